"""Stopping a run on a signal without losing work: SIGTERM (what a cluster scheduler sends before
it preempts a job), SIGHUP (a closed terminal) and Ctrl-C (SIGINT).

While ``graceful_stop(left_behind, grace_period)`` is active (``train`` wraps a run in it), the first
signal only sets a flag (``requested``) and prints one line naming what the run finishes first
(``finishing``: the current step and its checkpoint, or final/). ``Trainer.fit`` checks the flag
after each step: it writes a checkpoint of that step (where one was not just written) and raises
``RunInterrupted``, so the run directory is closed, its lock released, and ``--resume`` continues
from that step exactly; ``train`` checks it after writing final/. A warm start checks it after each
supervised step and stops before anything is saved. If what is being finished takes longer than
``grace_period`` seconds (0: at once), or a second signal comes, the process exits at once
(``os._exit``, no traceback) saying what it leaves (``left_behind()``: the last complete
checkpoint, or none), as after SIGKILL. ``stop_at_once`` makes the signals end the process at once outside a run (the
command line, while it loads and after the run). A signal the process ignores (SIGHUP under
``nohup``) stays ignored. The exit status is 128 + the signal's number (129
for SIGHUP, 130 for SIGINT, 143 for SIGTERM), the shell's convention for a process ended by a signal.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
DEFAULT_GRACE_PERIOD = 50.0     # seconds: inside a scheduler's usual minute between SIGTERM and SIGKILL

_requested: int | None = None
# what a stop waits for: (what the run is doing, its name when the grace period runs out); see ``finishing``
_finishing = ("finishing the current step and writing a checkpoint", "the step and its checkpoint")


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
    print(f"pgjax.run: {why}", file=sys.stderr, flush=True)
    os._exit(128 + signum)


def _heeded() -> list[signal.Signals]:
    """The ``STOP_SIGNALS`` the process does not ignore (``nohup`` ignores SIGHUP: it stays ignored)."""
    return [s for s in STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]


def stop_at_once() -> None:
    """From now on each of ``STOP_SIGNALS`` not ignored ends the process at once, in one line (no step
    runs: nothing is being written). For the command line outside ``graceful_stop``: a
    KeyboardInterrupt would print a traceback while modules load, or be lost where it lands in a
    garbage-collection callback (JAX installs one)."""
    for s in _heeded():
        signal.signal(s, lambda signum, frame: _exit_now(
            signum, f"interrupted by {signal.Signals(signum).name} (no step was running: nothing was being written)"))


@contextlib.contextmanager
def finishing(doing: str, done: str):
    """Within the block a stop signal waits for what ``doing`` names (its first line says it; ``done``
    names it when the grace period runs out) instead of the current step."""
    global _finishing
    previous, _finishing = _finishing, (doing, done)
    try:
        yield
    finally:
        _finishing = previous


@contextlib.contextmanager
def graceful_stop(left_behind, grace_period: float = DEFAULT_GRACE_PERIOD):
    """Within the block, ``STOP_SIGNALS`` (those not ignored) ask the run to stop after its current
    step (see the module docstring); a stop at once says ``left_behind()``, a callable giving what is
    left to resume (``RunDirectory.left_behind``). With ``grace_period`` <= 0 the first signal stops
    at once; outside the main thread nothing is installed."""
    global _requested
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    watchdog: list[threading.Timer] = []

    def stop_now(signum: int, why: str) -> None:
        _exit_now(signum, f"{why}; {left_behind()}")

    def handle(signum, frame):
        global _requested
        name = signal.Signals(signum).name
        if _requested is not None:
            stop_now(signum, f"a second signal ({name}): stopped at once")
        if grace_period <= 0:
            stop_now(signum, f"{name}: stopped at once (a grace period of 0 s)")
        _requested = signum
        timer = threading.Timer(grace_period, lambda: stop_now(signum, f"{_finishing[1]} did not finish within the "
                                                                      f"grace period of {grace_period:g} s"))
        timer.daemon = True
        timer.start()
        watchdog.append(timer)
        print(f"pgjax.run: {name}: {_finishing[0]} (at most {grace_period:g} s; a second signal stops at once)",
              file=sys.stderr, flush=True)

    previous = {s: signal.signal(s, handle) for s in _heeded()}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for timer in watchdog:
            timer.cancel()
        _requested = None
