"""The calibration samples: taken from the dataloader once, checked, split one per batch."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from lpq import DataError

from ..data import InputSpec
from ..runtime import Runner


@dataclass(frozen=True)
class Samples:
    """Single-sample batches in model input order, plus a digest that names them."""

    items: list[list[np.ndarray]]
    specs: list[InputSpec]
    digest: str

    def __len__(self) -> int:
        return len(self.items)

    def as_lists(self) -> Iterator[list[np.ndarray]]:
        """What TFLiteConverter's ``representative_dataset`` yields."""
        yield from self.items

    def as_signature_dicts(self, names: list[str]) -> list[dict[str, np.ndarray]]:
        """What ai-edge-quantizer's calibrator takes: ``{input name: array}`` per sample."""
        return [dict(zip(names, item)) for item in self.items]


def collect(float_tflite: bytes, dataloader: Iterable[Any] | None, max_samples: int) -> Samples:
    """Up to ``max_samples`` samples, checked against the float model's inputs.

    Splitting batches into single samples lets models with a fixed batch of 1 calibrate
    and makes a short last batch harmless. Misfit or empty data raise DataError here,
    before any converter runs.
    """
    if dataloader is None:
        raise DataError(
            "static quantization needs calibration data, but none was given",
            hint="pass a calibration dataloader, or choose dynamic quantization",
        )
    runner = Runner(float_tflite)
    items: list[list[np.ndarray]] = []
    digest = hashlib.blake2b(digest_size=16)
    for arrays, _ in runner.batches(dataloader, max_samples):
        count = len(arrays[0]) if arrays and arrays[0].ndim else 1
        for i in range(count):
            if len(items) >= max_samples:
                break
            sample = [np.ascontiguousarray(a[i : i + 1]) for a in arrays]
            for array in sample:
                digest.update(array.tobytes())
            items.append(sample)
    if not items:
        raise DataError("the calibration dataloader gave no samples", hint="pass non-empty data")
    return Samples(items, runner.specs, digest.hexdigest())
