"""``python -m workers.web ...``: the same as ``qbroker web ...``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from workers.commands.web import add_arguments, run


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.web")
    add_arguments(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
