"""After training: score the model, export the artifact, score the artifact's round trip, then test-time train.

Order and what each number measures (all on the same validation tokens and byte accounting):

    val_bpb         the trained model, with the eval group's windows (standard or sliding)
    val_bpb_quant   the dequantized artifact, same windows          (quant != off)
    val_bpb_ttt     score-first LoRA TTT on the dequantized model   (ttt != off; on the trained model if quant=off),
                    with ttt.phased the model itself fine-tuned on documents already scored
    val_bpb_ttt_base  the same TTT chunks and windows, unadapted    (ttt != off)

eval.max_seconds bounds each of the first two passes: one cut short scores a prefix of the tokens, and says so
(eval_complete / eval_complete_quant false, val_tokens_scored of val_tokens_total, a warning in the log); its
fingerprint is of the tokens it scored, so the report never compares it with a complete pass.

GPTQ (quant=int6) takes its Hessians from a fresh stream of *training* batches, never from validation data. The
job collects them right after the last training step, on the training clock (speedrun.run.quant_phase), and
passes them in; called without them, the export collects its own.

With ema.decay set, every number here is of the weights' moving average: training.loop.train returns with it in the
model (the record applies its EMA the same way, before its diagnostic eval, GPTQ and TTT).

Each phase (eval, quant, ttt) reports its keys through ``on_phase`` as soon as it ends (the runner writes them to
result.json and the results row), so a run stopped or failing in a later phase keeps what the earlier ones
measured; ``on_phase(name)`` with no keys says a phase started. Within a phase, scoring, GPTQ, compression and TTT
print a progress line every 30 s (speedrun.progress.Progress, ticked after each batch, matrix, MB or TTT chunk), so
a phase of minutes on a slow device is never silent.

Throughput: eval_tokens_per_s (and _quant), ttt_tokens_per_s. eval_recompiles counts the graphs torch.compile built
since finishing began (the compiled eval forward meeting a new shape or the document mask), as training's
recompiles does for the timed loop.

``eval_fingerprint`` names the exact scored tokens and how their bytes were counted: 16 hex digits of blake2b over
the tokenizer's sha256 (``tokenizer_sha256``, recorded too) and the int32 ids of the validation tokens the windows
cover (targets 1..eval_tokens and the context token 0). Runs with the same fingerprint scored the same tokens with
the same byte accounting; the report and sweep summary compare only those.

On several ranks (``world``): every score is split over the ranks and all-reduced (speedrun.core.evaluate), so it
equals a one-rank score of the same weights; the export (GPTQ, compression) runs on rank 0 alone, with
the Hessians rank 0 collected from the one-rank calibration stream, and its artifact is broadcast, so every rank scores the same dequantized
weights; TTT deals its document batches over the ranks (each batch is independent: fresh adapters per batch), and
its global phases run on every rank with averaged gradients.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from speedrun.artifact.code_count import write_manifest
from speedrun.config.choices import QuantName, TTTName
from speedrun.core.compile import graphs_compiled
from speedrun.core.evaluate import EvalResult, document_mask, run_eval
from speedrun.core.quant import Quantized, check_round_trip, dequantize_state_dict, load_packed
from speedrun.core.train import autocast_dtype
from speedrun.data.tokenizer import tokenizer_sha256
from speedrun.plan import Plan
from speedrun.progress import Progress
from speedrun.records.atomic import atomic_write
from speedrun.records.quant_report import REPORT
from speedrun.records.store import write_json
from speedrun.run.quant_phase import COMPRESS_WORKERS, compress_quantized, quantize_model

if TYPE_CHECKING:
    from speedrun.artifact.wrap import CodeSource

PhaseCallback = Callable[..., None]
"""on_phase(name) when a phase starts; on_phase(name, keys) when it ends."""


def eval_fingerprint(tokens: torch.Tensor, tokenizer: str | None = None) -> str:
    """16 hex digits of blake2b over the tokenizer's sha256 (when known) and the scored int32 ids: the same ids
    under another tokenizer of one vocab size count other bytes, so their val_bpb is of another set."""
    h = hashlib.blake2b(digest_size=8)
    if tokenizer is not None:
        h.update(tokenizer.encode())
    h.update(tokens.to(torch.int32).cpu().numpy().tobytes())
    return h.hexdigest()


def evaluate_and_export(
    plan: Plan,
    model: torch.nn.Module,
    eval_forward: Callable,
    data: Any,
    run_dir: Path,
    log: Callable[[str], None],
    on_phase: PhaseCallback | None = None,
    world: Any = None,
    code: CodeSource | None = None,
    hessians: dict[str, torch.Tensor] | None = None,
    started: float | None = None,
) -> dict[str, Any]:
    """The three phases in order; returns every key they measured (also reported through ``on_phase``). ``code``:
    the source the job read when it started, for the self-extracting file (None: read it at export).
    ``hessians``: GPTQ's, collected after training (None: the export collects them). ``started``: when training
    ended (time.perf_counter), where eval_seconds starts (None: now), so the record writes between them count."""
    finish = Finish(plan, model, eval_forward, data, run_dir, log, on_phase, world, code, hessians, started)
    finish.evaluate()
    if plan.quant.name != QuantName.off:
        finish.quantize()
    if plan.ttt.name != TTTName.off:
        finish.test_time_train()
    return finish.out


class _ScoreProgress(Progress):
    """A score's progress line that also runs ``between`` at every tick (after each batch, on the scoring
    thread): how the artifact's keys, compressed beside the round-trip score, reach the record mid-score."""

    def __init__(self, label: str, log: Callable[[str], None], between: Callable[[], Any]):
        super().__init__(label, log)
        self.between = between

    def tick(self, done: float, total: float | None = None) -> bool:
        self.between()
        return super().tick(done, total)


class Finish:
    """The phases after training, each a method: evaluate, quantize (export + round-trip score), test-time train.
    ``out`` collects their keys; each phase reports its own as it ends."""

    def __init__(
        self,
        plan: Plan,
        model: torch.nn.Module,
        eval_forward: Callable,
        data: Any,
        run_dir: Path,
        log: Callable[[str], None],
        on_phase: PhaseCallback | None = None,
        world: Any = None,
        code: CodeSource | None = None,
        hessians: dict[str, torch.Tensor] | None = None,
        started: float | None = None,
    ):
        self.plan, self.model, self.eval_forward, self.data = plan, model, eval_forward, data
        self.run_dir, self.log, self.world, self.code = run_dir, log, world, code
        self.hessians = hessians
        self.report: PhaseCallback = on_phase or (lambda name, keys=None: None)
        self.amp_dtype = autocast_dtype(plan.autocast)
        self.out: dict[str, Any] = {"eval_mode": plan.eval.label}
        self.t0 = started if started is not None else time.perf_counter()
        self.graphs0 = graphs_compiled()
        self._artifact: Future | None = None
        """The artifact's compression (rank 0, Finish.quantize), running beside the round-trip score."""
        self._artifact_keys: dict[str, Any] | None = None
        self.on_ttt_clock: Callable[[], None] | None = None
        """Called when TTT's clock starts, after its compile warm-up (scripts/ttt_table.py --profile)."""

    def score(self, label: str, suffix: str = "") -> tuple[EvalResult, dict[str, Any]]:
        """The model as it is now, over the eval slice with the eval group's windows (split over the ranks), within
        eval.max_seconds; and its keys: tokens scored, completeness, tokens per second (named with ``suffix``)."""
        plan, data = self.plan, self.data
        t0 = time.perf_counter()
        with document_mask(self.model, data.bos_id if plan.eval.document_isolated else None):
            res = run_eval(
                plan.eval.mode,
                self.eval_forward,
                data.val_tokens,
                data.luts,
                seq_len=plan.model.seq_len,
                stride=plan.eval.stride,
                batch_size=plan.eval.batch_size,
                device=plan.device,
                autocast_dtype=self.amp_dtype,
                shard=self.world,
                progress=_ScoreProgress(label, self.log, lambda: self._collect_artifact(block=False)),
                max_seconds=plan.eval.max_seconds,
                include_tail=plan.eval.include_tail,
            )
        seconds = time.perf_counter() - t0
        if not res.complete:
            self.log(
                f"WARNING {label}: eval.max_seconds={plan.eval.max_seconds:g} spent after {seconds:.1f} s: scored "
                f"{res.tokens:,} of {res.tokens_total:,} tokens; this score is PARTIAL (eval_complete{suffix} false)"
            )
        keys = {
            f"val_tokens_scored{suffix}": res.tokens,
            f"eval_complete{suffix}": res.complete,
            f"eval_tokens_per_s{suffix}": round(res.tokens / seconds, 1) if seconds > 0 else None,
        }
        return res, keys

    def done(self, phase: str, **keys: Any) -> None:
        """A phase's keys, with the evaluation's time so far: eval_seconds all of it since training ended (what a
        track's limit counts), eval_seconds_warm the same less TTT's compile and graph capture."""
        seconds = time.perf_counter() - self.t0
        compile_seconds = keys.get("ttt_compile_seconds", self.out.get("ttt_compile_seconds")) or 0.0
        timing = {
            "eval_seconds": round(seconds, 3),
            "eval_seconds_warm": round(seconds - compile_seconds, 3),
            "eval_recompiles": graphs_compiled() - self.graphs0,
        }
        self.out.update(keys, **timing)
        self.report(phase, {**keys, **timing})

    def evaluate(self) -> None:
        """val_loss and val_bpb of the trained model (its EMA weights when ema.decay is set)."""
        plan = self.plan
        self.report("eval")
        if plan.ema.on:
            self.log(
                f"eval: scoring the weights' moving average (ema.decay {plan.ema.decay:g}), as export and TTT will"
            )
        res, keys = self.score("eval")
        # build_data's bundle names the tokenizer file; callers that pass val tokens and LUTs alone have none
        paths = getattr(self.data, "paths", None)
        tokenizer = tokenizer_sha256(paths.tokenizer) if paths is not None else None
        # both window layouts score targets 1..res.tokens of the stream (a cut-short pass too: a prefix of them):
        # tokens 0..res.tokens are what was read
        self.done(
            "eval",
            eval_mode=plan.eval.label,
            val_loss=round(res.val_loss, 6),
            val_bpb=round(res.val_bpb, 6),
            eval_tokens=res.tokens,
            eval_bytes=res.bytes,
            eval_split="val",
            eval_fingerprint=eval_fingerprint(self.data.val_tokens[: res.tokens + 1], tokenizer),
            tokenizer_sha256=tokenizer[:16] if tokenizer else None,
            val_tokens_total=res.tokens_total,
            **keys,
        )
        self.log(
            f"eval ({self.out['eval_mode']}): val_loss {res.val_loss:.4f}  val_bpb {res.val_bpb:.4f}  "
            f"({res.tokens:,}{'' if res.complete else f' of {res.tokens_total:,}'} tokens, {res.bytes:,} bytes)"
        )

    def quantize(self) -> None:
        """Quantize the model (rank 0), load the dequantized weights into it and score that round trip, while rank
        0 compresses the same codes into the artifact on a thread: the score and the compression both start from
        the quantized codes and neither needs the other (brotli and zstd release the GIL). The artifact
        file is then read back and must hold exactly the codes that were scored, or the phase fails."""
        plan, q, world = self.plan, self.plan.quant, self.world
        self.report("quant")
        tq = time.perf_counter()
        rank0 = world is None or world.rank == 0
        quantized = (
            quantize_model(plan, self.model, self.data, self.log, self.run_dir, self.hessians) if rank0 else None
        )
        self.hessians = None  # quantized holds what the report needs
        self.quantized_seconds = time.perf_counter() - tq

        def codes() -> dict[str, dict[str, torch.Tensor]]:
            assert quantized is not None  # rank 0's
            return quantized.packed

        # every rank scores rank 0's codes (the export ran on rank 0 alone, with the one-rank calibration stream)
        packed = world.from_rank0(codes) if world else codes()
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compress") if quantized else None
        self._artifact = pool.submit(self._write_artifact, quantized, packed) if pool and quantized else None
        self._artifact_keys = None
        restored = dequantize_state_dict(packed)
        self.model.load_state_dict({k: restored[k].to(v.dtype) for k, v in self.model.state_dict().items()})
        try:
            qres, keys = self.score("eval (quantized)", "_quant")
        except BaseException:
            self._keep_artifact_after_failure()  # the artifact is a result even if its scoring never ends
            raise
        finally:
            if pool is not None:
                pool.shutdown(wait=False)  # its one job is collected below (or was, above)
        t_scored = time.perf_counter()
        waited = self._artifact is not None and self._artifact_keys is None
        artifact_keys = self._collect_artifact(block=True) or {}
        if self._artifact is not None:
            artifact_keys["compress_wait_seconds"] = round(time.perf_counter() - t_scored, 3) if waited else 0.0
        if world is not None:
            artifact_keys = world.from_rank0(lambda: artifact_keys)
        self.done(
            "quant",
            val_bpb_quant=round(qres.val_bpb, 6),
            val_loss_quant=round(qres.val_loss, 6),
            **keys,
            **artifact_keys,
            quant=str(q.name),
            compressor=str(q.compressor),
        )
        sizes = artifact_keys
        self.log(
            f"quant: {q.name}+{q.compressor} artifact {sizes['artifact_bytes']:,} bytes "
            f"(model {sizes['artifact_model_bytes']:,} + code {sizes['artifact_code_bytes']:,} "
            f"{sizes['artifact_code_rule']}; cap "
            f"{q.cap_bytes:,}: {'ok' if sizes['artifact_ok'] else 'OVER'}); val_bpb_quant {qres.val_bpb:.4f}; "
            f"compressed in {sizes['compress_seconds']:.1f} s beside the score (waited {sizes['compress_wait_seconds']:.1f}"
            f" s for it); per tensor: {REPORT}"
        )

    def _write_artifact(self, quantized: Quantized, packed: dict[str, dict[str, torch.Tensor]]) -> dict[str, Any]:
        """Rank 0, on the compression thread: compress the codes, write the artifact file (atomically), read it
        back and check it holds the codes that were scored, then the manifest and the per-tensor report; the keys
        of its size and timings. The file is on disk as soon as it exists, even if the score never ends."""
        q = self.plan.quant
        artifact = compress_quantized(self.plan, quantized, self.log, COMPRESS_WORKERS)
        path = self.run_dir / f"model.{q.name}.{q.compressor}"
        # checked before it takes the artifact's name: a file that does not hold the scored codes is never one
        atomic_write(
            path,
            artifact.blob,
            check=lambda tmp: check_round_trip(load_packed(tmp.read_bytes(), str(q.compressor)), packed, tmp),
        )
        # the code's bytes by artifact.code_rule (wrapped: train_gpt.py written beside the model); artifact_code.json
        sizes = write_manifest(self.run_dir, len(artifact.blob), q.cap_bytes, self.plan.artifact, self.code)
        write_json(self.run_dir / REPORT, {"artifact_model_bytes": len(artifact.blob), **artifact.extra["report"]})
        return {
            **sizes,
            "compress_seconds": artifact.compress_seconds,
            **({"quant_hessian_seconds": h} if (h := artifact.extra.get("quant_hessian_seconds")) is not None else {}),
            # the export's own work (GPTQ and compression; the Hessians are training's), whatever ran beside it
            "quant_seconds": round(self.quantized_seconds + artifact.compress_seconds, 3),
        }

    def _collect_artifact(self, block: bool) -> dict[str, Any] | None:
        """The artifact's keys once its thread is done (``block``: wait for it), reported as soon as they are
        collected, on this (the scoring) thread: the score ticks this between batches, so a run killed later in
        the score still has the artifact's size in its record. None while not done, or on ranks > 0."""
        future = self._artifact
        if future is None or self._artifact_keys is not None:
            return self._artifact_keys
        if not block and not future.done():
            return None
        self._artifact_keys = future.result()
        self.report("quant", self._artifact_keys)
        return self._artifact_keys

    def _keep_artifact_after_failure(self) -> None:
        """The round-trip score failed or was stopped: wait for the artifact and report its size. Best effort: the
        score's own error is the one that propagates, even if this wait is interrupted again (a second Ctrl-C)."""
        try:
            self._collect_artifact(block=True)
        except BaseException as e:  # noqa: BLE001 - secondary to the error already on its way
            self.log(f"quant: the artifact could not be kept after the failed score: {type(e).__name__}: {e}")

    def test_time_train(self) -> None:
        """Score-first LoRA TTT on the model as it is now (the dequantized artifact when quant is on)."""
        from speedrun.run.finish_ttt import run_ttt  # ttt on, a Plan's choice (artifact.closure)

        self.report("ttt")
        self.done(
            "ttt", **run_ttt(self.plan, self.model, self.data, self.amp_dtype, self.log, self.world, self.on_ttt_clock)
        )
