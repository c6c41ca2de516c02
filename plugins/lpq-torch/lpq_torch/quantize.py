"""lpq_quantize: pick the pass a tune_cfg asks for; the passes do the work.

* a backend scheme (``options["backend_scheme"]``, set by core from a backend profile):
  bit-exact simulation of that backend (:mod:`lpq_torch.backends.quantize`);
* weight-only ops (int4/int8 Linear weights for LLMs): lpq.weight_only's maths run by
  torch's CPU weight-only kernels (:mod:`lpq_torch.passes.weight_only`), no export;
* dynamic ops on an ``nn.Module`` without QAT: torchao's dynamic int8 for Linear
  (:mod:`lpq_torch.passes.dynamic`);
* otherwise the PT2E pass (:mod:`lpq_torch.passes.static`), static int8 per op or QAT
  with a ``train_func``.

With the ``latency_aware`` option (the capability's recipe: on for ``lpq.quantize``,
searched by ``lpq.fit``) ops that int8 makes slower on this machine stay in fp32, by
measurement (core's search, :mod:`lpq_torch.latency` its backend); the result then
carries the decision (``_lpq_latency``) and a tune_cfg with those ops as fp32 fallbacks.
QAT results are kept as trained.

The result carries its example inputs and tune_cfg (:mod:`lpq_torch.info`), so later jobs
(save, evaluation, inspection) work on it without data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from lpq import TuneConfig

from . import graph, latency, model_io
from .backends import quantize as backend
from .data import at_least_two, first_batch
from .info import EXAMPLE_ATTR, TUNE_CFG_ATTR
from .passes import dynamic, static, weight_only

#: Set on a model trained with quantization (its tune_cfg alone does not make it again).
_QAT_ATTR = "_lpq_qat"


def quantize(
    model: Any,
    tune_cfg: TuneConfig,
    calib_dataloader: Iterable[Any] | None,
    train_func: Callable[[Any], Any] | None,
) -> torch.nn.Module:
    """Quantize ``model`` per ``tune_cfg``; the original model is never modified."""
    if backend.wanted(tune_cfg):
        return backend.quantize(model, tune_cfg, calib_dataloader, train_func)
    module = model_io.require_module(model)
    qat = train_func is not None
    if weight_only.wanted(tune_cfg) and not qat:
        # no export: an LLM's Linears are found by module path, calibrated by hooks
        quantized = weight_only.quantize(module, tune_cfg, calib_dataloader)
        if calib_dataloader is not None:
            setattr(quantized, EXAMPLE_ATTR, first_batch(calib_dataloader))
        setattr(quantized, TUNE_CFG_ATTR, tune_cfg.to_json())
        return quantized
    args = first_batch(calib_dataloader)
    model_io.remember_example(module, args)
    if dynamic.wanted(tune_cfg) and not qat and not isinstance(module, torch.fx.GraphModule):
        graph.check_ops(tune_cfg, model_io.exported(module, args))
        result: torch.nn.Module = dynamic.quantize(module, tune_cfg)
    else:
        result = static.quantize(module, tune_cfg, calib_dataloader, train_func, args)
        if not qat and latency.wanted(tune_cfg):
            decision, result = latency.choose(
                module,
                tune_cfg,
                args,
                result,
                lambda cfg: static.quantize(module, cfg, calib_dataloader, None, args),
            )
            if decision is not None:
                setattr(result, latency.LATENCY_ATTR, decision.to_json())
                # What the model now runs, decided: quantizing with it again gives the
                # same model without measuring anew (lpq_resolved_config).
                tune_cfg = tune_cfg.with_fallbacks(decision.keep_float).with_options(
                    {"latency_aware": False}
                )
    setattr(result, EXAMPLE_ATTR, at_least_two(args))
    setattr(result, TUNE_CFG_ATTR, tune_cfg.to_json())
    if qat:
        setattr(result, _QAT_ATTR, True)
    return result


def resolved_config(model: Any) -> TuneConfig | None:
    """The ``lpq_resolved_config`` job: the tune_cfg a model lpq-torch quantized carries,
    the configuration it really is (ops latency-aware quantization kept fp32 as
    fallbacks, ``latency_aware`` off once decided); None for a model lpq did not make.
    QAT results carry the tune_cfg they were trained with, which does not retrain them:
    None for those too."""
    recorded = getattr(model, TUNE_CFG_ATTR, None)
    if not isinstance(recorded, dict) or getattr(model, _QAT_ATTR, False):
        return None
    return TuneConfig.from_json(recorded)
