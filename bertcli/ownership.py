"""What bertcli may replace or delete: only what it can prove it wrote, never the user's inputs.

bertcli replaces whole folders (prepared data, checkpoints and `best`, exports) by writing a new
one and renaming it over the old (atomic.folder), and it prunes old checkpoints. That is safe only
when the old folder is bertcli's own. A folder counts as bertcli's when
  - its proof file (a JSON object with a "bertcli_version" key: manifest.json, trainer_state.json,
    an export's config.json) is there, and
  - every entry in it is a path that bertcli writes in a folder of that kind (layout.Layout.paths),
    so that a user's notes dropped inside are never deleted with it.
An empty folder may always be used. Anything else at a target (a user's folder, a file) is refused
with one line naming it and saying what to do (UsageError, exit 2), and so is a target that is,
contains or (for folders that are read) lies inside one of the command's inputs: the config, the
corpus, the source checkpoint, the run folder. Paths are compared resolved (symlinks followed).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shlex
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertcli import atomic
from bertcli.errors import DamagedFile, UsageError
from bertcli.layout import (
    CHECKPOINT,
    CHECKPOINTS,
    EXPORT,
    LOCK,
    PREPARED,
    RUN_FILES,
    RUN_FOLDERS,
    Kind,
    Layout,
    identify,
)

PROOF_KEY = "bertcli_version"  # bertcli writes it in every manifest, trainer state and exported config.json


@dataclass(frozen=True)
class Input:
    """A path a command reads, which its outputs must never replace."""

    label: str  # "the corpus", "the config", "the source checkpoint"
    path: Path
    inside_ok: bool = False  # True: writing below it is fine (a run folder holds its prepared data)


def _is_proof(file: Path) -> bool:
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(raw, dict) and PROOF_KEY in raw


def first_foreign(folder: Path, layout: Layout, prefix: str = "") -> str | None:
    """The first entry under `folder` (relative path) that is not one `layout` holds; stops early,
    so a large folder of the user's is not walked whole. Symbolic links are not followed."""
    with os.scandir(folder) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            rel = prefix + entry.name
            if not layout.holds(rel):
                return rel
            if entry.is_dir(follow_symlinks=False):
                found = first_foreign(Path(entry.path), layout, rel + "/")
                if found is not None:
                    return found
    return None


def own_file(path: Path) -> bool:
    """Whether `path` is a regular file itself: not a symbolic link (to a file or anywhere), not
    missing, not a folder or a device. Inside a folder bertcli wrote, anything else is not bertcli's
    and is never read or copied: a link there would lead out of the folder."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def is_empty_folder(path: Path) -> bool:
    """An existing folder with nothing in it (a symbolic link to one counts)."""
    return Path(path).is_dir() and not any(Path(path).iterdir())


def not_owned(target: Path, layout: Layout) -> str | None:
    """Why bertcli may not replace `target` with a new folder of `layout` (None: it may:
    nothing there, an empty folder, or a folder of that kind that bertcli wrote and nobody added to)."""
    target = Path(target)
    if not target.exists():
        return "is a symbolic link to a missing path" if target.is_symlink() else None
    if not target.is_dir():
        return "is a file, not a folder"
    if is_empty_folder(target):
        return None
    foreign = first_foreign(target, layout)
    if foreign is not None:
        return f"holds {foreign}, which is not a file bertcli writes in {layout.noun}"
    # Every entry is one bertcli writes there; the proof must parse (see Layout.damaged_proof_counts).
    marked = (
        layout.own_mark is not None
        and (target / layout.own_mark).is_dir()
        and any((target / layout.own_mark).iterdir())
    )
    damaged_proof = (layout.damaged_proof_counts or marked) and (target / layout.proof).is_file()
    if not _is_proof(target / layout.proof) and not damaged_proof:
        return f"is not {layout.noun} written by bertcli (no {layout.proof} of bertcli's)"
    return None


def check_replaceable(target: Path, layout: Layout, fix: str) -> None:
    """Refuse (exit 2) to replace `target` unless bertcli wrote it (see not_owned)."""
    reason = not_owned(target, layout)
    if reason is not None:
        raise UsageError(
            f"{target} {reason}, so bertcli left it untouched (it replaces only what it wrote itself): {fix}"
        )


def relation(target: Path, other: Path) -> str | None:
    """How `target` stands to `other`, resolved: 'is', 'contains', 'is inside', or None (apart)."""
    t, o = Path(target).expanduser().resolve(), Path(other).expanduser().resolve()
    if t == o:
        return "is"
    if t in o.parents:
        return "contains"
    if o in t.parents:
        return "is inside"
    return None


def check_apart(target: Path, inputs: list[Input], fix: str) -> None:
    """Refuse (exit 2) an output `target` that is, contains or lies inside one of the inputs."""
    for item in inputs:
        how = relation(target, item.path)
        if how is not None and not (how == "is inside" and item.inside_ok):
            harm = "change" if how == "is inside" else "destroy"
            raise UsageError(f"{target} {how} {item.label} {item.path}; writing there would {harm} it: {fix}")


def remove_leftover_folders(final: Path, kind: Layout, mine: bool = False) -> None:
    """Remove what a killed writer of folder `final` (atomic.folder's) left next to it: its temporary
    folders (.tmp-NAME.PID, .tmp-del-NAME.PID) when process PID is gone (`mine`: this process's own,
    after a stop whose signal landed where no cleanup of its own ran), and only when they hold
    nothing but files of `kind`; a folder moved aside (.tmp-old-NAME.PID) whose replacement never
    arrived is put back."""
    final = Path(final).expanduser().resolve()
    if not final.parent.is_dir():
        return
    pattern = re.compile(rf"^{re.escape(atomic.TMP_PREFIX)}(old-|del-)?{re.escape(final.name)}\.(\d{{1,9}})$")
    for child in final.parent.iterdir():
        match = pattern.match(child.name)
        left = match and (int(match.group(2)) == os.getpid() if mine else not atomic.pid_alive(int(match.group(2))))
        if not left or child.is_symlink() or not child.is_dir():
            continue
        if first_foreign(child, kind) is not None:
            continue  # something else in it: not bertcli's to delete
        if match.group(1) == "old-" and not final.exists() and not final.is_symlink():
            os.replace(child, final)
        else:
            shutil.rmtree(child, ignore_errors=True)


# The first bytes of compressed files: encode reads text, and a compressed file's bytes are no text.
COMPRESSED_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"PK\x03\x04": "zip",
}
# Output names that promise a compression encode does not apply, and the tool that would.
COMPRESSED_SUFFIXES = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd", ".zip": "zip"}
# How each is piped in, decompressed (trial 20 U1: zstd and zip were read as text after the model loaded).
DECOMPRESS = {"gzip": "gzip -dc", "bzip2": "bzip2 -dc", "xz": "xz -dc", "zstd": "zstd -dc", "zip": "unzip -p"}


# Text in another encoding than UTF-8, by its byte-order mark (UTF-32's first: its LE mark begins with UTF-16's),
# or by the NUL of each ASCII character's other byte (UTF-16 without a mark); converted with iconv.
ENCODING_MARKS = {
    b"\xff\xfe\x00\x00": "UTF-32",
    b"\x00\x00\xfe\xff": "UTF-32",
    b"\xff\xfe": "UTF-16",
    b"\xfe\xff": "UTF-16",
}
CONVERT = {name: f"iconv -f {name} -t UTF-8" for name in ("UTF-16", "UTF-32")}


def foreign_text_kind(start: bytes) -> str | None:
    """What a stream that begins with bytes `start` (its first 6 or more) holds, where it is not UTF-8
    text encode can read: a compression (COMPRESSED_MAGIC), or UTF-16 or UTF-32 text (trial 22 U2:
    Windows' "Unicode" text was refused after the model loaded, as "not valid UTF-8", and with
    --errors replace encoded as garbage). None: it may be UTF-8."""
    kind = next((name for magic, name in COMPRESSED_MAGIC.items() if start.startswith(magic)), None)
    kind = kind or next((name for mark, name in ENCODING_MARKS.items() if start.startswith(mark)), None)
    if kind is None and len(start) >= 6:  # ASCII as UTF-16 without a mark: every other byte NUL, the rest not
        odd, even = start[1:6:2], start[0:6:2]
        if (odd == bytes(3) and all(even)) or (even == bytes(3) and all(odd)):
            kind = "UTF-16"
    return kind


def refuse_foreign_text(name: str, kind: str, path: str | None = None) -> UsageError:
    """The one line for an input `name` that is not UTF-8 text (foreign_text_kind `kind`; `path`: a
    file, else stdin), with the command that makes it text."""
    tool = CONVERT.get(kind) or DECOMPRESS[kind]
    what = f"{kind} text" if kind in CONVERT else f"{kind}-compressed"
    how = (
        f"pipe it in ({tool} {shlex.quote(path)} | bertcli encode ... -)"
        if path is not None
        else f"pipe it through {tool} first (... | {tool} | bertcli encode ...)"
    )
    return UsageError(
        f"{name}: {what}, and encode reads UTF-8 text: {'convert' if kind in CONVERT else 'decompress'} it, or {how}"
    )


def check_input(path: str) -> None:
    """Refuse a missing input file, a folder or a compressed file (the CLI asks before the model
    loads: a .gz was refused after it, as "line 1 is not valid UTF-8", trial 19 U2)."""
    if not Path(path).exists():
        raise UsageError(f"{path}: no such input file")
    if Path(path).is_dir():
        raise UsageError(f"{path}: is a folder, not a text file")
    if Path(path).is_file():
        with open(path, "rb") as fh:
            kind = foreign_text_kind(fh.read(6))
        if kind:
            raise refuse_foreign_text(path, kind, path)


def check_stdin(wait_s: float = 0.5) -> None:
    """Refuse compressed or UTF-16/32 bytes on stdin before the model loads (seconds), where its first bytes come
    within `wait_s`: they are peeked, left for the reader. A producer slower than that, or a
    terminal, is not waited for (encode's reader checks the first line again)."""
    import select

    try:
        stream = sys.stdin.buffer
        if stream.isatty() or not select.select([stream], [], [], wait_s)[0]:
            return
        start = stream.peek(6)[:6]
    except (AttributeError, ValueError, OSError):  # no stdin of its own (in-process), or closed
        return
    kind = foreign_text_kind(start)
    if kind:
        raise refuse_foreign_text("stdin", kind)


def is_stream(path: Path) -> bool:
    """Whether `path` (its links followed: /dev/stdout) is a character device or a named pipe: an output
    written in place as it goes, as the shell's `>` writes it. Replacing it by a rename would put a
    regular file where /dev/null or a pipe's reader's FIFO was."""
    try:
        mode = os.stat(Path(path).expanduser()).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def _kind(path: Path) -> str:
    mode = os.stat(path).st_mode
    return "block device" if stat.S_ISBLK(mode) else "socket" if stat.S_ISSOCK(mode) else "special file"


def check_output_file(output: Path, inputs: list[Path], model: Path) -> Path:
    """The resolved path for a file output such as encode's output file: a file the user names is
    replaced (as with any -o), but never a folder, one of the input files, a file of the model
    (inside a checkpoint or Hugging Face folder, or a run folder's checkpoints/; a run folder's other
    files are not read), nor a new file inside a folder bertcli owns (see `owner`). Resolved, so
    that an output that is a symbolic link is written through; a character device or named pipe
    (`is_stream`) is returned as given, to be written in place."""
    read = Path(model) / CHECKPOINTS if (Path(model) / CHECKPOINTS).is_dir() else Path(model)
    if is_stream(output):  # -o /dev/null, a named pipe, /dev/stdout: written in place, as the shell's > does
        read = [os.stat(p) for p in inputs if is_stream(p)] + (
            [os.fstat(0)] if not inputs or "-" in map(str, inputs) else []
        )
        written = os.stat(Path(output).expanduser())
        if stat.S_ISFIFO(written.st_mode) and any(
            (r.st_dev, r.st_ino) == (written.st_dev, written.st_ino) for r in read
        ):
            raise UsageError(
                f"the output {output} is the pipe encode reads: its rows would come back as input; name another"
            )
        return Path(output)
    resolved = Path(output).expanduser().resolve()
    if resolved.exists() and not resolved.is_file() and not resolved.is_dir():
        raise UsageError(
            f"the output {output} is a {_kind(resolved)}, not a file: name a file (or a character device or named pipe, "
            "which are written in place)"
        )
    if resolved.is_dir():
        raise UsageError(f"the output {output} is a folder; name a file, e.g. {Path(output) / 'vectors.npy'}")
    if not resolved.parent.is_dir():  # checked before the model loads, not at the first write
        raise UsageError(
            f"the output {output}: its folder {Path(output).parent} does not exist; create it or name a "
            "file in an existing folder"
        )
    for path in inputs:
        if relation(resolved, path) == "is" or (
            resolved.exists() and Path(path).exists() and os.path.samefile(resolved, path)
        ):  # a hard link too
            raise UsageError(
                f"the output {output} is the input file {path}; writing there would destroy it: name another file"
            )
    if resolved.exists() and (not inputs or "-" in map(str, inputs)):  # stdin a file: `-o F < F` (trial 21 S2)
        try:
            given, written = os.fstat(0), os.stat(resolved)
        except OSError:  # no stdin
            given = written = None
        if given is not None and stat.S_ISREG(given.st_mode) and os.path.samestat(given, written):
            raise UsageError(
                f"the output {output} is the file on encode's stdin; writing there would destroy it: name another file"
            )
    if resolved.exists() and relation(resolved, read) == "is inside":
        raise UsageError(
            f"the output {output} is a file of the model {model}; writing there would destroy it: name another file"
        )
    run = run_file(resolved)
    if run is not None:
        raise UsageError(
            f"the output {output} is {run[1]} of the run folder {run[0]}, which bertcli reads and writes: "
            f"name another file, e.g. {run[0] / ('vectors' + (resolved.suffix if resolved.suffix in ('.npy', '.tsv') else '.jsonl'))}"
        )
    owned = owner(resolved.parent)
    if owned is not None:
        outside = owned[0].parent
        while owner(outside) is not None:
            outside = outside.parent
        raise UsageError(
            f"the output {output} is inside {owned[0]}, {owned[1]} of bertcli's (it replaces such folders "
            "whole, and refuses one holding a file it did not write): name a file outside it, e.g. "
            f"{outside / resolved.name}"
        )
    return resolved


def check_output_folder(target: Path, fix: str) -> None:
    """Refuse (exit 2) an output folder (export's OUT) inside a folder bertcli owns (see `owner`: a
    checkpoint, prepared data, a run's checkpoints/) or a run folder's own folders (tensorboard/):
    bertcli replaces or prunes those whole, and would count the new folder as damage or a foreign file."""
    resolved = Path(target).expanduser().resolve()
    run = run_file(resolved)
    if run is not None:
        raise UsageError(f"{target} is {run[1]} of the run folder {run[0]}, which bertcli reads and writes: {fix}")
    owned = owner(resolved.parent)
    if owned is not None:
        raise UsageError(
            f"{target} is inside {owned[0]}, {owned[1]} of bertcli's (it replaces such folders whole, and refuses "
            f"one holding a file it did not write): {fix}"
        )


def run_file(path: Path) -> tuple[Path, str] | None:
    """(the run folder, what `path` is of it) when `path` is one of a run folder's own files (see
    layout.RUN_FILES), or inside its tensorboard/; None otherwise. A run folder here is one that a
    run has started in (checkpoints/, .lock or metrics.jsonl: a folder with only a config.yaml is
    not one yet, and writing there is the user's)."""

    def is_run(folder: Path) -> bool:
        found = identify(folder)
        return found.kind is Kind.RUN and found.started

    if path.name in RUN_FILES and is_run(path.parent):
        return path.parent, f"the {path.name}"
    locked = path.parent / path.name[1 : -len(LOCK)]  # PARENT/.NAME.lock: the lock of prepared data PARENT/NAME
    if path.name.startswith(".") and path.name.endswith(LOCK) and locked.is_dir() and is_run(path.parent):
        return path.parent, f"the lock of its prepared data {locked.name}/"
    for at in path.parents:
        if at.name in RUN_FOLDERS and is_run(at.parent):
            return at.parent, f"inside the {at.name}/ folder"
    return None


def owner(folder: Path) -> tuple[Path, str] | None:
    """The nearest folder at or above `folder` that bertcli writes whole or prunes (a checkpoint,
    prepared data, an export, a run's checkpoints/ folder) and what it is; None: no such folder.
    Outputs the user names go elsewhere (see check_output_file)."""
    layouts = (CHECKPOINT, PREPARED, EXPORT)

    def proves(folder: Path, layout: Layout) -> bool:
        proof = folder / layout.proof
        return _is_proof(proof) or (layout.damaged_proof_counts and proof.is_file())

    for at in (folder, *folder.parents):
        for layout in layouts:
            if proves(at, layout):
                return at, layout.noun
        if at.name == CHECKPOINTS and at.is_dir() and any(proves(child, CHECKPOINT) for child in at.iterdir()):
            return at, "a run's checkpoints folder"
    return None


def check_config_replaceable(path: Path) -> None:
    """Refuse (exit 2) to overwrite `path` (a forced init) unless it is a bertcli config: a YAML
    mapping whose top-level keys are all bertcli sections (or an empty file). Only that one file is
    ever written; nothing else in its folder is touched."""
    import dataclasses

    import yaml

    from bertcli.config import Config

    sections = {f.name for f in dataclasses.fields(Config)}
    fix = "move it away first, or choose another folder"
    if path.is_dir():
        raise UsageError(f"{path} is a folder; bertcli init writes config.yaml as a file: {fix}")
    try:
        text = path.read_text(encoding="utf-8")
        raw = yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError):
        raw = False  # unreadable, not text, not YAML: not a config bertcli wrote
    if raw is None and not text.strip():
        return  # an empty file: nothing to lose (one of comments alone is notes, not a config bertcli wrote)
    foreign = sorted(str(k) for k in raw if k not in sections) if isinstance(raw, dict) else None
    if foreign is None or foreign:
        why = (
            f"its key {foreign[0]!r} is not a bertcli config section"
            if foreign
            else "it holds no settings"
            if raw is None
            else "it is not a YAML mapping"
        )
        raise UsageError(f"{path} is not a bertcli config ({why}), so bertcli init leaves it untouched: {fix}")


def linked(
    path: Path,
    where: str = "a checkpoint folder",
    fix: str = "replace it with the file itself, or use another checkpoint",
) -> UsageError:
    """The error for a file of bertcli's own folder `where` that is a symbolic link."""
    return UsageError(
        f"{path} is a symbolic link, which bertcli never follows out of {where} (its target could be any file): {fix}"
    )


def read_own(
    path: Path,
    where: str = "a checkpoint folder",
    fix: str = "replace it with the file itself, or use another checkpoint",
) -> bytes:
    """The bytes of a file of bertcli's own folder `where` (a checkpoint, the prepared data); a
    symbolic link is refused (exit 2, with `fix`), at the open itself (O_NOFOLLOW)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP or Path(path).is_symlink():
            raise linked(path, where, fix) from None
        raise
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def read_own_json(path: Path) -> dict[str, Any]:
    """The JSON object in file `path` of a checkpoint folder (read_own: never through a link); one
    that does not parse, or holds no object, is DamagedFile (exit 2, naming it)."""
    try:
        value = json.loads(read_own(path).decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise DamagedFile(path, exc) from None
    if not isinstance(value, dict):
        raise DamagedFile(path, ValueError("not a JSON object"))
    return value


# The checkpoint format (trainer_state.json's format_version) from which every checkpoint records the
# SHA-256 of its weights, training state, config and tokenizer files. Without that record, a checkpoint
# of an older format is read as it was; one of this format or none is damaged (a trainer_state.json
# cut down to `{}` let an edited config.yaml through, exit 0).
HASHES_RECORDED_FROM = 3


def must_record_hashes(trainer_state: dict[str, Any]) -> bool:
    """Whether checkpoint state `trainer_state` must hold the SHA-256 records (see HASHES_RECORDED_FROM)."""
    version = trainer_state.get("format_version")
    return not (isinstance(version, int) and not isinstance(version, bool) and version < HASHES_RECORDED_FROM)


# SHA-256 of large files already hashed by this process, by (device, inode, size, mtime, ctime): a
# checkpoint's weights are checked before torch is imported, then again where they are loaded. Any
# write or a time set back changes the ctime, which no user can set: an edit is always hashed anew.
_HASHED: dict[tuple[int, ...], str] = {}
HASH_CACHE_BYTES = 16 << 20  # smaller files cost little to hash again


def sha256_of(path: Path) -> str:
    """The SHA-256 of a file, read in 4 MiB blocks (about 1.5 GB/s: 0.3 s for BERT-base's weights):
    what shows that a file is the one bertcli wrote (a corpus file, a tokenizer, a checkpoint's weights)."""
    with open(path, "rb") as fh:
        st = os.fstat(fh.fileno())
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if key in _HASHED:
            return _HASHED[key]
        digest = hashlib.sha256()
        for block in iter(lambda: fh.read(4 << 20), b""):
            digest.update(block)
    if st.st_size >= HASH_CACHE_BYTES:
        _HASHED[key] = digest.hexdigest()
    return digest.hexdigest()
