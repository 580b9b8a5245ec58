"""``python -m workers`` runs the ``qbroker`` CLI."""

from __future__ import annotations

import sys

from workers.cli import main

sys.exit(main())
