"""The report on results.sqlite (``python -m speedrun.report``), and the grouping the sweep summary shares.

One module per job:

- ``runs``: a run (result row, config, Plan, overrides), key lookup, the definition of a failure;
- ``selection``: which runs (``--sweep``, ``--name``, ``--hardware``, ``--where``), the keys ``--metric`` takes;
- ``groups``: grouping and statistics: group keys, groups, evaluation sets, baselines (Welch t-test, Holm), ranks;
- ``leaderboard``: groups as tables and the one CSV layout (leaderboard.csv here, summary.csv for a sweep);
- ``accept``: a contest's acceptance rule (``--accept``), its numbers read from conf/track/;
- ``target``: time to target (``--target``);
- ``view``: how tables are shown on a console: empty groups hidden, equal columns said once, the terminal's width;
- ``plots``, ``page``: the PNGs and report.html;
- ``cli``: the command.
"""

from __future__ import annotations

from speedrun.report.cli import LOWER_IS_BETTER, build_parser, main
from speedrun.report.groups import EvalSets, Group, compare, default_group_keys, eval_sets, group_runs, rank_groups
from speedrun.report.run_rows import Run, canon, is_failure
from speedrun.report.selection import load_runs, parse_pairs

__all__ = [
    "LOWER_IS_BETTER",
    "EvalSets",
    "Group",
    "Run",
    "build_parser",
    "canon",
    "compare",
    "default_group_keys",
    "eval_sets",
    "group_runs",
    "is_failure",
    "load_runs",
    "main",
    "parse_pairs",
    "rank_groups",
]
