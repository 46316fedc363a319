"""One command at a time on a run: `pretrain` and `prepare` hold an exclusive lock on output_dir/.lock.

A `prepare` while the run's `pretrain` trains would replace the prepared data under it (the run
goes on with the old token ids, its next checkpoints would pair them with the new tokenizer).
Runs with other output_dirs may share one data.prepared_dir: `PreparedLock` keeps a `prepare` from
replacing it while another command prepares it or reads it at its start.
flock is released by the kernel when its holder dies, so a crashed command never leaves the folder
locked. Torch-free: `prepare` does not load torch.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from bertcli import atomic, layout
from bertcli.errors import RunError
from bertcli.ownership import linked


class RunLock:
    """An exclusive lock on output_dir/.lock while `command` (pretrain, prepare) works on the run;
    the lock file says which process holds it and for which command."""

    def __init__(self, output_dir: Path, command: str = "pretrain") -> None:
        self.path = Path(output_dir) / layout.LOCK
        self.folder = Path(output_dir)  # what is locked, for the message
        self.command = command
        self.fh = None

    def refusal(self, command: str, holder: str) -> str:
        """The line for a command refused because `command` (`holder`: "pid N") holds the lock."""
        fix = (
            "wait for it to finish, or set output_dir to another folder"
            if self.command == "pretrain"
            else "wait for it to finish, then run it again"
        )
        return f"{self.folder} is in use by another bertcli {command} ({holder}); {fix}"

    def __enter__(self) -> RunLock:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:  # never through a symbolic link: writing the holder's pid would truncate its target
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP or self.path.is_symlink():
                raise linked(
                    self.path, "a folder of its own", "remove the link, then run the same command again"
                ) from None
            raise
        self.fh = os.fdopen(fd, "r+")
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.fh.close()
            raise self._busy() from None
        with atomic.writing(self.path):  # a full disk: one line naming the file
            self.fh.seek(0)
            self.fh.truncate()
            self.fh.write(f"pid {os.getpid()} {self.command}\n")
            self.fh.flush()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fh is not None:
            self.fh.close()  # closing releases the lock

    def check_free(self) -> None:
        """Refuse at once when another command holds the lock; take nothing. `pretrain` asks before it
        imports torch (3-4 s, 250 MB), then takes the lock for real (a command that starts in between
        is refused there)."""
        import fcntl

        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return  # no lock file yet (or a link, which __enter__ refuses)
        with os.fdopen(fd) as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when fh closes
            except BlockingIOError:
                raise self._busy() from None

    def _busy(self) -> RunError:
        """The refusal of a lock another process holds, naming it from the lock file."""
        try:
            words = self.path.read_text().split()  # "pid N COMMAND" ("pid N" from older versions: a pretrain)
        except OSError:
            words = []
        holder = " ".join(words[:2]) or "another process"
        command = words[2] if len(words) > 2 else "pretrain"
        return RunError(self.refusal(command, holder))


class PreparedLock(RunLock):
    """An exclusive lock on a prepared-data folder while `prepare` checks or writes it, and while a
    `pretrain` prepares or reads it at its start (its training then reads its own memory maps and
    tokenizer bytes, which a later replacement leaves alone). The folder is replaced whole, by a
    rename, so a lock file inside it would go with it: the lock is a file beside it, PARENT/.NAME.lock,
    named from the resolved path, so that two configs naming one folder differently share it."""

    def __init__(self, prepared_dir: Path, command: str = "prepare") -> None:
        super().__init__(prepared_dir, command)
        folder = Path(prepared_dir).expanduser().resolve()
        self.path = layout.prepared_lock(folder)
        self.folder = folder

    def __enter__(self) -> PreparedLock:
        while True:  # until the file locked is the one the path names (see __exit__)
            super().__enter__()
            if self._still_named():
                return self
            self.fh.close()  # its holder removed it as it let go: lock the path's file now

    def __exit__(self, *exc: object) -> None:
        """The lock file lies in a folder of the user's (PARENT): removed while still held, so that
        none is left there (trial 16 P10). A command that opened it meanwhile finds, once it holds
        it, that the path no longer names it (_still_named), and locks the path's file afresh."""
        if self.fh is not None and self._still_named():
            try:
                os.unlink(self.path)
            except OSError:
                pass  # (a read-only parent: the file stays, as before)
        super().__exit__(*exc)

    def _still_named(self) -> bool:
        try:
            return os.path.samestat(os.fstat(self.fh.fileno()), os.stat(self.path, follow_symlinks=False))
        except OSError:
            return False

    def refusal(self, command: str, holder: str) -> str:
        when = "it has finished" if command == "prepare" else "it has started training"
        return (
            f"the prepared data {self.folder} is being prepared or read by another bertcli {command} ({holder}); "
            f"run this again once {when}, or set data.prepared_dir to another folder"
        )
