"""The report's curves (group mean ± std of train loss and periodic val_bpb, against tokens or seconds), its links to
each run's files, and the W&B dashboard layout (built offline, never saved)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from speedrun import report
from speedrun.records.store import ResultsDB
from speedrun.report.curves import aggregate, read_curves


def make_db(root: Path, groups=("sdpa", "flex"), seeds=3, steps=300) -> Path:
    db = ResultsDB(root / "results.sqlite")
    rng = np.random.default_rng(0)
    for gi, attn in enumerate(groups):
        for seed in range(seeds):
            run_dir = root / "runs" / f"{attn}-{seed}"
            run_dir.mkdir(parents=True)
            (run_dir / "run.log").write_text("log\n")
            lines = []
            for step in range(1, steps + 1):
                loss = 6.0 / (1 + step / 50) + 0.1 * gi + rng.normal(0, 0.05)
                lines.append({"step": step, "tokens": step * 1024, "train_loss": loss, "elapsed_s": step * 0.01})
                if step % 100 == 0:
                    lines.append(
                        {
                            "kind": "val",
                            "step": step,
                            "tokens": step * 1024,
                            "val_bpb": 3 - step / 200 + gi,
                            "elapsed_s": step * 0.01,
                        }
                    )
            (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
            db.upsert(
                str(run_dir),
                {
                    "status": "ok",
                    "name": "t",
                    "sweep": "s1",
                    "hardware": "h100",
                    "attn": attn,
                    "seed": seed,
                    "val_bpb": 1.3 + gi / 100 + seed / 1000,
                    "tokens_per_s": 1e6,
                    "run_dir": str(run_dir),
                    "started_at": 1000.0 + seed + 10 * gi,
                    "overrides": f"attn={attn} seed={seed}",
                    "config": {"attn": {"name": attn}},
                    "budget_end": "steps",
                },
            )
    return root / "results.sqlite"


def test_curves_read_train_and_val_records_and_average_over_the_common_range(tmp_path):
    make_db(tmp_path, groups=("sdpa",), seeds=1, steps=200)
    curves = read_curves(tmp_path / "runs" / "sdpa-0")
    assert len(curves["train"][0]) == 200 and curves["val"] == ([102400.0, 204800.0], [2.5, 2.0])
    assert read_curves(tmp_path / "runs" / "sdpa-0", x="seconds")["val"][0] == [1.0, 2.0]
    grid, mean, std = aggregate([([0, 10], [1, 3]), ([0, 5, 20], [3, 3, 3])], points=3)
    assert grid.tolist() == [0, 5, 10] and mean.tolist() == [2, 2.5, 3] and std[0] == pytest.approx(2**0.5)
    assert aggregate([([0, 1], [1, 1])], points=2)[2] is None  # one run: no band


def test_the_report_draws_curves_and_links_every_run_to_its_files(tmp_path):
    pytest.importorskip("matplotlib")
    db = make_db(tmp_path)
    out = tmp_path / "report"
    assert report.main(["--db", str(db), "--out", str(out)]) == 0
    assert (out / "loss_curves.png").stat().st_size > 10_000
    page = (out / "report.html").read_text()
    hrefs = re.findall(r'href="([^"#][^"]*)"', page)
    assert any(h.endswith("metrics.jsonl") for h in hrefs) and any(h.endswith("run.log") for h in hrefs)
    assert all((out / h).exists() for h in hrefs)  # relative links that resolve from the report's folder
    assert page.count('href="#runs-') == 2 and page.count('id="runs-') == 2


def test_many_groups_stay_readable(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from speedrun.report.curves import plot_curves
    from speedrun.report.groups import group_runs

    names = tuple(f"a{i}" for i in range(25))
    make_db(tmp_path, groups=names, seeds=1, steps=120)
    runs = report.load_runs(tmp_path / "results.sqlite")
    groups = group_runs(runs, ["attn"])
    colors = {g.label(): plt.get_cmap("tab20")(i % 20) for i, g in enumerate(groups)}
    fig = plot_curves(plt, groups, colors, max_groups=20)
    assert "5 more group(s) not shown" in fig._suptitle.get_text()
    assert len(fig.axes[0].lines) == 20 and len(fig.axes) == 2  # one line per group; val panel beside


def test_the_wandb_dashboard_layout(tmp_path, capsys):
    from speedrun.report.dashboard import dashboard_spec

    db = make_db(tmp_path)
    out = tmp_path / "dash"
    assert report.main(["--db", str(db), "--out", str(out), "--wandb-dashboard", "s1", "--dry-run"]) == 0
    spec = json.loads((out / "dashboard.json").read_text())
    assert spec == dashboard_spec(report.load_runs(db, ["s1"]), "s1", "speedrun")
    assert spec["filters"] == {"Group": "s1", "JobType": "train"} and spec["groupby"] == ["attn.name"]
    panels = {p["title"]: p for s in spec["sections"] for p in s["panels"]}
    assert [s["name"] for s in spec["sections"]] == ["Training", "Validation", "Sweep summary"]
    loss = panels["train loss (mean ± std over seeds)"]
    assert loss["x"] == "tokens" and loss["groupby"] == ["attn.name"] and loss["range"] == "stddev"
    assert "nothing was created" in capsys.readouterr().out

    ws_mod = pytest.importorskip("wandb_workspaces.workspaces", reason="pip install -e '.[dashboard]'")
    from speedrun.report.dashboard import build_workspace

    workspace = build_workspace({**spec, "entity": "me"})
    assert isinstance(workspace, ws_mod.Workspace) and [s.name for s in workspace.sections] == [
        "Training",
        "Validation",
        "Sweep summary",
    ]
    line = workspace.sections[0].panels[0]
    assert line.x == "tokens" and line.y == ["train_loss"] and line.groupby_rangefunc == "stddev"
    assert str(workspace.runset_settings.filters) == """Metric("Group") == 's1' and Metric("JobType") == 'train'"""
