"""python -m speedrun.bench: the declared checks, the runner end to end on this CPU (one two-arm check at a tiny
budget, its result file's fields), the refusals of a machine that cannot run a check, the peers' log parsers, the
bars, docs/benchmarks.md as the render of the result files, and what the dist_resume check reports from an
uninterrupted and a stopped-and-resumed run (speedrun.bench.resume)."""

from __future__ import annotations

import json
import re
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from speedrun.bench import machine as hw
from speedrun.bench import resume as resume_check
from speedrun.bench.__main__ import main
from speedrun.bench.checks import CHECKS
from speedrun.bench.execute import POLL_S, execute
from speedrun.bench.metrics import tokens_per_s_before_loop, tokens_per_s_with_loop
from speedrun.bench.parsers import pgolf_baseline, pgolf_record
from speedrun.bench.readiness import prepare_corpus, why_not
from speedrun.bench.render import HYDRA_TRAILER, PAGE, render
from speedrun.bench.runner import run_check
from speedrun.bench.spec import Check, Diff, PeerArm, Ratio, RunArm, Value, judge
from speedrun.bench.steps import Options, Step, plan
from speedrun.records.identity import file_sha256

GPU_HERE = bool(hw.detect().gpus)

TINY = [
    "budget.max_steps=1",
    "budget.warmup_steps=0",
    "budget.tokens_per_step=256",
    "eval.tokens=1024",
    "quant=off",
]
"""One step of one micro-batch and a two-window eval: the smoke model's run in a few seconds on a CPU."""


@pytest.fixture(scope="module")
def cpu_result(tmp_path_factory):
    """cpu_smoke_attn run once at the tiny budget, one pass: (exit status, printed lines, result file)."""
    if GPU_HERE:
        pytest.skip("cpu_smoke_attn is a CPU check; this machine has a GPU")
    root = tmp_path_factory.mktemp("bench")
    lines: list[str] = []
    opts = Options(results=root / "results", work=root / "work", repeats=1, overrides=tuple(TINY), timeout_s=300)
    # with the runner's own clock of each run's start-up shown too
    check = replace(CHECKS["cpu_smoke_attn"], metrics=(*CHECKS["cpu_smoke_attn"].metrics, "startup_seconds"))
    status, path = run_check(check, opts, say=lines.append)
    return status, lines, path


def test_the_runner_runs_a_check_end_to_end_and_records_it(cpu_result):
    status, lines, path = cpu_result
    assert path is not None, "\n".join(lines)
    assert status in (0, 1)  # a tiny run's ratio may miss the bar; the file is what is checked
    assert re.fullmatch(r"\d{4}-\d\d-\d\d_cpu_[0-9a-f]{9}(-dirty)?\.json|\d{4}-\d\d-\d\d_cpu_nocommit\.json", path.name)
    assert path.parent.name == "cpu_smoke_attn" and not list(path.parent.glob(".*tmp*"))
    r = json.loads(path.read_text())
    assert r["check"] == "cpu_smoke_attn" and r["machine"]["card"] == "cpu" and r["machine"]["gpu_count"] == 0
    assert r["torch"] and r["python"] and "dirty" in r
    assert r["commit"] is None or re.fullmatch(r"[0-9a-f]{40}", r["commit"])
    assert r["corpus"]["data"] == "embedded" and len(r["corpus"]["fingerprint"]) == 16
    assert r["overrides"] == TINY and "--override budget.max_steps=1" in r["command"]
    assert list(r["arms"]) == ["sdpa", "math"]
    for name, arm in r["arms"].items():
        (run,) = arm["runs"]
        assert run["status"] == "ok", run["log_tail"]
        assert run["metrics"]["steps"] == 1 and run["metrics"]["tokens_per_s"] > 0
        assert 0 < run["metrics"]["startup_seconds"] < run["seconds"]  # launch to its first step (no warm-up)
        assert arm["metrics"]["tokens_per_s"] == run["metrics"]["tokens_per_s"]
        assert 0 < len(run["log_tail"]) <= 40 and any("status:" in line for line in run["log_tail"])
        assert f"attn={name}" in arm["command"] and "seed=0" in arm["command"]
    ((text, per_pass),) = r["ratios"].items()
    ratio = r["arms"]["sdpa"]["metrics"]["tokens_per_s"] / r["arms"]["math"]["metrics"]["tokens_per_s"]
    assert text == "ratio tokens_per_s sdpa/math >= 0.9" and per_pass == [pytest.approx(ratio, rel=1e-3)]
    (bar,) = r["bars"]
    assert bar["observed"] == pytest.approx(ratio) and bar["passed"] == (ratio >= 0.9) == r["passed"]
    assert status == (0 if r["passed"] else 1)
    assert lines[-1].endswith(str(path))


def test_the_page_renders_a_result_and_keeps_the_newest_per_card(cpu_result, tmp_path):
    _, _, path = cpu_result
    results = tmp_path / "benchmarks" / "results"
    shutil.copytree(path.parent, results / "cpu_smoke_attn")
    older = json.loads(path.read_text())
    older["started_at"], older["passed"] = "2000-01-01T00:00:00+00:00", not older["passed"]
    (results / "cpu_smoke_attn" / "2000-01-01_cpu_000000000.json").write_text(json.dumps(older))
    page = render([CHECKS["cpu_smoke_attn"], CHECKS["cpu_default"]], results)
    section = page.split("## cpu_smoke_attn")[1].split("\n## ")[0]
    new = json.loads(path.read_text())
    assert section.count("| sdpa |") == 1 and f"commit `{(new['commit'] or 'unknown')[:9]}" in section
    assert ("**pass**" if new["passed"] else "**fail**") in section and new["command"] in section
    assert "Not yet measured." in page.split("## cpu_default")[1]


def test_a_failed_run_shows_its_last_line_and_the_scripts_it_ran(tmp_path):
    failed = {"status": "exit 1", "seed": 0, "log_tail": ["step 242", "FileNotFoundError: no `pyminify`"]}
    result = {
        "check": "record_vs_pgolf",
        "machine": {"card": "H200 SXM", "gpu_count": 2},
        "date": "2026-11-28",
        "passed": False,
        "all_runs_ok": False,
        "arms": {"speedrun": {"runs": [{"status": "ok", "seed": 0}]}, "record": {"runs": [failed]}},
        "peers": {"pgolf_record": {"path": "p", "sha256": "8520ea55b64e3768aa46"}},
        "fa3_stand_in": {"path": "s", "sha256": "7cd2b78978a080ab6658"},
    }
    results = tmp_path / "benchmarks" / "results"
    (results / "record_vs_pgolf").mkdir(parents=True)
    (results / "record_vs_pgolf" / "2026-11-28_h200-sxm_000000000.json").write_text(json.dumps(result))
    page = render([CHECKS["record_vs_pgolf"]], results)
    assert "record seed 0: exit 1, last line `FileNotFoundError: no 'pyminify'`" in page
    # the run's own error line wins over Hydra's closing line, and what it measured before failing is kept
    failed["log_tail"] = ["val_bpb:  0.631085", "error:   KeyError: 'delta'", "", f"{HYDRA_TRAILER} for a complete"]
    failed["metrics"] = {"val_bpb": 0.631085, "val_bpb_ttt": None}
    (results / "record_vs_pgolf" / "2026-11-28_h200-sxm_000000000.json").write_text(json.dumps(result))
    page = render([CHECKS["record_vs_pgolf"]], results)
    assert "record seed 0: exit 1, error `KeyError: 'delta'`; before it failed: val_bpb 0.63109;" in page
    assert "speedrun seed 0" not in page
    assert "pgolf_record sha256 `8520ea55b64e`" in page and "stand-in, sha256 `7cd2b78978a0`" in page


def test_a_machine_that_cannot_run_a_check_says_so_and_writes_nothing(tmp_path, capsys):
    results = tmp_path / "results"
    name = "cpu_default" if GPU_HERE else "kernel_tuned"
    assert main([name, "--results", str(results), "--work", str(tmp_path / "work")]) == 2
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1 and name in out
    assert not results.exists()


def _machine(name: str | None, count: int = 1) -> hw.Machine:
    return hw.Machine(gpus=tuple(hw.Gpu(name, 81559, "580.1") for _ in range(count)) if name else (), cpu="x")


def test_the_refusals_name_what_is_missing(tmp_path, monkeypatch):
    h100, h200 = _machine("NVIDIA H100 80GB HBM3"), _machine("NVIDIA H200", 1)
    opts = Options(peers={})
    monkeypatch.setattr("speedrun.bench.steps.PEERS_DIR", tmp_path / "no_peers")
    assert "needs H100 and this machine has H200 SXM" in why_not(CHECKS["ttt_rate"], opts, h200)
    assert "needs 2 GPUs and 1 are visible" in why_not(CHECKS["dist_2gpu"], opts, h100)
    assert "CPU check" in why_not(CHECKS["cpu_default"], opts, h100)
    assert "no GPU" in why_not(CHECKS["kernel_tuned"], opts, _machine(None))
    assert "--peer pgolf_baseline=" in why_not(CHECKS["baseline_vs_pgolf"], opts, h100)
    script = tmp_path / "train_gpt.py"
    script.write_text("print('hi')\n")
    two = _machine("NVIDIA H100 80GB HBM3", 2)
    record = Options(peers={"pgolf_record": script})
    if shutil.which("nvidia-smi") is None:  # FlashAttention-3 is not installed on a CPU machine
        assert "--fa3-shim DIR" in why_not(CHECKS["record_vs_pgolf"], record, two)
    shim = Options(peers={"pgolf_record": script}, fa3_shim=tmp_path)
    monkeypatch.setattr("speedrun.bench.readiness.importable", lambda m: True)  # triton comes with CUDA torch only
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert "runs pyminify, not on PATH here (pyminify: pip install python-minifier" in why_not(
        CHECKS["record_vs_pgolf"], shim, two
    )
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "pyminify").write_text("#!/bin/sh\n")
    (tools / "pyminify").chmod(0o755)
    monkeypatch.setenv("PATH", str(tools))
    assert why_not(CHECKS["record_vs_pgolf"], shim, two) is None  # its corpus is prepared when missing
    monkeypatch.setattr("speedrun.bench.readiness.importable", lambda m: m != "brotli")
    assert "imports brotli, which" in why_not(CHECKS["record_vs_pgolf"], shim, two)
    assert why_not(CHECKS["dist_4gpu"], opts, _machine("NVIDIA H200", 4)) is None


def test_the_dry_run_prints_each_runs_command_with_its_environment(tmp_path, capsys):
    script = tmp_path / "train_gpt.py"
    script.write_text("")
    assert main(["--dry-run", "baseline_vs_pgolf", "--peer", f"pgolf_baseline={script}"]) == 0
    out = capsys.readouterr().out.splitlines()
    commands = [line for line in out if not line.startswith("#")]
    assert len(commands) == 4  # two passes of two arms, alternated
    assert "-m run model=pgolf_baseline kernel=tuned" in commands[0] and "data=python_sp1024" in commands[0]
    assert "MAX_WALLCLOCK_SECONDS=60" in commands[1] and f"{script}" in commands[1]
    assert "DATA_PATH=" in commands[1] and "TOKENIZER_PATH=" in commands[1] and commands[1].startswith("cd ")
    assert [c.split("seed=")[-1].split()[0] for c in commands[::2]] == ["0", "0"] and "s0_p2" in commands[2]


def test_a_check_showing_a_quality_metric_must_show_epochs_beside_it():
    arm = RunArm("a", ())
    with pytest.raises(ValueError, match="list 'epochs' in its metrics"):
        Check("c", "C.", (arm,), (Value("a", "val_bpb", "<=", 3.0),), ("val_bpb",))
    Check("c", "C.", (arm,), (Value("a", "val_bpb", "<=", 3.0),), ("val_bpb", "epochs"))
    Check("c", "C.", (arm,), (Value("a", "tokens_per_s", ">=", 1.0),), ("tokens_per_s",))


def test_the_dry_run_takes_the_name_before_or_after_the_flag(capsys):
    assert main(["--dry-run", "cpu_default"]) == 0
    first = capsys.readouterr().out
    assert main(["cpu_default", "--dry-run"]) == 0
    assert capsys.readouterr().out == first and "-m run data=embedded" in first
    with pytest.raises(SystemExit):
        main(["--dry-run"])
    assert "--dry-run needs a check's name" in capsys.readouterr().err


def test_parallel_arms_get_gpus_of_their_own_and_alternating_arms_share_the_first():
    record, tuned = CHECKS["record_vs_pgolf"], CHECKS["kernel_tuned"]
    ((a, b),) = plan(record, Options(), _machine("NVIDIA H100 80GB HBM3", 4))
    assert (a.env["CUDA_VISIBLE_DEVICES"], b.env["CUDA_VISIBLE_DEVICES"]) == ("0", "1")
    (a1, b1), (a2, b2) = plan(record, Options(repeats=2), _machine("NVIDIA H100 80GB HBM3", 2))
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in (a1, b1, a2, b2)] == ["0", "1", "1", "0"]  # swapped on pass 2
    assert (a2.arm.name, a2.run_dir.name) == ("speedrun", "s0_p2")
    waves = plan(tuned, Options(), _machine("NVIDIA H100 80GB HBM3", 4))
    assert [[s.arm.name for s in w] for w in waves] == [["default", "tuned"], ["default", "tuned"]]
    assert {s.env["CUDA_VISIBLE_DEVICES"] for w in waves for s in w} == {"0"}
    (wave,) = plan(CHECKS["dist_4gpu"], Options(repeats=1), _machine("NVIDIA H200", 4))
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in wave] == ["0", "0,1,2,3"]


def test_the_list_shows_every_check_with_its_card_gpus_and_bar(capsys):
    assert main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(CHECKS)
    for line, check in zip(lines, CHECKS.values()):
        assert line.startswith(check.name) and check.bars[0].text in line and f"{check.gpus} GPU" in line


def test_every_claim_has_a_check():
    wanted = {
        "cpu_default", "gpu_default", "cpu_smoke_attn", "baseline_vs_pgolf", "record_vs_pgolf", "kernel_tuned", "precision_fp8",
        "attn_backends", "dist_2gpu", "dist_4gpu", "ttt_rate", "eval_rate", "record_export", "mng_time_to_target",
    }  # fmt: skip
    assert wanted <= set(CHECKS)
    for check in CHECKS.values():
        assert check.measures.endswith(".") and check.metrics and check.bars
        peers = [a for a in check.arms if isinstance(a, PeerArm)]
        for arm in peers:
            assert "{data_path}" in arm.env.values() and arm.parser in ("pgolf_baseline", "pgolf_record")
    assert CHECKS["record_vs_pgolf"].corpus.data == "python_sp1024"


def test_a_check_refuses_bars_on_arms_or_metrics_it_lacks():
    arm = RunArm("a", ())
    with pytest.raises(ValueError, match="names arms it does not have"):
        Check("x", "x.", (arm,), (Ratio("tokens_per_s", "a", "b", ">=", 1),), ("tokens_per_s",))
    with pytest.raises(ValueError, match="needs .*val_bpb"):
        Check("x", "x.", (arm,), (Value("a", "val_bpb", "<=", 1),), ("tokens_per_s",))
    with pytest.raises(ValueError, match="dist.nproc=2"):
        RunArm("b", (), gpus=2)


def test_bars_judge_ratios_values_and_differences():
    m = {"a": {"t": 150.0, "q": 2.01, "b": 2.0, "ok": True}, "b": {"t": 100.0, "q": 2.1}}
    assert judge(Ratio("t", "a", "b", ">=", 1.25), m) == (1.5, True)
    assert judge(Ratio("t", "b", "a", ">=", 1.0), m)[1] is False
    observed, passed = judge(Value("a", "q", "<=", 0.01, minus="b"), m)
    assert observed == pytest.approx(0.01) and passed
    assert judge(Diff("q", "a", "b", "<=", 0.0), m)[1]
    assert judge(Value("a", "ok", ">=", 1.0), m) == (1.0, True)
    assert judge(Value("b", "missing", ">=", 0), m) == (None, False)  # a metric the run lacks fails the bar


def test_speedruns_loop_split_of_tokens_per_s():
    result = {
        "tokens_per_step": 1000,
        "steps": 30,
        "train_seconds": 41.0,
        "train_loop_seconds": 40.0,
        "tokens_per_s": 750.0,
        "stages": [{"seq_len": 2048, "start_step": 0}, {"seq_len": 2048, "start_step": 10, "start_seconds": 10.0, "loop": True}],
    }  # fmt: skip
    assert tokens_per_s_before_loop(result) == 1000.0
    assert tokens_per_s_with_loop(result) == pytest.approx(20 * 1000 / 30.0)
    assert tokens_per_s_before_loop({"tokens_per_s": 5.0, "stages": []}) == 5.0  # no loop: the whole run's


BASELINE_LOG = """\
model_params:17059912
step:1/20000 train_loss:6.9380 train_time:290ms step_avg:290.00ms
step:100/20000 train_loss:3.1000 train_time:29000ms step_avg:290.00ms
step:207/20000 val_loss:2.5000 val_bpb:1.4800 train_time:60030ms step_avg:290.00ms
stopping_early: wallclock_cap train_time:60030ms step:207/20000
peak memory allocated: 10240 MiB reserved: 11000 MiB
Total submission size int8+zlib: 15900000 bytes
final_int8_zlib_roundtrip val_loss:2.5100 val_bpb:1.4900 eval_time:900ms
final_int8_zlib_roundtrip_exact val_loss:2.51001234 val_bpb:1.49001234
"""

RECORD_LOG = """\
model_params:35945671
gptq:reserving 10.0s, effective=290000ms
1/20000 train_loss: 8.9988 train_time: 0.0m tok/s: 12172079
100/20000 train_loss: 2.5584 train_time: 1.3m tok/s: 1000000
layer_loop:enabled step:130 frac:0.350 encoder:[0, 1, 2, 3, 4, 5, 3, 4] decoder:[5, 3, 4, 5, 6, 7, 8, 9, 10]
300/20000 train_loss: 2.4099 train_time: 4.5m tok/s: 810000
stopping_early: wallclock_cap train_time: 290050ms step: 310/20000
peak memory allocated: 41710 MiB reserved: 47036 MiB
Total submission size quantized+brotli: 15951777 bytes
diagnostic pre-quantization post-ema val_loss:2.33020168 val_bpb:1.06474209 eval_time:9082ms
diagnostic quantized val_loss:2.34967561 val_bpb:1.07364034 eval_time:11036ms
"""


def test_the_parameter_golf_baseline_log_parses_as_speedrun_names_it():
    m = pgolf_baseline(BASELINE_LOG, {})
    assert m["steps"] == 207 and m["train_seconds"] == 60.03
    assert m["tokens_per_s"] == pytest.approx(207 * 524288 / 60.03)
    assert (m["val_bpb"], m["val_bpb_quant"], m["artifact_bytes"]) == (1.48, 1.49001234, 15900000)
    assert m["peak_mem_mb"] == 10240 and m["params"] == 17059912
    assert pgolf_baseline(BASELINE_LOG, {"TRAIN_BATCH_TOKENS": "262144"})["tokens_per_s"] == pytest.approx(
        207 * 262144 / 60.03
    )
    assert pgolf_baseline("Traceback (most recent call last):\n", {}) == {}  # a crash: no metrics, no error


def test_the_record_log_parses_with_the_loop_split():
    m = pgolf_record(RECORD_LOG, {})
    assert m["steps"] == 310 and m["tokens_per_s"] == pytest.approx(310 * 786432 / 290.05)
    at = 0.35 * 290.0
    assert m["tokens_per_s_before_loop"] == pytest.approx(130 * 786432 / at)
    assert m["tokens_per_s_with_loop"] == pytest.approx(180 * 786432 / (290.05 - at))
    assert (m["val_bpb"], m["val_bpb_quant"], m["artifact_bytes"]) == (1.06474209, 1.07364034, 15951777)


def committed_results(tmp_path: Path) -> Path:
    """A copy of the result files git tracks (benchmarks/results/ as committed or staged), without the ones a local
    `python -m speedrun.bench <check>` wrote and nobody added: the page is the render of what the repository holds,
    not of this machine's measurements. Without git (a tree that is no checkout) every file there counts."""
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    source = repo / "benchmarks" / "results"
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--", "benchmarks/results"], cwd=repo, capture_output=True, check=True
        ).stdout.decode()
        files = [repo / name for name in listed.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        files = sorted(source.rglob("*.json"))
    copy = tmp_path / "benchmarks" / "results"
    for path in files:
        if path.is_file():
            (copy / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, copy / path.relative_to(source))
    return copy


def test_docs_benchmarks_md_is_the_render_of_the_result_files(tmp_path):
    """docs/benchmarks.md is generated: a committed result file or a check changed without `python -m speedrun.bench
    --render` leaves it stale. A result file this machine wrote and git does not track leaves it as it is."""
    text = render(CHECKS.values(), committed_results(tmp_path))
    assert PAGE.read_text() == text, "docs/benchmarks.md is out of date: run python -m speedrun.bench --render"
    assert len(text.splitlines()) <= 400
    for name in CHECKS:
        assert f"\n## {name}\n" in text


def test_every_result_file_is_the_runners(tmp_path):
    """Result files come from the runner only: each parses, names its check and card, and sits where the runner
    puts it."""
    root = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    for path in sorted(root.glob("*/*.json")):
        r = json.loads(path.read_text())
        assert r["check"] == path.parent.name and r["check"] in CHECKS, path
        assert path.name == f"{r['date']}_{r['machine']['slug']}_{path.stem.split('_', 2)[2]}.json", path
        assert {"torch", "commit", "corpus", "arms", "bars", "passed", "command"} <= set(r), path


def test_every_speedrun_arm_composes():
    """Each speedrun arm's command line (its overrides, the corpus's, a seed) composes with the real conf/ tree and
    passes the schemas' own checks, as a run checks it before any GPU time is spent: a misspelt key in a check
    would otherwise surface only on the GPU machine."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from speedrun.config import CONF_DIR, register_configs, to_config

    register_configs()
    lines = {
        (*arm.overrides, *check.corpus.overrides(), "seed=0")
        for check in CHECKS.values()
        for arm in check.arms
        if isinstance(arm, RunArm)
    }
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for overrides in sorted(lines):
            try:
                cfg = compose("config", overrides=list(overrides))
                to_config(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]))
            except Exception as e:  # noqa: BLE001 - the message names the arm's overrides and the error
                pytest.fail(f"{' '.join(overrides)}\n  {type(e).__name__}: {e}")


FAKE_PEER = """\
import os, sys, time
import flash_attn_interface  # the stand-in module --fa3-shim puts on the path
print("model_params:123")
time.sleep(1.5)  # its "warm-up": startup_seconds must count it
print("step:10/20000 train_loss:3.0000 train_time:2000ms step_avg:200.00ms")
print("step:10/20000 val_loss:2.9000 val_bpb:1.7000 train_time:2000ms step_avg:200.00ms")
print("final_int8_zlib_roundtrip_exact val_loss:2.91000000 val_bpb:1.71000000")
open("seen.txt", "w").write(os.environ["DATA_PATH"] + "\\n" + os.environ["SEED"])
"""


def test_a_peer_arm_runs_its_script_with_the_env_and_its_log_parsed(tmp_path):
    """A peer's script runs in its own run dir with the check's environment filled in (the corpus's path, the seed),
    the FA3 stand-in's folder first on PYTHONPATH, its log parsed into speedrun's metric names, its sha256 and the
    stand-in's recorded."""
    if GPU_HERE:
        pytest.skip("the check below is declared for a CPU machine")
    script, shim = tmp_path / "train_gpt.py", tmp_path / "shim"
    script.write_text(FAKE_PEER)
    shim.mkdir()
    (shim / "flash_attn_interface.py").write_text("")
    peer = PeerArm(
        "peer", peer="fake", source="a test", parser="pgolf_baseline", needs_fa3=True,
        env={"DATA_PATH": "{data_path}", "SEED": "{seed}", "TRAIN_BATCH_TOKENS": "1000"},
    )  # fmt: skip
    check = Check(
        "fake_peer", "A peer alone.", (peer,), (Ratio("tokens_per_s", "peer", "peer", ">=", 1.0),),
        ("tokens_per_s", "val_bpb", "val_bpb_quant", "steps", "epochs", "startup_seconds"), cards=("cpu",), seeds=(3,),
    )  # fmt: skip
    opts = Options(peers={"fake": script}, fa3_shim=shim, results=tmp_path / "results", work=tmp_path / "work")
    status, path = run_check(check, opts, say=lambda line: None)
    assert status == 0 and path is not None
    r = json.loads(path.read_text())
    (run,) = r["arms"]["peer"]["runs"]
    data_path, seed = (Path(run["run_dir"]) / "seen.txt").read_text().split("\n")
    assert Path(data_path) == Path(r["corpus"]["path"]) and (Path(data_path) / "dataset.json").is_file()
    train_tokens = json.loads((Path(data_path) / "dataset.json").read_text())["train"]["tokens"]
    startup = run["metrics"].pop("startup_seconds")
    assert run["status"] == "ok" and run["metrics"] == {
        "tokens_per_s": 5000.0, "val_bpb": 1.7, "val_bpb_quant": 1.71, "steps": 10,
        "epochs": round(10 * 1000 / train_tokens, 3),  # 10 steps of TRAIN_BATCH_TOKENS over the corpus
    }  # fmt: skip
    assert 1.5 <= startup <= run["seconds"]  # launch to its first step line, the pause included
    assert seed == "3"
    assert r["peers"]["fake"] == {"path": str(script), "sha256": file_sha256(script)}
    stand_in = shim / "flash_attn_interface.py"
    assert r["fa3_stand_in"] == {
        "path": str(stand_in), "sha256": file_sha256(stand_in), "kind": "the --fa3-shim stand-in"
    }  # fmt: skip
    assert f"PYTHONPATH={shim}" in r["arms"]["peer"]["command"]


def test_a_missing_corpus_is_built_by_its_prepare_command(tmp_path):
    """A corpus dir without shards is built once by its prepare command, started with the runs' interpreter (its
    leading `python` only: `--source python` is a word of the command)."""
    from speedrun.bench.spec import Corpus

    out = tmp_path / "ds"
    make = (
        "import pathlib, sys; d = pathlib.Path(sys.argv[1]); d.mkdir(); "
        "[(d / f'fineweb_{s}_000000.bin').write_bytes(b'') for s in ('train', 'val')]; "
        "(d / 'argv.txt').write_text(' '.join(sys.argv[2:]))"
    )
    corpus = Corpus(data="mine", path=str(out), tokenizer=str(out / "tok.model"), prepare=("python", "-c", make, str(out), "--source", "python"))  # fmt: skip
    check = Check("c", "C.", (RunArm("a", ()),), (Value("a", "steps", ">=", 1),), ("steps",), corpus=corpus)
    lines: list[str] = []
    assert prepare_corpus(check, Options(work=tmp_path / "work"), lines.append) is None
    assert (out / "argv.txt").read_text() == "--source python" and lines[0].startswith("preparing mine: ")
    assert prepare_corpus(check, Options(work=tmp_path / "work"), lines.append) is None and len(lines) == 1


# ---------------------------------------------------------------------------------------------------------
# the dist_resume check's comparison


def _run(path: Path, losses: dict[int, float], tokens_per_s: float, log: str) -> Path:
    path.mkdir()
    result = {
        "status": "ok",
        "steps": max(losses),
        "tokens_per_s": tokens_per_s,
        "world_size": 4,
        "device_name": "H100",
    }
    (path / "result.json").write_text(json.dumps(result))
    lines = [json.dumps({"step": s, "tokens": 10 * s, "train_loss": v}) for s, v in sorted(losses.items())]
    lines.append(json.dumps({"step": max(losses), "val_loss": 3.0}))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (path / "run.log").write_text(log)
    return path


def test_compare_reads_the_resume_step_the_saves_and_the_loss_gap(tmp_path):
    full = _run(tmp_path / "full", {1: 5.0, 2: 4.0, 3: 3.5, 4: 3.2}, 1000.0, "")
    log = (
        "[t] checkpoint at step 2: /r/checkpoints/step_00000002.pt (1.5s, not in train time)\n"
        "[t] interrupted: signal 15 at step 2\n"
        "[t] resumed from /r/checkpoints/step_00000002.pt: step 2, 20 tokens, 9.0 train seconds done\n"
        "[t] checkpoint at step 4: /r/checkpoints/step_00000004.pt (2.5s, not in train time)\n"
    )
    resumed = _run(tmp_path / "resumed", {1: 5.0, 2: 4.0, 3: 3.5, 4: 3.25}, 990.0, log)
    out = resume_check.compare(resume_check.read_run(full), resume_check.read_run(resumed))
    assert out["resumed_from_step"] == 2 and out["steps_compared"] == 4
    assert out["max_train_loss_diff"] == pytest.approx(0.05)
    assert out["tokens_per_s_ratio"] == pytest.approx(0.99)
    assert out["checkpoints"] == 2 and out["checkpoint_write_s"] == {"mean": 2.0, "max": 2.5}
    assert resume_check.resume_metrics(full, resumed) == {
        "resumed_from_step": 2,
        "max_train_loss_diff": pytest.approx(0.05),
        "checkpoint_write_s": 2.5,
    }
    assert resume_check.resume_metrics(full, tmp_path / "missing")["max_train_loss_diff"] is None


GATED_PEER = """\
import pathlib, time
speedrun_log = pathlib.Path("../../speedrun/s0_p1.log")  # the arm beside it, in its own run dir's log
t0 = time.monotonic()
while "start gate: waiting" not in (speedrun_log.read_text() if speedrun_log.exists() else ""):
    if time.monotonic() - t0 > 120:
        raise SystemExit("the speedrun arm never reached its start gate")
    time.sleep(0.1)
print("peer training starts", flush=True)
print("step:10/20000 train_loss:3.0000 train_time:2000ms step_avg:200.00ms")
"""


def test_a_speedrun_arm_beside_a_peer_trains_only_once_the_peer_does(tmp_path, capsys):
    """In a parallel wave with a peer, a speedrun arm waits at its start gate after its warm-up and starts its
    timed training once the peer logs its first step; the fake peer here starts only after it sees speedrun
    waiting, so a gate that opened early, or never, fails the run."""
    if GPU_HERE:
        pytest.skip("the check below is declared for a CPU machine")
    script = tmp_path / "train_gpt.py"
    script.write_text(GATED_PEER)
    peer = PeerArm("peer", peer="fake", source="a test", parser="pgolf_baseline", env={"TRAIN_BATCH_TOKENS": "1000"})
    check = Check(
        "gated_pair", "speedrun beside a peer.", (RunArm("speedrun", ("debug=smoke",)), peer),
        (Ratio("tokens_per_s", "speedrun", "peer", ">=", 0.0),), ("tokens_per_s", "startup_seconds"),
        cards=("cpu",), parallel=True, timeout_s=180,
    )  # fmt: skip
    opts = Options(peers={"fake": script}, results=tmp_path / "results", work=tmp_path / "work", overrides=tuple(TINY))
    status, path = run_check(check, opts, say=lambda line: None)
    assert path is not None
    r = json.loads(path.read_text())
    for arm in ("speedrun", "peer"):
        (run,) = r["arms"][arm]["runs"]
        assert run["status"] == "ok", run["log_tail"]
        assert 0 < run["metrics"]["startup_seconds"] <= run["seconds"]
    log = Path(r["arms"]["speedrun"]["runs"][0]["log"]).read_text()
    waiting, opened = log.index("start gate: waiting for"), log.index("start gate open after")
    assert log.index("] ready to train") < waiting < opened < log.index("] step ")
    (gated,), (peer_run,) = r["arms"]["speedrun"]["runs"], r["arms"]["peer"]["runs"]
    assert gated["start_gate_seconds"] > 0 and "start_gate_seconds" not in peer_run
    assert (tmp_path / "work" / "gated_pair" / "start_gate_s0_p1").is_file()
    main(["--dry-run", "record_vs_pgolf"])  # the real pair: its speedrun arm is gated, the record script not
    speedrun_line, record_line = [ln for ln in capsys.readouterr().out.splitlines() if "PYTHONUNBUFFERED" in ln]
    assert "SPEEDRUN_START_GATE=" in speedrun_line and "SPEEDRUN_START_GATE" not in record_line


def test_a_run_past_its_timeout_is_stopped_and_its_ready_line_still_timed(tmp_path):
    """execute(): runs start at once; one past the timeout is stopped (exit code None) with its ready time kept, one
    that ends without its ready line has none."""
    slow = "import time; print('loading', flush=True); time.sleep(0.6); print('GO', flush=True); time.sleep(60)"
    steps = [
        Step(RunArm(name, ()), 0, 0, (sys.executable, "-c", code), {}, tmp_path, tmp_path / name,
             tmp_path / f"{name}.log", ready=r"^GO$")
        for name, code in (("slow", slow), ("quick", "print('done')"))
    ]  # fmt: skip
    (stopped, quick) = execute(steps, timeout_s=3.0)
    assert stopped.rc is None and 3.0 <= stopped.seconds < 40 and 0.6 <= stopped.ready_s <= 0.6 + 2 * POLL_S + 0.5
    assert quick.rc == 0 and quick.ready_s is None and quick.seconds < 3.0


def test_a_peer_with_no_ready_line_cannot_stand_beside_a_gated_speedrun_arm(tmp_path):
    peer = PeerArm("peer", peer="fake", source="a test", parser="no_such_parser")
    check = Check(
        "ungateable", "speedrun beside a peer whose start nobody can see.", (RunArm("speedrun", ()), peer),
        (Ratio("tokens_per_s", "speedrun", "peer", ">=", 0.0),), ("tokens_per_s",), cards=("cpu",), parallel=True,
    )  # fmt: skip
    with pytest.raises(ValueError, match="no first training-step line.*READY_LINES"):
        plan(check, Options(work=tmp_path), hw.detect())
