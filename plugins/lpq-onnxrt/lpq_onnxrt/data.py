"""Turning dataloader items into validated ONNX Runtime feeds.

Inputs may be one array (single-input model), a tuple/list (positional, in the order of
the graph's inputs) or a dict by input name. Every array is checked against the model's
declared input: a wrong name, rank, fixed dimension or dtype raises :class:`lpq.DataError`
naming the input and what it expects, rather than an ORT error deep inside a trial.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from lpq import DataError, split_batch, take_samples

if TYPE_CHECKING:
    import onnx

# onnx TensorProto element types -> numpy dtypes (the ones models take as inputs).
_ONNX_TO_NUMPY = {
    1: np.float32,
    2: np.uint8,
    3: np.int8,
    4: np.uint16,
    5: np.int16,
    6: np.int32,
    7: np.int64,
    9: np.bool_,
    10: np.float16,
    11: np.float64,
    12: np.uint32,
    13: np.uint64,
}


@dataclass(frozen=True)
class InputSpec:
    """One graph input: name, numpy dtype and shape (``None`` for symbolic dims)."""

    name: str
    dtype: Any
    shape: tuple[int | None, ...] | None

    def describe(self) -> str:
        dims = (
            "?"
            if self.shape is None
            else "x".join("N" if d is None else str(d) for d in self.shape)
        )
        return f"{np.dtype(self.dtype).name}[{dims}]"


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    """The graph inputs a caller must feed (initializers listed as inputs excluded)."""
    initializers = {init.name for init in model.graph.initializer}
    head_sizes = cache_head_sizes(model)
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dtype = _ONNX_TO_NUMPY.get(tensor.elem_type, np.float32)
        shape: tuple[int | None, ...] | None = None
        if tensor.HasField("shape"):
            shape = tuple(
                d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                for d in tensor.shape.dim
            )
            if value.name in head_sizes and shape and shape[-1] is None:
                shape = (*shape[:-1], head_sizes[value.name])  # a symbolic head size
        specs.append(InputSpec(value.name, dtype, shape))
    return specs


def cache_head_sizes(model: onnx.ModelProto) -> dict[str, int]:
    """The head size of each KV-cache input of an ORT attention node, from the node's
    head counts and its query projection's width.

    onnxruntime-genai's builder names the cache's last dim (``kv_cache_dim``) instead of
    fixing it, and an empty cache needs the real size: GroupQueryAttention checks it.
    """
    weights = {init.name: init for init in model.graph.initializer}
    producers = {out: node for node in model.graph.node for out in node.output}
    sizes: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type not in ("GroupQueryAttention", "MultiHeadAttention") or not node.input:
            continue
        attrs = {a.name: a.i for a in node.attribute}
        heads = attrs.get("num_heads", 0)
        kv_heads = attrs.get("kv_num_heads", heads)
        width = _projection_width(node.input[0], producers, weights)
        if not heads or not width:
            continue
        packed = len(node.input) < 2 or not node.input[1]  # Q, K and V in one tensor
        head = width // (heads + 2 * kv_heads) if packed else width // heads
        for name in node.input[3:5]:  # past_key, past_value
            if name:
                sizes[name] = head
    return sizes


def _projection_width(
    tensor: str, producers: Mapping[str, Any], weights: Mapping[str, Any]
) -> int | None:
    """Output width of the MatMul (or MatMulNBits, through a bias Add) producing ``tensor``."""
    node = producers.get(tensor)
    while node is not None and node.op_type == "Add":
        node = next((producers[i] for i in node.input if i in producers), None)
    if node is None:
        return None
    if node.op_type == "MatMul" and len(node.input) > 1 and node.input[1] in weights:
        return int(weights[node.input[1]].dims[-1])
    if node.op_type == "MatMulNBits":
        return next((int(a.i) for a in node.attribute if a.name == "N"), None)
    return None


def _check(spec: InputSpec, array: Any) -> np.ndarray:
    value = np.asarray(array)
    if value.dtype != spec.dtype:
        # Same kind only (float64 -> float32 is fine): integers fed to a float input
        # are usually unnormalised pixels or token ids, a mistake worth reporting.
        safe = value.dtype.kind == np.dtype(spec.dtype).kind
        if not safe:
            raise DataError(
                f"input {spec.name!r} has dtype {value.dtype}, the model expects {spec.describe()}",
                hint=f"convert the data with .astype(numpy.{np.dtype(spec.dtype).name})",
            )
        value = value.astype(spec.dtype)
    fits = spec.shape is None or (
        value.ndim == len(spec.shape)
        and all(want is None or want == got for want, got in zip(spec.shape, value.shape))
    )
    if not fits:
        raise DataError(
            f"input {spec.name!r} has shape {tuple(value.shape)}, the model expects "
            f"{spec.describe()}",
            hint="reshape the data to the model's input shape (N is the batch)",
        )
    return value


def make_feed(specs: list[InputSpec], inputs: Any) -> dict[str, np.ndarray]:
    """One validated feed dict from one batch of inputs.

    For a decoder with KV-cache inputs, token windows alone (``input_ids`` as a dict
    entry or the only array) are enough: :mod:`.llm_io` fills the mask, positions and
    empty caches.
    """
    from . import llm_io

    if llm_io.is_decoder(specs):
        if not isinstance(inputs, Mapping | list | tuple):
            inputs = {llm_io.TOKENS: inputs}
        if isinstance(inputs, Mapping) and llm_io.TOKENS in inputs:
            inputs = llm_io.fill_decoder_inputs(specs, inputs)
    if isinstance(inputs, Mapping):
        expected = {spec.name for spec in specs}
        unknown = [name for name in inputs if name not in expected]
        missing = [spec.name for spec in specs if spec.name not in inputs]
        if unknown or missing:
            parts = []
            if unknown:
                parts.append(f"unknown input(s) {', '.join(map(repr, unknown))}")
            if missing:
                parts.append(f"missing input(s) {', '.join(map(repr, missing))}")
            raise DataError(
                "the data does not match the model's inputs: " + "; ".join(parts),
                hint="the model takes: " + ", ".join(f"{s.name} {s.describe()}" for s in specs),
            )
        return {spec.name: _check(spec, inputs[spec.name]) for spec in specs}
    arrays = list(inputs) if isinstance(inputs, list | tuple) else [inputs]
    if len(arrays) != len(specs):
        raise DataError(
            f"the data gives {len(arrays)} input array(s), the model takes {len(specs)}: "
            + ", ".join(f"{s.name} {s.describe()}" for s in specs),
            hint="yield a dict of input name to array for multi-input models",
        )
    return {spec.name: _check(spec, array) for spec, array in zip(specs, arrays)}


def iter_batches(
    model: onnx.ModelProto, dataloader: Iterable[Any] | None, max_samples: int | None = None
) -> Iterator[tuple[dict[str, np.ndarray], Any]]:
    """Yield ``(feed, labels)`` per dataloader item; DataError on empty or misfit data."""
    if dataloader is None:
        raise DataError(
            "static quantization needs calibration data, but none was given",
            hint="pass a calibration dataloader, or choose dynamic / weight-only quantization",
        )
    specs = input_specs(model)
    for item in take_samples(dataloader, max_samples):
        inputs, labels = split_batch(item)
        yield make_feed(specs, inputs), labels


def batched_feed(
    specs: list[InputSpec], feeds: Iterable[Mapping[str, np.ndarray]], batch_size: int
) -> dict[str, np.ndarray]:
    """One feed of ``batch_size`` samples built from ``feeds`` (cycled when they hold fewer).

    Samples are stacked along each input's batch axis: its first symbolic dimension (a
    recurrent state ``[2, N, 128]`` batches on axis 1); inputs without one (a scalar sample
    rate) are taken from the first feed. Used to time a model at the batch it is deployed
    at rather than at the calibration batch.
    """
    pool = [dict(feed) for feed in feeds]
    if not pool:
        raise DataError("no data to build a timing batch from", hint="pass calibration data")
    axes: dict[str, int | None] = {}
    for spec in specs:
        dims = spec.shape
        if dims is None:
            axes[spec.name] = 0 if np.ndim(pool[0][spec.name]) else None
        else:
            axes[spec.name] = next((i for i, d in enumerate(dims) if d is None), None)
    out: dict[str, np.ndarray] = {}
    for name, first in pool[0].items():
        axis = axes.get(name, 0 if np.ndim(first) else None)
        if axis is None or np.ndim(first) <= axis:
            out[name] = first
            continue
        parts, count, index = [], 0, 0
        while count < batch_size:
            part = np.asarray(pool[index % len(pool)][name])
            parts.append(part)
            count += max(1, part.shape[axis])
            index += 1
        out[name] = np.take(np.concatenate(parts, axis=axis), range(batch_size), axis=axis)
    return out
