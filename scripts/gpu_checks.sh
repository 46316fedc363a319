#!/usr/bin/env bash
# Every GPU check of the project in one call, for a machine with a CUDA GPU and torch installed:
#   OUT=/some/folder bash scripts/gpu_checks.sh
# Writes one file per check into $OUT (default gpu_checks/) and a summary of exit codes; a check
# that fails does not stop the others. What it checks:
#   - the training-step benchmark against transformers: base at 128, large at 512, with profiles;
#     base at 128 again under torch.compile; base and large with real pretraining lengths, padded
#     against unpadded (train.unpad);
#   - end to end: the base preset on the bundled sample for 60 steps in bf16 (tokens/s, MFU and
#     peak memory land in metrics.jsonl), in fp16 with the grad scaler, compiled, unpadded, and with FSDP
#     under torchrun on every visible GPU.
# PRESET, STEPS and GPUS override the run size and process count (PRESET=tiny STEPS=4 GPUS=2 is a
# quick smoke run of the script itself on a CPU, where the benchmarks then fail for want of CUDA).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_checks}
mkdir -p "$OUT"
# --no-build-isolation: GPU machines are often offline, and an isolated build would fetch setuptools
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.txt" 2>&1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the scripts import bertcli even if the install failed
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
GPUS=${GPUS:-$(python3 -c "import torch; print(torch.cuda.device_count())")}
PRESET=${PRESET:-base}
STEPS=${STEPS:-60}

check() {  # check NAME COMMAND...: run it, keep its output, record its exit code
  local name=$1; shift
  local start=$SECONDS
  "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  echo "$name: exit $rc, $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
}

check bench_base python3 scripts/bench_pretrain.py --preset base --seq 128 --batch 256 --device cuda --profile 15
check bench_large python3 scripts/bench_pretrain.py --preset large --seq 512 --batch 32 --device cuda --profile 15
check bench_base_compiled python3 scripts/bench_pretrain.py --preset base --seq 128 --batch 256 --device cuda --compile
# Rows of real pretraining lengths, padded against unpadded (train.unpad; attention dropout 0 for all)
check bench_base_unpad python3 scripts/bench_pretrain.py --preset base --seq 128 --batch 256 --device cuda --lengths real --unpad
check bench_large_unpad python3 scripts/bench_pretrain.py --preset large --seq 512 --batch 32 --device cuda --lengths real --unpad --profile 15

RUNS=$(mktemp -d)  # checkpoints stay out of $OUT; their metrics are copied below
COMMON=(--set train.max_steps="$STEPS" --set logging.log_every=20 --set checkpoint.save_every="$STEPS"
        --set train.eval_every="$STEPS" --set train.batch_size=64 --quiet)
python3 -m bertcli init "$RUNS/base" --preset "$PRESET" --force >"$OUT/init.txt" 2>&1
check run_bf16 python3 -m bertcli pretrain --config "$RUNS/base/config.yaml" "${COMMON[@]}" --set output_dir="$RUNS/base/bf16" --set precision.mode=bf16
check run_fp16 python3 -m bertcli pretrain --config "$RUNS/base/config.yaml" "${COMMON[@]}" --set output_dir="$RUNS/base/fp16" --set precision.mode=fp16
check run_compiled python3 -m bertcli pretrain --config "$RUNS/base/config.yaml" "${COMMON[@]}" --set output_dir="$RUNS/base/compiled" --set train.compile=true
check run_unpadded python3 -m bertcli pretrain --config "$RUNS/base/config.yaml" "${COMMON[@]}" --set output_dir="$RUNS/base/unpadded" \
  --set train.unpad=true --set model.attention_probs_dropout_prob=0
check run_fsdp python3 -m torch.distributed.run --standalone --nproc_per_node "$GPUS" -m bertcli pretrain \
  --config "$RUNS/base/config.yaml" "${COMMON[@]}" --set output_dir="$RUNS/base/fsdp" --set train.parallel=fsdp
for run in bf16 fp16 compiled unpadded fsdp; do
  echo "== $run" >>"$OUT/metrics.txt"
  tail -n 3 "$RUNS/base/$run/metrics.jsonl" >>"$OUT/metrics.txt" 2>&1
done

# One bundle of every file above, for transports that bring back only a few files.
tar czf "$OUT/all_checks.tar.gz" -C "$OUT" --exclude all_checks.tar.gz . 2>/dev/null
rm -rf "$RUNS"
