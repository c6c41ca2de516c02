"""Which tensors to calibrate, with which algorithm, and the collector MXNet fills.

MXNet calibrates two kinds of tensors: the output of every quantized op that requantizes
it (a fused Convolution / FullyConnected group, elemwise_add) and every float tensor it
must quantize in front of a quantized op (graph inputs, outputs of float ops). An op's
activation settings (algorithm, dtype) apply to its own output; a float tensor entering
a quantized op takes the settings of that op. Tensor names are those of the fused fp32
graph, which is what quantize_net_v2's calibration Module runs and reports to the
collector.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lpq import OpConfig

from ..framework import mxnet
from ..graph import REQUANTIZING_OPS, groups
from .algorithms import NEEDS_HISTOGRAM, Stats, tensor_range


@dataclass(frozen=True)
class TensorPlan:
    """How one tensor is calibrated: the range algorithm, and whether it must be signed
    int8 even when it never goes negative (activation dtype ``int8``)."""

    algorithm: str
    signed: bool


def _plan(cfg: OpConfig) -> TensorPlan:
    act = cfg.activation
    return TensorPlan(
        algorithm=act.algorithm if act else "minmax",
        signed=bool(act and act.dtype == "int8"),
    )


def plan_tensors(
    fused: dict[str, Any], inputs: Sequence[str], chosen: Mapping[str, OpConfig]
) -> dict[str, TensorPlan]:
    """Tensor name -> plan, for every tensor a quantized op produces or consumes.

    :param fused: the fp32 graph as oneDNN partitions it (JSON).
    :param chosen: fp32 op name -> config of every op to quantize.
    """
    plans: dict[str, TensorPlan] = {}
    consumer_plans: dict[str, TensorPlan] = {}
    for group in groups(fused):
        anchor = group.anchor
        cfg = chosen.get(anchor[0]) if anchor else None
        if cfg is None:
            continue
        if anchor is not None and anchor[1] in REQUANTIZING_OPS:
            plans[f"{group.node}_output"] = _plan(cfg)
        for tensor in group.inputs:
            consumer_plans.setdefault(tensor, _plan(cfg))
    # A float tensor entering a quantized op: a graph input or a float op's output.
    producers = {g.node for g in groups(fused)}
    for tensor, plan in consumer_plans.items():
        name = f"{tensor}_output" if tensor in producers else tensor
        if tensor in inputs or tensor in producers:
            plans.setdefault(name, plan)
    return plans


class Collector:
    """The ``LayerOutputCollector`` given to ``quantize_net_v2(calib_mode="customize")``.

    MXNet calls :meth:`collect` with every tensor of every calibration batch and reads
    :attr:`min_max_dict` once afterwards; tensors without a plan are skipped.
    """

    def __init__(self, plans: Mapping[str, TensorPlan]) -> None:
        self.plans = dict(plans)
        self.stats: dict[str, Stats] = {}

    def collect(self, name: Any, handle: Any) -> None:
        mx = mxnet()
        name = mx.base.py_str(name)
        plan = self.plans.get(name)
        if plan is None:
            return
        array = mx.nd.NDArray(ctypes.cast(handle, mx.base.NDArrayHandle), writable=False)
        self.stats.setdefault(name, Stats()).update(
            array.asnumpy(), with_histogram=plan.algorithm in NEEDS_HISTOGRAM
        )

    @property
    def min_max_dict(self) -> dict[str, tuple[float, float]]:
        """The calibrated range of every tensor seen, as MXNet's calib_graph reads it."""
        return {
            name: tensor_range(stats, self.plans[name].algorithm, self.plans[name].signed)
            for name, stats in self.stats.items()
        }
