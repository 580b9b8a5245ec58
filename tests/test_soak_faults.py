"""The soak's fault options are wired: through the fault proxy, a small run still loses nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_small_soak_through_the_fault_proxy_loses_nothing() -> None:
    command = [sys.executable, "-m", "benchmarks.soak", "--asks", "150", "--kills", "1", "--proxy", "--json"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=55)
    assert result.stdout, result.stderr[-3000:]
    figures = json.loads(result.stdout)
    assert figures["ok"] is True and figures["answers"] == 150 and figures["hung"] == 0, figures
    assert figures["redis_kills"] == figures["client_kills"] == 0 and figures["proxy_faults"] == {}, figures


def test_proxy_faults_need_the_proxy() -> None:
    command = [sys.executable, "-m", "benchmarks.soak", "--proxy-faults", "3"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "--proxy-faults needs --proxy" in result.stderr
