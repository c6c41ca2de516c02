"""Dynamic int8 for Linear layers through torchao's ``Int8DynamicActivationInt8WeightConfig``.

For Linear-heavy models (transformers, MLPs) torchao's dynamic path is the maintained
one: int8 weights per output channel, int8 activation scales computed per row (token) at
run time, lowered by ``torch.compile`` to int8 matmuls. It works on the eager
``nn.Module``: ``quantize_`` swaps the weights of the chosen ``nn.Linear`` modules for
quantized tensor subclasses, so an op is selected by its module path. lpq's op name of a
linear is that path whenever the module owns exactly one linear node (see
:mod:`lpq_torch.graph`). The result is marked with :data:`lpq_torch.info.DYNAMIC_ATTR`;
what really got quantized is read back from it by :mod:`lpq_torch.precision`.

tune_cfg mapping (capability YAML, ``dynamic`` mode of ``linear``): activation
``granularity: per_channel`` is torchao's ``PerRow`` (one scale per token),
``per_tensor`` its ``PerTensor``; ``scheme`` ``sym``/``asym`` its activation mapping.
Weights are int8, symmetric, per channel (``PerRow``) or per tensor.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch

from lpq import ConfigError, OpConfig, OpKey, TuneConfig

from ..errors import stage
from ..info import DYNAMIC_ATTR


def wanted(tune_cfg: TuneConfig) -> dict[OpKey, OpConfig]:
    """The ops ``tune_cfg`` quantizes dynamically."""
    return {
        key: cfg for key, cfg in tune_cfg.ops.items() if cfg.quantized and cfg.mode == "dynamic"
    }


def check(module: torch.nn.Module, tune_cfg: TuneConfig) -> None:
    """Refuse configs this path cannot apply, with what to do instead."""
    ops = wanted(tune_cfg)
    static = [key for key, cfg in tune_cfg.ops.items() if cfg.quantized and cfg.mode != "dynamic"]
    if static:
        raise ConfigError(
            "one tune_cfg cannot mix dynamic ops (torchao's dynamic int8 on nn.Linear "
            f"modules) with static ones ({static[0][0]} is {tune_cfg.ops[static[0]].mode})",
            hint="quantize every op either static or dynamic (approach='static' or "
            "approach='dynamic')",
        )
    names = dict(module.named_modules())
    for name, op_type in ops:
        if op_type != "linear" or not isinstance(names.get(name), torch.nn.Linear):
            raise ConfigError(
                f"dynamic quantization applies to nn.Linear modules; {name} ({op_type}) is not one",
                hint="keep it static or fp32, or pass the model as an nn.Module (not a "
                "loaded .pt2 graph) so its Linear modules are visible",
            )


def quantize(module: torch.nn.Module, tune_cfg: TuneConfig) -> torch.nn.Module:
    """A copy of ``module`` whose chosen Linear layers run torchao's dynamic int8."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    check(module, tune_cfg)
    result = copy.deepcopy(module).eval()
    by_config: dict[OpConfig, set[str]] = {}
    for (name, _), cfg in wanted(tune_cfg).items():
        by_config.setdefault(cfg, set()).add(name)
    for cfg, names in by_config.items():
        config = Int8DynamicActivationInt8WeightConfig(
            act_mapping_type=_mapping(cfg),
            granularity=_granularity(cfg),
            set_inductor_config=False,
        )
        with stage("quantize", "torchao quantize_ (dynamic int8)"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_(result, config, filter_fn=lambda _m, fqn, keep=names: fqn in keep)
    setattr(result, DYNAMIC_ATTR, [name for name, _ in tune_cfg.ops])
    return result


def _mapping(cfg: OpConfig) -> Any:
    from torchao.quantization.quant_primitives import MappingType

    scheme = cfg.activation.scheme if cfg.activation else "sym"
    return MappingType.SYMMETRIC if scheme == "sym" else MappingType.ASYMMETRIC


def _granularity(cfg: OpConfig) -> list[Any]:
    from torchao.quantization.granularity import PerRow, PerTensor

    def pick(granularity: str | None) -> Any:
        return PerTensor() if granularity == "per_tensor" else PerRow()

    if cfg.weight is not None and cfg.weight.scheme != "sym":
        raise ConfigError("torchao's dynamic int8 quantizes weights symmetrically only")
    act = cfg.activation.granularity if cfg.activation else None
    weight = cfg.weight.granularity if cfg.weight else None
    return [pick(act), pick(weight)]
