"""logger=wandb end to end: a real offline sweep (no API key, no network) leaves each job's config and summary in
its run dir, failed jobs included; its ok job logs its model and train_gpt.py as artifacts. One sweep for the file:
a job is a run of its own, so a separate single run would check the same logging again (~8 s)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from support.cli import SWEEP_TINY

pytestmark = pytest.mark.slow


def wandb_records(run_dir: Path) -> dict:
    """Read the offline run's transaction log (<run dir>/wandb/offline-run-*/run-*.wandb): a LevelDB-style log
    of protobuf Records. Returns the run record, the merged summary, the history count and the exit code."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, raw, pending = 32768, 7, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            raw.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            raw.append(pending + chunk)
    out: dict = {"summary": {}, "history": 0, "exit_code": None, "run": None, "metrics": {}, "keys": set()}
    out["artifacts"] = []
    for item in raw:
        rec = pb.Record()
        rec.ParseFromString(item)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out["run"] = rec.run
        elif kind == "summary":
            out["summary"].update({u.key: json.loads(u.value_json) for u in rec.summary.update if u.key})
        elif kind == "history":
            out["history"] += 1
            out["keys"].update(i.key or ".".join(i.nested_key) for i in rec.history.item)
        elif kind == "metric" and rec.metric.name:
            m = rec.metric
            out["metrics"][m.name] = (m.step_metric, [f for f in ("min", "last") if getattr(m.summary, f)])
        elif kind == "exit":
            out["exit_code"] = rec.exit.exit_code
        elif kind == "artifact":
            out["artifacts"].append(rec.artifact)
    return out


def offline_env(tmp_path: Path) -> dict[str, str]:
    """The environment of an offline W&B run (no API key, no network) whose W&B files all stay under tmp_path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(
        WANDB_MODE="offline",
        HOME=str(tmp_path / "home"),
        PYTHONUNBUFFERED="1",
        WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"),
        WANDB_CACHE_DIR=str(tmp_path / "wandb-cache"),
        WANDB_DATA_DIR=str(tmp_path / "wandb-data"),
    )
    # speedrun's own cache under the empty HOME is the one every other run of the suite uses (~/.cache/speedrun):
    # cold, job 0 minified every source file of its self-extracting train_gpt.py again (4.4 s of the test)
    from speedrun.paths import CACHE_DIR

    cache = CACHE_DIR.expanduser()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:  # a HOME without a writable cache: the link dangles, minify skips its cache (as it would there)
        pass
    (tmp_path / "home" / ".cache").mkdir(parents=True)
    (tmp_path / "home" / ".cache" / "speedrun").symlink_to(cache, target_is_directory=True)
    return env


@pytest.fixture(scope="module")
def offline_sweep(tmp_path_factory, data_cache) -> tuple[subprocess.CompletedProcess, Path]:
    """A 2-job sweep logging to W&B offline, run once for the file: its console and working dir. Job 0 is ok, job 1
    fails on purpose after its logger started."""
    pytest.importorskip("wandb", reason="wandb is not installed (pip install -e '.[wandb]'; it is in the dev extra)")
    cwd = tmp_path_factory.mktemp("wandb-sweep")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "run",
            "-m",
            *SWEEP_TINY,
            f"data.cache_dir={data_cache}",
            "logger=wandb",
            "logger.project=speedrun-test",
            # job 1 fails on purpose after its logger started: fineweb_sp1024's shards are not in its working dir
            "data=embedded,fineweb_sp1024",
            "eval.every_steps=2",
            "eval.periodic_tokens=1024",
        ],
        cwd=cwd,
        env=offline_env(cwd),
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc, cwd


def test_an_offline_sweep_leaves_config_and_summary_in_each_run_dir(offline_sweep):
    proc, cwd = offline_sweep
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]  # one job fails on purpose; the other is ok
    (sweep,) = (cwd / "outputs" / "multirun").glob("*/*")
    ok, failed = sweep / "0", sweep / "1"
    assert json.loads((ok / "result.json").read_text())["status"] == "ok"
    assert json.loads((failed / "result.json").read_text())["status"] == "failed"
    for run_dir in (ok, failed):
        assert "logger=wandb: offline run in" in (run_dir / "run.log").read_text()
        rec = wandb_records(run_dir)
        run = rec["run"]
        assert run.project == "speedrun-test" and run.run_group == sweep.name  # group = sweep id
        config = {u.key: json.loads(u.value_json) for u in run.config.update}
        assert config["model"]["name"] == "tiny" and config["plan"]["hardware"] == "cpu"
        assert rec["exit_code"] is not None  # finished, failed job included
    good, bad = wandb_records(ok), wandb_records(failed)
    result = json.loads((ok / "result.json").read_text())
    assert good["summary"]["status"] == "ok" and good["exit_code"] == 0 and good["history"] >= 1
    assert good["summary"]["val_bpb"] == pytest.approx(result["val_bpb"])
    assert good["summary"]["artifact_bytes"] == result["artifact_bytes"]
    # the ok job's compressed model and train_gpt.py are W&B artifacts; the failed job never wrote them
    assert sorted(a.type for a in good["artifacts"]) == ["code", "model"] and not bad["artifacts"]
    assert (
        bad["summary"]["status"] == "failed"
        and bad["exit_code"] == 1
        and "fineweb10B_sp1024" in bad["summary"]["error"]
    )
    # curves against tokens; validation summarised by its minimum; the kernel and hardware choices as config
    assert good["metrics"]["train_loss"] == ("tokens", ["last"]) and good["metrics"]["val_bpb"] == ("tokens", ["min"])
    assert {"train_loss", "val_bpb", "tokens", "lr_mult"} <= good["keys"]
    settings = {u.key: json.loads(u.value_json) for u in good["run"].config.update}["settings"]
    assert settings["attn_kernel"] == "sdpa:flash" and settings["hardware"] == "cpu" and settings["micro_batch"] == 4
    # the sweep's own W&B run: its leaderboard as a Table and the report's plots as images, in the sweep's group
    summary = wandb_records(sweep)
    assert summary["run"].run_group == sweep.name and summary["run"].job_type == "sweep-summary"
    assert "leaderboard._type" in summary["keys"] and any(k.startswith("plots/") for k in summary["keys"])
    (table,) = sweep.glob("wandb/offline-run-*/files/media/table/leaderboard_*.table.json")
    data = json.loads(table.read_text())
    assert "val_bpb_mean" in data["columns"] and len(data["data"]) == 2


def test_a_run_logs_its_model_and_train_gpt_as_artifacts_with_its_numbers(offline_sweep):
    # the sweep's ok job: a run of its own (a process, a run dir) that logs to W&B as a single run does
    proc, cwd = offline_sweep
    (sweep,) = (cwd / "outputs" / "multirun").glob("*/*")
    run_dir = sweep / "0"
    assert json.loads((run_dir / "result.json").read_text())["status"] == "ok", (proc.stdout + proc.stderr)[-4000:]
    result = json.loads((run_dir / "result.json").read_text())
    rec = wandb_records(run_dir)
    run_id = rec["run"].run_id
    model_file = run_dir / f"model.{result['quant']}.{result['compressor']}"
    by_type = {a.type: a for a in rec["artifacts"]}
    assert sorted(by_type) == ["code", "model"] and len(rec["artifacts"]) == 2
    for kind, path in (("model", model_file), ("code", run_dir / "train_gpt.py")):
        art = by_type[kind]
        assert art.name == f"{kind}-{run_id}" and {"latest", "ok"} <= set(art.aliases)
        # the manifest holds exactly the run dir's file, byte for byte (W&B's md5 digest, and the staged copy that
        # `wandb sync` uploads)
        (entry,) = art.manifest.contents
        data = path.read_bytes()
        assert entry.path == path.name and entry.size == len(data)
        assert entry.digest == base64.b64encode(hashlib.md5(data).digest()).decode()
        assert Path(entry.local_path).read_bytes() == data
        meta = json.loads(art.metadata)
        assert meta["file"] == path.name and meta["sha256"] == hashlib.sha256(data).hexdigest()
        for key in ("val_bpb", "val_bpb_quant", "artifact_bytes", "steps", "tokens", "code_fingerprint", "git_sha"):
            assert meta[key] == result[key], key
    assert json.loads(by_type["code"].metadata)["artifact_code_sha256"] == result["artifact_code_sha256"]
    assert model_file.stat().st_size == result["artifact_model_bytes"]
    # the headline numbers as the W&B run's summary
    for key in ("val_bpb", "val_bpb_quant", "artifact_bytes", "tokens_per_s", "steps", "tokens"):
        assert rec["summary"][key] == pytest.approx(result[key]), key
