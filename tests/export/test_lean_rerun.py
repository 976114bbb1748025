"""Each compressor's self-extracting file decodes its payload and runs it, whatever bytes the compressed payload
holds (the exported file's re-run where speedrun is not installed: tests/e2e/test_export_rerun.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from speedrun.artifact.unwrap import compressor_of, unwrap_payload
from speedrun.artifact.wrap import available_compressors, pack
from support.export import bare_env


def test_each_compressors_file_decodes_any_payload_bytes(tmp_path):
    """A file per compressor, its payload holding bytes a one-line literal must escape (random text compresses to
    every byte value): each decodes to its payload and runs it."""
    noise = "".join(chr(b) for b in os.urandom(20_000))  # incompressible: NUL, CR, LF, quote, backslash all occur
    payload = f"N = {noise!r}\nprint('ran', len(N), __name__, __file__.endswith('train_gpt.py'))\n"
    sizes = {}
    for name in available_compressors():
        data = pack(payload, name)
        assert compressor_of(data) == name and unwrap_payload(data) == payload
        (tmp_path / "train_gpt.py").write_bytes(data)
        proc = subprocess.run(
            [sys.executable, "train_gpt.py"], cwd=tmp_path, env=bare_env(), capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0 and proc.stdout == "ran 20000 __main__ True\n", (name, proc.stderr)
        sizes[name] = len(data)
    # with no compressor named, the file is the smallest of them
    assert len(pack(payload)) == min(sizes.values())
