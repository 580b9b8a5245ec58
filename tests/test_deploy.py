"""deploy/: what can be checked without a Docker engine or a cluster.

Every file parses; every ``qbroker`` command and flag the files use exists in the CLI; every
``QBROKER_*`` variable they set is read by ``workers/``; the image installs the project with
pip and runs as a non-root user; the Redis configuration starts a real ``redis-server`` whose
ACL users work in their namespace and nowhere else; the web readiness probe is ready on the
lease holder only.
"""

from __future__ import annotations

import argparse
import asyncio
import configparser
import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from redis.asyncio import Redis
from redis.exceptions import NoPermissionError

from broker import Broker
from broker.roles import ROLES, acl_rule
from tests.helpers import KEYS, one_question, pick
from tests.redis_server import REDIS_SERVER, free_port
from workers.answering.auto.rules import parse_rules
from workers.answering.web.config import load_credentials
from workers.answering.web.service import Status
from workers.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
YAML_FILES = sorted([*DEPLOY.rglob("*.yml"), *DEPLOY.rglob("*.yaml")])
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
TEXT_FILES = sorted(p for p in DEPLOY.rglob("*") if p.is_file())


def yaml_documents(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def k8s_objects() -> list[dict[str, Any]]:
    paths = sorted(p for p in (DEPLOY / "k8s").glob("*.yaml") if p.name != "kustomization.yaml")
    return [doc for path in paths for doc in yaml_documents(path)]


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    found = [o for o in k8s_objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}"
    return found[0]


def compose() -> dict[str, Any]:
    data = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def read_unit(path: Path) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(path.read_text())
    return unit


# -- every file parses ---------------------------------------------------------------------------


def test_the_expected_files_exist():
    names = {p.relative_to(DEPLOY).as_posix() for p in TEXT_FILES}
    for name in (
        "Dockerfile", "docker-compose.yml", "README.md", "redis/redis.conf", "k8s/web.yaml", "k8s/worker.yaml",
        "k8s/configmap.yaml", "k8s/secret.yaml", "systemd/qbroker-web.service", "systemd/qbroker-worker.service",
        "systemd/qbroker-auto.service",
    ):  # fmt: skip
        assert name in names


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_yaml_parses(path):
    assert yaml_documents(path)


def test_k8s_objects_are_well_formed():
    kinds = set()
    for obj in k8s_objects():
        kinds.add(obj["kind"])
        assert obj["apiVersion"] and obj["metadata"]["name"]
        if obj["kind"] == "Deployment":
            spec = obj["spec"]
            labels = spec["template"]["metadata"]["labels"]
            assert spec["selector"]["matchLabels"].items() <= labels.items()
    assert {"Deployment", "Service", "ConfigMap", "Secret"} <= kinds
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (DEPLOY / "k8s" / resource).is_file()


def test_toml_files_parse_as_what_they_are():
    rules = DEPLOY / "rules.example.toml"
    parse_rules(rules.read_text(), str(rules))  # raises RulesError, naming the line
    users = DEPLOY / "users.example.toml"
    tomllib.loads(users.read_text())
    load_credentials(users, [])
    secret = k8s_object("Secret", "qbroker-secrets")
    tomllib.loads(secret["stringData"]["users.toml"])


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_systemd_units_parse(path):
    unit = read_unit(path)
    assert unit.sections() == ["Unit", "Service", "Install"]
    service = unit["Service"]
    assert service["User"] not in ("", "root")
    environment_file = service["EnvironmentFile"]
    assert environment_file.lstrip("-").startswith("/etc/qbroker/")
    assert service["ExecStart"].startswith("/opt/qbroker/bin/qbroker ")


def test_env_example_is_key_value_lines():
    for line in (DEPLOY / "qbroker.env.example").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            assert re.fullmatch(r"QBROKER_[A-Z_]+=\S*", line), line


# -- commands, flags and environment variables exist ------------------------------------------------


def qbroker_invocations() -> Iterator[tuple[str, list[str]]]:
    """Every qbroker argument vector in deploy/, with where it comes from."""
    for name, service in compose()["services"].items():
        if service.get("image", "").startswith("qbroker") or "build" in service:
            yield f"compose {name}", list(service["command"])
        test = service.get("healthcheck", {}).get("test", [])
        if "qbroker" in test:
            yield f"compose {name} healthcheck", test[test.index("qbroker") + 1 :]
    for anchor in ("x-web-health", "x-status-health"):
        test = compose()[anchor]["test"]
        if "qbroker" in test:
            yield f"compose {anchor}", test[test.index("qbroker") + 1 :]
    for obj in k8s_objects():
        if obj["kind"] != "Deployment":
            continue
        for container in obj["spec"]["template"]["spec"]["containers"]:
            if container["image"].startswith("qbroker"):
                yield f"k8s {obj['metadata']['name']}", list(container["args"])
            for probe in ("readinessProbe", "livenessProbe"):
                command = container.get(probe, {}).get("exec", {}).get("command", [])
                if command[:1] == ["qbroker"]:
                    yield f"k8s {obj['metadata']['name']} {probe}", command[1:]
    for path in UNITS:
        argv = shlex.split(read_unit(path)["Service"]["ExecStart"])
        assert argv[0].endswith("/qbroker")
        yield path.name, argv[1:]


def test_deploy_files_run_every_long_running_command():
    commands = {argv[0] for _, argv in qbroker_invocations() if argv and not argv[0].startswith("-")}
    assert {"web", "worker", "auto", "status"} <= commands


@pytest.mark.parametrize("where, argv", list(qbroker_invocations()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_command_and_flag_exists(where, argv):
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = argv[0]
    assert command in subparsers.choices, f"{where}: no sub-command {command!r}"
    known = subparsers.choices[command]._option_string_actions
    for token in argv[1:]:
        if token.startswith("-"):
            flag = token.split("=", 1)[0]
            assert flag in known, f"{where}: `qbroker {command}` has no flag {flag}"  # exact, no abbreviations
    # and the whole vector parses (values of the right type, required flags present)
    args = parser.parse_args(argv)
    assert args.command == command


def qbroker_variables(text: str) -> set[str]:
    return set(re.findall(r"\bQBROKER_[A-Z0-9_]*[A-Z0-9]\b", text))


def workers_source() -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / "workers").rglob("*.py")))


def test_every_environment_variable_is_read_by_workers():
    source = workers_source()
    read = {name for name in qbroker_variables(source) if f'"{name}"' in source}
    used: dict[str, set[str]] = {}
    for path in [*TEXT_FILES, ROOT / "docs" / "operations.md", ROOT / "docs" / "architecture.md"]:
        if path.is_file():
            for name in qbroker_variables(path.read_text()):
                used.setdefault(name, set()).add(path.relative_to(ROOT).as_posix())
    assert used, "the deploy files set no QBROKER_* variable at all"
    unknown = {name: sorted(files) for name, files in used.items() if name not in read}
    assert unknown == {}


def test_the_check_catches_an_unknown_variable():
    assert "QBROKER_NO_SUCH_THING" not in workers_source()
    assert qbroker_variables("X=QBROKER_NO_SUCH_THING") == {"QBROKER_NO_SUCH_THING"}


# -- the image -------------------------------------------------------------------------------------


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """(instruction, arguments) per stage, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, arguments = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        assert stages, "an instruction before FROM"
        stages[-1].append((instruction.upper(), arguments.strip()))
    return stages


def test_the_image_is_multi_stage_slim_and_runs_qbroker():
    stages = dockerfile_stages()
    assert len(stages) >= 2
    for stage in stages:
        assert stage[0][1].split()[0].startswith("python:3.11-slim")
    final = stages[-1]
    entrypoint = [args for instruction, args in final if instruction == "ENTRYPOINT"]
    assert entrypoint == ['["qbroker"]']
    assert any(instruction == "COPY" and args.startswith("--from=") for instruction, args in final)
    assert not any(instruction == "RUN" and "pip install" in args for instruction, args in final)


def test_the_image_runs_as_a_non_root_user():
    final = dockerfile_stages()[-1]
    users = [args for instruction, args in final if instruction == "USER"]
    assert users, "the final stage sets no USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    # and the k8s pods insist on it
    for obj in k8s_objects():
        if obj["kind"] == "Deployment":
            context = obj["spec"]["template"]["spec"]["securityContext"]
            assert context["runAsNonRoot"] is True
            assert str(context["runAsUser"]) == user


def test_the_image_installs_the_project_with_pip_as_readme_says():
    readme = (ROOT / "README.md").read_text() + (ROOT / "docs" / "cli.md").read_text()
    assert re.search(r"pip install (-q )?-e ['\"]?\.", readme)  # the documented install: pip install of the project
    build = dockerfile_stages()[0]
    workdir = next(args for instruction, args in build if instruction == "WORKDIR")
    copied = {
        source
        for instruction, args in build
        if instruction == "COPY" and not args.startswith("--from=")
        for source in args.split()[:-1]
    }
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {
        "pyproject.toml",
        pyproject["project"]["readme"],
        *pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"],
    }
    assert needed <= copied, f"the build stage does not copy {needed - copied}"
    for source in copied:
        assert (ROOT / source).exists()
    installs = [args for instruction, args in build if instruction == "RUN" and "pip install" in args]
    assert installs
    argv = shlex.split(installs[0].split("&&")[0])
    assert argv[argv.index("install") + 1 :] in ([workdir], ["."]), (
        argv
    )  # the project directory, not a name from an index


# -- docker compose --------------------------------------------------------------------------------


def test_compose_has_redis_with_aof_web_standby_worker_and_optional_auto():
    services = compose()["services"]
    command = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in command and "--appendfsync everysec" in command
    webs = [s for s in services.values() if s.get("command", [None])[0] == "web"]
    assert len(webs) == 2
    assert len({s["command"][s["command"].index("--name") + 1] for s in webs}) == 2  # distinct provider names
    assert services["worker"]["command"][0] == "worker"
    assert services["auto"]["command"][0] == "auto" and services["auto"]["profiles"] == ["auto"]
    for name, service in services.items():
        assert "healthcheck" in service, f"{name} has no health check"
        if name != "redis":
            assert service["depends_on"]["redis"]["condition"] == "service_healthy"
    for path in ("users.toml",):  # the volumes name files the README tells people to create
        assert path in (DEPLOY / "README.md").read_text()


# -- Kubernetes: the web provider's readiness is "holds the lease" ---------------------------------


def web_container() -> dict[str, Any]:
    deployment = k8s_object("Deployment", "qbroker-web")
    assert deployment["spec"]["replicas"] == 2
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def test_configmap_and_secret_carry_redis_url_tokens_and_webhook_secret():
    secret = k8s_object("Secret", "qbroker-secrets")["stringData"]
    assert {"QBROKER_WEBHOOK_SECRET", "users.toml"} <= set(secret)
    assert "QBROKER_WEB_SECRET" not in secret  # web sessions live in Redis: no shared signing secret
    config = k8s_object("ConfigMap", "qbroker-config")["data"]
    assert config["QBROKER_WEB_HOST"] == "0.0.0.0"
    assert not set(config) & set(secret)
    for name in ("qbroker-web", "qbroker-worker"):
        deployment = k8s_object("Deployment", name)
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            sources = [next(iter(s.values()))["name"] for s in container["envFrom"]]
            signing = ["qbroker-signing-key"] if name == "qbroker-web" else []  # the answering side's only
            assert sources == ["qbroker-config", "qbroker-secrets", f"{name}-redis", *signing]


def test_web_and_worker_connect_as_their_own_acl_users():
    """Issue 16: operations.md recommends a user per component; the Secret gave both one URL."""
    from urllib.parse import urlsplit

    users = {}
    for name in ("qbroker-web-redis", "qbroker-worker-redis"):
        data = k8s_object("Secret", name)["stringData"]
        assert set(data) == {"QBROKER_REDIS_URL"}
        users[name] = urlsplit(data["QBROKER_REDIS_URL"]).username
    assert users == {"qbroker-web-redis": "team-a-answerer", "qbroker-worker-redis": "team-a-maintenance"}
    assert "QBROKER_REDIS_URL" not in k8s_object("Secret", "qbroker-secrets")["stringData"]
    conf = (DEPLOY / "redis" / "redis.conf").read_text()
    config = k8s_object("ConfigMap", "qbroker-config")["data"]
    namespace, queue = config["QBROKER_NAMESPACE"], config["QBROKER_ARQ_QUEUE"]
    web_rule = next(line for line in conf.splitlines() if line.startswith("user team-a-answerer "))
    worker_rule = next(line for line in conf.splitlines() if line.startswith("user team-a-maintenance "))
    assert f"~qb:{{{namespace}}}:*" in web_rule and "~arq:" not in web_rule
    assert f"~qb:{{{namespace}}}:*" in worker_rule and f"~{queue}*" in worker_rule


def test_redis_conf_holds_exactly_the_rules_qbroker_acl_makes():
    """deploy/redis/redis.conf is not a second copy of the roles to drift: its rules are broker/roles.py's."""
    conf = (DEPLOY / "redis" / "redis.conf").read_text()
    for namespace, role in [("team-a", r) for r in ROLES] + [("team-b", "asker")]:
        line = next(line for line in conf.splitlines() if line.startswith(f"user {namespace}-{role} "))
        assert line.split(" ", 4)[4] == acl_rule(namespace, role)


def test_the_readiness_probe_reads_a_status_the_web_provider_reports():
    probe = " ".join(web_container()["readinessProbe"]["exec"]["command"])
    assert "/healthz" in probe
    statuses = set(re.findall(r"'(\w+)'", probe)) & {"connecting", "standby", "active", "stopped"}
    assert statuses == {"active"}
    assert "active" in typing.get_args(Status)


def probe_exit(command: list[str], port: int) -> int:
    code = " ".join(command[2:]).replace("8080", str(port))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=20).returncode


@pytest.mark.slow
def test_the_readiness_probe_is_ready_on_the_lease_holder_only(redis_server, namespace, tmp_path):
    command = web_container()["readinessProbe"]["exec"]["command"]
    assert command[:2] == ["python", "-c"]
    ports = [free_port(), free_port()]
    env = {**os.environ, "QBROKER_REDIS_URL": redis_server.url, "QBROKER_NAMESPACE": namespace}
    logs = [tmp_path / f"web{i}.log" for i in range(2)]

    def wait_until(condition: Any, log: Path) -> None:
        deadline = time.monotonic() + 30
        while not condition():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)

    with contextlib.ExitStack() as stack:
        processes = []
        for i, port in enumerate(ports):
            argv = [
                sys.executable,
                "-m",
                "workers",
                "web",
                "--port",
                str(port),
                "--name",
                f"web-{i}",
                "--allow-no-users",
            ]
            log = stack.enter_context(logs[i].open("w"))
            process = stack.enter_context(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log))
            stack.callback(process.terminate)
            processes.append(process)
            if i == 0:
                wait_until(lambda: probe_exit(command, ports[0]) == 0, logs[0])
            else:
                wait_until(lambda: standing_by(ports[1]), logs[1])
        assert [probe_exit(command, port) for port in ports] == [0, 1]
        processes[0].terminate()  # releases the lease: the standby takes over and becomes ready
        processes[0].wait(20)
        wait_until(lambda: probe_exit(command, ports[1]) == 0, logs[1])


def standing_by(port: int) -> bool:
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return bool(json.load(response)["status"] == "standby")
    except OSError:
        return False


# -- the Redis configuration -----------------------------------------------------------------------


@pytest.fixture
def configured_redis(tmp_path: Path) -> Iterator[int]:
    """redis-server started with deploy/redis/redis.conf (port, address and directory overridden)."""
    port = free_port()
    process = subprocess.Popen(
        [REDIS_SERVER, str(DEPLOY / "redis" / "redis.conf"), "--port", str(port), "--bind", "127.0.0.1",
         "--dir", str(tmp_path), "--logfile", str(tmp_path / "redis.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield port
    finally:
        process.kill()
        process.wait()


async def admin_client(port: int) -> Redis:
    admin = Redis(port=port, username="admin", password="change-me-admin", decode_responses=True)
    deadline = time.monotonic() + 10
    while True:
        try:
            await admin.ping()
            return admin
        except OSError:
            assert time.monotonic() < deadline, "redis-server did not start with deploy/redis/redis.conf"
            await asyncio.sleep(0.05)
        except Exception as error:  # redis' ConnectionError is an OSError subclass only in some versions
            if "Connection" not in type(error).__name__:
                raise
            assert time.monotonic() < deadline, "redis-server did not start with deploy/redis/redis.conf"
            await asyncio.sleep(0.05)


async def test_redis_conf_starts_redis_with_aof_and_fenced_users(configured_redis):
    port = configured_redis
    admin = await admin_client(port)
    try:
        config = await admin.config_get("append*")
        assert config["appendonly"] == "yes" and config["appendfsync"] == "everysec"
        assert (await admin.config_get("maxmemory-policy"))["maxmemory-policy"] == "noeviction"
        users = await admin.acl_users()
        assert {"team-a-asker", "team-a-answerer", "team-a-maintenance", "team-b-asker", "admin"} <= set(users)
        default = await admin.acl_getuser("default")
        assert "off" in default["flags"]
    finally:
        await admin.aclose()

    asker_url = f"redis://team-a-asker:change-me-team-a-asker@127.0.0.1:{port}/0"
    answerer_url = f"redis://team-a-answerer:change-me-team-a-answerer@127.0.0.1:{port}/0"
    async with Broker(asker_url, "team-a", **KEYS) as asking, Broker(answerer_url, "team-a", **KEYS) as answering:
        async with asking.agent("root") as agent, answering.provider("ui") as provider:
            task = asyncio.create_task(agent.ask(one_question()))
            async for pending in provider:
                await pending.answer(pick("yes"), by="test")
                break
            assert await asyncio.wait_for(task, 10) == pick("yes")

        intruder = Redis(
            port=port, username="team-a-answerer", password="change-me-team-a-answerer", decode_responses=True
        )
        try:
            for attempt in (
                intruder.set("qb:{team-b}:provider", "1:x:thief"),
                intruder.xrange("qb:{team-b}:requests"),
                intruder.execute_command("SCAN", 0),
                intruder.execute_command("FLUSHALL"),
                intruder.execute_command("CONFIG", "SET", "appendonly", "no"),
            ):
                with pytest.raises(NoPermissionError):
                    await attempt
        finally:
            await intruder.aclose()


# -- the documents link to files that exist -------------------------------------------------------


@pytest.mark.parametrize("doc", ["docs/architecture.md", "docs/operations.md", "deploy/README.md", "README.md"])
def test_relative_links_resolve(doc):
    path = ROOT / doc
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text())
    assert targets
    missing = [t for t in targets if "://" not in t and not (path.parent / t).exists()]
    assert missing == []


# -- the platforms' own parsers, where installed --------------------------------------------------


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_finds_only_the_missing_install(tmp_path):
    result = subprocess.run(["systemd-analyze", "verify", *map(str, UNITS)], capture_output=True, text=True, timeout=60)
    problems = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if line.strip() and "/opt/qbroker/bin/qbroker is not executable" not in line
    ]
    assert problems == []


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_kustomize_renders_the_manifests():
    result = subprocess.run(["kubectl", "kustomize", str(DEPLOY / "k8s")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    kinds = sorted(doc["kind"] for doc in yaml.safe_load_all(result.stdout) if doc)
    assert kinds == ["ConfigMap", "Deployment", "Deployment", "Secret", "Secret", "Secret", "Secret", "Service"]
