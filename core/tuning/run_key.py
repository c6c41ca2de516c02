"""The run key: which tuning history a run resumes.

A run is identified by a hash of the model, the search configuration and the data, so
re-running the same command finds its history and replays finished trials, while a run
with different inputs gets a folder of its own. The budget is not part of the key.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ..eval.data import split_batch


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


def run_key(parts: dict[str, Any]) -> str:
    """12 hex digits hashed from the JSON of ``parts``."""
    source = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(source.encode()).hexdigest()[:12]
