"""The self-extracting train_gpt.py: the run's code and resolved config in one file, as parameter-golf's records ship
their code, so that artifact_code_bytes (the wrapped rule) is the length of a file that exists and runs.

The file is a comment and three lines of Python, e.g. for lzma:

    import lzma as C
    P="<payload>"
    exec(C.decompress(P.encode("l1"),C.FORMAT_RAW,None,[{"id":C.FILTER_LZMA2}]))

The compressed payload is written as a Latin-1 string literal (the comment declares the file's coding): each byte
is one character, and only NUL, CR, LF, backslash and the quote are escaped, so the file is about 2% larger than
the compressed bytes where base85 would add 25%. The compressor is whichever of lzma, brotli (when installed) and
zlib gives the smaller file (COMPRESSORS); ``compressor_of`` reads it back, and artifact_code.json records it. The
payload sits on its own line, so a traceback through the exec shows a short line.

The payload, decompressed, is a Python program: ``F`` = {path in the repository: text} (the modules the run's
re-run imports, speedrun.artifact.closure, minified; conf/ files only where the Plan reads them), ``M`` = the meta
as JSON text (the resolved config with the Plan's choices pinned, the torch and speedrun versions), ``R`` =
{module: pip requirement} of what the re-run imports beyond the standard library (requirements), then BOOT, which
exits with one `pip install ...` line naming every requirement whose module is missing, writes F into a private
temporary directory laid out as the repository (removed at exit), puts its src/ first on sys.path and calls
``speedrun.rerun.main(M, __file__)``. Only the standard library runs before that (and brotli, when it is the
compressor). ``read_wrapper`` takes a file apart again without running it (the export and the tests use it).
"""

from __future__ import annotations

import ast
import importlib
import json
import lzma
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.util import find_spec
from typing import Any

from speedrun.artifact.closure import PlanView, reached
from speedrun.artifact.unwrap import compressor_of, read_wrapper, unwrap_payload
from speedrun.paths import CONF_DIR, source_path
from speedrun.version import __version__

FORMAT = 1
"""Bumped when the payload's layout changes; speedrun.rerun refuses a format it does not know."""

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


# Runs before anything of speedrun's is importable: written small by hand, since every byte is counted. First the
# packages (R), looked up without importing them, so a bare machine gets one pip line, not a traceback. A private
# directory per process (mkdtemp is 0700), so torchrun's ranks never share or race on one.
BOOT = """import atexit,os,shutil,sys,tempfile
from importlib.util import find_spec
m=[f"'{p}'"for k,p in R.items()if find_spec(k)is None]
if m:sys.exit("error: this run needs packages this Python lacks: pip install "+" ".join(m))
d=tempfile.mkdtemp(prefix="speedrun-");atexit.register(shutil.rmtree,d,True);s=os.path.join(d,"src")
for p,t in F.items():
 q=os.path.join(d,p);os.makedirs(os.path.dirname(q),exist_ok=True)
 with open(q,"w",encoding="utf-8")as f:f.write(t)
sys.path.insert(0,s);os.environ["PYTHONPATH"]=os.pathsep.join(filter(None,(s,os.environ.get("PYTHONPATH"))))
from speedrun.rerun import main
main(M,__file__)
"""

CHECK = """from importlib.util import find_spec as S;R={R};m=[f"'{{p}}'"for k,p in R.items()if S(k)is None]
if m:raise SystemExit("error: this run needs packages this Python lacks: pip install "+" ".join(m))
"""
"""BOOT's check of the packages, before the import of a decoder that is a package (brotli): a bare machine still gets
one pip line."""

TUNED_TABLES = "kernel/tuned/*.yaml"
"""The conf/ files a re-run reads, under kernel=tuned only (speedrun.kernels.tuned)."""


def packed_files(plan: PlanView | None = None) -> tuple[str, ...]:
    """What the file carries, as paths in the repository: src/ + every module a re-run of ``plan`` imports
    (speedrun.artifact.closure; every choice's when None), then kernel=tuned's tables when the Plan reads them."""
    tuned = plan is None or str(plan.kernel.source).startswith("tuned")
    conf = sorted(f"conf/{p.relative_to(CONF_DIR).as_posix()}" for p in CONF_DIR.glob(TUNED_TABLES)) if tuned else []
    return (*(f"src/{rel}" for rel in reached(plan)), *conf)


def pin_choices(config: dict[str, Any], plan: PlanView) -> dict[str, Any]:
    """The config with the Plan's `auto` choices written in: the attention backend, and the model preset with the
    run's explicit fields on top (as speedrun.plan.model_choice merges them), so a re-run builds what ran without
    reading conf/ (and without OmegaConf, which reads it)."""
    from speedrun.plan import load_option  # at pin time only: a re-run's config names its preset

    tree = json.loads(json.dumps(config))
    if tree.get("attn", {}).get("name") == "auto":
        tree["attn"]["name"] = plan.attn
    model = tree.get("model", {})
    if model.get("name") == "auto":
        explicit = {k: v for k, v in model.items() if v is not None and k != "name"}
        tree["model"] = {**load_option("model", plan.model_name), **explicit, "name": plan.model_name}
    return tree


@dataclass(frozen=True)
class CodeSource:
    """The source a run's file is made from, read when the job starts (the code that ran, not what is on disk when
    it ends), with the run's resolved config."""

    files: dict[str, str]
    config: dict[str, Any] | None = None
    """The resolved config tree the file re-runs; None: a file that refuses to run (tests that only count)."""
    versions: dict[str, str] = field(default_factory=dict)
    """torch, python, speedrun: what the run had (speedrun.rerun checks torch's major version)."""

    @classmethod
    def snapshot(cls, config: dict[str, Any] | None = None, plan: PlanView | None = None) -> CodeSource:
        """The modules a re-run of ``plan`` imports (every choice's when None), read now, and ``config`` with the
        Plan's choices pinned."""
        import platform

        import torch

        files = {rel: source_path(rel).read_text(encoding="utf-8") for rel in packed_files(plan)}
        versions = {"torch": torch.__version__, "python": platform.python_version(), "speedrun": __version__}
        if config is not None and plan is not None:
            config = pin_choices(config, plan)
        return cls(files, config, versions)

    def with_threads(self, threads: int) -> CodeSource:
        """This source with a CPU run's thread count pinned in its config: a sum over another number of threads
        rounds differently, so a re-run on a machine of other load would miss the run's val_bpb."""
        if self.config is None or (self.config.get("hardware") or {}).get("threads") is not None:
            return self
        hardware = {**(self.config.get("hardware") or {}), "threads": threads}
        return CodeSource(self.files, {**self.config, "hardware": hardware}, self.versions)


REQUIRED = {"torch": "torch", "numpy": "numpy>=1.24", "sentencepiece": "sentencepiece>=0.2"}
"""What every re-run imports beyond the standard library (pyproject.toml's dependencies, less python-minifier: a
re-run counts the file that ran and minifies nothing). No omegaconf, no Hydra: the re-run builds its config from
the plain tree (speedrun.config.tree)."""
TUNED = {"omegaconf": "omegaconf>=2.3"}
"""kernel=tuned's re-run reads its tables with OmegaConf (speedrun.kernels.tuned)."""
OPTIONAL = {"brotli": ("brotli", "brotli>=1.1"), "zstd": ("zstandard", "zstandard>=0.22")}
"""quant.compressor (or quant.pergroup_codec) -> (module, pip requirement): the compress extra's packages."""
TIKTOKEN = ("tiktoken", "tiktoken>=0.7")
"""data.tokenizer=gpt2 or a .tiktoken file: the gpt2 extra's package."""


def requirements(config: dict[str, Any] | None, torch_version: str | None = None) -> dict[str, str]:
    """{module the re-run imports: its pip requirement}: REQUIRED, torch held to the run's major version, plus the
    compressor's and tokenizer's packages when ``config`` uses them, and OmegaConf under kernel=tuned."""
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
    if ((config or {}).get("kernel") or {}).get("name") == "tuned":
        out.update(TUNED)
    return out


def linked_files(code: CodeSource) -> dict[str, str]:
    """The files the file carries: ``code``'s, with its speedrun/core/ modules linked down to what the rest of the
    packed modules import from them (speedrun.artifact.link.link_shell), comments kept."""
    from speedrun.artifact.link import link_shell  # when a file is made, never when one re-runs

    return link_shell(code.files)


def _meta_lines(code: CodeSource) -> tuple[str, dict[str, str]]:
    meta = {"format": FORMAT, "config": code.config, "versions": code.versions}
    needs = requirements(code.config, code.versions.get("torch"))
    return (
        f"M={json.dumps(meta, sort_keys=True, separators=(',', ':'))!r}\nR={json.dumps(needs, separators=(',', ':'))}\n",
        needs,
    )


def build_wrapper(code: CodeSource, compressor: str | None = None, link: bool = True) -> tuple[bytes, dict[str, str]]:
    """The self-extracting file's bytes, and the minified sources it carries ({path: minified source}).
    ``compressor``: one of COMPRESSORS; None: whichever available gives the smaller file. ``link``: link the core
    first (linked_files); False for files linked already."""
    from speedrun.artifact.minify import minify_files  # when a file is made, never when one re-runs

    minified = minify_files(linked_files(code) if link else code.files)
    meta, needs = _meta_lines(code)
    payload = f"F={minified!r}\n{meta}{BOOT}".encode()
    names = [compressor] if compressor else available_compressors()
    data = min((_file(payload, name, needs) for name in names), key=len)
    if unwrap_payload(data) != payload.decode("utf-8"):  # the outer lines decode with defaults: prove it, per file
        raise RuntimeError("the self-extracting file does not decode to its payload (speedrun.artifact.wrap)")
    return data, minified


HUMAN_HEADER = """# {name}: the code of train_gpt.py to read: the same modules, before they were minified and
# compressed, comments kept, each under its path. It runs as train_gpt.py does (python {name}, or torchrun) and
# re-runs the same run, counting the train_gpt.py beside it: that is the file whose bytes are counted.
"""


def readable_file(code: CodeSource, name: str = "train_gpt_human.py") -> str:
    """The readable companion of the file ``build_wrapper(code)`` makes: its payload uncompressed, each module's
    linked source as written (a raw string where it can be one) under a ``# ---- <path> ----`` line."""
    # the re-run counts the file whose bytes are the run's code: train_gpt.py beside this one
    counted = (
        'c=os.path.join(os.path.dirname(os.path.abspath(__file__)),"train_gpt.py")\n'
        'if not os.path.isfile(c):sys.exit(f"error: {c} is missing: this file re-runs as the train_gpt.py beside it, '
        'whose bytes are the code counted")\nmain(M,c)\n'
    )
    boot = BOOT.replace("main(M,__file__)\n", counted)
    parts = [HUMAN_HEADER.format(name=name), "F = {}\n"]
    for path, text in linked_files(code).items():
        literal = f"r'''{text}'''"
        try:
            raw = ast.literal_eval(literal) == text
        except SyntaxError:
            raw = False
        literal = literal if raw else repr(text)
        parts.append(f"# ---- {path} ----\nF[{path!r}] = {literal}\n")
    meta, _ = _meta_lines(code)
    parts.append(f"# ---- the run's resolved config (M) and the packages it needs (R) ----\n{meta}\n{boot}")
    return "\n".join(parts)


def _file(payload: bytes, compressor: str, needs: dict[str, str]) -> bytes:
    """The file for ``payload`` compressed by ``compressor``: header, import, P as a Latin-1 literal, exec; a
    decoder that is not the standard library's (brotli) is preceded by BOOT's check of the packages."""
    blob = COMPRESSORS[compressor][0](payload)
    check = b""
    if compressor not in ("lzma", "zlib"):
        needs = {**needs, compressor: OPTIONAL[compressor][1]}
        check = CHECK.format(R=json.dumps(needs, separators=(",", ":"))).encode("ascii")
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
    "linked_files",
    "readable_file",
    "packed_files",
    "read_wrapper",
    "requirements",
    "unwrap_payload",
]
