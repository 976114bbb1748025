"""``python -m speedrun.report --wandb-dashboard <sweep>``: a W&B workspace for one sweep group.

The layout is plain data first (``dashboard_spec``: sections, panels, axes, grouping), so it is tested and can be
inspected offline (``--dry-run`` prints it and writes dashboard.json); ``build_workspace`` turns it into
wandb-workspaces objects (``pip install -e '.[dashboard]'``), and ``save`` creates the workspace online.
``preflight`` checks, before any work, what creating it needs (the package, an entity, W&B credentials), so a
missing one is one line naming the fix rather than a traceback from inside wandb.

The workspace shows the sweep's training runs (its W&B group, job_type train), grouped by the keys the sweep
varies (seeds folded, so each line is a combination's mean with a std band): train loss and LR multiplier
against training tokens, the periodic validation curve, val_bpb against throughput, and the sweep-summary run's
leaderboard table and plots.
"""

from __future__ import annotations

import importlib.util
import json
import netrc
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from speedrun.report.groups import default_group_keys

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


def credentials_problem() -> str | None:
    """None when W&B will find credentials for its server, else one line naming the problem and the fix.

    Looks where wandb looks, without wandb's side effects: WANDB_API_KEY (or WANDB_IDENTITY_TOKEN_FILE), the
    .netrc file (NETRC, ~/.netrc or ~/_netrc) for the WANDB_BASE_URL host, then wandb's own lookup (its settings
    file) when wandb is importable.
    """
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return None
    base = os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai"
    parts = urlsplit(base)
    hosts = {h for h in (parts.netloc, parts.hostname) if h} or {"api.wandb.ai"}
    if _netrc_has(hosts) or _wandb_finds_credentials(base):
        return None
    host = parts.hostname or "api.wandb.ai"
    return (
        f"no W&B credentials for {host}: set WANDB_API_KEY or run `wandb login`, then run this again "
        "(--dry-run writes the layout without them)"
    )


def _netrc_has(hosts: set[str]) -> bool:
    named = os.environ.get("NETRC")
    paths = [Path(named).expanduser()] if named else [Path("~/.netrc").expanduser(), Path("~/_netrc").expanduser()]
    for path in paths:
        try:
            entries = netrc.netrc(str(path))
        except (OSError, netrc.NetrcParseError):
            continue
        if any(entries.authenticators(h) for h in hosts):
            return True
    return False


def _wandb_finds_credentials(base: str) -> bool:
    """wandb's own credential lookup (env, .netrc, its settings file), without prompting; False if unavailable."""
    try:
        from wandb.sdk.lib.wbauth import authenticate
        from wandb.sdk.lib.wbauth.host_url import HostUrl

        found = authenticate._use_system_auth(host=HostUrl(base), source="speedrun.report", update_session=False)
    except Exception:  # noqa: BLE001 - a private API that may change: then the checks above decide
        return False
    return found is not None


def preflight(entity: str | None) -> str | None:
    """What creating a workspace online needs, checked before any work: None, or the first problem in one line."""
    if importlib.util.find_spec("wandb_workspaces") is None or importlib.util.find_spec("wandb") is None:
        return "wandb-workspaces is not installed: pip install -e '.[dashboard]' (or add --dry-run)"
    if not entity:
        return "--wandb-entity is needed to create a workspace online (or add --dry-run)"
    return credentials_problem()


def run_dashboard(runs: Sequence[Any], sweep: str, project: str, entity: str | None, dry_run: bool, out: Any) -> int:
    """The CLI's --wandb-dashboard: write dashboard.json; unless --dry-run, create the workspace online.

    The CLI has already run ``preflight``; problems found only now (W&B refusing the key, no network) are one line
    on stderr too, never a traceback."""
    spec = dashboard_spec(runs, sweep, project, entity)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dashboard.json").write_text(json.dumps(spec, indent=2) + "\n")
    print(json.dumps(spec, indent=2))
    if dry_run:
        print(f"dry run: the layout above is in {out / 'dashboard.json'}; nothing was created")
        return 0
    problem = preflight(spec["entity"])
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    import wandb

    try:
        workspace = build_workspace(spec)
        workspace.save()
    except wandb.errors.Error as e:
        message = " ".join(str(e).split())
        print(
            f"error: W&B refused the workspace ({type(e).__name__}: {message}); the layout is in "
            f"{out / 'dashboard.json'}",
            file=sys.stderr,
        )
        return 2
    print(f"W&B workspace: {getattr(workspace, 'url', '(saved)')}")
    return 0
