"""What a run returns to Hydra's sweeper: its objective, a float that carries the whole result record.

Hydra's adaptive sweepers (Optuna, Ax, Nevergrad) read the number a job returns; the speedrun sweeper reads the
job's status from its record. An ``Objective`` is both: ``float(o)`` is the result's ``objective`` key (val_bpb by
default) and ``o.record`` the result. A run that did not end ok (failed, refused, diverged, out of memory), or that
recorded no number for the key, scores the worst value, inf (-inf where the sweeper maximises): a sweeper then
ranks it last and moves away from it, and goes on. NaN is not used: Optuna marks a NaN trial failed, and its Hydra
sweeper stops the whole sweep at the first failed trial (``max_failure_rate`` 0).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from speedrun.config.objective import DEFAULT_OBJECTIVE

log = logging.getLogger("speedrun")


class Objective(float):
    """A run's objective as a float (what a sweeper optimises), with the run's result record in ``record``."""

    record: dict[str, Any]
    key: str

    def __new__(cls, value: float, record: Mapping[str, Any] | None = None, key: str = DEFAULT_OBJECTIVE) -> Objective:
        self = super().__new__(cls, value)
        self.record, self.key = dict(record or {}), key
        return self

    def __repr__(self) -> str:
        return f"Objective({self.key}={float(self)!r}, status={self.record.get('status')!r})"


def worst(maximise: bool) -> float:
    return -math.inf if maximise else math.inf


def objective_of(record: Mapping[str, Any] | None, key: str = DEFAULT_OBJECTIVE, maximise: bool = False) -> Objective:
    """``record[key]`` as the objective of a run that ended ok; the worst value for any other run."""
    record = record or {}
    status = record.get("status")
    value = record.get(key)
    if status != "ok":
        return Objective(worst(maximise), record, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        log.warning(
            "objective=%s: the run recorded %r for it, not a number; the sweeper scores it as the worst, %s",
            key,
            value,
            worst(maximise),
        )
        return Objective(worst(maximise), record, key)
    return Objective(float(value), record, key)


def maximising(sweeper: Any) -> bool:
    """Whether the sweep's sweeper (the ``hydra.sweeper`` node) maximises what jobs return: Optuna's ``direction``,
    Nevergrad's ``optim.maximize``, Ax's ``ax_config.experiment.minimize``. Others (the speedrun and basic
    sweepers) use no objective: False."""
    if sweeper is None:
        return False
    direction = _get(sweeper, "direction")
    if direction is not None:
        first = direction[0] if isinstance(direction, (list, tuple)) or _is_list_node(direction) else direction
        return "max" in str(getattr(first, "name", first)).lower()
    nevergrad = _get(_get(sweeper, "optim"), "maximize")
    if nevergrad is not None:
        return bool(nevergrad)
    minimize = _get(_get(_get(sweeper, "ax_config"), "experiment"), "minimize")
    return minimize is not None and not bool(minimize)


def _get(node: Any, key: str) -> Any:
    if node is None or not hasattr(node, "get"):
        return None
    try:
        return node.get(key)
    except Exception:  # noqa: BLE001 - an interpolation that cannot resolve here: not this sweeper's setting
        return None


def _is_list_node(value: Any) -> bool:
    return type(value).__name__ == "ListConfig"  # omegaconf's list, without importing omegaconf here
