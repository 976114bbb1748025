"""report.html: one self-contained page (CSS inline, plots embedded as data URIs) that opens offline."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from speedrun.report.leaderboard import REPEATED_MARK

_CSS = """
body { font-family: -apple-system, Segoe UI, Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1400px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; white-space: nowrap; }
th { background: #f3f3f3; } td.text { text-align: left; white-space: normal; }
tr.baseline td { background: #eef5ff; } tr.better td { background: #eefbea; }
.meta { color: #555; font-size: 0.9em; } img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }
.notes { background: #fff6e0; border: 1px solid #e8c870; padding: 0.5em 1em; font-size: 0.9em; }
.footnotes { color: #555; font-size: 0.85em; margin: 0.2em 0 1em; }
figure { margin: 1em 0; } figcaption { color: #555; font-size: 0.9em; }
"""

CAPTIONS = {
    "pareto": "val_bpb vs training throughput per card, with the Pareto front of group means",
    "loss_curves": "train loss and periodic validation per group (mean ± std over its runs), from metrics.jsonl",
    "quant_vs_size": "val_bpb of the dequantized artifact vs its compressed size",
}

Table = tuple[list[str], list[list[str]]]


def html_table(
    table_id: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    row_classes: Sequence[str] | None = None,
    links: Sequence[str] | None = None,
) -> str:
    """``links``: one more cell per row holding trusted HTML (anchors this module built), under a "runs" header."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in [*headers, *(["runs"] if links else [])])
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        cells = "".join(f"<td{_cell_class(c)}>{html.escape(str(c))}</td>" for c in row)
        cells += f'<td class="text">{links[i]}</td>' if links else ""
        body.append(f"<tr{cls}>{cells}</tr>")
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


_NUMERIC = re.compile(r"^[+-]?[\d,.]+(e[+-]?\d+)?( ± [\d,.]+(e[+-]?\d+)?)?( †)?$")


def _cell_class(value: Any) -> str:
    return "" if not str(value) or _NUMERIC.match(str(value)) else ' class="text"'


RUN_FILES = ("result.json", "metrics.jsonl", "run.log", "plan.json", "checkpoints")
"""Run-dir files the runs table links to (when they exist)."""


def run_links(run_dir: str | None, out: Path) -> str:
    """Links to a run dir's files, relative to the report's folder (they open from a local copy of both)."""
    if not run_dir:
        return ""
    base = Path(run_dir)
    links = [
        f'<a href="{html.escape(_href(base / name, out))}">{name}</a>' for name in RUN_FILES if (base / name).exists()
    ]
    return f'<a href="{html.escape(_href(base, out))}">dir</a> ' + " ".join(links)


def _href(path: Path, out: Path) -> str:
    import os

    try:
        return Path(os.path.relpath(path, out)).as_posix()
    except ValueError:  # another drive (Windows): an absolute file URI
        return path.resolve().as_uri()


def runs_section(groups: Sequence[Any], out: Path) -> str:
    """One table row per run (grouped as in the leaderboard, anchor runs-<i> per group) linking its files."""
    rows = []
    for i, g in enumerate(groups):
        for j, r in enumerate(g.runs):
            anchor = f' id="runs-{i}"' if j == 0 else ""
            value = r.row.get("val_bpb")
            mark = f" {REPEATED_MARK}" if (r.epochs or 0.0) > 1.0 else ""
            cells = [
                g.label() or "(all)",
                str(r.row.get("seed")),
                r.status,
                f"{value:.4f}{mark}" if isinstance(value, (int, float)) else "",
                str(r.row.get("budget_end") or ""),
            ]
            tds = "".join(f"<td{_cell_class(c)}>{html.escape(c)}</td>" for c in cells)
            rows.append(f'<tr{anchor}>{tds}<td class="text">{run_links(r.row.get("run_dir"), out)}</td></tr>')
    head = "".join(f"<th>{h}</th>" for h in ("group", "seed", "status", "val_bpb", "budget_end", "files"))
    return f'<table id="runs"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def render_html(
    title: str,
    meta: list[str],
    notes: list[str],
    board: Table,
    board_classes: list[str],
    ttest: Table | None,
    failures: list[list[str]],
    plots: dict[str, Path],
    runs_html: str = "",
    board_links: Sequence[str] | None = None,
    target: tuple[str, list[str], Table] | None = None,
    board_notes: Sequence[str] = (),
    board_above: Sequence[str] = (),
    ttest_note: str = "",
    accept: tuple[str, list[str], Table] | None = None,
) -> str:
    """The page: meta lines, notes (evaluation-set and other warnings), the leaderboard with the lines above it
    (``board_above``: hidden groups, columns equal on every row) and its footnotes (``board_notes``), the t-tests
    (``ttest_note``: their Holm correction), the time to target table (``target``: heading, notes, table;
    --target), the acceptance table (``accept``, alike; --accept), the plots and the runs that did not end ok."""
    parts = [
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>',
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        '<div class="meta">' + "<br>".join(html.escape(m) for m in meta) + "</div>",
    ]
    if notes:
        parts.append('<div class="notes" id="notes">' + "<br>".join(html.escape(n) for n in notes) + "</div>")
    parts.append("<h2>Leaderboard</h2>")
    if board_above:
        parts.append('<p class="meta" id="board-above">' + "<br>".join(map(html.escape, board_above)) + "</p>")
    parts += [html_table("leaderboard", *board, row_classes=board_classes, links=board_links)]
    if board_notes:
        parts.append('<p class="footnotes" id="footnotes">' + "<br>".join(map(html.escape, board_notes)) + "</p>")
    if ttest is not None:
        parts.append("<h2>Against the baseline (Welch t-test; H1 as stated above)</h2>")
        if ttest_note:
            parts.append(f'<p class="meta" id="holm">{html.escape(ttest_note.strip())}</p>')
        parts.append(html_table("ttest", *ttest))
    for table_id, section in (("target", target), ("accept", accept)):
        if section is not None:
            heading, section_notes, table = section
            parts += [
                f"<h2>{html.escape(heading)}</h2>",
                '<div class="meta">' + "<br>".join(map(html.escape, section_notes)) + "</div>",
                html_table(table_id, *table),
            ]
    if plots:
        parts.append("<h2>Plots</h2>")
        for name, path in plots.items():
            data = base64.b64encode(path.read_bytes()).decode("ascii")
            caption = html.escape(CAPTIONS.get(name, name))
            parts.append(
                f'<figure><img id="plot-{name}" alt="{caption}" src="data:image/png;base64,{data}">'
                f"<figcaption>{caption}</figcaption></figure>"
            )
    if runs_html:
        parts += ["<h2>Runs</h2>", runs_html]
    if failures:
        parts += [
            "<h2>Runs that did not end ok</h2>",
            html_table("failures", ["status", "group", "error", "run dir"], failures),
        ]
    parts.append("</body></html>")
    return "\n".join(parts)
