"""``python -m speedrun.export``: see speedrun.export.cli."""

from __future__ import annotations

import sys

from speedrun.export.cli import main

sys.exit(main())
