"""One run as the report and the sweep summary see it: its result row, config, Plan and overrides, and how a key
is looked up in them; plus the override helpers both use to find what a set of runs varies.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from speedrun.tables import display

OK = "ok"
NOT_RUN = "not_run"
"""A sweep job that never started (fail-fast, interrupted): neither a result nor a failure."""

FOLDED_KEYS = ("seed",)
"""Override keys folded into one group (their runs are repeats of one combination)."""


def is_failure(status: Any) -> bool:
    """The one definition of a failure, for the report and the sweep summary: a run that started and did not end
    ok. ``diverged`` counts (its metrics are not a result to average), although a sweep's exit status forgives it."""
    return status not in (OK, NOT_RUN)


# ---------------------------------------------------------------------------------------------------------
# overrides


def override_key(override: str) -> str:
    """``+model.x=1`` -> ``model.x``; ``hydra/launcher=pool`` -> ``hydra/launcher``."""
    key = override.split("=", 1)[0]
    return key.lstrip("+~")


def override_dict(overrides: Iterable[str]) -> dict[str, str]:
    """Overrides as {key: value as typed}; deletions (``~key``) map to ``~``."""
    out = {}
    for o in overrides:
        key = override_key(o)
        out[key] = "~" if o.startswith("~") else o.split("=", 1)[1] if "=" in o else ""
    return out


def split_overrides(text: str | None) -> list[str]:
    """The ``overrides`` column of results.sqlite (space-joined) back to a list."""
    return [o for o in (text or "").split(" ") if o]


def varying_keys(override_sets: Sequence[dict[str, str]], folded: Sequence[str] = FOLDED_KEYS) -> list[str]:
    """Keys whose value differs across the sets (a key missing from some sets differs), in first-seen order."""
    keys: dict[str, None] = {}
    for d in override_sets:
        keys.update(dict.fromkeys(d))
    return [k for k in keys if k not in folded and len({d.get(k) for d in override_sets}) > 1]


# ---------------------------------------------------------------------------------------------------------
# runs


@dataclass
class Run:
    row: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    plan: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: dict[str, Any], overrides: Sequence[str] | None = None) -> Run:
        """A results row (database or result.json); ``overrides`` (a sweep job's own) replace the row's."""
        listed = split_overrides(row.get("overrides")) if overrides is None else overrides
        return cls(
            row=row, config=_json(row.get("config")), plan=_json(row.get("plan")), overrides=override_dict(listed)
        )

    def get(self, key: str) -> Any:
        """A key's value for this run: results column, else config (dotted), else Plan, else override text."""
        value = self.row.get(key)
        if value is not None and key not in ("config", "plan", "overrides"):
            return value
        if key == "model.name" and self.plan.get("model_name"):
            return self.plan["model_name"]
        # model=auto is resolved per device: the Plan holds the model that actually ran.
        for tree in (self.plan, self.config) if key.startswith("model.") else (self.config, self.plan):
            found, value = dotted(tree, key)
            if found:
                return value.get("name", json.dumps(value, sort_keys=True)) if isinstance(value, dict) else value
        return self.overrides.get(key)

    def asked(self, key: str) -> str:
        """The value this run's overrides asked for, as typed, else what ``get`` finds: a sweep's combinations
        are what was asked, also for jobs that never ran and so have no record."""
        return self.overrides[key] if key in self.overrides else display(self.get(key))

    def metric(self, key: str) -> Any:
        """A metric of the row; ``ttt_gain`` is derived: val_bpb_ttt_base - val_bpb_ttt (what TTT bought), and
        ``overhead_s``: wall_seconds - train_seconds (start-up, compilation, evaluation: what a job costs beyond
        its training budget)."""
        if key == "overhead_s":
            wall, train = self.row.get("wall_seconds"), self.row.get("train_seconds")
            return wall - train if _number(wall) and _number(train) else None
        if key == "ttt_gain":
            base, ttt = self.row.get("val_bpb_ttt_base"), self.row.get("val_bpb_ttt")
            if _number(base) and _number(ttt):
                return base - ttt
            return None
        return self.row.get(key)

    @property
    def status(self) -> str:
        return str(self.row.get("status"))


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _json(text: Any) -> dict[str, Any]:
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def dotted(tree: dict[str, Any], key: str) -> tuple[bool, Any]:
    """(found, value) of a dotted key (``optim.matrix_lr``) in a nested dict."""
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def canon(value: Any) -> str:
    """A value as a comparable string: 2 == 2.0 == "2", True == "true", None == "null"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"{float(value):.12g}"
    text = str(value).strip()
    if text.lower() in ("none", "null", "~"):
        return "null"
    if text.lower() in ("true", "false"):
        return text.lower()
    try:
        number = float(text)
    except ValueError:
        return text
    # an id that happens to parse (a hex fingerprint of digits, or with an "e" that overflows) stays itself
    if not math.isfinite(number) or sum(c.isdigit() for c in text.split("e")[0].split("E")[0]) > 15:
        return text
    return f"{number:.12g}"
