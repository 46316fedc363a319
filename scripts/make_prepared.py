"""Generate a run folder whose prepared data holds N tokens, fast and in bounded memory: for measuring
`pretrain` on corpora of any size (issue 20) without preparing gigabytes of text first.

    python scripts/make_prepared.py /work/big/run-1b --tokens 1e9 [--seed 0] [--set KEY=VALUE ...]
    python -m bertcli pretrain --config /work/big/run-1b/config.yaml --set train.max_steps=5 ...

Writes DIR/config.yaml (the tiny preset, data.corpus: sample, --set overrides applied) and
DIR/data/, prepared data in exactly the format `bertcli prepare` writes, so that `pretrain` and
`inspect` find it up to date and use it as it is:
  1. `prepare` runs for real on the bundled sample (the stand-in corpus): it trains the tokenizer
     (tokenizer.json, vocab.txt, their SHA-256s) and records the sample's hash and the settings in
     the manifest's fingerprint, which is what decides reuse. So the fingerprint is honest about
     the corpus file and the settings; only the shards are synthetic.
  2. The shards of its first unit (units/KEY/train and valid/) are replaced by generated ones of N
     tokens, that unit's counts (unit.json, the manifest) and the totals with theirs, and the index
     (index/DIGEST, the same digest: the same units) is written again from the units, as `prepare`
     writes it; the manifest records `generated_by` (this script and its arguments).
     data.prepared.verify accepts the result (the script runs it at the end).
The generated corpus: documents of 1-200 sentences (log-normal, median 15), sentences of 5-60
tokens (log-normal, median 20), token ids drawn from the unigram distribution of the sample's own
tokens (every id in the vocabulary's range); every k-th document held out, as `prepare` does
(k = 1/data.validation_fraction). Written in blocks of BLOCK_DOCUMENTS documents: memory stays
flat (about 100 MB) whatever N; 1e9 tokens take about a minute and 2.3 GB of disk.

Changing a setting that the fingerprint covers (data.tokenizer.*, data.split_sentences,
data.validation_fraction) in the config makes `prepare` replace the generated shards with the
sample's: pass such settings to this script with --set instead.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from bertcli import store
from bertcli.config_load import preset_config
from bertcli.config_write import preset_header, to_yaml
from bertcli.data.prepare import prepare
from bertcli.data.prepared import load_prepared, read_manifest, verify
from bertcli.data.units import write_index
from bertcli.layout import MANIFEST, SHARD_FILES, SPLITS, UNIT_RECORD, UNITS
from bertcli.resolve import load_run

BLOCK_DOCUMENTS = 1 << 14  # documents generated at once (~9M tokens: ~80 MB of temporaries)


def lognormal_int(rng: np.random.Generator, median: float, sigma: float, low: int, high: int, size: int) -> np.ndarray:
    """`size` integers from a log-normal of `median`, clipped to [low, high] (int64)."""
    return np.clip(np.rint(median * np.exp(sigma * rng.standard_normal(size))), low, high).astype(np.int64)


class Split:
    """One split's three shard files, appended to block by block (the corpus.Corpus layout)."""

    def __init__(self, folder: Path, dtype: np.dtype) -> None:
        folder.mkdir()
        self.dtype = dtype
        self.files = {name: open(folder / name, "wb") for name in SHARD_FILES}
        self.tokens = self.segments = self.documents = 0
        for name in ("seg_offsets.bin", "doc_offsets.bin"):
            self.files[name].write(np.zeros(1, dtype=np.int64).tobytes())

    def add(self, tokens: np.ndarray, lengths: np.ndarray, sentences: np.ndarray) -> None:
        """Documents of `sentences` (D,) sentences of `lengths` (S,) tokens, the ids `tokens` (N,)."""
        self.files["tokens.bin"].write(tokens.astype(self.dtype).tobytes())
        self.files["seg_offsets.bin"].write((self.tokens + np.cumsum(lengths)).tobytes())
        self.files["doc_offsets.bin"].write((self.segments + np.cumsum(sentences)).tobytes())
        self.tokens += int(lengths.sum())
        self.segments += len(lengths)
        self.documents += len(sentences)

    def close(self) -> dict[str, int]:
        for fh in self.files.values():
            fh.flush()
            os.fsync(fh.fileno())
            fh.close()
        return {"documents": self.documents, "segments": self.segments, "tokens": self.tokens}


def generate(
    folder: Path, total: int, validation_fraction: float, unigram: np.ndarray, dtype: np.dtype, seed: int
) -> dict[str, dict[str, int]]:
    """Write train/ and valid/ under `folder`: `total` tokens in documents, every k-th held out."""
    rng = np.random.default_rng(seed)
    splits = {"train": Split(folder / "train", dtype), "valid": Split(folder / "valid", dtype)}
    written = documents = 0
    while written < total:
        sentences = lognormal_int(rng, 15, 1.0, 1, 200, BLOCK_DOCUMENTS)  # (D,) sentences per document
        lengths = lognormal_int(rng, 20, 0.5, 5, 60, int(sentences.sum()))  # (S,) tokens per sentence
        ends = np.cumsum(lengths)
        if written + ends[-1] >= total:  # the last block: cut at `total` tokens, the last sentence shortened
            keep = int(np.searchsorted(ends, total - written, side="left")) + 1  # sentences kept
            lengths = lengths[:keep].copy()
            lengths[-1] -= int(ends[keep - 1]) - (total - written)
            doc_ends = np.cumsum(sentences)
            last = int(np.searchsorted(doc_ends, keep, side="left"))  # the document holding sentence keep-1
            sentences = sentences[: last + 1].copy()
            sentences[-1] -= int(doc_ends[last]) - keep
        tokens = unigram[rng.integers(0, len(unigram), size=int(lengths.sum()))]
        stride = round(1 / validation_fraction) if validation_fraction > 0 else 0  # corpus.is_held_out, vectorised
        held = (
            (np.arange(documents, documents + len(sentences)) % stride == stride - 1)
            if stride
            else np.zeros(len(sentences), dtype=bool)
        )  # (D,) of this block
        seg_doc = np.repeat(held, sentences)  # (S,) whether each sentence is held out
        tok_held = np.repeat(seg_doc, lengths)  # (N,)
        for name, pick, seg_pick, tok_pick in (
            ("train", ~held, ~seg_doc, ~tok_held),
            ("valid", held, seg_doc, tok_held),
        ):
            if pick.any():
                splits[name].add(tokens[tok_pick], lengths[seg_pick], sentences[pick])
        written += int(lengths.sum())
        documents += len(sentences)
        print(f"\r{written / total:6.1%} of {total:,} tokens", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return {name: split.close() for name, split in splits.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="run folder to create (config.yaml and data/)")
    parser.add_argument(
        "--tokens",
        type=float,
        required=True,
        help="generated tokens (train + valid), e.g. 1e9; other units of the sample, if any, keep theirs",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated documents")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override written into config.yaml (repeatable)",
    )
    parser.add_argument("--force", action="store_true", help="replace a folder this script made before")
    args = parser.parse_args()
    folder, total = args.folder.resolve(), int(args.tokens)
    if folder.exists():
        if not (args.force and (folder / "config.yaml").is_file() and (folder / "data" / MANIFEST).is_file()):
            sys.exit(f"make_prepared: {folder} exists; pass --force to replace a folder this script made")
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    start = time.perf_counter()
    config = folder / "config.yaml"
    store.write_text(
        config, to_yaml(preset_config("tiny", ["data.corpus=sample", *args.overrides]), preset_header("tiny"))
    )
    cfg = load_run(config)
    data = prepare(cfg, quiet=True)  # the real thing, on the stand-in corpus: tokenizer, fingerprint
    manifest, _ = read_manifest(data)
    sample = load_prepared(data).corpus("train")
    unigram = np.array(sample.tokens)  # the sample's token ids, drawn uniformly: its unigram distribution
    dtype = np.dtype(manifest["dtype"])
    (data / MANIFEST).unlink()  # until the shards are whole: prepare would then prepare the sample again
    first = manifest["units"][0]  # its shards become the generated ones; the other units stay the sample's
    unit = data / UNITS / first["key"]
    for split in SPLITS:
        shutil.rmtree(unit / split)
    first["splits"] = generate(unit, total, cfg.data.validation_fraction, unigram, dtype, args.seed)
    first["unknown_tokens"] = 0
    record = json.loads((unit / UNIT_RECORD).read_text())
    store.write_text(unit / UNIT_RECORD, json.dumps({**record, "splits": first["splits"], "unknown_tokens": 0}))
    records = {u["key"]: u for u in manifest["units"]}
    units = [argparse.Namespace(key=u["key"]) for u in manifest["units"]]
    write_index(data, units, records, manifest["index"])  # the same units: the same digest
    splits = {
        split: {c: sum(u["splits"][split][c] for u in manifest["units"]) for c in ("documents", "segments", "tokens")}
        for split in SPLITS
    }
    manifest.update(
        splits=splits,
        unknown_tokens=sum(u["unknown_tokens"] for u in manifest["units"]),
        generated_by={
            "script": "scripts/make_prepared.py",
            "tokens": total,
            "seed": args.seed,
            "overrides": args.overrides,
            "note": "synthetic shards; the corpus entry and fingerprint are the bundled sample's (the stand-in)",
        },
    )
    store.write_text(data / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    if damage := verify(data, manifest):
        sys.exit(f"make_prepared: the generated data does not check: {damage[0]}")
    t, v = splits["train"], splits["valid"]
    print(
        f"{folder}: {t['tokens'] + v['tokens']:,} tokens, {t['documents'] + v['documents']:,} documents "
        f"({v['documents']:,} held out), {t['segments'] + v['segments']:,} sentences, "
        f"{time.perf_counter() - start:.0f} s; train with: python -m bertcli pretrain --config {config}"
    )


if __name__ == "__main__":
    main()
