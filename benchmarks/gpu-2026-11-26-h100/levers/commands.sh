#!/usr/bin/env bash
# issue 21 experiments, one call
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >$OUT/install.txt 2>&1
export PYTHONPATH=$PWD
t() { local n=$1; shift; local s=$SECONDS; timeout ${TMO:-150} "$@" >$OUT/$n.txt 2>&1; echo "$n: exit $?, $((SECONDS-s)) s" | tee -a $OUT/summary.txt; grep -E "tokens/s|ratio|median|cosine" $OUT/$n.txt | head -20; }
B="python3 scripts/bench_pretrain.py --preset base --seq 128 --device cuda"
t abl_base $B --batch 256 --ablate --profile 15
t base_compiled $B --batch 256 --compile
t abl_b64 $B --batch 64 --ablate
t b64_cg $B --batch 64 --compile --compile-mode reduce-overhead
TMO=120 t large_unpad python3 scripts/bench_pretrain.py --preset large --seq 512 --batch 32 --device cuda --lengths real --unpad
R=$(mktemp -d)
python3 -m bertcli init $R/base --preset base >/dev/null 2>&1
C=(--set train.max_steps=60 --set logging.log_every=20 --set checkpoint.save_every=60 --set train.eval_every=60 --quiet)
t e2e_64x4 python3 -m bertcli pretrain --config $R/base/config.yaml "${C[@]}" --set output_dir=$R/a
t e2e_256x1 python3 -m bertcli pretrain --config $R/base/config.yaml "${C[@]}" --set output_dir=$R/b --set train.batch_size=256 --set train.grad_accum_steps=1
for r in a b; do echo "== $r"; grep '"train"' $R/$r/metrics.jsonl | tail -2 | cut -c1-400; grep '"eval"' $R/$r/metrics.jsonl | tail -1; done | tee $OUT/e2e_metrics.txt
TMO=200 t encode python3 scripts/bench_encode.py --gpu --model .gpu/minilm --corpus .gpu/python-docs.txt --short 20000 --paragraphs 10000 --rounds 2 --batch-size 128
