"""notebooks/colab_t4.ipynb runs top to bottom on CPU: its parameters cell is followed by one that sets the CPU
values (as papermill injects parameters: RUN_ARGS = "debug=smoke", no install, a work folder in tmp), nbclient runs
every cell on an IPython kernel, and the outputs hold the plan, the run's result block, the report with its plots
and the exported submission, with no error anywhere."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook extra: pip install -e '.[notebook]'")
nbclient = pytest.importorskip("nbclient", reason="the notebook extra: pip install -e '.[notebook]'")

pytestmark = pytest.mark.slow

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "colab_t4.ipynb"
SRC = Path(__file__).resolve().parents[2] / "src"


def with_parameters(nb, values: dict[str, object]):
    """``nb`` with a cell setting ``values`` right after the cell tagged ``parameters``, as papermill injects them."""
    (index,) = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    source = "\n".join(f"{name} = {value!r}" for name, value in values.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(index + 1, cell)
    return nb


def texts(cell) -> str:
    """Everything a code cell printed or returned as text."""
    parts = []
    for out in cell.get("outputs", []):
        parts.append(out.get("text", "") if out.output_type == "stream" else out.get("data", {}).get("text/plain", ""))
    return "".join(parts)


def test_the_t4_notebook_runs_on_cpu_with_debug_smoke(tmp_path, data_cache, monkeypatch):
    # the kernel and the commands it starts import this checkout's speedrun
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(SRC), os.environ.get("PYTHONPATH")))))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    run_args = f"debug=smoke data.cache_dir={data_cache}"
    # no INSTALL, no REPO_URL: this checkout's speedrun is importable, so the install cell installs nothing
    values = {"INSTALL": "", "REPO_URL": "", "RUN_ARGS": run_args, "WORK_DIR": str(tmp_path / "work")}
    nb = with_parameters(nb, values)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": tmp_path}})
    client.execute()  # raises CellExecutionError, with the cell and its traceback, when a cell fails

    cells = {c.get("id"): c for c in nb.cells if c.cell_type == "code"}
    errors = [o for c in cells.values() for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    assert "precision" in texts(cells["plan"]) and "budget" in texts(cells["plan"])
    trained = texts(cells["train"])
    assert "\nstatus:" in trained and "status ok, val_bpb " in trained
    report = cells["report"]
    assert "leaderboard (val_bpb" in texts(report) and "report.html" in texts(report)
    assert any("image/png" in o.get("data", {}) for o in report.outputs), "the report's plots are shown inline"
    assert "wrote submission" in texts(cells["export"]) and "train_gpt.py" in texts(cells["export"])
    assert (tmp_path / "work" / "submission" / "train_gpt.py").is_file()
    assert (tmp_path / "work" / "outputs" / "results.sqlite").is_file()
