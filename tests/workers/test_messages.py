"""Messages name what the reader types next (issue "The page a team trusts", row 7).

A message that names a Python argument to a shell user, or advises handing a gateway's public key to
askers (docs/security.md forbids it), sends a person the wrong way.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.redis_server import RedisServer
from tests.workers.procs import env_for, finished, start_qbroker

pytestmark = pytest.mark.timeout(30)
ROOT = Path(__file__).resolve().parents[2]


async def qbroker(*args: str, cwd: Path) -> tuple[int, str]:
    status, _, err = await finished(await start_qbroker(*args, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=cwd))
    return status, err.decode()


async def test_keys_new_says_where_each_half_of_an_answering_key_goes(tmp_path: Path) -> None:
    status, said = await qbroker("keys", "new", "keys/team-a", cwd=tmp_path)
    assert status == 0, said
    assert "--signing-key-file keys/team-a.key" in said and "--trusted-keys-file keys/team-a.pub" in said
    assert "qbroker keys new PREFIX --gateway" in said  # the other kind of key is another pair


async def test_keys_new_for_a_gateway_never_advises_giving_its_public_key_to_askers(tmp_path: Path) -> None:
    status, said = await qbroker("keys", "new", "keys/gateway", "--gateway", cwd=tmp_path)
    assert status == 0, said
    assert "--attest-key-file keys/gateway.key" in said and "--gateway-keys-file keys/gateway.pub" in said
    assert "--trusted-keys-file" not in said and "never an asker's trusted key" in said
    assert (tmp_path / "keys" / "gateway.key").stat().st_mode & 0o777 == 0o600


async def test_an_ask_without_a_trusted_key_names_the_flag_a_shell_user_types(
    redis_server: RedisServer, namespace: str
) -> None:
    env = env_for(redis_server.url, namespace)
    del env["QBROKER_TRUSTED_KEYS"], env["QBROKER_SIGNING_KEY"]
    status, _, err = await finished(await start_qbroker("ask", "-q", "Deploy now?", "--timeout", "5", env=env))
    error = json.loads(err)
    assert (status, error["code"]) == (17, "NO_TRUSTED_KEY")
    assert "--trusted-keys-file" in error["message"] and "QBROKER_TRUSTED_KEYS_FILE" in error["message"], error
