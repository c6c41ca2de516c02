"""Tuning history: every trial written atomically as JSON, and resume.

A run is identified by a key hashed from the model, the configuration and the data, so
re-running the same command finds its history and replays finished trials instead of
repeating them, while a run with different inputs gets a folder of its own.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ._version import __version__
from .data import split_batch
from .errors import ConfigError
from .fileio import write_json
from .trial import TrialRecord


def _hash_array_like(value: Any, digest: Any) -> None:
    if isinstance(value, dict):
        for key in sorted(value):
            digest.update(str(key).encode())
            _hash_array_like(value[key], digest)
    elif isinstance(value, list | tuple):
        for item in value:
            _hash_array_like(item, digest)
    elif value is not None:
        array = np.asarray(value.detach().cpu() if hasattr(value, "detach") else value)
        digest.update(str(array.shape).encode() + str(array.dtype).encode())
        digest.update(np.ascontiguousarray(array).tobytes())


def data_fingerprint(dataloader: Iterable[Any] | None, batches: int = 2) -> str:
    """Hash of the first batches of a dataloader (enough to tell datasets apart)."""
    digest = hashlib.sha256()
    if dataloader is None:
        return "none"
    for index, item in enumerate(dataloader):
        if index >= batches:
            break
        inputs, labels = split_batch(item)
        _hash_array_like(inputs, digest)
        _hash_array_like(labels, digest)
    return digest.hexdigest()[:16]


def model_fingerprint(model: Any, ops: Iterable[Any]) -> str:
    """Hash of a model file's bytes, or for in-memory models of its type and op list."""
    digest = hashlib.sha256()
    if isinstance(model, str | os.PathLike) and Path(model).is_file():
        with open(model, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    else:
        digest.update(f"{type(model).__module__}.{type(model).__qualname__}".encode())
        digest.update(repr(sorted(ops)).encode())
    return digest.hexdigest()[:16]


class TuningHistory:
    """The history file of one run: ``<workspace>/<run key>/history.json``."""

    def __init__(self, workspace: str | os.PathLike[str], run_key: str, meta: dict[str, Any]):
        self.folder = Path(workspace) / run_key
        self.path = self.folder / "history.json"
        self.run_key = run_key
        self.meta = meta
        self.baseline: TrialRecord | None = None
        self.trials: list[TrialRecord] = []
        self.previous: dict[str, TrialRecord] = {}
        if self.path.exists():
            self._load_previous()

    def _load_previous(self) -> None:
        try:
            data = json.loads(self.path.read_text())
            records = [TrialRecord.from_json(t) for t in data.get("trials", [])]
        except (OSError, ValueError, TypeError) as exc:
            raise ConfigError(
                f"the tuning history {self.path} is unreadable ({exc})",
                hint="delete it to start over, or pass another workspace",
            ) from exc
        if data.get("run_key") != self.run_key:
            return
        self.previous = {r.fingerprint: r for r in records if r.status == "ok"}

    def add(self, record: TrialRecord) -> None:
        self.trials.append(record)
        self.write()

    def write(self, **extra: Any) -> None:
        write_json(
            self.path,
            {
                "lpq_version": __version__,
                "run_key": self.run_key,
                **self.meta,
                "baseline": self.baseline.to_json() if self.baseline else None,
                "trials": [t.to_json() for t in self.trials],
                **extra,
            },
        )
