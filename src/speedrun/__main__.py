"""``python -m speedrun <command> ...``: the same as the ``speedrun`` console command (speedrun.cli)."""

from __future__ import annotations

import sys

from speedrun.cli import main

sys.exit(main())
