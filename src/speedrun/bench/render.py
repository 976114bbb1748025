"""docs/benchmarks.md from the declared checks and their result files: the page is generated, never edited.

Per check: what it measures, its arms, its bar and the command that runs it; then, per card, the latest result
(its date, commit, every arm's metrics, each bar's observed value and whether it passed, and the exact command
that produced it), or "not yet measured". The page depends only on the checks and the files under
benchmarks/results/, so a test can render it and compare it with the committed page.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from speedrun.bench.machine import REPO
from speedrun.bench.spec import Check, PeerArm
from speedrun.bench.steps import arm_command

PAGE = REPO / "docs" / "benchmarks.md"
RESULTS = REPO / "benchmarks" / "results"


def latest_results(check: Check, results: Path) -> list[dict[str, Any]]:
    """The newest result of ``check`` per card (by start time, then file name), cards in name order. A file that
    is not a result of this check is skipped."""
    by_card: dict[str, tuple[tuple[str, str], dict[str, Any]]] = {}
    for path in sorted((results / check.name).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or data.get("check") != check.name:
            continue
        card = str((data.get("machine") or {}).get("card") or "unknown")
        key = (str(data.get("started_at") or ""), path.name)
        if card not in by_card or key > by_card[card][0]:
            by_card[card] = (key, {**data, "_file": path.relative_to(results.parent.parent).as_posix()})
    return [by_card[card][1] for card in sorted(by_card)]


def fmt(value: Any) -> str:
    """A metric as the page shows it: thousands apart from 1,000 up, 5 significant digits below."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.5g}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, list):
        return ", ".join(fmt(v) for v in value)
    return str(value).replace("|", "/")


WIDTH = 120
"""The docs' line width: prose and list items wrap to it; tables and code do not."""


def _wrap(line: str) -> str:
    """A prose line or list item wrapped to WIDTH (a list item's continuation indented under its text)."""
    if not line or line.startswith(("|", "#", "```", "<!--")) or len(line) <= WIDTH:
        return line
    indent = "  " if line.startswith("- ") else ""
    return textwrap.fill(line, WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)


def _table(head: list[str], rows: Iterable[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]


def command(check: Check) -> str:
    parts = ["python -m speedrun.bench", check.name, *(f"--peer {p}=<path>" for p in check.peers)]
    if any(isinstance(a, PeerArm) and a.needs_fa3 for a in check.arms):
        parts.append("[--fa3-shim <dir>]")
    return " ".join(parts)


def _bar_line(r: Mapping[str, Any]) -> str:
    """Each bar of a result: what it observed (pass by pass for a ratio of several passes) and whether it held."""
    ratios = r.get("ratios") or {}
    parts = []
    for bar in r.get("bars") or []:
        spread = ratios.get(bar.get("bar"))
        per_pass = f" (passes: {fmt(spread)})" if spread and len(spread) > 1 else ""
        parts.append(
            f"`{bar.get('bar')}`: {fmt(bar.get('observed'))}{per_pass}, {'pass' if bar.get('passed') else 'fail'}"
        )
    if not r.get("all_runs_ok", True):
        failed = [
            f"{name} seed {run.get('seed')}: {run.get('status')}, {_why(run)}{_recorded(run)}"
            for name, arm in r.get("arms", {}).items()
            for run in arm.get("runs", [])
            if run.get("status") != "ok"
        ]
        parts.append(f"not every run finished ok ({'; '.join(failed) or 'see the file'}; the file keeps each log tail)")
    ran = [f"{name} sha256 `{(p.get('sha256') or '')[:12]}`" for name, p in (r.get("peers") or {}).items()]
    if r.get("fa3_stand_in"):
        kind = r["fa3_stand_in"].get("kind") or "the --fa3-shim stand-in"
        ran.append(f"FlashAttention-3's interface on {kind}, sha256 `{(r['fa3_stand_in'].get('sha256') or '')[:12]}`")
    if ran:
        parts.append("scripts run: " + ", ".join(ran))
    if r.get("overrides"):
        parts.append(f"extra overrides `{' '.join(r['overrides'])}`: not the check's own settings")
    return "; ".join(parts)


HYDRA_TRAILER = "Set the environment variable HYDRA_FULL_ERROR=1"
"""How Hydra's own last line after a failed job begins: it never says what failed."""


def _why(run: dict[str, Any]) -> str:
    """What a failed run said of its failure: its result's ``error:`` line, else its last line but Hydra's."""
    tail = [str(line).strip() for line in run.get("log_tail") or []]
    errors = [line.removeprefix("error:").strip() for line in tail if line.startswith("error:")]
    if errors and errors[-1] != "None":
        return f"error `{_quote(errors[-1])}`"
    lines = [line for line in tail if line and not line.startswith(HYDRA_TRAILER)] or [""]
    return f"last line `{_quote(lines[-1])}`"


def _quote(line: str) -> str:
    return line.replace("`", "'")[:160]


def _recorded(run: dict[str, Any]) -> str:
    """The metrics a failed run wrote before it failed (the phases it finished), if any."""
    done = {k: v for k, v in (run.get("metrics") or {}).items() if v is not None}
    return f"; before it failed: {', '.join(f'{k} {fmt(v)}' for k, v in done.items())}" if done else ""


def section(check: Check, results: list[dict[str, Any]]) -> list[str]:
    """A check's part of the page. Prose is one line a paragraph: the page must stay short (<= 400 lines) with a
    result on every card, and Markdown joins the lines anyway."""
    where = (
        "a CPU (no GPU)" if check.gpus == 0 else f"{check.card_text}, {check.gpus} GPU{'s' if check.gpus > 1 else ''}"
    )
    runs = f"{len(check.seeds)} seed{'s' if len(check.seeds) > 1 else ''} x {check.repeats} pass"
    runs += "es" if check.repeats > 1 else ""
    if len(check.arms) > 1:
        runs += ", the arms side by side" if check.parallel else ", the arms alternated"
    out = [f"## {check.name}", "", f"{check.measures} {check.notes}".strip(), ""]
    for arm in check.arms:
        out.append(f"- arm `{arm.name}`: `{arm_command(check, arm)}`")
    bars = "; ".join(f"`{b.text}`" for b in check.bars)
    out += [f"- bar: {bars}. Needs {where}; corpus `{check.corpus.data}`; {runs}. Run: `{command(check)}`", ""]
    if not results:
        out += ["Not yet measured.", ""]
    for r in results:
        machine = r.get("machine") or {}
        commit = (r.get("commit") or "unknown")[:9] + ("-dirty" if r.get("dirty") else "")
        verdict = "**pass**" if r.get("passed") else "**fail**"
        out += [
            f"**{machine.get('card')}** ({machine.get('gpu_count', 0)} visible), {r.get('date')}, commit `{commit}`, "
            f"torch {r.get('torch')}: {verdict}. {_bar_line(r)}. Reproduce: `{r.get('command')}` "
            f"(`{r.get('_file')}`).",
            "",
        ]
        arms: Mapping[str, Any] = r.get("arms") or {}
        rows = [[name, *(fmt((arm.get("metrics") or {}).get(m)) for m in check.metrics)] for name, arm in arms.items()]
        out += [*_table(["arm", *check.metrics], rows), ""]
    return out


def render(checks: Iterable[Check], results: Path = RESULTS) -> str:
    checks = list(checks)
    latest = {c.name: latest_results(c, results) for c in checks}
    out = [
        "# Benchmarks",
        "",
        "<!-- Generated by `python -m speedrun.bench --render` from src/speedrun/bench/checks/ and",
        "benchmarks/results/: edit those, not this page. -->",
        "",
        "Every measured claim in these pages is a check: declared once in `src/speedrun/bench/checks/` (its arms, "
        "corpus, card and bar), run by `python -m speedrun.bench NAME` on one machine in one process, and recorded "
        "as `benchmarks/results/<check>/<date>_<card>_<commit>.json` with the card, torch, commit, corpus "
        "fingerprint, every run's metrics and log tail. Below: per check, the latest result on each card. A ratio "
        "always comes from one machine in one call (the arms alternate, or run side by side); figures from "
        "different files are not ratios.",
        "",
        "```bash",
        "python -m speedrun.bench --list                 # every check: card, GPUs, bar",
        "python -m speedrun.bench --dry-run kernel_tuned # the exact commands, with their environment",
        "python -m speedrun.bench kernel_tuned           # run it here; exit 2 (and no file) if this machine cannot",
        "python -m speedrun.bench --render               # this page, from the result files",
        "```",
        "",
        "The embedded corpus (4.1 M training tokens) is for speed: GPU runs pass over it many times, so its val_bpb "
        "measures the plumbing. Quality checks train on `python_sp1024`, built from the machine's Python "
        "installation (`scripts/prepare_data.py --source python`), or on parameter-golf's FineWeb shards "
        "([data](data.md)).",
        "",
    ]
    rows = []
    for c in checks:
        found = latest[c.name]
        state = ", ".join(
            f"{(r.get('machine') or {}).get('card')} {'pass' if r.get('passed') else 'fail'} ({r.get('date')})"
            for r in found
        )
        bars = "; ".join(f"`{b.text}`" for b in c.bars)
        rows.append([f"[{c.name}](#{c.name})", c.card_text, str(c.gpus), bars, state or "not yet measured"])
    out += [*_table(["check", "card", "GPUs", "bar", "latest"], rows), ""]
    body = [line for c in checks for line in section(c, latest[c.name])]
    while body and body[-1] == "":
        body.pop()
    return "\n".join([*(_wrap(line) for line in out), *body]) + "\n"
