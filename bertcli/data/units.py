"""Units of work prepared into shards on every core, and the index of the whole corpus (`write_index`). Every
folder is written under a temporary name and renamed into place whole: a stop leaves only whole units."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from tokenizers import Tokenizer

from bertcli import __version__, layout, sniff, store
from bertcli.data.corpus import held_out_stride, is_held_out
from bertcli.data.scan import Unit
from bertcli.data.text import read_sentences
from bertcli.data.tokenizer import read_tokenizer_json, special_tokens
from bertcli.errors import BertcliError, RunError, UsageError
from bertcli.layout import DOC_OFFSETS, INDEX, SEG_OFFSETS, SHARD_FILES, SPLITS, TOKENS, UNIT_RECORD, UNITS
from bertcli.stopping import held_while_starting, worker_ignores

ENCODE_BATCH = 2048  # sentences per tokenizer call: large enough for its thread pool, small for memory
ENCODE_CHARS = 1 << 20  # and at most about this many characters (an encoding costs ~100 bytes a token)


@dataclass(frozen=True)
class UnitSettings:
    split_sentences: bool
    validation_fraction: float
    dtype: str  # of the token ids: uint16 where the vocabulary fits, else uint32
    owner: int  # the pid of the `prepare` whose temporary names the units are written under
    document: str = "blank_line"  # data.document: what ends a document in a text file


class ShardWriter:
    """Appends segments and document ends to one split's files, in bounded memory."""

    FLUSH_TOKENS = 1 << 16  # ~2 MB of Python ints: memory stays flat whatever the corpus size

    def __init__(self, folder: Path, dtype: np.dtype) -> None:
        folder.mkdir(parents=True)
        self.folder, self.dtype = folder, dtype
        self.files: dict[str, BinaryIO] = {name: open(folder / name, "wb") for name in SHARD_FILES}  # noqa: SIM115
        self.tokens: list[int] = []
        self.seg_offsets, self.doc_offsets = [0], [0]
        self.num_tokens = self.num_segments = self.num_documents = self.open_segments = 0

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
        # the file's write(), not ndarray.tofile: that one words a full disk without the reason
        for name, values, dtype in (
            (TOKENS, self.tokens, self.dtype),
            (SEG_OFFSETS, self.seg_offsets, np.int64),
            (DOC_OFFSETS, self.doc_offsets, np.int64),
        ):
            with store.writing(self.folder / name):
                self.files[name].write(np.asarray(values, dtype=dtype).data)
        self.tokens, self.seg_offsets, self.doc_offsets = [], [], []

    def close(self) -> dict[str, int]:
        self.end_document()
        self.flush()
        for name, fh in self.files.items():
            with store.writing(self.folder / name):
                fh.close()
        return {"documents": self.num_documents, "segments": self.num_segments, "tokens": self.num_tokens}


@contextlib.contextmanager
def _new_folder(final: Path, root: Path, pid: int | None = None) -> Iterator[Path]:
    """A temporary folder renamed to `final` in prepared folder `root` (over a damaged copy), removed on a failure."""
    tmp = layout.tmp_name(final, pid=pid)
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        yield tmp
        for path in (*tmp.rglob("*"), tmp):
            store.fsync_path(path)
        if final.exists() or final.is_symlink():
            if not store.holds_only(final, layout.PREPARED, final.relative_to(root).as_posix() + "/"):
                raise UsageError(f"{final} holds files bertcli did not write: move it out, then run the same command")
            store.remove_folder(final)
        os.replace(tmp, final)
        store.fsync_path(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def prepare_unit(
    root: Path,
    unit: Unit,
    tok: Tokenizer,
    *,
    settings: UnitSettings,
    progress: Callable[[int], None],
    stop: Callable[[], None],
) -> dict[str, Any]:
    """Tokenize one unit into root/units/KEY; return its record. `stop()` raises where asked to stop."""
    with _new_folder(root / UNITS / unit.key, root, settings.owner) as tmp:
        writers = {split: ShardWriter(tmp / split, np.dtype(settings.dtype)) for split in SPLITS}
        unknown = _encode(unit, tok, writers=writers, settings=settings, progress=progress, stop=stop)
        splits = {split: w.close() for split, w in writers.items()}
        record = {"bertcli_version": __version__, "key": unit.key, "splits": splits, "unknown_tokens": unknown}
        store.write_json(tmp / UNIT_RECORD, record)
    return record


def _encode(
    unit: Unit, tok: Tokenizer, writers: dict, settings: UnitSettings, progress: Callable, stop: Callable
) -> int:
    """Encode `unit` in batches into `writers`, each document into its split; return the count of [UNK] tokens."""
    unk, fraction = special_tokens(tok).unk, settings.validation_fraction
    phase = unit.phase(held_out_stride(fraction))
    counts = {"documents": 0, "unknown": 0}
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no offsets: faster where available

    def flush(items: list[str | None]) -> None:
        stop()
        encodings = iter(encode([s for s in items if s is not None], add_special_tokens=False))
        for item in items:  # None ends a document; a document may span batches: the writers keep it open
            writer = writers["valid" if is_held_out(counts["documents"], fraction, phase) else "train"]
            if item is None:
                counts["documents"] += writer.open_segments > 0
                writer.end_document()
            elif ids := next(encodings).ids:
                counts["unknown"] += ids.count(unk)
                writer.add_segment(ids)

    batch: list[str | None] = []
    pending = chars = 0
    for part, size in zip(unit.parts, unit.sizes):
        compressed = sniff.sniff(part.path).codec is not None  # progress in the file's bytes: at its end
        report = (lambda n: None) if compressed else progress
        for item in read_sentences([part], settings.split_sentences, report, document=settings.document):
            batch.append(item)
            pending, chars = pending + (item is not None), chars + len(item or "")
            if pending >= ENCODE_BATCH or chars >= ENCODE_CHARS:
                flush(batch)
                batch, pending, chars = [], 0, 0
        if compressed:
            progress(size)
    flush(batch)
    return counts["unknown"]


# ------------------------------------------------------------------------------------------ workers
_worker: dict[str, Any] = {}  # in a worker process: its tokenizer, settings and the stop event


def _start_worker(tokenizer_file: str, settings: UnitSettings, stop: Any) -> None:
    worker_ignores((signal.SIGINT, signal.SIGHUP))  # SIGTERM, sent to one worker, ends it
    os.environ.update(TOKENIZERS_PARALLELISM="false", RAYON_NUM_THREADS="1")  # one core each
    _worker.update(tok=read_tokenizer_json(Path(tokenizer_file)), settings=settings, stop=stop)


def _stopped() -> None:
    if _worker["stop"].is_set():
        raise RunError("stopped")


def _prepare_in_worker(root: Path, unit: Unit) -> dict[str, Any]:
    try:
        return prepare_unit(
            root, unit, _worker["tok"], settings=_worker["settings"], progress=lambda n: None, stop=_stopped
        )
    except BertcliError as exc:  # sent back by pickle: as the plain class, which needs its message alone
        raise (UsageError if isinstance(exc, UsageError) else RunError)(str(exc)) from None


@contextlib.contextmanager
def one_core(workers: int) -> Iterator[None]:
    """With one worker, the tokenizer encodes (and trains) on one thread: 1 worker means one core."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    if workers <= 1:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if workers <= 1 and before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM")
        elif workers <= 1:
            os.environ["TOKENIZERS_PARALLELISM"] = before


def prepare_units(
    todo: list[Unit],
    root: Path,
    tok: Tokenizer,
    *,
    settings: UnitSettings,
    workers: int,
    progress: Callable[[int], None],
    stop: Callable[[], None],
) -> dict[str, dict[str, Any]]:
    """Each unit's record by key, prepared into root/units/ on `workers` spawned processes, largest first. A stop
    (`stop()` raises) sets the workers' stop event: they end within a batch."""
    todo = sorted({u.key: u for u in todo}.values(), key=lambda u: -u.bytes)  # a unit twice (two equal files): once
    (root / UNITS).mkdir(parents=True, exist_ok=True)
    if workers <= 1 or len(todo) <= 1:
        return {u.key: prepare_unit(root, u, tok, settings=settings, progress=progress, stop=stop) for u in todo}
    context = multiprocessing.get_context("spawn")
    records: dict[str, dict[str, Any]] = {}
    with held_while_starting():
        event, size = context.Event(), min(workers, len(todo))
        initargs = (str(root / layout.TOKENIZER_JSON), settings, event)
        pool = ProcessPoolExecutor(size, mp_context=context, initializer=_start_worker, initargs=initargs)
        futures = {pool.submit(_prepare_in_worker, root, unit): unit for unit in todo}  # (each submit starts a worker)
    with pool:
        try:
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                stop()
                for future in done:
                    records[futures[future].key] = future.result()
                    progress(futures[future].bytes)
        except BrokenProcessPool:
            time.sleep(0.2)  # a stop signal to the whole group ends the workers too: say that instead
            stop()
            raise RunError("a prepare worker died (out of memory?); run again with fewer --workers") from None
        finally:
            event.set()
            pool.shutdown(cancel_futures=True)
    return records


# ------------------------------------------------------------------------------------------ the index
def write_index(root: Path, units: list[Unit], records: dict[str, dict[str, Any]], digest: str) -> None:
    """index/DIGEST: each split's offsets of the whole corpus, each unit's own shifted, written in blocks."""
    with _new_folder(root / INDEX / digest, root) as tmp:
        for split in SPLITS:
            (tmp / split).mkdir()
            for name, before in ((SEG_OFFSETS, "tokens"), (DOC_OFFSETS, "segments")):
                shift = 0  # the tokens (or segments) of the units before
                with store.writing(tmp / split / name), open(tmp / split / name, "wb") as out:
                    out.write(np.zeros(1, dtype=np.int64).data)
                    for unit in units:
                        counts = records[unit.key]["splits"][split]
                        if counts["documents"]:
                            offsets = np.memmap(root / UNITS / unit.key / split / name, dtype=np.int64, mode="r")
                            for lo in range(1, len(offsets), 1 << 20):
                                out.write((offsets[lo : lo + (1 << 20)] + shift).data)
                            shift += counts[before]
