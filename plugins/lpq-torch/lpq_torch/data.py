"""Dataloader items -> torch call arguments, and running a model on them with clear errors.

Items follow lpq's convention (``inputs`` or ``(inputs, labels)``, see
:func:`lpq.split_batch`). Inputs may be a numpy array or tensor (one positional input), a
tuple/list (positional inputs) or a dict (keyword inputs). A ``torch.utils.data.DataLoader``
is just another iterable of such items.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch

from lpq import DataError, split_batch

from .errors import first_line

#: Positional and keyword arguments of one model call.
CallArgs = tuple[tuple[Any, ...], dict[str, Any]]


def to_tensor(value: Any) -> Any:
    """A numpy array (or scalar array) as a tensor; tensors and other values unchanged.

    Tensors created under ``torch.inference_mode`` are cloned into normal tensors (outside
    inference mode): ``torch.export`` and calibration cannot use them as they are.
    """
    if isinstance(value, np.ndarray):
        if value.dtype == np.float64:
            value = value.astype(np.float32)
        return torch.from_numpy(np.ascontiguousarray(value))
    if (
        isinstance(value, torch.Tensor)
        and value.is_inference()
        and not torch.is_inference_mode_enabled()
    ):
        return value.clone()
    return value


def call_args(inputs: Any) -> CallArgs:
    """Turn one batch of inputs into ``(args, kwargs)`` for ``model(*args, **kwargs)``."""
    if isinstance(inputs, Mapping):
        return (), {str(k): to_tensor(v) for k, v in inputs.items()}
    if isinstance(inputs, list | tuple):
        return tuple(to_tensor(v) for v in inputs), {}
    return (to_tensor(inputs),), {}


def labels_to_numpy(labels: Any) -> Any:
    if isinstance(labels, torch.Tensor):
        return labels.detach().cpu().numpy()
    if isinstance(labels, list | tuple):
        return type(labels)(labels_to_numpy(v) for v in labels)
    return labels


def outputs_to_numpy(outputs: Any) -> Any:
    """Model outputs as numpy: one array, or a list of arrays for several outputs."""
    if isinstance(outputs, torch.Tensor):
        return outputs.detach().float().cpu().numpy()
    if isinstance(outputs, Mapping):
        # a Hugging Face output's KV cache (``past_key_values``) is state, not an output
        return [
            outputs_to_numpy(v)
            for v in outputs.values()
            if v is not None and not type(v).__name__.endswith("Cache")
        ]
    if isinstance(outputs, list | tuple):
        return [outputs_to_numpy(v) for v in outputs]
    return np.asarray(outputs)


def first_batch(dataloader: Iterable[Any] | None) -> CallArgs:
    """Example inputs for ``torch.export``: the dataloader's first batch."""
    if dataloader is None:
        raise DataError(
            "the PyTorch adaptor needs example inputs to export the model",
            hint="pass a calibration dataloader (its first batch is used as example inputs)",
        )
    for item in dataloader:
        return call_args(split_batch(item)[0])
    raise DataError("the dataloader yielded no batches", hint="pass non-empty data")


def at_least_two(args: CallArgs) -> CallArgs:
    """Repeat a batch of one sample so ``torch.export`` can mark the batch dim dynamic.

    Export specialises a dimension of size 1, so a dynamic batch needs an example of >= 2.
    """

    def grow(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == 1:
            return torch.cat([value, value])
        return value

    positional, keywords = args
    return tuple(grow(v) for v in positional), {k: grow(v) for k, v in keywords.items()}


def run(model: Callable[..., Any], args: CallArgs) -> Any:
    """``model(*args, **kwargs)``, turning shape/dtype mismatches into :class:`DataError`."""
    positional, keywords = args
    try:
        return model(*positional, **keywords)
    except (RuntimeError, TypeError, ValueError, IndexError, AssertionError) as exc:
        raise DataError(
            f"the model could not run on the given inputs: {first_line(exc)}",
            hint="check that the dataloader yields inputs with the shapes and dtypes the "
            f"model's forward() expects (got {describe(args)})",
        ) from exc


def describe(args: CallArgs) -> str:
    def one(value: Any) -> str:
        if isinstance(value, torch.Tensor):
            return f"{str(value.dtype).replace('torch.', '')}{list(value.shape)}"
        return type(value).__name__

    positional, keywords = args
    parts = [one(v) for v in positional] + [f"{k}={one(v)}" for k, v in keywords.items()]
    return "(" + ", ".join(parts) + ")"
