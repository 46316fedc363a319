"""Speed and memory of `bertcli prepare`, side by side with the bare `tokenizers` batch encoding.

    python scripts/bench_prepare.py [--corpus ../shared/corpora/python-docs.txt] [--repeat 3]

In one run, on the same text and with the same trained tokenizer:
  bare       tokenizers' own batch encoding (encode_batch_fast where available) of the corpus
             lines, already in memory, in batches of the size prepare uses: the tokenizer alone
  encode     `prepare` with that tokenizer (reading, UTF-8 checks, sentence splitting, encoding,
             writing shards and manifest): the whole pipeline minus tokenizer training
  full       `prepare` from scratch, training the tokenizer too
Reports median tokens/s over --repeat runs and encode/bare (the goal is >= 0.5). Then peak
resident memory of `bertcli prepare` as a separate process, on the corpus and on a copy four
times its size, next to the memory of a process that only imports the same modules.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bertcli.config_load import preset_config
from bertcli.config_write import preset_header, to_yaml
from bertcli.data.prepare import ENCODE_BATCH, load_prepared, prepare
from bertcli.data.text import read_sentences
from bertcli.resolve import resolve

REPO = Path(__file__).resolve().parents[1]


def write_config(folder: Path, corpus: Path, *extra: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    cfg = preset_config("tiny", [f"data.corpus={corpus}", *extra])
    path.write_text(to_yaml(cfg, preset_header("tiny")))
    return path


def peak_rss_mib(command: list[str]) -> float:
    """Peak resident memory of `command`, in MiB, measured by a wrapper process of its own (so one
    measurement never sees another's children; ru_maxrss is in KiB on Linux)."""
    wrapper = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", wrapper, *command], check=True, capture_output=True, text=True)
    return int(out.stdout) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "corpora" / "python-docs.txt")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if not args.corpus.is_file():
        sys.exit(f"bench_prepare: {args.corpus} not found; pass --corpus")
    work = Path(tempfile.mkdtemp(prefix="bench_prepare."))
    corpus_bytes = args.corpus.stat().st_size

    full, encode, bare = [], [], []
    trained = None
    for r in range(args.repeat):
        config = write_config(work / f"full{r}", args.corpus)
        start = time.perf_counter()
        folder = prepare(resolve(preset_config("tiny", [f"data.corpus={args.corpus}",
                                                         f"data.prepared_dir={work / f'full{r}' / 'data'}"]),
                                 config.parent), quiet=True, force=True)
        elapsed = time.perf_counter() - start
        tokens = sum(s["tokens"] for s in load_prepared(folder).manifest["splits"].values())
        full.append(tokens / elapsed)
        trained = trained or folder / "tokenizer.json"

        cfg = preset_config("tiny", [f"data.corpus={args.corpus}", f"data.tokenizer.path={trained}",
                                     f"data.prepared_dir={work / f'enc{r}'}"])
        start = time.perf_counter()
        folder = prepare(resolve(cfg, write_config(work / f"enc{r}cfg", args.corpus).parent), quiet=True, force=True)
        elapsed = time.perf_counter() - start
        encode_tokens = sum(s["tokens"] for s in load_prepared(folder).manifest["splits"].values())
        encode.append(encode_tokens / elapsed)

        tokenizer = load_prepared(folder).tokenizer
        fast = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
        lines = [s for s in read_sentences([args.corpus]) if s is not None]  # the same sentences, in memory
        start = time.perf_counter()
        count = 0
        for i in range(0, len(lines), ENCODE_BATCH):
            count += sum(len(e.ids) for e in fast(lines[i:i + ENCODE_BATCH], add_special_tokens=False))
        bare.append(count / (time.perf_counter() - start))

    big = work / "corpus-x4.txt"
    text = args.corpus.read_bytes()
    big.write_bytes(text + b"\n\n" + text + b"\n\n" + text + b"\n\n" + text)
    imports = peak_rss_mib([sys.executable, "-c", "import bertcli.cli, bertcli.data.prepare, tokenizers, numpy"])
    mem1 = peak_rss_mib([sys.executable, "-m", "bertcli", "prepare", "--config",
                         str(write_config(work / "mem1", args.corpus)), "--quiet", "--force"])
    mem4 = peak_rss_mib([sys.executable, "-m", "bertcli", "prepare", "--config",
                         str(write_config(work / "mem4", big)), "--quiet", "--force"])

    med = statistics.median
    print(f"corpus: {args.corpus} ({corpus_bytes / 1e6:.2f} MB, {encode_tokens:,} tokens), {args.repeat} runs, median")
    print(f"{'what':<44} {'tokens/s':>12}")
    print(f"{'bare tokenizers batch encoding':<44} {med(bare):>12,.0f}")
    print(f"{'bertcli prepare, given the tokenizer':<44} {med(encode):>12,.0f}")
    print(f"{'bertcli prepare, training the tokenizer too':<44} {med(full):>12,.0f}")
    print(f"ratio prepare/bare: {med(encode) / med(bare):.2f} (goal >= 0.5)")
    print(f"peak RSS: imports only {imports:.0f} MiB; prepare {mem1:.0f} MiB on {corpus_bytes / 1e6:.1f} MB; "
          f"{mem4:.0f} MiB on {4 * corpus_bytes / 1e6:.1f} MB (4x)")


if __name__ == "__main__":
    main()
