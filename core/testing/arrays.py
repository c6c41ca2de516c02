"""Small array helpers the conformance checks share (framework-neutral: numpy only)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..eval.data import batch_size, split_batch


def first(value: Any) -> Any:
    """A model output's first tensor (outputs may be a list, tuple or dict)."""
    if isinstance(value, list | tuple):
        return value[0]
    if isinstance(value, dict):
        return next(iter(value.values()))
    return value


def stacked(outputs: list[Any]) -> np.ndarray:
    """Every batch's first output, concatenated along the batch axis (float64)."""
    return np.concatenate([np.asarray(first(o), np.float64) for o in outputs])


def rms(values: Any) -> float:
    return float(np.sqrt(np.mean(np.square(np.asarray(values, np.float64)))))


def step(values: Any) -> float:
    """The int8 quantization step of a tensor's range (zero always representable)."""
    array = np.asarray(values, np.float64)
    return max(float(max(array.max(), 0.0) - min(array.min(), 0.0)) / 255, 1e-12)


def count_samples(loader: Any) -> int:
    return sum(batch_size(split_batch(item)[0]) for item in loader)


class CountingLoader:
    """Passes a dataloader through, counting the samples read in each pass."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.most_in_one_pass = 0

    def total_samples(self) -> int:
        return count_samples(self.loader)

    def __iter__(self) -> Iterator[Any]:
        seen = 0
        for item in self.loader:
            seen += batch_size(split_batch(item)[0])
            self.most_in_one_pass = max(self.most_in_one_pass, seen)
            yield item
