"""Atomic writes: everything is written under a temporary name, flushed, then renamed.

A crash at any moment leaves either the old or the new file/folder, never a half-written
one under the final name. Temporary names start with '.tmp-' so readers can skip them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TMP_PREFIX = ".tmp-"

# No room for the file: the disk, the user's quota, or the largest file this process may write
# (ulimit -f: EFBIG, Python ignores SIGXFSZ) or the file system holds.
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# How the libraries that raise no OSError say it: safetensors and tokenizers pass on Rust's io::Error text.
DISK_FULL_WORDS = (
    "No space left on device",
    "Disk quota exceeded",
    "File too large",
    "os error 28",
    "os error 122",
    "os error 27",
)


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc` says that the disk (or the user's quota) is full, in any library's words."""
    if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
        return True
    return any(words in str(exc) for words in DISK_FULL_WORDS)


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """A full disk while the block writes `path` is raised as OSError(ENOSPC) naming `path`, whichever
    library hit it (safetensors and tokenizers raise their own errors, a file's write() names no file,
    shutil.copyfile names its source); the CLI makes that one line saying what to do. A name inside a
    temporary folder of `folder()` is shown as the final one."""
    try:
        yield
    except Exception as exc:
        if not is_disk_full(exc) or (isinstance(exc, OSError) and exc.filename == str(path)):
            raise
        raise OSError(_full_errno(exc), os.strerror(_full_errno(exc)), str(path)) from exc


def _full_errno(exc: BaseException) -> int:
    """The errno of a full disk `exc` says, in any library's words (is_disk_full)."""
    if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
        return exc.errno
    text = str(exc)
    if "File too large" in text or "os error 27" in text:
        return errno.EFBIG
    if "Disk quota exceeded" in text or "os error 122" in text:
        return errno.EDQUOT
    return errno.ENOSPC


def save_torch(obj: Any, path: Path) -> None:
    """torch.save(obj) into `path`, through a file object of ours: torch words a failed write as
    "unexpected pos N vs M", without the reason, so the OSError behind it (a full disk) is kept and
    raised instead. The archive's contents are those torch.save(obj, path) writes."""
    import torch

    class File:
        def __init__(self, fh: Any) -> None:
            self.fh, self.error = fh, None

        def write(self, data: Any) -> int:
            try:
                return self.fh.write(data)
            except OSError as exc:
                self.error = exc
                raise

        def flush(self) -> None:
            self.fh.flush()

    with writing(path), open(path, "wb") as fh:
        out = File(fh)
        try:
            torch.save(obj, out)
        except RuntimeError:
            if out.error is not None:
                raise out.error from None
            raise


def fsync_path(path: Path) -> None:
    """Flush a file's (or a folder's entries') data to disk."""
    with writing(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_bytes(path: Path, data: bytes, *, exclusive: bool = False) -> None:
    """`data` into `path` through a temporary name; `exclusive`: never over a file that is there by then
    (another process's, written meanwhile: FileExistsError), by a hard link, which fails where a rename
    would replace."""
    path = Path(path)
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}")
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


@contextmanager
def folder(final: Path, guard: Callable[[Path], None]) -> Iterator[Path]:
    """Yield a temporary folder to fill; on success it replaces `final` in one rename.

    `guard(final)` raises when what is at `final` is not the caller's to replace (see
    ownership.py); it runs before anything is written and again just before the swap, so a folder
    the user filled meanwhile is not lost either. A symbolic link at `final` is followed: the
    folder it points to is replaced and the link kept. The caller must have flushed what it wrote
    (see fsync_path) before leaving the block.
    """
    final = Path(final).expanduser().resolve()
    guard(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f"{TMP_PREFIX}{final.name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        fsync_path(tmp)
        guard(final)
        if final.exists() and exchange(tmp, final):
            shutil.rmtree(tmp, ignore_errors=True)  # the old folder, swapped out
        elif final.exists():
            # Where the filesystem cannot swap: move the old one aside first. A crash between the two
            # renames leaves the old copy under a temporary name (ignored by readers), never a broken
            # `final`; but for a moment there is no `final` (a reader of `best` took another checkpoint).
            old = final.with_name(f"{TMP_PREFIX}old-{final.name}.{os.getpid()}")
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fsync_path(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


_RENAME_EXCHANGE = 2  # renameat2's flag (linux/fs.h): swap the two paths in one step
_AT_FDCWD = -100


def exchange(a: Path, b: Path) -> bool:
    """Swap folders `a` and `b` in one step (Linux renameat2 with RENAME_EXCHANGE): a reader of either
    path always finds a whole folder there, the old or the new. False where the system or the
    filesystem cannot (another OS, an old kernel or C library, some network filesystems)."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def remove_folder(path: Path) -> None:
    """Delete a folder so that it never looks complete while half-deleted: rename, then delete. A
    symbolic link is removed itself, its target left alone (renamed, it stayed behind as a .tmp-del- link)."""
    if path.is_symlink():
        path.unlink()
        return
    doomed = path.with_name(f"{TMP_PREFIX}del-{path.name}.{os.getpid()}")
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (one of this machine's; another user's counts too): the temporary
    names carry their writer's PID, so that a leftover is told from a write under way."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def clean_leftover_files(final: Path, prefix: str, ours: Callable[[Path], bool]) -> list[Path]:
    """Remove the temporary files a killed writer of file `final` left beside it (PREFIX+NAME.PID and
    PREFIX+NAME.PID.raw, PID gone from this machine: a writer on another machine sharing the folder is
    not seen), regular files only, never a link, and only where `ours` finds in them what the writer
    writes (trial 21 S3: a user's file of the name, whatever it held, was deleted unsaid). Returns
    those removed, for the caller to say."""
    pattern = re.compile(rf"{re.escape(prefix)}{re.escape(final.name)}\.(\d{{1,9}})(?:\.raw)?")
    removed: list[Path] = []
    if not final.parent.is_dir():
        return removed
    for child in final.parent.iterdir():
        match = pattern.fullmatch(child.name)
        if match and not pid_alive(int(match.group(1))) and not child.is_symlink() and child.is_file():
            with contextlib.suppress(OSError):  # another user's, in a shared sticky folder: theirs to remove
                if ours(child):
                    child.unlink()
                    removed.append(child)
    return removed
