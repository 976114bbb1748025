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

With ema.decay set, every number here is of the weights' moving average: core.train.train returns with it in the
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

import dataclasses
import hashlib
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from speedrun.artifact.code_count import write_manifest
from speedrun.config.choices import TTTName
from speedrun.core.compile import graphs_compiled
from speedrun.core.evaluate import EvalResult
from speedrun.core.pipeline import (
    FinishHooks,
    FinishSettings,
    score_quantized,
    score_trained,
    score_ttt,
)
from speedrun.core.pipeline import finish as core_finish
from speedrun.core.quant import Quantized, check_round_trip, load_packed
from speedrun.data.tokenizer import tokenizer_sha256
from speedrun.plan import Plan
from speedrun.plan.settings import finish_settings, ttt_settings
from speedrun.records.atomic import atomic_write
from speedrun.records.keys import ttt_keys
from speedrun.records.quant_report import REPORT
from speedrun.records.store import write_json
from speedrun.run.quant_phase import COMPRESS_WORKERS, compress_quantized, keep_quantized

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
    """The three phases in order (speedrun.core.pipeline.finish); returns every key they measured (also reported
    through ``on_phase``). ``code``: the source the job read when it started, for the self-extracting file (None:
    read it at export). ``hessians``: GPTQ's, collected after training (None: the export collects them).
    ``started``: when training ended (time.perf_counter), where eval_seconds starts (None: now), so the record
    writes between them count."""
    finish = Finish(plan, model, eval_forward, data, run_dir, log, on_phase, world, code, hessians, started)
    settings = finish.settings
    if plan.ttt.name != TTTName.off:
        settings = finish.with_ttt()
    hessians = finish._take_hessians()
    finish.run(
        lambda: core_finish(
            model, eval_forward, data, settings, finish.on_report, world=world, hessians=hessians, hooks=finish.hooks
        )
    )
    return finish.out


class Finish:
    """The record keeping of the phases after training (speedrun.core.pipeline computes them): each phase's keys
    into ``out`` and through ``on_phase`` as it ends, its log line, and the artifact's files, written on a thread
    beside the round-trip score. evaluate, quantize and test_time_train run one phase each."""

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
        self.settings = finish_settings(plan)
        self.out: dict[str, Any] = {"eval_mode": plan.eval.label}
        self.t0 = started if started is not None else time.perf_counter()
        self.graphs0 = graphs_compiled()
        self._artifact: Future | None = None
        """The artifact's compression (rank 0, started by ``_quantized``), running beside the round-trip score."""
        self._artifact_keys: dict[str, Any] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._scoring_quantized = False
        self._quant_started = 0.0
        self.quantized_seconds = 0.0
        self.on_ttt_clock: Callable[[], None] | None = None
        """Called when TTT's clock starts, after its compile warm-up (scripts/ttt_table.py --profile)."""
        self.hooks = FinishHooks(
            quantized=self._quantized,
            tick=lambda: self._collect_artifact(block=False),
            ttt_clock=lambda: self.on_ttt_clock() if self.on_ttt_clock is not None else None,
        )

    # -- one phase each (the core's order is core_finish's; scripts and tests run them one by one) ---------------
    def evaluate(self) -> None:
        """val_loss and val_bpb of the trained model (its EMA weights when ema.decay is set)."""
        self.run(lambda: score_trained(*self._args(), world=self.world, hooks=self.hooks))

    def quantize(self) -> None:
        """Quantize the model (rank 0), load the dequantized weights into it and score that round trip, while rank
        0 compresses the same codes into the artifact on a thread: the score and the compression both start from
        the quantized codes and neither needs the other (brotli and zstd release the GIL). The artifact
        file is then read back and must hold exactly the codes that were scored, or the phase fails."""
        self.run(
            lambda: score_quantized(*self._args(), world=self.world, hessians=self._take_hessians(), hooks=self.hooks)
        )

    def test_time_train(self) -> None:
        """Score-first LoRA TTT on the model as it is now (the dequantized artifact when quant is on)."""
        settings = self.with_ttt()
        self.run(lambda: score_ttt(self.model, self.data, settings, self.on_report, world=self.world, hooks=self.hooks))

    def with_ttt(self) -> FinishSettings:
        """The finish's settings with TTT's, and TTT's pass in the hooks (the plan's ttt block is on)."""
        from speedrun.run.finish_ttt import ttt_pass  # ttt on, a Plan's choice

        self.hooks.ttt = ttt_pass(self.plan)
        return dataclasses.replace(self.settings, ttt=ttt_settings(self.plan))

    def run(self, phases: Callable[[], Any]) -> None:
        """Run core phases; a round-trip score that fails or is stopped still keeps the artifact and its size."""
        try:
            phases()
        except BaseException:
            if self._scoring_quantized:
                self._keep_artifact_after_failure()  # the artifact is a result even if its scoring never ends
            raise
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=False)  # its one job was collected (or kept, above)
                self._pool = None

    def _args(self) -> tuple[Any, ...]:
        return self.model, self.eval_forward, self.data, self.settings, self.on_report

    def _take_hessians(self) -> dict[str, torch.Tensor] | None:
        hessians, self.hessians = self.hessians, None  # the Quantized holds what the report needs
        return hessians

    # -- the core's reports ---------------------------------------------------------------------------------
    def on_report(self, kind: str, values: dict[str, Any]) -> None:
        """The core's Report: its lines to the log; a phase's start to on_phase, its end to the phase's keys."""
        if kind == "line":
            self.log(values["text"])
        elif kind == "phase" and "result" not in values:
            self._started(values["name"])
        elif kind == "phase":
            {"eval": self._eval_done, "quant": self._quant_done, "ttt": self._ttt_done}[values["name"]](values)

    def _started(self, phase: str) -> None:
        self.report(phase)
        if phase == "eval" and self.plan.ema.on:
            self.log(
                f"eval: scoring the weights' moving average (ema.decay {self.plan.ema.decay:g}), as export and TTT will"
            )
        if phase == "quant":
            self._quant_started = time.perf_counter()

    def _score_keys(self, label: str, suffix: str, res: EvalResult, seconds: float) -> dict[str, Any]:
        """A score's keys: tokens scored, completeness, tokens per second (named with ``suffix``), and a warning
        when eval.max_seconds cut it short."""
        if not res.complete:
            self.log(
                f"WARNING {label}: eval.max_seconds={self.plan.eval.max_seconds:g} spent after {seconds:.1f} s: "
                f"scored {res.tokens:,} of {res.tokens_total:,} tokens; this score is PARTIAL (eval_complete{suffix} "
                f"false)"
            )
        return {
            f"val_tokens_scored{suffix}": res.tokens,
            f"eval_complete{suffix}": res.complete,
            f"eval_tokens_per_s{suffix}": round(res.tokens / seconds, 1) if seconds > 0 else None,
        }

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

    def _eval_done(self, values: dict[str, Any]) -> None:
        plan, res = self.plan, values["result"]
        keys = self._score_keys("eval", "", res, values["seconds"])
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

    def _quantized(self, quantized: Quantized, packed: dict[str, dict[str, torch.Tensor]]) -> None:
        """Rank 0, the codes made: keep the float weights if asked, and start the artifact's compression beside
        the round-trip score."""
        keep_quantized(self.plan, quantized, self.run_dir, self.log, time.perf_counter() - self._quant_started)
        self.quantized_seconds = time.perf_counter() - self._quant_started  # the float weights' save included
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compress")
        self._artifact = self._pool.submit(self._write_artifact, quantized, packed)
        self._artifact_keys = None
        self._scoring_quantized = True

    def _quant_done(self, values: dict[str, Any]) -> None:
        q, qres = self.plan.quant, values["result"]
        self._scoring_quantized = False
        t_scored = time.perf_counter()
        keys = self._score_keys("eval (quantized)", "_quant", qres, values["seconds"])
        waited = self._artifact is not None and self._artifact_keys is None
        artifact_keys = self._collect_artifact(block=True) or {}
        if self._artifact is not None:
            artifact_keys["compress_wait_seconds"] = round(time.perf_counter() - t_scored, 3) if waited else 0.0
        if self.world is not None:
            artifact_keys = self.world.from_rank0(lambda: artifact_keys)
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

    def _ttt_done(self, values: dict[str, Any]) -> None:
        from speedrun.run.finish_ttt import ttt_line  # ttt on, a Plan's choice

        res = values["result"]
        self.log(ttt_line(res, self.plan.ttt))
        self.done("ttt", **ttt_keys(res, self.plan.ttt))

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
        code = self.code
        if code is None and self.plan.artifact.code_rule == "wrapped":  # a phase run alone: today's source
            from speedrun.artifact.wrap import CodeSource

            code = CodeSource.snapshot().for_plan(self.plan)
        sizes = write_manifest(self.run_dir, len(artifact.blob), q.cap_bytes, self.plan.artifact, code)
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
