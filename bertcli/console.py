"""Every message for the user goes through here: one line at a time to stderr (stdout is for data).

Under torchrun every process runs the same code; only rank 0 speaks (`runtime.setup` says which
process this is), so a message appears once. Errors are shown from whichever process hits them.
`pretrain --quiet` keeps errors, warnings and the final summary: what only tells how the work goes
(`info`: resuming, data up to date, prepared) is left out.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

_speaks = True  # False in the processes of a job other than rank 0
_quiet = False  # pretrain --quiet: `info` lines are left out


def speak(enabled: bool) -> None:
    """Whether `log` prints in this process (runtime.setup: rank 0 only)."""
    global _speaks
    _speaks = enabled


def log(message: str) -> None:
    """A line for the user on stderr, from rank 0 only."""
    if _speaks:
        print(message, file=sys.stderr, flush=True)


def error(message: str) -> None:
    """A line on stderr from any process: an error, or the end of a command."""
    print(message, file=sys.stderr, flush=True)


def info(message: str) -> None:
    """A line that tells how the work goes (rank 0 only), left out under --quiet; a warning, or
    anything the user must know, goes through `log`."""
    if not _quiet:
        log(message)


@contextlib.contextmanager
def quiet(enabled: bool) -> Iterator[None]:
    """While inside: `info` lines are left out if `enabled` (pretrain --quiet)."""
    global _quiet
    before, _quiet = _quiet, enabled
    try:
        yield
    finally:
        _quiet = before
