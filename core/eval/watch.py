"""The data core hands to an adaptor: which set it is, and how far a pass has got.

Adaptors read calibration and evaluation data inside their hooks, so only core knows which
of the user's data sets a hook is reading. :func:`reading` wraps each such call:

* a :class:`lpq.DataError` raised inside names the data set and what it holds (a file's
  own shape, not the batch's), so "does not fit the model" says which data to fix;
* while a listener is installed (the CLI installs one, see :func:`listening`), every
  batch the adaptor reads is reported, so a long fp32 pass or calibration shows progress.
  Without a listener the adaptor gets the user's own loader, untouched.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ..errors import DataError
from .data import ArrayLoader, batch_size, split_batch

#: ``listener(stage, samples_read, samples_expected_or_None)``.
Listener = Callable[[str, int, int | None], None]

_listener: Listener | None = None
_lock = threading.Lock()


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Report data passes to ``listener`` while the block runs (this process only)."""
    global _listener
    with _lock:
        previous, _listener = _listener, listener
    try:
        yield
    finally:
        with _lock:
            _listener = previous


def describe(loader: Any) -> str:
    """What a data set holds, for messages: ``calib.npz: input (64, 1, 8, 8) float32``."""
    if not isinstance(loader, ArrayLoader):
        return ""
    inputs = loader.inputs
    if isinstance(inputs, Mapping):
        parts = [f"{name} {tuple(a.shape)} {a.dtype}" for name, a in inputs.items()]
    else:
        parts = [f"{tuple(inputs.shape)} {inputs.dtype}"]
    if loader.labels is not None:
        parts.append(f"labels {tuple(loader.labels.shape)}")
    source = f"{loader.source}: " if loader.source else ""
    return source + ", ".join(parts)


class Watched:
    """A dataloader that reports each batch read to the listener; otherwise transparent."""

    def __init__(self, loader: Iterable[Any], stage: str, listener: Listener, limit: int | None):
        self.loader, self.stage, self.listener, self.limit = loader, stage, listener, limit

    def _expected(self) -> int | None:
        total = getattr(self.loader, "num_samples", None)
        if total is None:
            return self.limit
        return min(total, self.limit) if self.limit else int(total)

    def __iter__(self) -> Iterator[Any]:
        expected, done = self._expected(), 0
        self.listener(self.stage, 0, expected)
        for item in self.loader:  # counted when handed over: a reader may stop after it
            done += batch_size(split_batch(item)[0])
            self.listener(self.stage, done, expected)
            yield item

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (copy / unpickle): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)


@contextmanager
def reading(
    stage: str, loader: Any, limit: int | None = None, *, task: str | None = None
) -> Iterator[Any]:
    """Hand ``loader`` (the ``stage`` data: "calibration", "evaluation") to an adaptor.

    ``limit``: samples the adaptor should read at most; ``task``: what the pass is for, when
    that is not the data set's own purpose (e.g. "latency" on the calibration data).
    """
    listener = _listener
    try:
        if loader is None or listener is None:
            yield loader
        else:
            yield Watched(loader, task or stage, listener, limit)
    except DataError as exc:
        if exc.message.startswith(f"the {stage} data"):
            raise
        held = describe(loader)
        raise DataError(
            f"the {stage} data{f' ({held})' if held else ''}: {exc.message}", hint=exc.hint
        ) from exc
