"""The run's math: model, data, the training step and loop, evaluation, quantization and TTT, with no record keeping.

One floor above the shared modules (speedrun.progress, speedrun.tables, speedrun.errors), which are all of
speedrun it imports. Two shells call it: ``python -m run`` (records, resume, loggers) and an exported train_gpt.py's
driver. The two markers here are read by the export's linker (speedrun.artifact.link):

- ``NAME = choice("plan.path", {key: entry, ...})`` is a registry: at run time it is the dict itself; the linker
  keeps only the entries whose key is the Plan's value at ``plan.path``.
- ``@shell_only`` marks code only ``python -m run`` calls; the linker refuses an export that reaches it.
"""

from __future__ import annotations

from typing import TypeVar

__all__ = ["choice", "shell_only"]

V = TypeVar("V")
F = TypeVar("F")


def choice(path: str, entries: dict[str, V]) -> dict[str, V]:
    """The registry ``entries``, keyed by the values the Plan may hold at ``path`` (a dotted Plan field). Returned
    as is: the path is read by the linker from the source, never at run time."""
    return entries


def shell_only(obj: F) -> F:
    """Mark ``obj`` as called by ``python -m run`` only (never by an exported driver). Identity at run time."""
    return obj
