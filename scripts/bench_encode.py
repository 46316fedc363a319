"""Lines/s of `bertcli encode` against transformers' BertModel, side by side in one run.

    python scripts/bench_encode.py --model runs/demo [--lines 4000] [--batch-size 32] [--repeat 3] [--device cpu]

Both encode the same lines (sentences of the corpus file, varied lengths) with the same weights
(bertcli's checkpoint, exported for transformers), the same batch size and [CLS] pooling, in fp32.
bertcli: `encode()` as the command runs it, JSON Lines formatting included (to memory).
transformers: AutoTokenizer + BertModel (attn_implementation="sdpa") under torch.inference_mode,
batches in input order padded to their longest line, vectors copied to numpy (no formatting).
Reports the median lines/s of --repeat timed passes after one warm-up pass, and the ratio.
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers

from bertcli.data.text import read_sentences
from bertcli.encode import Writer, encode, load_encoder
from bertcli.hf import export

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a bertcli run or checkpoint folder")
    parser.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "corpora" / "python-docs.txt")
    parser.add_argument("--lines", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    lines = []
    for s in read_sentences([args.corpus]):
        if s is not None:
            lines.append(s)
        if len(lines) == args.lines:
            break
    hf_dir = export(args.model, Path(tempfile.mkdtemp(prefix="bench_encode.")) / "hf")

    ours = load_encoder(args.model, device)

    def run_ours() -> None:
        encode(ours, iter(lines), Writer("jsonl", io.StringIO(), None, False), "cls", -1, False, args.batch_size)

    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    theirs = transformers.BertModel.from_pretrained(hf_dir, attn_implementation="sdpa").to(device).eval()
    limit = ours.max_length

    def run_theirs() -> None:
        with torch.inference_mode():
            for i in range(0, len(lines), args.batch_size):
                batch = tokenizer(lines[i:i + args.batch_size], padding=True, truncation=True, max_length=limit,
                                  return_tensors="pt").to(device)
                theirs(**batch).last_hidden_state[:, 0].float().cpu().numpy()

    results = {}
    for name, fn in (("bertcli encode", run_ours), ("transformers BertModel", run_theirs)):
        fn()  # warm-up
        times = []
        for _ in range(args.repeat):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        results[name] = len(lines) / statistics.median(times)
    cfg = ours.model.config
    print(f"model: {args.model} ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}); {len(lines):,} lines of "
          f"{args.corpus.name}; batch {args.batch_size}; [CLS] pooling; fp32; device {device}; "
          f"torch {torch.__version__}, transformers {transformers.__version__}; {torch.get_num_threads()} threads")
    for name, rate in results.items():
        print(f"{name:<24} {rate:>10,.0f} lines/s")
    print(f"ratio bertcli/transformers: {results['bertcli encode'] / results['transformers BertModel']:.2f} (goal >= 1.0)")


if __name__ == "__main__":
    main()
