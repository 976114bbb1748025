"""Parsers for the knobs OmegaConf cannot type alone: counts written 2e9, progressive stages, TTT targets and
short-document chunks.

Torch-free, so the config schemas can check these values beside their fields, at compose time.
"""

from __future__ import annotations

from typing import Any

from speedrun.errors import ConfigError

TTT_TARGETS = ("q", "k", "v", "o", "up", "down", "attn_bypass", "mlp_bypass", "head")
"""What can carry a LoRA adapter: the block linears attention q, k, v, o (proj) and MLP up (fc), down (proj); a
low-rank path beside a whole sublayer, from its input to its output (attn_bypass, mlp_bypass: what the 2026-04
records call their o and MLP adapters); the output head (a delta on the logits, tied or untied)."""
TTT_PRESETS = {
    "all": ("q", "k", "v", "o", "up", "down"),
    "no_qv": ("k", "o", "up", "down"),
    "qkvo": ("q", "k", "v", "o"),
    "qv": ("q", "v"),
    "record": ("q", "k", "v", "attn_bypass", "mlp_bypass", "head"),
}
"""Named target sets. record: the adapters of parameter-golf's 2026-04-27/29 records (q, k, v on the projections,
one beside each attention and each MLP, and the LM head)."""


def parse_count(value: Any, key: str) -> int | None:
    """A count (tokens, bytes) written 2000000000, 2e9, 2_000_000_000 or as such a string -> int, or None.

    The schema types these fields Any: Hydra reads 2e9 as a float, which an int field refuses, and a float field
    would show every count as 2000000000.0 in ``--cfg job``. Checks of the range stay with the field."""
    if value is None:
        return None
    number = value
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        try:
            number = int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                number = None
    if isinstance(number, float) and number.is_integer():
        number = int(number)
    if not isinstance(number, int) or isinstance(number, bool):
        raise ConfigError(f"{key}={value} is not a whole number; write a count as 2000000000, 2e9 or 2_000_000_000")
    return number


def parse_stages(spec: Any) -> list[tuple[int, float]]:
    """schedule.seq_len "1024@0.1,2048@0.7,3072@1.0" (or a list of "L@f") -> [(1024, 0.1), ...], checked."""
    if spec is None:
        raise ConfigError("schedule=progressive needs schedule.seq_len, e.g. 'schedule.seq_len=\"1024@0.5,2048@1.0\"'")
    items = [str(x).strip() for x in (spec if isinstance(spec, (list, tuple)) else str(spec).split(","))]
    stages = []
    for item in items:
        try:
            length, until = item.split("@")
            stages.append((int(length), float(until)))
        except ValueError:
            raise ConfigError(f"schedule.seq_len: cannot read {item!r}; write LENGTH@FRACTION, e.g. 1024@0.5") from None
    lengths, fractions = [s[0] for s in stages], [s[1] for s in stages]
    if any(b <= a for a, b in zip(lengths, lengths[1:])) or lengths[0] < 1:
        raise ConfigError(f"schedule.seq_len: lengths must be positive and strictly increasing, got {lengths}")
    if any(b <= a for a, b in zip(fractions, fractions[1:])) or fractions[0] <= 0:
        raise ConfigError(f"schedule.seq_len: fractions must be positive and strictly increasing, got {fractions}")
    if fractions[-1] != 1.0:
        raise ConfigError(f"schedule.seq_len: the last stage must run to 1.0 of the budget, got {fractions[-1]}")
    return stages


def parse_targets(spec: str) -> tuple[str, ...]:
    """A preset name or a comma list of TTT_TARGETS (``mlp`` = up,down) -> ordered target names."""
    spec = spec.strip()
    if spec in TTT_PRESETS:
        return TTT_PRESETS[spec]
    names: list[str] = []
    for item in (s.strip() for s in spec.split(",")):
        expanded = ("up", "down") if item == "mlp" else (item,)
        for name in expanded:
            if name not in TTT_TARGETS:
                raise ConfigError(
                    f"ttt.targets={spec!r}: unknown target {name!r}; use a preset ({', '.join(TTT_PRESETS)}) or a "
                    f"comma list of {', '.join(TTT_TARGETS)}"
                )
            if name not in names:
                names.append(name)
    if not names:
        raise ConfigError(f"ttt.targets={spec!r} names no layer; use e.g. all or no_qv")
    return tuple(names)


def parse_short_chunks(spec: str) -> list[tuple[int, int]]:
    """ "256:8,2000:24" -> [(256, 8), (2000, 24)]: (max scored tokens of a document, chunk size), ascending.
    "" -> []. Lengths must be distinct; every number a positive int."""
    steps: list[tuple[int, int]] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        parts = item.split(":")
        try:
            if len(parts) != 2:
                raise ValueError
            length, chunk = int(parts[0]), int(parts[1])
        except ValueError:
            raise ConfigError(f'ttt.short_chunks={spec!r}: {item!r} is not LEN:CHUNK (e.g. "256:8,2000:24")') from None
        if length < 1 or chunk < 1:
            raise ConfigError(f"ttt.short_chunks={spec!r}: lengths and chunk sizes must be positive, got {item!r}")
        steps.append((length, chunk))
    steps.sort()
    for (a, _), (b, _) in zip(steps, steps[1:]):
        if a == b:
            raise ConfigError(f"ttt.short_chunks={spec!r}: document length {a} appears twice")
    return steps
