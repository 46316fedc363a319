"""Raw corpora read as a stream of sentences, None at each document end: text (*.txt, documents separated by blank
lines or a document a file: data.document) and JSON Lines (*.jsonl, a "text" field a document), plain or compressed."""

from __future__ import annotations

import bz2
import codecs
import contextlib
import gzip
import hashlib
import io
import json
import lzma
import os
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from bertcli import sniff
from bertcli.errors import UsageError

END_OF_DOCUMENT = None
MAX_LINE_CHARS = 10_000  # about 2,000 tokens, four times BERT's longest example: only what none could hold is cut
CUT_WINDOW = 1_000  # a cut looks this far back from MAX_LINE_CHARS for white space
READ_BYTES = 1 << 16  # a text line is read in parts of at most this many bytes (a JSON Lines record whole)
# A sentence ends at . ! or ? (closing quotes and brackets stay with it) before white space (the "gap") and a
# capital, a digit or an opening quote; abbreviations that usually precede a capital are not ends.
_BOUNDARY = re.compile(r"""(?<=[.!?])["'\u201d\u2019)\]]*(?P<gap>\s+)(?=["'\u201c\u2018(\[]?[A-Z0-9])""")
_ABBREVIATIONS = set("mr mrs ms dr prof st vs etc e.g i.e fig no vol cf jr sr".split())
_SPACE = re.compile(r"\s+")


class _NoStream(io.RawIOBase):
    """A .gz file of 0 bytes holds no gzip stream (`gzip -t` calls it damaged; Python's gzip reads it as empty)."""

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        raise EOFError("no gzip stream: the file is empty")


# The corpus reader of each compression sniff.KINDS names (a codec); `CODEC -t` checks a file of it.
OPENERS = {
    "gzip": lambda path: _NoStream() if os.path.getsize(path) == 0 else gzip.open(path, "rb"),
    "bzip2": lambda path: io.BufferedReader(_Streams(path, bz2.BZ2Decompressor), READ_BYTES),
    "xz": lambda path: io.BufferedReader(_Streams(path, lzma.LZMADecompressor), READ_BYTES),
}


def split_sentences(line: str) -> list[str]:
    """Cut a line (often a paragraph) into sentences. Simple and rule-based: no downloads."""
    if len(line) < 40 or not _BOUNDARY.search(line):
        return [line]
    sentences, start = [], 0
    for match in _BOUNDARY.finditer(line):
        before = line[start : match.start()].rstrip("\"')]\u201d\u2019")
        last_word = before.rsplit(None, 1)[-1].rstrip(".!?") if before.strip() else ""
        if last_word.lower() in _ABBREVIATIONS or (len(last_word) == 1 and last_word.isupper()):  # "J. Smith"
            continue
        sentences.append(line[start : match.start("gap")].strip())
        start = match.end()
    sentences.append(line[start:].strip())
    return [s for s in sentences if s]


def cut_long_line(line: str, limit: int = MAX_LINE_CHARS) -> Iterator[str]:
    """`line` in pieces of at most `limit` characters, each cut at its last sentence end, else white space, in the
    CUT_WINDOW characters before the limit (else at the limit): the work per piece is bounded."""
    start = 0
    while len(line) - start > limit:
        lo, end = start + max(limit - CUT_WINDOW, 1), start + limit
        rest = end
        for pattern, group in ((_BOUNDARY, "gap"), (_SPACE, 0)):
            if found := [*pattern.finditer(line, lo, end)]:
                end, rest = found[-1].start(group), found[-1].end()
                break
        yield line[start:end]
        start = rest
    yield line[start:]


def _sentences(line: str, split: bool, keep: Callable[[str], bool] | None = None) -> Iterator[str]:
    """The sentences of a stripped line, an over-long one in pieces; with `keep`, of the pieces it keeps."""
    for piece in cut_long_line(line, MAX_LINE_CHARS) if len(line) > MAX_LINE_CHARS else (line,):
        piece = piece.strip()
        if piece and (keep is None or keep(piece)):
            yield from (split_sentences(piece) if split else [piece])


class LineSample:
    """A sample of about budget/total of a corpus's lines, by a hash of each line alone: the same in any
    process and for any cut of the corpus into parts. The calls count what was taken."""

    def __init__(self, budget: int, total: int) -> None:
        self.threshold = (budget << 64) // max(total, 1)  # >= 2^64: every line (rate 1)
        self.lines = self.chars = 0  # taken so far

    @property
    def whole(self) -> bool:
        """Whether every line is in (the budget covers the corpus)."""
        return self.threshold >= 1 << 64

    def __call__(self, line: str) -> bool:
        digest = None if self.whole else hashlib.blake2b(line.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        taken = digest is None or int.from_bytes(digest, "little") < self.threshold
        if taken:
            self.lines += 1
            self.chars += len(line)
        return taken


class _Streams(io.RawIOBase):
    """The decompressed bytes of a file of bz2 or xz streams (as pbzip2 and pixz write). Unlike bz2.open and
    lzma.open, bytes after a stream that start no other are an error, not a quiet end of the corpus."""

    def __init__(self, path: Path, decompressor: Callable[[], bz2.BZ2Decompressor | lzma.LZMADecompressor]) -> None:
        self.fileobj = open(path, "rb")  # noqa: SIM115 (closed with this reader); also named for error positions
        self.new, self.stream = decompressor, decompressor()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while True:
            if self.stream.eof:  # a stream ended: another follows, or the file ends
                rest = self.stream.unused_data or self.fileobj.read(READ_BYTES)
                if isinstance(self.stream, lzma.LZMADecompressor):
                    rest = rest.lstrip(b"\0")
                    while not rest and (more := self.fileobj.read(READ_BYTES)):
                        rest = more.lstrip(b"\0")
                if not rest:
                    return 0
                self.stream = self.new()
                data = self.stream.decompress(rest, len(buffer))  # raises on what is not a stream
            elif self.stream.needs_input:
                if not (raw := self.fileobj.read(READ_BYTES)):
                    raise EOFError("compressed file ended before the end-of-stream marker was reached")
                data = self.stream.decompress(raw, len(buffer))
            else:
                data = self.stream.decompress(b"", len(buffer))
            if data:
                buffer[: len(data)] = data
                return len(data)

    def close(self) -> None:
        self.fileobj.close()
        super().close()


def _open(path: Path) -> BinaryIO:
    codec = sniff.sniff(path).codec
    return OPENERS[codec](path) if codec else open(path, "rb")  # type: ignore[return-value]


def lines_end_in_cr(path: Path) -> bool:
    """Whether a text file's lines end in CR alone: its first 4 KiB hold CRs and no LF (a damaged file: no)."""
    if sniff.is_jsonl(path):
        return False
    try:
        with _open(path) as fh:
            head = fh.read(4096)
    except COMPRESSED_ERRORS:
        return False
    return head.count(b"\r") > 1 and b"\n" not in head


@dataclass(frozen=True)
class Part:
    """Bytes [start, end) of a corpus file (end None: its end) from line `line`, cut at document boundaries."""

    path: Path
    start: int = 0
    end: int | None = None
    line: int = 1


# A blank line (a document boundary in text) of at most 1,024 white-space bytes: the bound keeps finding one in
# bounded memory (a longer blank line still ends a document; it is only never a cut).
_BLANK_LINE = re.compile(rb"\n[ \t\r\f\v]{0,1024}\n")
_CUT_SCAN = 1 << 16  # bytes read at a time while looking for a boundary


def document_cuts(path: Path, every: int) -> list[int]:
    """Where an uncompressed corpus file is cut into parts of about `every` bytes: for each multiple m of
    `every`, the end of the first document boundary (a blank line; in JSON Lines, a line end) whose line
    starts at or after m. A function of the file's bytes, so an edit moves only the cuts near it."""
    size, cuts, target = path.stat().st_size, [], every
    pattern = re.compile(rb"\n") if sniff.is_jsonl(path) else _BLANK_LINE
    with open(path, "rb") as fh:
        while target < size:
            found = _boundary(fh, target, pattern)
            if found is None or found[1] >= size:
                break
            line_start, cut = found
            cuts.append(cut)
            target = (line_start // every + 1) * every  # the next multiple past this boundary's line
    return cuts


def _boundary(fh: BinaryIO, target: int, pattern: re.Pattern[bytes]) -> tuple[int, int] | None:
    """(line start, end) of the first match of `pattern` whose line starts at or after `target`; None at the end."""
    fh.seek(target - 1)
    base, buf = target - 1, b""
    while True:
        block = fh.read(_CUT_SCAN)
        if not block:
            return None
        buf += block
        match = pattern.search(buf)
        if match is not None:
            return base + match.start() + 1, base + match.end()
        last = buf.rfind(b"\n")  # a match can only start at the last line break, if it is still open
        keep = buf[last:] if last >= 0 and len(buf) - last <= 1026 and not buf[last + 1 :].strip(b" \t\r\f\v") else b""
        base += len(buf) - len(keep)
        buf = keep


# What a damaged compressed file raises: cut short (EOFError), corrupt or not of its format (the
# libraries' own errors; bz2 raises an OSError without an errno, unlike a failing disk).
COMPRESSED_ERRORS = (EOFError, OSError, zlib.error, lzma.LZMAError)


def _compressed_error(path: Path, fh: BinaryIO, exc: Exception, where: str) -> UsageError:
    """A damaged compressed file as one line naming the byte reached; a failing disk is raised as it is."""
    if (isinstance(exc, OSError) and exc.errno is not None) or not (tool := sniff.sniff(path).codec):
        raise exc
    at = getattr(getattr(fh, "raw", fh), "fileobj", None)  # the compressed file under gzip's reader or _Streams
    with contextlib.suppress(OSError, ValueError, AttributeError):
        where += f", compressed byte {at.tell():,}" if at is not None and not at.closed else ""
    what = "cut short" if isinstance(exc, EOFError) else f"damaged or not {tool} ({exc})"
    if isinstance(exc, EOFError) and os.path.getsize(path) == 0:
        what = "empty (0 bytes: a failed download?)"
    return UsageError(f"{path}: {where}: the {tool} file is {what}; download or compress it again ({tool} -t checks)")


def _raw_lines(path: Path, fh: BinaryIO, limit: int = -1) -> Iterator[bytes]:
    """The lines of an open file, in parts of at most `limit` bytes (when > 0); damage names the line reached."""
    lines = 0
    try:
        while raw := fh.readline(limit):
            lines += raw.endswith(b"\n")
            yield raw
    except COMPRESSED_ERRORS as exc:
        raise _compressed_error(path, fh, exc, f"line {lines + 1:,}") from None


def _lines(part: Part, progress: Callable[[int], None]) -> Iterator[tuple[int, str, bool]]:
    """(line number, text, whether it ends the line), strictly UTF-8; a text line past READ_BYTES comes in parts."""
    path = part.path
    offset, number, ends = part.start, part.line, True
    limit = -1 if sniff.is_jsonl(path) else READ_BYTES
    decoder = codecs.getincrementaldecoder("utf-8")()

    def decode(raw: bytes, *, final: bool) -> str:
        held = len(decoder.getstate()[0])  # bytes of a character cut by the previous part
        try:
            return decoder.decode(raw, final=final)
        except UnicodeDecodeError as exc:
            byte = offset - held + exc.start
            raise UsageError(
                f"{path}: byte {byte} (line {number}): not valid UTF-8; convert it (iconv -f latin1 -t utf-8)"
            ) from None

    with _open(path) as fh:
        if part.start:  # a part of an uncompressed file (never a compressed one)
            fh.seek(part.start)
        for raw in _raw_lines(path, fh, limit):
            nul = raw.find(b"\x00")
            if nul >= 0:
                raise UsageError(f"{path}: byte {offset + nul}: a NUL byte (not text); remove the file from the corpus")
            ends = raw.endswith(b"\n") or limit < 0 or len(raw) < limit  # short of the limit: the file's end
            text = decode(raw, final=ends)
            offset += len(raw)
            progress(len(raw))
            yield number, text, ends
            number += ends
            if part.end is not None and offset >= part.end:  # a part ends at a line end (document_cuts)
                break
        if not ends:  # the file ended with a part exactly READ_BYTES long
            yield number, decode(b"", final=True), True


def read_text(files: list[Path], block: int = 1 << 16) -> Iterator[str]:
    """The corpus text in blocks of about `block` characters (JSON Lines: their "text"), for a quick pass;
    bad bytes become U+FFFD and bad records are skipped: read_sentences reports them."""
    for path in files:
        with _open(path) as fh:
            if not sniff.is_jsonl(path):
                decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
                line = 1  # the line being read, for the error below
                try:
                    for chunk in iter(lambda: fh.read(block), b""):
                        text = decoder.decode(chunk)
                        line += text.count("\n")
                        yield text
                except COMPRESSED_ERRORS as exc:  # this pass comes first: it reports a damaged file
                    raise _compressed_error(path, fh, exc, f"line {line:,}") from None
                yield decoder.decode(b"", final=True) + "\n"
                continue
            texts: list[str] = []
            size = 0
            for number, raw in enumerate(_raw_lines(path, fh), 1):
                try:
                    # (decoded here: json.loads of bytes lets through surrogates written as bytes, ED A0 80)
                    record = json.loads(raw.decode("utf-8", errors="replace").removeprefix("\ufeff"))
                except (ValueError, RecursionError):
                    continue
                text = record.get("text") if isinstance(record, dict) else None
                if isinstance(text, str):
                    _check_surrogates(path, number, raw, text)
                    texts.append("\n".join(text.splitlines()))
                    size += len(text)
                if size >= block:
                    yield "\n".join(texts) + "\n"
                    texts, size = [], 0
            yield "\n".join(texts) + "\n"


def read_sentences(
    files: list[Path] | list[Part],
    split: bool = True,
    progress: Callable[[int], None] = lambda n: None,
    keep: Callable[[str], bool] | None = None,
    *,
    document: str = "blank_line",
) -> Iterator[str | None]:
    """Sentences of every document of the files (or Parts), END_OF_DOCUMENT after each; `keep`: a LineSample.
    `document` (data.document): what ends a text file's document, a blank line or the file's (part's) end."""
    for item in files:
        part = item if isinstance(item, Part) else Part(Path(item))
        if sniff.is_jsonl(part.path):
            yield from _jsonl_sentences(part, split, progress, keep)
        else:
            yield from _text_sentences(part, split, progress, keep, blank_ends=document == "blank_line")


def _jsonl_sentences(part: Part, split: bool, progress: Callable, keep: Callable | None) -> Iterator[str | None]:
    for number, line, _ in _lines(part, progress):
        if line.strip():
            paragraphs = [p.strip() for p in _record_text(part.path, number, line).splitlines() if p.strip()]
            for paragraph in paragraphs:
                yield from _sentences(paragraph, split, keep)
            if paragraphs:
                yield END_OF_DOCUMENT


def _text_sentences(
    part: Part, split: bool, progress: Callable, keep: Callable | None, *, blank_ends: bool
) -> Iterator[str | None]:
    """A blank line ends a document (where `blank_ends`), and so does the file's end; a long line is cut as it comes."""
    open_document = False
    pending, cut = "", False  # a long line read in parts: its text not yet cut; whether pieces went out
    for _, line, ends in _lines(part, progress):
        if not ends or pending:
            *pieces, pending = cut_long_line(pending + line if pending else line.lstrip())
            for piece in map(str.strip, pieces):
                yield from _sentences(piece, split, keep)
                if piece:  # a piece left out of a sample (keep) still belongs to the document
                    open_document = cut = True
            if not ends:
                continue
            line, pending = pending, ""
        line, was_cut, cut = line.strip(), cut, False
        if not line:
            if open_document and not was_cut and blank_ends:  # (the blank end of a long line ends none)
                yield END_OF_DOCUMENT
                open_document = False
            continue
        yield from _sentences(line, split, keep)
        open_document = True
    if open_document:
        yield END_OF_DOCUMENT


def _record_text(path: Path, number: int, line: str) -> str:
    """The "text" of JSON Lines record `line` (line `number` of `path`), or a refusal naming the line."""
    line = line.removeprefix("\ufeff")  # a byte-order mark, as Windows editors write before the first record
    try:  # (the hook costs a call per object: only where "text" is written twice, as a key or a value)
        record = json.loads(line, object_pairs_hook=_one_text) if line.count('"text"') > 1 else json.loads(line)
    except json.JSONDecodeError as exc:
        if line.lstrip().startswith("["):  # a pretty-printed array: its first line, "["
            raise _an_array(path, number) from None
        what = f"not valid JSON ({exc.msg.removesuffix(' at')} at column {exc.colno})"
        raise UsageError(f'{path}: line {number}: {what}; write one object per line: {{"text": "..."}}') from None
    except _TextTwice:
        raise UsageError(f'{path}: line {number}: two "text" fields (JSON readers keep the last); keep one') from None
    except RecursionError:
        raise UsageError(f'{path}: line {number}: nested too deeply to read; write {{"text": "..."}}') from None
    if isinstance(record, list):
        raise _an_array(path, number)
    text = record.get("text") if isinstance(record, dict) else None
    if not isinstance(text, str):
        raise UsageError(f'{path}: line {number}: no "text" string field; each record is a document: {{"text": "..."}}')
    _check_surrogates(path, number, line, text)
    return text


def _an_array(path: Path, number: int) -> UsageError:
    """A JSON array (a list of records saved whole) where JSON Lines holds one object per line."""
    return UsageError(f"{path}: line {number}: a JSON array; write one object per line (jq -c '.[]' FILE > NEW.jsonl)")


class _TextTwice(ValueError):
    """A JSON Lines record (an object of it) with two "text" keys."""


def _one_text(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads' object_pairs_hook refusing a second "text" key (json keeps the last one silently)."""
    if sum(key == "text" for key, _ in pairs) > 1:
        raise _TextTwice
    return dict(pairs)


_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _check_surrogates(path: Path, number: int, line: str | bytes, text: str) -> None:
    """Refuse a record whose text holds a lone surrogate: JSON may escape one (\\ud800), UTF-8 cannot
    hold it, and no tokenizer reads it. Cheap: searched only in lines with an escape."""
    found = _SURROGATE.search(text) if (b"\\u" if isinstance(line, bytes) else "\\u") in line else None
    if found:
        what = f"the text holds a lone surrogate (\\u{ord(found.group()):04x}), which is no Unicode character"
        raise UsageError(f"{path}: line {number:,}: {what}; remove it or escape its pair (\\ud83d\\ude00)")
