"""encode's torch-free half: lines in (checked before the model loads), rows out (FORMATS), --layer checked."""

from __future__ import annotations

import codecs
import collections
import contextlib
import json
import os
import queue
import shutil
import stat
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO, TextIO

import numpy as np

from bertcli import layout, sniff, store
from bertcli.errors import PipeClosed, RunError, UsageError

# A line is kept up to this many bytes, far more than a 512-token text uses (the rest is read, checked, dropped).
LINE_BYTES = 8 << 20
READ_AHEAD = 4096  # lines read ahead while a window is encoded
POOLINGS = ("cls", "mean", "max", "pooler")


class NotUtf8(UsageError):
    def __init__(self, source: str, line: int, byte: int) -> None:
        super().__init__(f"{source}: line {line} is not valid UTF-8 (byte {byte}); fix it or pass --errors replace")


class Line(str):
    """An input line, its source and number; past LINE_BYTES `lost` more than blanks, `dropped_tab` a TAB."""

    source: str
    number: int
    lost: bool = False
    dropped_tab: bool = False
    inner_cr: bool = False

    def where(self) -> str:
        return f"{self.source}: line {self.number}"


def check_inputs(inputs: list[str]) -> None:
    """Refuse, before the model loads, inputs that are not text (sniff.KINDS); stdin where its first bytes are in."""
    for source in inputs:
        if source != "-":
            sniff.check(Path(source), "encode")
    if (not inputs or "-" in inputs) and (kind := sniff.stdin_kind()) is not None and kind.encode:
        raise sniff.refusal("stdin", kind, "encode")


def read_lines(sources: list[str], errors: str) -> Iterator[Line]:
    """Lines of the files ('-': stdin), no line end or byte-order mark; not UTF-8 refused unless errors='replace'."""
    for source in sources or ["-"]:
        name = "stdin" if source == "-" else source
        stream: BinaryIO = sys.stdin.buffer if source == "-" else open(source, "rb")  # noqa: SIM115
        try:
            number = 0
            while raw := stream.readline(LINE_BYTES):
                number += 1
                if number == 1 and (kind := sniff.sniff_head(raw)).encode:  # a slow producer's first bytes
                    raise sniff.refusal(name, kind, "encode")
                lost = tab = False
                if len(raw) == LINE_BYTES and not raw.endswith(b"\n"):
                    raw, lost, tab = _drop_rest(raw, stream, errors=errors, source=name, number=number)
                try:
                    text = raw.decode("utf-8", errors=errors)
                except UnicodeDecodeError as exc:
                    raise NotUtf8(name, number, exc.start) from None
                line = Line((text.removeprefix("\ufeff") if number == 1 else text).rstrip("\r\n"))
                del raw, text  # a long line: one copy at a time
                line.source, line.number, line.lost, line.dropped_tab = name, number, lost, tab
                line.inner_cr = "\r" in line
                yield line
        finally:
            if stream is not sys.stdin.buffer:
                stream.close()


def _drop_rest(head: bytes, stream: BinaryIO, *, errors: str, source: str, number: int) -> tuple[bytes, bool, bool]:
    """(the head cut to whole characters, whether the rest held more than blanks, a TAB): the rest read, checked."""
    cut = len(head)
    while cut > len(head) - 3 and head[cut - 1] & 0xC0 == 0x80:  # continuation bytes of a character cut short
        cut -= 1
    if head[cut - 1] >= 0xC0:  # its lead byte
        cut -= 1
    decoder = codecs.getincrementaldecoder("utf-8")(errors=errors)
    lost, tab, position, pending = bool(head[cut:].strip()), False, cut, head[cut:]
    for block in iter(lambda: stream.readline(LINE_BYTES), b""):
        data, pending = pending + block, b""
        try:
            decoder.decode(data, final=block.endswith(b"\n"))
        except UnicodeDecodeError as exc:
            raise NotUtf8(source, number, position + exc.start) from None
        position += len(data)
        lost, tab = lost or bool(block.strip()), tab or b"\t" in block
        if block.endswith(b"\n"):
            break
    return head[:cut], lost, tab


END = object()  # after the last line


def may_stall(sources: list[str]) -> bool:
    """Whether reading `sources` ('-': stdin) can wait on a producer: a pipe, a terminal, a FIFO."""
    for source in sources or ["-"]:
        try:
            mode = os.fstat(sys.stdin.fileno()).st_mode if source == "-" else os.stat(source).st_mode
        except (OSError, ValueError):  # no stdin of its own (in-process), or a file gone
            return True
        if not stat.S_ISREG(mode):
            return True
    return False


class ReadAhead:
    """Lines read ahead by a thread (a deque: queue.Queue is 10x slower), so that encode sees the input stall."""

    def __init__(self, lines: Iterator[str]) -> None:
        self.items: collections.deque = collections.deque()
        self.ready, self.room, self.stopped = threading.Event(), threading.Event(), threading.Event()
        self.room.set()
        threading.Thread(target=self._read, args=(lines,), name="bertcli-encode-input", daemon=True).start()

    def _put(self, item: object) -> bool:
        self.items.append(item)
        if not self.ready.is_set():
            self.ready.set()
        while len(self.items) >= READ_AHEAD:  # far enough ahead: wait for room (a lost wake-up costs 0.1 s)
            self.room.clear()
            if len(self.items) >= READ_AHEAD and not self.room.wait(0.1) and self.stopped.is_set():
                return False
        return not self.stopped.is_set()

    def _read(self, lines: Iterator[str]) -> None:
        try:
            for line in lines:
                if not self._put(line):
                    break
            else:
                self._put(END)
        except BaseException as exc:  # noqa: BLE001  (handed to the encoding thread, which raises it)
            self._put(exc)
        finally:
            if (close := getattr(lines, "close", None)) is not None:
                close()  # a generator's files (read_lines)

    def get(self, timeout: float | None) -> object:
        """The next line or END; queue.Empty after `timeout` seconds without one."""
        while True:
            try:
                item = self.items.popleft()
            except IndexError:
                self.ready.clear()
                if not self.items and not self.ready.wait(timeout):  # (an append just before the clear is seen)
                    raise queue.Empty from None
                continue
            if not self.room.is_set():
                self.room.set()
            if isinstance(item, BaseException):
                raise item
            return item

    def close(self) -> None:
        """Stop reading ahead (a thread blocked reading stdin ends with the process)."""
        self.stopped.set()
        self.room.set()


def check_layer(model: Any, layer: int, pooling: str | None) -> int:
    """The index of --layer in ModelConfig `model` (0: the embeddings); the pooler reads only the last layer."""
    try:
        index = model.layer_index(layer)
    except IndexError:
        n = model.num_hidden_layers
        raise UsageError(f"--layer {layer}: this model has layers 0 (embeddings) to {n} (-1 to -{n + 1})") from None
    if pooling == "pooler" and index != model.num_hidden_layers:
        raise UsageError("--pooling pooler reads the last layer; drop --layer or pick another pooling")
    return index


class JsonlRows:
    """A JSON object a line: {"line": N, ("text"), "vector": [...]} or, per token, "tokens" and "vectors"."""

    suffix, binary = ".jsonl", False

    def __init__(self, with_text: bool) -> None:
        self.with_text = with_text

    def line(self, number: int, text: str, row: np.ndarray, tokens: list[str] | None) -> str:
        record: dict = {"line": number, **({"text": text} if self.with_text else {})}
        if tokens is not None:
            record |= {"tokens": tokens, "vectors": [[float(f"{x:.6g}") for x in v] for v in row]}
        else:
            record["vector"] = [float(f"{x:.6g}") for x in row]  # as TSV writes them
        return json.dumps(record, ensure_ascii=False)


class TsvRows(JsonlRows):
    """The numbers TAB-separated; with the text first, its backslash, TAB, CR and LF escaped."""

    suffix = ".tsv"

    def line(self, number: int, text: str, row: np.ndarray, tokens: list[str] | None) -> str:
        cell = text.replace("\\", "\\\\").replace("\t", "\\t").replace("\r", "\\r").replace("\n", "\\n")
        return "\t".join(([cell] if self.with_text else []) + [f"{x:.6g}" for x in row])


class NpyRows:
    """A float32 array (rows, hidden size), written at the end: its header needs the row count."""

    suffix, binary = ".npy", True

    def __init__(self, with_text: bool) -> None:
        if with_text:
            raise UsageError("--with-text: npy holds numbers only; use --format jsonl or tsv for the text")


FORMATS = {"jsonl": JsonlRows, "tsv": TsvRows, "npy": NpyRows}
# Output names of data formats encode does not write.
OTHER_FORMATS = tuple(".npz .csv .json .pt .pth .pkl .pickle .h5 .hdf5 .parquet .arrow .safetensors".split())


def output_format(fmt: str | None, output: Path | None, *, with_text: bool, tokens: bool) -> str:
    """--format, or the one the --output suffix names; refused where the other flags cannot have it."""
    if fmt is not None and fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: expected {', '.join(FORMATS)}")
    suffix = output.suffix.lower() if output is not None else ""
    by_name = next((name for name, rows in FORMATS.items() if rows.suffix == suffix), None)
    foreign = suffix in sniff.COMPRESSION_SUFFIXES or (fmt is None and suffix in OTHER_FORMATS)
    if foreign and output is not None and not sniff.is_stream(output):
        raise UsageError(f"--output {output}: encode writes no {suffix}; name a .jsonl, .tsv or .npy file")
    fmt = fmt or by_name or "jsonl"
    if tokens and fmt != "jsonl":
        raise UsageError(f"--tokens writes JSONL, not {fmt}: name a .jsonl file or use --format jsonl")
    if FORMATS[fmt].binary and output is None and sys.stdout.isatty():
        raise UsageError(f"--format {fmt} is binary, not for a terminal: pass --output FILE{FORMATS[fmt].suffix}")
    FORMATS[fmt](with_text)  # its own refusals
    return fmt


def check_output(output: Path, inputs: list[str], model: Path) -> Path:
    """Where rows go (resolved; a device or pipe as given): never a folder, an input, the model's or an owned file."""
    files, reads_stdin = [Path(i) for i in inputs if i != "-"], not inputs or "-" in inputs
    if sniff.is_stream(output):
        written = os.stat(Path(output).expanduser())
        sources = [os.stat(p) for p in files if sniff.is_stream(p)] + ([os.fstat(0)] if reads_stdin else [])
        if stat.S_ISFIFO(written.st_mode) and any(os.path.samestat(s, written) for s in sources):
            raise UsageError(f"--output {output}: the pipe encode reads; name another")
        return Path(output)
    resolved = Path(output).expanduser().resolve()
    kind = sniff.sniff(resolved)
    if kind is sniff.KINDS["folder"] or kind is sniff.KINDS["special"]:
        raise UsageError(f"--output {output}: {kind.what}; name a file, e.g. {Path(output) / 'vectors.npy'}")
    if not resolved.parent.is_dir():
        raise UsageError(f"--output {output}: its folder {Path(output).parent} does not exist; create it")
    with contextlib.suppress(OSError):
        stdin = [os.fstat(0)] if reads_stdin and stat.S_ISREG(os.fstat(0).st_mode) else []
        sources = [os.stat(p) for p in files if p.exists()] + stdin
        if resolved.exists() and any(os.path.samestat(s, os.stat(resolved)) for s in sources):
            raise UsageError(f"--output {output}: an input of encode; name another file")
    model_files = Path(model) / layout.CHECKPOINTS if (Path(model) / layout.CHECKPOINTS).is_dir() else Path(model)
    if resolved.exists() and store.relation(resolved, model_files) == "is inside":
        raise UsageError(f"--output {output}: a file of the model {model}; name another file")
    store.check_not_inside_own(resolved, f"name a file outside it, e.g. {Path.cwd() / resolved.name}")
    store.check_writable(resolved.parent, resolved)
    return resolved


def holds_rows(path: Path) -> bool:
    """Whether temporary file `path` starts as encode's rows do (empty, npy, JSON Lines, TSV): else not encode's."""
    with open(path, "rb") as fh:
        head = fh.read(1 << 16)
    first = head.split(b"\n", 1)[0]
    if not head or head.startswith(b"\x93NUMPY") or first.startswith(b'{"line": '):
        return True
    try:
        return all(float(f) is not None for f in first.split(b"\t")[-1:])
    except ValueError:
        return False


class Writer:
    """Rows to `stream`, to `output` under its temporary name until `close`, or in place to a device or pipe."""

    def __init__(self, fmt: str, stream: TextIO | None, output: Path | None, with_text: bool) -> None:
        self.rows, self.output, self.width = FORMATS[fmt](with_text), output, None
        self.count, self.in_place = 0, output is not None and sniff.is_stream(output)
        self.tmp = layout.tmp_name(output) if output is not None and not self.in_place else None
        if self.tmp is not None:  # of an encode killed before it put its output in place
            store.clean_leftovers(output.parent, lambda p, name: name == output.name and p.is_file() and holds_rows(p))
        binary, path = self.rows.binary, self.tmp or output
        self.target: IO = stream if path is None else open(path, "wb") if binary else open(path, "w", encoding="utf-8")
        folder = self.tmp.parent if self.tmp is not None else None
        self.raw = tempfile.TemporaryFile(dir=folder) if binary else None  # unnamed: nothing left behind

    def write(self, number: int, text: str, row: np.ndarray, tokens: list[str] | None) -> None:
        self.count += 1
        try:
            with store.writing(self.output or Path("stdout")):
                if self.raw is not None:
                    self.width = row.shape[-1]
                    self.raw.write(np.ascontiguousarray(row, dtype=np.float32).tobytes())
                else:
                    self.target.write(self.rows.line(number, text, row, tokens) + "\n")
        except BrokenPipeError:
            raise PipeClosed from None

    def flush(self) -> None:
        if self.output is None and self.raw is None:
            try:
                self.target.flush()
            except BrokenPipeError:
                raise PipeClosed from None

    def close(self, hidden_size: int) -> None:
        """Into place: the text written, or the npy header and rows (no rows: shape (0, H))."""
        try:
            with store.writing(self.output or Path("stdout")):
                out = self.target.buffer if self.output is None and self.raw is not None else self.target
                if self.raw is not None:
                    self.target.flush()
                    header = {"descr": "<f4", "fortran_order": False, "shape": (self.count, self.width or hidden_size)}
                    np.lib.format.write_array_header_1_0(out, header)
                    self.raw.seek(0)
                    shutil.copyfileobj(self.raw, out, 1 << 20)
                    self.raw.close()
                out.flush()
                if self.output is not None:
                    if self.tmp is not None:
                        os.fsync(self.target.fileno())
                    self.target.close()
        except BrokenPipeError:  # a FIFO's or stdout's reader went away
            raise PipeClosed from None
        if self.tmp is not None:
            with contextlib.suppress(FileNotFoundError):  # a file replaced keeps its mode (0600 stays private)
                os.chmod(self.tmp, stat.S_IMODE(os.stat(self.output).st_mode))
            os.replace(self.tmp, self.output)
            store.fsync_path(self.output.parent)

    def abort(self) -> None:
        """Remove what was written: the output keeps its earlier content, if any."""
        for fh in (self.raw, self.target if self.output is not None else None):
            with contextlib.suppress(OSError, AttributeError):  # closing flushes, which fails again on a full disk
                fh.close()
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)


def stream_full(exc: BaseException, output: Path | None) -> RunError | None:
    """The refusal of a full disk under rows written in place (stdout, a device, a pipe); None: another error."""
    in_place = output is None or sniff.is_stream(output)
    if not in_place or not isinstance(exc, OSError) or store.full_errno(exc) is None:
        return None
    fix = "free space" if output is not None else "free space, or pass --output FILE"
    return RunError(f"{output or 'stdout'}: disk full ({exc.strerror}); the rows there are incomplete: {fix}")
