"""The re-run of an exported train_gpt.py matches its run: status ok, the same val_bpb to 1e-6, and the code bytes
both counted equal to the file's size. Standard library only (it runs in the venv that re-ran the file).

    python scripts/check_rerun_matches.py <run dir>/result.json <folder the file was re-run in>
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(result: str, rerun_folder: str) -> int:
    first = json.loads(Path(result).read_text())
    found = sorted(Path(rerun_folder).glob("runs/*/result.json"))
    if len(found) != 1:
        print(f"check_rerun_matches: FAIL: expected one runs/*/result.json in {rerun_folder}, found {len(found)}")
        return 1
    again = json.loads(found[0].read_text())
    size = (Path(rerun_folder) / "train_gpt.py").stat().st_size
    print(
        f"check_rerun_matches: re-run status {again['status']}, val_bpb {again['val_bpb']} (run {first['val_bpb']}), "
        f"code bytes {again['artifact_code_bytes']} (run {first['artifact_code_bytes']}, file {size})"
    )
    same = again["status"] == "ok" and abs(again["val_bpb"] - first["val_bpb"]) <= 1e-6
    if not (same and again["artifact_code_bytes"] == first["artifact_code_bytes"] == size):
        print("check_rerun_matches: FAIL: the re-run differs from the run")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
