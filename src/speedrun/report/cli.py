"""``python -m speedrun.report``: the leaderboard, significance against a baseline, plots and an HTML report.

    python -m speedrun.report                                   # every run in outputs/results.sqlite
    python -m speedrun.report --sweep latest --baseline attn=sdpa
    python -m speedrun.report --where model.n_layer=2 --group-by attn,precision --out outputs/report
    python -m speedrun.report --target val_loss=3.28 --baseline attn=sdpa   # time to target
    python -m speedrun.report --group-by ablate --baseline ablate=none --alternative two-sided   # an ablation
    python -m speedrun.report --accept pgolf                          # parameter-golf's rule, against the record
    python -m speedrun.report --accept pgolf --record 1855            # ... against a named merged record

Runs are grouped by ``--group-by`` keys (default: the overrides that vary among the selected runs, seeds
folded, plus ``hardware`` and ``device_name`` when they vary), so each group is one combination on one card and
its runs are repeats. A key is looked up as a results column first (what ran: ``attn``, ``hardware``,
``precision`` are the resolved values), then in the composed config (``optim.matrix_lr``; a group such as
``model`` gives its ``name``), then in the Plan. ``--baseline KEY=VALUE`` compares every group with the group
that has KEY=VALUE and the same other keys, by a one-sided Welch t-test of H1: the group's mean ``--metric``
(val_bpb) is lower than the baseline's (``--alternative greater`` for an ablation, where taking a lever out
should make it higher; ``two-sided`` for either way). Runs scored on different evaluation sets
(``eval_fingerprint``) are never ranked or tested against each other: group by ``eval_fingerprint`` or select one
set with ``--where``. Several groups tested against a baseline get Holm-adjusted p-values beside the raw ones, and
the verdict reads the adjusted one. ``--accept pgolf`` judges each group by parameter-golf's rule for a record: its
scored loss against the standing record's published mean (conf/track/records/, or ``--record``), its numbers read
from conf/track/ (speedrun.report.accept).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from speedrun.config.track import TrackConfig
from speedrun.report.accept import Reference, accept_table, judge, parse_accept, parse_record, verdict_line
from speedrun.report.dashboard import preflight, run_dashboard
from speedrun.report.groups import (
    Group,
    compare,
    default_group_keys,
    eval_sets,
    group_runs,
    rank_groups,
    tested_count,
)
from speedrun.report.leaderboard import (
    extra_columns,
    groups_csv,
    holm_note,
    metrics_for,
    repeated_note,
    shared_note,
    table_rows,
    ttest_rows,
)
from speedrun.report.page import Table, render_html, runs_section
from speedrun.report.plots import make_plots
from speedrun.report.run_rows import LOST, Run, UnreadableDatabase
from speedrun.report.selection import check_metric, load_runs, parse_pairs
from speedrun.report.target import parse_target, target_table
from speedrun.report.view import console_table, fold_equal, hidden_groups, hidden_note, wrapped
from speedrun.stats import ALTERNATIVES
from speedrun.tables import csv_text

H1 = {"less": "is lower than", "greater": "is higher than", "two-sided": "differs from"}
TEST_NAME = {
    "less": "one-sided Welch t-test",
    "greater": "one-sided Welch t-test",
    "two-sided": "two-sided Welch t-test",
}
LOWER_IS_BETTER = ("val_bpb", "val_bpb_quant", "val_bpb_ttt", "val_bpb_ttt_base", "val_loss")
"""The quality metrics, lower better. --metric takes any numeric result key (selection.numeric_keys); the table
ranks lowest first whatever the key."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m speedrun.report",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--db", type=Path, default=Path("outputs/results.sqlite"), help="results database")
    p.add_argument(
        "--sweep", action="append", default=[], metavar="ID", help="a sweep id, 'latest', or a sweep dir (repeatable)"
    )
    p.add_argument("--name", help="only runs with this name")
    p.add_argument("--hardware", help="only runs on this hardware profile (the resolved one: cpu, t4, h100...)")
    p.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only runs where KEY (column or config key, e.g. optim.matrix_lr) is VALUE; "
        "VALUE may be a comma list (repeatable)",
    )
    p.add_argument("--group-by", metavar="KEYS", help="comma-separated keys (default: the overrides that vary)")
    p.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="compare every group with the group where KEY=VALUE (Welch t-test, H1 from --alternative)",
    )
    p.add_argument(
        "--metric",
        default="val_bpb",
        help="numeric result key to rank (lowest first) and test, e.g. val_loss_quant; an unknown one lists them",
    )
    p.add_argument("--alpha", type=float, default=0.05, help="significance level for the verdict")
    p.add_argument(
        "--alternative",
        default="less",
        choices=ALTERNATIVES,
        help="H1 of the t-test against the baseline: less (the group's mean is lower, i.e. better: the default), "
        "greater (higher: an ablation that takes a lever out makes it worse), two-sided (either way)",
    )
    p.add_argument(
        "--target",
        metavar="METRIC=VALUE",
        help="time to target (val_loss=3.28 or val_bpb=X): rank groups trained with budget.target_METRIC=VALUE by "
        "mean time_to_target, with the acceptance test of the final METRIC (p < 0.01)",
    )
    p.add_argument(
        "--accept",
        metavar="TRACK",
        help="judge each group by a contest's acceptance rule, read from conf/track/: pgolf (parameter-golf: the "
        "scored loss, TTT's else the quantized artifact's, at least the track's margin below the standing record's "
        "published mean, one-sided one-sample t-test; Welch against --baseline's seeds when given), mng "
        "(modded-nanogpt: below the track's threshold), or a track's name",
    )
    p.add_argument(
        "--record",
        metavar="REF",
        help="--accept's standing record: a merged record of conf/track/records/ by folder or PR (1855), or its "
        "numbers as val_loss=MEAN[,std=S,n=N,val_bpb=B] (default: the best merged record of the runs' data)",
    )
    p.add_argument(
        "--holm",
        action="store_true",
        help="--accept: Holm-adjust the p-values of several candidates (the contest applies no correction)",
    )
    p.add_argument("--all", action="store_true", help="show every group, those with no ok run too, and every column")
    p.add_argument("--out", type=Path, default=Path("outputs/report"), help="where CSV, PNGs and report.html go")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--open", action="store_true", help="open report.html in the web browser once written")
    p.add_argument(
        "--curve-x", choices=("tokens", "seconds"), default="tokens", help="x-axis of the train and validation curves"
    )
    p.add_argument(
        "--wandb-dashboard",
        metavar="SWEEP",
        help="build a W&B workspace for this sweep group (speedrun.report.dashboard) and exit",
    )
    p.add_argument("--wandb-project", default="speedrun", help="W&B project of --wandb-dashboard")
    p.add_argument("--wandb-entity", help="W&B entity of --wandb-dashboard")
    p.add_argument("--dry-run", action="store_true", help="--wandb-dashboard: print and save the layout only")
    p.add_argument(
        "--resync",
        action="store_true",
        help="rewrite every row whose run dir's result.json holds another final status from that result.json "
        "(its record wins over a row whose last write failed or that was marked lost), say which, and exit",
    )
    return p


def resync(db: Path) -> int:
    """``--resync``: rows rewritten from their run dirs' result.json (speedrun.records.store.ResultsDB.resync)."""
    import sqlite3

    from speedrun.records.store import ResultsDB

    if not db.is_file():
        print(f"error: no results database at {db}; give --db <path>", file=sys.stderr)
        return 2
    try:
        changed = ResultsDB(db).resync()
    except (sqlite3.Error, OSError) as e:
        print(f"error: {db} cannot be rewritten ({type(e).__name__}: {e}); check its permissions", file=sys.stderr)
        return 1
    for run_id, was, now in changed:
        print(f"{run_id}: {was} -> {now} (its result.json)")
    print(f"{len(changed)} row(s) rewritten from result.json in {db}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.resync:
        return resync(args.db)
    if args.wandb_dashboard and not args.dry_run:
        problem = preflight(args.wandb_entity)  # before any work: no credentials is one line, not a traceback
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    try:
        target = parse_target(args.target) if args.target else None
        track = parse_accept(args.accept) if args.accept else None
        record = parse_record(track, args.record) if track is not None and args.record else None
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    where = parse_pairs(args.where, "--where")
    baseline = parse_pairs(args.baseline, "--baseline")
    try:
        runs = load_runs(
            args.db,
            args.sweep + ([args.wandb_dashboard] if args.wandb_dashboard else []),
            args.name,
            args.hardware,
            where,
        )
    except UnreadableDatabase as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if not runs:
        print(f"no runs match in {args.db}", file=sys.stderr)
        return 2
    if args.wandb_dashboard:
        sweep = runs[-1].row.get("sweep") or args.wandb_dashboard
        return run_dashboard(runs, sweep, args.wandb_project, args.wandb_entity, args.dry_run, args.out)
    problem = check_metric(args.metric, runs)
    if args.record and track is None:
        problem = "--record names the standing record of --accept: add --accept pgolf"
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    board = leaderboard(args, runs, where, baseline)
    if board is None:
        print(f"--baseline {','.join(f'{k}={v}' for k, v in baseline.items())}: no group matches", file=sys.stderr)
        return 2
    print_board(args, board)
    target_html = time_to_target(args, runs, board.keys, target, baseline) if target is not None else None
    accept_html = acceptance(args, board, track, record) if track is not None else None
    write_report(args, board, target_html, accept_html)
    if args.open:
        open_page(args.out / "report.html")
    return 0


@dataclass
class Board:
    """The leaderboard of the selected runs, as printed and as the page shows it."""

    keys: list[str]
    groups: list[Group]
    metrics: dict[str, str]
    extras: list[str]
    table: Table
    ttest: Table | None
    """The t-tests against the baseline (None: no --baseline)."""
    meta: list[str]
    notes: list[str]
    footnotes: list[str]
    above: list[str]
    """Lines right above the leaderboard: the groups hidden, the columns equal on every row."""
    droppable: list[str]
    """The leaderboard's columns a narrow terminal may lose, highest priority first."""


def leaderboard(
    args: argparse.Namespace, runs: list[Run], where: dict[str, str], baseline: dict[str, str]
) -> Board | None:
    """Group, compare with the baseline and rank the runs; None when --baseline names no group."""
    keys = [k.strip() for k in args.group_by.split(",") if k.strip()] if args.group_by else default_group_keys(runs)
    keys = keys or ["name"]
    keys += [k for k in baseline if k not in keys]
    groups = group_runs([r for r in runs if r.status != "running"], keys)
    sets = eval_sets(groups)
    if baseline:
        compare(groups, baseline, args.metric, args.alternative)
        if not any(g.is_baseline for g in groups):
            return None
    groups = rank_groups(groups, args.metric, sets)
    metrics = metrics_for(groups, args.metric)
    extras = extra_columns(groups, keys, sets)
    hidden = [] if args.all else hidden_groups(groups)
    shown = [g for g in groups if g not in hidden]
    table = table_rows(shown, keys, metrics, extras, ranked=True, alpha=args.alpha if baseline else None)
    said = ""
    if not args.all:  # what every row shares is said once; the ranked metric and the test always stay
        table, said = fold_equal(table, ["#", args.metric, "delta", "p", "p (Holm)", "verdict"])
    filters = [f"--sweep {s}" for s in args.sweep] + [
        f"--{k} {v}" for k, v in (("name", args.name), ("hardware", args.hardware)) if v
    ]
    filters += [f"--where {k}={v}" for k, v in where.items()]
    return Board(
        keys=keys,
        groups=groups,
        metrics=metrics,
        extras=extras,
        table=table,
        ttest=ttest_rows(shown, args.metric, args.alpha) if baseline else None,
        meta=_meta(args, runs, keys, filters, baseline),
        notes=sets.messages(keys, " ".join(["python -m speedrun.report", *filters])) + shared_note(groups),
        footnotes=repeated_note(groups),
        above=hidden_note(hidden) + ([said] if said else []),
        # the raw p goes last, and only where the Holm-adjusted one stays beside the verdict
        droppable=[*(["p"] if tested_count(groups) > 1 else []), "n", "failures", "delta", *extras, *list(metrics)[1:]],
    )


def print_board(args: argparse.Namespace, board: Board) -> None:
    print("\n".join(board.meta))
    if board.notes:
        print("\n" + "\n".join(board.notes))
    print(f"\nleaderboard ({args.metric}, lowest first):", *wrapped(board.above), sep="\n")
    print(console_table(*board.table, board.droppable, [*board.keys, "verdict"]))
    if board.footnotes:
        print("\n".join(board.footnotes))
    if board.ttest is not None:
        holm = holm_note(board.groups)
        droppable = ["delta", "t", "df", "mean", "mean_base", "n", "n_base", "std", "std_base"]
        text = console_table(*board.ttest, droppable, [*board.keys, "verdict"])
        print(f"\nagainst the baseline ({TEST_NAME[args.alternative]} on {args.metric}):\n" + holm + text)


def acceptance(
    args: argparse.Namespace, board: Board, track: TrackConfig, record: Reference | None
) -> tuple[str, list[str], Table]:
    """The --accept section, printed and written to accept.csv: (heading, notes, table) for the page."""
    shown = [g for g in board.groups if args.all or g not in hidden_groups(board.groups)]
    judged = judge(track, shown, record, correct=args.holm)
    notes, headers, rows = accept_table(track, judged, board.keys)
    heading = f"acceptance ({track.name})"
    table = console_table(headers, rows, ["against", "t", "df", "mean", "mean_ref", "loss"], [*board.keys, "verdict"])
    verdicts = [verdict_line(j, track) for j in judged]  # one line per group a judge can sign, under the table
    print(f"\n{heading}:\n" + "\n".join(wrapped(notes)) + "\n" + table + "\n" + "\n".join(wrapped(verdicts)))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "accept.csv").write_text(csv_text(headers, [dict(zip(headers, r)) for r in rows]))
    return heading, notes + verdicts, (headers, rows)


def time_to_target(
    args: argparse.Namespace, runs: list[Run], keys: list[str], target: tuple[str, float], baseline: dict[str, str]
) -> tuple[str, list[str], Table]:
    """The --target section, printed and written to target.csv: (heading, notes, table) for the page."""
    t_notes, t_headers, t_rows = target_table(runs, keys, *target, baseline)
    heading = f"time to target ({target[0]} <= {target[1]:g})"
    print(f"\n{heading}:\n" + "\n".join(t_notes))
    print(
        console_table(t_headers, t_rows, ["steps_to_target"], keys)
        if t_rows
        else "no run in the selection trained with this target"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "target.csv").write_text(csv_text(t_headers, [dict(zip(t_headers, r)) for r in t_rows]))
    return heading, t_notes, (t_headers, t_rows)


def write_report(
    args: argparse.Namespace,
    board: Board,
    target_html: tuple[str, list[str], Table] | None,
    accept_html: tuple[str, list[str], Table] | None = None,
) -> None:
    """leaderboard.csv, the plots and report.html into --out."""
    out, groups = args.out, board.groups
    out.mkdir(parents=True, exist_ok=True)
    (out / "leaderboard.csv").write_text(groups_csv(groups, board.keys, list(board.metrics), board.extras))
    plots = {} if args.no_plots else make_plots(groups, out, args.metric, curve_x=args.curve_x)
    failures = [
        [r.status, g.label(), r.error[:300], str(r.row.get("run_dir") or "")]
        for g in groups
        for r in g.runs
        if r.status != "ok"
    ]
    shown = [g for g in groups if args.all or g not in hidden_groups(groups)]
    holm = tested_count(groups) > 1
    classes = ["baseline" if g.is_baseline else "better" if _better(g, args.alpha, holm) else "" for g in shown]
    links = [f'<a href="#runs-{groups.index(g)}">{len(g.runs)} run(s)</a>' for g in shown]
    page = render_html(
        "speedrun report",
        board.meta,
        board.notes,
        board.table,
        classes,
        board.ttest,
        failures,
        plots,
        runs_html=runs_section(groups, out),
        board_links=links,
        target=target_html,
        board_notes=board.footnotes,
        board_above=board.above,
        ttest_note=holm_note(groups),
        accept=accept_html,
    )
    (out / "report.html").write_text(page)
    print(f"\nwrote {out / 'leaderboard.csv'}" + "".join(f", {p}" for p in plots.values()) + f", {out / 'report.html'}")


def open_page(page: Path) -> bool:
    """``--open``: the page in the default web browser; one line instead where this machine has none (a server)."""
    import webbrowser

    try:
        opened = webbrowser.open(page.resolve().as_uri())
    except webbrowser.Error:
        opened = False
    if not opened:
        print(f"--open: no web browser to open it here; open {page.resolve()} on a machine with one")
    return opened


def _better(g: Group, alpha: float, holm: bool) -> bool:
    p = g.p_holm if holm and g.p_holm is not None else g.welch.p if g.welch else None
    return g.welch is not None and p is not None and p < alpha and g.welch.delta < 0


def _meta(
    args: argparse.Namespace, runs: Sequence, keys: Sequence[str], filters: list[str], baseline: dict[str, str]
) -> list[str]:
    running = sum(r.status == "running" for r in runs)
    lost = sum(r.status == LOST for r in runs)
    meta = [
        f"database: {args.db.resolve()}",
        f"runs: {len(runs)} ({running} still running, not in the tables; {lost} lost: their process died without "
        f"a word, counted as failures)",
        f"grouped by: {', '.join(keys)}; cells: mean ± sample std over ok runs; failures: runs that did not end "
        f"ok; #: rank within an evaluation set",
        f"generated: {time.strftime('%Y-%m-%d %H:%M:%S')}",
    ]
    if filters:
        meta.insert(1, "filters: " + " ".join(filters))
    if baseline:
        meta.append(
            f"baseline: {', '.join(f'{k}={v}' for k, v in baseline.items())}; H1: the group's mean "
            f"{args.metric} {H1[args.alternative]} its baseline's ({TEST_NAME[args.alternative]}), alpha {args.alpha:g}"
        )
    return meta
