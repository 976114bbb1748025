"""report.html: one self-contained page (CSS inline, plots embedded as data URIs) that opens offline."""
from __future__ import annotations

import base64
import html
import re
from pathlib import Path
from typing import Any, Optional, Sequence

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
figure { margin: 1em 0; } figcaption { color: #555; font-size: 0.9em; }
"""

CAPTIONS = {"pareto": "val_bpb vs training throughput per card, with the Pareto front of group means",
            "loss_curves": "training loss curves from each run's metrics.jsonl",
            "quant_vs_size": "val_bpb of the dequantized artifact vs its compressed size"}

Table = tuple[list[str], list[list[str]]]


def html_table(table_id: str, headers: Sequence[str], rows: Sequence[Sequence[str]],
               row_classes: Optional[Sequence[str]] = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        cells = "".join(f'<td{_cell_class(c)}>{html.escape(str(c))}</td>' for c in row)
        body.append(f"<tr{cls}>{cells}</tr>")
    return (f'<table id="{table_id}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


_NUMERIC = re.compile(r"^[+-]?[\d,.]+(e[+-]?\d+)?( ± [\d,.]+(e[+-]?\d+)?)?$")


def _cell_class(value: Any) -> str:
    return "" if not str(value) or _NUMERIC.match(str(value)) else ' class="text"'


def render_html(title: str, meta: list[str], notes: list[str], board: Table, board_classes: list[str],
                ttest: Optional[Table], failures: list[list[str]], plots: dict[str, Path]) -> str:
    """The page: meta lines, notes (evaluation-set and other warnings), the leaderboard, the t-tests, the plots and
    the runs that did not end ok."""
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>",
             f"<style>{_CSS}</style></head><body>", f"<h1>{html.escape(title)}</h1>",
             "<div class=\"meta\">" + "<br>".join(html.escape(m) for m in meta) + "</div>"]
    if notes:
        parts.append('<div class="notes" id="notes">' + "<br>".join(html.escape(n) for n in notes) + "</div>")
    parts += ["<h2>Leaderboard</h2>", html_table("leaderboard", *board, row_classes=board_classes)]
    if ttest is not None:
        parts += ["<h2>Against the baseline (one-sided Welch t-test)</h2>", html_table("ttest", *ttest)]
    if plots:
        parts.append("<h2>Plots</h2>")
        for name, path in plots.items():
            data = base64.b64encode(path.read_bytes()).decode("ascii")
            caption = html.escape(CAPTIONS.get(name, name))
            parts.append(f'<figure><img id="plot-{name}" alt="{caption}" src="data:image/png;base64,{data}">'
                         f"<figcaption>{caption}</figcaption></figure>")
    if failures:
        parts += ["<h2>Runs that did not end ok</h2>",
                  html_table("failures", ["status", "group", "error", "run dir"], failures)]
    parts.append("</body></html>")
    return "\n".join(parts)
