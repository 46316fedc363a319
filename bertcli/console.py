"""Every message for the user goes through here: one line at a time to stderr (stdout is for data).

Under torchrun every process runs the same code; only rank 0 speaks (`runtime.setup` says which
process this is), so a message appears once. Errors are shown from whichever process hits them.
"""

from __future__ import annotations

import sys

_speaks = True  # False in the processes of a job other than rank 0


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
