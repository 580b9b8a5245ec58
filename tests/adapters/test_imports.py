"""Adapters are optional: importing the package loads no framework."""

from __future__ import annotations

import subprocess
import sys


def test_the_package_imports_no_framework():
    probe = (
        "import sys, broker_adapters, broker_adapters.tool; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'langgraph', 'pydantic_ai', 'agents', 'openai'}))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, check=True)
    assert done.stdout.strip() == "[]"
