"""lpq hook implementations for MXNet (entry point ``mxnet`` in group ``lpq``).

This module stays framework-free: importing it, the registration hook and detection never
import MXNet, so ``lpq plugins list`` works (and lists this plugin) in an environment
without MXNet. Per-framework hooks return ``None`` unless ``framework == "mxnet"`` and
then delegate to modules that import MXNet through :func:`lpq_mxnet.framework.mxnet`,
which raises an lpq error saying what to install when MXNet cannot be imported.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import lpq
from lpq import (
    AdaptorInfo,
    EvalResult,
    FrameworkCapability,
    Inspection,
    LatencyMeasurer,
    Metric,
    TuneConfig,
)

from .exports import PARAMS_SUFFIX, SYMBOL_SUFFIX, find_export
from .framework import INSTALL_HINT

FRAMEWORK = "mxnet"


def capability_file() -> Path:
    """The capability YAML shipped in this package."""
    return Path(str(resources.files("lpq_mxnet").joinpath("capabilities", "mxnet.yaml")))


@lpq.hookimpl
def lpq_register_adaptors(register: Callable[[AdaptorInfo], None]) -> None:
    register(
        AdaptorInfo(
            framework=FRAMEWORK,
            framework_distribution="mxnet",
            capability_files=[capability_file()],
            description=(
                "MXNet Gluon HybridBlocks and exported symbol JSON + params, "
                "oneDNN int8 via quantize_net_v2"
            ),
            model_suffixes=(SYMBOL_SUFFIX, PARAMS_SUFFIX),
            install_hint=INSTALL_HINT,
        )
    )


@lpq.hookimpl
def lpq_detect_framework(model: Any) -> str | None:
    if isinstance(model, str | Path):
        return FRAMEWORK if find_export(model) is not None else None
    # A Gluon block can only exist if mxnet is imported already: never import it here.
    mx = sys.modules.get("mxnet")
    gluon = getattr(mx, "gluon", None) if mx is not None else None
    if gluon is not None and isinstance(model, gluon.Block):
        return FRAMEWORK
    return None


@lpq.hookimpl
def lpq_query_fw_capability(
    framework: str, model: Any, dataloader: Iterable[Any] | None, options: dict[str, Any]
) -> FrameworkCapability | None:
    if framework != FRAMEWORK:
        return None
    from . import capability

    return capability.query(model, dataloader, options)


@lpq.hookimpl
def lpq_query_fused_patterns(framework: str, model: Any) -> list[tuple[str, ...]] | None:
    if framework != FRAMEWORK:
        return None
    from . import capability

    return capability.fused_patterns(model)


@lpq.hookimpl
def lpq_quantize(
    framework: str,
    model: Any,
    tune_cfg: TuneConfig,
    calib_dataloader: Iterable[Any] | None,
    train_func: Callable[[Any], Any] | None,
) -> Any | None:
    if framework != FRAMEWORK:
        return None
    from . import quantize

    return quantize.quantize(model, tune_cfg, calib_dataloader, train_func)


@lpq.hookimpl
def lpq_evaluate(
    framework: str,
    model: Any,
    dataloader: Iterable[Any],
    postprocess: Any,
    metrics: Sequence[Metric],
    measurer: LatencyMeasurer | None,
    iteration: int | None,
) -> EvalResult | None:
    if framework != FRAMEWORK:
        return None
    from . import evaluate

    return evaluate.evaluate(model, dataloader, postprocess, metrics, measurer, iteration)


@lpq.hookimpl
def lpq_convert_bf16(
    framework: str, model: Any, op_names: Sequence[str], dtype: Literal["bf16", "fp16"]
) -> Any | None:
    if framework != FRAMEWORK:
        return None
    from . import convert

    return convert.convert(model, op_names, dtype)


@lpq.hookimpl
def lpq_inspect_tensor(
    framework: str,
    model: Any,
    dataloader: Iterable[Any],
    op_names: Sequence[str] | None,
    kind: Literal["activation", "weight", "both"],
    iteration: int | None,
) -> Inspection | None:
    if framework != FRAMEWORK:
        return None
    from . import inspection

    return inspection.inspect_tensor(model, dataloader, op_names, kind, iteration)


@lpq.hookimpl
def lpq_quantized_ops(framework: str, model: Any) -> dict[str, str] | None:
    if framework != FRAMEWORK:
        return None
    from . import inspection

    return inspection.quantized_ops(model)


@lpq.hookimpl
def lpq_save_model(framework: str, model: Any, path: Path) -> Path | None:
    if framework != FRAMEWORK:
        return None
    from . import persist

    return persist.save(model, path)


@lpq.hookimpl
def lpq_load_model(framework: str, path: Path) -> Any | None:
    if framework != FRAMEWORK:
        return None
    from . import persist

    return persist.load(path)
