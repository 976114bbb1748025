"""The tracks' rules as speedrun ships them in conf/track/, read into TrackConfig: for the report's and the export's
judgements. Not on a re-run's path (it reads YAML through OmegaConf; a run carries its track in its config).

Beside the rules, two tables of data: conf/track/records/<track>.yaml, the contest's merged records as their
submission.json files publish them (the standing record a candidate is tested against), and
conf/track/attribution/<track>.yaml, the records that introduced each lever speedrun's options turn on (the
export's credits)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

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
    if name not in track_names():  # a name read from a run dir is data: checked before it becomes a path
        raise ValueError(f"no track {name!r} in {CONF_DIR / 'track'}; the tracks: {', '.join(track_names())}")
    raw = OmegaConf.to_container(OmegaConf.load(path))
    assert isinstance(raw, dict)
    raw.pop("defaults", None)  # Hydra's: the schema it names is TrackConfig, merged here
    track = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrackConfig), raw))
    assert isinstance(track, TrackConfig)
    return track


@dataclass(frozen=True)
class PublishedRecord:
    """One merged record of a track as its submission.json publishes it (conf/track/records/<track>.yaml)."""

    folder: str
    pr: int | None
    date: str | None
    author: str | None
    data: str | None
    """The conf/data/ setting of its tokenizer and shards: nats per token compare only within one."""
    val_bpb: float | None
    val_bpb_std: float | None
    val_loss: float | None
    """Mean nats per token over its seeds (None: not published)."""
    val_loss_std: float | None
    n: int | None
    """Seeds behind the mean (None: not stated)."""
    notes: str = ""

    def label(self) -> str:
        return self.folder + (f" (PR #{self.pr})" if self.pr else "")


@cache
def load_records(track: str) -> tuple[PublishedRecord, ...]:
    """conf/track/records/<track>.yaml: the track's merged records; () where speedrun ships none."""
    path = CONF_DIR / "track" / "records" / f"{track}.yaml"
    if track not in track_names() or not path.is_file():
        return ()
    raw = OmegaConf.to_container(OmegaConf.load(path))
    assert isinstance(raw, dict)
    return tuple(PublishedRecord(**{"notes": "", **r}) for r in raw.get("records") or [])


def find_record(track: str, ref: str) -> PublishedRecord:
    """A record by its folder, or its pull request as 1855 or #1855; ValueError naming where to look."""
    records = load_records(track)
    key = ref.strip().lstrip("#")
    for r in records:
        if ref.strip() == r.folder or (key.isdigit() and r.pr == int(key)):
            return r
    raise ValueError(
        f"no merged record {ref!r} of {track} in conf/track/records/{track}.yaml: give a folder or a PR number of "
        "that table, or the numbers as val_loss=MEAN[,std=S,n=N,val_bpb=B]"
    )


def standing_record(track: str, data: str | None) -> PublishedRecord | None:
    """The best merged record (lowest val_bpb) scored on ``data``'s tokenizer and shards; None where there is none."""
    same = [r for r in load_records(track) if r.data == data and r.val_bpb is not None]
    return min(same, key=lambda r: (r.val_bpb, r.date or "")) if same else None


@dataclass(frozen=True)
class Credit:
    """One record behind a lever: its folder, the PR that merged it, and what it introduced."""

    folder: str
    pr: int | None
    what: str


@cache
def load_attribution(track: str) -> tuple[tuple[str, dict[str, Any], tuple[Credit, ...]], ...]:
    """conf/track/attribution/<track>.yaml: (lever, when, credits) for each lever; () where none ships."""
    path = CONF_DIR / "track" / "attribution" / f"{track}.yaml"
    if track not in track_names() or not path.is_file():
        return ()
    raw = OmegaConf.to_container(OmegaConf.load(path))
    assert isinstance(raw, dict)
    return tuple(
        (str(e["lever"]), dict(e["when"]), tuple(Credit(**c) for c in e["records"])) for e in raw.get("levers") or []
    )


def levers_used(track: str, config: dict[str, Any]) -> list[tuple[str, tuple[Credit, ...]]]:
    """The levers of the attribution table that a run's resolved config (a plain dict) turns on, with their credits."""
    return [(lever, credits) for lever, when, credits in load_attribution(track) if _holds(when, config)]


def _holds(when: dict[str, Any], config: dict[str, Any]) -> bool:
    for key, want in when.items():
        value: Any = config
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if want == "set":
            if value in (None, False, 0, 0.0, "", "off", "none") or value == []:
                return False
        elif str(value) != str(want) and value != want:
            return False
    return True
