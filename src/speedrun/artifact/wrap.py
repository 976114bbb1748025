"""The self-extracting train_gpt.py: the run's code and resolved config in one file, as parameter-golf's records ship
their code, so that artifact_code_bytes (the wrapped rule) is the length of a file that exists and runs.

The file is a comment and three lines of Python:

    import lzma as L,base64 as B
    P="<payload>"
    exec(L.decompress(B.b85decode(P),format=L.FORMAT_RAW,filters=[{"id":L.FILTER_LZMA2}]))

(the payload on a line of its own, so that a traceback through the exec shows the short line, not 100 KB).

The payload, decompressed, is a Python program: ``F`` = {path in the repository: text} (packed_files: the Python
minified, the few conf/ files the resolver reads as they are), ``M`` = the meta as JSON text (the resolved config,
the torch and speedrun versions), ``R`` = {module: pip requirement} of what the re-run imports beyond the standard
library (requirements), then BOOT, which exits with one `pip install ...` line naming every requirement whose
module is missing, writes F into a private temporary directory laid out as the repository (removed at exit), puts
its src/ first on sys.path and calls ``speedrun.rerun.main(M, __file__)``. Only the standard library runs before
that. ``read_wrapper`` takes a file apart again without running it (the
export and the tests use it).
"""

from __future__ import annotations

import ast
import base64
import json
import lzma
import re
from dataclasses import dataclass, field
from typing import Any

from speedrun.artifact.code_count import CODE_FILES, CONF_READ, WRAPPED_ALSO
from speedrun.artifact.minify import minify_files
from speedrun.paths import CONF_DIR, source_path
from speedrun.version import __version__

FORMAT = 1
"""Bumped when the payload's layout changes; speedrun.rerun refuses a format it does not know."""

HEADER = "# speedrun self-extracting run: `python train_gpt.py` (or torchrun) re-runs it; docs/export.md\n"
OUTER = (
    "import lzma as L,base64 as B\n"
    'P="{payload}"\n'
    'exec(L.decompress(B.b85decode(P),format=L.FORMAT_RAW,filters=[{{"id":L.FILTER_LZMA2}}]))\n'
)
# LZMA2 at its strongest preset; the decoder's default dictionary (8 MiB) covers any distance in a payload of a few
# hundred KB, so the outer line need not spell the encoder's settings out.
FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]

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


def packed_files() -> tuple[str, ...]:
    """What the file carries, as paths in the repository: src/ + CODE_FILES (as listed there, whatever gets added)
    and WRAPPED_ALSO (the entry point and what it needs beyond them), then the conf/ files the resolver reads
    (CONF_READ)."""
    conf = sorted(
        {f"conf/{p.relative_to(CONF_DIR).as_posix()}" for pattern in CONF_READ for p in CONF_DIR.glob(pattern)}
    )
    return (*(f"src/{rel}" for rel in (*CODE_FILES, *WRAPPED_ALSO)), *conf)


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
    def snapshot(cls, config: dict[str, Any] | None = None) -> CodeSource:
        import platform

        import torch

        files = {rel: source_path(rel).read_text(encoding="utf-8") for rel in packed_files()}
        versions = {"torch": torch.__version__, "python": platform.python_version(), "speedrun": __version__}
        return cls(files, config, versions)


REQUIRED = {"torch": "torch", "numpy": "numpy>=1.24", "sentencepiece": "sentencepiece>=0.2"}
"""What every re-run imports beyond the standard library (pyproject.toml's dependencies, less python-minifier: a
re-run counts the file that ran and minifies nothing), besides omegaconf and hydra-core (RUNTIME)."""
RUNTIME = {"omegaconf": "omegaconf>=2.3", "hydra": "hydra-core>=1.3.2"}
"""What the re-run imports that parameter-golf's image lacks (the export's requirements.txt lists these too)."""
OPTIONAL = {"brotli": ("brotli", "brotli>=1.1"), "zstd": ("zstandard", "zstandard>=0.22")}
"""quant.compressor (or quant.pergroup_codec) -> (module, pip requirement): the compress extra's packages."""
TIKTOKEN = ("tiktoken", "tiktoken>=0.7")
"""data.tokenizer=gpt2 or a .tiktoken file: the gpt2 extra's package."""


def requirements(config: dict[str, Any] | None, torch_version: str | None = None) -> dict[str, str]:
    """{module the re-run imports: its pip requirement}: REQUIRED and RUNTIME, torch held to the run's major
    version, plus the compressor's and tokenizer's packages when ``config`` uses them."""
    out = {**REQUIRED, **RUNTIME}
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


def build_wrapper(code: CodeSource) -> tuple[bytes, dict[str, str]]:
    """The self-extracting file's bytes, and the minified sources it carries ({path: minified source})."""
    minified = minify_files(code.files)
    meta = {"format": FORMAT, "config": code.config, "versions": code.versions}
    needs = requirements(code.config, code.versions.get("torch"))
    payload = (
        f"F={minified!r}\nM={json.dumps(meta, sort_keys=True, separators=(',', ':'))!r}\n"
        f"R={json.dumps(needs, separators=(',', ':'))}\n{BOOT}"
    )
    blob = lzma.compress(payload.encode("utf-8"), format=lzma.FORMAT_RAW, filters=FILTERS)
    text = HEADER + OUTER.format(payload=base64.b85encode(blob).decode("ascii"))
    data = text.encode("ascii")
    if unwrap_payload(data) != payload:  # the outer line decodes with the decoder's defaults: prove it, once per file
        raise RuntimeError("the self-extracting file does not decode to its payload (speedrun.artifact.wrap)")
    return data, minified


def unwrap_payload(data: bytes) -> str:
    """The payload program of a self-extracting file, decoded as the file decodes it (nothing is run)."""
    match = re.search(rb'^P="([^"]*)"$', data, re.M)
    if match is None:
        raise ValueError('not a speedrun self-extracting file: no P="<payload>" line in it')
    blob = base64.b85decode(match.group(1))
    return lzma.decompress(blob, format=lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2}]).decode("utf-8")


def read_wrapper(data: bytes) -> tuple[dict[str, str], dict[str, Any]]:
    """({path: minified source}, meta) of a self-extracting file, read without running it."""
    values: dict[str, Any] = {}
    for node in ast.parse(unwrap_payload(data)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("F", "M"):
                values[node.targets[0].id] = ast.literal_eval(node.value)
    if set(values) != {"F", "M"}:
        raise ValueError("not a speedrun self-extracting file: its payload lacks F (files) or M (meta)")
    return values["F"], json.loads(values["M"])
