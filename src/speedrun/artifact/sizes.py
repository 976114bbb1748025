"""The counted code bytes of a config, without training: compose it, resolve its Plan for a card, link the
self-extracting train_gpt.py a run of it would write (speedrun.artifact.wrap), and measure it.

    python -m speedrun.artifact.sizes                          # docs/export.md's table: every experiment, the default
    python -m speedrun.artifact.sizes --write docs/export.md   # the same, written between its marker lines
    python -m speedrun.artifact.sizes experiment=pgolf_record  # one config: the bytes each role costs, beside the
                                                               # 2026-04-29 record script's for the same role
    python -m speedrun.artifact.sizes --record train_gpt.py    # that record script's roles, measured again

A config whose hardware is auto (or cpu) is resolved for an H100 (speedrun.hardware.profiles.device_for), the card
the records run on, so the numbers do not depend on the machine that measures them; one that names its card is
resolved for that card. The file's bytes depend on the Python minor version (python-minifier's output) and on
which compressors are installed (brotli), as a run's do.
"""

from __future__ import annotations

import hashlib
import lzma
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speedrun.artifact.link import counted, tail
from speedrun.artifact.wrap import CodeSource, build_wrapper, compressor_of, file_requirements, pack
from speedrun.config import CONF_DIR, register_configs, to_config
from speedrun.config.choices import HardwareName
from speedrun.hardware.profiles import device_for
from speedrun.plan import resolve

CARD = "h100"
"""The profile a config with hardware=auto is measured for."""

TARGETS = {"experiment=pgolf_record": 40_000, "model=pgolf_baseline": 30_000}
"""Code bytes these configs aim at: the 2026-04-29 record's script counts 31,385 bytes; every byte of code is a
byte less of model under parameter-golf's 16,000,000."""


@dataclass(frozen=True)
class CodeSize:
    overrides: tuple[str, ...]
    code_bytes: int
    """The self-extracting file's length: what a run of this config counts as artifact_code_bytes."""
    compressor: str
    modules: dict[str, int]
    """{linked module path: its kept source minified, lzma-compressed alone}: each module's share, roughly (the file
    compresses them together, which costs less than the sum)."""


def resolved(overrides: list[str] | tuple[str, ...], card: str = CARD) -> tuple[dict[str, Any], Any]:
    """(the config tree, its Plan) of a run composed from ``overrides``, resolved for ``card`` unless the config
    names its hardware."""
    from hydra import compose, initialize_config_dir  # composing is Hydra's; the measured file never imports it
    from omegaconf import OmegaConf  # as above

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        composed = compose(config_name="config", overrides=list(overrides))
    cfg = to_config(composed)
    name = str(cfg.hardware.name)
    device = device_for(card if cfg.hardware.name in (HardwareName.auto, HardwareName.cpu) else name)
    tree = OmegaConf.to_container(composed, resolve=True, enum_to_str=True)
    assert isinstance(tree, dict)
    return {str(k): v for k, v in tree.items()}, resolve(cfg, device, cwd=Path.cwd())


def code_size(overrides: list[str] | tuple[str, ...], card: str = CARD) -> CodeSize:
    """The code bytes a run composed from ``overrides`` would count, its Plan resolved for ``card`` unless the
    config names its hardware."""
    _, plan = resolved(overrides, card)
    code = CodeSource.snapshot().for_plan(plan)
    data, _ = build_wrapper(code)
    modules = {
        path: len(lzma.compress(counted(text).encode("utf-8"), preset=9 | lzma.PRESET_EXTREME))
        for path, text in module_parts(code).items()
    }
    return CodeSize(tuple(overrides), len(data), compressor_of(data), modules)


def module_parts(code: CodeSource) -> dict[str, str]:
    """{module path: its part of the linked module} (the ``# ---- path ----`` sections of train_gpt_human.py)."""
    from speedrun.artifact.link import link, sections, settings_types

    assert code.settings is not None and code.plan is not None
    return sections(link(code.files, code.plan, settings_types(code.settings)))


ROLES = ("driver", "model", "data", "step", "eval", "quant", "TTT")
"""What each part of the file does, as a record's train_gpt.py is read: the driver (settings, logging, main), the
model with its optimizers, the data streams, the training step and loop, evaluation, quantization and compression,
and test-time training."""

CORE_ROLES = {
    **dict.fromkeys(("model", "attention", "fp8", "optim"), "model"),
    "data": "data",
    **dict.fromkeys(("train", "compile", "dist", "pipeline"), "step"),
    "evaluate": "eval",
    **dict.fromkeys(("quant", "gptq", "pergroup"), "quant"),
}
"""speedrun/core/<module>.py -> its role; core/ttt_*.py are TTT, anything else of the file (driver.py, progress,
tables, errors, core/__init__.py) is the driver's."""


def role_of(path: str) -> str:
    """The role a linked module (speedrun/core/x.py, speedrun/driver.py, ...; src/ in front or not) counts under."""
    rel = path.removeprefix("src/").removeprefix("speedrun/")
    if rel.startswith("core/"):
        name = rel.removeprefix("core/").removesuffix(".py")
        return "TTT" if name.startswith("ttt_") else CORE_ROLES.get(name, "driver")
    return "driver"


@dataclass(frozen=True)
class RoleCost:
    files: int
    alone: int
    """The file built from this role's parts only, less the file built from none (the wrapper and settings)."""
    lose: int
    """What the whole file loses without this role's parts. Roles compress together, so these add up to less than
    the file."""


RECORD = {
    "driver": RoleCost(1, 4_471, 3_544),
    "model": RoleCost(1, 8_126, 6_829),
    "data": RoleCost(1, 2_563, 1_962),
    "step": RoleCost(1, 1_860, 1_270),
    "eval": RoleCost(1, 951, 398),
    "quant": RoleCost(1, 3_855, 3_182),
    "TTT": RoleCost(1, 5_667, 4_132),
}
"""The 2026-04-29 record script's roles, counted as this module counts speedrun's (speedrun's minifier and
wrapper, brotli): openai/parameter-golf 4908dc46f, records/track_10min_16mb/2026-04-29_SmearGateBOSFix_3Seed_1.06141/
train_gpt.py (RECORD_SHA256), cut by RECORD_LINES. ``--record FILE`` measures them again."""
RECORD_WRAPPER = 898
"""Its wrapper with no code (the record has no settings file: its defaults are in the code)."""
RECORD_BYTES = 24_493
"""The record script whole, packed the same way (its log counts 31,385 B in its own lzma+base85 wrapper)."""
RECORD_SHA256 = "8520ea55b64e3768aa46ac12f663ec8be31a236b73d17c42a23648541762595f"
RECORD_LINES = {
    "driver": ((1, 14), (227, 449), (3136, 3147), (3359, 3575)),
    "model": ((15, 226), (754, 1426), (1720, 2036)),  # fused CE, GPT, then Muon and the optimizer groups
    "data": ((450, 753),),
    "step": ((3148, 3358),),
    "eval": ((2531, 2614),),
    "quant": ((2037, 2530),),
    "TTT": ((1636, 1719), (1427, 1635), (2615, 3135)),  # LoRA, GPT's forward_ttt & co., the TTT pass
}
"""The record script's lines (1-based, inclusive) of each role. GPT's TTT methods (1427-1635) go under a class
header of their own so the part parses alone."""


def record_parts(source: str) -> dict[str, str]:
    """The record script cut into its roles' sources. Its one ``vars(type(h))`` is written ``type(h).__dict__``: a
    ``vars`` call anywhere stops python-minifier renaming locals in the whole module (+1.9 KB counted)."""
    lines = source.replace("vars(type(h))", "type(h).__dict__").splitlines(keepends=True)
    parts = {}
    for role, spans in RECORD_LINES.items():
        texts = ["".join(lines[a - 1 : b]) for a, b in spans]
        if role == "TTT":
            texts[1] = "class _GPTTTT:\n" + texts[1]
        parts[role] = "".join(texts)
    return parts


def role_costs(
    parts: dict[str, str], pack: Callable[[dict[str, str]], bytes], role: Callable[[str], str] = role_of
) -> tuple[int, int, dict[str, RoleCost]]:
    """(the file's bytes, the bytes of the file with no parts, {role: RoleCost} in ROLES order) for a file that
    ``pack`` builds from ``parts`` ({path: source}) or any subset of them."""
    full, empty = len(pack(parts)), len(pack({}))
    groups: dict[str, list[str]] = {}
    for path in parts:
        groups.setdefault(role(path), []).append(path)
    out = {}
    for name in sorted(groups, key=lambda r: ROLES.index(r) if r in ROLES else len(ROLES)):
        mine = set(groups[name])
        alone = len(pack({p: t for p, t in parts.items() if p in mine})) - empty
        lose = full - len(pack({p: t for p, t in parts.items() if p not in mine}))
        out[name] = RoleCost(len(mine), alone, lose)
    return full, empty, out


def role_table(full: int, empty: int, roles: dict[str, RoleCost], target: int | None = None) -> str:
    """The role table as text: each role's files, alone and lose, beside the record script's."""
    head = f"{'role':<20} {'files':>5} {'alone':>8} {'lose':>8}   {'record alone':>12} {'record lose':>11}"
    lines = [head]
    for name, cost in roles.items():
        rec = RECORD.get(name)
        rec_text = f"{rec.alone:>12,} {rec.lose:>11,}" if rec else f"{'':>12} {'':>11}"
        lines.append(f"{name:<20} {cost.files:>5} {cost.alone:>8,} {cost.lose:>8,}   {rec_text}")
    lines.append(f"{'wrapper + settings':<20} {'':>5} {empty:>8,} {'':>8}   {RECORD_WRAPPER:>12,}")
    goal = f" (target {target:,})" if target else ""
    lines.append(f"{'the file':<20} {'':>5} {full:>8,}{goal}   {'':>1}record script whole: {RECORD_BYTES:,}")
    return "\n".join(lines)


def code_roles(code: CodeSource) -> tuple[int, int, dict[str, RoleCost]]:
    """role_costs of the file ``code`` makes: its linked module's parts, every subset packed with the whole file's
    compressor and ending in the same settings."""
    data, human = build_wrapper(code)
    assert code.settings is not None
    parts, end = module_parts(code), tail(code.settings)
    head = human.split("\n# ---- ", 1)[0]  # the header and the external imports
    compressor, needs = compressor_of(data), file_requirements(code.settings, code.versions.get("torch"))

    def packed(files: dict[str, str]) -> bytes:
        return pack(counted("\n\n".join([head, *files.values(), end])), compressor, needs)

    return role_costs(parts, packed)


def record_roles(path: Path) -> tuple[int, int, dict[str, RoleCost]]:
    """role_costs of the record script at ``path`` (checked against RECORD_SHA256), cut by RECORD_LINES."""
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != RECORD_SHA256:
        raise SystemExit(f"error: {path} is not the 2026-04-29 record's train_gpt.py (sha256 {RECORD_SHA256[:16]}…)")
    parts = {f"{role}.py": text for role, text in record_parts(data.decode("utf-8")).items()}  # .py: minified

    def packed(files: dict[str, str], compressor: str | None = None) -> bytes:
        return pack(counted("\n\n".join(files.values())), compressor)

    compressor = compressor_of(packed(parts))
    return role_costs(parts, lambda files: packed(files, compressor), role=lambda p: p.removesuffix(".py"))


def experiments() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


def table_rows() -> list[tuple[str, CodeSize]]:
    """docs/export.md's rows: the default job, model=pgolf_baseline, and each experiment."""
    configs = [("(defaults)", []), ("model=pgolf_baseline", ["model=pgolf_baseline"])]
    configs += [(f"experiment={name}", [f"experiment={name}"]) for name in experiments()]
    return [(label, code_size(overrides)) for label, overrides in configs]


def markdown(rows: list[tuple[str, CodeSize]]) -> str:
    lines = ["| config | code bytes | compressor | modules linked |", "|---|---:|---|---:|"]
    for label, size in rows:
        lines.append(f"| `{label}` | {size.code_bytes:,} | {size.compressor} | {len(size.modules)} |")
    return "\n".join(lines)


BEGIN, END = "<!-- speedrun.artifact.sizes: begin -->", "<!-- speedrun.artifact.sizes: end -->"
"""The lines between which ``--write`` puts the table in a Markdown page."""


def write_table(page: Path, table: str) -> None:
    text = page.read_text(encoding="utf-8")
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise SystemExit(f"error: {page} has no {BEGIN} ... {END} lines to put the table between")
    page.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}", encoding="utf-8")


def main(argv: list[str]) -> int:
    if not argv or argv[0] == "--write":
        table = markdown(table_rows())
        if argv:
            write_table(Path(argv[1]), table)
        print(table)
        return 0
    if argv[0] == "--record":
        if len(argv) != 2:
            raise SystemExit("error: --record takes the record's train_gpt.py, e.g. --record train_gpt.py")
        full, empty, roles = record_roles(Path(argv[1]))
        print(f"{argv[1]}: {full:,} bytes by role (its parts packed as speedrun packs its own)")
        print(role_table(full, empty, roles))
        return 0
    _, plan = resolved(argv)
    code = CodeSource.snapshot().for_plan(plan)
    full, empty, roles = code_roles(code)
    label = " ".join(argv)
    parts = len(module_parts(code))
    print(f"{label}: {full:,} bytes of code ({compressor_of(build_wrapper(code)[0])}, {parts} modules linked)")
    print(role_table(full, empty, roles, TARGETS.get(label)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
