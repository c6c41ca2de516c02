"""lpq hook implementations for PyTorch (entry point ``torch`` in group ``lpq``).

This module stays tiny and framework-free: registration hooks and the import of this
module never import torch, so ``lpq plugins list`` stays fast. Per-framework hooks return
``None`` unless ``framework == "torch"`` and then delegate to modules that import torch.
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

FRAMEWORK = "torch"
#: Suffix of the files :func:`lpq_save_model` writes (a ``torch.export`` archive).
MODEL_SUFFIX = ".pt2"


def capability_file() -> Path:
    """The capability YAML shipped in this package."""
    return Path(str(resources.files("lpq_torch").joinpath("capabilities", "torch.yaml")))


@lpq.hookimpl
def lpq_register_adaptors(register: Callable[[AdaptorInfo], None]) -> None:
    register(
        AdaptorInfo(
            framework=FRAMEWORK,
            framework_distribution="torch",
            capability_files=[capability_file()],
            description="PyTorch nn.Module via torch.export + PT2E (torchao), x86 int8",
            model_suffixes=(MODEL_SUFFIX,),
            install_hint="pip install lpq-torch",
        )
    )


@lpq.hookimpl
def lpq_register_backend_profiles(register: Callable[[lpq.BackendProfile], None]) -> None:
    from .backends.profiles import register_all  # plain data: no torch import

    register_all(register)


@lpq.hookimpl
def lpq_detect_framework(model: Any) -> str | None:
    if isinstance(model, str | Path):
        return FRAMEWORK if _is_saved_model(Path(model)) else None
    # A torch model can only exist if torch is already imported: never import it here.
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(model, torch.nn.Module):
        return FRAMEWORK
    return None


def _is_saved_model(path: Path) -> bool:
    """A ``.pt2`` zip archive (what ``torch.export.save`` and lpq_save_model write)."""
    try:
        if path.suffix != MODEL_SUFFIX or not path.is_file():
            return False
        with path.open("rb") as handle:
            return handle.read(4) == b"PK\x03\x04"
    except OSError:
        return False


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
    if tune_cfg.options.get("backend_scheme"):  # a backend profile's scheme: simulate it
        from .backends import quantize as backend

        return backend.quantize(model, tune_cfg, calib_dataloader, train_func)
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
    from .backends import simulate

    if simulate.is_simulated(model):  # its speed on this CPU says nothing about the backend
        measurer = None
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
    from . import report
    from .backends import simulate

    if simulate.is_simulated(model):
        return simulate.quantized_ops(model)
    return report.quantized_ops(model)


@lpq.hookimpl
def lpq_convert(framework: str, model: Any, target: str, options: dict[str, Any]) -> Any | None:
    if framework != FRAMEWORK:
        return None
    from .backends import convert

    return convert.convert(model, target, options)


@lpq.hookimpl
def lpq_set_tensor(framework: str, model: Any, tensor_name: str, value: Any) -> Any | None:
    if framework != FRAMEWORK:
        return None
    from . import edit

    return edit.set_tensor(model, tensor_name, value)


@lpq.hookimpl
def lpq_quantize_input(framework: str, model: Any, options: dict[str, Any]) -> Any | None:
    if framework != FRAMEWORK:
        return None
    from . import edit

    return edit.quantize_input(model, options)


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
