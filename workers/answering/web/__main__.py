"""``python -m workers.answering.web ...``: the same as ``qbroker web ...`` (shared flags included)."""

from __future__ import annotations

import sys

from workers.cli import main

if __name__ == "__main__":
    sys.exit(main(["web", *sys.argv[1:]]))
