"""The re-run of an exported train_gpt.py (or its train_gpt_human.py) matches its run: status ok, the same val_bpb
to 1e-6, and the code bytes it counted equal to the run's and to train_gpt.py's size. Standard library only (it
runs in the venv that re-ran the file).

    python scripts/check_rerun_matches.py <run dir>/result.json <the re-run's output> <the train_gpt.py it counted>
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def main(result: str, output: str, code_file: str) -> int:
    first = json.loads(Path(result).read_text())
    # the exported file ends as `python -m run` does: one "key: value" line per result key
    again = dict(re.findall(r"^(\w+): (\S+)$", Path(output).read_text(), re.M))
    size = Path(code_file).stat().st_size
    print(
        f"check_rerun_matches: {Path(output).name}: status {again.get('status')}, val_bpb {again.get('val_bpb')} "
        f"(run {first['val_bpb']}), code bytes {again.get('artifact_code_bytes')} "
        f"(run {first['artifact_code_bytes']}, file {size})"
    )
    try:
        same = again["status"] == "ok" and abs(float(again["val_bpb"]) - first["val_bpb"]) <= 1e-6
        counted = int(again["artifact_code_bytes"]) == first["artifact_code_bytes"] == size
    except (KeyError, ValueError):
        same = counted = False
    if not (same and counted):
        print("check_rerun_matches: FAIL: the re-run differs from the run")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
