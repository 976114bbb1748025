"""How a table is shown: the leaderboard without the groups that have no result (``--all`` keeps them), without
the columns whose value is the same on every row (said once above it), and within the terminal's width (the
lowest-priority columns dropped first, then the widest cells cut), so no line wraps.

leaderboard.csv keeps every group and column: these are for reading, the CSV is for tools.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from collections.abc import Sequence

from speedrun.report.groups import Group
from speedrun.tables import format_table

Table = tuple[list[str], list[list[str]]]

ELLIPSIS = "…"
MIN_CELL = 6
"""The narrowest a cut column gets: a key's value still tells itself apart at this width."""


def hidden_groups(groups: Sequence[Group]) -> list[Group]:
    """Groups with no ok run: every run failed, was refused before training (a failed row whose error names the
    refusal) or never ran. Their rows hold no figure to rank or compare."""
    return [g for g in groups if not g.ok and not g.is_baseline]


def hidden_note(hidden: Sequence[Group]) -> list[str]:
    if not hidden:
        return []
    return [
        f"{len(hidden)} group(s) hidden: no ok run (every run failed, was refused or never ran: "
        f"{'; '.join(g.label() or '(all)' for g in hidden)}); --all shows them, and 'Runs that did not end ok' "
        "in report.html says why"
    ]


def fold_equal(table: Table, keep: Sequence[str]) -> tuple[Table, str]:
    """The table without the columns whose cell is the same on every row (``keep`` excepted), and the line that
    says them once: ``all rows: hardware=cpu precision=fp32; empty in every row: mfu``. A table of
    fewer than two rows is left whole: one row says nothing about what its rows share."""
    headers, rows = table
    if len(rows) < 2:
        return table, ""
    same = [i for i, h in enumerate(headers) if h not in keep and len({r[i] for r in rows}) == 1]
    if not same:
        return table, ""
    said = " ".join(f"{headers[i]}={rows[0][i]}" for i in same if rows[0][i])
    empty = ", ".join(headers[i] for i in same if not rows[0][i])
    line = "; ".join(([f"all rows: {said}"] if said else []) + ([f"empty in every row: {empty}"] if empty else []))
    shown = [i for i in range(len(headers)) if i not in same]
    return ([headers[i] for i in shown], [[r[i] for i in shown] for r in rows]), line


def terminal_width() -> int | None:
    """The console's width: $COLUMNS when set, else the terminal's; None (no limit) when the output goes to a file
    or a pipe, whose reader has no width to keep within and wants every column."""
    if not os.environ.get("COLUMNS") and not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size((80, 24)).columns


def line_width(widths: Sequence[int]) -> int:
    """The length of a speedrun.tables.format_table line whose columns are ``widths`` wide."""
    return sum(widths) + 3 * len(widths) + 1


def fit_width(
    table: Table, width: int, droppable: Sequence[str], cuttable: Sequence[str] | None = None
) -> tuple[Table, list[str]]:
    """The table narrowed to ``width`` characters a line: the ``droppable`` columns go first, the last named first
    (the lowest priority), then the cells of the widest ``cuttable`` columns (any column when None; text, since a
    cut number would misread) are cut with an ellipsis, the cut shared among the wide ones, down to MIN_CELL
    characters. Returns the table and the dropped columns' names."""
    headers, rows = list(table[0]), [list(r) for r in table[1]]
    dropped: list[str] = []

    def widths() -> list[int]:
        return [max([len(headers[i])] + [len(r[i]) for r in rows]) for i in range(len(headers))]

    for name in reversed(droppable):
        if line_width(widths()) <= width:
            break
        if name in headers:
            i = headers.index(name)
            headers.pop(i)
            for r in rows:
                r.pop(i)
            dropped.append(name)
    cut = [i for i, h in enumerate(headers) if cuttable is None or h in cuttable]
    while cut and line_width(w := widths()) > width:
        widest = max(cut, key=lambda i: w[i])
        # down to the next widest at most: the cut is shared by the wide columns, so none is cut to nothing
        runner_up = max([w[i] for i in cut if i != widest] + [0])
        limit = max(MIN_CELL, w[widest] - (line_width(w) - width), min(runner_up, w[widest] - 1))
        if w[widest] <= limit:
            break  # every cuttable column is as narrow as it gets: the line stays longer than the terminal
        headers[widest] = _cut(headers[widest], limit)
        for r in rows:
            r[widest] = _cut(r[widest], limit)
    return (headers, rows), dropped


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + ELLIPSIS


def dropped_note(dropped: Sequence[str], width: int) -> list[str]:
    if not dropped:
        return []
    return [
        f"left out to fit {width} columns: {', '.join(dropped)} (in report.html and leaderboard.csv; a wider "
        "terminal or COLUMNS=200 shows them)"
    ]


def console_table(headers: list[str], rows: list[list[str]], droppable: list[str], cuttable: list[str]) -> str:
    """A table as console text within the terminal's width (fit_width), a line after it naming the columns left
    out; whole when the output is no terminal."""
    width = terminal_width()
    if width is None:
        return format_table(headers, rows)
    (headers, rows), dropped = fit_width((headers, rows), width, droppable, cuttable)
    return "\n".join([format_table(headers, rows), *dropped_note(dropped, width)])


def wrapped(lines: Sequence[str]) -> list[str]:
    """Lines of prose broken at the terminal's width (as they are when the output is no terminal)."""
    width = terminal_width()
    if width is None:
        return list(lines)
    return [part for line in lines for part in textwrap.wrap(line, width, break_on_hyphens=False) or [""]]
