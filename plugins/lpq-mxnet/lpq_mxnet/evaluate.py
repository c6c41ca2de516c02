"""lpq_evaluate: run a model over a dataloader, timing only the MXNet call.

Every model runs as a hybridized block with ``static_alloc`` and ``static_shape`` (an
fp32 HybridBlock or exported model as a fresh SymbolBlock, so the user's block is left
alone): the fp32 baseline gets MXNet's fast path too, and speedups compare like with
like. MXNet's engine is asynchronous, so the engine is drained (``mx.nd.waitall()``)
before each timed call starts and inside it before it ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import lpq
from lpq import EvalResult, LatencyMeasurer, Metric

from . import data
from .framework import mxnet
from .model_io import info_of, to_graph


def runnable(model: Any, example: Any) -> tuple[Any, list[str]]:
    """A block to run ``model`` with, and its input names. An fp32 model's block is made
    once per model inside :func:`lpq.runtimes_kept` (the fidelity gate's timing rounds
    ran an exported model's files through ``to_graph`` once per round)."""
    info = info_of(model)
    if info is not None:
        return model, list(info.input_names)

    def make() -> tuple[Any, list[str]]:
        graph = to_graph(model, example)
        return graph.block(), list(graph.input_names)

    if isinstance(model, str | Path):
        path = Path(model)
        stat = path.stat() if path.is_file() else None
        stamp = (stat.st_mtime_ns, stat.st_size) if stat is not None else None
        return lpq.kept_runtime(("mxnet", str(path.resolve()), stamp), make)
    return lpq.kept_runtime(("mxnet", id(model)), make, holds=model)


def evaluate(
    model: Any,
    dataloader: Iterable[Any],
    postprocess: Any,
    metrics: Sequence[Metric],
    measurer: LatencyMeasurer | None,
    iteration: int | None,
) -> EvalResult:
    mx = mxnet()
    first, items = data.peek(dataloader, "evaluation")
    block, names = runnable(model, first)

    def batches() -> Iterator[tuple[list[Any], Any]]:
        for item in items:
            inputs, labels = lpq.split_batch(item)
            arrays = [data.to_nd(v) for v in data.ordered(inputs, names)]
            mx.nd.waitall()  # nothing pending when the timer starts
            yield arrays, data.labels_to_numpy(labels)

    return lpq.evaluate_batches(
        batches(),
        lambda arrays: data.run(block, arrays),
        metrics,
        postprocess=postprocess,
        measurer=measurer,
        iteration=iteration,
        to_numpy=data.outputs_to_numpy,
        count=lambda arrays: int(arrays[0].shape[0]),
    )
