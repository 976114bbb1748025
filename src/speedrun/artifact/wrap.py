"""The self-extracting train_gpt.py: the run's code, linked for its Plan, in one file, as parameter-golf's records
ship their code, so that artifact_code_bytes (the wrapped rule) is the length of a file that exists and runs.

The code is speedrun.driver linked with the part of speedrun.core it reaches for the run's Plan
(speedrun.artifact.link): one module, train_gpt_human.py, that ends in the run's frozen settings (``PLAN =
RunSettings(...)``, built from the Plan by ``frozen_settings``) and ``main(PLAN, __file__)``. train_gpt.py is that
module minified (speedrun.artifact.link.counted) and compressed, a comment and three lines of Python, e.g. for lzma:

    import lzma as C
    P="<payload>"
    exec(C.decompress(P.encode("l1"),C.FORMAT_RAW,None,[{"id":C.FILTER_LZMA2}]))

The compressed payload is written as a Latin-1 string literal (the comment declares the file's coding): each byte
is one character, and only NUL, CR, LF, backslash and the quote are escaped, so the file is about 2% larger than
the compressed bytes where base85 would add 25%. The compressor is whichever of lzma, brotli (when installed) and
zlib gives the smaller file (COMPRESSORS); ``compressor_of`` reads it back, and artifact_code.json records it. The
payload sits on its own line, so a traceback through the exec shows a short line. Both files run the same (python,
or torchrun) wherever torch, numpy and sentencepiece are installed (``requirements``); neither needs speedrun.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import lzma
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from speedrun.artifact.unwrap import compressor_of, unwrap_payload
from speedrun.core.compile import CompileOptions
from speedrun.driver import DataSettings, RunSettings
from speedrun.paths import source_path
from speedrun.plan.settings import finish_settings, plain, train_settings
from speedrun.version import __version__

if TYPE_CHECKING:
    from speedrun.plan import Plan

HEADER = (
    "# speedrun self-extracting run (coding:latin-1): `python train_gpt.py` or torchrun re-runs it; docs/export.md\n"
)

# LZMA2 at its strongest preset, raw (no container header); the decoder's default dictionary (8 MiB) covers any
# distance in a payload of a few hundred KB, so the outer line need not spell the encoder's settings out.
FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]


def _brotli(data: bytes) -> bytes:
    # optional (the compress extra): tried only where it is installed
    return bytes(importlib.import_module("brotli").compress(data, quality=11, lgwin=24))


def _deflate(data: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, -15, 9)  # raw deflate: no zlib header or checksum to count
    return c.compress(data) + c.flush()


COMPRESSORS: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "lzma": (
        lambda b: lzma.compress(b, format=lzma.FORMAT_RAW, filters=FILTERS),
        'exec(C.decompress(P.encode("l1"),C.FORMAT_RAW,None,[{"id":C.FILTER_LZMA2}]))',
    ),
    "brotli": (_brotli, 'exec(C.decompress(P.encode("l1")))'),
    "zlib": (
        lambda b: _deflate(b),
        'exec(C.decompress(P.encode("l1"),-15))',
    ),
}
"""name -> (compress, the file's exec line, which decodes P with the module imported as C: speedrun.artifact.unwrap's
DECODERS decode it the same way). The decoders are the standard library's, but brotli's, which needs the package (a
requirement of such a file)."""


def available_compressors() -> list[str]:
    """The compressors this Python can make a file with: lzma and zlib always, brotli when installed."""
    return [name for name in COMPRESSORS if name != "brotli" or find_spec("brotli") is not None]


LINKED = ("speedrun/driver.py", "speedrun/errors.py", "speedrun/progress.py", "speedrun/tables.py")
"""The modules linked beside speedrun/core/ (the driver and the shared modules the core imports)."""


def linked_sources() -> dict[str, str]:
    """{repo path: text} of every module the linker may take: speedrun/core/*.py and LINKED, read now."""
    core = sorted(p.name for p in source_path("src/speedrun/core").glob("*.py"))
    rels = [f"src/speedrun/core/{name}" for name in core] + [f"src/{rel}" for rel in LINKED]
    return {rel: source_path(rel).read_text(encoding="utf-8") for rel in rels}


def frozen_settings(
    plan: Plan | SimpleNamespace, *, hessian_reserve: float = 0.0, threads: int | None = None
) -> RunSettings:
    """The exported file's settings from a Plan (or plan.json read as attributes): the core's settings of each
    phase (speedrun.plan.settings) and what the driver sets up around them. ``hessian_reserve``: the seconds the run
    measured for GPTQ's Hessians; ``threads``: a CPU run's torch threads, as it ran."""
    d, k = plan.data, plan.kernel
    path: str
    tokenizer: str | None
    if d.path is None:  # the embedded corpus: the file trains on the dataset built from it (DATA_PATH elsewhere)
        from speedrun.data.layout import TOKENIZER_FILE, embedded_dir

        built = embedded_dir(Path(d.cache_dir), d.vocab_size)
        path, tokenizer = str(built), str(built / TOKENIZER_FILE)
    else:
        path, tokenizer = str(d.path), d.tokenizer
    ttt = plain(plan.ttt.name)
    return RunSettings(
        seed=plan.seed,
        device=plan.device,
        data=DataSettings(path, tokenizer, d.tokenizer_kind, d.vocab_size, plan.eval.tokens),
        micro_batch=plan.micro_batch,
        model_arch=plan.model_arch,
        attn=plan.attn,
        attn_options=_pairs(plan.attn_options),
        model_options=_pairs(plan.model_options),
        document_mask=plan.document_mask,
        fused_qkv=k.fused_qkv,
        fused_ce=k.fused_ce_chunk if k.fused_ce else 0,
        fp8=plain(k.fp8),
        fp8_impl=k.fp8_impl,
        ns_dtype=plan.ns_dtype,
        compile=plan.compile,
        kernel=CompileOptions(
            k.compile_mode, k.compile_scope, k.dynamic_shapes, k.coordinate_descent_tuning, k.cuda_graphs
        ),
        train=dataclasses.replace(train_settings(plan), attn_options=_pairs(plan.attn_options)),
        finish=finish_settings(plan, ttt=True),
        ttt=None if ttt == "off" else ttt,
        cap_bytes=int(plan.quant.cap_bytes),
        threads=threads if plan.device == "cpu" else None,
        tf32=plan.matmul_dtype == "tf32",
        memory_cap_gb=plan.memory_cap_gb,
        hessian_reserve=round(hessian_reserve, 3),
        dist_timeout_s=plan.dist.timeout_s,
        world_size=plan.dist.world_size,
    )


def _pairs(options: Any) -> tuple[tuple[str, Any], ...]:
    """((name, value), ...) of a Plan's options: a tuple of pairs, or plan.json's object for one (read as a mapping
    or as attributes)."""
    if isinstance(options, (tuple, list)):
        return tuple((str(k), plain(v)) for k, v in options)
    items = options.items() if isinstance(options, dict) else vars(options).items()
    return tuple((str(k), plain(v)) for k, v in items)


@dataclass(frozen=True)
class CodeSource:
    """What a run's file is made from: the source read when the job starts (the code that ran, not what is on disk
    when it ends), and the run's settings once they are known (``for_plan``)."""

    files: dict[str, str]
    """{repo path: text}: speedrun/core/ and LINKED (linked_sources)."""
    settings: RunSettings | None = None
    """The frozen settings the file runs; None until ``for_plan`` (a file is linked for a Plan)."""
    plan: dict[str, Any] | None = None
    """The Plan's values (plan.json), which choose each registry's entries."""
    versions: dict[str, str] = field(default_factory=dict)

    @classmethod
    def snapshot(cls) -> CodeSource:
        import platform

        import torch

        versions = {"torch": torch.__version__, "python": platform.python_version(), "speedrun": __version__}
        return cls(linked_sources(), versions=versions)

    def for_plan(self, plan: Plan | SimpleNamespace, **frozen: Any) -> CodeSource:
        """This source with ``plan``'s settings (frozen_settings(plan, **frozen)) and registry choices."""
        values = plan.to_dict() if hasattr(plan, "to_dict") else json.loads(json.dumps(plan, default=vars))
        return dataclasses.replace(self, settings=frozen_settings(plan, **frozen), plan=values)


def linked_module(code: CodeSource, name: str = "train_gpt_human.py") -> str:
    """The readable module: the driver and the core it reaches for ``code``'s Plan, then its settings."""
    from speedrun.artifact.link import link, readable, settings_types  # when a file is made, never when one runs

    if code.settings is None or code.plan is None:
        raise ValueError("a file is linked for a Plan: CodeSource.for_plan(plan) first")
    linked = link(code.files, code.plan, settings_types(code.settings))
    return readable(linked, code.settings, name, code.versions.get("speedrun", __version__))


def pack(minified: str, compressor: str | None = None, needs: dict[str, str] | None = None) -> bytes:
    """The self-extracting file of ``minified`` (a module's source): ``compressor``, or whichever available gives the
    smaller file; ``needs`` ({module: pip requirement}) checked first, so a Python that lacks one gets one line."""
    payload = minified.encode("utf-8")
    names = [compressor] if compressor else available_compressors()
    data = min((_file(payload, name, needs or {}) for name in names), key=len)
    if unwrap_payload(data) != minified:  # the outer lines decode with defaults: prove it, per file
        raise RuntimeError("the self-extracting file does not decode to its payload (speedrun.artifact.wrap)")
    return data


def build_wrapper(code: CodeSource, compressor: str | None = None) -> tuple[bytes, str]:
    """(train_gpt.py's bytes, train_gpt_human.py's text) for ``code``."""
    from speedrun.artifact.link import counted  # when a file is made, never when one runs

    human = linked_module(code)
    assert code.settings is not None  # linked_module refuses a source without them
    return pack(counted(human), compressor, file_requirements(code.settings, code.versions.get("torch"))), human


REQUIRED = {"torch": "torch", "numpy": "numpy>=1.24", "sentencepiece": "sentencepiece>=0.2"}
"""What every exported file imports beyond the standard library."""
OPTIONAL = {"brotli": ("brotli", "brotli>=1.1"), "zstd": ("zstandard", "zstandard>=0.22")}
"""quant.compressor (or quant.pergroup_codec), or the file's own compressor -> (module, pip requirement)."""
TIKTOKEN = ("tiktoken", "tiktoken>=0.7")
"""data.tokenizer=gpt2 or a .tiktoken file: the gpt2 extra's package."""


def file_requirements(settings: RunSettings, torch_version: str | None = None) -> dict[str, str]:
    """{module an exported file imports: its pip requirement}: REQUIRED, torch held to the run's major version, the
    artifact's compressor and codec, tiktoken for a byte-level BPE tokenizer."""
    out = dict(REQUIRED)
    if torch_version:
        major = int(torch_version.split(".")[0])
        out["torch"] = f"torch>={major},<{major + 1}"
    q = settings.finish.quant
    for codec in (q.compressor, q.pergroup_codec if q.compressor == "pergroup" else None) if q else ():
        if codec in OPTIONAL:
            out[OPTIONAL[codec][0]] = OPTIONAL[codec][1]
    if settings.data.tokenizer_kind == "tiktoken":
        out[TIKTOKEN[0]] = TIKTOKEN[1]
    return out


def requirements(config: dict[str, Any] | None, torch_version: str | None = None) -> dict[str, str]:
    """{module the file imports: its pip requirement}: REQUIRED, torch held to the run's major version, plus the
    compressor's and tokenizer's packages when ``config`` (the run's config tree) uses them."""
    out = dict(REQUIRED)
    if torch_version:
        major = int(torch_version.split(".")[0])
        out["torch"] = f"torch>={major},<{major + 1}"
    quant, data = (config or {}).get("quant") or {}, (config or {}).get("data") or {}
    codec = quant.get("pergroup_codec") if quant.get("compressor") == "pergroup" else quant.get("compressor")
    if quant.get("name") != "off" and codec in OPTIONAL:
        module, spec = OPTIONAL[codec]
        out[module] = spec
    tokenizer = str(data.get("tokenizer") or "")
    if tokenizer == "gpt2" or tokenizer.endswith(".tiktoken"):
        out[TIKTOKEN[0]] = TIKTOKEN[1]
    return out


CHECK = """from importlib.util import find_spec as S;R={R};m=[f"'{{p}}'"for k,p in R.items()if S(k)is None]
if m:raise SystemExit("error: this run needs packages this Python lacks: pip install "+" ".join(m))
"""
"""The file's first line of code: the packages it needs, looked up without importing them, so a bare machine gets
one pip line, not a traceback (brotli's decoder, a package, is among them when it packed the file)."""


def _file(payload: bytes, compressor: str, needs: dict[str, str]) -> bytes:
    """The file for ``payload`` compressed by ``compressor``: header, the packages' check (when ``needs``), import,
    P as a Latin-1 literal, exec."""
    blob = COMPRESSORS[compressor][0](payload)
    if needs and compressor in OPTIONAL:
        needs = {**needs, OPTIONAL[compressor][0]: OPTIONAL[compressor][1]}
    check = CHECK.format(R=json.dumps(needs, separators=(",", ":"))).encode("ascii") if needs else b""
    return (
        HEADER.encode("ascii")
        + check
        + f"import {compressor} as C\n".encode("ascii")
        + b'P="'
        + _latin1_literal(blob)
        + b'"\n'
        + COMPRESSORS[compressor][1].encode("ascii")
        + b"\n"
    )


_ESCAPES = {0: b"\\x00", 10: b"\\n", 13: b"\\r", 34: b'\\"', 92: b"\\\\"}
"""The bytes a one-line string literal cannot hold as they are (NUL: no source may hold it; CR, LF: line ends)."""


def _latin1_literal(blob: bytes) -> bytes:
    parts = re.split(rb'([\x00\n\r"\\])', blob)
    return b"".join(_ESCAPES[p[0]] if len(p) == 1 and p[0] in _ESCAPES else p for p in parts)


__all__ = [
    "CodeSource",
    "build_wrapper",
    "compressor_of",
    "frozen_settings",
    "linked_module",
    "pack",
    "requirements",
    "unwrap_payload",
]
