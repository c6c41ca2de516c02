"""Dataloader items -> MXNet inputs, and running a block on them with clear errors.

Items follow lpq's convention (``inputs`` or ``(inputs, labels)``, see
:func:`lpq.split_batch`). Inputs may be a numpy array or NDArray (one input), a
tuple/list (positional inputs) or a dict keyed by input name. A ``gluon.data.DataLoader``
is just another iterable of such items.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from lpq import DataError, ModelError, split_batch, take_samples

from .framework import mxnet
from .info import INFO_ATTR

#: How oneDNN says it has no kernel for an op on this CPU (bf16 without AVX-512 BF16).
NO_KERNEL_MESSAGE = "could not create a primitive descriptor"


def num_inputs(inputs: Any) -> int:
    """How many model inputs one batch holds."""
    return len(inputs) if isinstance(inputs, Mapping | list | tuple) else 1


def ordered(inputs: Any, names: Sequence[str]) -> list[Any]:
    """The batch's arrays in the order of the model's ``names``."""
    if isinstance(inputs, Mapping):
        if len(inputs) == len(names) == 1:
            return list(inputs.values())
        missing = [n for n in names if n not in inputs]
        if missing:
            raise DataError(
                f"the batch has inputs {sorted(inputs)}, the model takes {list(names)}",
                hint="key each array by the model's input name, or pass a tuple in order",
            )
        values = [inputs[n] for n in names]
    elif isinstance(inputs, list | tuple):
        values = list(inputs)
    else:
        values = [inputs]
    if len(values) != len(names):
        raise DataError(
            f"the batch holds {len(values)} input(s), the model takes {len(names)} "
            f"({', '.join(names)})",
            hint="pass one array per model input",
        )
    return values


def to_numpy(value: Any) -> np.ndarray:
    """An input array as numpy, float64 narrowed to float32 (MXNet's default type)."""
    mx = mxnet()
    array = value.asnumpy() if isinstance(value, mx.nd.NDArray) else np.asarray(value)
    return array.astype(np.float32) if array.dtype == np.float64 else array


def to_nd(value: Any) -> Any:
    mx = mxnet()
    if isinstance(value, mx.nd.NDArray):
        return value
    array = to_numpy(value)
    return mx.nd.array(array, dtype=array.dtype)


def labels_to_numpy(labels: Any) -> Any:
    mx = mxnet()
    if isinstance(labels, mx.nd.NDArray):
        return labels.asnumpy()
    if isinstance(labels, list | tuple):
        return type(labels)(labels_to_numpy(v) for v in labels)
    return labels


def outputs_to_numpy(outputs: Any) -> Any:
    """Block outputs as numpy: one array, or a list of arrays for several outputs."""
    if isinstance(outputs, list | tuple):
        return [outputs_to_numpy(v) for v in outputs]
    return outputs.asnumpy()


def peek(dataloader: Iterable[Any] | None, purpose: str) -> tuple[Any, Iterator[Any]]:
    """The first item's inputs, and an iterator over all items (the first included).

    :raises lpq.DataError: when there is no data.
    """
    if dataloader is None:
        raise DataError(f"the MXNet adaptor needs data for {purpose}", hint="pass a dataloader")
    iterator = iter(dataloader)
    try:
        first = next(iterator)
    except StopIteration:
        raise DataError(
            f"the dataloader for {purpose} yielded no batches", hint="pass non-empty data"
        ) from None
    return split_batch(first)[0], itertools.chain([first], iterator)


def calibration_arrays(
    dataloader: Iterable[Any], names: Sequence[str], max_samples: int
) -> list[np.ndarray]:
    """Up to ``max_samples`` calibration samples, one concatenated array per input."""
    per_input: list[list[np.ndarray]] = [[] for _ in names]
    for item in take_samples(dataloader, max_samples):
        for i, value in enumerate(ordered(split_batch(item)[0], names)):
            per_input[i].append(to_numpy(value))
    try:
        arrays = [np.concatenate(chunks)[:max_samples] for chunks in per_input]
    except ValueError as exc:
        raise DataError(
            f"calibration batches have inconsistent shapes ({exc})",
            hint="give every sample the same shape",
        ) from exc
    return arrays


def calibration_iter(arrays: Sequence[np.ndarray], names: Sequence[str]) -> Any:
    """An ``mx.io.DataIter`` over every calibration sample, in batches of equal size (the
    largest divisor of the sample count up to 32, so no sample is dropped or repeated:
    the calibration Module is bound to one batch shape)."""
    mx = mxnet()
    total = len(arrays[0])
    batch = max(d for d in range(1, min(total, 32) + 1) if total % d == 0)
    data = OrderedDict((name, array) for name, array in zip(names, arrays))
    return mx.io.NDArrayIter(data, batch_size=batch, last_batch_handle="discard")


def run(block: Any, inputs: Sequence[Any]) -> Any:
    """``block(*inputs)`` with the engine drained, an MXNet failure turned into a DataError
    (inputs that do not fit the model are the common cause), except oneDNN finding no
    kernel for a bf16 model: a ModelError about the CPU."""
    mx = mxnet()
    try:
        out = block(*inputs)
        mx.nd.waitall()
    except mx.base.MXNetError as exc:
        if NO_KERNEL_MESSAGE in str(exc) and _precision(block) == "bf16":
            raise no_bf16_kernel(exc) from exc
        raise misfit(inputs, exc) from exc
    return out


def _precision(block: Any) -> str | None:
    """The precision of a block lpq-mxnet built (its ``ModelInfo``), else ``None``."""
    return getattr(getattr(block, INFO_ATTR, None), "precision", None)


def no_bf16_kernel(exc: Exception) -> ModelError:
    reason = next((line.strip() for line in str(exc).splitlines() if "Error" in line), str(exc))
    return ModelError(
        f"oneDNN has no bf16 kernel for this model on this CPU (it needs AVX-512 BF16 or "
        f"AMX): {reason[:300]}",
        hint="keep the model in fp32 (or quantize it to int8), or run the bf16 model on a "
        "CPU with AVX-512 BF16 or AMX; LPQ_CPU_FLAGS may be claiming features this CPU "
        "lacks",
    )


def misfit(inputs: Sequence[Any], exc: Exception) -> DataError:
    shapes = ", ".join(str(tuple(getattr(v, "shape", ()))) for v in inputs)
    reason = next((line.strip() for line in str(exc).splitlines() if "Error" in line), str(exc))
    return DataError(
        f"the model cannot run on inputs of shape {shapes}: {reason[:300]}",
        hint="give the inputs the shape (and number) the model was built for",
    )
