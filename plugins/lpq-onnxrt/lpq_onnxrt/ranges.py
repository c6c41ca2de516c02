"""Which activations need ranges, and calibrating them once per (model, data, size).

Calibration statistics (streaming histograms, see :mod:`lpq_onnxrt.calibration`) are
collected for *every* activation any static op of the model could need, not only the
ones the current tune_cfg quantizes. A later trial that only falls some ops back to fp32,
or switches an op from minmax to kl, then reuses the same statistics: only
``compute_range`` runs again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

import lpq

from .data import iter_batches

if TYPE_CHECKING:
    import onnx

    from .calibration import CalibrationStats

log = logging.getLogger(__name__)

#: Ops ORT quantizes to keep neighbours in int8 (data movement / removable activations).
FOLLOW_OPS = frozenset(
    {
        "Relu",
        "Clip",
        "MaxPool",
        "Reshape",
        "Flatten",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Slice",
        "Split",
        "Pad",
        "Resize",
        "Softmax",
    }
)


def activation_tensors(model: onnx.ModelProto, node_names: Iterable[str]) -> list[str]:
    """Non-constant float inputs and outputs of the named nodes, in graph order."""
    from .graph import tensor_types

    wanted = set(node_names)
    constants = {init.name for init in model.graph.initializer}
    constants |= {
        out for node in model.graph.node if node.op_type == "Constant" for out in node.output
    }
    types = tensor_types(model)
    names: dict[str, None] = {}
    for node in model.graph.node:
        if node.name not in wanted:
            continue
        for name in (*node.input, *node.output):
            if name and name not in constants and types.get(name, 1) in (1, 10, 16):
                names[name] = None
    return list(names)


def calibration_candidates(model: onnx.ModelProto, static_op_types: Iterable[str]) -> list[str]:
    """Every activation a static quantization of this model might need a range for."""
    types = set(static_op_types) | FOLLOW_OPS
    return activation_tensors(
        model, [node.name for node in model.graph.node if node.op_type in types]
    )


def limited_feeds(
    model: onnx.ModelProto, dataloader: Iterable[Any] | None, max_samples: int
) -> Iterator[dict[str, np.ndarray]]:
    """Validated feeds, cut so that exactly ``max_samples`` samples (or all) are used."""
    seen = 0
    for feed, _ in iter_batches(model, dataloader, max_samples):
        first = next(iter(feed.values()))
        count = int(first.shape[0]) if first.ndim else 1
        if max_samples and first.ndim and seen + count > max_samples:
            keep = max_samples - seen
            feed = {name: value[:keep] for name, value in feed.items()}
            count = keep
        seen += count
        yield feed


def statistics(
    model: onnx.ModelProto,
    model_key: str,
    tensor_names: list[str],
    dataloader: Iterable[Any] | None,
    max_samples: int,
    session_options: Any = None,
    memory_budget_bytes: int | None = None,
) -> CalibrationStats:
    """Calibration statistics for ``tensor_names``, from lpq's run cache: keyed by the
    model, the *content* of the data actually used, the sample count and the tensors, so
    every trial of a run (and every worker) calibrates once."""
    from .calibration import DEFAULT_MEMORY_BUDGET, CalibrationStats, collect_statistics

    if dataloader is not None and iter(dataloader) is dataloader:  # one-shot iterator
        dataloader = list(dataloader)
    data_key = lpq.content_key(
        [sorted(feed.items()) for feed in limited_feeds(model, dataloader, max_samples)]
    )  # also validates the data (DataError when empty or misfit)
    key = lpq.content_key(model_key, data_key, max_samples, tensor_names)

    def compute() -> CalibrationStats:
        return collect_statistics(
            model,
            tensor_names,
            limited_feeds(model, dataloader, max_samples),
            session_options=session_options,
            memory_budget_bytes=memory_budget_bytes or DEFAULT_MEMORY_BUDGET,
        )

    return lpq.run_cache().get_or_compute(
        "onnxrt-calibration",
        key,
        compute,
        save=lambda stats, handle: stats.write(handle),
        load=CalibrationStats.load,
    )
