"""What score-first TTT is asked to do: LoRASettings (what ``ttt.*`` resolves to) and the checks made before any
work starts."""

from __future__ import annotations

from dataclasses import dataclass

from speedrun.config.specs import parse_short_chunks
from speedrun.ttt.global_phases import GlobalSettings


@dataclass(frozen=True)
class LoRASettings:
    """How the adapters learn: what ``ttt.*`` resolves to (speedrun.config.finishing.TTTConfig has each knob's
    meaning)."""

    rank: int
    lr: float
    chunk_size: int
    local_lr_mult: float = 1.0
    """The adapters' optimizer steps at lr x local_lr_mult (ttt.local_lr_mult); global TTT keeps phased.lr."""
    short_chunks: str = ""
    """Short documents' chunk schedule, "LEN:CHUNK,..." (config.specs.parse_short_chunks); "" = off."""
    targets: str = "all"
    batch_size: int = 1
    """Documents adapted side by side, each with its own adapters."""
    beta1: float = 0.9
    beta2: float = 0.95
    weight_decay: float = 0.0
    max_seconds: float | None = None
    """Stop after the chunk that passes this many seconds (the rest unscored, recorded as the fraction scored)."""
    seed: int = 0
    score_base: bool = True
    """Also score each chunk with the unadapted model (base_val_loss, base_val_bpb)."""
    alpha: float | None = None
    """LoRA scaling alpha / rank; None: 1."""
    optimizer: str = "adam"
    """adam (AdamW with beta1, beta2, eps, weight_decay) or sgd (momentum, weight_decay)."""
    eps: float = 1e-8
    momentum: float | None = None
    warm_start_a: bool = False
    """Keep A from one batch to the next of its chain (B still starts at 0); A goes back to its draw after a
    global phase."""
    warm_start_chains: int = 8
    """With warm_start_a: the batches between two global phases are dealt into this many chains, whatever the rank
    count, each on one rank (documents.deal_batches); a batch continues the A of its chain's previous batch. At least
    the rank count."""
    phased: GlobalSettings = GlobalSettings()
    """Phased global TTT (speedrun.ttt.global_phases); off by default."""
    cast_weights: bool = True
    """Under a bf16/fp16 autocast, keep the frozen linears of the adapted copy (and of the unadapted one that scores
    val_bpb_ttt_base) in that dtype, cast once (speedrun.ttt.lora.cast_linear_weights): the same numbers,
    without a cast of every weight at every forward. False: the casts at every call (tests compare the two)."""
    compile: str | None = None
    """torch.compile backend of the adapted and unadapted forwards (inductor; tests use aot_eager), dynamic
    shapes, warmed up before the clock starts; None: eager."""
    compile_scope: str = "blocks"
    """blocks: each block and the head compiled on their own (one small graph that every block reuses, through
    the model's compiled_regions); model: the whole forward as one graph."""
    cuda_graphs: bool = False
    """Replay each step from a CUDA graph, one per step shape, all captured before the clock starts
    (speedrun.ttt.graphs); CUDA only."""
    max_batch_share: float | None = None  # None here: unit tests batch exactly as asked; the config's default is 1/8
    """Halve a batch (by documents) while its cost is more than this share of all batches' (documents.
    split_heavy_batches): a batch of long documents that one rank would work on while the others wait. None: never."""
    row_widths: str = "pow2"
    """The widths a step's rows are padded to (global_phases.row_width): pow2 (64, 128, 256, ...), half_octave
    (64, 96, 128, 192, ...: less padding, twice the shapes to compile and capture) or a number N (multiples of N)."""
    graph_rows: str = "pow2"
    """The row counts a graphed step is padded to (graphs.pad_rows): pow2 or half_octave (3, 6, 12, 24, ...)."""
    shared_attn_a: bool = False
    """One A product for the adapters that read the attention's input (q, k, v, attn_bypass), through the
    attention's adapter hook (speedrun.ttt.lora.InputAdapters): the same arithmetic, x read once."""


def check_settings(s: LoRASettings, seq_len: int, world: int) -> list[tuple[int, int]]:
    """Refuse settings TTT cannot run (ValueError, naming the knob) on ``world`` ranks; returns the short documents'
    chunk schedule (ttt.short_chunks, parsed)."""
    steps = parse_short_chunks(s.short_chunks)
    for size in [s.chunk_size] + [c for _, c in steps]:
        if not 1 <= size <= seq_len:
            raise ValueError(f"TTT chunk sizes must be in [1, seq_len={seq_len}], got {size}")
    if s.batch_size < 1:
        raise ValueError(f"ttt.batch_size must be >= 1, got {s.batch_size}")
    if s.warm_start_a and not 1 <= world <= s.warm_start_chains:
        raise ValueError(f"ttt.warm_start_chains={s.warm_start_chains} chains cannot keep {world} ranks busy")
    padding(s)
    return steps


def padding(s: LoRASettings) -> tuple[str, bool]:
    """(ttt.row_widths, whether ttt.graph_rows pads graphed steps' rows to half octaves), checked."""
    if not (s.row_widths in ("pow2", "half_octave") or (s.row_widths.isdigit() and int(s.row_widths) >= 16)):
        raise ValueError(f"ttt.row_widths must be pow2, half_octave or a multiple like 128, got {s.row_widths!r}")
    if s.graph_rows not in ("pow2", "half_octave"):
        raise ValueError(f"ttt.graph_rows must be pow2 or half_octave, got {s.graph_rows!r}")
    return s.row_widths, s.graph_rows == "half_octave"
