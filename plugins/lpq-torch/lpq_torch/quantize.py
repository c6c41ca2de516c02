"""lpq_quantize: torch.export -> PT2E prepare -> calibrate (or QAT) -> convert.

The result is the ``GraphModule`` ``convert_pt2e`` returns: quantize/dequantize ops around
float conv/linear ops. Run eagerly it *simulates* int8 (exact arithmetic, no speedup);
``torch.compile`` with Inductor freezing fuses the q/dq patterns into oneDNN int8 kernels,
which is where the speedup comes from (see :mod:`lpq_torch.evaluate`).

Quantization-aware training: with a ``train_func``, the model is exported in train mode,
prepared with ``prepare_qat_pt2e`` (fake quantizers are torchao's
``LearnableFakeQuantize``: their scale and zero point get gradients), calibrated once so
the scales start from observed ranges, then range learning is switched on and
``train_func(prepared)`` trains weights and scales together. Converting gives the same
deployable int8 graph as PTQ.
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torchao.quantization.pt2e import (
    enable_range_learning,
    move_exported_model_to_eval,
    move_exported_model_to_train,
)
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e

from lpq import ConfigError, OpConfig, TuneConfig, split_batch, take_samples

from . import graph, lowp_float
from .data import CallArgs, at_least_two, call_args, first_batch, require_module, run
from .qspec import quant_config
from .quantizer import Group, LpqX86Quantizer

#: Attribute on a quantized GraphModule holding example inputs (to re-export on save).
EXAMPLE_ATTR = "_lpq_example_inputs"
#: Attribute holding the tune_cfg (JSON) the model was quantized with.
TUNE_CFG_ATTR = "_lpq_tune_cfg"

# Example inputs seen for fp32 models (capability query), so later hooks can export them.
_examples: weakref.WeakKeyDictionary[torch.nn.Module, CallArgs] = weakref.WeakKeyDictionary()


def remember_example(model: torch.nn.Module, args: CallArgs) -> None:
    with contextlib.suppress(TypeError):
        _examples[model] = at_least_two(args)


def example_for(model: torch.nn.Module) -> CallArgs | None:
    found: CallArgs | None = getattr(model, EXAMPLE_ATTR, None)
    if found is not None:
        return found
    return _examples.get(model)


def quantize(
    model: Any,
    tune_cfg: TuneConfig,
    calib_dataloader: Iterable[Any] | None,
    train_func: Callable[[Any], Any] | None,
) -> torch.fx.GraphModule:
    """Quantize ``model`` per ``tune_cfg``; the original model is never modified."""
    module = require_module(model)
    qat = train_func is not None
    if qat:
        module = copy.deepcopy(module)  # training must not touch the user's weights
    args = first_batch(calib_dataloader)
    remember_example(model, args)
    program = graph.export(module, args, training=qat)
    gm = program.module()
    present = {key for key, _ in graph.quantizable_nodes(gm)}
    _check_ops(tune_cfg, present)

    quantized = {key: cfg for key, cfg in tune_cfg.ops.items() if cfg.quantized}
    if quantized:
        quantizer = LpqX86Quantizer(_groups(tune_cfg, qat=qat))
        prepared = prepare_qat_pt2e(gm, quantizer) if qat else prepare_pt2e(gm, quantizer)
        _calibrate(prepared, calib_dataloader, tune_cfg.calib_sampling_size)
        if train_func is not None:
            prepared.apply(enable_range_learning)
            move_exported_model_to_train(prepared)
            returned = train_func(prepared)
            if isinstance(returned, torch.fx.GraphModule):
                prepared = returned
        move_exported_model_to_eval(prepared)
        result = convert_pt2e(prepared)
        move_exported_model_to_eval(result)
        drop_unused_tensors(result)
    else:
        result = gm
        if qat:
            move_exported_model_to_eval(result)
    for dtype in ("bf16", "fp16"):
        names = [n for (n, _), c in tune_cfg.ops.items() if c.precision == dtype]
        if names:
            lowp_float.cast_nodes(result, names, dtype)
    setattr(result, EXAMPLE_ATTR, at_least_two(args))
    setattr(result, TUNE_CFG_ATTR, tune_cfg.to_json())
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


def _check_ops(tune_cfg: TuneConfig, present: set[tuple[str, str]]) -> None:
    unknown = [key for key in tune_cfg.ops if key not in present]
    if unknown:
        shown = ", ".join(f"{name} ({op_type})" for name, op_type in unknown[:5])
        raise ConfigError(
            f"the tune_cfg names ops the model does not have: {shown}",
            hint="use op names and types from the capability query (module paths such as "
            "'features.0' with op types conv2d/linear/matmul)",
        )


def _groups(tune_cfg: TuneConfig, *, qat: bool) -> list[Group]:
    """Ops grouped by identical OpConfig, each with its torchao config."""
    by_cfg: dict[OpConfig, set[str]] = {}
    for (name, _), cfg in tune_cfg.ops.items():
        # bf16/fp16 ops are cast after conversion; they stay float through PT2E.
        key = cfg if cfg.quantized else OpConfig.fallback()
        by_cfg.setdefault(key, set()).add(name)
    groups: list[Group] = []
    modes = {cfg.mode for cfg in by_cfg if cfg.quantized}
    if qat and "dynamic" in modes:
        raise ConfigError(
            "dynamic quantization cannot be combined with quantization-aware training",
            hint="use mode 'static' for QAT, or quantize without a train_func",
        )
    for cfg, names in by_cfg.items():
        groups.append((frozenset(names), quant_config(cfg, qat=qat) if cfg.quantized else None))
    return groups


def _calibrate(
    prepared: torch.fx.GraphModule, dataloader: Iterable[Any] | None, samples: int
) -> None:
    """Run up to ``samples`` samples through the observers (QAT: initialises scales)."""
    if dataloader is None:
        return
    with torch.no_grad():
        for item in take_samples(dataloader, max(1, samples)):
            run(prepared, call_args(split_batch(item)[0]))
