"""python -m speedrun.bench: list, show, run and render the declared checks (speedrun/bench/checks/).

    python -m speedrun.bench --list
    python -m speedrun.bench --dry-run kernel_tuned
    python -m speedrun.bench kernel_tuned
    python -m speedrun.bench baseline_vs_pgolf --peer pgolf_baseline=peers/pgolf_baseline/train_gpt.py
    python -m speedrun.bench --render

Exit status of a run: 0 every bar passed, 1 a bar failed or a run did not finish, 2 this machine cannot run the
check (one line says why; nothing is written). ``--render --check`` exits 1 when docs/benchmarks.md is stale.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

from speedrun.bench import fa4
from speedrun.bench import machine as hw
from speedrun.bench.checks import CHECKS
from speedrun.bench.readiness import why_not
from speedrun.bench.render import PAGE, RESULTS, render
from speedrun.bench.runner import reproduce, run_check, write_atomic
from speedrun.bench.spec import Check, RunArm
from speedrun.bench.steps import Options, corpus_dir, plan


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m speedrun.bench",
        description="Declared benchmark checks: run one on this machine, or render docs/benchmarks.md.",
    )
    parser.add_argument("name", nargs="?", help="the check to run (see --list)")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true", help="every check: name, card, GPUs, bar")
    what.add_argument(
        "--dry-run",
        nargs="?",
        const=True,
        metavar="NAME",
        help="print the commands each arm would run, with their env (`--dry-run NAME` or `NAME --dry-run`)",
    )
    what.add_argument("--render", action="store_true", help="regenerate docs/benchmarks.md from the result files")
    parser.add_argument(
        "--check", action="store_true", help="with --render: write nothing, exit 1 if the page is out of date"
    )
    parser.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a peer's script, e.g. pgolf_baseline=/path/to/train_gpt.py (default: peers/NAME/train_gpt.py)",
    )
    parser.add_argument(
        "--fa3-shim",
        type=Path,
        metavar="DIR",
        help="a folder with a stand-in flash_attn_interface.py for peers (default where FlashAttention-3 is not "
        "installed and FlashAttention-4 is: FA3's interface on FA4)",
    )
    parser.add_argument("--repeats", type=int, help="passes over the arms instead of the check's own")
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra python -m run override for every speedrun arm (recorded in the result)",
    )
    parser.add_argument("--timeout", type=float, help="seconds a run may take, instead of the check's own")
    parser.add_argument("--results", type=Path, help="where result files go (default benchmarks/results)")
    parser.add_argument("--work", type=Path, help="where runs write (default outputs/bench)")
    parser.add_argument("--commit", help="the code's commit, for a copy of the tree without .git (SHA or SHA-dirty)")
    return parser


def options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Options:
    peers = {}
    for item in args.peer:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            parser.error(
                f"--peer {item}: write NAME=PATH, e.g. --peer pgolf_baseline=peers/pgolf_baseline/train_gpt.py"
            )
        peers[name] = Path(path).expanduser()
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: give 1 or more")
    opts = Options(
        peers=peers,
        fa3_shim=args.fa3_shim,
        repeats=args.repeats,
        overrides=tuple(args.override),
        timeout_s=args.timeout,
        commit=args.commit,
    )
    if args.results is not None:
        opts = replace(opts, results=args.results.resolve())
    if args.work is not None:
        opts = replace(opts, work=args.work.resolve())
    if opts.fa3_shim is None and importlib.util.find_spec("flash_attn_interface") is None and fa4.installed():
        # FA4 installed, FA3 not: the peers' FA3 calls run on FA4's kernels (speedrun.bench.fa4)
        opts = replace(opts, fa3_shim=fa4.write_shim(opts.work / "fa4_shim"))
    return opts


def find(name: str, parser: argparse.ArgumentParser) -> Check:
    if name not in CHECKS:
        parser.error(f"no check named {name!r}; python -m speedrun.bench --list shows them")
    return CHECKS[name]


def list_checks() -> str:
    width = max(len(n) for n in CHECKS)
    lines = []
    for c in CHECKS.values():
        bars = "; ".join(b.text for b in c.bars)
        lines.append(f"{c.name:<{width}}  {c.card_text:<14} {c.gpus} GPU  {bars}")
    return "\n".join(lines)


def dry_run(check: Check, opts: Options) -> str:
    here = hw.detect()
    data_dir = corpus_dir(check, resolve_embedded=False)
    lines = [f"# {check.name}: {check.measures}", f"# {reproduce(check, opts)}"]
    reason = why_not(check, opts, here)
    lines.append(f"# here ({here.card}): " + (f"cannot run: {reason}" if reason else "can run"))
    if check.corpus.path is not None and check.corpus.prepare:
        lines.append(f"# corpus, when {check.corpus.path} holds no shards: {' '.join(check.corpus.prepare)}")
    for w, wave in enumerate(plan(check, opts, here, data_dir), 1):
        together = " (these at once)" if check.parallel and len(wave) > 1 else ""
        lines.append(f"# pass {w}{together}")
        for step in wave:
            lines.append(step.shell())
            if step.gate is not None:
                lines.append(f"#   waits after its warm-up until {step.gate} exists: the runner creates it when the "
                             "peer logs its first step (by hand: touch it, or leave SPEEDRUN_START_GATE out)")  # fmt: skip
            if isinstance(step.arm, RunArm) and step.arm.stop_after_s is not None:
                lines.append(f"#   SIGTERM to it {step.arm.stop_after_s:g} s after its `ready to train` line, then:")
                lines.append(step.shell(step.resume_argv))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list:
        print(list_checks())
        return 0
    if args.render:
        text = render(CHECKS.values(), args.results.resolve() if args.results else RESULTS)
        if args.check:
            stale = not PAGE.is_file() or PAGE.read_text() != text
            print(f"{PAGE} is {'out of date: python -m speedrun.bench --render' if stale else 'up to date'}")
            return 1 if stale else 0
        write_atomic(PAGE, text)
        print(f"wrote {PAGE} ({text.count(chr(10))} lines)")
        return 0
    opts = options(args, parser)
    if args.dry_run:
        name = args.name if args.dry_run is True else args.dry_run
        if not name:
            parser.error("--dry-run needs a check's name (--list shows them)")
        print(dry_run(find(name, parser), opts))
        return 0
    if not args.name:
        parser.error("name a check to run (--list shows them), or give --list, --dry-run NAME or --render")
    status, _ = run_check(find(args.name, parser), opts)
    return status


if __name__ == "__main__":
    sys.exit(main())
