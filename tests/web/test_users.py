"""``workers.answering.web.users``: the web's users file read again when it changes (on real files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker import load_policies
from workers.answering.web.config import ConfigError, Credentials, credentials_from
from workers.answering.web.users import UsersFile, unmet_policies

BASE = {
    "users": {"alice": "scrypt$alice", "bob": "scrypt$bob"},
    "tokens": {"alice": "alice-token-0123456789", "ci": "ci-token-0123456789abc"},
    "namespaces": {"alice": ["a"], "bob": ["a"], "ci": ["a"]},
    "groups": {"sre": ["alice", "bob"], "leads": ["bob"]},
}


def changed(section: str, value: object) -> dict[str, object]:
    return {**BASE, section: value}


@pytest.mark.parametrize(
    ("data", "alice_changed"),
    [
        (changed("users", {"alice": "scrypt$new", "bob": "scrypt$bob"}), True),
        (changed("tokens", {"alice": "alice-token-9876543210", "ci": "ci-token-0123456789abc"}), True),
        (changed("namespaces", {"alice": ["a", "b"], "bob": ["a"], "ci": ["a"]}), True),
        (changed("groups", {"sre": ["bob"], "leads": ["bob"]}), True),
        (changed("groups", {"sre": ["alice", "bob"], "leads": ["bob"], "ops": ["alice"]}), True),
        (changed("users", {"alice": "scrypt$alice", "bob": "scrypt$new"}), False),
        (changed("groups", {"sre": ["alice", "bob"], "leads": ["bob", "ci"]}), False),
        ({**BASE, "users": {"bob": "scrypt$bob"}, "tokens": {"ci": "ci-token-0123456789abc"}}, True),
    ],
    ids=[
        "password", "token", "namespaces", "left-a-group", "joined-a-group",
        "another-users-password", "another-joined-a-group", "removed",
    ],
)  # fmt: skip
def test_a_grant_changes_with_all_the_file_says_of_its_user_and_nothing_else(
    data: dict[str, object], alice_changed: bool
) -> None:
    before = credentials_from(BASE, "users.toml", []).grant("alice")
    after = credentials_from(data, "users.toml", []).grant("alice")
    assert before is not None
    assert (after != before) is alice_changed


def test_only_a_user_or_a_token_has_a_grant() -> None:
    credentials = credentials_from(BASE, "users.toml", ["flag=flag-token-0123456789"])
    assert credentials.grant("ci") is not None and credentials.grant("flag") is not None
    assert credentials.grant("mallory") is None
    assert Credentials().grant("alice") is None


def write(path: Path, text: str) -> None:
    with path.open("w") as out:
        out.write(text)


def test_the_groups_view_follows_the_file_and_a_policy_files_own_groups_win(tmp_path: Path) -> None:
    path = tmp_path / "users.toml"
    write(path, '[groups]\nsre = ["alice"]\nops = ["carol"]\n')
    users = UsersFile(path)
    groups = users.groups({"ops": frozenset({"dave"})})
    assert dict(groups) == {"sre": frozenset({"alice"}), "ops": frozenset({"dave"})}
    write(path, '[groups]\nsre = ["bob"]\n')
    assert groups["sre"] == frozenset({"alice"})  # the view does not look at the file itself...
    users.refresh()  # ...a request (or the server's look once a second) does
    assert groups["sre"] == frozenset({"bob"}) and "ops" in groups


def test_the_slack_view_reads_the_file_at_each_lookup(tmp_path: Path) -> None:
    path = tmp_path / "users.toml"
    write(path, '[slack]\nalice = "UALICE"\nbob = "Bob@Example.com"\n')
    mapping = UsersFile(path, slack=True).slack_users()
    assert mapping.get("UALICE") == "alice" and mapping.get("bob@example.com") == "bob"
    write(path, '[slack]\nbob = "Bob@Example.com"\n')
    assert mapping.get("UALICE") is None and list(mapping) == ["bob@example.com"]


def test_the_slack_mapping_is_checked_only_for_a_slack_face(tmp_path: Path) -> None:
    path = tmp_path / "users.toml"
    write(path, "[slack]\nalice = 1\n")
    assert UsersFile(path).current().users == {}
    with pytest.raises(ConfigError, match=r"\[slack\]"):
        UsersFile(path, slack=True)


@pytest.mark.parametrize(
    "text",
    [b"[users\n", b"[users]\nalice = 1\n", b'[groups]\nsre = "alice"\n', b'[users]\nbob = "\xff"\n'],
    ids=["toml", "users", "groups", "not-utf8"],
)
def test_a_bad_users_file_at_start_is_a_config_error(tmp_path: Path, text: bytes) -> None:
    path = tmp_path / "users.toml"
    path.write_bytes(text)
    with pytest.raises(ConfigError):
        UsersFile(path)


def test_a_missing_users_file_at_start_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read users file"):
        UsersFile(tmp_path / "nowhere.toml")


def test_unmet_policies_names_a_group_gone_and_a_quorum_out_of_reach(tmp_path: Path) -> None:
    path, policy = tmp_path / "users.toml", tmp_path / "policy.toml"
    write(path, '[groups]\nsre = ["alice", "bob"]\nleads = ["lee"]\n')
    write(policy, '[[policy]]\nname = "deploys"\napprovals = 2\ngroups = ["sre"]\nroute = "leads"\n')
    users = UsersFile(path)
    policies = load_policies(policy, groups=users.current().groups)
    live = type(policies)(policies.policies, users.groups())
    assert unmet_policies(live) == []
    write(path, '[groups]\nsre = ["alice"]\n')
    users.refresh()
    assert unmet_policies(live) == [
        "policy 'deploys': no group 'leads'",
        "policy 'deploys' needs 2 approvals but its groups have 1 members",
    ]
