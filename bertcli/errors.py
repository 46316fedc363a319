"""The two kinds of failure a user can see, and the exit codes they map to.

Everything the user can fix (a flag, a config value, an input file) is a `UsageError`
(exit 2); everything that goes wrong while doing the work is a `RunError` (exit 1).
The CLI prints `str(error)` as one line on stderr, with no traceback unless debugging was asked for.
"""

from __future__ import annotations

import signal


class BertcliError(Exception):
    """Base class: a message meant for the user, one line per problem."""

    exit_code = 1

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


class UsageError(BertcliError):
    """A bad flag, config or input: the user must change something (exit 2)."""

    exit_code = 2


class DamagedFile(UsageError):
    """A file of a folder bertcli wrote that no longer parses (cut short, say): `file` and `reason`
    say which and how."""

    def __init__(self, file: object, exc: BaseException, fix: str = "use another checkpoint") -> None:
        self.file, self.reason = file, str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        super().__init__(f"{file}: damaged ({self.reason}); {fix}")


class RunError(BertcliError):
    """Something failed while working (exit 1)."""

    exit_code = 1


class PipeClosed(Exception):
    """The reader of stdout went away (`| head`): the command ends quietly with exit 0.
    Not an OSError, so that Typer (which turns EPIPE into exit 1) lets it through to main()."""


# The signals that stop a command cleanly (Interrupted, exit 128 + N): Ctrl-C, a scheduler's SIGTERM,
# and the SIGHUP of a closed terminal or ssh session (not where the process was started to ignore it: nohup).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class Interrupted(BertcliError):
    """Stopped by a signal after saving a checkpoint: exit 128 + the signal number (130, 143)."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum
