"""User errors: a request that cannot run, with a message that names the problem and the fix.

The runner prints these as one line (no traceback on the console; the traceback goes to error.txt) and records
a failed row. Anything else is a bug and keeps its traceback. All are ValueErrors, so callers that catch
ValueError keep working.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A value that is wrong whatever the device: raised beside the field, in the schema's __post_init__."""


class PlanError(ConfigError):
    """A combination that cannot run on this device; the message names the conflict and what works."""


class DataError(ConfigError):
    """Missing or corrupt data or tokenizer; the message names the file and how to get or fix it."""


class RunOutOfMemory(RuntimeError):
    """The run ran out of GPU memory (status ``oom``); the message names the phase, the memory and the fix."""
