"""Stopping a run on a signal without losing work: SIGTERM (what a cluster scheduler sends before
it preempts a job) and Ctrl-C (SIGINT).

While ``graceful_stop(grace_period)`` is active (``train`` wraps a whole run in it), the first
SIGTERM or SIGINT only sets a flag (``requested``) and prints one line. ``Trainer.fit`` checks the
flag after each step: it writes a checkpoint of that step (where one was not just written) and
raises ``RunInterrupted``, so the run directory is closed, its lock released, and ``--resume``
continues from that step exactly. A warm start checks it after each supervised step and stops
before anything is saved. If the step and its checkpoint take longer than ``grace_period`` seconds,
or a second signal comes, the process exits at once (``os._exit``, no traceback) with the last
complete checkpoint intact, as after SIGKILL. The exit status is 128 + the signal's number (130
for SIGINT, 143 for SIGTERM), the shell's convention for a process ended by a signal.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
DEFAULT_GRACE_PERIOD = 50.0     # seconds: inside a scheduler's usual minute between SIGTERM and SIGKILL

_requested: int | None = None


class RunInterrupted(Exception):
    """The run stopped on the signal ``signum``; the message says where and what was saved."""

    def __init__(self, signum: int, what: str):
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name} {what}")

    @property
    def exit_status(self) -> int:
        """128 + the signal's number."""
        return 128 + self.signum


def requested() -> int | None:
    """The signal that asked the run to stop (None: none did)."""
    return _requested


def _exit_now(signum: int, why: str) -> None:
    """Print ``why`` and end the process at once with 128 + ``signum`` (no cleanup, no traceback)."""
    print(f"pgjax.run: {why}; the last complete checkpoint is intact (--resume continues from it)",
          file=sys.stderr, flush=True)
    os._exit(128 + signum)


@contextlib.contextmanager
def graceful_stop(grace_period: float = DEFAULT_GRACE_PERIOD):
    """Within the block, SIGTERM and SIGINT ask the run to stop after its current step (see the module
    docstring); outside the main thread, or with ``grace_period`` <= 0, nothing is installed."""
    global _requested
    if threading.current_thread() is not threading.main_thread() or grace_period <= 0:
        yield
        return
    watchdog: list[threading.Timer] = []

    def handle(signum, frame):
        global _requested
        name = signal.Signals(signum).name
        if _requested is not None:
            _exit_now(signum, f"a second signal ({name}): stopped at once")
        _requested = signum
        timer = threading.Timer(grace_period, _exit_now, (signum, f"the step and its checkpoint did not finish "
                                                                  f"within the grace period of {grace_period:g} s"))
        timer.daemon = True
        timer.start()
        watchdog.append(timer)
        print(f"pgjax.run: {name}: finishing the current step and writing a checkpoint (at most "
              f"{grace_period:g} s; a second Ctrl-C stops at once)", file=sys.stderr, flush=True)

    previous = {s: signal.signal(s, handle) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for timer in watchdog:
            timer.cancel()
        _requested = None
