"""The failures a user sees, a line each: a `UsageError` (exit 2) the user fixes (a flag, a config value, an
input file), a `RunError` (exit 1) went wrong during the work, `Interrupted` (128 + N) was stopped by signal N."""

from __future__ import annotations


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
    """A file bertcli wrote that no longer parses (cut short, say): `file` and `reason` say which and how."""

    def __init__(self, file: object, exc: BaseException, fix: str = "use another checkpoint") -> None:
        self.file, self.reason = file, str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        super().__init__(f"{file}: damaged ({self.reason}); {fix}")


class RunError(BertcliError):
    """Something failed while working (exit 1)."""


class PipeClosed(Exception):
    """The reader of stdout went away (`| head`): exit 0, quietly. Not an OSError, which Typer makes exit 1."""


class Interrupted(BertcliError):
    """Stopped by a signal after saving a checkpoint: exit 128 + the signal number (130, 143)."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum
