"""The PT2E pass: torch.export -> PT2E prepare -> calibrate (or QAT) -> convert_pt2e.

The result is the ``GraphModule`` ``convert_pt2e`` returns: quantize/dequantize ops around
float conv/linear ops. Run eagerly it *simulates* int8 (exact arithmetic, no speedup);
``torch.compile`` with Inductor freezing fuses the q/dq patterns into oneDNN int8 kernels,
which is where the speedup comes from (see :mod:`lpq_torch.evaluate`). Ops the tune_cfg
puts in bf16/fp16 stay float through PT2E and are cast afterwards (:mod:`lpq_torch.lowp`).

Quantization-aware training is this same pass with training between calibration and
conversion (its result is the same static int8 graph): with a ``train_func``, the model is
exported in train mode, prepared with ``prepare_qat_pt2e`` (fake quantizers are torchao's
``LearnableFakeQuantize``: their scale and zero point get gradients), calibrated once so
the scales start from observed ranges, then range learning is switched on and
``train_func(prepared)`` trains weights and scales together.

Which pass runs, and the latency-aware step around this one, is decided by
:mod:`lpq_torch.quantize`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torchao.quantization.pt2e import (
    enable_range_learning,
    move_exported_model_to_eval,
    move_exported_model_to_train,
)
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e

from lpq import ConfigError, OpConfig, TuneConfig

from .. import graph, lowering, lowp, model_io
from ..calibration import calibrate
from ..data import CallArgs
from ..errors import stage
from ..info import OUTPUT_RANGES_ATTR
from ..qspec import quant_config
from ..quantizer import Group, LpqX86Quantizer


def _fp32_graph(module: torch.nn.Module, args: CallArgs, *, training: bool = False) -> Any:
    if training:  # QAT trains a deep copy; its export is never reused
        return model_io.export(copy.deepcopy(module), args, training=True).module()
    return model_io.exported(module, args)


def quantize(
    module: torch.nn.Module,
    tune_cfg: TuneConfig,
    calib_dataloader: Iterable[Any] | None,
    train_func: Callable[[Any], Any] | None,
    args: CallArgs,
) -> torch.fx.GraphModule:
    """export (once per run) -> prepare -> calibrate (or QAT) -> convert -> bf16 casts.

    ``args`` are the example inputs (the first calibration batch) the model is exported
    with; the model itself is never modified.
    """
    qat = train_func is not None
    gm = _fp32_graph(module, args, training=qat)
    graph.check_ops(tune_cfg, gm)
    if any(cfg.quantized and cfg.mode == "dynamic" for cfg in tune_cfg.ops.values()) and qat:
        raise ConfigError(
            "dynamic quantization cannot be combined with quantization-aware training",
            hint="use mode 'static' for QAT, or quantize without a train_func",
        )
    quantized = {key: cfg for key, cfg in tune_cfg.ops.items() if cfg.quantized}
    if quantized:
        quantizer = LpqX86Quantizer(_groups(tune_cfg, qat=qat))
        with stage("prepare", "torchao prepare_pt2e with the x86 recipe"):
            prepared = prepare_qat_pt2e(gm, quantizer) if qat else prepare_pt2e(gm, quantizer)
        output_ranges = calibrate(prepared, calib_dataloader, tune_cfg.calib_sampling_size)
        if train_func is not None:
            prepared.apply(enable_range_learning)
            move_exported_model_to_train(prepared)
            returned = train_func(prepared)
            if isinstance(returned, torch.fx.GraphModule):
                prepared = returned
        with stage("convert", "torchao convert_pt2e"):
            # Only a QAT graph (exported in train mode) needs moving to eval: the call
            # re-exports torchao's dropout/batch-norm patterns (12 torch.export calls, 97%
            # of a 3-Linear model's quantization time); a PTQ graph is exported in eval.
            if qat:
                move_exported_model_to_eval(prepared)
            result = convert_pt2e(prepared)
            if qat:
                move_exported_model_to_eval(result)
        lowering.conv1d_as_conv2d(result)  # Inductor drops a quantized conv1d's stride
        drop_unused_tensors(result)
        setattr(result, OUTPUT_RANGES_ATTR, output_ranges)
    else:
        result = gm
        if qat:
            move_exported_model_to_eval(result)
    for dtype in ("bf16", "fp16"):
        names = [n for (n, _), c in tune_cfg.ops.items() if c.precision == dtype]
        if names:
            lowp.cast_nodes(result, names, dtype)
    return result


def drop_unused_tensors(gm: torch.fx.GraphModule) -> None:
    """Delete parameters/buffers no node reads (fp32 weights replaced by folded int8 ones).

    Without this the quantized module, and any file saved from it, still carries every
    original fp32 weight.
    """
    used = {str(node.target) for node in gm.graph.nodes if node.op == "get_attr"}
    named = [
        *gm.named_parameters(remove_duplicate=False),
        *gm.named_buffers(remove_duplicate=False),
    ]
    for name, _ in named:
        if name in used:
            continue
        owner_path, _, leaf = name.rpartition(".")
        owner = gm.get_submodule(owner_path) if owner_path else gm
        if hasattr(owner, leaf):
            delattr(owner, leaf)
    gm.delete_all_unused_submodules()


def _groups(tune_cfg: TuneConfig, *, qat: bool) -> list[Group]:
    """Ops grouped by identical OpConfig, each with its torchao config."""
    by_cfg: dict[OpConfig, set[str]] = {}
    for (name, _), cfg in tune_cfg.ops.items():
        # bf16/fp16 ops are cast after conversion; they stay float through PT2E.
        key = cfg if cfg.quantized else OpConfig.fallback()
        by_cfg.setdefault(key, set()).add(name)
    groups: list[Group] = []
    for cfg, names in by_cfg.items():
        groups.append((frozenset(names), quant_config(cfg, qat=qat) if cfg.quantized else None))
    return groups
