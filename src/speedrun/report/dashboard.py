"""``python -m speedrun.report --wandb-dashboard <sweep>``: a W&B workspace for one sweep group.

The layout is plain data first (``dashboard_spec``: sections, panels, axes, grouping), so it is tested and can be
inspected offline (``--dry-run`` prints it and writes dashboard.json); ``build_workspace`` turns it into
wandb-workspaces objects (``pip install -e '.[dashboard]'``), and ``save`` creates the workspace online.

The workspace shows the sweep's training runs (its W&B group, job_type train), grouped by the keys the sweep
varies (seeds folded, so each line is a combination's mean with a std band): train loss and LR multiplier
against training tokens, the periodic validation curve, val_bpb against throughput, and the sweep-summary run's
leaderboard table and plots.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .groups import default_group_keys

GROUP_OPTIONS = (
    "hardware",
    "attn",
    "precision",
    "model",
    "data",
    "optim",
    "schedule",
    "eval",
    "ttt",
    "quant",
    "logger",
)
"""Config groups: an override ``attn=flex`` is the config value ``attn.name`` in W&B."""


def config_key(override_key: str) -> str:
    """An override key as a W&B config key (nested config keys are dotted there too)."""
    return f"{override_key}.name" if override_key in GROUP_OPTIONS else override_key


def dashboard_spec(runs: Sequence[Any], sweep: str, project: str, entity: str | None = None) -> dict[str, Any]:
    keys = [k for k in default_group_keys(list(runs), by_value=False) if k not in ("device_name",)]
    groupby = [config_key(k) if k != "hardware" else "settings.hardware" for k in keys]

    def line(title: str, y: list[str], smoothing: float = 0.0) -> dict[str, Any]:
        return {
            "type": "line",
            "title": title,
            "x": "tokens",
            "y": y,
            "groupby": groupby,
            "agg": "mean",
            "range": "stddev",
            "smoothing": smoothing,
        }

    return {
        "entity": entity,
        "project": project,
        "name": f"speedrun sweep {sweep}",
        "filters": {"Group": sweep, "JobType": "train"},
        "groupby": groupby,
        "sections": [
            {
                "name": "Training",
                "panels": [
                    line("train loss (mean ± std over seeds)", ["train_loss"], 0.6),
                    line("LR multiplier", ["lr_mult"]),
                ],
            },
            {
                "name": "Validation",
                "panels": [
                    line("val_bpb, periodic (eval.periodic_tokens)", ["val_bpb"]),
                    {"type": "scatter", "title": "final val_bpb vs tokens/s", "x": "tokens_per_s", "y": "val_bpb"},
                ],
            },
            {
                "name": "Sweep summary",
                "panels": [
                    {
                        "type": "media",
                        "title": "report plots",
                        "keys": ["plots/pareto", "plots/loss_curves", "plots/quant_vs_size"],
                    }
                ],
            },
        ],
    }


def build_workspace(spec: dict[str, Any]) -> Any:
    """The spec as a wandb_workspaces Workspace (not saved)."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    def panel(p: dict[str, Any]) -> Any:
        if p["type"] == "line":
            return wr.LinePlot(
                title=p["title"],
                x=p["x"],
                y=list(p["y"]),
                groupby=p["groupby"][0] if p["groupby"] else None,
                groupby_aggfunc=p["agg"],
                groupby_rangefunc=p["range"],
                smoothing_factor=p["smoothing"] or None,
            )
        if p["type"] == "scatter":
            return wr.ScatterPlot(title=p["title"], x=wr.SummaryMetric(p["x"]), y=wr.SummaryMetric(p["y"]))
        if p["type"] == "media":
            return wr.MediaBrowser(title=p["title"], media_keys=list(p["keys"]))
        raise ValueError(f"unknown panel type {p['type']!r}")

    filters = ws.And(*[ws.Metric(k) == v for k, v in spec["filters"].items()])
    runset = ws.RunsetSettings(filters=filters, groupby=[ws.Config(k) for k in spec["groupby"]])
    return ws.Workspace(
        entity=spec["entity"] or "",
        project=spec["project"],
        name=spec["name"],
        sections=[
            ws.Section(name=s["name"], panels=[panel(p) for p in s["panels"]], is_open=True) for s in spec["sections"]
        ],
        runset_settings=runset,
    )


def run_dashboard(runs: Sequence[Any], sweep: str, project: str, entity: str | None, dry_run: bool, out: Any) -> int:
    """The CLI's --wandb-dashboard: write dashboard.json; unless --dry-run, create the workspace online."""
    spec = dashboard_spec(runs, sweep, project, entity)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dashboard.json").write_text(json.dumps(spec, indent=2) + "\n")
    print(json.dumps(spec, indent=2))
    if dry_run:
        print(f"dry run: the layout above is in {out / 'dashboard.json'}; nothing was created")
        return 0
    try:
        workspace = build_workspace(spec)
    except ImportError:
        print(
            "wandb-workspaces is not installed: pip install -e '.[dashboard]' (the layout is in "
            f"{out / 'dashboard.json'})"
        )
        return 2
    if not spec["entity"]:
        print("--wandb-entity is needed to create a workspace online")
        return 2
    workspace.save()
    print(f"W&B workspace: {getattr(workspace, 'url', '(saved)')}")
    return 0
