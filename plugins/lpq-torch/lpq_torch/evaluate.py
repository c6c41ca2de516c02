"""lpq_evaluate: run a model over a dataloader, score metrics, time the forward pass.

Compilation policy: the int8 speedup only exists after ``torch.compile`` (Inductor with
freezing lowers the q/dq graph to oneDNN int8 kernels), but compiling costs seconds to
minutes. So the model is compiled **only when a latency measurer is passed** (a latency
number of an uncompiled PT2E graph would be meaningless); accuracy-only evaluation runs
eagerly, which computes the same quantized arithmetic. ``LPQ_TORCH_COMPILE=0`` turns
compilation off entirely. Hugging Face causal LMs and weight-only models always run
eagerly: the weight-only kernels are aten ops that compilation does not speed up, and
compiling a decoder costs minutes a trial.

Compilation falls back, and says so (a warning on the ``lpq.torch`` logger): Inductor
with freezing -> Inductor without freezing (freezing failed on an LSTM cell) -> eager.
A failure is told apart from bad data by running the same batch eagerly: only if that
fails too is it the data's fault (:class:`lpq.DataError`).

Timing: the accuracy pass runs every batch once (it also warms the compiled model up).
Then up to :data:`TIMED_BATCHES` batches are run :data:`WARMUP` more times untimed and
timed over rounds until :data:`MIN_ROUNDS` rounds and :data:`MIN_SECONDS` have passed
(at most :data:`MAX_ROUNDS`); the measurer gets each batch's median run and reports the
median over batches. One timing of each batch, as a plain accuracy pass gives, swung by
2x on this shared machine, hence the rounds. The median, not the fastest run: the
fastest of many runs of a sub-millisecond model and of a 100 ms model are not equally
far from their typical time under load, so speedups from fastest runs disagreed with
interleaved benchmarks (which report medians) by 10-25%; lpq-core times the fp32 model
and the chosen one alternately at the end of ``fit``, so both medians see the same load.
"""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from lpq import (
    DataError,
    EvalResult,
    LatencyMeasurer,
    LpqError,
    Metric,
    batch_size,
    evaluate_batches,
    split_batch,
)

from . import state
from .backends import simulate
from .data import CallArgs, call_args, labels_to_numpy, outputs_to_numpy, run
from .errors import framework_error, stage
from .info import TUNE_CFG_ATTR, WEIGHT_ONLY_ATTR
from .model_io import is_causal_lm, require_module

logger = logging.getLogger("lpq.torch")

WARMUP = 2
TIMED_BATCHES = 4
MIN_ROUNDS = 10
MAX_ROUNDS = 100
MIN_SECONDS = 2.0


def compile_enabled() -> bool:
    return os.environ.get("LPQ_TORCH_COMPILE", "1") not in ("0", "false", "no")


@contextlib.contextmanager
def inductor_freezing(enabled: bool = True) -> Iterator[None]:
    """Inductor freezing: constant-folds weights so int8 conv/linear get prepacked kernels."""
    import torch._inductor.config as inductor_config

    with inductor_config.patch(freezing=enabled):
        yield


class Forward:
    """The callable that runs a model for timing: compiled if it can be, else eager.

    Tries Inductor with freezing, then without, then eager, on the first batch; logs
    each fallback with torch's reason. The choice is kept in the run state.
    """

    LEVELS = ("inductor+freezing", "inductor", "eager")

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        eager = not compile_enabled() or hasattr(module, WEIGHT_ONLY_ATTR) or is_causal_lm(module)
        self.level = len(self.LEVELS) - 1 if eager else 0
        self.fn: Callable[..., Any] | None = None
        self.checked = False

    @property
    def mode(self) -> str:
        return self.LEVELS[self.level]

    def _build(self) -> Callable[..., Any]:
        if self.mode == "eager":
            return self.module
        # Static shapes: each batch size gets its own graph. With dynamic shapes, Inductor
        # freezing's layout choices broke on a smaller last batch (stride assertion).
        return torch.compile(self.module, dynamic=False)

    def __call__(self, args: CallArgs) -> Any:
        while True:
            if self.fn is None:
                self.fn = self._build()
            try:
                with inductor_freezing(self.mode == "inductor+freezing"):
                    result = run_model(self.fn, args)
                self.checked = True
                return result
            except LpqError:
                raise
            except Exception as exc:
                if self.checked or self.mode == "eager":
                    raise framework_error("evaluate", exc, f"{self.mode} run") from exc
                self._fall_back(exc, args)

    def _fall_back(self, exc: Exception, args: CallArgs) -> None:
        run_eager(self.module, args)  # raises if the model fails without compiling too
        failed = self.mode
        self.level += 1
        self.fn = None
        logger.warning(
            "lpq-torch: torch.compile (%s) failed, evaluating with %s instead: %s: %s",
            failed,
            self.mode,
            type(exc).__name__,
            str(exc).strip().splitlines()[0][:300] if str(exc).strip() else "",
        )


def run_model(fn: Callable[..., Any], args: CallArgs) -> Any:
    positional, keywords = args
    return fn(*positional, **keywords)


def run_eager(module: torch.nn.Module, args: CallArgs) -> Any:
    """Run without compiling. The user's fp32 model failing is the data's fault
    (:class:`lpq.DataError`); a model lpq made failing is lpq's or torch's (stage error)."""
    if hasattr(module, TUNE_CFG_ATTR):
        with stage("evaluate", "the quantized model (eager)"):
            return run_model(module, args)
    return run(module, args)


def forward_for(module: torch.nn.Module) -> Forward:
    found = state.current().compiled.get(module)
    if not isinstance(found, Forward):
        found = Forward(module)
        with contextlib.suppress(TypeError):
            state.current().compiled[module] = found
    return found


def evaluate(
    model: Any,
    dataloader: Iterable[Any],
    postprocess: Any,
    metrics: Sequence[Metric],
    measurer: LatencyMeasurer | None,
    iteration: int | None,
) -> EvalResult:
    """Score ``metrics`` over ``dataloader``; with a ``measurer``, also time the compiled model.

    A model simulating a backend scheme is never timed: its speed on this CPU says nothing
    about the backend's.
    """
    if simulate.is_simulated(model):
        measurer = None
    module = require_module(model)
    restore_training = not isinstance(module, torch.fx.GraphModule) and module.training
    if not isinstance(module, torch.fx.GraphModule):
        module.eval()
    forward = forward_for(module) if measurer is not None else None
    timed: list[CallArgs] = []

    def batches() -> Iterator[tuple[Any, Any]]:
        for item in dataloader:
            inputs, labels = split_batch(item)
            yield (call_args(inputs), batch_size(inputs)), labels_to_numpy(labels)

    def execute(prepared: tuple[CallArgs, int]) -> Any:
        args = prepared[0]
        if forward is not None:
            if len(timed) < TIMED_BATCHES:
                timed.append(args)
            return forward(args)
        return run_eager(module, args)

    try:
        with torch.inference_mode():
            result = evaluate_batches(
                batches(),
                execute,
                metrics,
                postprocess=postprocess,
                iteration=iteration,
                to_numpy=outputs_to_numpy,
                count=lambda prepared: prepared[1],
            )
            if forward is not None and measurer is not None:
                result.latency_ms = time_batches(forward, timed, measurer)
    finally:
        if restore_training:
            module.train(True)
    return result


def time_batches(forward: Forward, batches: list[CallArgs], measurer: LatencyMeasurer) -> float:
    """Warm up, then time rounds over ``batches``; the measurer gets each batch's median run
    and reports the median over batches (see the module doc for why the median)."""
    if not batches:
        raise DataError("the evaluation dataloader yielded no batches", hint="pass data")
    for _ in range(WARMUP):
        for args in batches:
            forward(args)
    runs: list[list[float]] = [[] for _ in batches]
    start = time.perf_counter()
    rounds = 0
    while rounds < MAX_ROUNDS and (
        rounds < MIN_ROUNDS or time.perf_counter() - start < MIN_SECONDS
    ):
        for i, args in enumerate(batches):
            began = time.perf_counter()
            forward(args)
            runs[i].append(time.perf_counter() - began)
        rounds += 1
    measurer.reset()
    measurer.samples.extend(statistics.median(times) for times in runs)
    median = measurer.median_ms
    assert median is not None
    return median
