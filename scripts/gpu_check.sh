#!/usr/bin/env bash
# gptlab on a GPU, end to end, in under 5 minutes on one GPU (issue #13.5):
#
#   bash scripts/gpu_check.sh                          # one GPU: real sizes
#   GPU_CHECK_DEVICE=cpu bash scripts/gpu_check.sh     # the same sequence on CPU, tiny sizes (~1 min)
#
# 1. default     gptlab-train trainer=gpu                        (the default run, bf16-mixed)
# 2. large       a larger model: d_model 512, 8 blocks, 8 heads, context 256, batch 64,
#                bf16-mixed, model.compile=true
# 3. ddp         gptlab-train trainer=ddp trainer.devices=1      (the DDP path on one device)
# 4. generate    gptlab-generate ckpt_path=<the default run's directory>
#
# For each training run it prints tokens/s and MFU from the run's metrics.json (tokens_per_sec,
# mfu: "n/a" where the device's peak is unknown, e.g. on CPU), and the steady rate: the median
# of the run's logged vitals/tokens_per_sec over its second half (metrics.json's rate counts the
# first steps too, which carry torch.compile's compilation and CUDA's warm-up). For generation:
# tokens/s from gptlab-generate's log. A compact table comes at the end; the exit code is 1 if
# any step failed (every step still runs; generation needs the default run's checkpoint).
#
# Environment: GPU_CHECK_DIR (the runs and logs; default outputs/gpu_check/<date>_<time>),
# GPU_CHECK_STEP_TIMEOUT (seconds per step; default 240 on GPU, 300 on CPU), PYTHON (default:
# python). Offline: GPTLAB_DATA_DIR and TIKTOKEN_CACHE_DIR, else ./shared or ../shared (data/,
# tiktoken_cache/) when present.
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
device=${GPU_CHECK_DEVICE:-gpu}
py=${PYTHON:-python}
out=${GPU_CHECK_DIR:-outputs/gpu_check/$(date +%Y-%m-%d_%H-%M-%S)}
mkdir -p "$out/logs" && out=$(cd "$out" && pwd)

for shared in "$repo/shared" "$repo/../shared"; do
    if [ -z "${GPTLAB_DATA_DIR:-}" ] && [ -f "$shared/data/sales_textbook.txt" ]; then
        export GPTLAB_DATA_DIR="$shared/data"
    fi
    if [ -z "${TIKTOKEN_CACHE_DIR:-}" ] && [ -d "$shared/tiktoken_cache" ]; then
        export TIKTOKEN_CACHE_DIR="$shared/tiktoken_cache"
    fi
done
export PYTHONUNBUFFERED=1

case "$device" in
gpu)
    timeout_s=${GPU_CHECK_STEP_TIMEOUT:-240}
    "$py" -c "import torch, sys; ok = torch.cuda.is_available(); print('torch', torch.__version__, 'GPU:', \
torch.cuda.get_device_name(0) if ok else 'none'); sys.exit(0 if ok else 1)" \
        || { echo "gpu_check: torch sees no CUDA GPU (GPU_CHECK_DEVICE=cpu runs the CPU variant)" >&2; exit 2; }
    accel=()
    default=()                                                    # the default run as it is
    large=(model.d_model=512 model.num_blocks=8 model.num_heads=8 data.context_length=256 data.batch_size=64
           trainer.max_steps=300 trainer.val_check_interval=100)
    ddp=(trainer.max_steps=300 trainer.val_check_interval=100)
    generate=(device=cuda max_new_tokens=200 num_samples=2)
    what_default="the default run, bf16-mixed"
    what_large="d_model 512, 8 blocks, 8 heads, ctx 256, batch 64, bf16-mixed, compile, 300 steps"
    what_ddp="the default model, 300 steps"
    ;;
cpu)
    timeout_s=${GPU_CHECK_STEP_TIMEOUT:-300}
    accel=(trainer.accelerator=cpu)
    few=(trainer.max_steps=4 trainer.val_check_interval=2 trainer.limit_val_batches=2
         trainer.num_sanity_val_steps=0 trainer.log_every_n_steps=1 callbacks.text_sample.max_new_tokens=4)
    default=("${few[@]}")
    large=(model.d_model=32 model.num_blocks=1 model.num_heads=2 data.context_length=16 data.batch_size=4
           "${few[@]}")
    ddp=("${few[@]}")
    generate=(device=cpu max_new_tokens=16 num_samples=1)
    what_default="on CPU: the default model, bf16-mixed, 4 steps"
    what_large="on CPU, tiny: d_model 32, 1 block, ctx 16, batch 4, bf16-mixed, compile, 4 steps"
    what_ddp="on CPU: the default model, 4 steps"
    ;;
*)
    echo "gpu_check: GPU_CHECK_DEVICE=$device: use gpu or cpu" >&2
    exit 2
    ;;
esac

status=0
declare -A result

# run NAME CMD...: one step, its output in logs/NAME.log; records ok/FAILED
run() {
    local name=$1
    shift
    echo "[gpu_check] $name: $*" >&2
    local began=$SECONDS
    if timeout "$timeout_s" "$@" >"$out/logs/$name.log" 2>&1; then
        result[$name]=ok
    else
        local rc=$?
        result[$name]="FAILED (exit $rc$([ $rc = 124 ] && echo ", timed out after ${timeout_s} s"))"
        status=1
        echo "[gpu_check] $name FAILED, last lines of $out/logs/$name.log:" >&2
        tail -n 15 "$out/logs/$name.log" >&2
    fi
    echo "[gpu_check] $name: ${result[$name]} in $((SECONDS - began)) s" >&2
}

train() {
    local name=$1
    shift
    run "$name" "$py" -m gptlab.cli.train "$@" ${accel[@]+"${accel[@]}"} "hydra.run.dir=$out/$name"
}

total_began=$SECONDS
train default trainer=gpu ${default[@]+"${default[@]}"}
train large trainer=gpu model.compile=true "${large[@]}"
train ddp trainer=ddp trainer.devices=1 "${ddp[@]}"
if [ "${result[default]}" = ok ]; then
    run generate "$py" -m gptlab.cli.generate "ckpt_path=$out/default" "${generate[@]}" \
        "hydra.run.dir=$out/generate"
else
    result[generate]="FAILED (no checkpoint: the default run failed)"
    status=1
fi

# the table: tokens/s and MFU from each run's metrics.json, the steady rate from its TensorBoard scalars
"$py" - "$out" "$device" "$((SECONDS - total_began))" \
    "default=${result[default]}" "large=${result[large]}" "ddp=${result[ddp]}" \
    "generate=${result[generate]}" "@default=trainer=gpu: $what_default" \
    "@large=trainer=gpu model.compile=true: $what_large" "@ddp=trainer=ddp trainer.devices=1: $what_ddp" \
    "@generate=gptlab-generate ckpt_path=<the default run>" <<'EOF' | tee "$out/summary.txt"
import json
import re
import statistics
import sys
from pathlib import Path

out, device, seconds = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
pairs = [arg.split("=", 1) for arg in sys.argv[4:]]
results = {k: v for k, v in pairs if not k.startswith("@")}
what = {k[1:]: v for k, v in pairs if k.startswith("@")}


def fmt(value, digits=0):
    if value is None:
        return "n/a"
    return f"{value:.{digits}%}" if digits else f"{value:,.0f}"


def steady_rate(run_dir: Path):
    """Median of the logged vitals/tokens_per_sec over the run's second half (None: none logged)."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
        acc.Reload()
        values = [e.value for e in acc.Scalars("vitals/tokens_per_sec")]
    except Exception:  # no TensorBoard events, no such tag
        return None
    return statistics.median(values[len(values) // 2:]) if values else None


rows = [("step", "status", "steps", "tokens/s", "MFU", "steady tokens/s", "steady MFU", "what")]
for name in ("default", "large", "ddp"):
    status, metrics_file = results[name], out / name / "metrics.json"
    if not metrics_file.is_file():
        rows.append((name, status, "", "", "", "", "", what[name]))
        continue
    m = json.loads(metrics_file.read_text())
    rate, mfu = m.get("tokens_per_sec"), m.get("mfu")
    steady = steady_rate(out / name)
    steady_mfu = mfu * steady / rate if mfu is not None and steady and rate else None
    rows.append((name, status, str(m.get("steps", "")), fmt(rate), fmt(mfu, 2), fmt(steady),
                 fmt(steady_mfu, 2), what[name]))
log = out / "logs" / "generate.log"
found = re.findall(r"([\d,.]+) tokens/s", log.read_text(errors="replace")) if log.is_file() else []
rate = float(found[-1].replace(",", "")) if found else None
rows.append(("generate", results["generate"], "", fmt(rate), "", "", "", what["generate"]))
widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
print(f"gpu_check on {device}: {out} ({seconds} s)")
for row in rows:
    print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
EOF
[ "${PIPESTATUS[0]}" = 0 ] || status=1
exit $status
