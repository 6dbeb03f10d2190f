#!/usr/bin/env bash
# GPU smoke of the hf backend: one trainer and one generation worker share one GPU (num_gpus 0.5 each) and train
# a Hugging Face causal LM; bundles are cut, the run is SIGKILLed mid-training, a rerun resumes, the newest bundle
# is verified and exported, and the figures are printed. Nothing is downloaded.
# Usage: ops/gpu-smoke.sh [MODEL_DIR] [WORK_DIR]
#   MODEL_DIR  a local HF model directory (default: a tiny random Llama built into WORK_DIR/model)
#   WORK_DIR   scratch (default: a new /tmp/sc-app-gpu-smoke.* directory, kept for inspection)
# Env: GPU_SMOKE_STEPS (default 40), GPU_SMOKE_SAVE_PERIOD (5), SC_APP_PYTHON (default .venv/bin/python),
#   GPU_SMOKE_VLLM (1: also the vLLM engine runs, fresh + resume), GPU_SMOKE_WEIGHT_SYNC (object_store | nccl).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${SC_APP_PYTHON:-${repo}/.venv/bin/python}"
work="${2:-$(mktemp -d /tmp/sc-app-gpu-smoke.XXXXXX)}"
model="${1:-${work}/model}"
steps="${GPU_SMOKE_STEPS:-40}"
period="${GPU_SMOKE_SAVE_PERIOD:-5}"
ckpt="${work}/ckpt"
trace="${work}/trace.jsonl"

say() { printf '[gpu-smoke] %s\n' "$*" >&2; }
fail() { say "FAIL: $*"; exit 1; }

# The node floor of the image's CUDA 13 build (driver R580+, compute capability >= 7.5; docs/vllm.md "GPU nodes"):
# the one line every worker given GPUs would stop the run with, from what torch.cuda and nvidia-smi report here.
floor=$("${py}" -c 'from sc_app.rl.backend import probe_gpu; from sc_app.rl.gpu_floor import check
print(check(probe_gpu(1)) or "ok")') || fail "could not probe the GPU floor"
[[ "${floor}" == ok ]] || fail "${floor}"
say "GPU floor ok: $(nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2> /dev/null | head -n 1)"
"${py}" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
  || fail "torch sees no GPU (install the CUDA build of torch 2.13.0 and check nvidia-smi)"
mkdir -p "${work}"
if [[ ! -d "${model}" ]]; then
  say "no MODEL_DIR given: building a tiny random model in ${model}"
  "${py}" -m sc_app.rl.hf.random_model "${model}" > /dev/null
fi

settings=(
  --checkpoint-dir "${ckpt}"
  --set model.backend=hf --set "model.path=${model}"
  --set trainer.num_gpus=0.5 --set generation.num_gpus=0.5
  --set trainer.num_cpus=1 --set generation.num_cpus=1
  --set "checkpoint.save_period=${period}" --set "run.trace_file=${trace}"
)
run() { "${py}" -m sc_app run "${settings[@]}" "$@"; }

say "run A: fresh, to step $(( steps / 2 ))"
t0=$(date +%s)
run --max-steps "$(( steps / 2 ))" | tee "${work}/run_a.log"
say "run A took $(( $(date +%s) - t0 ))s"

say "run B: resumes, SIGKILLed once a bundle past step $(( steps / 2 )) exists and training went on"
setsid "${py}" -m sc_app run "${settings[@]}" --max-steps 100000 > "${work}/run_b.log" 2>&1 &
sid=$!
target=$(( steps / 2 + period ))
deadline=$(( $(date +%s) + 900 ))
until [[ -d "${ckpt}/step_${target}" ]] && grep -qE "^step +$(( target + 1 ))/" "${work}/run_b.log"; do
  (( $(date +%s) < deadline )) || { pkill -KILL -s "${sid}" || true; fail "run B never passed step ${target}"; }
  kill -0 "${sid}" 2> /dev/null || fail "run B exited early: $(tail -3 "${work}/run_b.log")"
  sleep 1
done
pkill -KILL -s "${sid}" || true
wait "${sid}" 2> /dev/null || true
say "run B killed after: $(grep -E '^step ' "${work}/run_b.log" | tail -1)"

say "run C: resumes after the kill, to step ${steps}"
t0=$(date +%s)
run --max-steps "${steps}" | tee "${work}/run_c.log"
resume_s=$(( $(date +%s) - t0 ))
grep -q "resuming from" "${work}/run_c.log" || fail "run C did not resume"

"${py}" -m sc_app ckpt verify --checkpoint-dir "${ckpt}"
rm -rf "${work}/export"
"${py}" -m sc_app export --checkpoint-dir "${ckpt}" --out "${work}/export"

say "figures"
"${py}" - "${work}" "${model}" <<'PY'
import json, re, sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

work, model_dir = Path(sys.argv[1]), sys.argv[2]
events = [json.loads(line) for line in (work / "trace.jsonl").read_text().splitlines() if line.strip()]
starts = [e for e in events if e["ev"] == "start"]
print(f"runs: {len(starts)}; resumed at steps {[s['step'] for s in starts[1:]]}")
for s in starts[1:]:
    print(f"  restored policy fingerprint at step {s['step']}: {s.get('restored_policy')}")
for name in ("run_a.log", "run_c.log"):
    text = (work / name).read_text()
    steps = [float(x) for x in re.findall(r"^step +\d+/\d+ +reward [0-9.]+ .* ([0-9.]+)s$", text, re.M)]
    saves = re.findall(r"saved (step_\d+) \(([0-9.]+)s, training paused (\d+) ms", text)
    if steps:
        print(f"{name}: median step {sorted(steps)[len(steps) // 2]:.3f}s over {len(steps)} steps")
    for bundle, secs, paused in saves:
        print(f"  {bundle}: save {secs}s, training paused {paused} ms")
    done = re.search(r"^done: .*$", text, re.M)
    if done:
        print(f"  {done.group(0)}")
newest = max((p for p in (work / "ckpt").glob("step_*")), key=lambda p: int(p.name.split("_")[1]))
policy = sum(p.stat().st_size for p in (newest / "policy").rglob("*") if p.is_file())
print(f"newest bundle {newest.name}: policy {policy / 2**20:.1f} MiB")
exported = AutoModelForCausalLM.from_pretrained(work / "export", dtype=torch.bfloat16).cuda()
ids = torch.tensor([[1, 5, 6, 7, 8]], device="cuda")
with torch.no_grad():
    print(f"export loads on the GPU; logits {tuple(exported(ids).logits.shape)}")
print(f"GPU memory peak in this process: {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")
PY
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
say "resume run took ${resume_s}s; everything is in ${work}"

# vLLM engine (generation.engine=vllm, docs/vllm.md): a fresh run, then a resume, on the same GPU (the engine
# takes generation.gpu_memory_utilization of it). Needs the CUDA vllm (the image has it) and GPU_SMOKE_VLLM != 0.
if [[ "${GPU_SMOKE_VLLM:-1}" != 0 ]]; then
  "${py}" -c 'import vllm' 2> /dev/null || fail "vllm is not installed (the image installs it; pip install vllm==0.32.0)"
  vckpt="${work}/ckpt-vllm"
  vsettings=(
    --checkpoint-dir "${vckpt}"
    --set model.backend=hf --set "model.path=${model}" --set generation.engine=vllm
    --set generation.gpu_memory_utilization=0.3 --set "generation.weight_sync=${GPU_SMOKE_WEIGHT_SYNC:-object_store}"
    --set "grpo.old_logprobs=$([[ "${GPU_SMOKE_WEIGHT_SYNC:-}" == nccl ]] && echo engine || echo trainer)"
    --set trainer.num_gpus=0.5 --set generation.num_gpus=0.5
    --set trainer.num_cpus=1 --set generation.num_cpus=1
    --set "checkpoint.save_period=${period}" --set "run.trace_file=${work}/trace-vllm.jsonl"
  )
  say "vLLM run V1: fresh, to step $(( steps / 2 ))"
  t0=$(date +%s)
  "${py}" -m sc_app run "${vsettings[@]}" --max-steps "$(( steps / 2 ))" | tee "${work}/run_v1.log"
  say "vLLM run V1 took $(( $(date +%s) - t0 ))s"
  say "vLLM run V2: resumes, to step ${steps}"
  "${py}" -m sc_app run "${vsettings[@]}" --max-steps "${steps}" | tee "${work}/run_v2.log"
  grep -q "resuming from" "${work}/run_v2.log" || fail "vLLM run V2 did not resume"
  "${py}" - "${work}/trace-vllm.jsonl" <<'PY'
import json, sys
events = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
runs, cur = [], None
for e in events:
    if e["ev"] == "start":
        cur = {"step": e["step"], "versions": []}
        runs.append(cur)
    elif e["ev"] == "rollout":
        cur["versions"].append(e["version"])
for r in runs:
    v = r["versions"]
    assert v and v[0] == r["step"] and v == sorted(v), f"run from step {r['step']}: versions served {v[:8]}..."
    print(f"vLLM run from step {r['step']}: {len(v)} generate calls, first served version {v[0]}, last {v[-1]}")
PY
fi
say "OK"
