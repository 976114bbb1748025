"""``python -m speedrun.report``: see speedrun.report.cli."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
