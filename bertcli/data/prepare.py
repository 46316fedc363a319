"""`bertcli prepare`: raw text -> tokenizer -> token-id shards that training memory-maps.

The corpus is cut into units of work, each prepared on its own (in worker processes, one per core)
into shards of its own; the same unit always gives the same shards, byte for byte, whatever the
number of workers, so the next `prepare` keeps the units whose contents are unchanged and prepares
only what was added or changed. A unit is a whole file of at least UNIT_BYTES, a part of an
uncompressed larger one (cut at a document boundary after each multiple of UNIT_BYTES, so a
function of its bytes: text.document_cuts), or a run of smaller files in corpus order (closed
after a file with a probability of its size / UNIT_BYTES, drawn from its SHA-256: again a function
of the files alone, so adding a small file re-prepares only its own run, about UNIT_BYTES).

Layout of the prepared folder (FORMAT_VERSION; the layout names are together below):
  manifest.json        written last, by an atomic rename: what makes the rest valid. Format version,
                       corpus files (size, mtime, sha256; the parts of large ones), the tokenizer
                       (settings, the SHA-256 of tokenizer.json and vocab.txt, what it was trained on),
                       the units in corpus order with their counts, the index, totals
  tokenizer.json       the WordPiece tokenizer (Hugging Face tokenizers format)
  vocab.txt            the same vocabulary, one token per line (BERT format)
  units/KEY/           one unit: unit.json (its counts) and train/, valid/ with tokens.bin (uint16
                       when the vocabulary fits, else uint32), seg_offsets.bin and doc_offsets.bin
                       (int64, the corpus.Corpus layout of the unit alone). KEY hashes what the shards
                       depend on: the unit's bytes, the tokenizer, the settings
  index/DIGEST/        train/, valid/: seg_offsets.bin and doc_offsets.bin of the whole corpus (the
                       units in corpus order), so training reads the units' tokens as one array
                       (corpus.PartTokens) with offsets memory-mapped, never gathered in memory
A `prepare` that finds the folder of this format with the same tokenizer writes new units under
temporary names and renames each into place, then a new index, then the manifest; only then are
the units and index the corpus no longer uses removed. A crash at any point leaves the previous
manifest valid, with all it names; the next `prepare` removes the strays, and reuses the finished
units. A folder of another format, a new tokenizer or a forced prepare prepares everything into a
temporary folder that replaces the old one in one rename (atomic.folder).

The tokenizer is trained once. The corpus is streamed three times: a scan for the characters of its
words (which fixes the vocabulary's ids and counts the characters), training, encoding (in batches,
by units). The trainer's memory grows with the distinct words it sees (about 2.7 MB per MB of
English text), so on a corpus of more than data.tokenizer.sample_chars characters it trains on a
sample of the lines, chosen by a hash of each line (text.LineSample): memory stays bounded
whatever the corpus's size. When
the corpus changes, the prepared folder keeps its tokenizer (a new vocabulary would change the ids
of every unit) as long as unchanged files hold at least half of the corpus's bytes (_unchanged_bytes); a forced prepare
trains a new one. A run keeps the tokenizer of its checkpoints whatever happens (run_tokenizer).

Held-out documents are every k-th document of each unit (k = 1/validation_fraction), counted from
a phase that the unit's contents give: deterministic, spread over the corpus, whole documents
only, and a unit added or changed never moves another unit's documents between the splits.

Prepared data is checked each time it is used (check_prepared): every file bertcli wrote there is a
regular file (a symbolic link is never followed out of the folder), tokenizer.json and vocab.txt
have the hashes the manifest records, the shards have the sizes its counts imply, the offsets rise
from 0 to those counts and the index agrees with the units, and every token id is below the
vocabulary size. Damaged data is prepared again (with a line saying why: a damaged unit alone);
where it cannot be (inspect), it is refused with one line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from tokenizers import Tokenizer

from bertcli import __version__, atomic, console, layout, ownership
from bertcli.config import Config, DataConfig
from bertcli.console import info, log
from bertcli.data.chunks import random_next_share
from bertcli.data.corpus import Corpus, PartTokens, SpecialTokens, held_out_stride, is_held_out
from bertcli.data.text import (
    MAX_LINE_CHARS,
    LineSample,
    Part,
    corpus_files,
    document_cuts,
    is_compressed,
    is_jsonl,
    lines_end_in_cr,
    read_sentences,
    read_text,
)
from bertcli.data.tokenizer import (
    SPECIAL,
    casing_clashes,
    check_ids,
    continuation_mask,
    describe,
    find_tokenizer_file,
    load_tokenizer,
    read_tokenizer_json,
    save_tokenizer,
    scan_characters,
    special_tokens,
    tokenizer_change,
    tokenizer_identity,
    train_wordpiece,
)
from bertcli.errors import STOP_SIGNALS, BertcliError, Interrupted, RunError, UsageError
from bertcli.layout import (
    DOC_OFFSETS,
    INDEX,
    INDEX_FILES,
    KEY,
    MANIFEST,
    SEG_OFFSETS,
    SHARD_FILES,
    SPLITS,
    TOKENIZER_FILES,
    TOKENS,
    UNIT_RECORD,
    UNITS,
)
from bertcli.runlock import PreparedLock
from bertcli.sizes import free_bytes

# ---------------------------------------------------------------- the prepared folder's layout
# 5: sentences keep the closing quotes and brackets after their end (4 dropped them).
# 4: units of work with shards of their own, a global index, per-unit held-out phase; incremental.
# 3: tokenizer.json and vocab.txt hashed in the manifest; lines over text.MAX_LINE_CHARS cut in pieces.
# 2: deterministic vocabulary (continuation pieces right after the special tokens).
FORMAT_VERSION = 5
# The names (manifest.json, units/KEY/, index/DIGEST/, the shards) are layout.py's, with layout.PREPARED: everything
# a prepared folder holds, which `prepare` alone replaces or removes.
_TMP = re.escape(atomic.TMP_PREFIX)

# ---------------------------------------------------------------- settings
UNIT_BYTES = 4 << 20  # a unit of work: small enough that 2 workers share a 30 MB corpus evenly, large
# enough that a 100 GB corpus is 25,000 units (each memory-maps 2 token files in training: the default
# vm.max_map_count is 65,530)
ENCODE_BATCH = 2048  # sentences per tokenizer call: large enough for its thread pool, small for memory
ENCODE_CHARS = 1 << 20  # and at most about this many characters (an encoding costs ~100 bytes a token)
PROGRESS_BYTES = 1 << 20  # a worker reports its progress every this many bytes read
# A corpus of up to this many bytes is hashed again at every cache check (about 1 s per GB); a
# larger one only where a file's size or modification time changed.
HASH_ALWAYS_BYTES = 1 << 30
RANDOM_NEXT_MARGIN = 0.1  # warn when the data gives random next sentences this far above random_next_prob
KEEP_TOKENIZER_SHARE = 0.5  # a changed corpus keeps its tokenizer while unchanged files hold this share of its bytes
SAMPLE = Path(__file__).resolve().parent / "sample" / "python-docs-sample.txt.gz"


def corpus_path(cfg: Config) -> Path:
    """data.corpus as a path: the bundled sample, or the (resolved, absolute) path of the config."""
    return SAMPLE if cfg.data.corpus == "sample" else Path(cfg.data.corpus)


def default_workers() -> int:
    """The cores this process may run on (its CPU affinity, as a scheduler or taskset sets it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


# ---------------------------------------------------------------- corpus files and their parts


def _hash_parts(path: Path, cuts: list[int]) -> list[dict[str, Any]]:
    """The parts of a file cut at `cuts`: start, end, first line number and SHA-256 of each, in one
    read of the file."""
    bounds = [0, *cuts, path.stat().st_size]
    parts = []
    with open(path, "rb") as fh:
        line = 1
        for start, end in zip(bounds, bounds[1:]):
            digest, left, lines = hashlib.sha256(), end - start, 0
            while left > 0:
                block = fh.read(min(1 << 20, left))
                if not block:
                    break  # the file shrank meanwhile: its hash will differ next time
                digest.update(block)
                lines += block.count(b"\n")
                left -= len(block)
            parts.append({"start": start, "end": end, "line": line, "sha256": digest.hexdigest()})
            line += lines
    return parts


def _file_entries(files: list[Path], previous: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Path, size, mtime and sha256 of each file; an uncompressed file larger than UNIT_BYTES is
    cut into parts (text.document_cuts) and has their hashes instead. A corpus of up to
    HASH_ALWAYS_BYTES is hashed whole every time; in a larger one, a file whose size and mtime are
    unchanged since the last prepare keeps its recorded hashes (so checking the cache does not
    reread gigabytes)."""
    known = {e["path"]: e for e in previous} if not _hashed_again(files) else {}
    entries = []
    for f in files:
        st = f.stat()
        old = known.get(str(f.resolve()))
        same = (
            old is not None
            and old.get("bytes") == st.st_size
            and old.get("mtime_ns") == st.st_mtime_ns
            and (isinstance(old.get("sha256"), str) or isinstance(old.get("parts"), list))
        )
        entry: dict[str, Any] = {"path": str(f.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
        if same:
            entry.update({k: old[k] for k in ("sha256", "parts") if k in old})  # type: ignore[index]
        else:
            _say_cr_line_ends(f)
            cuts = document_cuts(f, UNIT_BYTES) if st.st_size > UNIT_BYTES and not is_compressed(f) else []
            if cuts:
                entry["parts"] = _hash_parts(f, cuts)
            else:
                entry["sha256"] = ownership.sha256_of(f)
        entries.append(entry)
    return entries


def _say_copies(entries: list[dict[str, Any]]) -> None:
    """Warn of corpus files with the same bytes (their hashes are at hand): their documents would be
    trained on twice, and could fall on both sides of the held-out split, flattering its metrics."""
    first: dict[Any, str] = {}
    copies = []
    for entry in entries:
        if not entry["bytes"]:  # empty: no documents to train on twice
            continue
        content = entry.get("sha256") or tuple(p["sha256"] for p in entry["parts"])
        if content in first:
            copies.append((entry["path"], first[content]))
        else:
            first[content] = entry["path"]
    if copies:
        log(
            f"warning: {len(copies):,} corpus file(s) hold the same bytes as another, e.g. {copies[0][0]} and "
            f"{copies[0][1]}: their documents are trained on twice and can be held out and trained on at once; "
            "remove the copies"
        )


def _say_cr_line_ends(path: Path) -> None:
    """Warn of a text file whose lines end in CR alone: it is read as one line, its documents as one."""
    if lines_end_in_cr(path):
        log(
            f"warning: {path}: its lines end in CR alone (classic Mac OS line ends); a line ends at LF, so it is "
            "read as one line and its documents as one: convert it (tr '\\r' '\\n' < OLD > NEW)"
        )


def _entry_digest(entry: dict[str, Any]) -> str | None:
    """A corpus file's contents as recorded: its SHA-256, or for a file in parts their hashes', hashed."""
    if isinstance(entry.get("parts"), list):
        return _digest([p.get("sha256") for p in entry["parts"] if isinstance(p, dict)])
    return entry.get("sha256")


def _unchanged_bytes(entries: list[dict[str, Any]], previous: list[dict[str, Any]]) -> int:
    """Bytes of the corpus (`entries`) that the last prepare read too (`previous`): files, or parts of
    a file cut into parts, with a SHA-256 it recorded. By content, not by unit: a small corpus is one
    unit, which a file added changes whole, while nearly all of its text is the same."""

    def pieces(found: list[dict[str, Any]]) -> list[tuple[Any, int]]:  # (SHA-256, bytes) of each file or part
        out = []
        for e in found:
            parts = e.get("parts")
            if isinstance(parts, list):
                out += [(p.get("sha256"), p.get("end", 0) - p.get("start", 0)) for p in parts if isinstance(p, dict)]
            else:
                out.append((e.get("sha256"), e.get("bytes", 0)))
        return out

    known = {digest for digest, _ in pieces(previous) if isinstance(digest, str)}
    return sum(size for digest, size in pieces(entries) if digest in known)


def _hashed_again(files: list[Path]) -> bool:
    """Whether the cache check hashes every corpus file again (a small corpus), rather than trusting
    the recorded hash of a file whose size and modification time are unchanged."""
    return sum(f.stat().st_size for f in files) <= HASH_ALWAYS_BYTES


def cache_check(corpus_bytes: int) -> str:
    """What the cache check compares for a corpus of `corpus_bytes`, in words (for `inspect`)."""
    if corpus_bytes <= HASH_ALWAYS_BYTES:
        return (
            f"the same SHA-256 for every corpus file (all hashed again at each start: the corpus is at most "
            f"{HASH_ALWAYS_BYTES >> 30} GiB)"
        )
    return (
        f"the same size and modification time for every corpus file, hashed again only where either changed (the "
        f"corpus is over {HASH_ALWAYS_BYTES >> 30} GiB: an edit that keeps both is not seen; a forced "
        "`prepare` prepares again)"
    )


# ---------------------------------------------------------------- units of work


@dataclass(frozen=True)
class Unit:
    """A unit of work: parts of corpus files read in order and prepared into shards of their own."""

    key: str  # sha256 hex of what its shards depend on: its bytes, the tokenizer, the settings
    content: str  # sha256 hex of its bytes alone (and how they are read): the held-out phase
    parts: tuple[Part, ...]
    sizes: tuple[int, ...]  # bytes of each part in its file (compressed ones: the compressed size)
    pieces: tuple[tuple[int, int, int], ...]  # (file number in the corpus, start, end) of each part

    @property
    def bytes(self) -> int:
        return sum(self.sizes)

    def phase(self, stride: int) -> int:
        return unit_phase(self.content, stride)


def unit_phase(content: str, stride: int) -> int:
    """Where the every-k-th held-out documents of a unit of contents `content` (hex) start (see
    corpus.is_held_out): a function of its bytes, so that units with fewer documents than k (one
    document per file is common) are held out in their share too."""
    return int(content[:15], 16) % stride if stride else 0


def _reading(path: Path) -> str:
    """How a file's bytes are read (its format and compression): part of what its shards depend on."""
    name = path.name.lower()
    return ("jsonl" if is_jsonl(path) else "text") + next((c for c in (".gz", ".bz2", ".xz") if name.endswith(c)), "")


def plan_units(files: list[Path], entries: list[dict[str, Any]], tokenizer_sha256: str, data: DataConfig) -> list[Unit]:
    """The units of the corpus, in corpus order (see the module's docstring): a function of the files'
    contents and names' formats, so the same corpus always gives the same units."""
    settings = {
        "format_version": FORMAT_VERSION,
        "tokenizer": tokenizer_sha256,
        "split_sentences": data.split_sentences,
        "validation_fraction": data.validation_fraction,
        "max_line_chars": MAX_LINE_CHARS,
    }
    units: list[Unit] = []
    group: list[tuple[Part, int, tuple[int, int, int], str]] = []  # (part, size, piece, sha256)

    def close(members: list[tuple[Part, int, tuple[int, int, int], str]]) -> None:
        if not members:
            return
        content = _digest([[_reading(m[0].path), m[3]] for m in members])
        units.append(
            Unit(
                key=_digest({**settings, "content": content}),
                content=content,
                parts=tuple(m[0] for m in members),
                sizes=tuple(m[1] for m in members),
                pieces=tuple(m[2] for m in members),
            )
        )

    for number, (path, entry) in enumerate(zip(files, entries)):
        if "parts" in entry:  # a large file, cut into parts: a unit each
            close(group)
            group = []
            for p in entry["parts"]:
                close(
                    [
                        (
                            Part(path, p["start"], p["end"], p["line"]),
                            p["end"] - p["start"],
                            (number, p["start"], p["end"]),
                            p["sha256"],
                        )
                    ]
                )
            continue
        member = (Part(path), entry["bytes"], (number, 0, entry["bytes"]), entry["sha256"])
        if entry["bytes"] >= UNIT_BYTES:  # a large compressed file (or one without a boundary to cut at)
            close(group)
            close([member])
            group = []
            continue
        group.append(member)
        if (
            int(entry["sha256"][:16], 16) < (entry["bytes"] << 64) // UNIT_BYTES
        ):  # closes its run: P = size / UNIT_BYTES
            close(group)
            group = []
    close(group)
    return units


def _index_digest(units: list[Unit]) -> str:
    return _digest({"format_version": FORMAT_VERSION, "units": [u.key for u in units]})


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
        for name, values, dtype in (
            (TOKENS, self.tokens, self.dtype),
            (SEG_OFFSETS, self.seg_offsets, np.int64),
            (DOC_OFFSETS, self.doc_offsets, np.int64),
        ):
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


def sample_line(sample: dict[str, Any]) -> str:
    """What trained the vocabulary (manifest["tokenizer"]["sample"]), in words that follow "trained on" or "from"."""
    if sample["whole"] and not sample["sample_chars"]:
        return "the whole corpus (data.tokenizer.sample_chars=0)"
    if sample["whole"]:
        return (
            f"the whole corpus ({sample['corpus_chars']:,} characters, within data.tokenizer.sample_chars="
            f"{sample['sample_chars']:,})"
        )
    share = sample["chars"] / max(sample["corpus_chars"], 1)
    return (
        f"a sample of {sample['lines']:,} lines, {sample['chars']:,} of the corpus's {sample['corpus_chars']:,} "
        f"characters ({100 * share:.1f}%), chosen by a hash of each line all over the corpus "
        f"(data.tokenizer.sample_chars={sample['sample_chars']:,}; 0 trains on the whole corpus)"
    )


def vocabulary_sample(manifest: dict[str, Any]) -> str | None:
    """What trained the vocabulary of prepared data, in words (sample_line); None for a given tokenizer,
    for data from before the sample was recorded, and for a manifest whose record is malformed."""
    sample = manifest["tokenizer"].get("sample")
    if not (
        isinstance(sample, dict)
        and isinstance(sample.get("whole"), bool)
        and all(_count(sample.get(k)) for k in ("sample_chars", "corpus_chars", "lines", "chars"))
    ):
        return None
    return sample_line(sample)


def _progress(total: int | None, desc: str, quiet: bool):
    from tqdm import tqdm

    return tqdm(
        total=total, unit="B", unit_scale=True, desc=desc, file=sys.stderr, disable=quiet or None, dynamic_ncols=True
    )


@dataclass(frozen=True)
class UnitSettings:
    """What a worker needs besides the unit and the tokenizer (picklable)."""

    split_sentences: bool
    validation_fraction: float
    dtype: str
    owner: int  # the pid of the `prepare` that owns the temporary names (its workers write them)


def _prepare_unit(
    root: Path, unit: Unit, tok: Tokenizer, *, settings: UnitSettings, progress: Callable[[int], None]
) -> dict[str, Any]:
    """Tokenize one unit into root/units/KEY (written under a temporary name, renamed when complete);
    return its record (counts per split, unknown tokens). Documents are held out by their number in
    the unit (see Unit.phase). Runs in a worker process or in `prepare`'s own."""
    final = root / UNITS / unit.key
    tmp = root / UNITS / f"{atomic.TMP_PREFIX}{unit.key}.{settings.owner}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        dtype = np.dtype(settings.dtype)
        writers = {split: ShardWriter(tmp / split, dtype) for split in SPLITS}
        unk = special_tokens(tok).unk
        fraction = settings.validation_fraction
        phase = unit.phase(held_out_stride(fraction))
        counts = {"documents": 0, "unknown": 0}
        encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no offsets: faster where available

        def flush(items: list[str | None]) -> None:
            _check_stop()
            encodings = iter(encode([s for s in items if s is not None], add_special_tokens=False))
            for item in items:
                writer = writers["valid" if is_held_out(counts["documents"], fraction, phase) else "train"]
                if item is None:
                    if writer.open_segments:
                        counts["documents"] += 1
                    writer.end_document()
                    continue
                ids = next(encodings).ids
                if ids:
                    counts["unknown"] += ids.count(unk)
                    writer.add_segment(ids)

        batch: list[str | None] = []
        pending = chars = 0
        for part, size in zip(unit.parts, unit.sizes):
            compressed = is_compressed(part.path)  # progress in the file's bytes: a compressed one's at its end
            for item in read_sentences([part], settings.split_sentences, (lambda n: None) if compressed else progress):
                batch.append(item)
                if item is not None:
                    pending += 1
                    chars += len(item)
                if (
                    pending >= ENCODE_BATCH or chars >= ENCODE_CHARS
                ):  # a document may span batches: the writers keep it open
                    flush(batch)
                    batch, pending, chars = [], 0, 0
            if compressed:
                progress(size)
        flush(batch)
        record = {
            "bertcli_version": __version__,
            "key": unit.key,
            "splits": {split: w.close() for split, w in writers.items()},
            "unknown_tokens": counts["unknown"],
        }
        with atomic.writing(tmp / UNIT_RECORD), open(tmp / UNIT_RECORD, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(record, indent=2) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        for path in (*(tmp / split for split in SPLITS), tmp):
            atomic.fsync_path(path)
        _replace_folder(tmp, final, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return record


def _replace_folder(tmp: Path, final: Path, root: Path) -> None:
    """Rename the complete folder `tmp` to `final`, removing a damaged copy there first (bertcli's own
    only: a folder there holding anything else is refused)."""
    if final.exists() or final.is_symlink():
        if not _ours(final, root):
            raise UsageError(
                f"{final} holds files that bertcli did not write, so it was left untouched: move it out "
                "of the prepared folder, then run the same command"
            )
        atomic.remove_folder(final)
    os.replace(tmp, final)
    atomic.fsync_path(final.parent)


# ---------------------------------------------------------------- workers
# A worker is `python -c "...; _worker_main()"`, not a multiprocessing process: it imports bertcli's
# data modules only (never the parent's __main__, which spawn would run again: a user's script, a
# notebook, stdin), and it speaks JSON lines on its stdin and stdout (nothing is unpickled).
#   parent -> worker: {"tokenizer": path of tokenizer.json, "settings": {...}}, then one unit a line; EOF: no more
#   worker -> parent: {"progress": bytes} | {"done": key, "record": {...}} | {"error": kind, ...}


def _unit_json(root: Path, unit: Unit) -> str:
    return json.dumps(
        {
            "root": str(root),
            "key": unit.key,
            "content": unit.content,
            "sizes": list(unit.sizes),
            "pieces": [list(p) for p in unit.pieces],
            "parts": [[str(p.path), p.start, p.end, p.line] for p in unit.parts],
        }
    )


def _unit_from_json(line: str) -> tuple[Path, Unit]:
    job = json.loads(line)
    parts = tuple(Part(Path(path), start, end, line) for path, start, end, line in job["parts"])
    return Path(job["root"]), Unit(
        key=job["key"],
        content=job["content"],
        parts=parts,
        sizes=tuple(job["sizes"]),
        pieces=tuple(tuple(p) for p in job["pieces"]),
    )


def _worker_main() -> None:
    """A worker process: prepares the units it reads on stdin with one encoding thread (N workers
    means N cores), writing progress, records and the first error as JSON lines on stdout."""
    for signum in (signal.SIGINT, signal.SIGHUP):  # they reach the whole process group: the parent ends us
        signal.signal(signum, signal.SIG_IGN)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # read by tokenizers at each call
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # what a library prints goes to stderr, never into the messages

    def say(message: dict[str, Any]) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    header = json.loads(sys.stdin.readline())
    tok = read_tokenizer_json(Path(header["tokenizer"]))  # the prepared folder's: the one the units' keys name
    settings = UnitSettings(**header["settings"])
    for line in sys.stdin:
        root, unit = _unit_from_json(line)
        pending = 0

        def progress(n: int) -> None:
            nonlocal pending
            pending += n
            if pending >= PROGRESS_BYTES:
                say({"progress": pending})
                pending = 0

        try:
            record = _prepare_unit(root, unit, tok, settings=settings, progress=progress)
        except UsageError as exc:
            say({"error": "usage", "message": str(exc)})
            return
        except OSError as exc:  # a full disk, a file that went away: the parent words it as it would its own
            say({"error": "os", "errno": exc.errno, "strerror": exc.strerror, "filename": exc.filename})
            return
        except Exception as exc:  # noqa: BLE001  anything else: its words, for the parent's one line
            say({"error": "other", "message": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"})
            return
        say({"progress": pending})
        say({"done": unit.key, "record": record})


def _raise_worker_error(message: dict[str, Any]) -> None:
    """A worker's error, raised as the exception it was there."""
    if message["error"] == "usage":
        raise UsageError(message["message"])
    if message["error"] == "os":
        raise OSError(message["errno"], message["strerror"], message["filename"])
    raise RunError(f"preparing the corpus failed in a worker process: {message['message']}")


@contextmanager
def _one_core(workers: int) -> Iterator[None]:
    """With one worker, the tokenizer encodes (and trains) on one thread: 1 worker means one core."""
    if workers > 1:
        yield
        return
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


def _prepare_units(
    todo: list[Unit], root: Path, tok: Tokenizer, *, settings: UnitSettings, workers: int, quiet: bool
) -> dict[str, dict[str, Any]]:
    """Prepare `todo` into root/units/ on `workers` processes (in this one when one worker or one unit
    is enough); return each unit's record by key. The first error in a worker is raised here as it
    was raised there; a stop signal ends the workers at once. Progress: bytes of the corpus."""
    todo = list({u.key: u for u in todo}.values())  # a unit twice (two equal files): prepared once, read twice
    (root / UNITS).mkdir(parents=True, exist_ok=True)
    with _progress(sum(u.bytes for u in todo), "tokenizing", quiet) as bar:
        if workers <= 1 or len(todo) <= 1:
            return {unit.key: _prepare_unit(root, unit, tok, settings=settings, progress=bar.update) for unit in todo}
        return _run_workers(todo, root, settings=settings, count=min(workers, len(todo)), progress=bar.update)


@dataclass
class _Worker:
    proc: subprocess.Popen
    job: str | None = None  # the key of the unit it is preparing
    buffer: bytes = b""  # stdout read but not yet a whole line
    stderr: bytes = b""  # the tail of what it said on stderr (a crash's last words)


def _run_workers(
    todo: list[Unit], root: Path, *, settings: UnitSettings, count: int, progress: Callable[[int], None]
) -> dict[str, dict[str, Any]]:
    """`count` worker processes take the units, largest first (so that the last to finish is a small
    one), each a new one as it finishes the last."""
    import selectors

    waiting = sorted(todo, key=lambda u: -u.bytes)
    records: dict[str, dict[str, Any]] = {}
    header = (
        json.dumps({"tokenizer": str(root / layout.TOKENIZER_JSON), "settings": dataclasses.asdict(settings)}) + "\n"
    )
    selector = selectors.DefaultSelector()
    workers: list[_Worker] = []

    def give(worker: _Worker) -> None:
        assert worker.proc.stdin is not None
        try:
            if waiting:
                unit = waiting.pop(0)
                worker.job = unit.key
                worker.proc.stdin.write((_unit_json(root, unit) + "\n").encode())
                worker.proc.stdin.flush()
            else:
                worker.job = None
                worker.proc.stdin.close()
        except BrokenPipeError:
            pass  # it died: seen below

    try:
        _start_workers(count, into=workers)
        for worker in workers:
            assert worker.proc.stdin is not None and worker.proc.stdout is not None and worker.proc.stderr is not None
            worker.proc.stdin.write(header.encode())
            selector.register(worker.proc.stdout, selectors.EVENT_READ, (worker, "out"))
            selector.register(worker.proc.stderr, selectors.EVENT_READ, (worker, "err"))
            give(worker)
        while len(records) < len(todo):
            _check_stop()
            for key, _ in selector.select(timeout=0.2):
                worker, stream = key.data
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fileobj)
                elif stream == "err":
                    worker.stderr = (worker.stderr + chunk)[-2000:]
                else:
                    for done in _worker_messages(worker, chunk, progress):
                        records[done[0]] = done[1]
                        give(worker)
            _check_workers_alive(workers, records)
    finally:
        _stop_workers(workers)
        selector.close()
    return records


def _start_workers(count: int, *, into: list[_Worker]) -> None:
    """Start `count` worker processes (plain interpreters running _worker_main, one thread each, importing
    this bertcli), each added to `into` as it starts (so that a failure to start one stops the others)."""
    package = str(Path(__file__).resolve().parents[2])  # the folder holding this bertcli: the workers import it
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (package, os.environ.get("PYTHONPATH")) if p),
        "TOKENIZERS_PARALLELISM": "false",
        "RAYON_NUM_THREADS": "1",
    }
    command = [sys.executable, "-c", "from bertcli.data.prepare import _worker_main; _worker_main()"]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    for _ in range(count):
        into.append(_Worker(subprocess.Popen(command, env=env, **pipes)))


def _worker_messages(
    worker: _Worker, chunk: bytes, progress: Callable[[int], None]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The (unit key, record) of each unit `worker` finished, from the JSON lines it wrote (`chunk`, a
    read of its stdout, completed by what it buffered); progress reported; an error raised."""
    worker.buffer += chunk
    *lines, worker.buffer = worker.buffer.split(b"\n")
    for line in lines:
        message = json.loads(line)
        if "progress" in message:
            progress(message["progress"])
        elif "done" in message:
            yield message["done"], message["record"]
        else:
            _raise_worker_error(message)


def _check_workers_alive(workers: list[_Worker], records: dict[str, dict[str, Any]]) -> None:
    """A RunError when a worker ended before finishing its unit (killed for memory, say)."""
    for worker in workers:
        if worker.job is not None and worker.job not in records and worker.proc.poll() is not None:
            time.sleep(0.2)  # a stop signal to the whole group ends the workers too: say that instead
            _check_stop()
            words = worker.stderr.decode(errors="replace").strip().splitlines()
            raise RunError(
                f"a worker process preparing the corpus ended without finishing (exit code "
                f"{worker.proc.returncode}{': ' + words[-1] if words else '; killed for memory?'}); "
                "run `bertcli prepare` again, with fewer workers if it happens again"
            )


def _stop_workers(workers: list[_Worker]) -> None:
    """End the workers still running and close their pipes."""
    for worker in workers:
        if worker.proc.poll() is None:
            worker.proc.terminate()
    for worker in workers:
        worker.proc.wait()
        for stream in (worker.proc.stdin, worker.proc.stdout, worker.proc.stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:  # (a pipe the worker never read: closing flushes into nothing)
                pass


# ---------------------------------------------------------------- the index


def _write_index(root: Path, units: list[Unit], records: dict[str, dict[str, Any]], digest: str) -> None:
    """index/DIGEST: each split's segment and document offsets of the whole corpus, the units' own
    shifted by the tokens and segments of the units before them, written in blocks (bounded memory)."""
    final = root / INDEX / digest
    tmp = root / INDEX / f"{atomic.TMP_PREFIX}{digest}.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    block = 1 << 20
    try:
        for split in SPLITS:
            (tmp / split).mkdir(parents=True)
            tokens = segments = 0
            # (the folder named for a full disk met where no file is: closing flushes what is buffered)
            with (
                atomic.writing(tmp / split),
                open(tmp / split / SEG_OFFSETS, "wb") as seg_out,
                open(tmp / split / DOC_OFFSETS, "wb") as doc_out,
            ):
                for out, name in ((seg_out, SEG_OFFSETS), (doc_out, DOC_OFFSETS)):
                    with atomic.writing(tmp / split / name):
                        out.write(np.zeros(1, dtype=np.int64).data)
                for unit in units:
                    counts = records[unit.key]["splits"][split]
                    if counts["documents"] == 0:
                        continue
                    base = root / UNITS / unit.key / split
                    for out, name, shift in ((seg_out, SEG_OFFSETS, tokens), (doc_out, DOC_OFFSETS, segments)):
                        offsets = np.memmap(base / name, dtype=np.int64, mode="r")
                        for lo in range(1, len(offsets), block):
                            with atomic.writing(tmp / split / name):
                                out.write((offsets[lo : lo + block] + shift).data)
                        del offsets
                    tokens += counts["tokens"]
                    segments += counts["segments"]
                for out, name in ((seg_out, SEG_OFFSETS), (doc_out, DOC_OFFSETS)):
                    with atomic.writing(tmp / split / name):
                        out.flush()
                        os.fsync(out.fileno())
            atomic.fsync_path(tmp / split)
        atomic.fsync_path(tmp)
        _replace_folder(tmp, final, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ---------------------------------------------------------------- prepare


def prepare(
    cfg: Config,
    quiet: bool = False,
    force: bool = False,
    workers: int | None = None,
    resume_from: Path | None = None,
    vocab_check: Callable[[int], None] | None = None,
) -> Path:
    """Prepare the corpus of resolved config `cfg` (see resolve.py) on `workers` processes (default:
    the cores available), keeping what is already prepared, whole and undamaged; return the prepared
    folder. SIGINT and SIGTERM stop it at once (what it was writing is removed; exit 130 or 143).
    `resume_from`: a checkpoint the run will resume from (see run_tokenizer). `vocab_check`: called
    with the vocabulary's size once it is known, before the corpus is tokenized (pretrain refuses a
    model its disk has no room for there, not after the whole corpus is prepared: trial 18 U1)."""
    workers = workers or default_workers()
    with _stop_on_signal(Path(cfg.data.prepared_dir)), _one_core(workers):
        return _prepare(cfg, quiet, force, workers, resume_from=resume_from, vocab_check=vocab_check)


@dataclass
class _Plan:
    """What `prepare` found and will do."""

    folder: Path
    files: list[Path]
    entries: list[dict[str, Any]]
    tok: Tokenizer | None  # None: to be trained
    tokenizer_file: Path | None  # the given or the run's tokenizer file; None: trained (or kept)
    given_sha256: str | None  # the given tokenizer (data.tokenizer.path) as loaded
    vocab_check: Callable[[int], None] | None = None  # see prepare


def _prepare(
    cfg: Config,
    quiet: bool,
    force: bool,
    workers: int,
    resume_from: Path | None = None,
    vocab_check: Callable[[int], None] | None = None,
) -> Path:
    data = cfg.data
    folder = Path(data.prepared_dir)
    stand_in = stands_in(cfg)  # the corpus is not here: its prepared data stands in, if it can
    if stand_in and force:  # (trial 27 C1: "corpus not found", though a plain prepare used the data)
        raise UsageError(
            f"{data.corpus}: corpus not found, and --force prepares from the corpus; without --force, the data prepared "
            f"from it in {folder} stands in for it"
        )
    files = [] if stand_in else corpus_files(corpus_path(cfg))
    guard = _guard(cfg, folder)
    ownership.remove_leftover_folders(folder, layout.PREPARED)
    old, why_not = read_manifest(folder)
    if old is not None:
        _clean_inside(folder)
    stand_in = stand_in and old is not None  # (a manifest gone meanwhile: the corpus is not found, below)
    if stand_in:  # the files as recorded: they are not here to be read
        entries = old["corpus"]["files"]
        files = [Path(e["path"]) for e in entries]
    else:
        files = files or corpus_files(corpus_path(cfg))
        # The hashes recorded for files cut at another UNIT_BYTES are not those of today's parts.
        entries = _file_entries(files, old["corpus"]["files"] if old and old.get("unit_bytes") == UNIT_BYTES else [])
        _say_copies(entries)
    tokenizer_file, tok = fixed_tokenizer(cfg, resume_from) or (None, None)
    given_sha256 = fixed = None
    if data.tokenizer.path:
        check_ids(tok, tokenizer_file)  # its vocab.txt is written into the data and every checkpoint
        if clashes := casing_clashes(tok, data.tokenizer):
            log(
                f"warning: {clashes}: ignored, as the tokenizer of data.tokenizer.path ({tokenizer_file}) keeps its "
                "own casing (its vocabulary was made with it); set them as the tokenizer has them"
                + (
                    ""
                    if cfg.model.init_from
                    else ", or leave data.tokenizer.path empty to train a tokenizer of your own"
                )
            )
        # The loaded tokenizer as it is used (casing from a tokenizer_config.json, padding off), not its file
        # alone: data prepared with a tokenizer that padded (older bertcli) is prepared again.
        given_sha256 = hashlib.sha256(tok.to_str().encode()).hexdigest()
    else:  # the run's checkpoints fix its token ids, if any: never train another vocabulary under them
        fixed = tokenizer_file
        if fixed is not None:
            _say_ignored_tokenizer_settings(cfg, fixed)
    plan = _Plan(
        folder=folder,
        files=files,
        entries=entries,
        tok=tok,
        tokenizer_file=tokenizer_file,
        given_sha256=given_sha256,
        vocab_check=vocab_check,
    )
    # Before any work: the model's padding row is the tokenizer's [PAD] (a trained one's is SPECIAL's first, 0).
    pad = cfg.model.pad_problem(
        tok.token_to_id("[PAD]") if tok is not None else SPECIAL.index("[PAD]"), str(tokenizer_file or data.corpus)
    )
    if pad:
        raise UsageError(pad)
    if stand_in:
        return _stand_in(cfg, plan, old)

    if old is not None and not force:
        why_new = _tokenizer_changed(old, plan, data, folder)
        if why_new is None:
            kept_tok = read_tokenizer_json(folder / layout.TOKENIZER_JSON)
            units = plan_units(files, entries, _tokenizer_sha256(kept_tok), data)
            kept, total = _unchanged_bytes(entries, old["corpus"]["files"]), sum(e["bytes"] for e in entries)
            if tok is not None or kept >= KEEP_TOKENIZER_SHARE * total:  # a given or the run's tokenizer: always kept
                return _update(cfg, plan, old=old, tok=kept_tok, units=units, quiet=quiet, workers=workers)
            _say_changes(
                cfg,
                plan,
                old,
                f"{100 * (1 - kept / max(total, 1)):.0f}% of the corpus is new: a new tokenizer is trained on it",
            )
        elif why_new.startswith("is damaged"):
            log(f"prepared data in {folder} {why_new}: preparing it again")
        else:  # the data of other inputs: say which, since another run may be sharing the folder
            _say_changes(cfg, plan, old, None)
    elif why_not and not force:
        guard(folder)  # a folder bertcli did not write is refused, not said to be prepared again (trial 22 P2)
        log(f"prepared data in {folder} {why_not}: preparing it again")
    if fixed is not None:
        info(
            f"preparing {data.corpus} with the run's own tokenizer, {fixed} (its checkpoints were trained on its "
            "token ids; a new vocabulary would garble them)"
        )
    return _fresh(cfg, plan, guard=guard, quiet=quiet, workers=workers)


def _say_changes(cfg: Config, plan: _Plan, old: dict[str, Any], why: str | None) -> None:
    """Say that the prepared folder, made from other inputs (_changes), is prepared again, and `why` a
    changed corpus gets a new tokenizer."""
    configured = plan.tokenizer_file if cfg.data.tokenizer.path else None
    changes = _changes(
        old, plan.entries, cfg.data, configured=configured, tok=plan.tok, output_dir=Path(cfg.output_dir)
    )
    info(
        f"prepared data in {plan.folder} was made from other inputs than this config's ({'; '.join(changes)}): "
        "preparing it again"
    )
    run = plan.folder.parent
    found = layout.identify(run)
    if found.kind is layout.Kind.RUN and found.checkpoints and run.resolve() != Path(cfg.output_dir).resolve():
        # (trial 26 P6: two runs sharing a prepared folder, each prepare redid the whole corpus for the other)
        log(
            f"warning: {plan.folder} is the prepared data of the run in {run}, whose checkpoints were trained on "
            "the tokenizer it held: that run's next pretrain prepares it again, and each prepare of one redoes the "
            "whole corpus while they share it; give this run a data.prepared_dir of its own"
        )
    if why:
        info(f"prepared data in {plan.folder}: {why}")


PREPARED_SHARE = 0.2  # bytes of prepared data per byte of corpus file, at least (English text: 0.5 to 0.6)


def _check_room(folder: Path, corpus_bytes: int) -> None:
    """Refuse (exit 1) to prepare `corpus_bytes` of corpus files (compressed ones at their size: a lower
    bound) into `folder` where its disk has no room for PREPARED_SHARE of them: it would fill part-way
    (trial 26 C5: after 25 s of a 44 s prepare; hours in at scale)."""
    free, need = free_bytes(folder), PREPARED_SHARE * corpus_bytes
    if free is not None and free < need:
        raise RunError(
            f"{folder}: its disk has {free / 2**20:,.1f} MiB free, and preparing {corpus_bytes / 2**20:,.1f} MiB of "
            f"corpus takes at least {need / 2**20:,.1f} MiB (about half the text's size for English): free space, "
            "or set data.prepared_dir to another disk"
        )


def _tokenizer_sha256(tok: Tokenizer) -> str:
    """What the units' keys take of the tokenizer: all of it as used (vocabulary, normaliser, model settings)."""
    return hashlib.sha256(tok.to_str().encode()).hexdigest()


def _say_ignored_tokenizer_settings(cfg: Config, file: Path) -> None:
    """Warn of data.tokenizer settings other than those of the checkpoint whose tokenizer `file` the run keeps
    (trial 27 C5: `prepare --set data.tokenizer.vocab_size=5000` on a run with checkpoints, unsaid; a resume
    says it)."""
    from bertcli.checkpoint import read_config, tokenizer_setting_changes  # (checkpoint imports nothing of prepare)

    try:
        changed = tokenizer_setting_changes(read_config(file.parent), cfg)
    except (BertcliError, OSError):
        return
    if changed:
        log(
            f"warning: {changed}: ignored, as this run keeps the tokenizer of its checkpoints ({file}: its "
            "token ids are what the model learned); start a run in a new output_dir to change it"
        )


def _tokenizer_settings(data: DataConfig, corpus_chars: int) -> dict[str, Any]:
    """The data.tokenizer settings a tokenizer trained on a corpus of `corpus_chars` characters depends
    on: all but its path, and the vocabulary sample's budget only where it is below the corpus (a
    budget that covers the corpus trains on all of it, whatever its figure)."""
    settings = {k: v for k, v in dataclasses.asdict(data.tokenizer).items() if k != "path"}
    if not 0 < settings.get("sample_chars", 0) < corpus_chars:
        settings["sample_chars"] = None
    return settings


def made_from(cfg: Config, manifest: dict[str, Any]) -> bool:
    """Whether prepared data `manifest` holds a tokenizer trained from cfg's corpus files (by path) and
    tokenizer settings, at a glance: nothing is hashed (inspect's question; prepare checks contents)."""
    recorded = manifest["tokenizer"]
    sample = recorded.get("sample")
    trained_on = sample.get("corpus_chars") if isinstance(sample, dict) else None
    if recorded.get("source") != "trained" or not _count(trained_on):
        return False
    with console.silent():  # (what it says of the corpus, preparing says)
        try:
            paths = {str(f.resolve()) for f in corpus_files(corpus_path(cfg))}
        except UsageError:
            return False
    return recorded.get("settings") == _tokenizer_settings(cfg.data, trained_on) and paths == {
        e.get("path") for e in manifest["corpus"]["files"]
    }


def stands_in(cfg: Config) -> bool:
    """Whether data.corpus is not there (moved, unmounted, not copied to the machine that trains) and
    data.prepared_dir holds data prepared from it, which then stands in for it if it is of this config's
    settings and whole (_stand_in; trial 26 U2: a run could not train on its prepared data alone)."""
    if cfg.data.corpus in ("synthetic", "sample") or corpus_path(cfg).is_symlink():
        return False
    gone = corpus_gone(read_manifest(Path(cfg.data.prepared_dir))[0])
    return gone is not None and os.path.realpath(gone) == os.path.realpath(cfg.data.corpus)


def _stand_in(cfg: Config, plan: _Plan, old: dict[str, Any]) -> Path:
    """The prepared folder, as it is, for a corpus that is not there (stands_in): where it was prepared with
    this config's settings (and tokenizer) and its files are whole; else one line saying why it cannot."""
    data, folder = cfg.data, plan.folder
    why = _tokenizer_changed(old, plan, data, folder)
    if why is None and (changed := _unit_setting_changes(old, data)):
        why = f"was prepared with other settings ({'; '.join(changed)})"
    if why is None and old.get("unit_bytes") != UNIT_BYTES:  # its units are cut otherwise: not this plan's
        why = "was prepared by another version of bertcli (in units of another size)"
    if why is None:
        tok = read_tokenizer_json(folder / layout.TOKENIZER_JSON)
        if _index_digest(plan_units(plan.files, plan.entries, _tokenizer_sha256(tok), data)) != old["index"]:
            why = "does not hold the corpus's units as recorded"
    if why is None and (damage := check_prepared(folder, old)) is not None:
        why = f"is damaged ({damage})"
    if why is not None:
        raise UsageError(
            f"{data.corpus}: corpus not found, and the data prepared from it in {folder} {why}, so it cannot stand "
            "in for it: put the corpus back (or set data.corpus to where it is now)"
        )
    splits = old["splits"]
    where = (
        "is an empty folder (not mounted?)"
        if Path(data.corpus).is_dir()
        else "is not there (moved, or not on this machine)"
    )
    log(
        f"warning: {data.corpus} {where}: the data prepared from it in {folder} "
        f"stands in as it is ({splits['train']['documents'] + splits['valid']['documents']:,} documents, prepared "
        f"{old.get('created', 'earlier')}); whether the corpus changed since cannot be checked"
    )
    return folder


def _tokenizer_changed(old: dict[str, Any], plan: _Plan, data: DataConfig, folder: Path) -> str | None:
    """Why the prepared folder's tokenizer cannot be kept (None: it can): another tokenizer was given,
    the run's is another, the training settings changed, or its files are damaged."""
    recorded = old["tokenizer"]
    if plan.given_sha256 is not None:
        if recorded.get("given_sha256") != plan.given_sha256:
            return "was prepared with another tokenizer (data.tokenizer.path)"
    elif plan.tok is not None:  # the run's own
        if recorded.get("identity") != tokenizer_identity(plan.tok):
            return "was prepared with a tokenizer other than the run's own"
    else:
        sample = recorded.get("sample")
        trained_on = sample.get("corpus_chars") if isinstance(sample, dict) else None
        if (
            recorded.get("source") != "trained"
            or not _count(trained_on)
            or recorded.get("settings") != _tokenizer_settings(data, trained_on)
        ):
            return "was prepared with other tokenizer settings (data.tokenizer)"
    damage = _check_tokenizer(folder, old)
    if damage is not None:
        return f"is damaged ({damage})"
    return None


def _settings(data: DataConfig, tok: Tokenizer) -> UnitSettings:
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    dtype = np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)
    return UnitSettings(data.split_sentences, data.validation_fraction, dtype.name, os.getpid())


def _fresh(cfg: Config, plan: _Plan, *, guard: Callable[[Path], None], quiet: bool, workers: int) -> Path:
    """Everything prepared into a temporary folder that then replaces the prepared folder whole."""
    global _state
    data, folder, files = cfg.data, plan.folder, plan.files
    start = time.perf_counter()
    tok = plan.tok
    total_bytes = None if any(is_compressed(f) for f in files) else sum(e["bytes"] for e in plan.entries)
    sample: dict[str, Any] | None = None  # what trained the vocabulary, for the manifest (None: given tokenizer)
    # Before the tokenizer is trained (seconds to minutes): the units' held-out phases depend on their bytes alone.
    _check_enough_documents(plan_units(files, plan.entries, "", data), data)
    _check_room(folder, sum(e["bytes"] for e in plan.entries))
    with atomic.folder(folder, guard) as tmp:
        if tok is None:
            chars = scan_characters(read_text(files), data.tokenizer)
            lines = LineSample(data.tokenizer.sample_chars or chars.count, chars.count)
            with _progress(total_bytes, "training tokenizer", quiet) as bar:
                read = read_sentences(files, split=data.split_sentences, progress=_polling(bar.update), keep=lines)
                sentences = _until_stopped(s for s in read if s is not None)
                tok = train_wordpiece(sentences, data.tokenizer, chars)
            _check_stop()  # a signal cut the reading short: that vocabulary must not be used
            sample = {
                "sample_chars": data.tokenizer.sample_chars,
                "corpus_chars": chars.count,
                "whole": lines.whole,
                "lines": lines.lines,
                "chars": lines.chars,
            }
            if not lines.whole:
                info(f"the vocabulary was trained on {sample_line(sample)}")
            size = tok.get_vocab_size(with_added_tokens=True)
            if size > 1.25 * data.tokenizer.vocab_size:  # every character has its pieces, whatever the size asked
                log(
                    f"warning: the vocabulary has {size:,} tokens, {size / data.tokenizer.vocab_size:.1f}x "
                    f"data.tokenizer.vocab_size={data.tokenizer.vocab_size:,}: every character of the corpus is a "
                    f"token ({len(chars.every):,}), and each that continues a word a ## piece ({len(chars.inner):,}), "
                    "so the embeddings grow with the corpus's scripts; raise vocab_size for its words, or give a "
                    "tokenizer (data.tokenizer.path)"
                )
            elif not lines.whole and (warning := small_vocab_warning(size, sample, data)):
                log(warning)
        save_tokenizer(tok, tmp)
        tok = read_tokenizer_json(tmp / layout.TOKENIZER_JSON)  # as every later prepare reads it (the units' keys)
        if plan.vocab_check is not None:
            plan.vocab_check(tok.get_vocab_size(with_added_tokens=True))
        units = plan_units(files, plan.entries, _tokenizer_sha256(tok), data)
        settings = _settings(data, tok)
        records = _prepare_units(units, tmp, tok, settings=settings, workers=workers, quiet=quiet)
        manifest = _manifest(
            cfg,
            plan,
            tok=tok,
            root=tmp,
            units=units,
            records=records,
            settings=settings,
            sample=sample,
            old_tokenizer=None,
            seconds=time.perf_counter() - start,
            prepared=units,
        )
        _check_sizes(manifest, data)
        _write_index(tmp, units, records, manifest["index"])
        _write_manifest(tmp, manifest)
        _check_stop()
    _state = f"the prepared data in {folder} is complete"  # in place: a stop from here on keeps it
    _report(folder, manifest, cfg, f"prepared {folder}")
    return folder


def _update(
    cfg: Config, plan: _Plan, *, old: dict[str, Any], tok: Tokenizer, units: list[Unit], quiet: bool, workers: int
) -> Path:
    """The prepared folder, brought up to date in place: its tokenizer kept, the units it holds
    intact kept, the others prepared; a new index and manifest if anything changed."""
    global _state
    data, folder = cfg.data, plan.folder
    start = time.perf_counter()
    settings = _settings(data, tok)
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    if plan.vocab_check is not None:
        plan.vocab_check(vocab_size)
    records = {u["key"]: u for u in old["units"]}
    old_keys = set(records)
    todo, damaged = [], []
    for unit in {u.key: u for u in units}.values():  # a unit twice (two equal files): prepared once, read twice
        record = records.get(unit.key) or _stray_record(folder, unit.key)
        problem = (
            "missing"
            if record is None
            else _check_unit(folder, unit.key, record, dtype_name=settings.dtype, vocab_size=vocab_size)
        )
        if problem is None:
            records[unit.key] = record
            continue
        if unit.key in old_keys:
            damaged.append(problem)
        todo.append(unit)
    digest = _index_digest(units)
    # With a unit damaged, the index is written again with it (its check would read the damaged files).
    index_damage = None if damaged else _check_index(folder, old)
    index_problem = "written again with the damaged units" if damaged else index_damage and index_damage[0]
    suspect = index_damage[1] if index_damage else None
    current = {u.key: u for u in units}
    if suspect in current and suspect in old_keys and suspect not in {u.key for u in todo}:
        # The unit or the index: neither is taken for the truth; the unit is prepared again, then the index.
        damaged.append(index_problem)
        todo.append(current[suspect])
    if not todo and digest == old["index"] and index_problem is None:
        if [(e["path"], e["mtime_ns"]) for e in plan.entries] != [
            (e["path"], e["mtime_ns"]) for e in old["corpus"]["files"]
        ] or old["corpus"]["source"] != data.corpus:  # the same contents: record the files as they are now
            _write_manifest(folder, {**old, "corpus": {"source": data.corpus, "files": plan.entries}})
        _remove_unused(folder, old)  # units a stopped prepare finished for a corpus that is not this one
        info(f"prepared data in {folder} is up to date (corpus and settings unchanged, files intact): reusing it")
        _warn_random_next(folder, old, cfg)
        return folder
    problem = damaged[0] if damaged else index_problem
    line = _update_line(
        plan,
        todo,
        new_keys={u.key for u in units},
        old_keys=old_keys,
        problem=problem,
        settings=_unit_setting_changes(old, data),
        same_contents={u.content for u in units} == _old_contents(old),
        files=_file_changes(old["corpus"]["files"], plan.entries, root=corpus_path(cfg)),
    )
    (log if problem else info)(line)
    _state = f"the prepared data in {folder} is as it was (units finished are kept for the next prepare)"
    _check_room(folder, sum(u.bytes for u in todo))
    try:
        records.update(_prepare_units(todo, folder, tok, settings=settings, workers=workers, quiet=quiet))
        _warn_unknown(plan, todo, units, records, old=old)
        manifest = _manifest(
            cfg,
            plan,
            tok=tok,
            root=folder,
            units=units,
            records=records,
            settings=settings,
            sample=None,
            old_tokenizer=old["tokenizer"],
            seconds=time.perf_counter() - start,
            prepared=todo,
        )
        _check_sizes(manifest, data)
        if digest != old["index"] or index_problem is not None:
            _write_index(folder, units, records, digest)
        _check_stop()
        _write_manifest(folder, manifest)  # the commit point
        _state = f"the prepared data in {folder} is complete"
    finally:
        _clean_inside(folder, mine=True)
    _remove_unused(folder, manifest)
    _report(folder, manifest, cfg, f"updated {folder}")
    return folder


UNKNOWN_SHARE = 0.01  # [UNK] in the units an update prepares beyond this share, and 5x the rest's, is warned of


def _warn_unknown(
    plan: _Plan, todo: list[Unit], units: list[Unit], records: dict[str, dict[str, Any]], *, old: dict[str, Any]
) -> None:
    """Warn where the units an update prepared are far more [UNK] than the units kept, or than the data
    before it (`old`'s manifest) where none was kept: text in characters the kept tokenizer lacks (trial 26
    P7: a file of Chinese added to an English corpus, nearly all [UNK], showed only as 'unknown 1.55%' over
    the whole corpus; trial 27 P4: in a corpus of one unit, every update redoes it all)."""

    def unknown(group: list[Unit]) -> tuple[float, int]:
        tokens = sum(records[u.key]["splits"][split]["tokens"] for u in group for split in SPLITS)
        return sum(records[u.key]["unknown_tokens"] for u in group) / max(tokens, 1), tokens

    new, _ = unknown(todo)
    rest, rest_tokens = unknown([u for u in {u.key: u for u in units}.values() if u not in todo])
    than = "of the others"
    if not rest_tokens:  # every unit redone: compared with the data as it was
        splits = old["splits"]
        rest = old.get("unknown_tokens", 0) / max(splits["train"]["tokens"] + splits["valid"]["tokens"], 1)
        than = "before this update"
    if new <= UNKNOWN_SHARE or new <= 5 * rest:
        return
    worst = max(todo, key=lambda u: unknown([u])[0])
    files = sorted({str(part.path) for part in worst.parts})  # a unit of small files holds several
    where = files[0] + (f" (and {len(files) - 1} file(s) prepared with it)" if len(files) > 1 else "")
    remedy = (
        "give a tokenizer that has them (data.tokenizer.path)"
        if plan.given_sha256 is not None
        else "the run's checkpoints fix its tokenizer: a vocabulary with them needs a new run"
        if plan.tok is not None
        else "prepare --force trains a new tokenizer on the whole corpus"
    )
    log(
        f"warning: {100 * new:.1f}% of the tokens prepared now are [UNK] ({100 * rest:.2f}% {than}), the most "
        f"in {where} ({100 * unknown([worst])[0]:.0f}%): the tokenizer kept lacks their characters; "
        f"{remedy}"
    )


def _old_contents(old: dict[str, Any]) -> set[str]:
    """The contents (Unit.content) of the units an earlier prepare recorded."""
    return {u.get("content") for u in old["units"] if isinstance(u, dict)}


def _unit_setting_changes(old: dict[str, Any], data: DataConfig) -> list[str]:
    """The settings in every unit's key (plan_units) that differ from those `old` was prepared with."""
    return [
        f"{key} {json.dumps(old.get(name))} then, {json.dumps(getattr(data, name))} now"
        for key, name in (
            ("data.split_sentences", "split_sentences"),
            ("data.validation_fraction", "validation_fraction"),
        )
        if old.get(name) != getattr(data, name)
    ]


def _update_line(
    plan: _Plan,
    todo: list[Unit],
    *,
    new_keys: set[str],
    old_keys: set[str],
    problem: str | None,
    settings: list[str],
    same_contents: bool,
    files: str,
) -> str:
    """What `_update` says it does: why the folder is not up to date (`settings` that every unit
    depends on changed, the corpus changed, or `problem`: damage found), which tokenizer it keeps,
    and how much it prepares. `files`: the corpus files changed, in words (_file_changes)."""
    changes = [
        f"{n} {word}"
        for n, word in ((len(new_keys - old_keys), "new or changed"), (len(old_keys - new_keys), "gone"))
        if n
    ]
    named = f"files {files}; " if files else ""  # (trial 27 P2: no file was named)
    if settings and changes and same_contents:  # (trial 21 P7: a changed validation_fraction was "the corpus changed")
        why = f": the settings of every unit changed ({'; '.join(settings)})"
    elif changes:  # (trial 26 C8: the settings went unsaid where the corpus changed too)
        also = f"; and the settings of every unit ({'; '.join(settings)})" if settings else ""
        why = f": the corpus changed ({named}units of it {', '.join(changes)}){also}"
    elif problem:
        why = f" is damaged ({problem})"
    elif files:  # no unit to prepare: a copy added or removed, a file renamed (trial 26 P5: "renamed?")
        why = f": the corpus changed (files {files})"
    else:
        why = ": the corpus changed (its files are in another order)"
    with_tok = (
        "the tokenizer of data.tokenizer.path"
        if plan.given_sha256 is not None
        else "the run's own tokenizer (its checkpoints were trained on its token ids)"
        if plan.tok is not None
        else "the tokenizer trained on the corpus as it was (a forced prepare trains a new one)"
    )
    kept = len(new_keys) - len(todo)
    work = (
        f"preparing {len(todo)} of {len(new_keys)} units ({sum(u.bytes for u in todo) / 1e6:,.1f} MB) with "
        f"{with_tok}" + (f", keeping the other {kept}" if kept else "")
        if todo
        else "writing a new index"
    )
    return f"prepared data in {plan.folder}{why}: {work}"


def _file_changes(then: list[dict[str, Any]], now: list[dict[str, Any]], *, root: Path) -> str:
    """The corpus files changed between two prepares (their entries), in words, two of each kind named
    (relative to the corpus folder `root`): '1 changed (part05.txt), 1 added (new.txt)'; '' where none is."""
    old = {e.get("path"): _entry_digest(e) for e in then}
    new = {e.get("path"): _entry_digest(e) for e in now}
    added = [p for p in new if p not in old]
    gone = [p for p in old if p not in new]
    renamed = []  # a file gone and one added with its bytes: renamed (or moved)
    for path in list(added):
        twin = next((g for g in gone if old[g] == new[path]), None)
        if twin is not None:
            renamed.append(f"{_short(twin, root)} -> {_short(path, root)}")
            added.remove(path)
            gone.remove(twin)
    kinds = (
        ("changed", [_short(p, root) for p in new if p in old and old[p] != new[p]]),
        ("added", [_short(p, root) for p in added]),
        ("gone", [_short(p, root) for p in gone]),
        ("renamed", renamed),
    )
    return ", ".join(
        f"{len(names)} {word} ({', '.join(names[:2])}{', ...' if len(names) > 2 else ''})"
        for word, names in kinds
        if names
    )


def _short(path: Any, root: Path) -> str:
    """A corpus file's path as said: relative to the corpus folder."""
    return os.path.relpath(str(path), root) if root.is_dir() else Path(str(path)).name


def _stray_record(folder: Path, key: str) -> dict[str, Any] | None:
    """The record of a unit that a stopped `prepare` finished (renamed into place) but never listed in
    a manifest: reused when it reads and checks whole."""
    path = folder / UNITS / key / UNIT_RECORD
    if not ownership.own_file(path):
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return record if _well_formed_unit(record, in_manifest=False) and record["key"] == key else None


def _manifest(
    cfg: Config,
    plan: _Plan,
    *,
    tok: Tokenizer,
    root: Path,
    units: list[Unit],
    records: dict[str, dict[str, Any]],
    settings: UnitSettings,
    sample: dict[str, Any] | None,
    old_tokenizer: dict[str, Any] | None,
    seconds: float,
    prepared: list[Unit],
) -> dict[str, Any]:
    """The manifest of prepared data in `root` (deterministic but for `created`, `seconds`, `prepared_tokens`
    and `tokens_per_s`). `prepared`: the units tokenized this time (all of them, but in an update)."""
    data = cfg.data
    splits = {
        split: {c: sum(records[u.key]["splits"][split][c] for u in units) for c in ("documents", "segments", "tokens")}
        for split in SPLITS
    }
    # The rate is of the tokens prepared this time (trial 26 P1: an update of 2 units of 55 divided the whole
    # corpus's tokens by its time, 20-45x the real rate).
    prepared_tokens = sum(records[u.key]["splits"][split]["tokens"] for u in prepared for split in SPLITS)
    casing = describe(tok)
    if old_tokenizer is not None:
        tokenizer = old_tokenizer
    else:
        tokenizer = {
            "source": str(plan.tokenizer_file) if plan.tokenizer_file else "trained",
            "vocab_size": tok.get_vocab_size(with_added_tokens=True),
            "identity": tokenizer_identity(tok),
            "sha256": {name: ownership.sha256_of(root / name) for name in TOKENIZER_FILES},
            "requested_vocab_size": data.tokenizer.vocab_size,
            "lowercase": casing.get("lowercase", data.tokenizer.lowercase),  # as used, not as configured
            "strip_accents": casing.get("strip_accents", data.tokenizer.strip_accents),
            "min_frequency": data.tokenizer.min_frequency,
            "sample": sample,
            "given_sha256": plan.given_sha256,
        }
        if sample is not None:  # trained: on what (kept when files are added later), with which settings
            tokenizer["trained_on"] = {"files": len(plan.entries), "bytes": sum(e["bytes"] for e in plan.entries)}
            tokenizer["settings"] = _tokenizer_settings(data, sample["corpus_chars"])
    return {
        "format_version": FORMAT_VERSION,
        "bertcli_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "corpus": {"source": data.corpus, "files": plan.entries},
        "tokenizer": tokenizer,
        "split_sentences": data.split_sentences,
        "validation_fraction": data.validation_fraction,
        "unit_bytes": UNIT_BYTES,
        "dtype": settings.dtype,
        "splits": splits,
        "unknown_tokens": sum(records[u.key]["unknown_tokens"] for u in units),
        "index": _index_digest(units),
        "units": [
            {
                "key": u.key,
                "content": u.content,
                "bytes": u.bytes,
                "pieces": [list(p) for p in u.pieces],
                "splits": records[u.key]["splits"],
                "unknown_tokens": records[u.key]["unknown_tokens"],
            }
            for u in units
        ],
        "seconds": seconds,
        "prepared_tokens": prepared_tokens,
        "tokens_per_s": prepared_tokens / max(seconds, 1e-9),
    }


def _write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    atomic.write_text(root / MANIFEST, json.dumps(manifest, indent=2) + "\n")


def _report(folder: Path, manifest: dict[str, Any], cfg: Config, done: str) -> None:
    data = cfg.data
    t, v = manifest["splits"]["train"], manifest["splits"]["valid"]
    total_tokens = t["tokens"] + v["tokens"]
    share = _warn_random_next(folder, manifest, cfg)
    pairs = (
        f"; random next sentences {100 * share:.1f}% of pairs (data.random_next_prob "
        f"{100 * data.random_next_prob:.0f}%)"
        if share is not None
        else ""
    )
    seconds, prepared = manifest["seconds"], manifest["prepared_tokens"]
    part = f" for the {prepared:,} tokens of the changed units" if prepared < total_tokens else ""
    rate = f", {manifest['tokens_per_s']:,.0f} tokens/s" if prepared else ", no unit to tokenize"
    info(
        f"{done}: {t['documents'] + v['documents']:,} documents ({v['documents']:,} held out), "
        f"{t['segments'] + v['segments']:,} sentences, {total_tokens:,} tokens, vocabulary "
        f"{manifest['tokenizer']['vocab_size']:,}, unknown {100 * manifest['unknown_tokens'] / max(total_tokens, 1):.2f}%"
        f"{pairs}; {seconds:.1f} s{part if prepared else ''}{rate}"
    )


def _remove_unused(folder: Path, manifest: dict[str, Any]) -> None:
    """Remove the units and indexes that `manifest` does not name (bertcli's own folders only)."""
    keep = {u["key"] for u in manifest["units"]} | {manifest["index"]}
    for sub in (UNITS, INDEX):
        if not (folder / sub).is_dir():
            continue
        for child in (folder / sub).iterdir():
            if re.fullmatch(KEY, child.name) and child.name not in keep and _ours(child, folder):
                atomic.remove_folder(child)


def _ours(path: Path, folder: Path) -> bool:
    """Whether `path` (inside the prepared `folder`) is a folder holding only what bertcli writes there."""
    rel = path.relative_to(folder).as_posix()
    if path.is_symlink() or not path.is_dir() or not layout.PREPARED.holds(rel):
        return False
    return ownership.first_foreign(path, layout.PREPARED, rel + "/") is None


def data_random_next_share(folder: Path, manifest: dict[str, Any], data: DataConfig, seed: int) -> float | None:
    """The share of training pairs with a random next sentence that this data gives at `data`'s
    settings (None without pairs or training documents); see chunks.random_next_share."""
    if not data.pairs or manifest["splits"]["train"]["documents"] == 0:
        return None
    base = folder / INDEX / manifest["index"] / "train"
    return random_next_share(
        np.memmap(base / SEG_OFFSETS, dtype=np.int64, mode="r"),
        np.memmap(base / DOC_OFFSETS, dtype=np.int64, mode="r"),
        data,
        seed,
    )


SMALL_VOCAB_SHARE = 0.5  # a vocabulary trained on a sample to under this share of the size asked ...
SAMPLE_MISS = 2.0  # ... from a sample this many times over (or under) its budget is said


def small_vocab_warning(size: int, sample: dict[str, Any], data: DataConfig) -> str | None:
    """The line for a vocabulary trained on a sample of a large corpus to far fewer tokens than asked,
    where the sample missed its budget by far: equal lines are all in it or all out (text.LineSample),
    so a line repeated a million times fills it many times over, or leaves it nearly empty (trial 21
    P6: a sample 6.8x sample_chars, and 1,316 tokens of 8,000). None: nothing to say (a sample near
    its budget gives what the text has)."""
    over = sample["chars"] / max(sample["sample_chars"], 1)
    if size >= SMALL_VOCAB_SHARE * data.tokenizer.vocab_size or 1 / SAMPLE_MISS <= over <= SAMPLE_MISS:
        return None
    return (
        f"warning: the vocabulary has {size:,} tokens of the {data.tokenizer.vocab_size:,} asked "
        f"(data.tokenizer.vocab_size): the sample it was trained on is {over:.2g}x data.tokenizer.sample_chars, "
        "as lines repeated many times are all in it or all out; deduplicate the corpus, or raise "
        "data.tokenizer.sample_chars (0: the whole corpus)"
    )


def random_next_warning(share: float | None, data: DataConfig) -> str | None:
    """A line for the user when the documents are too short for the configured pairs."""
    if share is None or share <= data.random_next_prob + RANDOM_NEXT_MARGIN:
        return None
    return (
        f"warning: {100 * share:.1f}% of the NSP pairs will have a random next sentence, against "
        f"data.random_next_prob={data.random_next_prob:g}: most documents are too short for pairs (a single "
        f"sentence, or sentences that fill data.max_seq_length={data.max_seq_length} alone), so NSP accuracy will "
        "look high without learning; put several sentences in each document (a blank line ends a document in "
        "text, one JSONL record is one document), or set data.pairs: false and train.nsp_weight: 0"
    )


def _warn_random_next(folder: Path, manifest: dict[str, Any], cfg: Config) -> float | None:
    """random_next_warning said once on stderr (pretrain reaches this through prepare); the share."""
    share = data_random_next_share(folder, manifest, cfg.data, cfg.train.seed)
    warning = random_next_warning(share, cfg.data)
    if warning:
        log(warning)
    return share


# ---------------------------------------------------------------- stopping


class _Stopped(BaseException):
    """SIGINT or SIGTERM inside `prepare`: a BaseException, so that no library's `except Exception`
    (tqdm's, starting its monitor thread) swallows it; _stop_on_signal turns it into Interrupted."""


_stop_pipe: int | None = None  # the read end of _stop_on_signal's wakeup pipe
_signal: int | None = None  # the stop signal that came, if one did
_state = ""  # what a stop now keeps, in words


@contextmanager
def _stop_on_signal(folder: Path) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP stop `prepare` at once, also inside `pretrain` (whose own handlers only ask
    the training loop to stop after a step): the exception unwinds atomic.folder, which removes the
    temporary folder (or, updating a prepared folder in place, the temporary units; the previous
    manifest stays valid), ends the worker processes, and ends the command with exit 128 + N and
    one line. The previous handlers come back afterwards.

    Python runs a handler in the main thread only, and the tokenizer trainer holds the main thread
    while its own threads read the corpus (8 s for the 3.5 MB python-docs.txt): there the signal is
    seen through a wakeup pipe (signal.set_wakeup_fd), the reading stops (_until_stopped), and the
    trainer returns early; what it trained on part of the corpus is never used (_check_stop).

    A signal raises wherever the main thread is, also between atomic.folder's mkdir and its `try`,
    or after its `yield` and before the `with` took it: then no cleanup of its own runs, so this
    process's temporary folders next to and inside `folder` are removed here too."""
    global _stop_pipe, _signal, _state
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        global _signal
        _signal = signum
        raise _Stopped

    previous = {
        signum: handler
        for signum in STOP_SIGNALS
        if (handler := signal.getsignal(signum)) not in (signal.SIG_IGN, None)
    }  # nohup: ignored stays ignored
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    os.set_blocking(write_end, False)
    _stop_pipe, _signal, _state = read_end, None, "nothing was kept (the temporary data was removed)"
    previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    for signum in previous:
        signal.signal(signum, stop)
    try:
        yield
        _check_stop()  # a stop that something caught on the way
    except _Stopped:
        signum = _signal or signal.SIGTERM
        ownership.remove_leftover_folders(folder, layout.PREPARED, mine=True)
        if Path(folder).is_dir():
            _clean_inside(Path(folder), mine=True)
        raise Interrupted(
            f"stopped by {signal.Signals(signum).name} while preparing data; {_state}: run the same command again",
            signum,
        ) from None
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


def _poll_stop() -> None:
    """Look in _stop_on_signal's wakeup pipe for SIGINT or SIGTERM (from whatever thread)."""
    global _signal
    if _stop_pipe is not None and _signal is None:
        try:
            _signal = next((b for b in os.read(_stop_pipe, 64) if b in STOP_SIGNALS), None)
        except OSError:  # nothing there (BlockingIOError), or the pipe is gone
            pass


def _until_stopped(items: Iterator[str]) -> Iterator[str]:
    """`items` until SIGINT or SIGTERM comes (looked for every 1,024 items, from whatever thread
    reads them, and by _polling; see _stop_on_signal)."""
    for n, item in enumerate(items):
        if n % 1024 == 0:
            _poll_stop()
        if _signal is not None:
            return
        yield item


def _polling(progress: Callable[[int], None]) -> Callable[[int], None]:
    """`progress` (called for each line read) that also looks for a stop signal every 1,024 lines:
    with a vocabulary sample, most lines read yield no sentence, so _until_stopped alone would look
    only every 1,024 sampled sentences (tens of MB of a large corpus); the next sampled sentence
    then ends the reading."""
    calls = 0

    def update(n: int) -> None:
        nonlocal calls
        progress(n)
        calls += 1
        if calls % 1024 == 0:
            _poll_stop()

    return update


_TEMPORARY = re.compile(rf"{_TMP}(?:del-)?(?:{KEY}|{re.escape(MANIFEST)})\.(\d+)")


def _clean_inside(folder: Path, mine: bool = False) -> None:
    """Remove the temporary units, indexes and manifest that an update in place left inside `folder`:
    those of processes that are gone, or (`mine`) this process's own."""
    for sub in (folder / UNITS, folder / INDEX, folder):
        if not sub.is_dir() or sub.is_symlink():
            continue
        for child in sub.iterdir():
            match = _TEMPORARY.fullmatch(child.name)
            if match is None or (int(match.group(1)) != os.getpid() if mine else atomic.pid_alive(int(match.group(1)))):
                continue
            if child.is_dir() and _ours(child, folder):
                shutil.rmtree(child, ignore_errors=True)
            elif child.name.startswith(f"{atomic.TMP_PREFIX}{MANIFEST}") and ownership.own_file(child):
                child.unlink(missing_ok=True)


def fixed_tokenizer(cfg: Config, resume_from: Path | None = None) -> tuple[Path, Tokenizer] | None:
    """The tokenizer file the run's data is tokenized with, and the tokenizer as used, where something
    fixes it: data.tokenizer.path (with the config's casing), else the run's checkpoints (run_tokenizer);
    None: prepare trains one (or keeps the one the prepared data has)."""
    if cfg.data.tokenizer.path:
        file = find_tokenizer_file(Path(cfg.data.tokenizer.path))
        return file, load_tokenizer(file, cfg.data.tokenizer)
    fixed = run_tokenizer(cfg, resume_from)
    return (fixed, read_tokenizer_json(fixed)) if fixed is not None else None


def run_tokenizer(cfg: Config, resume_from: Path | None = None) -> Path | None:
    """The tokenizer.json of the run's newest checkpoint, None before its first: the tokenizer of a run
    is fixed by its first checkpoint, and every checkpoint carries it. A checkpoint whose tokenizer
    files were edited since (tokenizer_change) is damaged, and resuming sets it aside: never its.
    Before the run's first checkpoint, that of `resume_from` (pretrain --resume PATH, another run's
    checkpoint, say), whose weights were trained on its token ids (a new vocabulary was trained and
    the whole corpus prepared, and then resuming refused)."""
    complete = (*layout.CHECKPOINT_FILES, layout.TOKENIZER_JSON)  # a link is damage, never followed (checkpoint.damage)
    steps = [
        path
        for _, path in layout.list_checkpoints(Path(cfg.output_dir))
        if all(ownership.own_file(path / name) for name in complete) and unchanged_tokenizer(path)
    ]
    if not steps and resume_from is not None:
        steps = [
            p
            for p in [Path(resume_from)]
            if all(ownership.own_file(p / n) for n in complete) and unchanged_tokenizer(p)
        ]
    return steps[-1] / layout.TOKENIZER_JSON if steps else None


def unchanged_tokenizer(path: Path) -> bool:
    """Whether checkpoint `path`'s tokenizer files are those it was written with (tokenizer_change)."""
    try:
        return tokenizer_change(path) is None
    except (OSError, ValueError, UsageError):  # an unreadable trainer_state.json: damaged too
        return False


def _guard(cfg: Config, folder: Path) -> Callable[[Path], None]:
    """Refuse a prepared_dir that is, contains or lies inside an input (see ownership.py); return the
    check that atomic.folder runs before writing and again before the swap: only prepared data
    that bertcli wrote (or an empty folder) is replaced."""
    fix = "set data.prepared_dir to a new or empty folder (the default is data, next to the config)"
    inputs = [
        ownership.Input("the corpus", corpus_path(cfg)),
        ownership.Input("the run folder (output_dir)", Path(cfg.output_dir), inside_ok=True),
    ]
    for label, value in (
        ("the tokenizer (data.tokenizer.path)", cfg.data.tokenizer.path),
        ("the model (model.init_from)", cfg.model.init_from),
    ):
        if value:
            inputs.append(ownership.Input(label, Path(value)))
    ownership.check_apart(folder, inputs, fix)

    def guard(target: Path) -> None:
        ownership.check_replaceable(target, layout.PREPARED, fix)

    return guard


def prepared_lock(cfg: Config, command: str) -> AbstractContextManager[Any]:
    """The lock on the prepared folder of `cfg` (runlock.PreparedLock: a file beside it) for `command`,
    where a prepare may replace the folder. What is refused anyway is refused first, leaving nothing
    beside the folder: a prepared_dir that is, holds or lies inside an input; and a folder bertcli
    did not write (the user's), which no prepare replaces, so that reading it needs no lock."""
    folder = Path(cfg.data.prepared_dir).expanduser().resolve()
    _guard(cfg, folder)
    if ownership.not_owned(folder, layout.PREPARED) is not None:
        return nullcontext()
    return PreparedLock(folder, command)


def _changes(
    old: dict[str, Any],
    entries: list[dict[str, Any]],
    data: DataConfig,
    *,
    configured: Path | None,
    tok: Tokenizer | None,
    output_dir: Path,
) -> list[str]:
    """What differs between the inputs recorded in manifest `old` and this config's (the fingerprint
    only says that something does), in words; `configured`: the tokenizer file of
    data.tokenizer.path (None: trained, or the run's own), `tok` the tokenizer that will be used."""
    changes = []
    if old["corpus"].get("source") != data.corpus:
        changes.append(
            f"corpus {old['corpus'].get('source')} then, {data.corpus} now: the folder was prepared for "
            "another config sharing data.prepared_dir, or data.corpus changed"
        )
    else:
        before = {f["path"]: _entry_digest(f) for f in old["corpus"]["files"]}
        now = {e["path"]: _entry_digest(e) for e in entries}
        for what, paths in (
            ("added", set(now) - set(before)),
            ("removed", set(before) - set(now)),
            ("changed", {p for p in set(now) & set(before) if now[p] != before[p]}),
        ):
            if paths:
                first = sorted(paths)[0]
                more = f" and {len(paths) - 1:,} more" if len(paths) > 1 else ""
                changes.append(f"corpus file {what}: {first}{more}")
    recorded, t = old["tokenizer"], data.tokenizer
    source = str(configured) if configured else "trained"
    source_then = str(recorded.get("source"))
    own = source_then != "trained" and layout.checkpoints_dir(output_dir) in Path(source_then).parents
    if recorded.get("source") != source and not own:  # (own: prepared with this run's checkpoint's tokenizer)
        changes.append(f"tokenizer {recorded.get('source')} then, {source} now")
    elif configured and tok is not None and recorded.get("identity") != tokenizer_identity(tok):
        changes.append(f"the tokenizer {configured} is not the one it was prepared with")
    settings = [
        ("data.tokenizer.vocab_size", recorded.get("requested_vocab_size"), t.vocab_size),
        ("data.tokenizer.min_frequency", recorded.get("min_frequency"), t.min_frequency),
        ("data.split_sentences", old.get("split_sentences"), data.split_sentences),
        ("data.validation_fraction", old.get("validation_fraction"), data.validation_fraction),
    ]
    if source == "trained":  # a given tokenizer's casing is its own: the manifest records it as used
        settings += [
            ("data.tokenizer.lowercase", recorded.get("lowercase"), t.lowercase),
            ("data.tokenizer.strip_accents", recorded.get("strip_accents"), t.strip_accents),
        ]
    changes += [f"{key} {json.dumps(then)} then, {json.dumps(now)} now" for key, then, now in settings if then != now]
    return changes or ["the corpus or tokenizer settings differ"]


def _held_out_count(units: list[dict[str, Any]], stride: int) -> int:
    """Documents held out with every `stride`-th document of each unit (its phase, its documents)."""
    total = 0
    for u in units:
        n = sum(u["splits"][s]["documents"] for s in SPLITS)
        phase = unit_phase(u["content"], stride)
        total += (n + phase) // stride  # d + phase = stride - 1 (mod stride) for d in [0, n)
    return total


def _check_sizes(manifest: dict[str, Any], data: DataConfig) -> None:
    """Enough documents for examples in each split: 2 with sentence pairs (a random next sentence
    comes from another document), 1 without. Every fix suggested is one that works."""
    splits = manifest["splits"]
    train, valid = splits["train"]["documents"], splits["valid"]["documents"]
    total = train + valid
    if total == 0:
        raise UsageError(f"data.corpus={data.corpus!r}: the corpus is empty (no text after reading and tokenizing)")
    need = 2 if data.pairs else 1
    why = " (random next sentences come from another document)" if data.pairs else ""
    no_pairs = "set data.pairs: false and train.nsp_weight: 0 (no NSP)"
    if data.validation_fraction > 0 and valid < need:
        fixes = []
        # The widest stride (every k-th document of each unit) that holds out `need` and leaves `need` to train on.
        stride = next(
            (
                k
                for k in range(held_out_stride(data.validation_fraction) - 1, 1, -1)
                if need <= _held_out_count(manifest["units"], k) <= total - need
            ),
            None,
        )
        if stride is not None:  # validation_fraction is at most 0.5
            fixes.append(f"raise data.validation_fraction to {1 / stride:.4g}")
        if total >= need:
            fixes.append("set data.validation_fraction: 0 (no held-out evaluation)")
        elif data.pairs:
            fixes.append("set data.validation_fraction: 0, data.pairs: false and train.nsp_weight: 0 (no NSP)")
        fixes.append("add documents (blank lines separate them)")
        raise UsageError(
            f"data.corpus={data.corpus!r}: {total} document(s) is too small for the held-out split: "
            f"validation_fraction={data.validation_fraction} holds out {valid}, and held-out examples need at "
            f"least {need}{why}; {', or '.join(fixes)}"
        )
    if train < need:
        raise UsageError(
            f"data.corpus={data.corpus!r}: {train} training document(s); at least 2 are needed{why}: "
            f"separate documents with blank lines, or {no_pairs}"
        )


def check_before_training(cfg: Config) -> None:
    """What `pretrain` would refuse once its data is prepared, where the files show it at once: run
    before torch is imported (3-4 s, 250 MB), so that such a refusal takes a fraction of a second.
    A model.vocab_size the tokenizer will not have (check_vocab_size); a corpus of fewer
    documents than the held-out split and the pairs need (_check_enough_documents, which reads
    documents only until there are enough), looked at only when the corpus is under UNIT_BYTES on
    disk: a corpus too small that is larger is a few huge documents, refused where it is prepared;
    a data.prepared_dir to be prepared that holds files bertcli did not write there."""
    data = cfg.data
    check_vocab_size(cfg)
    if stands_in(cfg):  # the corpus is not here: its prepared data is checked where it is used (prepare)
        return
    folder = Path(data.prepared_dir)
    if folder.is_dir() and read_manifest(folder)[0] is None:  # to be prepared: a folder of the user's is refused
        _guard(cfg, folder)(folder)
    with console.silent():  # what it says of the corpus (files skipped, odd lines), preparing says
        files = corpus_files(corpus_path(cfg))
        sizes = [f.stat().st_size for f in files]
        if sum(sizes) < UNIT_BYTES:  # one unit's worth: no file is cut into parts (plan_units)
            entries = [{"bytes": size, "sha256": ownership.sha256_of(f)} for f, size in zip(files, sizes)]
            _check_enough_documents(plan_units(files, entries, "", data), data)


def check_vocab_size(cfg: Config) -> None:
    """Refuse (exit 2) a model.vocab_size the run's tokenizer will not have, seen from the files and
    the config: that of a tokenizer fixed in advance (data.tokenizer.path, or the run's checkpoints'),
    or one larger than data.tokenizer.vocab_size where a tokenizer is to be trained into a new
    prepared folder (the trainer makes at most that many, bar a corpus of more distinct characters:
    trial 16 U5, refused after the whole corpus was prepared, 12 s). `init` and `pretrain` run it."""
    from bertcli.resolve import with_vocab

    size, data = cfg.model.vocab_size, cfg.data
    if size is None or data.corpus == "synthetic":
        return
    fixed = fixed_tokenizer(cfg)
    if fixed is not None:
        with_vocab(cfg, fixed[1].get_vocab_size(with_added_tokens=True), str(fixed[0]))
    elif size > data.tokenizer.vocab_size and read_manifest(Path(data.prepared_dir)) == (None, None):
        raise UsageError(
            f"model.vocab_size={size:,} but the tokenizer to be trained has at most data.tokenizer.vocab_size="
            f"{data.tokenizer.vocab_size:,} tokens; set model.vocab_size: null to take the size from the tokenizer"
        )


def _check_enough_documents(units: list[Unit], data: DataConfig) -> None:
    """Refuse a corpus with too few documents for _check_sizes before any tokenizer work: the documents
    are read (no sentence splitting), unit by unit with each unit's held-out phase, only until there
    are enough, so a corpus that has them costs a few documents' reading, and one that has not is
    refused after one reading pass, not after the tokenizer is trained and the shards written.
    Tokenizing can only empty a document (left out then), never add one, so the counts here are
    upper bounds: what passes is checked again on the shards (_check_sizes)."""
    need, fraction = 2 if data.pairs else 1, data.validation_fraction
    stride = held_out_stride(fraction)
    counted = []
    total = {"train": 0, "valid": 0}
    for unit in units:
        counts = {"train": {"documents": 0}, "valid": {"documents": 0}}
        phase = unit.phase(stride)
        for item in read_sentences(list(unit.parts), split=False):
            if item is not None:
                continue
            n = counts["train"]["documents"] + counts["valid"]["documents"]
            split = "valid" if is_held_out(n, fraction, phase) else "train"
            counts[split]["documents"] += 1
            total[split] += 1
            if total["train"] >= need and (fraction == 0 or total["valid"] >= need):
                return
        counted.append({"content": unit.content, "splits": counts})
    _check_sizes(
        {
            "splits": {split: {"documents": sum(u["splits"][split]["documents"] for u in counted)} for split in SPLITS},
            "units": counted,
        },
        data,
    )


# ---------------------------------------------------------------- reading and checking prepared data


def read_manifest(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the manifest of a prepared folder, None), or (None, why it cannot be used: damaged, of another
    format version, a symbolic link), or (None, None) when there is none.

    A manifest is data, never a source of paths: shards are read at fixed names inside the folder
    (a unit's and the index's folder names are checked to be 64 hexadecimal digits), and the corpus
    paths it records only serve as keys of the hash cache (never opened, never written). What
    decides how the shards are read (their dtype, the splits, the counts) is checked here, the
    files themselves by check_prepared.
    """
    path = folder / MANIFEST
    if not path.exists() and not path.is_symlink():
        return None, None
    if not ownership.own_file(path):
        return None, f"is damaged ({MANIFEST} is not a regular file; a symbolic link is never followed)"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        return (
            None,
            f"is damaged ({MANIFEST} cannot be read: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__})",
        )
    if not isinstance(manifest, dict):
        return None, f"is damaged ({MANIFEST} is not a JSON object)"
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        return None, f"is of format version {version} (this bertcli reads and writes version {FORMAT_VERSION})"
    splits, files, tok = manifest.get("splits"), (manifest.get("corpus") or {}).get("files"), manifest.get("tokenizer")
    units = manifest.get("units")
    well_formed = (
        manifest.get("dtype") in ("uint16", "uint32")
        and isinstance(files, list)
        and all(isinstance(f, dict) and isinstance(f.get("path"), str) for f in files)
        and _well_formed_splits(splits)
        and isinstance(tok, dict)
        and _count(tok.get("vocab_size"))
        and isinstance(tok.get("sha256"), dict)
        and all(isinstance(tok["sha256"].get(name), str) for name in TOKENIZER_FILES)
        and isinstance(manifest.get("index"), str)
        and re.fullmatch(KEY, manifest["index"]) is not None
        and isinstance(units, list)
        and all(_well_formed_unit(u) for u in units)
        and all(
            sum(u["splits"][s][c] for u in units) == splits[s][c]
            for s in SPLITS
            for c in ("documents", "segments", "tokens")
        )
    )
    if not well_formed:
        return None, f"is damaged ({MANIFEST} lacks fields or has values of the wrong type)"
    return manifest, None


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _well_formed_splits(splits: Any) -> bool:
    return (
        isinstance(splits, dict)
        and set(splits) == set(SPLITS)
        and all(
            isinstance(v, dict) and all(_count(v.get(c)) for c in ("documents", "segments", "tokens"))
            for v in splits.values()
        )
    )


def _well_formed_unit(unit: Any, in_manifest: bool = True) -> bool:
    """A unit's record: a key of 64 hex digits and counts; in the manifest, the hash of its contents too
    (its unit.json has none)."""
    return (
        isinstance(unit, dict)
        and isinstance(unit.get("key"), str)
        and re.fullmatch(KEY, unit["key"]) is not None
        and _well_formed_splits(unit.get("splits"))
        and _count(unit.get("unknown_tokens"))
        and (
            not in_manifest or (isinstance(unit.get("content"), str) and re.fullmatch(KEY, unit["content"]) is not None)
        )
    )


def _check_tokenizer(folder: Path, manifest: dict[str, Any]) -> str | None:
    """What is wrong with tokenizer.json and vocab.txt (regular files, the hashes the manifest records)."""
    for name in TOKENIZER_FILES:
        path = folder / name
        if os.path.islink(path):
            return f"{name} is a symbolic link, which bertcli never follows out of its folder"
        if not path.exists():
            return f"{name} is missing"
        if not ownership.own_file(path):
            return f"{name} is not a regular file"
        if ownership.sha256_of(path) != manifest["tokenizer"]["sha256"][name]:
            return f"{name} was changed after prepare: its SHA-256 is not the one {MANIFEST} records"
    lines = (folder / layout.VOCAB).read_bytes().count(b"\n")  # one token a line, the vocabulary in id order
    vocab_size = manifest["tokenizer"]["vocab_size"]
    if lines != vocab_size:
        return f"{MANIFEST} says the vocabulary holds {vocab_size:,} tokens, vocab.txt {lines:,}"
    return None


def _check_files(folder: Path, rel: str, names: tuple[str, ...]) -> str | None:
    """Whether folder/rel/{train,valid}/NAME are regular files in regular folders (no symbolic links)."""
    for path in (
        rel,
        *(f"{rel}/{split}" for split in SPLITS),
        *(f"{rel}/{split}/{n}" for split in SPLITS for n in names),
    ):
        full = folder / path
        if os.path.islink(full):
            return f"{path} is a symbolic link, which bertcli never follows out of its folder"
        if not full.exists():
            return f"{path} is missing"
        is_folder = path.count("/") <= rel.count("/") + 1
        if not (full.is_dir() if is_folder else ownership.own_file(full)):
            return f"{path} is not a {'folder' if is_folder else 'regular file'}"
    return None


def _check_unit(folder: Path, key: str, record: dict[str, Any], *, dtype_name: str, vocab_size: int) -> str | None:
    """What is wrong with the shards of unit `key` (naming the file), or None when they are whole:
    regular files, of the sizes its record implies, offsets rising from 0 to its counts, token ids
    below the vocabulary size (read once: about 15 ms per 100M tokens in the page cache)."""
    rel = f"{UNITS}/{key}"
    problem = _check_files(folder, rel, SHARD_FILES)
    if problem is not None:
        return problem
    dtype = np.dtype(dtype_name)
    for split, counts in record["splits"].items():
        base = folder / rel / split
        expected = {
            TOKENS: counts["tokens"] * dtype.itemsize,
            SEG_OFFSETS: (counts["segments"] + 1) * 8,
            DOC_OFFSETS: (counts["documents"] + 1) * 8,
        }
        for name, size in expected.items():
            actual = (base / name).stat().st_size
            if actual != size:
                kind = dtype_name if name == TOKENS else "int64"  # offsets are int64 whatever the tokens
                return f"{rel}/{split}/{name} holds {actual:,} bytes where {MANIFEST} implies {size:,} ({kind})"
        for name, last in ((SEG_OFFSETS, counts["tokens"]), (DOC_OFFSETS, counts["segments"])):
            if not _rising(np.memmap(base / name, dtype=np.int64, mode="r"), last):
                return f"{rel}/{split}/{name} does not rise from 0 to {last:,}: its offsets are damaged"
        if counts["tokens"] and vocab_size <= np.iinfo(dtype).max:  # else every id of the dtype is in range
            top = int(np.memmap(base / TOKENS, dtype=dtype, mode="r").max())
            if top >= vocab_size:
                return f"{rel}/{split}/tokens.bin holds token id {top:,}, past the vocabulary of {vocab_size:,}"
    return None


def _check_index(folder: Path, manifest: dict[str, Any]) -> tuple[str, str | None] | None:
    """What is wrong with the index (naming the file) and the key of the unit it disagrees with, if
    one; None when it is whole: regular files of the sizes the totals imply, holding each unit's own
    offsets (checked by _check_unit first), shifted by the tokens and segments of the units before
    it. So every boundary training reads is one a unit holds: a moved one (still rising) is found
    too. The index is the second copy of each unit's offsets: where the two disagree, either may be
    the damaged one (a moved offset in a unit still rises from 0 to its counts)."""
    rel = f"{INDEX}/{manifest['index']}"
    problem = _check_files(folder, rel, INDEX_FILES)
    if problem is not None:
        return problem, None
    for split, counts in manifest["splits"].items():
        base = folder / rel / split
        lengths = {SEG_OFFSETS: counts["segments"] + 1, DOC_OFFSETS: counts["documents"] + 1}
        offsets = {}
        for name, length in lengths.items():
            actual = (base / name).stat().st_size
            if actual != length * 8:
                return (
                    f"{rel}/{split}/{name} holds {actual:,} bytes where {MANIFEST} implies {length * 8:,} (int64)",
                    None,
                )
            offsets[name] = np.memmap(base / name, dtype=np.int64, mode="r")
        if offsets[SEG_OFFSETS][0] != 0 or offsets[DOC_OFFSETS][0] != 0:
            return f"{rel}/{split} does not start at 0: the index is damaged", None
        start = {"tokens": 0, "segments": 0, "documents": 0}  # of the units before this one
        for unit in manifest["units"]:
            unit_counts = unit["splits"][split]
            own = folder / UNITS / unit["key"] / split
            # (a unit _check_unit has not seen, of an older manifest: its files checked before they are read)
            problem = _check_files(folder, f"{UNITS}/{unit['key']}", INDEX_FILES)
            for name, count in ((SEG_OFFSETS, unit_counts["segments"]), (DOC_OFFSETS, unit_counts["documents"])):
                if problem is None and (own / name).stat().st_size != (count + 1) * 8:
                    problem = f"{UNITS}/{unit['key']}/{split}/{name} is not of the size {MANIFEST} implies"
            if problem is not None:
                return problem, unit["key"]
            for name, at, shift in (
                (SEG_OFFSETS, start["segments"], start["tokens"]),
                (DOC_OFFSETS, start["documents"], start["segments"]),
            ):
                if not _holds_shifted(offsets[name], at, np.memmap(own / name, dtype=np.int64, mode="r"), shift):
                    return (
                        f"{rel}/{split}/{name} does not hold the offsets of {UNITS}/{unit['key']}/{split} from its "
                        f"entry {at:,}: one of the two is damaged",
                        unit["key"],
                    )
            start = {c: start[c] + unit_counts[c] for c in start}
        if start != {c: counts[c] for c in start}:
            return f"{MANIFEST}: the {split} totals are not the sum of its units' counts: the manifest is damaged", None
    return None


def _holds_shifted(index: np.ndarray, at: int, own: np.ndarray, shift: int, block: int = 1 << 20) -> bool:
    """Whether index[at : at + len(own)] == own + shift; read in blocks, so that no temporary array grows
    with the corpus."""
    if at + len(own) > len(index):
        return False
    for lo in range(0, len(own), block):
        piece = own[lo : lo + block]
        if not np.array_equal(index[at + lo : at + lo + len(piece)], piece + shift):
            return False
    return True


def check_prepared(folder: Path, manifest: dict[str, Any]) -> str | None:
    """What is wrong with the files of prepared data (naming the file), or None when they are whole:
    regular files (never symbolic links), tokenizer.json and vocab.txt as hashed in the manifest,
    every unit as _check_unit checks it, then the index as _check_index does. Cheap: the tokenizer
    files and the offsets are read whole, the token ids once."""
    problem = _check_tokenizer(folder, manifest)
    if problem is not None:
        return problem
    for unit in {u["key"]: u for u in manifest["units"]}.values():
        problem = _check_unit(
            folder, unit["key"], unit, dtype_name=manifest["dtype"], vocab_size=manifest["tokenizer"]["vocab_size"]
        )
        if problem is not None:
            return problem
    damage = _check_index(folder, manifest)
    return damage[0] if damage else None


def _rising(offsets: np.ndarray, last: int, block: int = 1 << 20) -> bool:
    """Whether `offsets` goes from 0 to `last`, each one above the one before; read in blocks, so
    that no temporary array grows with the corpus (1M offsets: 9 MB of temporaries, as fast as larger ones)."""
    if offsets[0] != 0 or offsets[-1] != last:
        return False
    for lo in range(0, len(offsets) - 1, block):
        if not (np.diff(offsets[lo : lo + block + 1]) > 0).all():
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

    @property
    def identity(self) -> dict[str, Any]:
        """What the examples and the held-out set are drawn from, as a checkpoint records it (a resume on a
        changed corpus is said: trial 26 P5): the index (every unit, in order), the units holding held-out
        documents, in order, and the documents."""
        units = [u for u in self.manifest["units"] if isinstance(u, dict)]
        splits = self.manifest["splits"]
        return {
            "index": self.manifest["index"],
            "held_out": _digest([u.get("key") for u in units if u.get("splits", {}).get("valid", {}).get("documents")]),
            "documents": splits["train"]["documents"] + splits["valid"]["documents"],
        }

    def corpus(self, split: str) -> Corpus | None:
        """One split: the index's offsets memory-mapped, the units' tokens read as one array (each unit's
        tokens.bin memory-mapped now, so that a unit another `prepare` removes later stays readable)."""
        if self.manifest["splits"][split]["documents"] == 0:
            return None
        dtype = self.manifest["dtype"]
        pieces = [
            np.memmap(self.folder / UNITS / u["key"] / split / TOKENS, dtype=dtype, mode="r")
            for u in self.manifest["units"]
            if u["splits"][split]["tokens"]
        ]
        base = self.folder / INDEX / self.manifest["index"] / split
        return Corpus(
            tokens=pieces[0] if len(pieces) == 1 else PartTokens(pieces),
            seg_offsets=np.memmap(base / SEG_OFFSETS, dtype=np.int64, mode="r"),
            doc_offsets=np.memmap(base / DOC_OFFSETS, dtype=np.int64, mode="r"),
            vocab_size=self.vocab_size,
            special=self.special,
            continuation=continuation_mask(self.tokenizer),
        )


class NotPrepared(UsageError):
    """Folder `folder` holds no usable prepared data (`problem` says why); preparing again from the run's
    config file `config` (None: no config.yaml beside it) makes it. The CLI words that with its command."""

    def __init__(self, folder: Path, problem: str, config: Path | None, gone: str | None = None) -> None:
        super().__init__(f"{folder}: {problem}; prepare it again from {config or 'its config file'}")
        self.folder, self.problem, self.config = folder, problem, config
        self.gone = gone  # its corpus, where that is not there: no prepare can make it again (trial 27 P1)


def corpus_drift(manifest: dict[str, Any]) -> str | None:
    """How the corpus prepared data `manifest` was made from differs now, by its files' names, sizes and
    times (nothing is read: inspect's question; prepare compares contents), in words; None: no file
    differs (trial 27 P3: inspect showed the corpus as prepared, a file added since)."""
    source = manifest["corpus"].get("source")
    if not isinstance(source, str) or source in ("sample", "synthetic"):
        return None
    if corpus_gone(manifest):
        return f"the corpus, {source}, is not there now"
    with console.silent():
        try:
            files = corpus_files(Path(source))
        except (UsageError, OSError):
            return None
    then = {e.get("path"): (e.get("bytes"), e.get("mtime_ns")) for e in manifest["corpus"]["files"]}
    now = {str(f.resolve()): (st.st_size, st.st_mtime_ns) for f in files for st in [f.stat()]}
    counts = (
        (len(now.keys() - then.keys()), "added"),
        (len(then.keys() - now.keys()), "gone"),
        (sum(now[p] != then[p] for p in now.keys() & then.keys()), "written to (by size or time)"),
    )
    if not any(n for n, _ in counts):
        return None
    return (
        f"the corpus's files differ from those prepared ({', '.join(f'{n} {w}' for n, w in counts if n)}): the next "
        "prepare or pretrain brings the data up to date"
    )


def corpus_gone(manifest: dict[str, Any] | None) -> str | None:
    """The corpus prepared data `manifest` was made from, where it is not there now (nor an empty folder's
    contents: an unmounted mount point): preparing again needs it back. None: it is there, or unknown."""
    source = manifest.get("corpus", {}).get("source") if isinstance(manifest, dict) else None
    if not isinstance(source, str) or source in ("sample", "synthetic"):
        return None
    path = Path(source)
    return source if not path.exists() or (path.is_dir() and not any(path.iterdir())) else None


def load_prepared(folder: Path, verify: bool = True) -> PreparedData:
    """Prepared data, checked (check_prepared) unless `verify` is False (prepare checked it just now)."""
    manifest, why_not = read_manifest(folder)
    config = folder.parent / layout.RUN_CONFIG if (folder.parent / layout.RUN_CONFIG).is_file() else None
    if manifest is None:
        raise NotPrepared(folder, f"the prepared data {why_not}" if why_not else "no prepared data here", config)
    if verify:
        damage = check_prepared(folder, manifest)
        if damage is not None:
            raise NotPrepared(folder, f"the prepared data is damaged ({damage})", config, corpus_gone(manifest))
    return PreparedData(folder=folder, manifest=manifest, tokenizer=read_tokenizer_json(folder / layout.TOKENIZER_JSON))
