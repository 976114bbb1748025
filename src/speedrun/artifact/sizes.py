"""The counted code bytes of a config, without training: compose it, resolve its Plan for a card, build the
self-extracting train_gpt.py a run of it would write, and measure it.

    python -m speedrun.artifact.sizes                          # docs/export.md's table: every experiment, the default
    python -m speedrun.artifact.sizes --write docs/export.md   # the same, written between its marker lines
    python -m speedrun.artifact.sizes experiment=pgolf_record  # one config: the bytes each package costs

A config whose hardware is auto (or cpu) is resolved for an H100 (speedrun.hardware.profiles.device_for), the card
the records run on, so the numbers do not depend on the machine that measures them; one that names its card is
resolved for that card. The file's bytes depend on the Python minor version (python-minifier's output) and on
which compressors are installed (brotli), as a run's do.
"""

from __future__ import annotations

import dataclasses
import lzma
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speedrun.artifact.wrap import CodeSource, build_wrapper, compressor_of
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
    """{packed path: its minified source's bytes, lzma-compressed alone}: each module's share, roughly (the file
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
    tree, plan = resolved(overrides, card)
    data, minified = build_wrapper(CodeSource.snapshot(tree, plan))
    modules = {
        path: len(lzma.compress(text.encode("utf-8"), preset=9 | lzma.PRESET_EXTREME))
        for path, text in minified.items()
    }
    return CodeSize(tuple(overrides), len(data), compressor_of(data), modules)


def package_of(path: str) -> str:
    """The package a packed file is counted under: speedrun/<package>/, a top-level module, or a non-Python file."""
    parts = path.removeprefix("src/").split("/")
    return "/".join(parts[:2]) + ("/" if len(parts) > 2 else "") if parts[0] == "speedrun" else parts[0]


def package_costs(code: CodeSource) -> tuple[int, dict[str, int]]:
    """The file ``code`` makes: its bytes, and {package: the bytes the file would lose without it}, largest first
    (the file rebuilt with the same compressor and config, that package's files left out). Packages compress
    together, so the costs add up to less than the file."""
    full, _ = build_wrapper(code)
    compressor = compressor_of(full)
    costs = {}
    for package in sorted({package_of(p) for p in code.files}):
        files = {p: t for p, t in code.files.items() if package_of(p) != package}
        without, _ = build_wrapper(dataclasses.replace(code, files=files), compressor)
        costs[package] = len(full) - len(without)
    return len(full), dict(sorted(costs.items(), key=lambda kv: -kv[1]))


def experiments() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


def table_rows() -> list[tuple[str, CodeSize]]:
    """docs/export.md's rows: the default job, model=pgolf_baseline, and each experiment."""
    configs = [("(defaults)", []), ("model=pgolf_baseline", ["model=pgolf_baseline"])]
    configs += [(f"experiment={name}", [f"experiment={name}"]) for name in experiments()]
    return [(label, code_size(overrides)) for label, overrides in configs]


def markdown(rows: list[tuple[str, CodeSize]]) -> str:
    lines = ["| config | code bytes | compressor | modules packed |", "|---|---:|---|---:|"]
    for label, size in rows:
        py = sum(1 for p in size.modules if p.endswith(".py"))
        lines.append(f"| `{label}` | {size.code_bytes:,} | {size.compressor} | {py} |")
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
    size = code_size(argv)
    print(f"{' '.join(argv)}: {size.code_bytes:,} bytes of code ({size.compressor}, {len(size.modules)} files)")
    tree, plan = resolved(argv)
    _, costs = package_costs(CodeSource.snapshot(tree, plan))
    print("bytes the file would lose without each package (they compress together: the sum is less):")
    for package, cost in costs.items():
        print(f"  {cost:>7,}  {package}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
