"""Re-quantize a finished run's float weights under several quant settings and print one Markdown table: model bytes,
val_bpb of the dequantized round trip, the quantization gap, compression seconds and bytes per tensor class.

    python scripts/quant_table.py outputs/runs/<date>/<time>_<name> eval.tokens=1000000
    python scripts/quant_table.py <run dir> --setting "sigma=quant.clip=sigma" --setting "lqer=quant.clip=sigma quant.lqer.rank=4"

The run's own config (``.hydra/config.yaml``) is rebuilt on this machine with the overrides given after the run dir
(dotted keys, e.g. ``eval.tokens=1000000``, applied to every setting), then each setting's dotted quant overrides on
top. The float weights come from ``model.pt`` in the run dir (written with ``quant.keep_weights=true``, which
quant=record, the export of experiment=pgolf_record, sets), else from the newest checkpoint (mid-training weights,
the EMA's where it kept one), said so on the console. Without ``--setting`` the ladder is LADDER: today's int6 export, then the record's
levers added one at a time. Each setting runs the export exactly as a run does (speedrun.run.finish.Finish:
Hessians from training batches, GPTQ, compression, the round trip scored on the eval tokens) into
``<run dir>/quant_table/<n>/``, whose ``artifact_tensors.json`` holds the per-tensor report; the table is also written
to ``<run dir>/quant_table/table.md``. A setting that changes the model's shape (``quant.logit_rescale``'s two softcap
scalars) gets a model of its own, the parameters the run did not train at their start value.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

OFF = [
    "quant.name=int6",
    "quant.clip=absmax_search",
    "quant.embed_gptq=false",
    "quant.embed_bits=8",
    "quant.lqer.rank=0",
    "quant.gate_bits=null",
    "quant.compressor=brotli",
    "quant.level=11",
]
"""Every lever off: today's int6 + brotli-11 export, the ladder's first rung."""
LADDER = [
    ("int6 absmax-search, brotli-11", OFF),
    ("+ sigma clip", [*OFF, "quant.clip=sigma"]),
    ("+ embed GPTQ int7", [*OFF, "quant.clip=sigma", "quant.embed_gptq=true", "quant.embed_bits=7"]),
    ("+ LQER r4 top3", [*OFF, "quant.clip=sigma", "quant.embed_gptq=true", "quant.embed_bits=7", "quant.lqer.rank=4"]),
    (
        "+ gates int8",
        [
            *OFF,
            "quant.clip=sigma",
            "quant.embed_gptq=true",
            "quant.embed_bits=7",
            "quant.lqer.rank=4",
            "quant.gate_bits=8",
        ],
    ),
    (
        "+ pergroup brotli",
        [
            *OFF,
            "quant.clip=sigma",
            "quant.embed_gptq=true",
            "quant.embed_bits=7",
            "quant.lqer.rank=4",
            "quant.gate_bits=8",
            "quant.compressor=pergroup",
        ],
    ),
]
CLASSES = ("attn", "mlp", "embed", "matrix", "gate", "float")


def parse_setting(text: str) -> tuple[str, list[str]]:
    label, _, overrides = text.partition("=")
    if not overrides:
        raise SystemExit(f"--setting {text!r}: write LABEL=OVERRIDES, e.g. 'sigma=quant.clip=sigma'")
    return label, [*OFF, *overrides.split()]


def load_config(run_dir: Path, overrides: list[str]) -> Any:
    from omegaconf import OmegaConf

    from speedrun.config import register_configs, to_config

    path = run_dir / ".hydra" / "config.yaml"
    if not path.is_file():
        raise SystemExit(f"{run_dir} has no .hydra/config.yaml: pass the dir of a finished `python -m run`")
    register_configs()  # the resolvers the stored config still names (debug=smoke's depth)
    cfg = OmegaConf.merge(OmegaConf.load(path), OmegaConf.from_dotlist(overrides))
    return to_config(cfg)


def ema_as_run(result: dict[str, Any]) -> list[str]:
    """The decay the run used (none: off) in place of its ``ema.horizon``, a fraction of the run's steps resolved
    only when a run starts: the weights are already the EMA's, and the finish names the decay it scores."""
    if result.get("ema_horizon") is None:
        return []
    decay = result.get("ema_decay")
    return ["ema.horizon=null", f"ema.decay={decay!r}" if decay else "ema.decay=null"]


def float_weights(run_dir: Path, log: Any) -> dict[str, Any]:
    import torch

    from speedrun.run.checkpoint import load_checkpoint
    from speedrun.run.quant_phase import FLOAT_WEIGHTS

    if (run_dir / FLOAT_WEIGHTS).is_file():
        return torch.load(run_dir / FLOAT_WEIGHTS, map_location="cpu", weights_only=True)
    payload = load_checkpoint(run_dir)
    if payload is None:
        raise SystemExit(
            f"{run_dir} has neither {FLOAT_WEIGHTS} nor a checkpoint: rerun it with quant.keep_weights=true"
        )
    state = dict(payload["model"])
    shadow = (payload.get("ema") or {}).get("shadow") or {}
    state.update({k: v.to(state[k].dtype) for k, v in shadow.items() if k in state})
    log(
        f"no {FLOAT_WEIGHTS} in the run dir: the newest checkpoint's weights (step "
        f"{payload['progress']['steps']}{', EMA' if shadow else ''}), not the final ones"
    )
    return state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("overrides", nargs="*", help="dotted keys for every setting, e.g. eval.tokens=1000000")
    parser.add_argument("--setting", action="append", default=[], help="LABEL=OVERRIDES (repeatable)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    log = logging.getLogger("quant_table").info

    import torch

    from speedrun.hardware import profiles as hardware
    from speedrun.plan import resolve
    from speedrun.run.build import build_attention, build_data, build_model
    from speedrun.run.finish import Finish

    run_dir = args.run_dir.resolve()
    settings = [parse_setting(s) for s in args.setting] or LADDER
    device = hardware.detect()
    result = json.loads((run_dir / "result.json").read_text()) if (run_dir / "result.json").is_file() else {}
    common = [*ema_as_run(result), *args.overrides]
    plans = [resolve(load_config(run_dir, [*common, *extra]), device, cwd=Path.cwd()) for _, extra in settings]
    first = plans[0]
    data = build_data(first, log)
    weights = float_weights(run_dir, log)
    # the run ended with its loop on: score the model as it was exported
    loop = bool(first.model.loop.on and (result.get("stages") or [{}])[-1].get("loop"))
    built: dict[Any, tuple[Any, Any, dict[str, Any]]] = {}

    def model_for(plan: Any) -> tuple[Any, Any]:
        """The model of a setting's shape, holding the run's float weights. A setting that adds parameters to the
        shape (quant.logit_rescale's two softcap scalars) keeps them at their init, which gives the same logits."""
        if plan.model not in built:
            model, _, eval_forward, _ = build_model(plan, build_attention(plan), data.bos_id)
            own = model.state_dict()
            extra = set(own) - set(weights)
            if unknown := set(weights) - set(own):
                raise SystemExit(f"{run_dir}: its weights hold {sorted(unknown)[:3]}, which this setting's model lacks")
            state = {k: v.to(own[k].dtype) for k, v in weights.items()}
            state.update({k: own[k].detach().clone() for k in extra})
            if loop:
                model.set_loop(True)
            model.eval()
            built[plan.model] = (model, eval_forward, state)
        model, eval_forward, state = built[plan.model]
        model.load_state_dict(state)
        return model, eval_forward

    out = run_dir / "quant_table"
    model, eval_forward = model_for(first)
    base = Finish(first, model, eval_forward, data, out, log)
    out.mkdir(exist_ok=True)
    base.evaluate()
    val_bpb = base.out["val_bpb"]
    rows = []
    for i, ((label, _), plan) in enumerate(zip(settings, plans)):
        model, eval_forward = model_for(plan)
        where = out / str(i)
        where.mkdir(exist_ok=True)
        finish = Finish(plan, model, eval_forward, data, where, log)
        finish.quantize()
        report = json.loads((where / "artifact_tensors.json").read_text())
        rows.append(
            {
                "setting": label,
                "model_bytes": finish.out["artifact_model_bytes"],
                "artifact_bytes": finish.out["artifact_bytes"],
                "val_bpb_quant": finish.out["val_bpb_quant"],
                "gap": finish.out["val_bpb_quant"] - val_bpb,
                "compress_s": finish.out["compress_seconds"],
                "quant_s": finish.out["quant_seconds"],
                "classes": {c: v["est_bytes"] for c, v in report["classes"].items()},
            }
        )
    table = markdown(rows, val_bpb, base.out["eval_tokens"], torch.__version__, first.device_name)
    (out / "table.md").write_text(table)
    print(table)
    return 0


def markdown(rows: list[dict[str, Any]], val_bpb: float, tokens: int, torch_version: str, device: str) -> str:
    present = [c for c in CLASSES if any(c in r["classes"] for r in rows)]
    head = ["setting", "model bytes", "artifact bytes", "val_bpb_quant", "quant gap", "compress s", "quant s"]
    head += [f"{c} bytes" for c in present]
    lines = [
        f"float val_bpb {val_bpb:.5f} on {tokens:,} eval tokens; {device}, torch {torch_version}; quant s: Hessians, "
        f"GPTQ and compression; class bytes are estimates (artifact_tensors.json: each "
        f"group's compressed bytes shared out by byte entropy)",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    for r in rows:
        cells = [
            r["setting"],
            f"{r['model_bytes']:,}",
            f"{r['artifact_bytes']:,}",
            f"{r['val_bpb_quant']:.5f}",
            f"{r['gap']:+.5f}",
            f"{r['compress_s']:.1f}",
            f"{r['quant_s']:.1f}",
        ]
        cells += [f"{r['classes'].get(c, 0):,}" for c in present]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
