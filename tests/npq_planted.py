"""npq (``npq_adaptor``) plus an honest ``lpq_quantized_ops``, with issue 28's bugs planted.

Clean, this adaptor passes every conformance check, the new ones included. ``NPQ_PLANT``
plants one bug the suite missed before 0.2:

* ``identity`` - quantize returns the fp32 model, while ``lpq_quantized_ops`` says int8;
* ``ignores_labels`` - evaluate scores the model against its own predictions;
* ``unknown_op`` - the capability YAML also names ``FancyMatMul``, an op type npq lacks.

Everything else is npq_adaptor's own hooks, re-exported so that registering this module
registers them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import npq_adaptor
from npq_adaptor import (
    CAPABILITY_YAML,
    FRAMEWORK,
    OPS,
    SUFFIX,
    NpqModel,
    lpq_detect_framework,
    lpq_inspect_tensor,
    lpq_load_model,
    lpq_query_fw_capability,
    lpq_save_model,
)

import lpq

__all__ = [
    "lpq_detect_framework",
    "lpq_inspect_tensor",
    "lpq_load_model",
    "lpq_query_fw_capability",
    "lpq_save_model",
]

#: The op types npq really has (what its conformance subclass's ``known_op_types`` says).
KNOWN_OP_TYPES = frozenset({"MatMul"})
#: The ``unknown_op`` plant's capability file, installed next to this module.
UNKNOWN_OP_CAPABILITY = Path(__file__).with_name("npq_unknown_op.yaml")
UNKNOWN_OP_YAML = CAPABILITY_YAML.replace("int8: [MatMul]", "int8: [MatMul, FancyMatMul]")


def plant(name: str) -> bool:
    return os.environ.get("NPQ_PLANT") == name


@dataclass
class ClaimingModel(NpqModel):
    """The identity quantizer's result: fp32 weights, no activation ranges, and a claim."""

    claimed: set[str] = field(default_factory=set)


@lpq.hookimpl
def lpq_register_adaptors(register: Any) -> None:
    capability = UNKNOWN_OP_CAPABILITY if plant("unknown_op") else npq_adaptor.CAPABILITY
    register(lpq.AdaptorInfo(FRAMEWORK, "numpy", [capability], model_suffixes=(SUFFIX,)))


@lpq.hookimpl
def lpq_quantize(framework: str, model: Any, tune_cfg: Any, calib_dataloader: Any) -> Any:
    if framework != FRAMEWORK:
        return None
    quantized = npq_adaptor.lpq_quantize(framework, model, tune_cfg, calib_dataloader)
    if plant("identity"):  # calibrates (so bad data still fails), then returns fp32
        source = npq_adaptor._load(model)
        claimed = {name for (name, _), op in tune_cfg.ops.items() if op.quantized}
        return ClaimingModel(dict(source.weights), claimed=claimed)
    return quantized


@lpq.hookimpl
def lpq_quantized_ops(framework: str, model: Any) -> dict[str, str] | None:
    """Read from the model: an op runs int8 when it has an activation range (or, for the
    identity plant, when its config said so)."""
    if framework != FRAMEWORK:
        return None
    npq = npq_adaptor._load(model)
    quantized = npq.claimed if isinstance(npq, ClaimingModel) else set(npq.qparams)
    return {op: "int8" if op in quantized else "fp32" for op, _ in OPS}


@lpq.hookimpl
def lpq_evaluate(
    framework: str, model: Any, dataloader: Any, postprocess: Any, metrics: Any, measurer: Any,
    iteration: Any,
) -> Any:  # fmt: skip
    if framework != FRAMEWORK:
        return None
    if not plant("ignores_labels"):
        return npq_adaptor.lpq_evaluate(
            framework, model, dataloader, postprocess, metrics, measurer, iteration
        )
    npq = npq_adaptor._load(model)
    own = ((x, npq.run(x).argmax(axis=1)) for x, _ in npq_adaptor._batches(dataloader))
    return lpq.evaluate_batches(
        own, npq.run, metrics, postprocess=postprocess, measurer=measurer, iteration=iteration
    )
