#!/usr/bin/env bash
# GPU check of the model's record levers (issue 23 item 2): every lever on, compiled by inductor under bf16, and the
# layer loop switched on mid-run without a recompile. About 6 minutes on an H100.
#
# On the offline GPU machine (device_env.sh installs the carried wheels and puts src/ on PYTHONPATH):
#   . scripts/device_env.sh && bash scripts/gpu_check_levers.sh
# 1. pgolf_11l with every lever at the record's setting: eager vs torch.compile(fullgraph) loss under bf16, graphs
#    compiled while the loop flips off/on/off/on (2 expected), and the step time with the loop off and on.
# 2. `python -m run` of the same model, levers off and on, 45 train seconds each (loop on at 0.3 of the budget),
#    int6 + zlib, TTT capped at 10 s: status, recompiles (0 expected), stages, tok/s, mfu, val_bpb(_quant, _ttt).
# Writes $OUT/levers/: console.txt and summary.txt. Exits non-zero if a check fails.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
out=${OUT:-/tmp/out}/levers
work=$(mktemp -d /tmp/levers.XXXXXX)
mkdir -p "$out"
log="$out/console.txt"
: >"$log"
levers=(model.mlp_act=leaky_relu2 model.rope_dims=16 model.ln_scale=true model.qk_gain_init=5.0 model.xsa_last_n=11
  model.skip_gates=true model.loop.start=3 model.loop.end=5 model.loop.num=2 model.loop.enable_at=0.3
  model.parallel_start_layer=8 model.smear_gate.window=12 model.attn_out_gate.window=12)

echo "=== 1. compiled model, every lever on" | tee -a "$log"
timeout 300 "$py" - >>"$log" 2>&1 <<'EOF'
import time
import torch
from torch._dynamo.utils import counters
from speedrun.model.attention import get_backend
from speedrun.model.gpt import GPT
from speedrun.model.shape import AttnOutGate, LayerLoop, ModelShape, SmearGate

shape = ModelShape(
    vocab_size=1024, n_layer=11, d_model=512, n_head=8, n_kv_head=4, mlp_mult=4, seq_len=2048, mlp_act="leaky_relu2",
    rope_dims=16, ln_scale=True, qk_gain_init=5.0, xsa_last_n=11, skip_gates=True,
    loop=LayerLoop(start=3, end=5, num=2, enable_at=0.3), parallel_start_layer=8, smear_gate=SmearGate(window=12),
    attn_out_gate=AttnOutGate(window=12),
)
torch.manual_seed(0)
m = GPT(shape, get_backend("sdpa", kernel="cudnn"), doc_bos_id=1).cuda()
with torch.no_grad():
    for p in m.parameters():
        p.add_(0.01 * torch.randn_like(p))
x = torch.randint(0, 1024, (16, 2048), device="cuda")
y = torch.randint(0, 1024, (16, 2048), device="cuda")
compiled = torch.compile(m, fullgraph=True, dynamic=False)
before = counters["stats"]["unique_graphs"]
for looped in (False, True, False, True):
    m.set_loop(looped)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        eager = m(x, y).item()
        loss = compiled(x, y)
    loss.backward()
    m.zero_grad(set_to_none=True)
    print(f"loop {looped}: eager {eager:.5f} compiled {loss.item():.5f}")
    assert abs(eager - loss.item()) < 2e-2, (eager, loss.item())
graphs = counters["stats"]["unique_graphs"] - before
print(f"graphs compiled over off/on/off/on: {graphs}")
assert graphs == 2, graphs
for looped in (False, True):
    m.set_loop(looped)
    for i in range(13):
        if i == 3:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            compiled(x, y).backward()
        m.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) / 10 * 1e3
    print(f"loop {looped}: {ms:.1f} ms per 32k-token fwd+bwd, {x.numel() / ms:.0f}k tok/s")
print("compiled check passed")
EOF
echo "rc=$? (compiled check)" | tee -a "$log"

common=(data.cache_dir="$work/cache" results_db="$work/results.sqlite" logger.log_every_seconds=10 model=pgolf_11l
  model.seq_len=2048 budget.train_seconds=45 eval.tokens=131072 quant=int6 quant.compressor=zlib quant.level=9
  quant.calib_batches=4 ttt=lora ttt.max_seconds=10)
run() {  # run <name> overrides...: one `python -m run` into $work/<name>
  local name=$1
  shift
  echo "=== $name: $*" | tee -a "$log"
  timeout 280 "$py" -m run "${common[@]}" name="$name" hydra.run.dir="$work/$name" "$@" >>"$log" 2>&1
  echo "rc=$? ($name)" | tee -a "$log"
}
run levers_off
run levers_on "${levers[@]}"

"$py" - "$work" <<'EOF' | tee "$out/summary.txt"
import json, sys
from pathlib import Path

work = Path(sys.argv[1])
failures = []
for name in ("levers_off", "levers_on"):
    path = work / name / "result.json"
    r = json.loads(path.read_text()) if path.exists() else {}
    print(f"--- {name}")
    for k in ("status", "device_name", "steps", "tokens_per_s", "mfu", "flops_per_token", "recompiles",
              "compile_seconds", "stages", "val_bpb", "val_bpb_quant", "val_bpb_ttt", "artifact_bytes", "error"):
        if r.get(k) is not None:
            print(f"  {k:<16} {r[k]}")
    plan = json.loads((work / name / "plan.json").read_text()) if (work / name / "plan.json").exists() else {}
    print(f"  {'plan model':<16} {plan.get('model')}")
    if r.get("status") != "ok":
        failures.append(f"{name}: status {r.get('status')}: {r.get('error')}")
    elif r.get("recompiles") != 0:
        failures.append(f"{name}: recompiles {r.get('recompiles')}")
    if name == "levers_on" and r.get("status") == "ok" and not any(s.get("loop") for s in r.get("stages") or []):
        failures.append("levers_on: no stage with the loop on")
print("FAILED: " + "; ".join(failures) if failures else "all lever checks passed")
sys.exit(1 if failures else 0)
EOF
rc=${PIPESTATUS[0]}
rm -rf "$work"
exit "$rc"
