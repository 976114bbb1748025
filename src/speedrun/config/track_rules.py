"""The tracks' rules as speedrun ships them in conf/track/, read into TrackConfig: for the report's and the export's
judgements. Not on a re-run's path (it reads YAML through OmegaConf; a run carries its track in its config)."""

from __future__ import annotations

from functools import cache

from omegaconf import OmegaConf

from speedrun.config.track import TrackConfig
from speedrun.paths import CONF_DIR


def track_names() -> list[str]:
    """The tracks conf/track/ ships, by name."""
    return sorted(p.stem for p in (CONF_DIR / "track").glob("*.yaml"))


@cache
def load_track(name: str) -> TrackConfig:
    """conf/track/<name>.yaml read into its schema: the rules as speedrun ships them (not as a run recorded them,
    so a run cannot bring laxer rules of its own under the same name). ValueError naming the shipped tracks for
    another name."""
    path = CONF_DIR / "track" / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"no track {name!r} in {CONF_DIR / 'track'}; the tracks: {', '.join(track_names())}")
    raw = OmegaConf.to_container(OmegaConf.load(path))
    assert isinstance(raw, dict)
    raw.pop("defaults", None)  # Hydra's: the schema it names is TrackConfig, merged here
    track = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrackConfig), raw))
    assert isinstance(track, TrackConfig)
    return track
