"""Running a large batch in chunks of samples, for memory: ONNX Runtime holds every
intermediate tensor of a run at once, so a run's memory grows with its batch.

A model whose graph inputs and outputs all share one symbolic batch axis, and that has
no node whose outputs depend on the whole batch, gives each sample outputs of its own:
the batch may run in pieces, their outputs concatenated. Used by the latency search's
output error (:mod:`lpq_onnxrt.latency.fidelity`) and by evaluation
(:mod:`lpq_onnxrt.evaluate`: the fidelity check and the data probe run the user's
``--batch-size`` batches).

The check is on the graph's declared shapes: a model that mixes samples some other way
(a reduction over the batch axis, broadcast back) while declaring one batch axis is not
told apart; inference graphs do not do that. Where the declared shapes do not say (an
exporter that names the output's batch axis apart from the input's, as paddle2onnx does),
:func:`has_batch_axis` runs two samples alone and together to see.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx

#: A batch whose inputs take more than this many bytes runs in chunks of samples that
#: fit it (see :func:`batch_chunks`). MTCNN P-Net, 32 pictures of 320x240 a batch:
#: 705 MB a run, in chunks of 4 pictures 121 MB, the same outputs bit for bit, in less
#: CPU time (0.99 -> 0.65 s for three batches).
CHUNK_BYTES = 4 << 20
#: Node types whose outputs depend on the whole batch (dynamic quantization's ranges).
BATCH_WIDE = frozenset({"DynamicQuantizeLinear", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM"})


def _fed_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs a caller feeds (not the weights some exporters list as inputs)."""
    weights = {init.name for init in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in weights]


def shares_batch_axis(model: onnx.ModelProto) -> bool:
    """Whether every graph input and output of ``model`` has a first axis named by one
    and the same symbol (``N``): one sample's outputs are then its own, and a batch may
    run in pieces. A fixed first axis, or none, gives False."""
    values = [*_fed_inputs(model), *model.graph.output]
    names = set()
    for value in values:
        dims = value.type.tensor_type.shape.dim
        if not dims or not dims[0].dim_param:
            return False
        names.add(dims[0].dim_param)
    return len(names) == 1


#: :func:`rows_are_samples`: a row run alone and in a pair may differ by this much of its
#: L2 norm (ORT may pick other kernels for another batch size: float rounding only).
ROW_TOLERANCE = 1e-3


def has_batch_axis(
    model: onnx.ModelProto,
    run: Callable[[dict[str, np.ndarray]], Sequence[Any]],
    feed: Mapping[str, Any],
) -> bool:
    """Whether ``model``'s first axis is a batch of samples, each with outputs of its own:
    declared (:func:`shares_batch_axis`), or, where every input's first axis is free
    but the outputs name theirs apart, seen by running ``feed``'s first samples
    (:func:`rows_are_samples`; ``run`` runs the model and returns all its outputs).
    PP-OCRv4 det declares its input's batch axis and its output's with different names."""
    if shares_batch_axis(model):
        return True
    for value in _fed_inputs(model):
        dims = value.type.tensor_type.shape.dim
        if not dims or (dims[0].HasField("dim_value") and dims[0].dim_value > 0):
            return False  # a fixed batch (or none): not cut
    return rows_are_samples(run, feed)


def rows_are_samples(
    run: Callable[[dict[str, np.ndarray]], Sequence[Any]], feed: Mapping[str, Any]
) -> bool:
    """Whether ``run`` gives ``feed``'s first two samples (rows of every input) outputs
    of their own: run together, every output has two rows, each the output of its
    sample run alone (to :data:`ROW_TOLERANCE`). False where ``feed`` holds fewer than
    two samples or the model refuses a batch of one or two."""
    count = shared_batch(feed)
    if count is None or count < 2:
        return False
    arrays = {name: np.asarray(value) for name, value in feed.items()}
    try:
        pair = [np.asarray(v) for v in run({n: a[:2] for n, a in arrays.items()})]
        alone = [
            [np.asarray(v) for v in run({n: a[row : row + 1] for n, a in arrays.items()})]
            for row in (0, 1)
        ]
    except Exception:  # ORT refuses the batch size: a batch it cannot cut
        return False
    for index, both in enumerate(pair):
        for row, outputs in enumerate(alone):
            one = outputs[index]
            if both.ndim == 0 or both.shape[0] != 2 or one.shape != (1, *both.shape[1:]):
                return False
            if not np.issubdtype(both.dtype, np.floating):
                if not np.array_equal(both[row : row + 1], one):
                    return False
                continue
            wide = one.astype(np.float64)
            gap = np.linalg.norm(both[row : row + 1].astype(np.float64) - wide)
            if gap > ROW_TOLERANCE * max(float(np.linalg.norm(wide)), 1e-30):
                return False
    return True


def batch_wide(model: onnx.ModelProto) -> bool:
    """Whether ``model`` has a node whose outputs depend on the whole batch (one of
    :data:`BATCH_WIDE`: dynamic quantization's ranges are the batch's)."""
    return any(node.op_type in BATCH_WIDE for node in model.graph.node)


def feed_runs_in_chunks(
    model: onnx.ModelProto,
    run: Callable[[dict[str, np.ndarray]], Sequence[Any]],
    feed: Mapping[str, Any],
) -> bool:
    """Whether ``feed`` is cut into pieces (:func:`batch_chunks`) and ``model`` may run
    them with the same outputs: not :func:`batch_wide`, and a batch axis declared or seen
    by running (:func:`has_batch_axis`: only for a feed that would be cut)."""
    if batch_wide(model) or batch_chunks(feed) is None:
        return False
    return has_batch_axis(model, run, feed)


def shared_batch(feed: Mapping[str, Any]) -> int | None:
    """The first-axis size every input of ``feed`` shares; None when an input is a scalar
    or two differ (not one batch of samples)."""
    sizes = {np.shape(value)[0] if np.ndim(value) else -1 for value in feed.values()}
    return int(sizes.pop()) if len(sizes) == 1 and -1 not in sizes else None


def batch_chunks(
    feed: Mapping[str, Any], limit: int | None = None
) -> list[dict[str, np.ndarray]] | None:
    """``feed`` cut along its first axis into pieces of at most ``limit`` bytes of inputs
    (:data:`CHUNK_BYTES` when None; at least one sample each); None when it fits whole or
    its inputs do not share a batch size."""
    limit = CHUNK_BYTES if limit is None else limit
    arrays = {name: np.asarray(value) for name, value in feed.items()}
    count = shared_batch(arrays)
    total = sum(array.nbytes for array in arrays.values())
    if count is None or total <= limit or count <= 1:
        return None
    step = max(1, int(limit * count // total))
    return [
        {name: array[start : start + step] for name, array in arrays.items()}
        for start in range(0, count, step)
    ]


def run_in_chunks(
    run: Callable[[dict[str, np.ndarray]], Sequence[Any]],
    feed: Mapping[str, Any],
    limit: int | None = None,
) -> list[Any] | None:
    """``run``'s outputs on ``feed`` run in the pieces of :func:`batch_chunks`, each
    output concatenated along the batch axis (new arrays, not ORT's buffers); None when
    ``feed`` is not cut (run it whole). Only where :func:`feed_runs_in_chunks`."""
    pieces = batch_chunks(feed, limit)
    if pieces is None:
        return None
    runs = [run(piece) for piece in pieces]
    return [np.concatenate([got[k] for got in runs]) for k in range(len(runs[0]))]
