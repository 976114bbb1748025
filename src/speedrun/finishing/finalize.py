"""After training: score the model, export the artifact, score the artifact's round trip, then test-time train.

Order and what each number measures (all on the same validation tokens and byte accounting):

    val_bpb         the trained model, with the eval group's windows (standard or sliding)
    val_bpb_quant   the dequantized artifact, same windows          (quant != off)
    val_bpb_ttt     score-first LoRA TTT on the dequantized model   (ttt != off; on the trained model if quant=off)
    val_bpb_ttt_base  the same TTT chunks and windows, unadapted    (ttt != off)

GPTQ (quant=int6) takes its Hessians from a fresh stream of *training* batches, never from validation data.

With ema.decay set, every number here is of the weights' moving average: training.loop.train returns with it in the
model (the record applies its EMA the same way, before its diagnostic eval, GPTQ and TTT).

Each phase (eval, quant, ttt) reports its keys through ``on_phase`` as soon as it ends (the runner writes them to
result.json and the results row), so a run stopped or failing in a later phase keeps what the earlier ones
measured; ``on_phase(name)`` with no keys says a phase started. Within a phase, scoring, GPTQ, compression and TTT
print a progress line every 30 s (speedrun.training.dense_metrics.Progress, ticked after each batch, matrix, MB or TTT chunk), so
a phase of minutes on a slow device is never silent.

``eval_fingerprint`` names the exact scored tokens: 16 hex digits of blake2b over the int32 ids of the validation
tokens the windows cover (targets 1..eval_tokens and the context token 0). Runs with the same fingerprint scored
the same tokens; the report and sweep summary compare only those.

On several ranks (``world``): every score is split over the ranks and all-reduced (speedrun.finishing.evaluate), so it
equals a one-rank score of the same weights; the export (Hessians, GPTQ, compression) runs on rank 0 alone, with
the one-rank calibration stream, and its artifact is broadcast, so every rank scores the same dequantized
weights; TTT deals its document batches over the ranks (each batch is independent: fresh adapters per batch).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from speedrun.finishing.artifact import write_manifest
from speedrun.finishing.evaluate import EvalResult, document_mask, run_eval
from speedrun.finishing.quantize import (
    Artifact,
    collect_hessians,
    export,
    export_packed,
    load_artifact,
    quantize_state_dict_gptq,
)
from speedrun.plan import Plan
from speedrun.plan.dtypes import autocast_dtype
from speedrun.progress import Progress

PhaseCallback = Callable[..., None]
"""on_phase(name) when a phase starts; on_phase(name, keys) when it ends."""


def eval_fingerprint(tokens: torch.Tensor) -> str:
    return hashlib.blake2b(tokens.to(torch.int32).cpu().numpy().tobytes(), digest_size=8).hexdigest()


def evaluate_and_export(
    plan: Plan,
    model: torch.nn.Module,
    eval_forward: Callable,
    data: Any,
    run_dir: Path,
    log: Callable[[str], None],
    on_phase: PhaseCallback | None = None,
    world: Any = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"eval_mode": plan.eval.label}
    report: PhaseCallback = on_phase or (lambda name, keys=None: None)
    amp_dtype = autocast_dtype(plan)
    bos_id = data.bos_id if plan.eval.document_isolated else None
    q = plan.quant

    def score(label: str) -> EvalResult:
        with document_mask(model, bos_id):
            return run_eval(
                plan.eval.mode,
                eval_forward,
                data.val_tokens,
                data.luts,
                seq_len=plan.model.seq_len,
                stride=plan.eval.stride,
                batch_size=plan.eval.batch_size,
                device=plan.device,
                autocast_dtype=amp_dtype,
                shard=world,
                progress=Progress(label, log),
            )

    t0 = time.perf_counter()

    def done(phase: str, **keys: Any) -> None:
        out.update(keys, eval_seconds=round(time.perf_counter() - t0, 3))
        report(phase, {**keys, "eval_seconds": out["eval_seconds"]})

    report("eval")
    if plan.ema.on:
        log(f"eval: scoring the weights' moving average (ema.decay {plan.ema.decay:g}), as export and TTT will")
    res = score("eval")
    # both window layouts score targets 1..res.tokens of the stream: tokens 0..res.tokens are what was read
    done(
        "eval",
        eval_mode=plan.eval.label,
        val_loss=round(res.val_loss, 6),
        val_bpb=round(res.val_bpb, 6),
        eval_tokens=res.tokens,
        eval_bytes=res.bytes,
        eval_split="val",
        eval_fingerprint=eval_fingerprint(data.val_tokens[: res.tokens + 1]),
    )
    log(
        f"eval ({out['eval_mode']}): val_loss {res.val_loss:.4f}  val_bpb {res.val_bpb:.4f}  "
        f"({res.tokens:,} tokens, {res.bytes:,} bytes)"
    )
    if q.name != "off":
        report("quant")
        tq = time.perf_counter()

        def export() -> Artifact:
            return _export(plan, model, data, log)

        artifact = world.from_rank0(export) if world else export()  # rank 0 exports, every rank gets its bytes
        path = run_dir / f"model.{q.name}.{q.compressor}"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(artifact.blob)
        os.replace(tmp, path)
        restored = load_artifact(path.read_bytes(), str(q.compressor))
        model.load_state_dict({k: restored[k].to(v.dtype) for k, v in model.state_dict().items()})
        quant_seconds = round(time.perf_counter() - tq, 3)
        sizes = write_manifest(run_dir, len(artifact.blob), q.cap_bytes)  # artifact_code.json: what was counted
        report("quant", sizes)  # the artifact exists: its size is a result even if its scoring never ends
        qres = score("eval (quantized)")
        done(
            "quant",
            val_bpb_quant=round(qres.val_bpb, 6),
            val_loss_quant=round(qres.val_loss, 6),
            **sizes,
            quant=str(q.name),
            compressor=str(q.compressor),
            quant_seconds=quant_seconds,
        )
        log(
            f"quant: {q.name}+{q.compressor} artifact {sizes['artifact_bytes']:,} bytes "
            f"(model {sizes['artifact_model_bytes']:,} + code {sizes['artifact_code_bytes']:,} raw; cap "
            f"{q.cap_bytes:,}: {'ok' if sizes['artifact_ok'] else 'OVER'}); val_bpb_quant {qres.val_bpb:.4f}"
        )
    if plan.ttt.name != "off":
        report("ttt")
        done("ttt", **_ttt(plan, model, data, amp_dtype, log, world))
    return out


def _export(plan: Plan, model: torch.nn.Module, data: Any, log: Callable[[str], None]) -> Artifact:
    q = plan.quant
    if q.name == "int8":
        return export(model.state_dict(), str(q.compressor), q.level, log)
    t0 = time.perf_counter()
    hessians = collect_hessians(
        model,
        data.train_batches(),
        q.calib_batches,
        device=plan.device,
        autocast_dtype=autocast_dtype(plan),
        progress=Progress("gptq: Hessians", log, unit="batches"),
    )
    t1 = time.perf_counter()
    packed = quantize_state_dict_gptq(
        model.state_dict(),
        hessians,
        bits=q.bits,
        embed_bits=q.embed_bits,
        damp=q.damp,
        block_size=q.block_size,
        clip_ratios=q.clip_ratios,
        progress=Progress(f"gptq: int{q.bits}", log, unit="matrices"),
    )
    log(
        f"quant: GPTQ int{q.bits} on {len(hessians)} matrices (Hessians from {q.calib_batches} training batches "
        f"in {t1 - t0:.1f} s, quantized in {time.perf_counter() - t1:.1f} s), embeddings int{q.embed_bits}"
    )
    return export_packed(packed, str(q.compressor), q.level, log)


def _ttt(
    plan: Plan, model: torch.nn.Module, data: Any, autocast_dtype: Any, log: Callable[[str], None], world: Any = None
) -> dict[str, Any]:
    from speedrun.finishing.ttt import ttt_evaluate

    t = plan.ttt
    res = ttt_evaluate(
        model,
        data.val_tokens,
        data.luts,
        bos_id=data.bos_id,
        seq_len=plan.model.seq_len,
        rank=t.rank,
        lr=t.lr,
        chunk_size=t.chunk_size,
        short_chunks=t.short_chunks,
        targets=t.targets,
        batch_size=t.batch_size or plan.eval.batch_size,  # the resolver fills it; None only in a hand-made plan
        beta1=t.beta1,
        beta2=t.beta2,
        weight_decay=t.weight_decay,
        max_seconds=t.max_seconds,
        device=plan.device,
        autocast_dtype=autocast_dtype,
        seed=plan.seed,
        log=log,
        score_base=t.score_base,
        shard=world,
    )
    out = dict(
        val_bpb_ttt=None if res.val_bpb is None else round(res.val_bpb, 6),
        val_loss_ttt=None if res.val_loss is None else round(res.val_loss, 6),
        val_bpb_ttt_base=None if res.base_val_bpb is None else round(res.base_val_bpb, 6),
        val_loss_ttt_base=None if res.base_val_loss is None else round(res.base_val_loss, 6),
        ttt_seconds=round(res.seconds, 3),
        ttt_tokens_scored=res.tokens_scored,
        ttt_fraction=round(res.fraction, 6),
        ttt_complete=res.complete,
        ttt_docs=res.docs_total,
    )
    log(
        f"ttt ({t.name}, rank {t.rank}, targets {t.targets}): val_bpb_ttt "
        f"{'n/a' if res.val_bpb is None else f'{res.val_bpb:.4f}'} (unadapted "
        f"{'n/a' if res.base_val_bpb is None else f'{res.base_val_bpb:.4f}'}) over {res.tokens_scored:,}/{res.tokens_total:,} "
        f"tokens ({100 * res.fraction:.1f}%) of {res.docs_total:,} documents in {res.seconds:.1f} s"
    )
    return out
