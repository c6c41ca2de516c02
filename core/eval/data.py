"""Dataloader conventions shared by the tuner and every adaptor.

A dataloader is any iterable (re-iterable for evaluation) yielding either inputs or
``(inputs, labels)``. Inputs are whatever the framework takes: one array, a tuple/list of
arrays (positional inputs) or a dict of input name to array. :func:`split_batch` is the
one place that tells inputs from labels.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError


def split_batch(item: Any) -> tuple[Any, Any]:
    """``(inputs, labels)`` of one dataloader item; labels are ``None`` when absent.

    A 2-tuple or 2-list is read as ``(inputs, labels)`` (PyTorch's ``DataLoader`` yields
    ``[x, y]`` lists); any other value is inputs only. A model with exactly two
    positional inputs must therefore yield ``((a, b), labels)`` or a dict.
    """
    if isinstance(item, tuple | list) and len(item) == 2:
        return item[0], item[1]
    return item, None


def head(inputs: Any, count: int = 1) -> Any:
    """The first ``count`` samples of a batch of inputs: an array, a mapping of arrays or
    a sequence of arrays, each leading with the batch."""
    if isinstance(inputs, Mapping):
        return {name: value[:count] for name, value in inputs.items()}
    if isinstance(inputs, list | tuple):
        return type(inputs)(value[:count] for value in inputs)
    return inputs[:count]


def batch_size(inputs: Any) -> int:
    """Number of samples in a batch of inputs (leading dimension of the first array)."""
    if isinstance(inputs, Mapping):
        inputs = next(iter(inputs.values()))
    elif isinstance(inputs, list | tuple):
        inputs = inputs[0]
    shape = getattr(inputs, "shape", None)
    return int(shape[0]) if shape else 1


def take_samples(dataloader: Iterable[Any], max_samples: int | None) -> Iterator[Any]:
    """Yield dataloader items until ``max_samples`` samples have been seen.

    Raises :class:`DataError` if the dataloader yields nothing.
    """
    seen = 0
    empty = True
    for item in dataloader:
        empty = False
        yield item
        seen += batch_size(split_batch(item)[0])
        if max_samples is not None and seen >= max_samples:
            return
    if empty:
        raise DataError("the dataloader yielded no batches", hint="pass non-empty data")


class ArrayLoader:
    """A re-iterable dataloader over in-memory arrays, batching along the first axis.

    ``inputs`` is one array or a dict of input name to array; ``labels`` is optional.
    ``source`` names the file it was read from (for messages).
    """

    source: str | None = None
    #: The input arrays' names in the file they were read from (``None``: not from a file).
    names: list[str] | None = None

    def __init__(
        self,
        inputs: np.ndarray | Mapping[str, np.ndarray],
        labels: np.ndarray | None = None,
        batch_size: int = 32,
    ) -> None:
        if batch_size < 1:
            raise DataError(f"batch size must be at least 1, not {batch_size}")
        self.inputs = inputs
        self.labels = labels
        self.batch_size = batch_size
        first = next(iter(inputs.values())) if isinstance(inputs, Mapping) else inputs
        self.num_samples = len(first)
        if self.num_samples == 0:
            raise DataError("the data holds no samples", hint="pass at least one sample")
        if isinstance(inputs, Mapping):
            for name, array in inputs.items():
                if len(array) != self.num_samples:
                    raise DataError(
                        f"input {name!r} has {len(array)} samples, expected {self.num_samples}",
                        hint="give every input the same number of samples",
                    )
        if labels is not None and len(labels) != self.num_samples:
            raise DataError(
                f"{len(labels)} labels for {self.num_samples} samples",
                hint="give exactly one label per sample",
            )

    def __len__(self) -> int:
        return -(-self.num_samples // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        for start in range(0, self.num_samples, self.batch_size):
            stop = start + self.batch_size
            if isinstance(self.inputs, Mapping):
                batch: Any = {k: v[start:stop] for k, v in self.inputs.items()}
            else:
                batch = self.inputs[start:stop]
            yield (batch, self.labels[start:stop]) if self.labels is not None else batch


class ReferenceLoader:
    """Pairs a dataloader's inputs with reference outputs (e.g. the fp32 model's).

    Used when the eval data has no labels: metrics then score agreement with fp32.
    """

    def __init__(self, dataloader: Iterable[Any], references: Sequence[Any]) -> None:
        self.dataloader = dataloader
        self.references = references

    def __iter__(self) -> Iterator[Any]:
        for item, ref in zip(self.dataloader, self.references):
            yield split_batch(item)[0], ref


class OutputRecorder:
    """A pseudo-metric that keeps each batch's predictions (to build reference labels)."""

    name = "outputs"
    higher_is_better = True

    def __init__(self) -> None:
        self.outputs: list[Any] = []

    def reset(self) -> None:
        self.outputs = []

    def update(self, preds: Any, labels: Any) -> None:
        self.outputs.append(preds)

    def result(self) -> float:
        return float(len(self.outputs))


#: How an ``.npz`` (a zip archive) and an ``.npy`` file begin.
_ZIP_MAGIC = b"PK\x03\x04"
_NPY_MAGIC = b"\x93NUMPY"


def _not_npz(file: Path) -> DataError | None:
    """What ``file`` is when it is not an ``.npz`` archive (before numpy's own message,
    which for a text file talks about pickles)."""
    with file.open("rb") as handle:
        head = handle.read(512)
    if head.startswith(_ZIP_MAGIC) or head.startswith(_NPY_MAGIC):
        return None
    if not head:
        what = "it is empty"
    else:
        try:
            head.decode("utf-8")
            what = "it looks like text"
        except UnicodeDecodeError:
            what = "it is some other binary file"
    return DataError(
        f"{file} is not an .npz archive ({what}), so lpq cannot read it",
        hint="save data with numpy.savez(path, input_name=array, labels=labels); a CSV or "
        "text file must be loaded and saved that way first",
    )


def _check_finite(file: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """NaN or inf in data would lower the fp32 baseline (eval) or widen every range
    (calibration) without a word: refuse them, naming the array."""
    for name, array in arrays.items():
        if array.dtype.kind not in "fc":
            continue
        bad = array.size - int(np.count_nonzero(np.isfinite(array)))
        if bad:
            nans = int(np.count_nonzero(np.isnan(array)))
            raise DataError(
                f"{file}: array {name!r} holds {bad} non-finite value(s) ({nans} NaN, "
                f"{bad - nans} inf) of {array.size}",
                hint="clean the data first (drop those samples, or numpy.nan_to_num); lpq "
                "would otherwise score and calibrate on them",
            )


def load_npz(path: str | os.PathLike[str], batch_size: int = 32) -> ArrayLoader:
    """Read CLI data: an ``.npz`` with one array per model input (or one array for a
    single-input model) and an optional ``labels`` array.

    The loader's ``names`` are the file's input array names (for the CLI's check that they
    match the model's input names).
    """
    file = Path(path)
    if file.is_dir():
        raise DataError(
            f"{file} is a directory, lpq expected an .npz data file",
            hint="pass the .npz file (numpy.savez(path, input_name=array, labels=labels))",
        )
    if not file.is_file():
        raise DataError(f"data file {file} does not exist", hint="check the path")
    try:
        problem = _not_npz(file)
    except OSError as exc:
        raise DataError(f"cannot read {file} ({exc.strerror})", hint="check the file") from exc
    if problem is not None:
        raise problem
    try:
        with np.load(file, allow_pickle=False) as npz:
            if not hasattr(npz, "files"):
                raise DataError(
                    f"{file} is a single .npy array, not an .npz archive",
                    hint="save data with numpy.savez(path, input_name=array, labels=labels)",
                )
            arrays = {name: npz[name] for name in npz.files}
    except DataError:
        raise
    except ValueError as exc:
        if "pickle" in str(exc):
            raise DataError(
                f"cannot read {file}: it holds Python objects (e.g. ragged lists), not plain "
                "numeric arrays",
                hint="save numeric arrays: numpy.savez(path, input_name=numpy.stack(samples))",
            ) from exc
        raise DataError(
            f"cannot read {file} as .npz ({exc})",
            hint="save data with numpy.savez(path, input_name=array, labels=labels)",
        ) from exc
    except Exception as exc:
        raise DataError(
            f"cannot read {file} as .npz ({exc})",
            hint="save data with numpy.savez(path, input_name=array, labels=labels)",
        ) from exc
    _check_finite(file, arrays)
    labels = arrays.pop("labels", None)
    if not arrays:
        raise DataError(f"{file} holds no input arrays", hint="add one array per model input")
    inputs: Any = next(iter(arrays.values())) if len(arrays) == 1 else arrays
    loader = ArrayLoader(inputs, labels, batch_size=batch_size)
    loader.source = str(file)
    loader.names = list(arrays)
    return loader


def as_dataloader(data: Any) -> Any:
    """Accept the data forms users pass: a numpy array (inputs only), an ``(inputs,
    labels)`` pair of arrays, a dict of input arrays, or any re-iterable dataloader."""
    if data is None:
        return None
    if isinstance(data, np.ndarray):
        return ArrayLoader(data)
    if (
        isinstance(data, tuple)
        and len(data) == 2
        and isinstance(data[0], np.ndarray | Mapping)
        and isinstance(data[1], np.ndarray)
    ):
        return ArrayLoader(data[0], data[1])
    if isinstance(data, Mapping) and all(isinstance(v, np.ndarray) for v in data.values()):
        return ArrayLoader(data)
    return data
