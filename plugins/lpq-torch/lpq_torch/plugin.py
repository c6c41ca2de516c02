"""lpq hook implementations for PyTorch (entry point ``torch = "lpq_torch.plugin:plugin"``).

Registration only. :class:`TorchPlugin` describes the adaptor (``lpq_register_*``) and
binds each job lpq-torch offers to lpq's per-framework hook through
:class:`lpq.AdaptorHooks`, which declines every other framework. Each job method imports
its module when first called: importing this module, registering and detecting never
import torch, so ``lpq plugins list`` stays fast. Nothing in the package imports this
module; it sits on top of every job module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lpq
from lpq import (
    AdaptorInfo,
    lazy_job,
)

from .info import DISTRIBUTION, FRAMEWORK, MODEL_SUFFIX, capability_files, detect


class TorchPlugin(lpq.AdaptorHooks):
    """The PyTorch adaptor: registration hooks and the jobs it implements."""

    framework = FRAMEWORK

    @lpq.hookimpl
    def lpq_register_adaptors(self, register: Callable[[AdaptorInfo], None]) -> None:
        register(
            AdaptorInfo(
                framework=FRAMEWORK,
                framework_distribution=DISTRIBUTION,
                capability_files=capability_files(),
                description="PyTorch nn.Module via torch.export + PT2E (torchao), x86 int8",
                model_suffixes=(MODEL_SUFFIX,),
                install_hint="pip install lpq-torch",
            )
        )

    @lpq.hookimpl
    def lpq_register_backend_profiles(self, register: Callable[[lpq.BackendProfile], None]) -> None:
        from .backends.profiles import register_all  # plain data: no torch import

        register_all(register)

    def detect(self, model: Any) -> bool:
        return detect(model)

    query_capability = lazy_job("lpq_torch.capability:query_capability")
    fused_patterns = lazy_job("lpq_torch.capability:fused_patterns")
    quantize = lazy_job("lpq_torch.quantize:quantize")
    evaluate = lazy_job("lpq_torch.evaluate:evaluate")
    cast_lowp = lazy_job("lpq_torch.lowp:cast_lowp")
    inspect_tensor = lazy_job("lpq_torch.inspection:inspect_tensor")
    quantized_ops = lazy_job("lpq_torch.precision:quantized_ops")
    resolved_config = lazy_job("lpq_torch.quantize:resolved_config")
    export = lazy_job("lpq_torch.export:export")
    set_tensor = lazy_job("lpq_torch.edit:set_tensor")
    quantize_input = lazy_job("lpq_torch.edit:quantize_input")
    save = lazy_job("lpq_torch.persist:save")
    load = lazy_job("lpq_torch.persist:load")


plugin = TorchPlugin()
