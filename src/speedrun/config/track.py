"""A contest's rules as a setting (conf/track/): what a run must meet to count as a submission to it.

``track=pgolf_10min_16mb`` names parameter-golf's record track, ``track=mng_124m`` modded-nanogpt's GPT-2 speedrun;
the default, ``track=none``, holds no rules. A run with a track is refused at compose where it cannot comply
(TrackConfig.check_plan: a validation subset, a time budget over the limit, GPTQ's Hessians outside the training
clock), and at its end records ``track_ok`` with the reasons it fails (``track_problems``: the GPUs, the card, the
data, the time measured). The export (speedrun.export) claims a record only for a run whose rules held.

The rules judge a run by its result keys alone (``problems``), so the export checks a finished run the same way.
Sources of every rule: docs/tracks.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from speedrun.errors import ConfigError, PlanError

ACCEPT_RULES = ("improve_by", "below")
SCORED_LOSS = "scored_loss"
"""acceptance.metric for the loss a parameter-golf submission is scored on: the TTT pass's when it scored every token,
else the dequantized artifact's (SCORED_KEYS); never the float model's val_loss before export."""
SCORED_KEYS = (("val_loss_ttt", "val_bpb_ttt"), ("val_loss_quant", "val_bpb_quant"))
"""(loss key, bpb key) of what a submission is scored on, in the order tried (scored_keys)."""
"""improve_by: the mean must beat the standing record by ``margin`` at p < ``p_value``; below: the mean must be
under ``threshold`` at p < ``p_value``."""


@dataclass
class AcceptanceConfig:
    """When a set of seeds counts as a result under the contest's statistics."""

    metric: str | None = None
    """The result key judged, in nats per token: val_loss (the trained model's), or scored_loss (SCORED_LOSS: what a
    parameter-golf submission is scored on, TTT's loss else the quantized artifact's)."""
    rule: str | None = None
    """improve_by or below (ACCEPT_RULES); None: the contest states none."""
    margin: float | None = None
    """improve_by: how far below the standing record the mean must be."""
    threshold: float | None = None
    """below: the value the mean must be under."""
    p_value: float | None = None
    """The one-sided test's level."""
    min_seeds: int | None = None
    """Seeds a record claim needs (parameter-golf: 3, "usually over 3 seeds"); None: the test's own minimum (2)."""

    def text(self) -> str:
        if self.rule == "improve_by":
            return (
                f"mean {self.metric} at least {self.margin:g} nats below the standing record at p < {self.p_value:g}"
                + (f", over >= {self.min_seeds} seeds" if self.min_seeds else "")
            )
        if self.rule == "below":
            return f"mean {self.metric} below {self.threshold:g} at p < {self.p_value:g}"
        return "none stated"


@dataclass
class ValidationPin:
    """What a data setting's scores must have been computed on, as runs record it: the tokenizer's sha256 (a
    prefix: runs keep its first 16 hex digits) and the scored validation tokens' eval_fingerprint (None: not
    pinned, then only what is pinned is checked)."""

    tokenizer_sha256: str | None = None
    eval_fingerprint: str | None = None
    source: str | None = None
    """Where the pinned values come from (a file's address)."""


@dataclass
class TrackConfig:
    """One contest's rules; every field None (or empty) where the contest sets no such rule."""

    name: str | None = None
    """The track's name as the setting spells it (None: no track, no rules)."""
    contest: str | None = None
    """Whose rules: parameter-golf, modded-nanogpt."""
    record: bool = False
    """Whether a run that meets these rules may claim a record (a non-record track keeps only some rules)."""
    folder: str | None = None
    """Where the contest files a submission of this track (parameter-golf's records/<folder>/)."""
    gpus: int | None = None
    """GPUs the run must use."""
    card: str | None = None
    """What every GPU's name must contain, e.g. H100."""
    card_model: str | None = None
    """The contest machine's card as speedrun.hardware.cards names it (H100 SXM): the peak a run on another card is
    projected with."""
    train_seconds: float | None = None
    """Limit on ``train_seconds``: the timed training steps plus anything after them that reads training data (GPTQ's
    Hessians); compile and warm-up steps before the clock starts are excluded, as the contests' own scripts time it."""
    eval_seconds: float | None = None
    """Limit on evaluation: all the wall time from the end of training to the last score, compilation and CUDA
    graph capture included (``eval_seconds``); ``eval_seconds_warm`` leaves TTT's compile out, for comparison."""
    artifact_cap_bytes: int | None = None
    """Code + compressed model, in bytes (decimal: 16 MB is 16,000,000)."""
    val_tokens: int | None = None
    """Validation targets every final score must cover: None with full_validation, the whole split."""
    full_validation: bool = False
    """Every score must cover the whole validation split (eval.tokens unset, nothing cut short)."""
    data: list[str] = field(default_factory=list)
    """The data settings (conf/data/) whose shards and tokenizer the contest scores; empty: any."""
    tokenizer_sha256: str | None = None
    """The tokenizer's sha256 prefix as runs record it (tokenizer_sha256), where it is pinned."""
    validation: dict[str, ValidationPin] = field(default_factory=dict)
    """Per data setting of ``data``: the validation identity its scores must carry (checked where pinned). The export
    claims no record on a data setting the track scores but does not pin (``unpinned``)."""
    validation_target: bool = True
    """Whether training may stop on a validation score (budget.target_val_*): modded-nanogpt's time to target does;
    parameter-golf's fixed budget does not (validation data would steer training)."""
    acceptance: AcceptanceConfig = field(default_factory=AcceptanceConfig)
    sources: list[str] = field(default_factory=list)
    """Where each rule is written down (URLs), for the docs and the export."""

    def __post_init__(self) -> None:
        positive = {"gpus": self.gpus, "train_seconds": self.train_seconds, "eval_seconds": self.eval_seconds}
        positive |= {"artifact_cap_bytes": self.artifact_cap_bytes, "val_tokens": self.val_tokens}
        bad = [f"track.{k}={v}" for k, v in positive.items() if v is not None and not v > 0]
        if bad:
            raise ConfigError(f"{', '.join(bad)}: a track's limits are positive numbers, or null for no limit")
        if self.full_validation and self.val_tokens is not None:
            raise ConfigError(
                f"track.full_validation=true and track.val_tokens={self.val_tokens} contradict each other: the "
                "whole split, or a fixed count of targets; set one"
            )
        rule = self.acceptance.rule
        if rule is not None and rule not in ACCEPT_RULES:
            raise ConfigError(f"track.acceptance.rule={rule!r} is not one of {', '.join(ACCEPT_RULES)}")

    @property
    def on(self) -> bool:
        return self.name is not None

    def unpinned(self, data: str | None) -> str | None:
        """Why a run on ``data`` cannot have its shards and tokenizer verified (None where the track pins them or
        pins nothing at all)."""
        if not self.validation:
            return None
        pin = self.validation.get(str(data))
        if pin is not None and pin.tokenizer_sha256:
            return None
        return (
            f"the track pins no tokenizer sha256 for data={data} (conf/track/{self.name}.yaml, validation), so its "
            "shards and tokenizer are unverified"
        )

    def compose_problems(
        self, data: str, quant: str, eval_max_seconds: float | None, target: tuple[str, float] | None
    ) -> list[str]:
        """What the composed config already breaks, before any device is looked at (Config.__post_init__ refuses
        it): data outside the track's list, no artifact where the track counts one, an evaluation allowed to stop
        before the whole split, validation loss steering training."""
        if not self.on:
            return []
        out = []
        if self.data and data not in self.data:
            out.append(f"it scores data {' or '.join(self.data)}, and data={data} is not one: set data={self.data[0]}")
        if self.artifact_cap_bytes is not None and quant == "off":
            out.append(
                f"it counts a compressed artifact of at most {self.artifact_cap_bytes:,} bytes, and quant=off writes "
                "none: set quant=int6 (or int8)"
            )
        if (self.full_validation or self.val_tokens is not None) and eval_max_seconds is not None:
            out.append(
                f"every score must cover its validation tokens, and eval.max_seconds={eval_max_seconds:g} may stop "
                "one early: set eval.max_seconds=null"
            )
        if not self.validation_target and target is not None:
            out.append(
                f"budget.target_{target[0]}={target[1]:g} stops training on a validation score, which the contest "
                f"does not allow: set budget.target_{target[0]}=null"
            )
        return out

    def check_plan(
        self, eval_tokens: int | None, train_seconds: float | None, ttt_on: bool, ttt_max_seconds: float | None
    ) -> None:
        """Refuse (PlanError), before any work, a run that cannot comply whatever happens on the way: a validation
        subset, a time budget over the limit, TTT allowed more than the evaluation limit. ``eval_tokens``: the Plan's
        (N targets need N + 1 tokens, the first is context only); ``train_seconds``: its time budget (None: none)."""
        if not self.on:
            return
        why = []
        if self.full_validation and eval_tokens is not None:
            why.append(
                f"it scores the whole validation split, and eval.tokens={eval_tokens} scores a subset (eval.tokens=null)"
            )
        elif self.val_tokens is not None and (eval_tokens is None or eval_tokens - 1 != self.val_tokens):
            why.append(
                f"it scores the first {self.val_tokens:,} validation targets: set eval.tokens={self.val_tokens + 1}"
            )
        limit = self.train_seconds
        if limit is not None and (train_seconds is None or train_seconds > limit):
            have = "no time limit" if train_seconds is None else f"budget.train_seconds={train_seconds:g}"
            why.append(
                f"it limits training to {limit:g} s and this run has {have}: set budget.train_seconds<={limit:g}"
            )
        if self.eval_seconds is not None and ttt_on and ttt_max_seconds is not None:
            if ttt_max_seconds > self.eval_seconds:
                why.append(
                    f"it limits evaluation to {self.eval_seconds:g} s, TTT included, and ttt.max_seconds="
                    f"{ttt_max_seconds:g} allows more: lower ttt.max_seconds"
                )
        if why:
            raise PlanError(f"track={self.name} cannot accept this run: " + "; ".join(why))

    def problems(self, result: dict[str, Any], card_of: Callable[[str], str | None] | None = None) -> list[str]:
        """Why a run with these result keys does not meet the rules ([] when it meets them all). ``card_of``: a GPU
        name -> its card in speedrun.hardware.cards (the H100 SXM), so that a card_model rule tells an H100 PCIe
        from the contest's SXM (without it, only the name's ``card`` substring is checked)."""
        out = _status_problems(result)
        out += self._machine_problems(result, card_of)
        out += self._data_problems(result)
        out += self._validation_problems(result)
        out += self._time_problems(result)
        cap, size = self.artifact_cap_bytes, result.get("artifact_bytes")
        if cap is not None:
            if size is None:
                out.append("no artifact was written (quant=off): the track counts code + compressed model")
            elif int(size) > cap:
                out.append(f"artifact {int(size):,} bytes, over {cap:,}")
        return out

    def _machine_problems(self, result: dict[str, Any], card_of: Callable[[str], str | None] | None) -> list[str]:
        out = []
        world = int(result.get("world_size") or 1)
        if self.gpus is not None and (world != self.gpus or result.get("hardware") == "cpu"):
            unit = "CPU process" if result.get("hardware") == "cpu" else "GPU"
            plural = "" if world == 1 else "es" if unit.endswith("s") else "s"
            out.append(f"ran on {world} {unit}{plural}, not {self.gpus} GPUs")
        if self.card is not None:
            names = [str(n) for n in (result.get("gpu_names") or [result.get("device_name")])]
            other = sorted({n for n in names if self.card not in n})
            if other:
                out.append(f"ran on {', '.join(other)}, not {self.card}")
            elif self.card_model is not None and card_of is not None:
                models = sorted(
                    {
                        f"{n} ({card_of(n) or 'a card the table does not know'})"
                        for n in names
                        if card_of(n) != self.card_model
                    }
                )
                if models:
                    out.append(f"ran on {', '.join(models)}, not {self.card_model}")
            if result.get("emulated"):
                out.append(f"hardware={result.get('hardware')} was emulated on another card")
        return out

    def _data_problems(self, result: dict[str, Any]) -> list[str]:
        out = []
        if self.data and result.get("data") not in self.data:
            out.append(f"data={result.get('data')}, not the track's {' or '.join(self.data)}")
        pinned, used = self.tokenizer_sha256, result.get("tokenizer_sha256")
        if pinned is not None and (used is None or not str(pinned).startswith(str(used))):
            out.append(f"tokenizer sha256 {used}, not the track's {pinned}")
        if self.validation and result.get("data") in self.data:
            out += _pin_problems(str(result.get("data")), self.validation.get(str(result.get("data"))), result)
        return out

    def _validation_problems(self, result: dict[str, Any]) -> list[str]:
        out = []
        whole = result.get("eval_whole_split")
        if self.full_validation and whole is not True:
            scored = result.get("val_tokens_total")
            out.append(
                "no eval_whole_split recorded"
                if whole is None
                else f"it scored the first {_count(scored)} validation tokens (eval.tokens), not the whole split"
            )
        for suffix, phase in (("", "eval"), ("_quant", "quantized eval")):
            scored = result.get(f"val_tokens_scored{suffix}")
            if result.get(f"eval_complete{suffix}") is False:
                out.append(f"the {phase} was cut short (eval_complete{suffix} false)")
            elif self.val_tokens is not None and scored is not None and scored != self.val_tokens:
                out.append(f"the {phase} scored {_count(scored)} tokens, not the track's {self.val_tokens:,}")
        if result.get("ttt_complete") is False:
            out.append(
                f"TTT scored {100 * float(result.get('ttt_fraction') or 0):.1f}% of the tokens (ttt_complete false)"
            )
        return out

    def _time_problems(self, result: dict[str, Any]) -> list[str]:
        out = []
        if self.train_seconds is not None:
            train = result.get("train_seconds")
            if train is None:
                out.append("no train_seconds recorded")
            elif float(train) > self.train_seconds:
                out.append(f"trained {float(train):.1f} s (Hessians included), over {self.train_seconds:g} s")
        if self.eval_seconds is not None:
            seconds = result.get("eval_seconds")
            if seconds is None:
                out.append("no eval_seconds recorded")
            elif float(seconds) > self.eval_seconds:
                out.append(f"evaluated in {float(seconds):.1f} s (compile included), over {self.eval_seconds:g} s")
        return out

    def rules_text(self) -> str:
        """The rules in one line, for the plan's description and the export's README."""
        parts = [f"{self.gpus} x {self.card or 'GPU'}"] if self.gpus else []
        parts += [f"train <= {self.train_seconds:g} s"] if self.train_seconds else []
        parts += [f"eval <= {self.eval_seconds:g} s"] if self.eval_seconds else []
        parts += [f"artifact <= {self.artifact_cap_bytes:,} bytes"] if self.artifact_cap_bytes else []
        parts += ["the whole validation split"] if self.full_validation else []
        parts += [f"{self.val_tokens:,} validation targets"] if self.val_tokens else []
        parts += [f"data {' or '.join(self.data)}"] if self.data else []
        return f"{self.name} ({self.contest}): " + (", ".join(parts) or "no limits")


def _pin_problems(data: str, pin: ValidationPin | None, result: dict[str, Any]) -> list[str]:
    """Why a run's recorded validation identity is not the one the track pins for its data setting (nothing to
    check where none is pinned: a record claim refuses that itself, speedrun.export.track)."""
    if pin is None or pin.tokenizer_sha256 is None:
        return []
    out = []
    used = result.get("tokenizer_sha256")
    if not used or not pin.tokenizer_sha256.startswith(str(used)):
        out.append(
            f"tokenizer sha256 {used or 'not recorded'}, not the {pin.tokenizer_sha256[:16]} pinned for data={data}"
        )
    fingerprint = result.get("eval_fingerprint")
    if pin.eval_fingerprint is not None and fingerprint != pin.eval_fingerprint:
        out.append(
            f"validation set eval_fingerprint {fingerprint or 'not recorded'}, not the {pin.eval_fingerprint} pinned "
            f"for data={data}"
        )
    return out


def scored_keys(result: dict[str, Any]) -> tuple[str, str] | None:
    """(loss key, bpb key) of what a parameter-golf submission of this run is scored on: TTT's when it scored every
    token, else the quantized artifact's; None when the run has neither (quant=off)."""
    for loss, bpb in SCORED_KEYS:
        if _finite(result.get(loss)) and (loss != "val_loss_ttt" or result.get("ttt_complete")):
            return loss, bpb
    return None


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _count(value: Any) -> str:
    """A token count as the reasons write it; a record may lack it (an old or hand-made one)."""
    return f"{value:,}" if isinstance(value, int) else "?"


def _status_problems(result: dict[str, Any]) -> list[str]:
    status = result.get("status")
    return [] if status == "ok" else [f"status {status}"]
