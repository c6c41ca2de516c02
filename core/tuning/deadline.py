"""A hard limit on the trials running when ``--timeout`` runs out.

The driver already refuses to *start* a trial that the trials so far say cannot finish
inside the limit. A trial can still run long past it (the first one, whose time nobody
knew; one that hits a slow path), and a limit that a running trial may overrun by half an
hour is not a limit. So the driver runs each batch under :func:`deadline`: when the time is
up, :class:`DeadlineReached` is raised in the driver's thread, wherever it is (quantizing,
evaluating, or waiting on worker processes), the executor's workers are stopped
(:meth:`lpq.tuning.executors.Executor.abort`), and tuning ends like any other stop: the
finished trials are in the history, the best one is returned.

The stopped trial is *not* recorded: a re-run of the same command with a larger
``--timeout`` resumes and runs it. ``DeadlineReached`` derives from ``BaseException`` so
that an adaptor's ``except Exception`` cannot swallow it and record a bogus failure.

It uses ``SIGALRM``, so it works in the main thread of a POSIX process (the CLI, a script
calling ``lpq.fit``). Elsewhere (another thread, Windows) only the start-of-trial check
applies, and :func:`deadline` says so in the log. Python runs the handler between
bytecodes: a long call into a framework (one ORT session run) finishes first.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

logger = logging.getLogger("lpq")


class DeadlineReached(BaseException):
    """The tuning time limit ran out while trials were running."""


def can_interrupt() -> bool:
    """Whether :func:`deadline` can stop running work here (main thread, POSIX timers)."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Raise :class:`DeadlineReached` in this thread after ``seconds`` (None/0: no limit).

    Restores the previous ``SIGALRM`` handler and timer on the way out, so it nests inside
    code that uses neither and leaves no alarm behind.
    """
    if not seconds:
        yield
        return
    if not can_interrupt():
        logger.debug("the tuning timeout cannot stop a running trial outside the main thread")
        yield
        return

    def _alarm(_signum: int, _frame: FrameType | None) -> None:
        raise DeadlineReached(f"{seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
