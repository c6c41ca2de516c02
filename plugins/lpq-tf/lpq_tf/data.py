"""Dataloader items -> the arrays a LiteRT model takes, checked against its inputs.

A dataloader item's inputs may be one array, a list or a dict by input name; lpq orders
them like the model's inputs and checks each one's dtype and shape here, so a misfit is a
:class:`lpq.DataError` naming the input instead of a C++ error from the interpreter. Float
data fed to an integer-input model (``io_dtype: int8``) is quantized with the input's own
scale, so the same data evaluates every model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lpq import DataError


@dataclass(frozen=True)
class InputSpec:
    """One model input: its names, dtype, shape (None for dynamic dims) and quantization."""

    index: int
    name: str
    signature_name: str | None
    dtype: Any
    shape: tuple[int | None, ...]
    scale: float
    zero_point: int

    def describe(self) -> str:
        dims = "x".join("N" if d is None else str(d) for d in self.shape)
        return f"{np.dtype(self.dtype).name}[{dims}]"


def _check(spec: InputSpec, array: Any) -> np.ndarray:
    value = np.asarray(array)
    want = np.dtype(spec.dtype)
    if want.kind in "iu" and spec.scale and value.dtype.kind == "f":
        # An integer-input model fed float data: quantize it as the model says.
        info = np.iinfo(want)
        value = np.clip(np.round(value / spec.scale + spec.zero_point), info.min, info.max)
        value = value.astype(want)
    elif value.dtype != want:
        # Same kind only (float64 -> float32 is fine): integers fed to a float input are
        # usually unnormalised pixels or token ids, a mistake worth reporting.
        if value.dtype.kind != want.kind:
            raise DataError(
                f"input {spec.name!r} has dtype {value.dtype}, the model expects {spec.describe()}",
                hint=f"convert the data with .astype(numpy.{want.name})",
            )
        value = value.astype(want)
    fits = value.ndim == len(spec.shape) and all(
        want_dim is None or want_dim == got or i == 0
        for i, (want_dim, got) in enumerate(zip(spec.shape, value.shape))
    )
    if not fits:
        raise DataError(
            f"input {spec.name!r} has shape {tuple(value.shape)}, the model expects "
            f"{spec.describe()}",
            hint="reshape the data to the model's input shape (N is the batch)",
        )
    return np.ascontiguousarray(value)


def make_feed(specs: list[InputSpec], inputs: Any) -> list[np.ndarray]:
    """One batch's arrays in model input order, from an array, a list or a dict by name."""
    if isinstance(inputs, Mapping):
        lookup = {}
        for spec in specs:
            for name in (spec.name, spec.signature_name, spec.name.split(":")[0]):
                if name is not None:
                    lookup[name] = spec
        unknown = [name for name in inputs if name not in lookup]
        if unknown or len(inputs) != len(specs):
            raise DataError(
                f"the data's inputs {sorted(inputs)} do not match the model's",
                hint="the model takes: "
                + ", ".join(f"{s.signature_name or s.name} {s.describe()}" for s in specs),
            )
        ordered = {lookup[name].index: value for name, value in inputs.items()}
        return [_check(spec, ordered[spec.index]) for spec in specs]
    arrays = list(inputs) if isinstance(inputs, list | tuple) else [inputs]
    if len(arrays) != len(specs):
        raise DataError(
            f"the data gives {len(arrays)} input array(s), the model takes {len(specs)}: "
            + ", ".join(f"{s.signature_name or s.name} {s.describe()}" for s in specs),
            hint="yield a dict of input name to array for multi-input models",
        )
    return [_check(spec, array) for spec, array in zip(specs, arrays)]
