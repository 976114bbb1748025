"""``python -m speedrun.report``: see speedrun.report.cli."""

from __future__ import annotations

import sys

from speedrun.report.cli import main

sys.exit(main())
