"""``python -m speedrun.export``: finished runs -> a parameter-golf submission folder.

    python -m speedrun.export outputs/runs/2026-11-26/17-22-18-954404_default --out submission
    python -m speedrun.export <run seed 0> <run seed 1> <run seed 2> --out submission --name "My record"
    python -m speedrun.export outputs/multirun/2026-11-26/10-00-00-000000_default --out submission   # a sweep's jobs

The folder holds train_gpt.py (the runs' self-extracting file: `python train_gpt.py` or torchrun re-runs them; its
bytes are the code counted), train_gpt_human.py (the same code to read, comments kept; it re-runs the same),
README.md, submission.json, requirements.txt and one log per seed (train_seed<seed>.log); several runs must be
seeds of one config, and report their mean and std. A run that is not ok or whose artifact is over its cap is
refused unless --force; so is a train_gpt.py that is not the file the run wrote (the sha256 in its result.json), and
an --out that exists and holds an earlier export. An --out that is, holds or lies inside a run dir it exports, the
results database or outputs/, or an existing folder holding other files, is refused whatever the flags. submission.json claims the record track only for runs made with
track=pgolf_10min_16mb that meet its rules (conf/track/: 8xH100, 600 s of training, 600 s of evaluation, 16,000,000
bytes, the whole validation split), at least 3 seeds whose scored loss beats the standing record (conf/track/records/,
or --record) by 0.005 nats at p < 0.01, and a result.json its packed config and run.log confirm; otherwise the folder
is a non-record submission and says why. The folder is built
beside --out and renamed into place, so a failed export leaves nothing half written. docs/export.md has the whole
workflow.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import types
from collections.abc import Sequence
from pathlib import Path

from speedrun.artifact.code_count import HUMAN_FILE, WRAPPED_FILE
from speedrun.artifact.link import counted
from speedrun.artifact.wrap import CodeSource, build_wrapper, unwrap_payload
from speedrun.errors import PlanError
from speedrun.export.folder import Submission, log_name
from speedrun.export.run_dirs import ExportError, Run, check_runs, expand, load_run
from speedrun.export.track import RECORD_NAME, load_track, track_name
from speedrun.paths import REPO_ROOT, results_db_path
from speedrun.records.identity import code_fingerprint
from speedrun.records.rundir import is_regular, read_bytes
from speedrun.records.store import write_json
from speedrun.report.accept import Reference, parse_record


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m speedrun.export",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="run dirs, or a sweep dir (its jobs)")
    p.add_argument("--out", type=Path, required=True, help="the submission folder to write")
    p.add_argument(
        "--force",
        action="store_true",
        help="export runs that are not ok or over their cap, ship a train_gpt.py that does not match the run's "
        "record (flagged in submission.json), and replace an --out holding an earlier export (only its files: "
        "never a run dir, the results database, outputs/ or a folder holding anything else)",
    )
    p.add_argument("--name", help="the submission's name (default: the runs' name)")
    p.add_argument("--author", default="", help="submission.json's author")
    p.add_argument("--github-id", default="", help="submission.json's github_id")
    p.add_argument(
        "--track",
        default=RECORD_NAME,
        type=_track,
        help=f"the parameter-golf track to claim (default: {RECORD_NAME}, claimed only when every run was made "
        f"with track={RECORD_NAME} and meets its "
        "rules; else track_non_record_16mb, saying why)",
    )
    p.add_argument(
        "--record",
        metavar="REF",
        help="the standing record the acceptance test compares with: a merged record of conf/track/records/ by "
        "folder or PR (1855), or val_loss=MEAN[,std=S,n=N,val_bpb=B] (default: the best merged record of the data)",
    )
    p.add_argument("--blurb", default="", help="submission.json's blurb (default: one line of the runs' numbers)")
    p.add_argument("--summary", default="", help="submission.json's technique_summary (default: the settings)")
    return p


def _track(spelling: str) -> str:
    try:
        return track_name(spelling)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _record(text: str | None) -> Reference | None:
    if text is None:
        return None
    try:
        return parse_record(load_track(RECORD_NAME), text)
    except ValueError as e:
        raise ExportError(str(e)) from None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        out = export(args)
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0


def export(args: argparse.Namespace) -> str:
    """Write the folder; returns the one line that says what was written."""
    out: Path = args.out
    dirs = expand(list(args.runs))
    check_out(out, dirs, args.force)
    runs = [load_run(p) for p in dirs]
    check_runs(runs, args.force)
    code, human = wrapper_for(runs, args.force)
    sub = Submission(
        runs,
        code,
        human=human,
        name=args.name or str(runs[0].config.get("name")),
        author=args.author,
        github_id=args.github_id,
        track=args.track,
        summary=args.summary,
        blurb=args.blurb,
        record=_record(args.record),
    )
    write_folder(out, sub)
    if any(_logged_to_wandb(r.dir) for r in runs):  # the folder beside the run's curves (run.wandb_logger)
        from speedrun.run.wandb_logger import log_export

        for r in runs:
            log_export(r.dir, out, say=lambda line: print(line, file=sys.stderr))
    for problem in sub.code_problems():
        print(f"warning: {problem}; shipped anyway (--force), as submission.json's code_check says", file=sys.stderr)
    meta = sub.submission_json()
    spread = f" ± {meta['val_bpb_std']:.6f}" if meta["val_bpb_std"] is not None else ""
    return (
        f"wrote {out}: {WRAPPED_FILE} ({meta['bytes_code']:,} bytes)"
        + (f", {HUMAN_FILE}" if human is not None else "")
        + ", README.md, submission.json, requirements.txt, "
        f"{len(runs)} log(s); val_bpb {meta['val_bpb']:.6f}{spread} ({sub.bpb_key}), {meta['bytes_total']:,} bytes; "
        f"track {meta['track']}" + ("" if meta["record_track"] else " (not a record: submission.json's track_reason)")
    )


def _logged_to_wandb(run_dir: Path) -> bool:
    """Whether the run logged to W&B (its plan.json's logger), read without importing wandb."""
    try:
        return (json.loads((Path(run_dir) / "plan.json").read_text()).get("logger") or {}).get("name") == "wandb"
    except (OSError, ValueError):
        return False


EXPORT_FILES = (WRAPPED_FILE, HUMAN_FILE, "README.md", "submission.json", "requirements.txt")
_SEED_LOG = re.compile(r"^train_seed-?\d+\.log$")


def check_out(out: Path, run_dirs: list[Path], force: bool) -> None:
    """Refuse an --out the export must not replace, before anything is read: one that is, holds or lies in a run dir
    it exports, the results database or an outputs/ folder (whatever the flags), a path that is not a folder, or a
    folder holding anything but an earlier export's files; an earlier export is replaced only with ``force``."""
    target = out.resolve()  # `..` and symlinks resolved: aiming through a link aims at its target
    db = results_db_path()
    guarded = [(d.resolve(), f"the run dir {d}") for d in run_dirs]
    guarded.append((db.resolve(), f"the results database {db}"))
    outputs = {db.resolve().parent} | {p for d in run_dirs for p in d.resolve().parents if p.name == "outputs"}
    guarded.extend((p, f"the outputs folder {p}") for p in sorted(outputs))
    for place, what in guarded:
        where = (
            "is"
            if target == place
            else "lies inside"
            if place in target.parents
            else "holds"
            if target in place.parents
            else None
        )
        if where is not None:
            raise ExportError(
                f"--out {out} {where} {what}, which an export never writes into, over or above (whatever the flags); "
                "give --out a folder of its own, e.g. --out submission"
            )
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir() or out.is_symlink():
        raise ExportError(f"--out {out} exists and is not a folder; give --out a new folder, e.g. --out submission")
    names = sorted(os.listdir(out))
    foreign = [n for n in names if not (n in EXPORT_FILES or _SEED_LOG.match(n)) or not is_regular(out / n)]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ExportError(
            f"--out {out} holds files an export does not write ({shown}), which it never replaces (whatever the "
            "flags); give --out a new folder"
        )
    if names and not force:
        raise ExportError(f"{out} holds an earlier export; choose another --out, or pass --force to replace it")


def wrapper_for(runs: list[Run], force: bool) -> tuple[bytes, str | None]:
    """The first run's train_gpt.py and train_gpt_human.py (None for a run that wrote none); a raw-rule run wrote
    neither, so both are built from the source here, which must be the source that ran (its code_fingerprint) unless
    ``force``."""
    first = runs[0]
    if first.wrapper is not None:
        return first.wrapper, human_of(first, force)

    recorded, here = first.result.get("code_fingerprint"), code_fingerprint(REPO_ROOT)
    if recorded != here:
        why = (
            f"{first.dir} counted its code raw and wrote no {WRAPPED_FILE}; the export builds one from the source "
            f"here, which is not the source that ran (code_fingerprint {here}, the run's {recorded})"
        )
        if not force:
            raise ExportError(f"{why}: check out the run's commit {first.result.get('git_sha')}, or pass --force")
        first.code_problem = why
    try:  # the run's Plan, as plan.json holds it; its names are data, checked before they name a file
        plan = recorded_plan(first.dir)
        reserve = first.result.get("hessian_reserve_seconds") or 0.0
        code = CodeSource.snapshot().for_plan(plan, hessian_reserve=reserve, threads=first.result.get("cpu_threads"))
        return build_wrapper(code)
    except (PlanError, OSError, ValueError, AttributeError, TypeError) as e:
        raise ExportError(f"{first.dir / 'plan.json'}: {e}; export an untouched run dir") from None


def recorded_plan(run_dir: Path) -> types.SimpleNamespace:
    """A run dir's plan.json, read as the attributes of the Plan it was written from (its fields, nested)."""
    text = (run_dir / "plan.json").read_text(encoding="utf-8")
    return json.loads(text, object_hook=lambda d: types.SimpleNamespace(**d))


def human_of(run: Run, force: bool) -> str | None:
    """<run>/train_gpt_human.py, checked to be the code of its train_gpt.py (minified, it is that file's payload);
    None when the run wrote none (a run made before it did)."""
    path = run.dir / HUMAN_FILE
    if not is_regular(path):
        return None
    text = read_bytes(path).decode("utf-8")
    try:
        same = counted(text) == unwrap_payload(run.wrapper or b"")
    except (SyntaxError, ValueError, RuntimeError):
        same = False
    if not same:
        why = f"{path} is not the code of {run.dir / WRAPPED_FILE} (edited after the run?)"
        if not force:
            raise ExportError(f"{why}: re-run, or pass --force to ship {WRAPPED_FILE} without it")
        run.code_problem = run.code_problem or why
        return None
    return text


def write_folder(out: Path, sub: Submission) -> None:
    """Every file into a temporary sibling of ``out``, then renamed into place (a replaced ``out`` goes last)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        (tmp / WRAPPED_FILE).write_bytes(sub.code)
        if sub.human is not None:
            (tmp / HUMAN_FILE).write_text(sub.human, encoding="utf-8")
        (tmp / "README.md").write_text(sub.readme())
        write_json(tmp / "submission.json", sub.submission_json())
        (tmp / "requirements.txt").write_text(sub.requirements())
        for run in sub.runs:
            if is_regular(run.log):  # a regular file of the run dir only: a symlinked run.log is never published
                (tmp / log_name(run)).write_bytes(read_bytes(run.log))
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 is for while it is half written
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink()
        else:
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
