"""The run cache: per-run state an adaptor computes once and every trial reuses.

Calibration statistics, a prepared graph, latency measurements: an adaptor computes them
on the first trial and every later trial of the run wants them again — also trials in
another worker process or on another machine. Keeping them in a process-global dict
keyed by ``id(dataloader)`` works in one process only. The run cache keys them by
*content* (``content_key`` of the model bytes, the data, the options) and keeps them in
memory and, during a tuning run, as files under ``<workspace>/<run key>/cache/``, where
workers of that run find them (all of them on one machine; on a cluster, with a shared
filesystem, or else each machine builds its own once).

Adaptors call :func:`run_cache` (a :class:`RunCache`; outside ``lpq.fit`` /
``lpq.quantize`` it is a memory-only cache for the process) and ``get_or_compute`` with a
save/load pair. One call of ``fit`` or ``quantize`` is one run: everything it asks the
adaptor — the capability query, the fp32 baseline, sensitivity inspections, every trial
— sees the same cache, so what the capability query prepared (an exported graph) is
there for the first trial, and it is released when the call returns.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import numpy as np

from .fileio import atomic_write

T = TypeVar("T")
P = ParamSpec("P")

#: Objects kept in memory per cache (least recently used dropped first).
MEMORY_ITEMS = 16


def content_key(*parts: Any) -> str:
    """A stable hash of strings, bytes, numbers, numpy arrays and nested lists/dicts."""
    digest = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, dict):
            for key in sorted(value, key=str):
                digest.update(b"k" + str(key).encode())
                feed(value[key])
        elif isinstance(value, list | tuple):
            digest.update(b"[%d" % len(value))
            for item in value:
                feed(item)
        elif isinstance(value, bytes):
            digest.update(b"b" + value)
        elif isinstance(value, np.ndarray):
            digest.update(f"a{value.shape}{value.dtype}".encode())
            digest.update(np.ascontiguousarray(value).tobytes())
        else:
            digest.update(b"s" + repr(value).encode())

    for part in parts:
        feed(part)
    return digest.hexdigest()[:32]


class RunCache:
    """Content-keyed values in memory, and on disk when the cache has a folder."""

    def __init__(self, folder: str | Path | None = None) -> None:
        self.folder = Path(folder) if folder is not None else None
        self._memory: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.disk_hits = self.misses = 0

    def _path(self, namespace: str, key: str) -> Path | None:
        return self.folder / namespace / key if self.folder is not None else None

    def get_or_compute(
        self,
        namespace: str,
        key: str,
        compute: Callable[[], T],
        *,
        save: Callable[[T, Any], None] | None = None,
        load: Callable[[Any], T] | None = None,
        memory: bool = True,
    ) -> T:
        """The value for ``key``: from memory, else from disk (``load(file)``), else
        ``compute()`` — then kept in memory and written to disk (``save(value, file)``,
        atomically) when a folder and a save function are given. ``namespace`` separates
        kinds of values (e.g. ``"onnxrt-calibration"``). ``memory=False`` keeps the value
        on disk only: for many values (a quantized weight per layer) that would push the
        few large ones (the prepared model) out of the memory's :data:`MEMORY_ITEMS`."""
        memory_key = f"{namespace}/{key}"
        with self._lock:
            if memory and memory_key in self._memory:
                self._memory.move_to_end(memory_key)
                self.hits += 1
                return self._memory[memory_key]
        path = self._path(namespace, key)
        value: Any = None
        found = False
        if path is not None and load is not None and path.exists():
            try:
                with open(path, "rb") as handle:
                    value, found = load(handle), True
                self.disk_hits += 1
            except Exception:  # a corrupt or foreign file: recompute and overwrite it
                found = False
        if not found:
            self.misses += 1
            value = compute()
            if path is not None and save is not None:
                with atomic_write(path, "wb") as handle:
                    save(value, handle)
        if memory:
            with self._lock:
                self._memory[memory_key] = value
                while len(self._memory) > MEMORY_ITEMS:
                    self._memory.popitem(last=False)
        return value

    def items(self) -> list[tuple[str, str, Any]]:
        """``(namespace, key, value)`` of what this cache holds in memory, oldest first:
        to ship a warm cache to workers that cannot fork from this process."""
        with self._lock:
            return [(*k.split("/", 1), v) for k, v in self._memory.items()]

    def clear_memory(self) -> None:
        with self._lock:
            self._memory.clear()

    def attach(self, folder: str | Path) -> None:
        """Give this cache its folder once the run has one (the run key needs the fp32
        baseline, measured inside the cache): from now on ``using_run_cache(folder)`` in
        this process — and in workers forked later — is this object, memory included."""
        self.folder = Path(folder).resolve()
        _folder_caches[self.folder] = self

    def detach(self) -> None:
        """End of the run: drop what is held in memory (files stay for a resume)."""
        self.clear_memory()
        if self.folder is not None and _folder_caches.get(self.folder) is self:
            del _folder_caches[self.folder]


_process_cache = RunCache()
_current: contextvars.ContextVar[RunCache | None] = contextvars.ContextVar(
    "lpq_run_cache", default=None
)
_folder_caches: dict[Path, RunCache] = {}


def run_cache() -> RunCache:
    """The cache of the tuning run in progress, or this process's memory-only cache."""
    return _current.get() or _process_cache


@contextlib.contextmanager
def using_run_cache(folder: str | Path | RunCache | None) -> Iterator[RunCache]:
    """Make the cache at ``folder`` current (one object per folder per process, so its
    memory survives from trial to trial). ``None``: the process's memory-only cache; a
    :class:`RunCache`: that cache."""
    cache = _process_cache
    if isinstance(folder, RunCache):
        cache = folder
    elif folder is not None:
        resolved = Path(folder).resolve()
        cache = _folder_caches.setdefault(resolved, RunCache(resolved))
    token = _current.set(cache)
    try:
        yield cache
    finally:
        _current.reset(token)


def one_run(func: Callable[P, T]) -> Callable[P, T]:
    """Run ``func`` (``lpq.fit``, ``lpq.quantize``) in a fresh run cache of its own,
    released when it returns."""

    @functools.wraps(func)
    def in_own_cache(*args: P.args, **kwargs: P.kwargs) -> T:
        cache = RunCache()
        try:
            with using_run_cache(cache):
                return func(*args, **kwargs)
        finally:
            cache.detach()

    return in_own_cache
