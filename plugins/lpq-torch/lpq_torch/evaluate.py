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

from lpq import DataError, EvalResult, LatencyMeasurer, Metric, batch_size

from .data import call_args, labels_to_numpy, outputs_to_numpy, require_module, run, split

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
    if not isinstance(module, torch.fx.GraphModule):
        was_training = module.training
        module.eval()
    for metric in metrics:
        metric.reset()
    batches = samples = 0
    try:
        with torch.inference_mode(), inductor_freezing() if use_compile else _null():
            for item in dataloader:
                if iteration is not None and batches >= iteration:
                    break
                inputs, labels = split(item)
                args = call_args(inputs)
                if measurer is not None:
                    with measurer.measure():
                        outputs = run(forward, args)
                else:
                    outputs = run(forward, args)
                preds, labels = outputs_to_numpy(outputs), labels_to_numpy(labels)
                if postprocess is not None:
                    preds, labels = postprocess(preds, labels)
                for metric in metrics:
                    metric.update(preds, labels)
                batches += 1
                samples += batch_size(inputs)
    finally:
        if not isinstance(module, torch.fx.GraphModule):
            module.train(was_training)
    if batches == 0:
        raise DataError("the evaluation dataloader yielded no batches", hint="pass non-empty data")
    return EvalResult(
        metrics={metric.name: float(metric.result()) for metric in metrics},
        latency_ms=measurer.median_ms if measurer is not None else None,
        batches=batches,
        samples=samples,
    )


@contextlib.contextmanager
def _null() -> Iterator[None]:
    yield
