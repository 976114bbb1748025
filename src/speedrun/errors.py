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


STORAGE_ERRNOS = {"ENOSPC", "EDQUOT", "EFBIG", "EROFS", "EACCES", "EPERM"}
"""What a filesystem refuses a run for: full (or over a quota or file-size limit), read-only, not ours. Not bugs:
the machine's state, with a fix."""


def storage_problem(exc: BaseException | None) -> str | None:
    """One line for a write the filesystem refused (exc itself or a cause: a full disk, a read-only or foreign
    dir), naming the path and the fix; None for anything else."""
    import errno

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and errno.errorcode.get(exc.errno or -1) in STORAGE_ERRNOS:
            where = f" ({exc.filename})" if exc.filename else ""
            return (
                f"cannot write{where}: {exc.strerror}; free space there or make it writable, or put the run "
                f"elsewhere (hydra.run.dir=<dir> results_db=<file>)"
            )
        exc = exc.__cause__ or exc.__context__
    return None
