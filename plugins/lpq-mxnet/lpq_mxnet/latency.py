"""Latency-aware quantization for MXNet: lpq-mxnet's backend for :mod:`lpq.latency`.

The search is core's (:func:`lpq.latency.decide`); this module answers its questions for
Gluon blocks:

* ``ops()``: the int8 ops of the plan (fp32 op names, MXNet op types, graph order);
* ``build(keep_float)``: the int8 block with those ops left out of quantization (more
  ``exclude_layers`` in ``quantize_net_v2``), the fused fp32 block when all are;
* ``runner(candidate)``: one forward of the hybridized block (``static_alloc``,
  ``static_shape``), engine drained, on the first calibration sample repeated to
  ``latency_batch_size`` (default 1).

MXNet's oneDNN kernels use the OpenMP thread pool (``OMP_NUM_THREADS``); decisions are
cached on disk (:mod:`lpq.latency.cache`) per model, plan, shapes, machine, that thread
setting and MXNet's version.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lpq import ConfigError, OpConfig, TuneConfig, content_key
from lpq.latency import DEFAULT_MARGIN, Decision, announce, decide, runner_timer
from lpq.latency import cache as latency_cache

from . import data
from .framework import mxnet

log = logging.getLogger("lpq.mxnet")

FRAMEWORK = "mxnet"
#: The attribute a block built by latency-aware quantization carries its decision in.
LATENCY_ATTR = "_lpq_latency"


class GluonBackend:
    """Candidates are hybridized blocks; see the module doc."""

    def __init__(
        self,
        ops: Sequence[tuple[str, str]],
        build: Callable[[frozenset[str]], Any],
        inputs: list[Any],
    ) -> None:
        self._ops, self._build, self.inputs = list(ops), build, inputs

    def ops(self) -> list[tuple[str, str]]:
        return self._ops

    def build(self, keep_float: frozenset[str]) -> Any:
        return self._build(keep_float)

    def runner(self, candidate: Any) -> Callable[[], object]:
        mx, inputs = mxnet(), self.inputs

        def run() -> None:
            candidate(*inputs)
            mx.nd.waitall()

        return run


def latency_batch_size(options: dict[str, Any]) -> int:
    value = options.get("latency_batch_size", 1)
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).isdigit():
        raise ConfigError(
            f"latency_batch_size must be a whole number >= 1, not {value!r}",
            hint="latency_batch_size=1",
        )
    if int(value) < 1:
        raise ConfigError("latency_batch_size must be >= 1", hint="latency_batch_size=1")
    return int(value)


def choose(
    *,
    ops: Sequence[tuple[str, str]],
    chosen: dict[str, OpConfig],
    arrays: list[np.ndarray],
    options: dict[str, Any],
    model_digest: str,
    build_int8: Callable[[dict[str, OpConfig]], Any],
    reference: Any,
    planned: Any,
) -> tuple[Decision, Any]:
    """The decision for this plan and the block it leaves (``planned`` when it keeps
    every op int8). ``ops``: the model's tunable ops in graph order."""
    types = dict(ops)
    order = [(name, op_type) for name, op_type in ops if name in chosen]
    batch = latency_batch_size(options)
    margin = float(options.get("latency_margin", DEFAULT_MARGIN))
    samples = [np.repeat(a[:1], batch, axis=0) for a in arrays]
    inputs = [data.to_nd(a) for a in samples]

    def build(keep_float: frozenset[str]) -> Any:
        if not keep_float:
            return planned
        rest = {name: cfg for name, cfg in chosen.items() if name not in keep_float}
        return build_int8(rest) if rest else reference

    backend = GluonBackend(order, build, inputs)
    plan = TuneConfig(ops={(n, types[n]): chosen[n] for n, _ in order}).to_json()
    ctx = latency_cache.context(
        framework=FRAMEWORK,
        framework_version=str(mxnet().__version__),
        model_digest=model_digest,
        plan=plan,
        shapes=[list(a.shape) for a in samples],
        threads=_omp_threads(),
        margin=margin,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        decision = latency_cache.cached_decide(
            lambda: decide(
                backend, timer=runner_timer(backend, seed=0), margin=margin, log=log.info
            ),
            latency_cache.folder(FRAMEWORK, options),
            ctx,
        )
    announce(decision, FRAMEWORK, log)
    return decision, build(frozenset(decision.keep_float))


def graph_digest(graph: Any) -> str:
    """The fp32 graph and its parameter values, hashed."""
    params = {name: value.asnumpy() for name, value in sorted(graph.params.items())}
    return content_key(graph.symbol.tojson(), params)


def _omp_threads() -> int | None:
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() else None
