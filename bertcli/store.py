"""bertcli's own files and folders on disk, one owner per promise (torch-free): atomic writes (`write_bytes`,
`folder`, `clean_leftovers`), no link followed (`read_own`), digests, ownership (`not_owned`, `owner`), locks."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertcli import layout
from bertcli.errors import DamagedFile, RunError, UsageError
from bertcli.layout import TEMPORARY, Layout, tmp_name

PROOF_KEY = "bertcli_version"  # in every manifest, trainer state and exported config.json bertcli writes

# The disk, the quota, or ulimit -f (EFBIG); safetensors and tokenizers pass on Rust's io::Error text, no OSError.
DISK_FULL = {
    errno.ENOSPC: ("No space left on device", "os error 28"),
    errno.EDQUOT: ("Disk quota exceeded", "os error 122"),
    errno.EFBIG: ("File too large", "os error 27"),
}


def read_json(file: Path, kind: type = dict) -> Any:
    """A JSON file's value, refused where it does not read or is no `kind` (a dict: an object)."""
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
        raise UsageError(f"{file}: cannot read ({exc}); fix or restore the file") from None
    if not isinstance(raw, kind):
        raise UsageError(f"{file}: expected a JSON {'object' if kind is dict else kind.__name__}")
    return raw


def full_errno(exc: BaseException) -> int | None:
    """The errno of a full disk that `exc` reports, in any library's words; None: another error."""
    if isinstance(exc, OSError) and exc.errno in DISK_FULL:
        return exc.errno
    return next((code for code, words in DISK_FULL.items() if any(w in str(exc) for w in words)), None)


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """A full disk while the block writes `path` is raised as an OSError naming `path` (write() names no file)."""
    try:
        yield
    except Exception as exc:
        code = full_errno(exc)
        if code is None or (isinstance(exc, OSError) and exc.filename == str(path)):
            raise
        raise OSError(code, os.strerror(code), str(path)) from exc


def fsync_path(path: Path) -> None:
    with writing(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def check_writable(folder: Path, named: Path) -> None:
    """An OSError naming `named` where `folder` (or its nearest existing parent) takes no file: a probe is made."""
    folder = Path(folder).expanduser().absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        fd, probe = tempfile.mkstemp(prefix=layout.TMP_PREFIX, dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(named)) from None


def write_bytes(path: Path, data: bytes, *, exclusive: bool = False) -> None:
    """`data` into `path` through its temporary name; `exclusive`: never over a file there (FileExistsError)."""
    path = Path(path)
    tmp = tmp_name(path)
    try:
        with writing(path), open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if exclusive:
            os.link(tmp, path)
            tmp.unlink()
        else:
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def write_text(path: Path, text: str, *, exclusive: bool = False) -> None:
    write_bytes(path, text.encode("utf-8"), exclusive=exclusive)


def write_inside(path: Path, data: str | bytes) -> None:
    """A file inside a folder being written (folder()): the folder's rename makes it appear."""
    with writing(path):
        Path(path).write_bytes(data.encode("utf-8") if isinstance(data, str) else data)


def write_json(path: Path, value: Any) -> None:
    write_inside(path, json.dumps(value, indent=2) + "\n")


def umask() -> int:
    """The process's umask, read without changing it where Linux says it in /proc."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_safetensors(tensors: dict[str, Any], path: Path) -> None:
    """safetensors' file with one metadata key (several come in random order), mode 0666 less the umask (not 0600)."""
    import safetensors.torch

    with writing(path):
        safetensors.torch.save_file(tensors, path, metadata={"format": "pt"})
    os.chmod(path, 0o666 & ~umask())


def save_torch(obj: Any, path: Path) -> None:
    """torch.save(obj, path), raising the OSError of a failed write (torch says only "unexpected pos N vs M")."""
    import torch

    class File:
        def __init__(self, fh: Any) -> None:
            self.fh, self.error, self.flush = fh, None, fh.flush

        def write(self, data: Any) -> int:
            try:
                return self.fh.write(data)
            except OSError as exc:
                self.error = exc
                raise

    with writing(path), open(path, "wb") as fh:
        out = File(fh)
        try:
            torch.save(obj, out)
        except RuntimeError:
            if out.error is not None:
                raise out.error from None
            raise


@contextlib.contextmanager
def folder(final: Path, guard: Callable[[Path], None]) -> Iterator[Path]:
    """A temporary folder to fill, which then replaces `final` in one rename; `guard(final)` runs before and after."""
    final = Path(final).expanduser().resolve()
    guard(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(final)
    try:  # (made inside: a stop signal between the two would leave it)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        yield tmp
        for path in (*tmp.rglob("*"), tmp):
            fsync_path(path)
        guard(final)
        if final.exists() and exchange(tmp, final):
            shutil.rmtree(tmp, ignore_errors=True)  # the old folder, swapped out
        elif final.exists():  # no atomic swap here: a crash between the renames leaves the old one aside
            old = tmp_name(final, "old")
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fsync_path(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def exchange(a: Path, b: Path) -> bool:
    """Swap folders `a` and `b` in one step (renameat2 RENAME_EXCHANGE); False where the system cannot."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_cwd, exchange_flag = -100, 2
    if renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), exchange_flag) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def remove_folder(path: Path) -> None:
    """Delete a folder, renamed first so that it never looks whole half-deleted (a link: itself only)."""
    if path.is_symlink():
        path.unlink()
        return
    doomed = tmp_name(path, "del")
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this machine (another user's too: EPERM)."""
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return not isinstance(exc, ProcessLookupError)
    return True


def clean_leftovers(parent: Path, ours: Callable[[Path, str], bool], *, mine: bool = False) -> list[Path]:
    """Remove (and return) gone writers' (`mine`: this process's) temporary names in `parent` that `ours(path, NAME)`
    accepts; a folder moved aside whose replacement never came is put back."""
    removed: list[Path] = []
    if not parent.is_dir() or parent.is_symlink():
        return removed
    for child in sorted(parent.iterdir()):
        match = TEMPORARY.fullmatch(child.name)
        if match is None or child.is_symlink():
            continue
        how, name, pid = match.group(1), match.group(2), int(match.group(3))
        if (pid != os.getpid()) if mine else pid_alive(pid):
            continue
        with contextlib.suppress(OSError):  # another user's, in a shared folder: theirs to remove
            if not ours(child, name):
                continue
            if how == "old" and not (parent / name).exists() and not (parent / name).is_symlink():
                os.replace(child, parent / name)
                continue
            shutil.rmtree(child) if child.is_dir() else child.unlink()
            removed.append(child)
    return removed


def holds_only(folder: Path, kind: Layout, prefix: str = "") -> bool:
    return folder.is_dir() and not folder.is_symlink() and first_foreign(folder, kind, prefix) is None


def clean_folder_leftovers(final: Path, kind: Layout, *, mine: bool = False) -> None:
    final = Path(final).expanduser().resolve()
    clean_leftovers(final.parent, lambda c, name: name == final.name and holds_only(c, kind), mine=mine)


def file_problem(path: Path) -> str | None:
    """Why `path`, a file of a folder bertcli wrote, may not be read (None: a regular file itself)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "missing"
    if stat.S_ISLNK(mode):
        return "a symbolic link, which bertcli never follows out of its folders"
    return None if stat.S_ISREG(mode) else "not a regular file"


def own_file(path: Path) -> bool:
    return file_problem(path) is None


def linked(path: Path, fix: str) -> UsageError:
    """The refusal of `path`, a symbolic link where bertcli keeps a file or folder of its own."""
    return UsageError(f"{path}: a symbolic link, which bertcli never follows out of its folders; {fix}")


def read_own(path: Path, fix: str = "use another checkpoint") -> bytes:
    """The bytes of a file of a folder bertcli wrote; a symbolic link is refused at the open itself."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP or Path(path).is_symlink():
            raise linked(path, fix) from None
        raise
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def read_own_json(path: Path, fix: str = "use another checkpoint") -> dict[str, Any]:
    """The JSON object of a file of bertcli's (read_own); DamagedFile where it holds none."""
    try:
        value = json.loads(read_own(path, fix).decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise DamagedFile(path, exc, fix) from None
    if not isinstance(value, dict):
        raise DamagedFile(path, ValueError("not a JSON object"), fix)
    return value


# SHA-256 of large files hashed by this process, by (device, inode, size, mtime, ctime): any write changes the ctime.
_HASHED: dict[tuple[int, ...], str] = {}
HASH_CACHE_BYTES = 16 << 20  # smaller files cost little to hash again


def sha256_of(path: Path) -> str:
    """The SHA-256 of a file, read in 4 MiB blocks (about 1.5 GB/s)."""
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


def digest_change(
    folder: Path, recorded: dict[str, Any], names: tuple[str, ...] | None = None
) -> tuple[str, str] | None:
    """The first file of `folder` (of `names`, default all) whose SHA-256 is not the one `recorded`, and why."""
    for name in names if names is not None else sorted(recorded):
        if name not in recorded:
            continue
        if problem := file_problem(Path(folder) / name):
            return name, problem
        if sha256_of(Path(folder) / name) != recorded[name]:
            return name, "changed since bertcli wrote it (its SHA-256 is not the one recorded)"
    return None


@dataclass(frozen=True)
class Input:
    """A path a command reads, which its outputs must never replace."""

    label: str  # "the corpus", "the config", "the source checkpoint"
    path: Path
    inside_ok: bool = False  # writing below it is fine (a run folder holds its prepared data)


def _proves(folder: Path, kind: Layout, *, marked: bool = False) -> bool:
    """Whether `folder` holds bertcli's proof file of `kind` (one a failing disk cut counts where Layout says so)."""
    if (kind.damaged_proof_counts or marked) and (folder / kind.proof).is_file():
        return True
    try:
        raw = json.loads((folder / kind.proof).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(raw, dict) and PROOF_KEY in raw


def first_foreign(folder: Path, kind: Layout, prefix: str = "") -> str | None:
    """The first entry under `folder` (relative path) that a folder of `kind` does not hold; links not followed."""
    with os.scandir(folder) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            rel = prefix + entry.name
            if not kind.holds(rel):
                return rel
            if entry.is_dir(follow_symlinks=False) and (found := first_foreign(Path(entry.path), kind, rel + "/")):
                return found
    return None


def is_empty_folder(path: Path) -> bool:
    return Path(path).is_dir() and not any(Path(path).iterdir())


def not_owned(target: Path, kind: Layout) -> str | None:
    """Why bertcli may not replace `target` with a folder of `kind` (None: nothing there, empty, or its own)."""
    target = Path(target)
    if not target.exists():
        return "is a symbolic link to a missing path" if target.is_symlink() else None
    if not target.is_dir():
        return "is a file, not a folder"
    if is_empty_folder(target):
        return None
    if (foreign := first_foreign(target, kind)) is not None:
        return f"holds {foreign}, which is not a file bertcli writes in {kind.noun}"
    mark = target / kind.own_mark if kind.own_mark else None
    if not _proves(target, kind, marked=mark is not None and mark.is_dir() and any(mark.iterdir())):
        return f"is not {kind.noun} written by bertcli (no {kind.proof} of bertcli's)"
    return None


def check_replaceable(target: Path, kind: Layout, fix: str) -> None:
    if (reason := not_owned(target, kind)) is not None:
        raise UsageError(f"{target} {reason}, so bertcli left it untouched (it replaces only what it wrote): {fix}")


def relation(target: Path, other: Path) -> str | None:
    """How `target` stands to `other`, resolved: 'is', 'contains', 'is inside', or None (apart)."""
    t, o = Path(target).expanduser().resolve(), Path(other).expanduser().resolve()
    return "is" if t == o else "contains" if t in o.parents else "is inside" if o in t.parents else None


def check_apart(target: Path, inputs: list[Input], fix: str) -> None:
    """Refuse (exit 2) an output `target` that is, contains or lies inside one of the inputs."""
    for item in inputs:
        how = relation(target, item.path)
        if how is not None and not (how == "is inside" and item.inside_ok):
            harm = "change" if how == "is inside" else "destroy"
            raise UsageError(f"{target} {how} {item.label} {item.path}; writing there would {harm} it: {fix}")


def owner(folder: Path) -> tuple[Path, str] | None:
    """The nearest folder at or above `folder` that bertcli writes whole or prunes, and what it is."""
    for at in (folder, *folder.parents):
        for kind in (layout.CHECKPOINT, layout.PREPARED, layout.EXPORT):
            if _proves(at, kind):
                return at, kind.noun
        if at.name == layout.CHECKPOINTS and at.is_dir() and any(_proves(c, layout.CHECKPOINT) for c in at.iterdir()):
            return at, "a run's checkpoints folder"
    return None


def run_file(path: Path) -> tuple[Path, str] | None:
    """(the run folder, what `path` is of it) where `path` is a started run's own file or inside its folders."""

    def is_run(folder: Path) -> bool:
        found = layout.identify(folder)
        return found.kind is layout.Kind.RUN and found.started

    if path.name in layout.RUN_FILES and is_run(path.parent):
        return path.parent, f"the {path.name}"
    locked = path.parent / path.name[1 : -len(layout.LOCK)]
    if path.name.startswith(".") and path.name.endswith(layout.LOCK) and locked.is_dir() and is_run(path.parent):
        return path.parent, f"the lock of its prepared data {locked.name}/"
    for at in path.parents:
        if at.name in layout.RUN_FOLDERS and is_run(at.parent):
            return at.parent, f"inside the {at.name}/ folder"
    return None


def check_not_inside_own(target: Path, fix: str) -> None:
    """Refuse (exit 2) an output inside a folder bertcli replaces whole or prunes, or a run folder's own file."""
    resolved = Path(target).expanduser().resolve()
    if (run := run_file(resolved)) is not None:
        raise UsageError(f"{target} is {run[1]} of the run folder {run[0]}, which bertcli reads and writes: {fix}")
    if (owned := owner(resolved.parent)) is not None:
        raise UsageError(f"{target} is inside {owned[0]}, {owned[1]} of bertcli's (replaced whole): {fix}")


@contextlib.contextmanager
def lock(path: Path, what: str, fix: str, *, peek: bool = False) -> Iterator[None]:
    """Hold lock file `path` (flock: freed when its holder dies), refusing one held (exit 1); `peek`: only check."""
    import filelock

    if path.is_symlink():  # opened through it, the link's target would be the lock
        raise linked(path, "remove the link, then run the same command again")
    if peek and not path.exists():
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with filelock.FileLock(path, timeout=0):
            yield
    except filelock.Timeout:
        raise RunError(f"{what} is in use by another bertcli command; {fix}") from None


def run_lock(output_dir: Path, *, peek: bool = False) -> contextlib.AbstractContextManager[None]:
    """The lock of a run folder, held by pretrain and prepare (which would replace the data a run reads)."""
    fix = "wait for it to finish, or set output_dir to another folder"
    return lock(Path(output_dir) / layout.LOCK, str(output_dir), fix, peek=peek)


def prepared_lock(folder: Path) -> contextlib.AbstractContextManager[None]:
    """The lock of a prepared folder, by its resolved path: two configs naming it differently share it."""
    folder = Path(folder).expanduser().resolve()
    fix = "run this again once it has finished, or set data.prepared_dir to another folder"
    return lock(layout.prepared_lock(folder), f"the prepared data {folder}", fix)


def check_free(output_dir: Path) -> None:
    """Refuse at once (exit 1) a run folder another command holds, creating nothing."""
    with run_lock(output_dir, peek=True):
        pass
