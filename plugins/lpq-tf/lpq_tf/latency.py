"""Latency-aware quantization for LiteRT: lpq-tf's backend for :mod:`lpq.latency`.

The search is core's (:func:`lpq.latency.decide`); this module answers its three
questions for ``.tflite`` candidates:

* ``ops()``: the ops the plan quantizes (lpq names, TFLite op types, graph order);
* ``build(keep_float)``: the quantized flatbuffer with those ops in fp32 (the same
  quantizer route as the plan, with more fallbacks), the float ``.tflite`` when all are;
* ``runner(candidate)``: one ``invoke()`` of a LiteRT interpreter for it, inputs set
  once, at the model's input shape with batch ``latency_batch_size`` (default 1, the usual
  LiteRT deployment) and ``num_threads`` threads (default 1).

Decisions are cached on disk (:mod:`lpq.latency.cache`) per float model, plan, shapes,
machine, threads and LiteRT version. Off for integer-only models (``io_dtype=int8``:
microcontrollers and NPUs, where this CPU's timings say nothing) and for ``.tflite``
plans with nothing quantized.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

import numpy as np

from lpq import ConfigError, OpConfig, TuneConfig, content_key
from lpq.latency import DEFAULT_MARGIN, Decision, announce, decide, enabled, runner_timer
from lpq.latency import cache as latency_cache

from .calibration import Samples
from .data import InputSpec
from .runtime import create_interpreter, input_specs

log = logging.getLogger("lpq.tf")

FRAMEWORK = "tf"


def wanted(options: dict[str, Any], io_dtype: str) -> bool:
    """Whether to search: the ``latency_aware`` option, never for integer-only models."""
    return enabled(options) and io_dtype != "int8"


def positive_int(options: dict[str, Any], name: str, default: int) -> int:
    value = options.get(name, default)
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1 or isinstance(value, bool):
        raise ConfigError(f"{name} must be a whole number >= 1, not {value!r}", hint=f"{name}=1")
    return number


class LiteRtBackend:
    """Candidates are ``.tflite`` bytes; see the module doc."""

    def __init__(
        self,
        ops: Sequence[tuple[str, str]],
        build: Callable[[frozenset[str]], bytes],
        arrays: list[np.ndarray],
        threads: int,
    ) -> None:
        self._ops, self._build, self.arrays, self.threads = list(ops), build, arrays, threads

    def ops(self) -> list[tuple[str, str]]:
        return self._ops

    def build(self, keep_float: frozenset[str]) -> bytes:
        return self._build(keep_float)

    def runner(self, candidate: bytes) -> Callable[[], object]:
        interpreter = create_interpreter(candidate, self.threads)
        specs = input_specs(interpreter)
        for spec, array in zip(specs, self.arrays):
            interpreter.resize_tensor_input(spec.index, list(array.shape), strict=False)
        interpreter.allocate_tensors()
        for spec, array in zip(specs, self.arrays):
            interpreter.set_tensor(spec.index, array.astype(spec.dtype, copy=False))
        invoke: Callable[[], object] = interpreter.invoke
        return invoke


def measuring_arrays(float_tflite: bytes, samples: Samples | None, batch: int) -> list[np.ndarray]:
    """One input batch: the first calibration sample (random data without one, e.g. for
    dynamic-range plans), repeated to ``batch``; fixed batch dimensions are kept."""
    specs: list[InputSpec] = input_specs(create_interpreter(float_tflite))
    rng = np.random.default_rng(0)
    arrays = []
    for position, spec in enumerate(specs):
        if samples is not None and len(samples):
            one = np.asarray(samples.items[0][position])
        else:
            shape = tuple(1 if d is None else d for d in spec.shape)
            one = rng.standard_normal(shape).astype(spec.dtype)
        fixed = spec.shape[0] if spec.shape else None
        repeat = 1 if fixed is not None or one.ndim == 0 else batch
        arrays.append(np.repeat(one, repeat, axis=0) if repeat > 1 else one)
    return arrays


def choose(
    *,
    float_tflite: bytes,
    configs: dict[str, OpConfig],
    op_types: dict[str, str],
    samples: Samples | None,
    options: dict[str, Any],
    convert: Callable[[dict[str, OpConfig]], bytes],
    planned: bytes,
) -> tuple[Decision, bytes]:
    """The decision for this plan and the model it leaves (``planned`` when it keeps
    every op quantized)."""
    order = [name for name in op_types if name in configs and configs[name].quantized]
    ops = [(name, op_types[name]) for name in order]
    threads = positive_int(options, "num_threads", 1)
    batch = positive_int(options, "latency_batch_size", 1)
    margin = float(options.get("latency_margin", DEFAULT_MARGIN))
    arrays = measuring_arrays(float_tflite, samples, batch)

    def build(keep_float: frozenset[str]) -> bytes:
        if not keep_float:
            return planned
        if keep_float >= set(order):
            return float_tflite
        return convert(
            {n: OpConfig.fallback() if n in keep_float else c for n, c in configs.items()}
        )

    backend = LiteRtBackend(ops, build, arrays, threads)
    plan = TuneConfig(ops={(n, op_types[n]): configs[n] for n in order}).to_json()
    ctx = latency_cache.context(
        framework=FRAMEWORK,
        framework_version=_versions(),
        model_digest=content_key(float_tflite),
        plan=plan,
        shapes=[list(a.shape) for a in arrays],
        threads=threads,
        margin=margin,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the converter's deprecation chatter per candidate
        decision = latency_cache.cached_decide(
            lambda: decide(
                backend,
                timer=runner_timer(backend, seed=0),
                margin=margin,
                log=log.info,
            ),
            latency_cache.folder(FRAMEWORK, options),
            ctx,
        )
    announce(decision, FRAMEWORK, log)
    return decision, build(frozenset(decision.keep_float))


def _versions() -> str:
    found = []
    for dist in ("tensorflow", "ai-edge-litert"):
        try:
            found.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            found.append(f"{dist} -")
    return ", ".join(found)
