"""lpq hook implementations for MXNet (entry point ``mxnet = "lpq_mxnet.plugin:plugin"``).

Registration only. Importing this module, registering and detecting never import MXNet
(only :mod:`lpq_mxnet.info`), so ``lpq plugins list`` works and lists this plugin in an
environment without MXNet. Each job method imports its job module when called; those
import MXNet through :func:`lpq_mxnet.framework.mxnet`, which raises an lpq error saying
what to install when MXNet cannot be imported. :class:`lpq.AdaptorHooks` answers other
frameworks' calls with ``None``. Nothing in the package imports this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lpq
from lpq import (
    AdaptorInfo,
    lazy_job,
)

from . import info
from .info import FRAMEWORK


class MxnetPlugin(lpq.AdaptorHooks):
    """The MXNet adaptor: registration, and one method per job it offers."""

    framework = FRAMEWORK

    @lpq.hookimpl
    def lpq_register_adaptors(self, register: Callable[[AdaptorInfo], None]) -> None:
        register(
            AdaptorInfo(
                framework=FRAMEWORK,
                framework_distribution=info.DISTRIBUTION,
                capability_files=info.capability_files(),
                description=(
                    "MXNet Gluon HybridBlocks and exported symbol JSON + params, "
                    "oneDNN int8 via quantize_net_v2"
                ),
                model_suffixes=(info.SYMBOL_SUFFIX, info.PARAMS_SUFFIX),
                install_hint=info.INSTALL_HINT,
            )
        )

    def detect(self, model: Any) -> bool:
        return info.detect(model)

    query_capability = lazy_job("lpq_mxnet.capability:query_capability")
    fused_patterns = lazy_job("lpq_mxnet.capability:fused_patterns")
    quantize = lazy_job("lpq_mxnet.quantize:quantize")
    evaluate = lazy_job("lpq_mxnet.evaluate:evaluate")
    cast_lowp = lazy_job("lpq_mxnet.lowp:cast_lowp")
    inspect_tensor = lazy_job("lpq_mxnet.inspection:inspect_tensor")
    quantized_ops = lazy_job("lpq_mxnet.precision:quantized_ops")
    resolved_config = lazy_job("lpq_mxnet.quantize:resolved_config")
    save = lazy_job("lpq_mxnet.persist:save")
    load = lazy_job("lpq_mxnet.persist:load")


plugin = MxnetPlugin()
