"""Calibration: per-tensor statistics and the registry of range algorithms.

lpq-mxnet calibrates with its own collector (``quantize_net_v2(calib_mode="customize")``)
so that each tensor gets the algorithm and signedness its op's tune_cfg asks for, where
MXNet's built-in modes apply one algorithm to the whole graph. An algorithm is one
function registered under the name the capability YAML uses; adding one is a function
plus a YAML line.
"""

from __future__ import annotations

from .algorithms import ALGORITHMS, Stats, register, tensor_range
from .collector import Collector, TensorPlan, plan_tensors

__all__ = [
    "ALGORITHMS",
    "Collector",
    "Stats",
    "TensorPlan",
    "plan_tensors",
    "register",
    "tensor_range",
]
