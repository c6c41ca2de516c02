"""Why no plugin recognised a model: the error that points the right way.

Every error here is a :class:`lpq.NoAdaptorError` (no adaptor takes this model), with a
message that says why.

When every adaptor declines a model, "install a plugin" is rarely the answer. The file may
not exist, may be corrupt under a known suffix, may belong to a plugin that is installed
but disabled or broken, or may be a format (a TensorFlow ``.pb``) that the right adaptor
reads only in another form. This module tells these apart, from the installed adaptors'
``model_suffixes``, the plugin records and a small table of well-known model formats (the
only place lpq-core names framework plugins, and only to say which one would help).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import NoAdaptorError
from .discovery import ENV_ALLOW, ENV_DENY, PluginRecord, PluginStatus
from .types import AdaptorInfo


@dataclass(frozen=True)
class ModelFormat:
    """A kind of model file (or object) and the plugin that handles it."""

    description: str
    plugin: str
    distribution: str
    suffixes: tuple[str, ...] = ()
    #: Top-level packages whose objects are models of this kind.
    packages: tuple[str, ...] = ()
    #: What to do when the plugin reads this format only in another form.
    note: str = ""


TF_GRAPH = ModelFormat(
    "a TensorFlow graph (a SavedModel's saved_model.pb or a frozen graph)",
    "tf",
    "lpq-tf",
    (".pb", ".pbtxt"),
    note="pass the SavedModel folder (the one holding saved_model.pb), or convert a frozen "
    "graph to a SavedModel or a .tflite file first",
)

SAVED_MODEL = ModelFormat("a TensorFlow SavedModel folder", "tf", "lpq-tf")

KNOWN_FORMATS: tuple[ModelFormat, ...] = (
    ModelFormat("an ONNX model", "onnxrt", "lpq-onnxrt", (".onnx",), ("onnx",)),
    ModelFormat("a PyTorch exported program", "torch", "lpq-torch", (".pt2",), ("torch",)),
    ModelFormat(
        "a PyTorch checkpoint or TorchScript file",
        "torch",
        "lpq-torch",
        (".pt", ".pth", ".ckpt"),
        note="load it into a torch.nn.Module and pass the module to lpq.fit / lpq.quantize, "
        "or save it with torch.export.save(...) as a .pt2 file",
    ),
    ModelFormat("a TensorFlow Lite model", "tf", "lpq-tf", (".tflite",)),
    ModelFormat(
        "a Keras model", "tf", "lpq-tf", (".keras", ".h5"), ("keras", "tf_keras", "tensorflow")
    ),
    TF_GRAPH,
    ModelFormat("an MXNet model", "mxnet", "lpq-mxnet", ("-symbol.json", ".params"), ("mxnet",)),
)


def _suffix_match(name: str, suffixes: Sequence[str]) -> str | None:
    lowered = name.lower()
    return next((s for s in suffixes if lowered.endswith(s.lower())), None)


def _known_format(model: Any) -> ModelFormat | None:
    if isinstance(model, str | Path):
        path = Path(model)
        if path.is_dir() and (path / "saved_model.pb").exists():
            return SAVED_MODEL
        return next((f for f in KNOWN_FORMATS if _suffix_match(path.name, f.suffixes)), None)
    package = type(model).__module__.split(".")[0]
    return next((f for f in KNOWN_FORMATS if package in f.packages), None)


def _shown(model: Any) -> str:
    if isinstance(model, str | Path):
        return str(model)
    return f"a {type(model).__module__}.{type(model).__qualname__} object"


def _readers(adaptors: Mapping[str, AdaptorInfo]) -> str:
    parts = [
        f"{', '.join(info.model_suffixes) or 'objects'} ({name})" for name, info in adaptors.items()
    ]
    return "; ".join(parts) or "no adaptor is installed"


def _enable_hint(plugin: str, record: PluginRecord) -> str:
    if ENV_DENY in record.message:
        return f"remove {plugin} from {ENV_DENY}"
    return f"add {plugin} to {ENV_ALLOW}"


def _plugin_problem(
    shown: str, fmt: ModelFormat, records: Mapping[str, PluginRecord]
) -> NoAdaptorError | None:
    """An error when the plugin for ``fmt`` is installed but disabled or failed to load."""
    record = records.get(fmt.plugin)
    if record is None:
        return None
    if record.status is PluginStatus.DISABLED:
        return NoAdaptorError(
            f"{shown} looks like {fmt.description}, which the {fmt.plugin!r} plugin "
            f"({record.distribution}) handles, but that plugin is {record.message or 'disabled'}",
            hint=_enable_hint(fmt.plugin, record),
        )
    if record.status in (PluginStatus.ERROR, PluginStatus.INCOMPATIBLE):
        return NoAdaptorError(
            f"{shown} looks like {fmt.description}, but the {fmt.plugin!r} plugin that "
            f"handles it did not load: {record.message.splitlines()[0]}",
            hint=record.hint or "`lpq plugins list` shows why",
        )
    return None


def unrecognised_model_error(
    model: Any, adaptors: Mapping[str, AdaptorInfo], records: Sequence[PluginRecord]
) -> NoAdaptorError:
    """The error to raise when no installed adaptor claimed ``model``."""
    shown = _shown(model)
    by_name = {record.name: record for record in records}
    if isinstance(model, str | Path):
        path = Path(model)
        if not path.exists():
            return NoAdaptorError(f"model {path} does not exist", hint="check the path")
        for framework, info in adaptors.items():
            suffix = _suffix_match(path.name, info.model_suffixes)
            if suffix is not None and path.is_file():
                fmt = _known_format(path)
                what = fmt.description if fmt is not None else f"a {framework} model"
                return NoAdaptorError(
                    f"{path} has the {suffix} suffix of {framework} models, but the "
                    f"{framework} adaptor does not recognise its contents as {what} (the file "
                    "is corrupt, truncated, or another kind of file)",
                    hint=f"re-export the model; pass --framework {framework} (framework="
                    f"{framework!r}) to see the adaptor's own error when loading it",
                )
    fmt = _known_format(model)
    if fmt is not None:
        problem = _plugin_problem(shown, fmt, by_name)
        if problem is not None:
            return problem
        record = by_name.get(fmt.plugin)
        if record is not None and record.status is PluginStatus.OK:
            return NoAdaptorError(
                f"{shown} looks like {fmt.description}, which the {fmt.plugin!r} adaptor does "
                "not read in this form",
                hint=fmt.note or f"the {fmt.plugin} adaptor reads: {_readers(adaptors)}",
            )
        return NoAdaptorError(
            f"{shown} looks like {fmt.description}; no installed plugin handles it",
            hint=f"pip install {fmt.distribution}" + (f"; then {fmt.note}" if fmt.note else ""),
        )
    return NoAdaptorError(
        f"no installed plugin recognises the model {shown}",
        hint=f"installed adaptors read: {_readers(adaptors)}. Pass one of these, or install "
        "the adaptor for your framework (pip install lpq-onnxrt, lpq-torch, lpq-tf, "
        "lpq-mxnet); `lpq plugins list` shows plugins that failed to load",
    )


def missing_framework_error(
    framework: str, adaptors: Mapping[str, AdaptorInfo], records: Sequence[PluginRecord]
) -> NoAdaptorError:
    """The error to raise when no loaded plugin provides ``framework``."""
    record = next((r for r in records if r.name == framework), None)
    installed = ", ".join(sorted(adaptors)) or "none"
    if record is not None and record.status is PluginStatus.DISABLED:
        return NoAdaptorError(
            f"the {framework!r} plugin ({record.distribution}) is installed but "
            f"{record.message or 'disabled'}",
            hint=_enable_hint(framework, record),
        )
    if record is not None and record.status in (PluginStatus.ERROR, PluginStatus.INCOMPATIBLE):
        return NoAdaptorError(
            f"the {framework!r} plugin ({record.distribution}) did not load: "
            f"{record.message.splitlines()[0]}",
            hint=record.hint or "`lpq plugins list` shows why",
        )
    known = next((f for f in KNOWN_FORMATS if f.plugin == framework), None)
    return NoAdaptorError(
        f"no installed plugin provides the {framework!r} framework",
        hint=f"installed adaptors: {installed}"
        + (f"; pip install {known.distribution}" if known else "")
        + "; `lpq plugins list` shows plugins that failed to load",
    )
