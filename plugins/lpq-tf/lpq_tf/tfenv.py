"""Importing TensorFlow quietly, and keeping the converter's log out of the user's way.

TensorFlow and its MLIR converter print pages of C++ log lines (oneDNN notices, MLIR
pass dumps, "fully_quantize: 0, ...") on stderr. lpq sets ``TF_CPP_MIN_LOG_LEVEL=2``
(errors still print) unless the user set it, and runs each conversion with stderr
captured: the captured text is dropped when the conversion works and quoted in the
:class:`lpq.ModelError` when it fails, so nothing that explains an error is hidden.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def import_tf() -> Any:
    """``tensorflow``, imported with its C++ INFO/WARNING logs off.

    The first import runs with stderr captured: TensorFlow prints its oneDNN notice before
    its log level applies. An import that fails shows what TensorFlow printed.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "tensorflow" not in sys.modules:
        from lpq import ModelError

        quietly(
            lambda: importlib.import_module("tensorflow"),
            lambda exc, log: ModelError(
                f"TensorFlow cannot be imported: {type(exc).__name__}: {exc}",
                hint="pip install tensorflow-cpu (2.16 or later)\n" + log,
            ),
        )
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    with contextlib.suppress(Exception):
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    return tf


class CapturedLog:
    """What a block wrote to file descriptor 2 while :func:`captured_stderr` ran."""

    def __init__(self) -> None:
        self.text = ""

    def tail(self, lines: int = 12) -> str:
        kept = [line for line in self.text.splitlines() if line.strip()]
        return "\n".join(kept[-lines:])


@contextlib.contextmanager
def captured_stderr() -> Iterator[CapturedLog]:
    """Capture fd 2 (C++ logs included) for the block; set ``LPQ_TF_VERBOSE=1`` to see it."""
    log = CapturedLog()
    if os.environ.get("LPQ_TF_VERBOSE"):
        yield log
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield log
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            log.text = sink.read().decode(errors="replace")


def quietly(func: Callable[[], T], make_error: Callable[[Exception, str], Exception]) -> T:
    """``func()`` with stderr captured; if it raises, ``make_error(exc, log tail)`` instead.

    The lpq error is raised after stderr is restored, so the CLI prints it as usual.
    """
    failure: Exception | None = None
    with captured_stderr() as log:
        try:
            return func()
        except Exception as exc:
            failure = exc
    assert failure is not None
    raise make_error(failure, log.tail()) from None
