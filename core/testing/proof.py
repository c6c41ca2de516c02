"""Checks that quantization really happened (issue 28: an adaptor whose quantize left every
layer fp32 while ``lpq_quantized_ops`` said int8 passed 43 of 43 checks).

Three views of one default-config model, each through a hook every adaptor has:

* what it *says*: ``lpq_quantized_ops`` reports at least one op in an integer precision;
* what it *holds*: the weights of ops reported int8, read back with ``lpq_inspect_tensor``
  (dequantized, keyed by fp32 names), lie on an integer grid and differ from fp32's;
* what it *computes*: its outputs on the calibration batches differ from fp32's (an
  identity quantizer reproduces them bit for bit).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .arrays import first
from .grid import on_grid
from .introduced import ConformanceFailure, not_run
from .subject import Subject

#: Precisions that mean "quantized" in ``lpq_quantized_ops`` answers.
INTEGER_PRECISIONS = frozenset({"int8", "uint8", "int4", "uint4"})
#: Precisions whose weights must lie on an 8-bit grid (int4 may be block-wise).
EIGHT_BIT = frozenset({"int8", "uint8"})


def offers_quantization(subject: Subject) -> bool:
    cap = subject.capability
    return any(cap.default_op_config(key).quantized for key in cap.opwise)


def reported_precisions(subject: Subject, qmodel: Any) -> dict[str, str] | None:
    """``lpq_quantized_ops``'s answer, or ``None`` when the adaptor does not implement it."""
    if not subject.pm.implements("lpq_quantized_ops"):
        return None
    return subject.pm.quantized_ops(subject.framework, qmodel)


def check_reports_integer_ops(subject: Subject, qmodel: Any) -> None:
    """At least one op of a default-config model is reported in an integer precision."""
    if not offers_quantization(subject):
        not_run(f"the {subject.framework} capability offers no quantized op for the sample model")
        return
    reported = reported_precisions(subject, qmodel)
    if reported is None:
        not_run("the adaptor does not implement the optional lpq_quantized_ops hook")
        return
    if not any(precision in INTEGER_PRECISIONS for precision in reported.values()):
        raise ConformanceFailure(
            "lpq_quantized_ops reports no op in int8/uint8/int4 after quantizing with every "
            f"op at its default (quantized) config: {reported}"
        )


def _claimed_eight_bit(subject: Subject, qmodel: Any, cfg_ops: dict[Any, Any]) -> list[str]:
    """Ops the adaptor says run in 8 bits: its ``lpq_quantized_ops`` answer, or (without
    that hook) the ops the default config asked to quantize in 8 bits."""
    reported = reported_precisions(subject, qmodel)
    if reported is not None:
        return [name for name, precision in reported.items() if precision in EIGHT_BIT]
    return [name for (name, _), op in cfg_ops.items() if op.precision in EIGHT_BIT]


def _main_tensor(tensors: dict[str, np.ndarray]) -> str | None:
    """The op's weight proper: its largest tensor (a bias is smaller)."""
    if not tensors:
        return None
    return max(tensors, key=lambda name: np.asarray(tensors[name]).size)


def _fp32_counterpart(
    fp32: dict[str, np.ndarray], name: str, value: np.ndarray
) -> np.ndarray | None:
    """The fp32 tensor a quantized one came from: the same name (as the hookspec asks),
    else the one tensor of the same shape."""
    if name in fp32:
        return np.asarray(fp32[name])
    same = [np.asarray(t) for t in fp32.values() if np.asarray(t).shape == value.shape]
    return same[0] if len(same) == 1 else None


def check_weights_are_quantized(subject: Subject) -> None:
    """Weights of ops reported int8 lie on an integer grid and differ from fp32's."""
    cfg = subject.tune_cfg()
    names = [name for name, _ in subject.capability.opwise]
    inspected = subject.pm.inspect_tensor(
        subject.framework, subject.model, subject.data, names, "weight", 1
    ).weights
    # Copies: an adaptor may hand out its model's own arrays, which quantize must not touch
    # (a separate check), but which must not blur this one if it does.
    fp32 = {op: {k: np.array(v, copy=True) for k, v in t.items()} for op, t in inspected.items()}
    qmodel = subject.quantize(cfg)
    claimed = _claimed_eight_bit(subject, qmodel, cfg.ops)
    claimed = [name for name in claimed if fp32.get(name)]
    if not claimed:
        not_run("no op reported int8 has weights (lpq_inspect_tensor gives none for them)")
        return
    weights = subject.pm.inspect_tensor(
        subject.framework, qmodel, subject.data, claimed, "weight", 1
    ).weights
    missing, off_grid, changed = [], [], []
    for op in claimed:
        name = _main_tensor(weights.get(op, {}))
        if name is None:
            missing.append(op)
            continue
        value = np.asarray(weights[op][name])
        if not on_grid(value):
            off_grid.append(f"{op}:{name}")
        before = _fp32_counterpart(fp32[op], name, value)
        if before is not None and not np.array_equal(before, value):
            changed.append(op)
    if missing:
        # Some kernels (oneDNN's int8 convolutions) quantize weights inside the kernel at run
        # time, so the model holds none to read back: those ops cannot be checked here (the
        # outputs check still sees an identity quantizer).
        not_run(
            f"lpq_inspect_tensor(kind='weight') reads no weights from the quantized model for "
            f"ops reported int8 {missing}, so their weights were not checked"
        )
    problems = []
    if off_grid:
        problems.append(
            "weights of ops reported int8 are not on any integer grid (per tensor or per "
            f"channel, <= 256 values, each scale * integer): {off_grid}"
        )
    checked = [op for op in claimed if op not in missing]
    if checked and not changed:
        problems.append(
            f"the weights of every op reported int8 ({checked}) are bit-identical to fp32's: "
            "nothing was quantized"
        )
    if problems:
        raise ConformanceFailure("; ".join(problems))


def check_outputs_differ_from_fp32(subject: Subject) -> None:
    """A quantized model computes something else than fp32 on the calibration batches."""
    if not offers_quantization(subject):
        not_run(f"the {subject.framework} capability offers no quantized op for the sample model")
        return
    qmodel = subject.quantize()
    batches = subject.calibration_batches()
    fp32 = subject.outputs(subject.model, batches)
    quantized = subject.outputs(qmodel, batches)
    if all(
        np.array_equal(np.asarray(first(a)), np.asarray(first(b)))
        for a, b in zip(fp32, quantized, strict=True)
    ):
        raise ConformanceFailure(
            "the quantized model's outputs on the calibration batches are bit-identical to "
            "fp32's: an int8 model rounds its weights and activations, so its outputs move "
            "(quantize returned the fp32 model?)"
        )
