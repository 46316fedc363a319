"""Atomic writes: everything is written under a temporary name, flushed, then renamed.

A crash at any moment leaves either the old or the new file/folder, never a half-written
one under the final name. Temporary names start with '.tmp-' so readers can skip them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

TMP_PREFIX = ".tmp-"


def fsync_path(path: Path) -> None:
    """Flush a file's (or a folder's entries') data to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


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
        if final.exists():
            # Move the old one aside first: a crash between the two renames leaves the old
            # copy under a temporary name (ignored by readers), never a broken `final`.
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


def remove_folder(path: Path) -> None:
    """Delete a folder so that it never looks complete while half-deleted: rename, then delete."""
    doomed = path.with_name(f"{TMP_PREFIX}del-{path.name}.{os.getpid()}")
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def clean_leftovers(parent: Path) -> None:
    """Remove temporary files and folders that a crashed writer left in `parent`; a folder moved
    aside by `folder()` whose replacement never arrived (a crash between its two renames) is
    put back instead."""
    if not parent.is_dir():
        return
    for child in parent.iterdir():
        if child.name.startswith(f"{TMP_PREFIX}old-"):
            original = parent / child.name[len(f"{TMP_PREFIX}old-"):].rsplit(".", 1)[0]
            if not original.exists():
                os.replace(child, original)
                continue
        if child.name.startswith(TMP_PREFIX):
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
