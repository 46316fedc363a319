"""Every message for the user goes through here, a line at a time to stderr (stdout is for data). Under torchrun
only rank 0 speaks (`log`); errors come from any process; a quiet pretrain leaves out `info` lines."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

_state = {"speaks": True, "quiet": False}  # speaks: False in a job's processes but rank 0; quiet: no `info` lines


MAX_LINE = 2_000  # characters of a message; a value echoed whole (a 10 MB path) would bury the rest


def _shortened(message: str) -> str:
    """`message` with its middle left out past MAX_LINE (the start says what and where, the end the fix)."""
    if len(message) <= MAX_LINE:
        return message
    if "\n" in message:  # (help text): line by line
        return "\n".join(_shortened(line) for line in message.split("\n"))
    head, tail = MAX_LINE * 2 // 3, MAX_LINE // 4
    return f"{message[:head]} [... {len(message) - head - tail:,} characters left out ...] {message[-tail:]}"


def speak(enabled: bool) -> None:
    """Whether `log` prints in this process (runtime.setup: rank 0 only)."""
    _state["speaks"] = enabled


def log(message: str) -> None:
    """A line for the user on stderr, from rank 0 only."""
    if _state["speaks"]:
        print(_shortened(message), file=sys.stderr, flush=True)


def error(message: str) -> None:
    """A line on stderr from any process: an error, or the end of a command."""
    print(_shortened(message), file=sys.stderr, flush=True)


def info(message: str) -> None:
    """A line that tells how the work goes (rank 0 only), left out when quiet; warnings go through `log`."""
    if not _state["quiet"]:
        log(message)


@contextlib.contextmanager
def _while(key: str, value: bool) -> Iterator[None]:
    before, _state[key] = _state[key], value
    try:
        yield
    finally:
        _state[key] = before


def quiet(enabled: bool) -> contextlib.AbstractContextManager[None]:
    """While inside: `info` lines are left out if `enabled` (a quiet pretrain)."""
    return _while("quiet", value=enabled)


def silent() -> contextlib.AbstractContextManager[None]:
    """While inside: `log` and `info` print nothing (a check run ahead of the work); errors are raised."""
    return _while("speaks", value=False)
