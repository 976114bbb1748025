"""The quantized round trip is scored while rank 0 compresses the artifact (speedrun.run.finish.Finish
.quantize): the two run at the same time, the artifact read back must hold exactly the codes that were scored, and
a score that fails still leaves the artifact and its size."""

from __future__ import annotations

import threading
import types

import pytest
import torch

from speedrun.config import to_config
from speedrun.plan import resolve
from speedrun.run import finish as finish_module
from support.devices import fake_device
from support.tiny import BOS, QUANT_TINY, QUANT_TINY_RUN, byte_luts, calibration_batches, docs_stream, tiny_gpt


def _data():
    return types.SimpleNamespace(
        val_tokens=docs_stream([40, 30]),
        luts=byte_luts(),
        bos_id=BOS,
        train_batches=lambda: iter(calibration_batches()),
    )


def _finish(compose, tmp_path, forward=None, on_phase=None, *overrides):
    model = tiny_gpt(QUANT_TINY, doc_bos_id=BOS)
    plan = resolve(to_config(compose(["hardware=cpu", *QUANT_TINY_RUN, *overrides])), fake_device("cpu"))
    fwd = forward or (lambda x, y: model(x, y, reduction="none"))
    return finish_module.Finish(plan, model, fwd, _data(), tmp_path, lambda line: None, on_phase), model


def _wait(condition, timeout: float = 30.0) -> bool:
    import time

    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def _artifact(finish, tmp_path):
    q = finish.plan.quant
    return tmp_path / f"model.{q.name}.{q.compressor}"


def test_compression_runs_while_the_round_trip_is_scored(compose, tmp_path, monkeypatch):
    """The compression waits, inside its thread, for the score's first batch; the score's first batch waits for
    the compression to have started. Run one after the other, either wait would time out."""
    compressing, scored = threading.Event(), threading.Event()
    seen: dict[str, bool] = {}
    real = finish_module.compress_quantized

    def compress(*args, **kwargs):
        compressing.set()
        seen["score_during_compression"] = scored.wait(timeout=30)
        return real(*args, **kwargs)

    monkeypatch.setattr(finish_module, "compress_quantized", compress)
    reports: list[tuple] = []
    int6 = ["quant=int6", "quant.calib_batches=2", "quant.block_size=8", "eval.batch_size=1"]
    finish, model = _finish(compose, tmp_path, None, lambda name, keys=None: reports.append((name, keys)), *int6)
    finish.evaluate()  # the float score first, as the phases run
    batches = [0]

    def forward(x, y):
        batches[0] += 1
        if batches[0] == 1:
            seen["compression_during_score"] = compressing.wait(timeout=30)
            scored.set()
        elif batches[0] == 2:  # let the compression end here: the tick after this batch hands its keys over
            seen["compressed_during_score"] = _wait(lambda: finish._artifact.done())
        elif batches[0] == 3:
            seen["reported_during_score"] = any(k and "artifact_bytes" in k for name, k in reports if name == "quant")
        return model(x, y, reduction="none")

    finish.eval_forward = forward
    finish.quantize()
    assert batches[0] >= 3
    assert seen == dict.fromkeys(
        ["compression_during_score", "score_during_compression", "compressed_during_score", "reported_during_score"],
        True,
    )
    assert finish.out["compress_wait_seconds"] == 0.0  # collected before the score ended
    out = finish.out
    assert out["artifact_model_bytes"] == _artifact(finish, tmp_path).stat().st_size
    assert out["compress_wait_seconds"] >= 0 and out["quant_seconds"] >= out["compress_seconds"]
    assert (tmp_path / "artifact_tensors.json").is_file()


def test_an_artifact_that_does_not_read_back_as_scored_fails_the_phase(compose, tmp_path, monkeypatch):
    real = finish_module.load_packed

    def corrupt(blob, compressor):
        packed = real(blob, compressor)
        name, entry = next(iter(packed.items()))
        field = next(iter(entry))
        entry[field] = entry[field].clone()
        entry[field].view(-1)[0] += 1  # one code (or one fp16 value) off
        return packed

    monkeypatch.setattr(finish_module, "load_packed", corrupt)
    finish, _ = _finish(compose, tmp_path)
    with pytest.raises(RuntimeError, match="differs from the codes scored"):
        finish.quantize()
    assert not _artifact(finish, tmp_path).exists()  # the file that failed its check never takes the name


def test_check_round_trip_names_a_missing_tensor(tmp_path):
    scored = {"a": {"q": torch.zeros(2, dtype=torch.int8)}, "b": {"raw": torch.ones(1)}}
    finish_module.check_round_trip(
        {"a": {"q": torch.zeros(2, dtype=torch.int8)}, "b": {"raw": torch.ones(1)}}, scored, tmp_path
    )
    with pytest.raises(RuntimeError, match=r"b\.raw read back differs"):
        finish_module.check_round_trip({"a": scored["a"]}, scored, tmp_path)
    with pytest.raises(RuntimeError, match=r"holds other tensors than those scored: \['c'\]"):
        finish_module.check_round_trip({**scored, "c": {"raw": torch.ones(1)}}, scored, tmp_path)
    with pytest.raises(RuntimeError, match="b.raw"):
        finish_module.check_round_trip({**scored, "b": {"raw": torch.ones(1, dtype=torch.float64)}}, scored, tmp_path)


def test_a_failed_round_trip_score_still_keeps_and_reports_the_artifact(compose, tmp_path):
    reports: list[tuple] = []
    finish, _ = _finish(compose, tmp_path, None, lambda name, keys=None: reports.append((name, keys)))

    def broken(x, y):
        raise RuntimeError("the quantized score broke")

    finish.eval_forward = broken
    with pytest.raises(RuntimeError, match="the quantized score broke"):
        finish.quantize()
    kept = [keys for name, keys in reports if name == "quant" and keys]
    assert kept and kept[0]["artifact_model_bytes"] == _artifact(finish, tmp_path).stat().st_size
