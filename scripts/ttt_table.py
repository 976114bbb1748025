"""Test-time train a finished run's model under several TTT settings and print one Markdown table: val_bpb_ttt,
val_bpb_ttt_base beside it, the gain, TTT seconds, tokens per second and the compile warm-up.

    python scripts/ttt_table.py outputs/runs/<date>/<time>_<name> ttt.max_seconds=600
    python scripts/ttt_table.py <run dir> --setting "rank 32=ttt.rank=32 ttt.alpha=48"
    python scripts/ttt_table.py <pgolf_pr2014 run dir> --ttt run ttt.compile=true \
        --setting "x0.75=ttt.local_lr_mult=0.75" --setting "x1=ttt.local_lr_mult=1"
    torchrun --standalone --nproc_per_node 4 scripts/ttt_table.py <run dir> --out <dir>   # TTT on 4 ranks

Under torchrun every setting runs on all the ranks, the documents dealt over them and the sums all-reduced, as a
run of dist.nproc=N does its TTT phase; rank 0 writes the table. So one trained model gives the 1-rank and the
N-rank rows of the same settings (whether N ranks score as one, and how much faster), whatever number of GPUs
it trained on.

The run's own config (``.hydra/config.yaml``) is rebuilt on this machine with the overrides given after the run dir
(dotted keys, applied to every setting), then the records' TTT (conf/ttt/record.yaml) on top (``--ttt run`` keeps
the run's own TTT instead), then each setting's dotted overrides. TTT adapts the model the run exported: the
dequantized artifact (``model.<quant>.<compressor>`` in the run dir) when there is one, as a run's TTT phase does,
else the float weights (``model.pt``, written with quant.keep_weights=true, or the newest checkpoint's). Without
``--setting`` the ladder is LADDER: the records' TTT, then its global phases 1 and 0, then each of its LoRA options
switched back to its default, then compiled. Each setting runs the TTT phase exactly as a run does
(speedrun.run.finish.Finish.test_time_train); the table is also written to ``<run dir>/ttt_table/table.md`` (or
``--out``), and each row's keys to ``rows.json`` beside it.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from quant_table import float_weights, load_config

ROOT = Path(__file__).resolve().parents[1]
LADDER = [
    ("record: 3 phases", []),
    ("1 phase", ["ttt.phased.phases=1"]),
    ("0 phases", ["ttt.phased.phases=0"]),
    ("no warm-start A", ["ttt.warm_start_a=false"]),
    ("no alpha (x1)", ["ttt.alpha=null"]),
    ("no weight decay", ["ttt.weight_decay=0"]),
    ("no head adapter", ["ttt.targets=q,k,v,attn_bypass,mlp_bypass"]),
    ("compiled", ["ttt.compile=true"]),
]
"""(label, overrides on top of the records' TTT)."""


def record_ttt() -> list[str]:
    """conf/ttt/record.yaml as dotted overrides (ttt.rank=96, ...; its nested phased block as ttt.phased.*)."""
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "ttt" / "record.yaml"))
    assert isinstance(node, dict)
    node.pop("defaults", None)

    def flat(prefix: str, value: Any) -> list[str]:
        if isinstance(value, dict):
            return [item for k, v in value.items() for item in flat(f"{prefix}.{k}", v)]
        return [f"{prefix}={'null' if value is None else value}"]

    return flat("ttt", node)


def base_overrides(ttt: str, overrides: list[str]) -> list[str]:
    """What every row applies to the run's config before its own keys: one process, eager TTT (a setting or an
    override may compile it), the records' TTT unless ``ttt == "run"``, then the command line's dotted keys."""
    start = record_ttt() if ttt == "record" else []
    return ["dist.nproc=1", "dist.nodes=1", "ttt.compile=false", *start, *overrides]


def parse_setting(text: str) -> tuple[str, list[str]]:
    label, _, overrides = text.partition("=")
    if not overrides:
        raise SystemExit(f"--setting {text!r}: write LABEL=OVERRIDES, e.g. 'rank 32=ttt.rank=32 ttt.alpha=48'")
    return label, overrides.split()


def exported_weights(run_dir: Path, plan: Any, log: Any) -> tuple[dict[str, Any], str]:
    """The weights a run's TTT phase adapts: the artifact's round trip if the run wrote one, else the float ones."""
    from speedrun.core.quant import dequantize_state_dict, load_packed

    q = plan.quant
    artifact = run_dir / f"model.{q.name}.{q.compressor}"
    if q.name != "off" and artifact.is_file():
        return dequantize_state_dict(
            load_packed(artifact.read_bytes(), str(q.compressor))
        ), f"the dequantized {artifact.name}"
    return float_weights(run_dir, log), "the float weights (no artifact in the run dir)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("overrides", nargs="*", help="dotted keys for every setting, e.g. ttt.max_seconds=600")
    parser.add_argument("--setting", action="append", default=[], help="LABEL=OVERRIDES (repeatable)")
    parser.add_argument(
        "--rows", help="only these rows of the ladder, by index from 0 (e.g. 0,2,4), to split it over GPUs"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="where table.md, rows.json and each setting's files go (default <run dir>/ttt_table); "
        "two tables of one run, e.g. halves of the ladder on two GPUs, need two",
    )
    parser.add_argument(
        "--ttt",
        choices=("record", "run"),
        default="record",
        help="the TTT every setting starts from: the records' (conf/ttt/record.yaml, the default) or the run's own "
        "(e.g. experiment=pgolf_pr2014's, to measure one of its settings on its model)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run each setting under torch.profiler and write where its time went to <row>/profile.txt "
        "(slows TTT down: keep ttt.max_seconds short)",
    )
    args = parser.parse_intermixed_args(argv)  # dotted keys may follow an option (--ttt run ttt.compile=true)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    log = logging.getLogger("ttt_table").info

    import torch

    from speedrun.distributed import world as ranks
    from speedrun.hardware import profiles as hardware
    from speedrun.plan import resolve
    from speedrun.run.build import build_attention, build_data, build_model
    from speedrun.run.finish import Finish

    run_dir = args.run_dir.resolve()
    settings = [parse_setting(s) for s in args.setting] or LADDER
    rows_kept = list(range(len(settings)))  # each setting's index in the whole list: its folder's name
    if args.rows:
        try:
            rows_kept = [int(i) for i in args.rows.split(",")]
        except ValueError:
            parser.error(f"--rows {args.rows}: give row indices separated by commas, e.g. 0,2,4")
        if not all(0 <= i < len(settings) for i in rows_kept):
            parser.error(f"--rows {args.rows}: rows are 0 to {len(settings) - 1} here")
        settings = [settings[i] for i in rows_kept]
    # under torchrun, this rank (its GPU bound before anything touches CUDA); else one process
    world = ranks.current()
    device = hardware.detect()
    # the ranks are this table's, whatever the run trained on: its dist.* are read back as "what is here"; TTT eager
    # unless a setting or an override compiles it (a run of experiment=pgolf_record compiled its own)
    base = base_overrides(args.ttt, args.overrides)
    plans = [
        resolve(load_config(run_dir, [*base, *extra]), device, cwd=Path.cwd(), world=world.info)
        for _, extra in settings
    ]
    first = plans[0]
    world.init(first)  # the process group, on several ranks: TTT shards the documents and all-reduces the sums
    world.quiet()
    if world.rank > 0:
        logging.getLogger("ttt_table").setLevel(logging.WARNING)
    data = build_data(first, log)
    model, _, eval_forward, _ = build_model(first, build_attention(first), data.bos_id)
    weights, source = exported_weights(run_dir, first, log)
    state = {k: v.to(model.state_dict()[k].dtype) for k, v in weights.items()}
    result = json.loads((run_dir / "result.json").read_text()) if (run_dir / "result.json").is_file() else {}
    if first.model.loop.on and (result.get("stages") or [{}])[-1].get("loop"):
        model.set_loop(True)  # the run ended with its loop on: adapt the model as it was exported
    # a subset of rows writes apart by default, so two GPUs running two subsets never overwrite each other's table
    out = args.out or run_dir / ("ttt_table" if not args.rows else f"ttt_table_rows{args.rows.replace(',', '_')}")
    if world.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (label, _), plan in zip(rows_kept, settings, plans):
        model.load_state_dict(state)
        model.eval()
        where = out / str(i)
        if world.rank == 0:
            where.mkdir(exist_ok=True)
        finish = Finish(plan, model, eval_forward, data, where, log, world=None if world.single else world)
        if args.profile and world.rank == 0:
            profile_ttt(finish, where / "profile.txt", log)
        else:
            finish.test_time_train()
        rows.append({"setting": label, "world_size": world.world_size, **finish.out})
        if world.rank > 0:
            continue
        # after every row, so a run cut short (a time limit, a crash in a later row) keeps the rows it finished
        table = markdown(rows, source, torch.__version__, first.device_name, world.world_size)
        write_atomic(out / "table.md", table)
        write_atomic(out / "rows.json", json.dumps(rows, indent=1, default=str) + "\n")
    world.shutdown(clean=True)
    if world.rank == 0:
        print(table)
    return 0


def profile_ttt(finish: Any, path: Path, log: Any) -> None:
    """The row's TTT under torch.profiler: GPU busy time against TTT's wall time (a low share means the GPU waits on
    Python and kernel launches, not arithmetic), then the operators by GPU time and by CPU time."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    # from TTT's clock on: the compile warm-up under the profiler makes minutes of tracing events to count (more
    # than a 10-minute job has left after TTT), and is not what a step costs
    prof = profile(activities=activities)
    started: list[bool] = []

    def start() -> None:
        prof.start()
        started.append(True)

    finish.on_ttt_clock = start
    try:
        finish.test_time_train()
    finally:
        finish.on_ttt_clock = None
        if started:
            prof.stop()
    if not started:
        write_atomic(path, "TTT's clock never started: nothing profiled\n")
        return
    events = prof.key_averages()
    wall = finish.out.get("ttt_seconds") or 0.0
    # kernels only: an operator's self_device_time_total repeats its kernels' time, so summing every event counts it twice
    gpu_us = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA) if cuda else 0
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"))
    head = (
        f"TTT {wall:.1f} s under the profiler (compile warm-up apart); GPU busy {gpu_us / 1e6:.1f} s "
        f"({gpu_us / 1e6 / wall:.0%} of it); kernel launches {launches:,}; tokens scored {finish.out.get('ttt_tokens_scored')}"
        if wall
        else "TTT scored nothing"
    )
    parts = [head, ""]
    if cuda:
        parts += [events.table(sort_by="self_device_time_total", row_limit=45), ""]
    parts.append(events.table(sort_by="self_cpu_time_total", row_limit=25))
    write_atomic(path, "\n".join(parts) + "\n")
    log(head)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def markdown(rows: list[dict[str, Any]], source: str, torch_version: str, device: str, world_size: int = 1) -> str:
    head = ["setting", "val_bpb_ttt", "val_bpb_ttt_base", "gain", "phases", "scored", "TTT s", "tokens/s", "compile s"]
    where = device if world_size == 1 else f"{world_size} ranks of {device} (tokens/s: all ranks together)"
    lines = [
        f"TTT of {source}; {where}, torch {torch_version}; gain = val_bpb_ttt_base - val_bpb_ttt (what adaptation "
        f"and the phases bought on the same chunks); scored: the fraction of validation tokens TTT reached",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]

    def num(value: Any, fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    for r in rows:
        ttt, base = r.get("val_bpb_ttt"), r.get("val_bpb_ttt_base")
        cells = [
            r["setting"],
            num(ttt, ".5f"),
            num(base, ".5f"),
            num(None if ttt is None or base is None else base - ttt, "+.5f"),
            f"{r.get('ttt_phases_done', 0)}/{r.get('ttt_phased_phases', 0)}",
            num(r.get("ttt_fraction"), ".1%"),
            num(r.get("ttt_seconds"), ".1f"),
            num(r.get("ttt_tokens_per_s"), ",.0f"),
            num(r.get("ttt_compile_seconds"), ".1f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
