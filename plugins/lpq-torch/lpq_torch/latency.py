"""Latency-aware quantization for PyTorch: lpq-torch's backend for :mod:`lpq.latency`.

int8 is not faster everywhere. On Silero VAD's network (sub-millisecond, a 1-channel STFT
conv with a 256-tap kernel feeding a square root) the int8 graph compiled with Inductor was
slower than fp32 at batch 1 and only as fast at batch 8: the quantize/dequantize steps
around small convs cost more than the int8 kernels save. The search is core's
(:func:`lpq.latency.decide`); this module answers its questions with the compiled models
lpq's evaluation uses (:class:`lpq_torch.evaluate.Forward`):

* ``ops()``: the ops the tune_cfg quantizes, ``(name, op type)``, in its order;
* ``build(keep_float)``: the PT2E model with those ops in fp32 (the planned model when
  none is, the fp32 model when all are);
* ``runner(candidate)``: one compiled forward under ``torch.inference_mode()``.

Timing (:func:`worse_timer`): every comparison is timed at the first calibration batch
*and* at batch 1 (small batches pay the quantize/dequantize steps most: VAD's int8 plan was
0.95x the fp32 time at batch 8 and 1.5x at batch 1), and the shape where the more
quantized candidate fares worse decides; batch 1 is skipped when the calibration batch
already shows that candidate clearly faster (under ``CLEAR_WIN`` of the other's time,
noise included), so a clearly winning plan costs one fp32 and one int8 compile, both
reused by the evaluation. Timing holds :func:`lpq.exclusive_timing` (parallel tuning
workers wait); compiling happens before it. The result must be measured faster than fp32
at that worse shape, or every op goes back to fp32 (``float_unless_faster``: a wide noise
on a loaded machine does not keep a result measured slower).

Decisions are cached (:mod:`lpq.latency.cache`) per model weights, plan, shapes, machine,
threads and torch version; the returned model carries the decision's JSON in
:data:`LATENCY_ATTR`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

import lpq
from lpq import TuneConfig, content_key
from lpq.latency import (
    DEFAULT_MARGIN,
    Decision,
    Timer,
    Timing,
    announce,
    decide,
    enabled,
    interleaved,
)
from lpq.latency import cache as latency_cache
from lpq.latency.search import CLEAR_WIN

from . import evaluate, state
from .data import CallArgs

logger = logging.getLogger("lpq.torch")

FRAMEWORK = "torch"
#: The attribute a model built by latency-aware quantization carries its decision in.
LATENCY_ATTR = "_lpq_latency"


def wanted(tune_cfg: TuneConfig) -> bool:
    """The ``latency_aware`` option (:func:`lpq.latency.enabled`)."""
    return enabled(tune_cfg.options)


class TorchBackend:
    """Candidates are ``nn.Module`` s; see the module doc."""

    def __init__(
        self,
        ops: Sequence[tuple[str, str]],
        build: Callable[[frozenset[str]], torch.nn.Module],
        args: CallArgs,
    ) -> None:
        self._ops, self._build, self.args = list(ops), build, args

    def ops(self) -> list[tuple[str, str]]:
        return self._ops

    def build(self, keep_float: frozenset[str]) -> torch.nn.Module:
        return self._build(keep_float)

    def runner(
        self, candidate: torch.nn.Module, args: CallArgs | None = None
    ) -> Callable[[], object]:
        forward, at = evaluate.forward_for(candidate), self.args if args is None else args

        def run() -> object:
            with torch.inference_mode():
                return forward(at)

        return run


def time_at(backend: TorchBackend, candidates: Mapping[str, Any], args: CallArgs) -> Timing:
    """``candidates`` timed interleaved at ``args``: compiled and warmed up first, then
    timed with the machine to ourselves (:func:`lpq.exclusive_timing`)."""
    runs = {label: backend.runner(candidate, args) for label, candidate in candidates.items()}
    for _ in range(2):  # compile, then warm up: outside the exclusive block
        for run in runs.values():
            run()
    with torch.inference_mode(), lpq.exclusive_timing():
        return interleaved(runs, warmup=1, seed=0)


def worse_timer(
    backend: TorchBackend, shapes: Sequence[CallArgs], clear_win: float = CLEAR_WIN
) -> Timer:
    """Times each comparison at every shape in ``shapes`` and returns the timing where
    ``current`` (the more quantized candidate) fares worse, i.e. the smallest paired
    ratio candidate / current. Later shapes are skipped when the first already shows
    ``current`` clearly faster (under ``clear_win`` of the candidate's time, noise
    included). A comparison timed again (core pools close calls) is timed at the shape
    chosen the first time, so pooled rounds are of one shape."""
    chosen: dict[tuple[int, int], int] = {}

    def timer(candidates: Mapping[str, Any]) -> Timing:
        pair = (id(candidates["current"]), id(candidates["candidate"]))
        if pair in chosen:  # both are alive in decide()'s build cache: ids are stable
            return time_at(backend, candidates, shapes[chosen[pair]])
        worst: tuple[int, Timing] | None = None
        for index, args in enumerate(shapes):
            timing = time_at(backend, candidates, args)
            ratio = timing.ratio("candidate", "current")
            if worst is None or ratio < worst[1].ratio("candidate", "current"):
                worst = (index, timing)
            if index == 0 and (1.0 + timing.noise("candidate", "current")) / ratio < clear_win:
                break
        assert worst is not None
        chosen[pair] = worst[0]
        return worst[1]

    return timer


def choose(
    module: torch.nn.Module,
    tune_cfg: TuneConfig,
    args: CallArgs,
    planned: torch.nn.Module,
    build: Callable[[TuneConfig], torch.nn.Module],
) -> tuple[Decision | None, torch.nn.Module]:
    """The decision for ``planned`` (the model per ``tune_cfg``) and the model it leaves:
    ``planned``, or a version with ops in fp32 that is faster on this machine. No decision
    when nothing is quantized or torch.compile is off."""
    ops = [key for key, cfg in tune_cfg.ops.items() if cfg.quantized]
    if not ops:
        return None, planned
    if not evaluate.compile_enabled():
        logger.warning("lpq-torch: latency-aware quantization needs torch.compile; skipped")
        return None, planned
    every = frozenset(name for name, _ in ops)

    def candidate(keep_float: frozenset[str]) -> torch.nn.Module:
        """What is timed: the user's fp32 model stands for "every op in fp32"."""
        return module if keep_float >= every else result(keep_float)

    def result(keep_float: frozenset[str]) -> torch.nn.Module:
        """What is returned: lpq's own graph (the user's model is never modified)."""
        return build(tune_cfg.with_fallbacks(keep_float)) if keep_float else planned

    margin = float(tune_cfg.options.get("latency_margin", DEFAULT_MARGIN))
    shapes = [args] if batch_size(args) <= 1 else [args, first_sample(args)]
    backend = TorchBackend(ops, candidate, args)
    ctx = latency_cache.context(
        framework=FRAMEWORK,
        framework_version=torch.__version__,
        model_digest=model_digest(module),
        plan=TuneConfig(
            {key: tune_cfg.ops[key] for key in ops},
            tune_cfg.calib_sampling_size,
            {k: v for k, v in tune_cfg.options.items() if not k.startswith("latency_")},
        ).to_json(),
        shapes=[_shapes(s) for s in shapes],
        threads=torch.get_num_threads(),
        margin=margin,
    )
    decision = latency_cache.cached_decide(
        lambda: decide(
            backend,
            timer=worse_timer(backend, shapes),
            margin=margin,
            log=logger.info,
            float_unless_faster=True,  # lpq-torch's rule: fp32 unless measured faster
        ),
        latency_cache.folder(FRAMEWORK, tune_cfg.options),
        ctx,
    )
    announce(decision, FRAMEWORK, logger)
    return decision, result(frozenset(decision.keep_float))


def model_digest(module: torch.nn.Module) -> str:
    """The fp32 model's class, structure and weights, hashed; remembered in the run state
    while no weight is replaced or changed in place."""
    tensors = [*module.state_dict(keep_vars=True).items()]
    version = tuple((name, t.data_ptr(), t._version) for name, t in tensors)
    digests = state.current().digests
    found = digests.get(module)
    if found is not None and found[0] == version:
        return found[1]
    weights = {
        name: [str(t.dtype), list(t.shape), _bytes(t)]
        for name, t in tensors
        if isinstance(t, torch.Tensor)
    }
    kind = f"{type(module).__module__}.{type(module).__qualname__}"
    digest = content_key(kind, repr(module), weights)
    with contextlib.suppress(TypeError):  # a module that refuses weak references
        digests[module] = (version, digest)
    return digest


def _bytes(tensor: torch.Tensor) -> Any:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    try:
        return flat.view(torch.uint8).numpy()
    except (RuntimeError, TypeError):  # a dtype with no byte view (quantized tensors)
        return flat.dequantize().float().numpy() if flat.is_quantized else repr(flat.tolist())


def _shapes(args: CallArgs) -> list[Any]:
    return [list(v.shape) for v in [*args[0], *args[1].values()] if hasattr(v, "shape")]


def batch_size(args: CallArgs) -> int:
    tensors = [v for v in [*args[0], *args[1].values()] if isinstance(v, torch.Tensor)]
    return int(tensors[0].shape[0]) if tensors and tensors[0].dim() > 0 else 1


def first_sample(args: CallArgs) -> CallArgs:
    def one(value: Any) -> Any:
        return value[:1] if isinstance(value, torch.Tensor) and value.dim() > 0 else value

    return tuple(one(v) for v in args[0]), {k: one(v) for k, v in args[1].items()}
