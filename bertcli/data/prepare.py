"""`bertcli prepare`: raw text -> tokenizer -> token-id shards that training memory-maps.

Layout of the prepared folder (written into a temporary folder, then renamed into place):
  manifest.json        format version, corpus files (size, mtime, sha256), tokenizer settings and
                       the SHA-256 of tokenizer.json and vocab.txt, counts, and the fingerprint
                       that decides whether the data can be reused
  tokenizer.json       the WordPiece tokenizer (Hugging Face tokenizers format)
  vocab.txt            the same vocabulary, one token per line (BERT format)
  train/, valid/       tokens.bin (uint16 when the vocabulary fits, else uint32),
                       seg_offsets.bin and doc_offsets.bin (int64): the corpus.Corpus layout
The corpus is streamed three times when a tokenizer is trained (a scan for the characters that
continue words, which fixes the vocabulary's ids; training; encoding), in batches, so memory
stays bounded whatever its size. Held-out documents are every k-th document (k =
1/validation_fraction): deterministic, spread over the corpus, whole documents only.

Prepared data is checked each time it is used (check_prepared): every file bertcli wrote there is a
regular file (a symbolic link is never followed out of the folder), tokenizer.json and vocab.txt
have the hashes the manifest records, the shards have the sizes its counts imply, the offsets rise
from 0 to those counts, and every token id is below the vocabulary size. Damaged data is prepared
again (with a line saying why); where it cannot be (inspect), it is refused with one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from tokenizers import Tokenizer

from bertcli import __version__, atomic, layout, ownership
from bertcli.config import Config, DataConfig
from bertcli.data.chunks import random_next_share
from bertcli.data.corpus import Corpus, SpecialTokens, is_held_out
from bertcli.data.text import corpus_files, is_compressed, read_sentences, read_text
from bertcli.data.tokenizer import (continuation_mask, describe, find_tokenizer_file, load_tokenizer, read_tokenizer_json,
                                    save_tokenizer, special_tokens, tokenizer_identity, train_tokenizer)
from bertcli.errors import Interrupted, UsageError
from bertcli.layout import DOC_OFFSETS, MANIFEST, SEG_OFFSETS, SHARD_FILES, TOKENIZER_FILES, TOKENS
from bertcli.console import log

# 3: tokenizer.json and vocab.txt hashed in the manifest; lines over text.MAX_LINE_CHARS cut in pieces.
# 2: deterministic vocabulary (continuation pieces right after the special tokens).
FORMAT_VERSION = 3
SAMPLE = Path(__file__).resolve().parent / "sample" / "python-docs-sample.txt.gz"
ENCODE_BATCH = 2048  # sentences per tokenizer call: large enough for its thread pool, small for memory
ENCODE_CHARS = 1 << 20  # and at most about this many characters (an encoding costs ~100 bytes a token)
# A corpus of up to this many bytes is hashed again at every cache check (about 1 s per GB); a
# larger one only where a file's size or modification time changed.
HASH_ALWAYS_BYTES = 1 << 30
RANDOM_NEXT_MARGIN = 0.1  # warn when the data gives random next sentences this far above random_next_prob


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
    """Path, size, mtime and sha256 of each file. A corpus of up to HASH_ALWAYS_BYTES is hashed
    whole every time; in a larger one, a file whose size and mtime are unchanged since the last
    prepare keeps its recorded hash (so checking the cache does not reread gigabytes)."""
    known = {e["path"]: e for e in previous} if not _hashed_again(files) else {}
    entries = []
    for f in files:
        st = f.stat()
        old = known.get(str(f.resolve()))
        same = (old is not None and old.get("bytes") == st.st_size and old.get("mtime_ns") == st.st_mtime_ns
                and isinstance(old.get("sha256"), str))
        entries.append({"path": str(f.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
                        "sha256": old["sha256"] if same else _sha256(f)})
    return entries


def _hashed_again(files: list[Path]) -> bool:
    """Whether the cache check hashes every corpus file again (a small corpus), rather than trusting
    the recorded hash of a file whose size and modification time are unchanged."""
    return sum(f.stat().st_size for f in files) <= HASH_ALWAYS_BYTES


def cache_check(corpus_bytes: int) -> str:
    """What the cache check compares for a corpus of `corpus_bytes`, in words (for `inspect`)."""
    if corpus_bytes <= HASH_ALWAYS_BYTES:
        return (f"the same SHA-256 for every corpus file (all hashed again at each start: the corpus is at most "
                f"{HASH_ALWAYS_BYTES >> 30} GiB)")
    return (f"the same size and modification time for every corpus file, hashed again only where either changed (the "
            f"corpus is over {HASH_ALWAYS_BYTES >> 30} GiB: an edit that keeps both is not seen; `prepare --force` "
            "prepares again)")


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
        self.files: dict[str, BinaryIO] = {name: open(folder / name, "wb") for name in SHARD_FILES}
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
        # The arrays' bytes through the file's write(), not ndarray.tofile: that one words a full disk as
        # "N requested and M written", without the reason.
        for name, values, dtype in ((TOKENS, self.tokens, self.dtype), (SEG_OFFSETS, self.seg_offsets, np.int64),
                                    (DOC_OFFSETS, self.doc_offsets, np.int64)):
            with atomic.writing(self.folder / name):
                self.files[name].write(np.asarray(values, dtype=dtype).data)
        self.tokens, self.seg_offsets, self.doc_offsets = [], [], []

    def close(self) -> dict[str, int]:
        self.end_document()
        self.flush()
        for name, fh in self.files.items():
            with atomic.writing(self.folder / name):
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
    fingerprint is already there, whole and undamaged; return the prepared folder. SIGINT and
    SIGTERM stop it at once (what it was writing is removed; exit 130 or 143)."""
    with _stop_on_signal():
        return _prepare(cfg, quiet, force)


def _prepare(cfg: Config, quiet: bool, force: bool) -> Path:
    global _written
    data = cfg.data
    folder = Path(data.prepared_dir)
    files = corpus_files(corpus_path(cfg))
    guard = _guard(cfg, folder)
    _clean_leftovers(folder)
    old, why_not = read_manifest(folder)
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
        damage = check_prepared(folder, old)
        if damage is None:
            log(f"prepared data in {folder} is up to date (corpus and settings unchanged, files intact): reusing it")
            _warn_random_next(folder, old, cfg)
            return folder
        log(f"prepared data in {folder} is damaged ({damage}): preparing it again")
    elif why_not and not force:
        log(f"prepared data in {folder} {why_not}: preparing it again")
    if fixed is not None:
        log(f"preparing {data.corpus} with the run's own tokenizer, {fixed} (its checkpoints were trained on its "
            "token ids; a new vocabulary would garble them)")

    start = time.perf_counter()
    total_bytes = None if any(is_compressed(f) for f in files) else sum(e["bytes"] for e in entries)
    with atomic.folder(folder, guard) as tmp:
        if tok is None:
            with _progress(total_bytes, "training tokenizer", quiet) as bar:
                sentences = _until_stopped(s for s in read_sentences(files, data.split_sentences, bar.update)
                                           if s is not None)
                tok = train_tokenizer(sentences, data.tokenizer, read_text(files))
            _check_stop()  # a signal cut the reading short: that vocabulary must not be used
        save_tokenizer(tok, tmp)
        vocab_size = tok.get_vocab_size(with_added_tokens=True)
        dtype = np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)
        splits, unknown = _write_shards(tok, files, data, tmp, dtype=dtype, total_bytes=total_bytes, quiet=quiet)
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
                          "sha256": {name: _sha256(tmp / name) for name in TOKENIZER_FILES},
                          "requested_vocab_size": data.tokenizer.vocab_size,
                          "lowercase": casing.get("lowercase", data.tokenizer.lowercase),  # as used, not as configured
                          "strip_accents": casing.get("strip_accents", data.tokenizer.strip_accents),
                          "min_frequency": data.tokenizer.min_frequency},
            "split_sentences": data.split_sentences, "validation_fraction": data.validation_fraction,
            "dtype": dtype.name, "splits": splits, "unknown_tokens": unknown,
            "seconds": elapsed, "tokens_per_s": total_tokens / max(elapsed, 1e-9),
        }
        with atomic.writing(tmp / MANIFEST):
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        for path in tmp.rglob("*"):
            if path.is_file():
                atomic.fsync_path(path)
        _check_stop()
    _written = folder  # in place: a stop from here on keeps it
    t, v = splits["train"], splits["valid"]
    share = _warn_random_next(folder, manifest, cfg)
    pairs = (f"; random next sentences {100 * share:.1f}% of pairs (data.random_next_prob "
             f"{100 * data.random_next_prob:.0f}%)" if share is not None else "")
    log(f"prepared {folder}: {t['documents'] + v['documents']:,} documents ({v['documents']:,} held out), "
        f"{t['segments'] + v['segments']:,} sentences, {total_tokens:,} tokens, vocabulary {vocab_size:,}, "
        f"unknown {100 * unknown / max(total_tokens, 1):.2f}%{pairs}; {elapsed:.1f} s, "
        f"{total_tokens / max(elapsed, 1e-9):,.0f} tokens/s")
    return folder


def data_random_next_share(folder: Path, manifest: dict[str, Any], data: DataConfig, seed: int) -> float | None:
    """The share of training pairs with a random next sentence that this data gives at `data`'s
    settings (None without pairs or training documents); see chunks.random_next_share."""
    if not data.pairs or manifest["splits"]["train"]["documents"] == 0:
        return None
    base = folder / "train"
    return random_next_share(np.memmap(base / SEG_OFFSETS, dtype=np.int64, mode="r"),
                             np.memmap(base / DOC_OFFSETS, dtype=np.int64, mode="r"), data, seed)


def random_next_warning(share: float | None, data: DataConfig) -> str | None:
    """A line for the user when the documents are too short for the configured pairs."""
    if share is None or share <= data.random_next_prob + RANDOM_NEXT_MARGIN:
        return None
    return (f"warning: {100 * share:.1f}% of the NSP pairs will have a random next sentence, against "
            f"data.random_next_prob={data.random_next_prob:g}: most documents are too short for pairs (a single "
            f"sentence, or sentences that fill data.max_seq_length={data.max_seq_length} alone), so NSP accuracy will "
            "look high without learning; put several sentences in each document (a blank line ends a document in "
            "text, one JSONL record is one document), or set data.pairs: false and train.nsp_weight: 0")


def _warn_random_next(folder: Path, manifest: dict[str, Any], cfg: Config) -> float | None:
    """random_next_warning said once on stderr (pretrain reaches this through prepare); the share."""
    share = data_random_next_share(folder, manifest, cfg.data, cfg.train.seed)
    warning = random_next_warning(share, cfg.data)
    if warning:
        log(warning)
    return share


class _Stopped(BaseException):
    """SIGINT or SIGTERM inside `prepare`: a BaseException, so that no library's `except Exception`
    (tqdm's, starting its monitor thread) swallows it; _stop_on_signal turns it into Interrupted."""


_stop_pipe: int | None = None  # the read end of _stop_on_signal's wakeup pipe
_signal: int | None = None  # the stop signal that came, if one did
_written: Path | None = None  # the prepared folder, once it is in place


@contextmanager
def _stop_on_signal() -> Iterator[None]:
    """SIGINT and SIGTERM stop `prepare` at once, also inside `pretrain` (whose own handlers only ask
    the training loop to stop after a step): the exception unwinds atomic.folder, which removes the
    temporary folder, and ends the command with exit 128 + N and one line. The previous handlers
    come back afterwards.

    Python runs a handler in the main thread only, and the tokenizer trainer holds the main thread
    while its own threads read the corpus (8 s for the 3.5 MB python-docs.txt): there the signal is
    seen through a wakeup pipe (signal.set_wakeup_fd), the reading stops (_until_stopped), and the
    trainer returns early; what it trained on part of the corpus is never used (_check_stop)."""
    global _stop_pipe, _signal, _written
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        global _signal
        _signal = signum
        raise _Stopped

    previous = {signum: handler for signum in (signal.SIGINT, signal.SIGTERM)
                if (handler := signal.getsignal(signum)) not in (signal.SIG_IGN, None)}  # nohup: ignored stays ignored
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    os.set_blocking(write_end, False)
    _stop_pipe, _signal, _written = read_end, None, None
    previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    for signum in previous:
        signal.signal(signum, stop)
    try:
        yield
        _check_stop()  # a stop that something caught on the way
    except _Stopped:
        signum = _signal or signal.SIGTERM
        kept = (f"the prepared data in {_written} is complete" if _written else
                "nothing was kept (the temporary data was removed)")
        raise Interrupted(f"stopped by {signal.Signals(signum).name} while preparing data; {kept}: run the same "
                          "command again", signum) from None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(previous_fd)
        _stop_pipe = None
        os.close(read_end)
        os.close(write_end)


def _check_stop() -> None:
    """Raise _Stopped if a stop signal came (seen by the handler or through the wakeup pipe)."""
    if _signal is not None:
        raise _Stopped


def _until_stopped(items: Iterator[str]) -> Iterator[str]:
    """`items` until SIGINT or SIGTERM comes (looked for every 1,024 items, from whatever thread
    reads them; see _stop_on_signal)."""
    global _signal
    for n, item in enumerate(items):
        if n % 1024 == 0 and _stop_pipe is not None and _signal is None:
            try:
                _signal = next((b for b in os.read(_stop_pipe, 64) if b in (signal.SIGINT, signal.SIGTERM)), None)
            except OSError:  # nothing there (BlockingIOError), or the pipe is gone
                pass
        if _signal is not None:
            return
        yield item


def _clean_leftovers(folder: Path) -> None:
    """Remove what a `prepare` that was killed left next to `folder`: its temporary folders
    (.tmp-NAME.PID, .tmp-del-NAME.PID) when process PID is gone, and only when they hold nothing
    but prepared-data files; a folder moved aside (.tmp-old-NAME.PID) whose replacement never
    arrived is put back."""
    final = Path(folder).expanduser().resolve()
    if not final.parent.is_dir():
        return
    pattern = re.compile(rf"^{re.escape(atomic.TMP_PREFIX)}(old-|del-)?{re.escape(final.name)}\.(\d+)$")
    for child in final.parent.iterdir():
        match = pattern.match(child.name)
        if not match or _alive(int(match.group(2))) or child.is_symlink() or not child.is_dir():
            continue
        if any(path.relative_to(child).as_posix() not in layout.PREPARED.paths for path in child.rglob("*")):
            continue  # something else in it: not bertcli's to delete
        if match.group(1) == "old-" and not final.exists() and not final.is_symlink():
            os.replace(child, final)
        else:
            shutil.rmtree(child, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Whether process `pid` exists (one of this machine's; another user's counts too)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _write_shards(tok: Tokenizer, files: list[Path], data: DataConfig, tmp: Path, *, dtype: np.dtype,
                  total_bytes: int | None, quiet: bool) -> tuple[dict[str, dict[str, int]], int]:
    """Tokenize the corpus files into the train and valid shards under `tmp` (documents held out
    by their number); return each split's counts and the number of unknown tokens."""
    writers = {split: ShardWriter(tmp / split, dtype) for split in layout.SPLITS}  # "train", "valid"
    unk = special_tokens(tok).unk
    counts = {"documents": 0, "unknown": 0}
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no offsets: faster where available

    def flush(items: list[str | None]) -> None:
        _check_stop()
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
        pending = chars = 0
        for item in read_sentences(files, data.split_sentences, bar.update):
            batch.append(item)
            if item is not None:
                pending += 1
                chars += len(item)
            if pending >= ENCODE_BATCH or chars >= ENCODE_CHARS:  # a document may span batches: the writers keep it open
                flush(batch)
                batch, pending, chars = [], 0, 0
        flush(batch)
    return {name: w.close() for name, w in writers.items()}, counts["unknown"]


def run_tokenizer(cfg: Config) -> Path | None:
    """The tokenizer.json of the run's newest checkpoint, None before its first: the tokenizer of a run
    is fixed by its first checkpoint, and every checkpoint carries it."""
    complete = (*layout.CHECKPOINT_FILES, layout.TOKENIZER_JSON)  # a link is damage, never followed (checkpoint.damage)
    steps = [path for _, path in layout.list_checkpoints(Path(cfg.output_dir))
             if all(ownership.own_file(path / name) for name in complete)]
    return steps[-1] / layout.TOKENIZER_JSON if steps else None


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
        ownership.check_replaceable(target, layout.PREPARED, fix)

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


def read_manifest(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the manifest of a prepared folder, None), or (None, why it cannot be used: damaged, of another
    format version, a symbolic link), or (None, None) when there is none.

    A manifest is data, never a source of paths: shards are read at fixed names inside the folder,
    and the corpus paths it records only serve as keys of the hash cache (never opened, never
    written). What decides how the shards are read (their dtype, the splits, the counts) is checked
    here, the files themselves by check_prepared.
    """
    path = folder / MANIFEST
    if not path.exists() and not path.is_symlink():
        return None, None
    if not ownership.own_file(path):
        return None, f"is damaged ({MANIFEST} is not a regular file; a symbolic link is never followed)"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return None, f"is damaged ({MANIFEST} cannot be read: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
    if not isinstance(manifest, dict):
        return None, f"is damaged ({MANIFEST} is not a JSON object)"
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        return None, f"is of format version {version} (this bertcli reads and writes version {FORMAT_VERSION})"
    splits, files, tok = manifest.get("splits"), (manifest.get("corpus") or {}).get("files"), manifest.get("tokenizer")
    counts = ("documents", "segments", "tokens")
    well_formed = (manifest.get("dtype") in ("uint16", "uint32") and isinstance(files, list)
                   and all(isinstance(f, dict) and isinstance(f.get("path"), str) for f in files)
                   and isinstance(splits, dict) and set(splits) == {"train", "valid"}
                   and all(isinstance(v, dict) and all(_count(v.get(c)) for c in counts) for v in splits.values())
                   and isinstance(tok, dict) and _count(tok.get("vocab_size")) and isinstance(tok.get("sha256"), dict)
                   and all(isinstance(tok["sha256"].get(name), str) for name in TOKENIZER_FILES))
    if not well_formed:
        return None, f"is damaged ({MANIFEST} lacks fields or has values of the wrong type)"
    return manifest, None


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_prepared(folder: Path, manifest: dict[str, Any]) -> str | None:
    """What is wrong with the files of prepared data (naming the file), or None when they are whole:
    regular files (never symbolic links), tokenizer.json and vocab.txt as hashed in the manifest,
    shards of the sizes its counts imply, offsets rising from 0 to those counts, token ids below
    the vocabulary size. Cheap: the tokenizer files and the offsets are read whole, the token ids
    once (about 15 ms per 100M tokens in the page cache)."""
    folders = layout.SPLITS
    for rel in (*folders, *TOKENIZER_FILES, *(f"{split}/{name}" for split in folders for name in SHARD_FILES)):
        path = folder / rel
        if os.path.islink(path):
            return f"{rel} is a symbolic link, which bertcli never follows out of its folder"
        if not path.exists():
            return f"{rel} is missing"
        if not (path.is_dir() if rel in folders else ownership.own_file(path)):
            return f"{rel} is not a {'folder' if rel in folders else 'regular file'}"
    for name in TOKENIZER_FILES:
        if _sha256(folder / name) != manifest["tokenizer"]["sha256"][name]:
            return f"{name} was changed after prepare: its SHA-256 is not the one {MANIFEST} records"
    dtype, vocab_size = np.dtype(manifest["dtype"]), manifest["tokenizer"]["vocab_size"]
    lines = (folder / layout.VOCAB).read_bytes().count(b"\n")  # one token a line, the vocabulary in id order
    if lines != vocab_size:
        return f"{MANIFEST} says the vocabulary holds {vocab_size:,} tokens, vocab.txt {lines:,}"
    for split, counts in manifest["splits"].items():
        expected = {TOKENS: counts["tokens"] * dtype.itemsize, SEG_OFFSETS: (counts["segments"] + 1) * 8,
                    DOC_OFFSETS: (counts["documents"] + 1) * 8}
        for name, size in expected.items():
            actual = (folder / split / name).stat().st_size
            if actual != size:
                kind = manifest["dtype"] if name == TOKENS else "int64"  # offsets are int64 whatever the tokens
                return f"{split}/{name} holds {actual:,} bytes where {MANIFEST} implies {size:,} ({kind})"
        base = folder / split
        for name, last in ((SEG_OFFSETS, counts["tokens"]), (DOC_OFFSETS, counts["segments"])):
            if not _rising(np.memmap(base / name, dtype=np.int64, mode="r"), last):
                return f"{split}/{name} does not rise from 0 to {last:,}: its offsets are damaged"
        if counts["tokens"] and vocab_size <= np.iinfo(dtype).max:  # else every id of the dtype is in range
            top = int(np.memmap(base / TOKENS, dtype=dtype, mode="r").max())
            if top >= vocab_size:
                return f"{split}/{TOKENS} holds token id {top:,}, past the vocabulary of {vocab_size:,}"
    return None


def _rising(offsets: np.ndarray, last: int, block: int = 1 << 22) -> bool:
    """Whether `offsets` goes from 0 to `last`, each one above the one before; read in blocks, so
    that no temporary array grows with the corpus."""
    if offsets[0] != 0 or offsets[-1] != last:
        return False
    for lo in range(0, len(offsets) - 1, block):
        if not (np.diff(offsets[lo:lo + block + 1]) > 0).all():
            return False
    return True


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
            tokens=np.memmap(base / TOKENS, dtype=self.manifest["dtype"], mode="r"),
            seg_offsets=np.memmap(base / SEG_OFFSETS, dtype=np.int64, mode="r"),
            doc_offsets=np.memmap(base / DOC_OFFSETS, dtype=np.int64, mode="r"),
            vocab_size=self.vocab_size, special=self.special, continuation=continuation_mask(self.tokenizer))


def load_prepared(folder: Path, verify: bool = True) -> PreparedData:
    """Prepared data, checked (check_prepared) unless `verify` is False (prepare checked it just now)."""
    manifest, why_not = read_manifest(folder)
    config = folder.parent / layout.RUN_CONFIG if (folder.parent / layout.RUN_CONFIG).is_file() else "CONFIG"
    again = (f"run `bertcli prepare --config {config}` (it prepares damaged or older data again; --force always "
             "does)")
    if manifest is None:
        raise UsageError(f"{folder}: {f'the prepared data {why_not}' if why_not else 'no prepared data here'}; {again}")
    if verify:
        damage = check_prepared(folder, manifest)
        if damage is not None:
            raise UsageError(f"{folder}: the prepared data is damaged ({damage}); {again}")
    return PreparedData(folder=folder, manifest=manifest, tokenizer=read_tokenizer_json(folder / layout.TOKENIZER_JSON))
