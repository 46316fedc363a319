"""Reading raw corpora, streamed: plain text (*.txt, *.txt.gz), folders of them (recursive), and
JSON Lines (*.jsonl, *.jsonl.gz) with a "text" field.

The text format is Google BERT's create_pretraining_data.py input: documents separated by blank
lines, one sentence or paragraph per line; lines are cut into sentences by a small built-in
splitter. A JSON Lines record is one document. Reading yields sentences and `None` at each
document end, so no document, file or corpus is ever held whole in memory.
"""

from __future__ import annotations

import codecs
import gzip
import json
import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from bertcli.errors import UsageError

SUFFIXES = (".txt", ".txt.gz", ".jsonl", ".jsonl.gz")
END_OF_DOCUMENT = None

# A sentence ends at . ! or ? (plus closing quotes/brackets), before white space and a capital,
# a digit or an opening quote. Abbreviations that usually precede a capital are not ends.
_BOUNDARY = re.compile(r"""(?<=[.!?])["'\u201d\u2019)\]]*\s+(?=["'\u201c\u2018(\[]?[A-Z0-9])""")
_ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "prof", "st", "vs", "etc", "e.g", "i.e", "fig", "no", "vol", "cf", "jr", "sr"}


def split_sentences(line: str) -> list[str]:
    """Cut a line (often a paragraph) into sentences. Simple and rule-based: no downloads."""
    if len(line) < 40 or not _BOUNDARY.search(line):
        return [line]
    sentences: list[str] = []
    start = 0
    for match in _BOUNDARY.finditer(line):
        before = line[start:match.start()].rstrip("\"')]\u201d\u2019")
        last_word = before.rsplit(None, 1)[-1].rstrip(".!?") if before.strip() else ""
        if last_word.lower() in _ABBREVIATIONS or (len(last_word) == 1 and last_word.isupper()):  # "Dr. Who", "J. Smith"
            continue
        sentences.append(line[start:match.start()].strip())
        start = match.end()
    sentences.append(line[start:].strip())
    return [s for s in sentences if s]


def corpus_files(path: Path) -> list[Path]:
    """The files of a corpus path: the file itself, or every corpus file under a folder, sorted."""
    path = Path(path).expanduser()
    if not path.exists():
        raise UsageError(f"{path}: corpus not found; set data.corpus to a text file, a JSONL file or a folder of them")
    if path.is_file():
        return [path]
    if not path.is_dir():  # a pipe, a device (/dev/null), a socket
        raise UsageError(f"{path}: not a regular file nor a folder; the corpus is read more than once (to train the "
                         "tokenizer, then to tokenize), so save the text to a file first and pass that")
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES))
    if not files:
        raise UsageError(f"{path}: no {', '.join('*' + s for s in SUFFIXES)} files in this folder")
    return files


def _open(path: Path) -> BinaryIO:
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")  # type: ignore[return-value]


GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)


def _gzip_error(path: Path, fh: BinaryIO, exc: Exception, where: str = "") -> UsageError:
    """A damaged gzip file (cut short, corrupt, or not gzip at all) as one line naming the file and
    the compressed byte reached. (Left alone, a truncated one raises EOFError, which Click turns
    into an 'interrupted' exit 130.)"""
    at = getattr(fh, "fileobj", None)
    byte = f"compressed byte {at.tell():,}" if at is not None and not at.closed else ""
    place = ", ".join(p for p in (where, byte) if p)
    what = "cut short" if isinstance(exc, EOFError) else f"damaged or not gzip ({exc})"
    return UsageError(f"{path}: {place + ': ' if place else ''}the gzip file is {what}; download or compress it "
                      "again (gzip -t checks it)")


def _raw_lines(path: Path, fh: BinaryIO) -> Iterator[bytes]:
    """The lines of an open file; a damaged gzip file is a UsageError naming the line reached."""
    number = 0
    try:
        for number, raw in enumerate(fh, start=1):
            yield raw
    except GZIP_ERRORS as exc:
        raise _gzip_error(path, fh, exc, f"line {number + 1:,}") from None


def _lines(path: Path, progress: Callable[[int], None]) -> Iterator[tuple[int, str]]:
    """(line number, decoded line) of a file, strictly UTF-8; errors name the file and byte offset."""
    offset = 0
    with _open(path) as fh:
        for number, raw in enumerate(_raw_lines(path, fh), start=1):
            nul = raw.find(b"\x00")
            if nul >= 0:
                raise UsageError(f"{path}: byte {offset + nul}: a NUL byte; this looks like a binary file, not text "
                                 "(remove it from the corpus)")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UsageError(f"{path}: byte {offset + exc.start} (line {number}): not valid UTF-8; convert the "
                                 "file to UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
            offset += len(raw)
            progress(len(raw))
            yield number, line


def read_text(files: list[Path], block: int = 1 << 16) -> Iterator[str]:
    """The corpus text in blocks of about `block` characters (small enough to stay in the cache), for
    a quick pass over its characters (no line decoding or sentence splitting: words never span white
    space). A block continues the previous one; a file ends with a line break. JSON Lines give their
    "text" fields, cut into lines as read_sentences cuts them. Bad bytes become U+FFFD and bad
    records are skipped: read_sentences is what reports them."""
    for path in files:
        with _open(path) as fh:
            if not path.name.endswith((".jsonl", ".jsonl.gz")):
                decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
                line = 1  # the line being read, for the error below
                try:
                    for chunk in iter(lambda: fh.read(block), b""):
                        text = decoder.decode(chunk)
                        line += text.count("\n")
                        yield text
                except GZIP_ERRORS as exc:  # this pass comes first: it reports a damaged file
                    raise _gzip_error(path, fh, exc, f"line {line:,}") from None
                yield decoder.decode(b"", final=True) + "\n"
                continue
            texts: list[str] = []
            size = 0
            for raw in _raw_lines(path, fh):
                try:
                    record = json.loads(raw)
                except ValueError:
                    continue
                text = record.get("text") if isinstance(record, dict) else None
                if isinstance(text, str):
                    texts.append("\n".join(text.splitlines()))
                    size += len(text)
                if size >= block:
                    yield "\n".join(texts) + "\n"
                    texts, size = [], 0
            yield "\n".join(texts) + "\n"


def read_sentences(files: list[Path], split: bool = True,
                   progress: Callable[[int], None] = lambda n: None) -> Iterator[str | None]:
    """Sentences of every document, with END_OF_DOCUMENT (None) after each document."""
    for path in files:
        jsonl = path.name.endswith((".jsonl", ".jsonl.gz"))
        open_document = False
        for number, line in _lines(path, progress):
            if jsonl:
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise UsageError(f"{path}: line {number}: not valid JSON ({exc.msg})") from None
                text = record.get("text") if isinstance(record, dict) else None
                if not isinstance(text, str):
                    raise UsageError(f"{path}: line {number}: no \"text\" string field in this JSON record")
                paragraphs = [p.strip() for p in text.splitlines() if p.strip()]
                for paragraph in paragraphs:
                    yield from (split_sentences(paragraph) if split else [paragraph])
                if paragraphs:
                    yield END_OF_DOCUMENT
                continue
            line = line.strip()
            if not line:
                if open_document:
                    yield END_OF_DOCUMENT
                    open_document = False
                continue
            yield from (split_sentences(line) if split else [line])
            open_document = True
        if open_document:  # a file's end also ends its last document
            yield END_OF_DOCUMENT
