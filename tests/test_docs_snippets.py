"""Every fenced snippet of README.md and docs/*.md is run (or, where it cannot run here, checked).

Each snippet gets a runner from ``_runner``; a snippet no runner claims fails
``test_every_snippet_has_a_runner``, so a new snippet cannot go untested silently. Scripts
run as written, as processes, with ``redis://localhost:6379/0`` pointed at the test's
private redis-server (QBROKER_REDIS_URL for the Python scripts, a text substitution for
the shell ones) and a real ``qbroker auto`` provider answering (``ANSWER_ALL``, the tests' own rules).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
import yaml

from broker.types import decode_outcome
from tests.helpers import SIGNING_KEY
from tests.workers.procs import auto_answering, env_for, finished
from workers.answering.auto.rules import parse_rules
from workers.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NAMESPACE = "team-a"  # the namespace the snippets name
LOCAL = "redis://localhost:6379/0"
VENV_BIN = str(Path(sys.executable).parent)

NOT_RUN = {
    # A redis-cli walk through the scripts' KEYS/ARGV: the script contracts are being reworked
    # (issue 12) and tests/test_protocol_doc.py checks that every contract is documented.
    ("protocol.md", "console"): "the redis-cli session follows the scripts' contracts (tests/test_protocol_doc.py)",
    ("architecture.md", "mermaid"): "a diagram",
    ("architecture.md", ""): "a diagram (the request's state machine)",
}


@dataclass(frozen=True)
class Snippet:
    file: str
    line: int
    lang: str
    code: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


def _snippets() -> list[Snippet]:
    found = []
    for path in FILES:
        lines = path.read_text().splitlines()
        n = 0
        while n < len(lines):
            opening = re.match(r"^```(\w*)\s*$", lines[n])
            if opening:
                end = lines.index("```", n + 1)
                found.append(Snippet(path.name, n + 1, opening.group(1), "\n".join(lines[n + 1 : end]) + "\n"))
                n = end
            n += 1
    return found


SNIPPETS = _snippets()


def _runner(snippet: Snippet) -> str:
    if (snippet.file, snippet.lang) in NOT_RUN:
        return "not-run"
    if snippet.lang == "python":
        if "broker.provider(" in snippet.code and "asyncio.run(main())" in snippet.code:
            return "python-provider"
        return "python-script" if "asyncio.run(main())" in snippet.code else "python-definitions"
    if snippet.lang == "sh":
        if "make demo" in snippet.code:
            return "make-targets"
        if "qbroker ask" in snippet.code and "$answer" in snippet.code:
            return "shell-script"
        return "qbroker-lines"
    if snippet.lang == "toml" and snippet.file == "slack.md":
        return "slack-toml"
    if snippet.lang == "toml" and ("[[policy]]" in snippet.code or "[groups]" in snippet.code):
        return "policy"
    if snippet.lang in ("json", "toml", "yaml"):
        return snippet.lang
    if snippet.lang == "" and snippet.code.startswith("user "):
        return "acl"
    return "unknown"


def _ids(snippets: list[Snippet]) -> list[str]:
    return [str(s) for s in snippets]


def _of(*runners: str) -> list[Snippet]:
    return [s for s in SNIPPETS if _runner(s) in runners]


def test_every_snippet_has_a_runner():
    assert [str(s) for s in SNIPPETS if _runner(s) == "unknown"] == []
    assert _of("python-script") and _of("python-provider") and _of("shell-script")


# -- processes ------------------------------------------------------------------------------------


ANSWER_ALL = """\
[default]
first = true

[[rule]]
intent = "plan-review"
approve = true
"""
"""the tests' rules: the snippets' asks are agentless (claimed), which the shipped example rules (answering
attested agents only, tests/workers/test_rules.py) cancel; never ship rules like these"""


@pytest.fixture
async def auto(redis_server, tmp_path):
    """`qbroker auto` answering every snippet's ask (the first option; plan reviews approved) in namespace team-a."""
    async with auto_answering(ANSWER_ALL, tmp_path / "answer-all.toml", redis_server.url, NAMESPACE) as worker:
        yield worker


async def _run(argv: list[str], url: str, *, stdin: bytes | None = None, limit: float = 40, **env: str):
    environment = env_for(url, NAMESPACE, OPENAI_API_KEY="not-used-offline", **env)
    environment["PATH"] = VENV_BIN + os.pathsep + environment.get("PATH", "")
    process = await asyncio.create_subprocess_exec(
        *argv, cwd=ROOT, env=environment, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    status, out, err = await finished(process, stdin, limit)
    return status, out.decode(), err.decode()


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("snippet", _of("python-script"), ids=_ids(_of("python-script")))
async def test_python_scripts_run_as_written(snippet, auto, redis_server, tmp_path):
    script = tmp_path / "snippet.py"
    script.write_text(snippet.code)
    status, out, err = await _run([sys.executable, str(script)], redis_server.url)
    assert status == 0, err
    assert re.search(r"\('\w+',\)", out), out  # the chosen label, printed


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("snippet", _of("python-provider"), ids=_ids(_of("python-provider")))
async def test_provider_scripts_answer(snippet, redis_server, tmp_path):
    script = tmp_path / "provider.py"
    script.write_text(snippet.code)
    environment = env_for(redis_server.url, NAMESPACE)
    provider = await asyncio.create_subprocess_exec(sys.executable, str(script), cwd=ROOT, env=environment)
    try:
        for _ in range(100):  # until it holds the lease: an ask before that is NO_PROVIDER
            status, out, err = await _run(
                [sys.executable, "-m", "workers", "ask", "-q", "Ship?", "-o", "yes", "-o", "no", "--timeout", "10"],
                redis_server.url,
            )
            if "NO_PROVIDER" not in err:
                break
            await asyncio.sleep(0.1)
        assert status == 0, err
        assert json.loads(out) == {"answers": [{"id": "q1", "selected": ["yes"]}]}
    finally:
        provider.terminate()
        await provider.wait()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("snippet", _of("python-definitions"), ids=_ids(_of("python-definitions")))
async def test_python_fragments_define_what_they_show(snippet, redis_server, tmp_path):
    pytest.importorskip("langgraph"), pytest.importorskip("pydantic_ai"), pytest.importorskip("agents")
    script = tmp_path / "fragment.py"
    script.write_text(snippet.code)
    status, _, err = await _run([sys.executable, str(script)], redis_server.url)
    assert status == 0, err


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("snippet", _of("shell-script"), ids=_ids(_of("shell-script")))
async def test_shell_scripts_run_as_written(snippet, auto, redis_server, tmp_path):
    trusted = tmp_path / "team-a.pub"  # the documented keys/team-a.pub, holding the tests' public key
    trusted.write_text(SIGNING_KEY.public_text + "\n")
    code = snippet.code.replace(LOCAL, redis_server.url).replace("keys/team-a.pub", str(trusted))
    argv = ["bash", "-euo", "pipefail", "-c", code]
    status, out, err = await _run(argv, redis_server.url, limit=60, QBROKER_TRUSTED_KEYS="")
    assert status == 0, err
    answers = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(answers) == 2 and answers[-1]["answers"][0]["selected"] == ["Approve"], out


def _without_redirections(words: list[str]) -> list[str]:
    """The shell's ``< file``, ``> file`` and ``2>&1`` are not the command's arguments."""
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word in ("<", ">", ">>", "2>"):
            skip = True
        elif not re.fullmatch(r"\d?>&\d", word):
            kept.append(word)
    return kept


def _qbroker_lines(code: str) -> list[list[str]]:
    joined = code.replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        line = line.split(" # ")[0].split("#")[0] if not line.lstrip().startswith("qbroker") else line.split("  #")[0]
        for part in re.split(r"\|\||\||&&|\$\(", line):
            words = shlex.split(part.replace(")", " "), comments=True) if part.strip() else []
            words = _without_redirections(words)
            if words[:1] == ["qbroker"]:
                commands.append(words[1:])
    return commands


@pytest.mark.parametrize("snippet", _of("qbroker-lines"), ids=_ids(_of("qbroker-lines")))
def test_every_qbroker_command_line_parses(snippet):
    commands = _qbroker_lines(snippet.code)
    assert commands, "no qbroker command in the snippet"
    for argv in commands:
        try:
            build_parser().parse_args(argv)
        except SystemExit as exit_:
            pytest.fail(f"{snippet}: qbroker {shlex.join(argv)} exits {exit_.code}")


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("snippet", _of("qbroker-lines"), ids=_ids(_of("qbroker-lines")))
async def test_the_ask_lines_are_answered(snippet, auto, redis_server):
    """Every `qbroker ask` line of the docs runs as written and is answered."""
    asks = [argv for argv in _qbroker_lines(snippet.code) if argv[:1] == ["ask"]]
    if not asks:
        pytest.skip("no qbroker ask here")
    for argv in asks:
        status, out, err = await _run([sys.executable, "-m", "workers", *argv], redis_server.url)
        assert status == 0, err
        expected = re.search(r"# -> (\{.*\})", snippet.code)
        if expected:
            assert json.loads(out) == json.loads(expected.group(1))


@pytest.mark.parametrize("snippet", _of("make-targets"), ids=_ids(_of("make-targets")))
def test_the_make_targets_exist(snippet):
    makefile = (ROOT / "Makefile").read_text()
    for target in re.findall(r"^make (\w+)", snippet.code, re.M):
        assert re.search(rf"^{target}:", makefile, re.M), target


# -- data -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("snippet", _of("json"), ids=_ids(_of("json")))
def test_json_snippets(snippet):
    if snippet.file == "protocol.md":  # outcome documents, one a line
        for line in snippet.code.splitlines():
            decode_outcome(line)
        return
    document = json.loads(snippet.code)
    if snippet.file == "slack.md":  # a card's Block Kit: compared with what the code makes there
        from tests.slack.test_blocks import test_the_docs_show_the_block_kit_a_card_becomes

        test_the_docs_show_the_block_kit_a_card_becomes()
        return
    if "mcpServers" in document:
        (server,) = document["mcpServers"].values()
        assert server["command"] == "qbroker"
        build_parser().parse_args(server["args"])
    elif "hooks" in document:
        example = json.loads((ROOT / "examples" / "claude_code" / "settings.json").read_text())
        assert document == example
    elif "hookSpecificOutput" in document:
        from workers.asking.claude_hook.hook import hook_output
        from workers.asking.claude_hook.questions import Verdict

        output = document["hookSpecificOutput"]
        if "decision" in output:  # PermissionRequest
            decision = output["decision"]
            verdict = Verdict(
                decision["behavior"],
                decision.get("message", ""),
                decision.get("updatedInput"),
                decision.get("updatedPermissions"),
            )
        else:  # PreToolUse
            verdict = Verdict(
                output["permissionDecision"], output["permissionDecisionReason"], output.get("updatedInput")
            )
        assert document == hook_output(output["hookEventName"], verdict)
    else:  # a webhook body (maintenance.md): decodes as the notice the worker sends
        from workers.operating.worker.webhooks import Notice

        notice = msgspec.convert(document, Notice)
        assert msgspec.json.decode(msgspec.json.encode(notice)) == document


@pytest.mark.parametrize("snippet", _of("toml"), ids=_ids(_of("toml")))
def test_toml_snippets_are_valid_rules(snippet):
    tomllib.loads(snippet.code)
    parse_rules(snippet.code, str(snippet))


@pytest.mark.parametrize("snippet", _of("policy"), ids=_ids(_of("policy")))
def test_policy_snippets_load(snippet, tmp_path):
    """docs/approvals.md's policy files load, with the groups its users-file snippets name."""
    from broker.answering.quorum import load_groups, load_policies

    groups = {name: members for s in _of("policy") for name, members in load_groups(tomllib.loads(s.code)).items()}
    path = tmp_path / "policies.toml"
    path.write_text(snippet.code)
    load_policies(path, groups=groups)


@pytest.mark.parametrize("snippet", _of("slack-toml"), ids=_ids(_of("slack-toml")))
def test_slack_snippets_load(snippet, tmp_path):
    """docs/slack.md's settings file and users-file ``[slack]`` table load as the Slack face reads them."""
    from workers.answering.slack.config import load_slack_config

    settings, users = tmp_path / "slack.toml", tmp_path / "users.toml"
    is_users = "[slack]" in snippet.code
    settings.write_text('channel = "C1"\n' if is_users else snippet.code)
    users.write_text(snippet.code if is_users else "")
    loaded = load_slack_config(settings, users, bot_token="xoxb-x", signing_secret="s", app_token="xapp-x")
    assert loaded.users if is_users else loaded.channel


@pytest.mark.parametrize("snippet", _of("yaml"), ids=_ids(_of("yaml")))
def test_yaml_snippets_are_alert_rules(snippet):
    rules = yaml.safe_load(snippet.code)
    assert all({"alert", "expr"} <= set(rule) for rule in rules)


@pytest.mark.parametrize("snippet", _of("acl"), ids=_ids(_of("acl")))
def test_acl_snippets_are_the_rules_redis_conf_ships(snippet):
    """deploy/redis/redis.conf is started and probed by tests/test_deploy.py; the doc shows its rules."""
    conf = [
        re.sub(r">\S+", ">PASSWORD", line)
        for line in (ROOT / "deploy" / "redis" / "redis.conf").read_text().splitlines()
    ]
    for line in snippet.code.splitlines():
        assert line in conf, line
