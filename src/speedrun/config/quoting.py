"""A value (a path, mostly) as one quoted Hydra override value, for the command lines speedrun builds itself (a
sweep's jobs, a run's ranks): the override grammar reserves characters a path may hold (``=``, ``,``, spaces,
brackets), and a path may hold a quote or a backslash too."""

from __future__ import annotations

import re

from speedrun.errors import ConfigError


def hydra_quote(value: str) -> str:
    """``value`` single-quoted for Hydra's override parser, which reads it back unchanged: inside quotes a quote is
    written ``\\'`` and a run of backslashes right before a quote, or before the closing quote, is doubled. A
    ``${`` would be resolved as an interpolation, so it is refused (ConfigError naming the value)."""
    if "${" in value:
        raise ConfigError(f"{value!r} holds '${{', which Hydra would resolve as an interpolation; rename that folder")
    body = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
    body = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, body)
    return f"'{body}'"
