"""What an input is (`sniff`: by its path, first bytes and name; `sniff_head`: by a stream's first bytes), and per
command (a row of KINDS) None where the command reads that kind, else what to do."""

from __future__ import annotations

import bz2
import codecs
import gzip
import lzma
import os
import select
import shlex
import stat
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

from bertcli.errors import UsageError

HEAD_BYTES = 8192  # the bytes that decide a kind


@dataclass(frozen=True)
class Kind:
    what: str  # in words, after the path: "gzip-compressed"
    prepare: str | None = None  # None: prepare reads it as corpus text; else what to do instead
    encode: str | None = None  # the same for encode's input
    magic: tuple[bytes, ...] = ()  # its first bytes
    suffixes: tuple[str, ...] = ()  # its names (lower case)
    codec: str | None = None  # a compression that the corpus reader undoes
    tool: str | None = None  # the command that makes it UTF-8 text, for encode to read through a pipe


PIPE = "pipe"  # encode's answer for a kind with a tool: pipe it through the tool
CONVERT = "convert it to UTF-8 ({tool} {{path}} > NEW) and put the new file in its place"
TABULAR = 'convert it: one JSON line {{"text": ...}} per document (.jsonl), or plain text (.txt, a blank line ends a document)'
EXTRACT, UNPACK = "extract its text into a .txt file", "extract its files into a folder and give the folder"
EXPORT = "export its text first"


def _piped(what: str, tool: str, magic: tuple[bytes, ...], suffixes: tuple[str, ...] = (), **more: str) -> Kind:
    return Kind(what, encode=PIPE, tool=tool, magic=magic, suffixes=suffixes, **more)


def _utf(bits: int, magic: tuple[bytes, ...]) -> Kind:
    tool = f"iconv -f UTF-{bits} -t UTF-8"
    return _piped(f"UTF-{bits} text", tool, magic, prepare=CONVERT.format(tool=tool))


ZSTD = "decompress it (zstd -d), or compress it as .gz, .bz2 or .xz, which prepare reads"
# Checked in this order: the first row whose magic, or for rows without one whose suffix, matches.
KINDS: dict[str, Kind] = {
    "gzip": _piped("gzip-compressed", "gzip -dc", (b"\x1f\x8b",), (".gz",), codec="gzip"),
    "bzip2": _piped("bzip2-compressed", "bzip2 -dc", (b"BZh",), (".bz2",), codec="bzip2"),
    "xz": _piped("xz-compressed", "xz -dc", (b"\xfd7zXZ\x00",), (".xz",), codec="xz"),
    "zstd": _piped("zstd-compressed", "zstd -dc", (b"\x28\xb5\x2f\xfd",), (".zst",), prepare=ZSTD),
    "word": Kind("a Word file", suffixes=(".docx", ".doc"), prepare=EXTRACT, encode="extract its text first"),
    "excel": Kind("an Excel file", suffixes=(".xlsx", ".xls"), prepare=TABULAR, encode=EXPORT),
    "zip": _piped("a zip archive", "unzip -p", (b"PK\x03\x04",), (".zip",), prepare=UNPACK),
    "tar": Kind("a tar archive", suffixes=(".tar",), prepare=UNPACK, encode="extract it first"),
    "pdf": Kind("a PDF file", magic=(b"%PDF",), suffixes=(".pdf",), prepare=EXTRACT, encode="extract its text first"),
    "parquet": Kind("a Parquet file", magic=(b"PAR1",), suffixes=(".parquet",), prepare=TABULAR, encode=EXPORT),
    "arrow": Kind("an Arrow file", suffixes=(".arrow", ".feather"), prepare=TABULAR, encode=EXPORT),
    "utf32": _utf(32, (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")),
    "utf16": _utf(16, (b"\xff\xfe", b"\xfe\xff")),
    "binary": Kind("binary data (a NUL byte)", prepare="remove it from the corpus", encode="remove it from the input"),
    "csv": Kind("a CSV file", suffixes=(".csv",), prepare=TABULAR),
    "tsv": Kind("a TSV file", suffixes=(".tsv",), prepare=TABULAR),
    "json-array": Kind("a JSON array", prepare="write one record per line (jq -c '.[]' {path} > NEW.jsonl)"),
    "json": Kind("a JSON file", suffixes=(".json",), prepare="if it holds one JSON object per line, name it .jsonl"),
    "text": Kind("UTF-8 text"),
    "folder": Kind("a folder", encode="name the text files inside it"),
    "special": Kind("not a regular file (a pipe or a device)", prepare="save it to a file: it is read more than once"),
    "missing": Kind("not found", prepare="set data.corpus to a text or JSONL file or a folder", encode="no such file"),
}
COMPRESSION_SUFFIXES = tuple(s for k in KINDS.values() if k.magic and not k.prepare for s in k.suffixes)


def split_name(path: Path) -> tuple[str, str]:
    """(the name without a compression suffix, that suffix or ''), lower-cased."""
    name = Path(path).name.lower()
    compression = next((s for s in COMPRESSION_SUFFIXES if name.endswith(s)), "")
    return name[: len(name) - len(compression)], compression


def is_jsonl(path: Path) -> bool:
    """JSON Lines, by its name (*.jsonl, plain or compressed): one record a document."""
    return split_name(path)[0].endswith(".jsonl")


def sniff_head(head: bytes, name: str = "") -> Kind:
    """The kind of bytes that begin with `head` (a file named `name`, or a stream)."""
    inner, compression = split_name(Path(name)) if name else ("", "")
    by_name = next((k for k in KINDS.values() if not k.magic and inner.endswith(k.suffixes or ("\0",))), None)
    by_bytes = next((k for k in KINDS.values() if any(head.startswith(m) for m in k.magic)), None)
    if by_name is not None and (by_bytes is None or by_bytes.codec or by_bytes is KINDS["zip"]):
        return KINDS["json-array"] if by_name is KINDS["json"] and head.lstrip().startswith(b"[") else by_name
    if by_bytes is not None:
        return by_bytes
    if compression:  # named compressed, and not: the reader opens it as such and names the damage
        return next(k for k in KINDS.values() if compression in k.suffixes)
    odd, even = head[1:6:2], head[0:6:2]  # ASCII as UTF-16 without a mark: every other byte NUL
    if len(head) >= 6 and ((odd == bytes(3) and all(even)) or (even == bytes(3) and all(odd))):
        return KINDS["utf16"]
    return KINDS["binary"] if b"\x00" in head else KINDS["text"]


def sniff(path: Path) -> Kind:
    """The kind of `path` (links followed)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return KINDS["missing"]
    if stat.S_ISDIR(mode):
        return KINDS["folder"]
    if not stat.S_ISREG(mode):
        return KINDS["special"]
    with open(path, "rb") as fh:
        return sniff_head(fh.read(HEAD_BYTES), Path(path).name)


PEEK = {"gzip": gzip.open, "bzip2": bz2.open, "xz": lzma.open}  # a compression's first bytes, undone


def holds_text(path: Path) -> bool:
    """Whether a file no corpus name announces is UTF-8 text (a compressed one: by its first bytes undone)."""
    kind = sniff(path)
    if kind is not KINDS["text"] and not kind.codec:
        return False
    try:
        with PEEK[kind.codec](path) if kind.codec else open(path, "rb") as fh:
            head = fh.read(HEAD_BYTES)
        codecs.getincrementaldecoder("utf-8")().decode(head)  # (a character cut at HEAD_BYTES: not final)
    except (OSError, EOFError, ValueError, lzma.LZMAError, zlib.error):  # damaged, or not UTF-8 (UnicodeDecodeError)
        return False
    return sniff_head(head, split_name(path)[0]) is KINDS["text"]


def refusal(source: str, kind: Kind, command: str) -> UsageError:
    """The one line for an input `source` (a path, or 'stdin') of `kind` that `command` does not read."""
    advice = getattr(kind, command) or ""
    if advice == PIPE and source == "stdin":
        advice = f"pipe it through {kind.tool} first"
    elif advice == PIPE:  # {path}: quoted below
        advice = f"pipe it in ({kind.tool} {{path}} | bertcli encode ... -)"
    return UsageError(f"{source}: {kind.what}; {advice.format(path=shlex.quote(source))}")


def check(path: Path, command: str) -> Kind:
    kind = sniff(path)
    if getattr(kind, command):
        raise refusal(str(path), kind, command)
    return kind


def is_stream(path: Path) -> bool:
    """Whether `path` (links followed) is a character device or a pipe: written in place, as a rename replaces it."""
    try:
        mode = os.stat(Path(path).expanduser()).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def stdin_kind(wait_s: float = 0.5) -> Kind | None:
    """The kind of stdin by its first bytes, peeked, where they come within `wait_s` (None: a terminal, or none)."""
    try:
        stream = sys.stdin.buffer
        if stream.isatty() or not select.select([stream], [], [], wait_s)[0]:
            return None
        return sniff_head(stream.peek(HEAD_BYTES)[:HEAD_BYTES])
    except (AttributeError, ValueError, OSError):
        return None
