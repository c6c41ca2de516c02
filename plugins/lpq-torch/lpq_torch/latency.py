"""Latency-aware quantization: keep in fp32 what int8 makes slower on this machine.

int8 is not faster everywhere. On Silero VAD's network (sub-millisecond, a 1-channel STFT
conv with a 256-tap kernel feeding a square root) the int8 graph compiled with Inductor was
slower than fp32 at batch 1 and only as fast at batch 8: the quantize/dequantize steps
around small convs cost more than the int8 kernels save. Whether an op wins depends on the
CPU, the thread count and the batch, so this module *measures*, with the compiled models
lpq's evaluation uses (:class:`lpq_torch.evaluate.Forward`), on the first calibration batch:

1. the plan against the fp32 model: clearly faster (under :data:`CLEAR_WIN` of its time),
   it is kept (the usual case; both compiled forwards are reused by the evaluation, so a
   trial pays nothing extra);
2. otherwise every comparison is made at the calibration batch *and* at batch 1 (small
   batches pay the quantize/dequantize steps most: VAD's int8 plan was 0.95x the fp32
   time at batch 8 and 1.5x at batch 1), taking the worse of the two: the plan is kept if
   faster by :data:`MARGIN`; else each op type in turn goes back to fp32, then (for models
   with at most :data:`MAX_SINGLE_OPS` quantized ops) each single op: a change is kept
   when the model gets faster by :data:`MARGIN`;
3. never slower than fp32: if the fp32 model still beats the result, every op stays fp32.

Comparisons are paired: the two models run alternately, each round's time ratio is
recorded, and the median ratio decides, so load drift on a shared machine hits both sides
alike. Decisions are kept in the run state per model, plan, input shape and thread count:
a tuning run asks for the same plan more than once.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import lpq
from lpq import ConfigError, OpConfig, TuneConfig

from . import evaluate, state
from .data import CallArgs

logger = logging.getLogger("lpq.torch")

#: A change must make the model this much faster (relative) to be kept.
MARGIN = 0.03
#: A plan taking less than this fraction of the fp32 time is kept without a batch-1 check.
CLEAR_WIN = 0.8
#: Single ops are tried only in models with at most this many quantized ops.
MAX_SINGLE_OPS = 8
MIN_ROUNDS = 10
MAX_ROUNDS = 200
MIN_SECONDS = 0.5


def wanted(tune_cfg: TuneConfig) -> bool:
    value = tune_cfg.options.get("latency_aware", False)
    if not isinstance(value, bool):
        raise ConfigError(
            f"latency_aware must be true or false, not {value!r}", hint="use true or false"
        )
    return value


def without(tune_cfg: TuneConfig, names: frozenset[str]) -> TuneConfig:
    """``tune_cfg`` with the ops ``names`` in fp32."""
    ops = {
        key: OpConfig.fallback() if key[0] in names else cfg for key, cfg in tune_cfg.ops.items()
    }
    return TuneConfig(ops, tune_cfg.calib_sampling_size, dict(tune_cfg.options))


def _plan_key(tune_cfg: TuneConfig, args: CallArgs) -> str:
    shapes = [tuple(v.shape) for v in [*args[0], *args[1].values()] if hasattr(v, "shape")]
    return f"{tune_cfg.to_json()}|{shapes}|{torch.get_num_threads()}"


def choose(
    module: torch.nn.Module,
    tune_cfg: TuneConfig,
    args: CallArgs,
    planned: torch.nn.Module,
    build: Callable[[TuneConfig], torch.nn.Module],
) -> torch.nn.Module:
    """``planned`` (the model per ``tune_cfg``) or a version with ops moved to fp32 that
    is faster on this machine (see the module doc)."""
    quantized = [key for key, cfg in tune_cfg.ops.items() if cfg.quantized]
    if not quantized:
        return planned
    if not evaluate.compile_enabled():
        logger.warning("lpq-torch: latency-aware quantization needs torch.compile; skipped")
        return planned
    decisions = state.current().latency.setdefault(module, {})
    key = _plan_key(tune_cfg, args)
    if key in decisions:
        names = decisions[key]
        return build(without(tune_cfg, names)) if names else planned
    names, chosen = _search(module, tune_cfg, args, planned, build, quantized)
    decisions[key] = names
    return chosen


def _search(
    module: torch.nn.Module,
    tune_cfg: TuneConfig,
    args: CallArgs,
    planned: torch.nn.Module,
    build: Callable[[TuneConfig], torch.nn.Module],
    quantized: list[tuple[str, str]],
) -> tuple[frozenset[str], torch.nn.Module]:
    """The ops to keep in fp32, and the model built that way."""
    ratio = paired_ratio(planned, module, args)
    if ratio < CLEAR_WIN:
        return frozenset(), planned
    shapes = [args] if _batch(args) <= 1 else [args, _first_sample(args)]

    def worse(a: torch.nn.Module, b: torch.nn.Module) -> float:
        return max(paired_ratio(a, b, shape) for shape in shapes)

    ratio = worse(planned, module)
    if ratio < 1 - MARGIN:
        return frozenset(), planned
    logger.warning(
        "lpq-torch: latency-aware: the int8 plan takes %.2fx the fp32 time (worse of batch "
        "%d and 1); trying ops in fp32",
        ratio,
        _batch(args),
    )
    every = frozenset(name for name, _ in quantized)
    by_type: dict[str, set[str]] = {}
    for name, op_type in quantized:
        by_type.setdefault(op_type, set()).add(name)
    groups = [frozenset(n) for _, n in sorted(by_type.items(), key=lambda kv: -len(kv[1]))]
    if len(every) <= MAX_SINGLE_OPS:
        groups += [frozenset([name]) for name, _ in quantized]
    current, names = planned, frozenset[str]()
    for group in groups:
        candidate_names = names | group
        if candidate_names in (names, every):
            continue  # nothing new, or all fp32 (decided last)
        candidate = build(without(tune_cfg, candidate_names))
        if worse(candidate, current) < 1 - MARGIN:
            current, names = candidate, candidate_names
    final = worse(current, module)
    if final >= 1.0:
        names = every
        current = build(without(tune_cfg, names))
    logger.warning(
        "lpq-torch: latency-aware: %s kept in fp32 (%.2fx the fp32 time before that)",
        ", ".join(sorted(names)) if names != every else "every op",
        final,
    )
    return names, current


def _batch(args: CallArgs) -> int:
    tensors = [v for v in [*args[0], *args[1].values()] if isinstance(v, torch.Tensor)]
    return int(tensors[0].shape[0]) if tensors and tensors[0].dim() > 0 else 1


def _first_sample(args: CallArgs) -> CallArgs:
    def one(value: Any) -> Any:
        return value[:1] if isinstance(value, torch.Tensor) and value.dim() > 0 else value

    return tuple(one(v) for v in args[0]), {k: one(v) for k, v in args[1].items()}


def paired_ratio(a: torch.nn.Module, b: torch.nn.Module, args: CallArgs) -> float:
    """Median over rounds of time(a) / time(b), the two run alternately (compiled)."""
    fa, fb = evaluate.forward_for(a), evaluate.forward_for(b)
    ratios: list[float] = []
    with torch.inference_mode():
        for _ in range(2):  # compile, then warm up
            fa(args)
            fb(args)
    # With parallel tuning workers: time with the machine to ourselves.
    with torch.inference_mode(), lpq.exclusive_timing():
        start = time.perf_counter()
        while len(ratios) < MAX_ROUNDS and (
            len(ratios) < MIN_ROUNDS or time.perf_counter() - start < MIN_SECONDS
        ):
            first, second = (fa, fb) if len(ratios) % 2 == 0 else (fb, fa)
            times = [_timed(first, args), _timed(second, args)]
            ta, tb = times if first is fa else times[::-1]
            ratios.append(ta / max(tb, 1e-9))
    return statistics.median(ratios)


def _timed(fn: Callable[[CallArgs], Any], args: CallArgs) -> float:
    began = time.perf_counter()
    fn(args)
    return time.perf_counter() - began
