"""``python -m benchmarks``: run the benchmark and print (and, at full size, write) the report."""

from __future__ import annotations

import sys

from .run import main

if __name__ == "__main__":
    sys.exit(main())
