"""`bertcli prepare`: raw text -> tokenizer -> token-id shards that training memory-maps.

Layout of the prepared folder (written into a temporary folder, then renamed into place):
  manifest.json        format version, corpus files (size, mtime, sha256), tokenizer settings,
                       counts, and the fingerprint that decides whether the data can be reused
  tokenizer.json       the WordPiece tokenizer (Hugging Face tokenizers format)
  vocab.txt            the same vocabulary, one token per line (BERT format)
  train/, valid/       tokens.bin (uint16 when the vocabulary fits, else uint32),
                       seg_offsets.bin and doc_offsets.bin (int64): the corpus.Corpus layout
The corpus is streamed three times when a tokenizer is trained (a scan for the characters that
continue words, which fixes the vocabulary's ids; training; encoding), in batches, so memory
stays bounded whatever its size. Held-out documents are every k-th document (k =
1/validation_fraction): deterministic, spread over the corpus, whole documents only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from tokenizers import Tokenizer

from bertcli import __version__, atomic, ownership
from bertcli.config import Config, DataConfig
from bertcli.data.corpus import Corpus, SpecialTokens, is_held_out
from bertcli.data.text import corpus_files, read_sentences, read_text
from bertcli.data.tokenizer import (continuation_mask, describe, find_tokenizer_file, load_tokenizer, read_tokenizer_json,
                                    save_tokenizer, special_tokens, tokenizer_identity, train_tokenizer)
from bertcli.errors import UsageError
from bertcli.console import log

FORMAT_VERSION = 2  # 2: deterministic vocabulary (continuation pieces right after the special tokens)
MANIFEST = "manifest.json"
SAMPLE = Path(__file__).resolve().parent / "sample" / "python-docs-sample.txt.gz"
# Everything a prepared folder holds: `prepare` replaces a folder only if it holds nothing else.
SHARD_FILES = ("tokens.bin", "seg_offsets.bin", "doc_offsets.bin")
LAYOUT = ownership.Layout("prepared data", MANIFEST, frozenset(
    [MANIFEST, "tokenizer.json", "vocab.txt", "train", "valid"]
    + [f"{split}/{name}" for split in ("train", "valid") for name in SHARD_FILES]))
ENCODE_BATCH = 2048  # sentences per tokenizer call: large enough for its thread pool, small for memory


def corpus_path(cfg: Config) -> Path:
    """data.corpus as a path: the bundled sample, or the (resolved, absolute) path of the config."""
    return SAMPLE if cfg.data.corpus == "sample" else Path(cfg.data.corpus)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _file_entries(files: list[Path], previous: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Path, size, mtime and sha256 of each file; a file whose size and mtime are unchanged since
    the last prepare keeps its recorded hash (so checking the cache does not reread the corpus)."""
    known = {e["path"]: e for e in previous}
    entries = []
    for f in files:
        st = f.stat()
        old = known.get(str(f.resolve()))
        same = old is not None and old["bytes"] == st.st_size and old["mtime_ns"] == st.st_mtime_ns
        entries.append({"path": str(f.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
                        "sha256": old["sha256"] if same else _sha256(f)})
    return entries


def _input_digest(entries: list[dict[str, Any]], data: DataConfig, tokenizer_hash: str | None) -> str:
    """What the prepared data depends on: corpus contents, tokenizer settings, splitting, format."""
    t = data.tokenizer
    key = {"format_version": FORMAT_VERSION, "files": [e["sha256"] for e in entries],
           "tokenizer": {"path_sha256": tokenizer_hash, "vocab_size": t.vocab_size, "min_frequency": t.min_frequency,
                         "lowercase": t.lowercase, "strip_accents": t.strip_accents},
           "split_sentences": data.split_sentences, "validation_fraction": data.validation_fraction}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


class ShardWriter:
    """Appends segments and document ends to one split's files, in bounded memory."""

    FLUSH_TOKENS = 1 << 16  # ~2 MB of Python ints: keeps memory flat whatever the corpus size

    def __init__(self, folder: Path, dtype: np.dtype) -> None:
        folder.mkdir(parents=True)
        self.folder, self.dtype = folder, dtype
        self.files: dict[str, BinaryIO] = {name: open(folder / f"{name}.bin", "wb")
                                           for name in ("tokens", "seg_offsets", "doc_offsets")}
        self.tokens: list[int] = []
        self.seg_offsets: list[int] = [0]
        self.doc_offsets: list[int] = [0]
        self.num_tokens = self.num_segments = self.num_documents = 0
        self.open_segments = 0  # segments of the document being written

    def add_segment(self, ids: list[int]) -> None:
        self.tokens.extend(ids)
        self.num_tokens += len(ids)
        self.num_segments += 1
        self.open_segments += 1
        self.seg_offsets.append(self.num_tokens)
        if len(self.tokens) >= self.FLUSH_TOKENS:
            self.flush()

    def end_document(self) -> None:
        if self.open_segments:
            self.num_documents += 1
            self.doc_offsets.append(self.num_segments)
            self.open_segments = 0

    def flush(self) -> None:
        np.asarray(self.tokens, dtype=self.dtype).tofile(self.files["tokens"])
        np.asarray(self.seg_offsets, dtype=np.int64).tofile(self.files["seg_offsets"])
        np.asarray(self.doc_offsets, dtype=np.int64).tofile(self.files["doc_offsets"])
        self.tokens, self.seg_offsets, self.doc_offsets = [], [], []

    def close(self) -> dict[str, int]:
        self.end_document()
        self.flush()
        for fh in self.files.values():
            fh.flush()
            os.fsync(fh.fileno())
            fh.close()
        return {"documents": self.num_documents, "segments": self.num_segments, "tokens": self.num_tokens}


def _progress(total: int | None, desc: str, quiet: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc=desc, file=sys.stderr, disable=quiet or None,
                dynamic_ncols=True)


def prepare(cfg: Config, quiet: bool = False, force: bool = False) -> Path:
    """Prepare the corpus of resolved config `cfg` (see resolve.py) unless prepared data with the same
    fingerprint is already there; return the prepared folder."""
    data = cfg.data
    folder = Path(data.prepared_dir)
    files = corpus_files(corpus_path(cfg))
    guard = _guard(cfg, folder)
    old = _read_manifest(folder)
    entries = _file_entries(files, old["corpus"]["files"] if old else [])
    tokenizer_file = tok = None
    if data.tokenizer.path:
        tokenizer_file = find_tokenizer_file(Path(data.tokenizer.path))
        tok = load_tokenizer(tokenizer_file, data.tokenizer)
    # The loaded tokenizer as it is used (casing from a tokenizer_config.json, padding off), not its file alone:
    # data prepared with a tokenizer that padded (older bertcli) is prepared again.
    tokenizer_hash = hashlib.sha256(tok.to_str().encode()).hexdigest() if tok is not None else None
    fingerprint = _input_digest(entries, data, tokenizer_hash)
    fixed = run_tokenizer(cfg) if tok is None else None
    if fixed is not None:  # the run's checkpoints fix its token ids: never train another vocabulary under them
        tokenizer_file, tok = fixed, read_tokenizer_json(fixed)
    reusable = old and old.get("fingerprint") == fingerprint and (
        fixed is None or old["tokenizer"].get("identity") == tokenizer_identity(tok))
    if reusable and not force:
        log(f"prepared data in {folder} is up to date (corpus and settings unchanged): reusing it")
        return folder
    if fixed is not None:
        log(f"preparing {data.corpus} with the run's own tokenizer, {fixed} (its checkpoints were trained on its "
            "token ids; a new vocabulary would garble them)")

    start = time.perf_counter()
    total_bytes = None if any(f.name.endswith(".gz") for f in files) else sum(e["bytes"] for e in entries)
    with atomic.folder(folder, guard) as tmp:
        if tok is None:
            with _progress(total_bytes, "training tokenizer", quiet) as bar:
                sentences = (s for s in read_sentences(files, data.split_sentences, bar.update) if s is not None)
                tok = train_tokenizer(sentences, data.tokenizer, read_text(files))
        save_tokenizer(tok, tmp)
        vocab_size = tok.get_vocab_size(with_added_tokens=True)
        dtype = np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)
        splits, unknown = _write_shards(tok, files, data, tmp, dtype, total_bytes, quiet)
        _check_sizes(splits, data, folder)
        elapsed = time.perf_counter() - start
        casing = describe(tok)
        total_tokens = splits["train"]["tokens"] + splits["valid"]["tokens"]
        manifest = {
            "format_version": FORMAT_VERSION, "bertcli_version": __version__, "fingerprint": fingerprint,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "corpus": {"source": data.corpus, "files": entries},
            "tokenizer": {"source": str(tokenizer_file) if tokenizer_file else "trained", "vocab_size": vocab_size,
                          "identity": tokenizer_identity(tok),
                          "requested_vocab_size": data.tokenizer.vocab_size,
                          "lowercase": casing.get("lowercase", data.tokenizer.lowercase),  # as used, not as configured
                          "strip_accents": casing.get("strip_accents", data.tokenizer.strip_accents),
                          "min_frequency": data.tokenizer.min_frequency},
            "split_sentences": data.split_sentences, "validation_fraction": data.validation_fraction,
            "dtype": dtype.name, "splits": splits, "unknown_tokens": unknown,
            "seconds": elapsed, "tokens_per_s": total_tokens / max(elapsed, 1e-9),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        for path in tmp.rglob("*"):
            if path.is_file():
                atomic.fsync_path(path)
    t, v = splits["train"], splits["valid"]
    log(f"prepared {folder}: {t['documents'] + v['documents']:,} documents ({v['documents']:,} held out), "
        f"{t['segments'] + v['segments']:,} sentences, {total_tokens:,} tokens, vocabulary {vocab_size:,}, "
        f"unknown {100 * unknown / max(total_tokens, 1):.2f}%; {elapsed:.1f} s, "
        f"{total_tokens / max(elapsed, 1e-9):,.0f} tokens/s")
    return folder


def _write_shards(tok: Tokenizer, files: list[Path], data: DataConfig, tmp: Path, dtype: np.dtype,
                  total_bytes: int | None, quiet: bool) -> tuple[dict[str, dict[str, int]], int]:
    """Tokenize the corpus files into the train and valid shards under `tmp` (documents held out
    by their number); return each split's counts and the number of unknown tokens."""
    writers = {"train": ShardWriter(tmp / "train", dtype), "valid": ShardWriter(tmp / "valid", dtype)}
    unk = special_tokens(tok).unk
    counts = {"documents": 0, "unknown": 0}
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no offsets: faster where available

    def flush(items: list[str | None]) -> None:
        encodings = iter(encode([s for s in items if s is not None], add_special_tokens=False))
        for item in items:
            writer = writers["valid" if is_held_out(counts["documents"], data.validation_fraction) else "train"]
            if item is None:
                if writer.open_segments:
                    counts["documents"] += 1
                writer.end_document()
                continue
            ids = next(encodings).ids
            if ids:
                counts["unknown"] += ids.count(unk)
                writer.add_segment(ids)

    with _progress(total_bytes, "tokenizing", quiet) as bar:
        batch: list[str | None] = []
        pending = 0
        for item in read_sentences(files, data.split_sentences, bar.update):
            batch.append(item)
            pending += item is not None
            if pending >= ENCODE_BATCH:  # a document may span batches: the writers keep it open
                flush(batch)
                batch, pending = [], 0
        flush(batch)
    return {name: w.close() for name, w in writers.items()}, counts["unknown"]


STEP_DIR = re.compile(r"^step-\d+$")  # checkpoint.STEP_DIR (checkpoint.py imports torch, prepare does not)


def run_tokenizer(cfg: Config) -> Path | None:
    """The tokenizer.json of the run's newest checkpoint, None before its first: the tokenizer of a run
    is fixed by its first checkpoint, and every checkpoint carries it."""
    root = Path(cfg.output_dir) / "checkpoints"
    complete = ("model.safetensors", "config.yaml", "training_state.pt", "trainer_state.json", "tokenizer.json")
    steps = sorted((int(p.name[5:]), p) for p in root.glob("step-*")  # a link is damage, never followed (checkpoint.damage)
                   if STEP_DIR.match(p.name) and all((p / n).is_file() and not (p / n).is_symlink() for n in complete))
    return steps[-1][1] / "tokenizer.json" if steps else None


def _guard(cfg: Config, folder: Path) -> Callable[[Path], None]:
    """Refuse a prepared_dir that is, contains or lies inside an input (see ownership.py); return the
    check that atomic.folder runs before writing and again before the swap: only prepared data
    that bertcli wrote (or an empty folder) is replaced."""
    fix = "set data.prepared_dir to a new or empty folder (the default is data, next to the config)"
    inputs = [ownership.Input("the corpus", corpus_path(cfg)),
              ownership.Input("the run folder (output_dir)", Path(cfg.output_dir), inside_ok=True)]
    for label, value in (("the tokenizer (data.tokenizer.path)", cfg.data.tokenizer.path),
                         ("the model (model.init_from)", cfg.model.init_from)):
        if value:
            inputs.append(ownership.Input(label, Path(value)))
    ownership.check_apart(folder, inputs, fix)

    def guard(target: Path) -> None:
        ownership.check_replaceable(target, LAYOUT, fix)

    return guard


def _check_sizes(splits: dict[str, dict[str, int]], data: DataConfig, folder: Path) -> None:
    """Enough documents for examples in each split: 2 with sentence pairs (a random next sentence
    comes from another document), 1 without. Every fix suggested is one that works."""
    train, valid = splits["train"]["documents"], splits["valid"]["documents"]
    total = train + valid
    if total == 0:
        raise UsageError(f"data.corpus={data.corpus!r}: the corpus is empty (no text after reading and tokenizing)")
    need = 2 if data.pairs else 1
    why = " (random next sentences come from another document)" if data.pairs else ""
    no_pairs = "set data.pairs: false and train.nsp_weight: 0 (no NSP)"
    if data.validation_fraction > 0 and valid < need:
        fixes = []
        stride = total // need  # every stride-th document is held out: the widest that holds out `need`
        if stride >= 2:  # validation_fraction is at most 0.5
            fixes.append(f"raise data.validation_fraction to {1 / stride:.4g}")
        if total >= need:
            fixes.append("set data.validation_fraction: 0 (no held-out evaluation)")
        elif data.pairs:
            fixes.append("set data.validation_fraction: 0, data.pairs: false and train.nsp_weight: 0 (no NSP)")
        fixes.append("add documents (blank lines separate them)")
        raise UsageError(f"data.corpus={data.corpus!r}: {total} document(s) is too small for the held-out split "
                         f"(validation_fraction={data.validation_fraction} holds out {valid}; at least {need} "
                         f"{'are' if need > 1 else 'is'} needed{why}): {', or '.join(fixes)}")
    if train < need:
        raise UsageError(f"data.corpus={data.corpus!r}: {train} training document(s); at least 2 are needed{why}: "
                         f"separate documents with blank lines, or {no_pairs}")


def _read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of a prepared folder, or None when there is none, of another format, or damaged.

    A manifest is data, never a source of paths: shards are read at fixed names inside the folder,
    and the corpus paths it records only serve as keys of the hash cache (never opened, never
    written). What decides how the shards are read (their dtype, the splits) is checked here.
    """
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format_version") != FORMAT_VERSION:
        return None
    splits, files = manifest.get("splits"), (manifest.get("corpus") or {}).get("files")
    well_formed = (manifest.get("dtype") in ("uint16", "uint32") and isinstance(files, list)
                   and all(isinstance(f, dict) and isinstance(f.get("path"), str) for f in files)
                   and isinstance(splits, dict) and set(splits) == {"train", "valid"}
                   and all(isinstance(v, dict) and isinstance(v.get("documents"), int) for v in splits.values()))
    return manifest if well_formed else None


@dataclass
class PreparedData:
    """Prepared data, memory-mapped: what training and `inspect` read."""

    folder: Path
    manifest: dict[str, Any]
    tokenizer: Tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def special(self) -> SpecialTokens:
        return special_tokens(self.tokenizer)

    def corpus(self, split: str) -> Corpus | None:
        if self.manifest["splits"][split]["documents"] == 0:
            return None
        base = self.folder / split
        return Corpus(
            tokens=np.memmap(base / "tokens.bin", dtype=self.manifest["dtype"], mode="r"),
            seg_offsets=np.memmap(base / "seg_offsets.bin", dtype=np.int64, mode="r"),
            doc_offsets=np.memmap(base / "doc_offsets.bin", dtype=np.int64, mode="r"),
            vocab_size=self.vocab_size, special=self.special, continuation=continuation_mask(self.tokenizer))


def load_prepared(folder: Path) -> PreparedData:
    manifest = _read_manifest(folder)
    if manifest is None:
        raise UsageError(f"{folder}: no prepared data here (or of another format version, or a damaged manifest.json); "
                         "run `bertcli prepare`")
    return PreparedData(folder=folder, manifest=manifest, tokenizer=read_tokenizer_json(folder / "tokenizer.json"))
