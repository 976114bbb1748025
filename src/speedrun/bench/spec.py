"""What a check is, as data: its arms, the corpus they train on, the machine it needs and the bar it is held to.

A check is declared once (``speedrun/bench/checks/``) and everything else is derived from it: the commands each
arm runs (``python -m speedrun.bench --dry-run NAME``), the run itself, the result file and its section of
docs/benchmarks.md. Two kinds of arm:

- ``RunArm``: a speedrun run, ``python -m run <overrides>``; its metrics are keys of the run's result.json, or one
  of the derived metrics of ``speedrun.bench.metrics``.
- ``PeerArm``: another project's training script (parameter-golf's train_gpt.py), given by a command and env
  template; its metrics come from a parser of its log (``speedrun.bench.parsers``). The script's path is the
  user's (``--peer NAME=PATH``); its sha256 goes into the result.

A bar compares metrics: the ratio of one metric between two arms (``Ratio``), one arm's value or the difference of
two of its metrics (``Value``), or one metric's difference between two arms (``Diff``). A check passes when every
bar does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Op = Literal[">=", "<="]


def _compare(observed: float, op: Op, threshold: float) -> bool:
    return observed >= threshold if op == ">=" else observed <= threshold


def _threshold(value: float) -> str:
    """A bar's threshold as written: 1.25, 24,000, 16,000,000."""
    return f"{value:,.0f}" if value == int(value) and abs(value) >= 1000 else f"{value:g}"


def _number(value: object) -> float | None:
    """A finite float from a metric's value (bools count as 0/1), else None."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


@dataclass(frozen=True)
class Corpus:
    """The data every arm trains and evaluates on."""

    data: str
    """The data= option (conf/data/<data>.yaml) a speedrun arm selects."""
    path: str | None = None
    """Directory of the parameter-golf-format shards (fineweb_{train,val}_*.bin), relative to the repository root;
    None for the embedded corpus, which speedrun builds on first use in its cache dir."""
    tokenizer: str | None = None
    """The shards' tokenizer (a SentencePiece .model, or a .tiktoken file), relative to the repository root; None
    for the embedded corpus."""
    vocab_size: int = 1024
    """The tokenizer's vocabulary, passed to speedrun (data.vocab_size) and to peers (VOCAB_SIZE)."""
    prepare: tuple[str, ...] = ()
    """The command that builds ``path`` when it holds no shards (run from the repository root, once); () when the
    corpus must be fetched by hand (the check then says how and does not run)."""
    inputs: tuple[str, ...] = ()
    """Files ``prepare`` reads that are not in the repository (relative to its root): without them the check
    cannot run here, and ``how`` says where to get them."""
    how: str = ""
    """One line for a missing corpus, or missing inputs, that ``prepare`` cannot build: where to get them."""

    def overrides(self) -> tuple[str, ...]:
        """What a speedrun arm adds to its command line to train on this corpus."""
        out = [f"data={self.data}"]
        if self.path is not None:
            out.append(f"data.path={self.path}")
        if self.tokenizer is not None:
            out.append(f"data.tokenizer={self.tokenizer}")
        out.append(f"data.vocab_size={self.vocab_size}")
        return tuple(out)


EMBEDDED = Corpus(data="embedded")
"""The Python 3.11 documentation shipped in the repository (4.1 M training tokens, vocabulary 1024): small, so a
GPU run passes over it many times; right for speed, wrong for quality."""


@dataclass(frozen=True)
class RunArm:
    """One side of a check: a speedrun run."""

    name: str
    """Short label (a column in the result, the denominator or numerator of a ratio)."""
    overrides: tuple[str, ...]
    """``python -m run`` overrides (the corpus's and the seed are added by the runner)."""
    gpus: int = 1
    """GPUs the run needs; above 1 the overrides must carry dist.nproc=<gpus>."""
    stop_after_s: float | None = None
    """Stop the run with SIGTERM this many seconds after its warm-up (its ``ready to train`` line), then resume it (``python -m run
    resume=<run dir>``): its metrics are then the resumed run's, over both parts."""
    compare_with: str | None = None
    """With ``stop_after_s``: the arm that ran uninterrupted, whose loss curve the resumed one is compared with
    (metrics ``resumed_from_step``, ``max_train_loss_diff`` and ``checkpoint_write_s``: speedrun.bench.resume)."""

    def __post_init__(self) -> None:
        if self.compare_with is not None and self.stop_after_s is None:
            raise ValueError(f"arm {self.name}: compare_with needs stop_after_s (a run stopped and resumed)")
        if self.gpus > 1 and f"dist.nproc={self.gpus}" not in self.overrides:
            raise ValueError(f"arm {self.name}: gpus={self.gpus} needs dist.nproc={self.gpus} in its overrides")


@dataclass(frozen=True)
class PeerArm:
    """One side of a check: another project's training script, run as its authors run it."""

    name: str
    """Short label, as RunArm.name."""
    peer: str
    """The name a user gives its script by (``--peer <peer>=/path/to/train_gpt.py``)."""
    source: str
    """Where the script comes from (repository and path), for the reader."""
    parser: str
    """The log parser in speedrun.bench.parsers.PARSERS that turns its output into metrics."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment the script reads its settings from. Values may name {data_path}, {tokenizer}, {vocab_size},
    {seed} and {run_dir}, filled in by the runner."""
    gpus: int = 1
    """GPUs: 1 runs ``python <script>`` (no process group, so a script that all-reduces its stop flag every step,
    as parameter-golf's do, does not pay that sync on one GPU); more run ``torchrun --standalone
    --nproc_per_node=<gpus> <script>``."""
    needs_fa3: bool = False
    """The script imports FlashAttention-3's ``flash_attn_interface``: on a machine without it, FA3's interface on
    FlashAttention-4 where that is installed (speedrun.bench.fa4), else ``--fa3-shim DIR``, goes first on
    PYTHONPATH."""
    needs_commands: tuple[str, ...] = ()
    """Programs the script runs as subprocesses, which must be on PATH: checked before any GPU time is spent (the
    record script counts its code with python-minifier's ``pyminify`` after training, and crashes there without it)."""
    needs_modules: tuple[str, ...] = ()
    """Modules the script imports beyond torch, checked likewise (the record script imports brotli only to write its
    artifact, after training)."""


Arm = RunArm | PeerArm


@dataclass(frozen=True)
class Ratio:
    """``metric`` of arm ``num`` divided by the same metric of arm ``den``, against a threshold."""

    metric: str
    num: str
    den: str
    op: Op
    value: float

    @property
    def text(self) -> str:
        return f"ratio {self.metric} {self.num}/{self.den} {self.op} {_threshold(self.value)}"

    def observe(self, metrics: Mapping[str, Mapping[str, object]]) -> float | None:
        a, b = _number(metrics[self.num].get(self.metric)), _number(metrics[self.den].get(self.metric))
        return None if a is None or b is None or b == 0 else a / b


@dataclass(frozen=True)
class Value:
    """One arm's ``metric`` (minus its ``minus`` metric, when given), against a threshold."""

    arm: str
    metric: str
    op: Op
    value: float
    minus: str | None = None

    @property
    def text(self) -> str:
        what = self.metric if self.minus is None else f"{self.metric} - {self.minus}"
        return f"value {self.arm}: {what} {self.op} {_threshold(self.value)}"

    def observe(self, metrics: Mapping[str, Mapping[str, object]]) -> float | None:
        a = _number(metrics[self.arm].get(self.metric))
        if self.minus is None:
            return a
        b = _number(metrics[self.arm].get(self.minus))
        return None if a is None or b is None else a - b


@dataclass(frozen=True)
class Diff:
    """``metric`` of arm ``a`` minus the same metric of arm ``b``, against a threshold."""

    metric: str
    a: str
    b: str
    op: Op
    value: float

    @property
    def text(self) -> str:
        return f"diff {self.metric} {self.a} - {self.b} {self.op} {_threshold(self.value)}"

    def observe(self, metrics: Mapping[str, Mapping[str, object]]) -> float | None:
        a, b = _number(metrics[self.a].get(self.metric)), _number(metrics[self.b].get(self.metric))
        return None if a is None or b is None else a - b


Bar = Ratio | Value | Diff


def judge(bar: Bar, metrics: Mapping[str, Mapping[str, object]]) -> tuple[float | None, bool]:
    """(what the bar observed, whether it passed): a metric that is missing fails the bar."""
    observed = bar.observe(metrics)
    return observed, observed is not None and _compare(observed, bar.op, bar.value)


@dataclass(frozen=True)
class Check:
    """A measured claim: arms run on one machine in one process, metrics extracted, bars judged."""

    name: str
    """Identifier: the CLI argument, the results folder (benchmarks/results/<name>/) and the docs anchor."""
    measures: str
    """What it measures, in one sentence."""
    arms: tuple[Arm, ...]
    """The runs it compares (one arm for a check against a fixed bar)."""
    bars: tuple[Bar, ...]
    """What counts as a pass; every bar must hold."""
    metrics: tuple[str, ...]
    """Metrics extracted from every arm (result.json keys or derived metrics for speedrun arms, the parser's keys
    for peers): what the result file and the docs show."""
    cards: tuple[str, ...] = ()
    """Card families it may run on, matched in the GPU's name (e.g. ("H100", "H200")); () any CUDA GPU; ("cpu",)
    a machine without a GPU."""
    corpus: Corpus = EMBEDDED
    """What every arm trains on."""
    seeds: tuple[int, ...] = (0,)
    """Seeds each arm runs with; an arm's metric is the mean over its seeds and passes."""
    repeats: int = 1
    """Passes over the arms. Arms alternate within a pass (A B A B ...), so a speed ratio comes from one machine in
    one call, with drift shared by both sides."""
    parallel: bool = False
    """Run a pass's arms at the same time, each on its own GPUs (the machine needs the sum of their GPUs): for
    checks whose arms take minutes each. Off: one arm at a time on the first GPUs."""
    timeout_s: float = 900.0
    """Seconds one arm's run may take, start-up, compile and evaluation included; past it the run is stopped and
    its metrics are missing."""
    notes: str = ""
    """Caveats shown with the check in docs/benchmarks.md (what the figure does and does not say)."""

    def __post_init__(self) -> None:
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"check {self.name}: arm names repeat: {names}")
        for bar in self.bars:
            used = {getattr(bar, k) for k in ("num", "den", "arm", "a", "b") if hasattr(bar, k)}
            unknown = used - set(names)
            if unknown:
                raise ValueError(f"check {self.name}: bar {bar.text!r} names arms it does not have: {sorted(unknown)}")
            wanted = {bar.metric} | ({bar.minus} if isinstance(bar, Value) and bar.minus else set())
            if not wanted <= set(self.metrics):
                raise ValueError(f"check {self.name}: bar {bar.text!r} needs {sorted(wanted)} in its metrics")
        for arm in self.arms:
            if isinstance(arm, RunArm) and arm.compare_with is not None and arm.compare_with not in names:
                raise ValueError(f"check {self.name}: arm {arm.name} compares with {arm.compare_with}, not an arm")
        if self.parallel and any(isinstance(a, RunArm) and a.stop_after_s for a in self.arms):
            raise ValueError(f"check {self.name}: an arm stopped and resumed runs alone; parallel must be off")
        quality = [m for m in self.metrics if m.startswith(("val_bpb", "val_loss"))]
        if quality and "epochs" not in self.metrics:
            # a val_bpb means little without how often the model saw its training tokens
            raise ValueError(f"check {self.name}: it shows {quality}; list 'epochs' in its metrics beside them")
        if self.repeats < 1 or not self.seeds:
            raise ValueError(f"check {self.name}: needs repeats >= 1 and at least one seed")

    @property
    def gpus(self) -> int:
        """GPUs the machine needs: the widest arm, or every arm's at once when they run in parallel."""
        widths = [a.gpus for a in self.arms]
        return 0 if self.cards == ("cpu",) else (sum(widths) if self.parallel else max(widths))

    @property
    def peers(self) -> tuple[str, ...]:
        return tuple(a.peer for a in self.arms if isinstance(a, PeerArm))

    @property
    def card_text(self) -> str:
        if self.cards == ("cpu",):
            return "CPU"
        return " or ".join(self.cards) if self.cards else "any GPU"
