"""lpq_evaluate: run a model over a dataloader, score metrics, time the forward pass.

Compilation policy: the int8 speedup only exists after ``torch.compile`` (Inductor with
freezing lowers the q/dq graph to oneDNN int8 kernels), but compiling costs seconds to
minutes. So the model is compiled **only when a latency measurer is passed** (a latency
number of an uncompiled PT2E graph would be meaningless); accuracy-only evaluation runs
eagerly, which computes the same quantized arithmetic. Compiled models are cached per
model object. ``LPQ_TORCH_COMPILE=0`` turns compilation off entirely.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from lpq import EvalResult, LatencyMeasurer, Metric, batch_size, evaluate_batches, split_batch

from .data import call_args, labels_to_numpy, outputs_to_numpy, require_module, run

_compiled: weakref.WeakKeyDictionary[torch.nn.Module, Callable[..., Any]] = (
    weakref.WeakKeyDictionary()
)


def compile_enabled() -> bool:
    return os.environ.get("LPQ_TORCH_COMPILE", "1") not in ("0", "false", "no")


@contextlib.contextmanager
def inductor_freezing() -> Iterator[None]:
    """Inductor freezing: constant-folds weights so int8 conv/linear get prepacked kernels."""
    import torch._inductor.config as inductor_config

    with inductor_config.patch(freezing=True):
        yield


def compiled(model: torch.nn.Module) -> Callable[..., Any]:
    """``torch.compile(model)``, cached; call it inside :func:`inductor_freezing`."""
    found = _compiled.get(model)
    if found is None:
        # Static shapes: each batch size gets its own graph. With dynamic shapes, Inductor
        # freezing's layout choices broke on a smaller last batch (stride assertion).
        found = torch.compile(model, dynamic=False)
        _compiled[model] = found
    return found


def evaluate(
    model: Any,
    dataloader: Iterable[Any],
    postprocess: Any,
    metrics: Sequence[Metric],
    measurer: LatencyMeasurer | None,
    iteration: int | None,
) -> EvalResult:
    module = require_module(model)
    use_compile = measurer is not None and compile_enabled()
    forward: Callable[..., Any] = compiled(module) if use_compile else module
    restore_training = not isinstance(module, torch.fx.GraphModule) and module.training
    if not isinstance(module, torch.fx.GraphModule):
        module.eval()

    def batches() -> Iterator[tuple[Any, Any]]:
        for item in dataloader:
            inputs, labels = split_batch(item)
            yield (call_args(inputs), batch_size(inputs)), labels_to_numpy(labels)

    try:
        with torch.inference_mode(), inductor_freezing() if use_compile else _null():
            return evaluate_batches(
                batches(),
                lambda prepared: run(forward, prepared[0]),
                metrics,
                postprocess=postprocess,
                measurer=measurer,
                iteration=iteration,
                to_numpy=outputs_to_numpy,
                count=lambda prepared: prepared[1],
            )
    finally:
        if restore_training:
            module.train(True)


@contextlib.contextmanager
def _null() -> Iterator[None]:
    yield
