"""After training: score the model, export the artifact, score the artifact's round trip."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

import torch

from .config import Config
from .evaluate import evaluate
from .plan import Plan
from .quantize import export, load_artifact

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}


def evaluate_and_export(cfg: Config, plan: Plan, model: torch.nn.Module, eval_forward: Callable, data: Any,
                        run_dir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    kwargs = dict(seq_len=plan.model.seq_len, batch_size=plan.eval_batch, device=plan.device,
                  autocast_dtype=AUTOCAST[plan.precision])
    t0 = time.perf_counter()
    res = evaluate(eval_forward, data.val_tokens, data.luts, **kwargs)
    out.update(val_loss=round(res.val_loss, 6), val_bpb=round(res.val_bpb, 6), eval_tokens=res.tokens,
               eval_bytes=res.bytes)
    log(f"eval: val_loss {res.val_loss:.4f}  val_bpb {res.val_bpb:.4f}  ({res.tokens:,} tokens, {res.bytes:,} bytes)")
    if cfg.quant.name != "off":
        artifact = export(model.state_dict(), cfg.quant.compressor, cfg.quant.level)
        path = run_dir / f"model.{cfg.quant.name}.{cfg.quant.compressor}"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(artifact.blob)
        os.replace(tmp, path)
        restored = load_artifact(path.read_bytes(), cfg.quant.compressor)
        model.load_state_dict({k: restored[k].to(v.dtype) for k, v in model.state_dict().items()})
        qres = evaluate(eval_forward, data.val_tokens, data.luts, **kwargs)
        out.update(val_bpb_quant=round(qres.val_bpb, 6), val_loss_quant=round(qres.val_loss, 6),
                   artifact_bytes=artifact.total_bytes, artifact_model_bytes=len(artifact.blob),
                   artifact_code_bytes=artifact.code_bytes, artifact_ok=artifact.total_bytes <= cfg.quant.cap_bytes,
                   quant=cfg.quant.name)
        log(f"quant: {cfg.quant.name}+{cfg.quant.compressor} artifact {artifact.total_bytes:,} bytes "
            f"(model {len(artifact.blob):,} + code {artifact.code_bytes:,}); val_bpb_quant {qres.val_bpb:.4f}")
    out["eval_seconds"] = round(time.perf_counter() - t0, 3)
    return out
