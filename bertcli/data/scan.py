"""The corpus's files (data.include, data.exclude), their sizes, times and SHA-256, and the units of work they make:
a file of at least UNIT_BYTES, a part of a larger uncompressed one, or a run of smaller files closed after a file with
a probability of its size / UNIT_BYTES drawn from its SHA-256 (adding a small file prepares only its run again)."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertcli import sniff, store
from bertcli.config import CORPUS_GLOBS, Config, DataConfig
from bertcli.console import info, log
from bertcli.data.text import MAX_LINE_CHARS, Part, document_cuts, lines_end_in_cr
from bertcli.errors import UsageError

FORMAT_VERSION = 5  # of the prepared folder (prepared.py)
# A unit of work: small enough that 2 workers share a 30 MB corpus evenly, large enough that a 100 GB
# corpus is 25,000 units (each memory-maps 2 token files in training: vm.max_map_count is 65,530).
UNIT_BYTES = 4 << 20
HASH_ALWAYS_BYTES = 1 << 30  # a corpus this large is hashed at every check (1 s a GB); a larger one where changed
SAMPLE = Path(__file__).resolve().parent / "sample" / "python-docs-sample.txt.gz"

SUFFIXES = (".txt", ".jsonl")  # read as text or JSON Lines, plain or compressed, in any case
CORPUS_NAMES = "*.txt and *.jsonl files (plain, .gz, .bz2 or .xz)"


def corpus_path(cfg: Config) -> Path:  # the bundled sample, or data.corpus as resolved
    return SAMPLE if cfg.data.corpus == "sample" else Path(cfg.data.corpus)


def files_of(cfg: Config) -> list[Path]:
    return corpus_files(corpus_path(cfg), cfg.data.include, cfg.data.exclude)


def selected(relative: str, globs: Sequence[str]) -> bool:
    """Whether a glob matches a file's path in the corpus folder or its name, with or without a compression
    suffix, in any case."""
    names = {relative.lower(), relative.lower().rsplit("/", 1)[-1]}
    names |= {name[: len(name) - len(sniff.split_name(Path(name))[1])] for name in names}
    return any(fnmatch.fnmatchcase(name, glob.lower()) for name in names for glob in globs)


def corpus_files(path: Path, include: Sequence[str] = CORPUS_GLOBS, exclude: Sequence[str] = ()) -> list[Path]:
    """The files of a corpus path: the file, or the files of a folder that `include` selects and `exclude` does
    not, sorted; a selected file not named *.txt or *.jsonl is taken where it holds UTF-8 text; skips are said."""
    path = Path(path).expanduser()
    if sniff.check(path, "prepare") is not sniff.KINDS["folder"]:
        return [path]
    files, skipped = _walk(path, include=include, exclude=exclude)
    default = list(include) == list(CORPUS_GLOBS)
    named = CORPUS_NAMES if default else f"files that data.include {list(include)} names"
    words = SKIPPED | {"name": f"file(s) that are not {named}", "excluded": f"file(s) data.exclude {exclude} names"}
    hint = "; data.include: ['*'] reads every file of UTF-8 text" if default else ""
    for why, examples in skipped.items():
        shown = ", ".join(str(e) for e in examples[:3]) + (", ..." if len(examples) > 3 else "")
        info(f"{path}: skipped {len(examples):,} {words[why]}: {shown}{hint if why == 'name' else ''}")
    if not files:
        raise UsageError(f"{path}: no {named} in this folder{hint}")
    for file in files:  # what no name says: another encoding, binary data, a CSV named .txt
        sniff.check(file, "prepare")
    return files


SKIPPED = {  # why a folder's entry is not read, by its code in _walk
    "content": "file(s) that are not plain UTF-8 text (binary data, another encoding, a format such as CSV)",
    "special": "entries that are not regular files (broken links, pipes, devices)",
    "again": "folder(s) or file(s) reached a second time through a symbolic link (read once)",
    "unreadable": "folder(s) that could not be read (permissions)",
    "model": "file(s) of a model, tokenizer, prepared data or run (a vocabulary list, training metrics), not text",
    "hidden": "hidden folder(s) and file(s) (names starting with '.')",
}


def _walk(root: Path, *, include: Sequence[str], exclude: Sequence[str]) -> tuple[list[Path], dict[str, list[Path]]]:
    """(corpus files under `root`, sorted; what was skipped, by its code in SKIPPED, "name" or "excluded")."""
    seen: set[tuple[int, int]] = set()  # (device, inode) of every folder and file taken
    files: list[Path] = []
    skipped: dict[str, list[Path]] = {}

    def skip(reason: str, entry: Path) -> None:
        skipped.setdefault(reason, []).append(entry)

    def new(entry: Path) -> bool:  # not reached before (through another link); else skipped
        st = entry.stat()
        if (st.st_dev, st.st_ino) in seen:
            skip("again", entry)
            return False
        seen.add((st.st_dev, st.st_ino))
        return True

    def reason(entry: Path) -> str | None:
        relative = entry.relative_to(root).as_posix()
        if entry.name.startswith(".") or not entry.is_file():
            return "hidden" if entry.name.startswith(".") else "special"
        if not selected(relative, include) or selected(relative, exclude):
            return "name" if not selected(relative, include) else "excluded"
        if not sniff.split_name(entry)[0].endswith(SUFFIXES):
            return None if sniff.holds_text(entry) else "content"
        return "model" if any((entry.parent / mark).exists() for mark in NOT_TEXT.get(entry.name, ())) else None

    seen.add((root.stat().st_dev, root.stat().st_ino))
    for folder, dirs, names in os.walk(root, followlinks=True, onerror=lambda e: skip("unreadable", Path(e.filename))):
        kept = []
        for name in sorted(dirs):
            if name.startswith("."):  # .git, .ipynb_checkpoints: copies and tools' files, not the corpus
                skip("hidden", Path(folder, name))
            elif new(Path(folder, name)):
                kept.append(name)
        dirs[:] = kept
        for name in sorted(names):
            entry = Path(folder, name)
            if why := reason(entry):
                skip(why, entry)
            elif new(entry):
                files.append(entry)
    return sorted(files), skipped


# Files a model, tokenizer, prepared data or run folder holds under corpus names, and what beside them shows it.
NOT_TEXT = {
    "vocab.txt": ("config.json", "tokenizer.json", "model.safetensors", "trainer_state.json", "manifest.json"),
    "merges.txt": ("config.json", "tokenizer.json", "vocab.json"),
    "metrics.jsonl": ("config.yaml", "checkpoints"),
}


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _hash_parts(path: Path, cuts: list[int]) -> list[dict[str, Any]]:
    """The parts of a file cut at `cuts`: start, end, first line number and SHA-256, in one read."""
    bounds, parts, line = [0, *cuts, path.stat().st_size], [], 1
    with open(path, "rb") as fh:
        for start, end in zip(bounds, bounds[1:]):
            sha, left, lines = hashlib.sha256(), end - start, 0
            while left > 0 and (block := fh.read(min(1 << 20, left))):  # (a file that shrank: hashed anew next time)
                sha.update(block)
                lines += block.count(b"\n")
                left -= len(block)
            parts.append({"start": start, "end": end, "line": line, "sha256": sha.hexdigest()})
            line += lines
    return parts


def file_entries(files: list[Path], previous: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Path, size, mtime and SHA-256 of each file; a corpus over HASH_ALWAYS_BYTES keeps unchanged files' hashes."""
    known = {e["path"]: e for e in previous} if sum(f.stat().st_size for f in files) > HASH_ALWAYS_BYTES else {}
    entries = []
    for f in files:
        st, old = f.stat(), known.get(str(f.resolve()))
        entry: dict[str, Any] = {"path": str(f.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
        same = old is not None and (old.get("bytes"), old.get("mtime_ns")) == (st.st_size, st.st_mtime_ns)
        if same and entry_digest(old):
            entry.update({k: old[k] for k in ("sha256", "parts") if k in old})
        else:
            if lines_end_in_cr(f):  # a line ends at LF: the file would read as one document
                log(f"warning: {f}: its lines end in CR alone, so it reads as one document: tr '\\r' '\\n' < OLD > NEW")
            cuts = document_cuts(f, UNIT_BYTES) if st.st_size > UNIT_BYTES and not sniff.sniff(f).codec else []
            entry.update({"parts": _hash_parts(f, cuts)} if cuts else {"sha256": store.sha256_of(f)})
        entries.append(entry)
    _say_copies(entries)
    return entries


def _say_copies(entries: list[dict[str, Any]]) -> None:
    """Warn of corpus files with the same bytes: trained on twice, and maybe on both sides of the held-out split."""
    first: dict[Any, str] = {}
    copies: list[tuple[str, str]] = []
    for entry in entries:
        if entry["bytes"]:
            copies += [(entry["path"], first[d])] if (d := entry_digest(entry)) in first else []
            first.setdefault(d, entry["path"])
    if copies:
        log(f"warning: {len(copies):,} corpus file(s) are copies, e.g. {copies[0][0]} and {copies[0][1]}: remove them")


def entry_digest(entry: dict[str, Any]) -> str | None:
    """A corpus file's contents as recorded: its SHA-256, or its parts' hashes, hashed."""
    if isinstance(entry.get("parts"), list):
        return digest([p.get("sha256") for p in entry["parts"] if isinstance(p, dict)])
    return entry.get("sha256") if isinstance(entry.get("sha256"), str) else None


def unchanged_bytes(entries: list[dict[str, Any]], previous: list[dict[str, Any]]) -> int:
    """Bytes of the corpus that the last prepare read too, by content (files, or parts of files)."""

    def pieces(found: list[dict[str, Any]]) -> list[tuple[Any, int]]:
        out = []
        for e in found:
            if isinstance(parts := e.get("parts"), list):
                out += [(p.get("sha256"), p.get("end", 0) - p.get("start", 0)) for p in parts if isinstance(p, dict)]
            else:
                out.append((e.get("sha256"), e.get("bytes", 0)))
        return out

    known = {sha for sha, _ in pieces(previous) if isinstance(sha, str)}
    return sum(size for sha, size in pieces(entries) if sha in known)


def file_changes(then: list[dict[str, Any]], now: list[dict[str, Any]], root: Path) -> str:
    """The corpus files changed between two prepares, in words, relative to `root`; '' where none is."""
    old = {e.get("path"): entry_digest(e) for e in then}
    new = {e.get("path"): entry_digest(e) for e in now}
    added, gone = [p for p in new if p not in old], [p for p in old if p not in new]
    short = (lambda p: os.path.relpath(str(p), root)) if root.is_dir() else (lambda p: Path(str(p)).name)
    renamed = []  # a file gone and one added with its bytes
    for path in list(added):
        if (twin := next((g for g in gone if old[g] == new[path]), None)) is not None:
            renamed.append(f"{short(twin)} -> {short(path)}")
            added.remove(path)
            gone.remove(twin)
    changed = [short(p) for p in new if p in old and old[p] != new[p]]
    kinds = {"changed": changed, "added": [*map(short, added)], "gone": [*map(short, gone)], "renamed": renamed}
    return ", ".join(f"{len(n)} {w} ({', '.join(n[:2])}{', ...' if len(n) > 2 else ''})" for w, n in kinds.items() if n)


@dataclass(frozen=True)
class Unit:
    """A unit of work: parts of corpus files read in order and prepared into shards of their own."""

    key: str  # SHA-256 of what its shards depend on: its bytes, the tokenizer, the settings
    content: str  # SHA-256 of its bytes alone (and how they are read): its held-out phase
    parts: tuple[Part, ...]
    sizes: tuple[int, ...]  # bytes of each part in its file (compressed ones: the compressed size)
    pieces: tuple[tuple[int, int, int], ...]  # (file number in the corpus, start, end) of each part

    @property
    def bytes(self) -> int:
        return sum(self.sizes)

    def phase(self, stride: int) -> int:
        return unit_phase(self.content, stride)


def unit_phase(content: str, stride: int) -> int:
    """Where a unit's every-k-th held-out documents start: from its bytes, so small units are held out too."""
    return int(content[:15], 16) % stride if stride else 0


def _reading(path: Path) -> str:
    """How a file's bytes are read (format, compression): part of what its shards depend on."""
    codec = sniff.sniff(path).codec
    return ("jsonl" if sniff.is_jsonl(path) else "text") + (f".{codec}" if codec else "")


def plan_units(files: list[Path], entries: list[dict[str, Any]], tokenizer_sha256: str, data: DataConfig) -> list[Unit]:
    """The units of the corpus, in corpus order: a function of the files' contents and formats."""
    settings = {"format_version": FORMAT_VERSION, "tokenizer": tokenizer_sha256, "max_line_chars": MAX_LINE_CHARS}
    settings |= {"split_sentences": data.split_sentences, "validation_fraction": data.validation_fraction}
    settings |= {"document": data.document} if data.document != "blank_line" else {}  # blank_line: no key of its own
    units: list[Unit] = []
    group: list[tuple[Part, int, tuple[int, int, int], str]] = []  # (part, size, piece, sha256)

    def close(members: list[tuple[Part, int, tuple[int, int, int], str]]) -> list:
        if members:
            content = digest([[_reading(m[0].path), m[3]] for m in members])
            parts, sizes, pieces = (tuple(m[i] for m in members) for i in range(3))
            key = digest({**settings, "content": content})
            units.append(Unit(key, content, parts=parts, sizes=sizes, pieces=pieces))
        return []

    for number, (path, entry) in enumerate(zip(files, entries)):
        if "parts" in entry:  # a large file, cut into parts: a unit each
            group = close(group)
            for p in entry["parts"]:
                piece = (number, p["start"], p["end"])
                close([(Part(path, p["start"], p["end"], p["line"]), p["end"] - p["start"], piece, p["sha256"])])
            continue
        member = (Part(path), entry["bytes"], (number, 0, entry["bytes"]), entry["sha256"])
        if entry["bytes"] >= UNIT_BYTES:  # a large compressed file (or one without a boundary to cut at)
            group = close(group)
            close([member])
            continue
        group.append(member)
        if int(entry["sha256"][:16], 16) < (entry["bytes"] << 64) // UNIT_BYTES:  # closes with P = size / UNIT_BYTES
            group = close(group)
    close(group)
    return units


def index_digest(units: list[Unit]) -> str:
    return digest({"format_version": FORMAT_VERSION, "units": [u.key for u in units]})
