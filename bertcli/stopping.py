"""One `Stopper` per command: SIGINT, SIGTERM, SIGHUP (unless ignored: nohup) raise `Stop`, a BaseException, in the
main thread: it unwinds every write and leaves `stopping()` as `Interrupted` (128 + N). `after_step` stops after the
step (a second signal: at once); `held` waits for an output in place; `poll` reads the wakeup pipe."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

from bertcli import console
from bertcli.errors import Interrupted

# The signals that stop a command cleanly: Ctrl-C, a scheduler's SIGTERM, a closed terminal's SIGHUP.
SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class Stop(BaseException):
    """Stop(signum): a stop signal came; raised in the main thread (see the module's docstring)."""


class Stopper:
    """What a stop keeps (`left`, in words), the signal that came (`signum`) and how a signal acts (`mode`)."""

    def __init__(self, left: str) -> None:
        self.left, self.signum, self.mode, self.held = left, None, "now", []
        self.wakeup: int | None = None  # the read end of the wakeup pipe

    def _handle(self, signum: int, frame: Any) -> None:
        if self.mode == "held":
            self.held.append(signum)
        elif self.mode == "after_step" and self.signum is None:
            self.signum = signum
            console.log(f"{signal.Signals(signum).name}: stopping after this step (a second signal: at once)")
        else:
            self.signum = signum
            raise Stop(signum)

    def poll(self) -> bool:
        """Whether a stop signal came, looking in the wakeup pipe too (from any thread)."""
        if self.signum is None and self.wakeup is not None:
            with contextlib.suppress(OSError):  # nothing there
                self.signum = next((b for b in os.read(self.wakeup, 64) if b in SIGNALS and b not in self.held), None)
        return self.signum is not None

    def check(self) -> None:
        """Raise Stop where a stop signal came (the main thread's checkpoints in long work)."""
        if self.poll() and self.mode == "now":
            raise Stop(self.signum)

    @contextlib.contextmanager
    def until(self, mode: str) -> Iterator[None]:
        """`mode` ("held" or "after_step") inside the block; a held signal goes on once the command is done."""
        before, self.mode = self.mode, mode
        try:
            yield
        finally:
            self.mode = before


_active: Stopper | None = None


@contextlib.contextmanager
def stopping(left: str) -> Iterator[Stopper]:
    """While inside, a stop signal stops the command as Interrupted saying `left` (nested: the outer stopper)."""
    global _active
    if _active is not None:
        before, _active.left = _active.left, left
        try:
            with _interrupted(_active):
                yield _active
        finally:
            _active.left = before
        return
    stopper = Stopper(left)
    if threading.current_thread() is not threading.main_thread():  # handlers are the main thread's
        yield stopper
        return
    previous = {s: h for s in SIGNALS if (h := signal.getsignal(s)) not in (signal.SIG_IGN, None)}
    read_end, write_end = os.pipe()
    for end in (read_end, write_end):
        os.set_blocking(end, False)
    previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    for signum in previous:
        signal.signal(signum, stopper._handle)
    stopper.wakeup, _active = read_end, stopper
    try:
        with _interrupted(stopper):
            yield stopper
    finally:
        _active = None
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(previous_fd)
        os.close(read_end)
        os.close(write_end)
        for signum in stopper.held:
            signal.raise_signal(signum)


@contextlib.contextmanager
def _interrupted(stopper: Stopper) -> Iterator[None]:
    try:
        yield
        stopper.check()  # a stop that something caught on the way
    except Stop as stop:
        (signum,) = stop.args
        name = signal.Signals(signum).name
        raise Interrupted(f"stopped by {name}; {stopper.left}: run the same command again", signum) from None


@contextlib.contextmanager
def exit_on_signal(words: str) -> Iterator[None]:
    """While the main thread waits in a library (torch's rendezvous), a stop signal exits at once (nothing written)."""
    stopper = _active
    if stopper is None or stopper.wakeup is None:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.1):
            if stopper.poll():
                console.error(f"bertcli: stopped by {signal.Signals(stopper.signum).name} {words}")
                os._exit(128 + stopper.signum)

    thread = threading.Thread(target=watch, daemon=True, name="bertcli-stop-watch")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=1)


def worker_ignores(signums: tuple[int, ...] = SIGNALS) -> None:
    """In a worker: stop signals sent to the process group are the parent's to act on (it stops its workers)."""
    for signum in signums:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


@contextlib.contextmanager
def held_while_starting() -> Iterator[None]:
    """Processes started in the block inherit the stop signals blocked: none dies of Ctrl-C half started."""
    from multiprocessing import resource_tracker

    mask = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        resource_tracker.ensure_running()  # first: starting it unblocks the signals in this thread
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
