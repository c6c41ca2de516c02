"""The lpq plugin contract: every hook a plugin may implement.

Plugins implement hooks with ``@lpq.hookimpl`` and are found through the ``lpq``
entry-point group (see ``docs/writing-a-plugin.md``). Two kinds of hooks exist:

* **Registration hooks** (``lpq_register_*``) are called once when a plugin is loaded.
  They receive a ``register`` callback; call it once per thing you provide.
* **Per-framework hooks** are dispatched with ``firstresult=True``: lpq calls each
  plugin's implementation in turn and stops at the first that returns something other
  than ``None``. An implementation therefore returns ``None`` whenever ``framework`` is
  not its own.

lpq itself never calls ``pm.hook`` outside :mod:`lpq.plugins.manager`; strategies and the CLI go
through that typed facade. Model objects are opaque to lpq: whatever an adaptor's
``lpq_quantize`` returns is what its ``lpq_evaluate`` and ``lpq_save_model`` receive.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import pluggy

from .eval.evaluation import EvalResult, Inspection, LatencyMeasurer, Metric, Postprocess
from .plan.capability import FrameworkCapability
from .plan.tune_config import TuneConfig
from .plugins.types import (
    RegisterAdaptor,
    RegisterBackendProfile,
    RegisterExample,
    RegisterExecutor,
    RegisterMetric,
    RegisterStrategy,
)

PROJECT_NAME = "lpq"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# --------------------------------------------------------------------------- registration


@hookspec
def lpq_register_adaptors(register: RegisterAdaptor) -> None:
    """Register the framework adaptors this plugin provides.

    :param register: call with one :class:`lpq.AdaptorInfo` per framework.

    Called once, when the plugin is loaded. Must not import the framework: ``lpq plugins
    list`` calls it and has to stay fast.
    """


@hookspec
def lpq_register_strategies(register: RegisterStrategy) -> None:
    """Register tuning strategies.

    :param register: call as ``register(name, factory)`` where ``factory(**kwargs)``
        returns an :class:`lpq.strategy.Strategy` subclass instance.

    Called once, when the plugin is loaded. Strategies must not import a framework.
    """


@hookspec
def lpq_register_metrics(register: RegisterMetric) -> None:
    """Register evaluation metrics.

    :param register: call as ``register(name, factory)``; ``factory(**kwargs)`` returns an
        object following the :class:`lpq.Metric` protocol.

    Called once, when the plugin is loaded.
    """


@hookspec
def lpq_register_backend_profiles(register: RegisterBackendProfile) -> None:
    """Register backend profiles (named adaptor settings for a kind of hardware).

    :param register: call with one :class:`lpq.BackendProfile` per profile.

    Called once, when the plugin is loaded.
    """


@hookspec
def lpq_register_examples(register: RegisterExample) -> None:
    """Register built-in examples that ``lpq tune --example NAME`` runs with no other input.

    :param register: call with one :class:`lpq.Example` per example (a model path, its
        calibration and evaluation ``.npz`` files and the metric to use).

    Called once, when the plugin is loaded. Keep example files small and in the package.
    """


@hookspec
def lpq_register_executors(register: RegisterExecutor) -> None:
    """Register trial executors (how a batch of trials is run: serially, in a local
    process pool, on a Ray cluster, on your own scheduler).

    :param register: call as ``register(name, factory)``; ``factory(workers=N, **options)``
        returns an :class:`lpq.Executor`.

    Called once, when the plugin is loaded. Must not import the executor's engine (e.g.
    ``ray``): import it when the factory is called.
    """


# ------------------------------------------------------------------- per-framework hooks


@hookspec(firstresult=True)
def lpq_detect_framework(model: Any) -> str | None:
    """Say whether ``model`` belongs to this plugin's framework.

    :param model: a model object or a filesystem path (``str`` or :class:`pathlib.Path`).
    :return: the framework name (as in :class:`lpq.AdaptorInfo`) or ``None`` if the model
        is not one this plugin handles. Must not raise for foreign models.

    Called when the user did not name a framework. Check cheaply (file suffix and magic
    bytes, or ``type(model).__module__``) so that foreign frameworks are not imported.
    """


@hookspec(firstresult=True)
def lpq_query_fw_capability(
    framework: str, model: Any, dataloader: Iterable[Any] | None, options: dict[str, Any]
) -> FrameworkCapability | None:
    """Report what can be quantized in ``model`` and how.

    :param framework: the framework being dispatched; return ``None`` if not yours.
    :param model: the fp32 model (object or path).
    :param dataloader: calibration data, for adaptors that need example inputs to trace
        or export the model; may be ``None``.
    :param options: global options (e.g. a backend profile's settings).
    :return: opwise and optypewise capability, built from the adaptor's capability YAML
        block for the installed framework version (see :meth:`lpq.CapabilitySpec.build`).

    Called once per tuning run, before the tuning space is built.
    """


@hookspec(firstresult=True)
def lpq_query_fused_patterns(framework: str, model: Any) -> list[tuple[str, ...]] | None:
    """Report the op-type sequences in ``model`` the framework fuses (e.g. Conv+Relu).

    :return: one tuple of op types per fusable pattern found, or ``None`` if not yours.

    Strategies fall back fused ops together, since quantizing half a fused pattern
    gains nothing.
    """


@hookspec(firstresult=True)
def lpq_quantize(
    framework: str,
    model: Any,
    tune_cfg: TuneConfig,
    calib_dataloader: Iterable[Any] | None,
    train_func: Callable[[Any], Any] | None,
) -> Any | None:
    """Calibrate and quantize ``model`` exactly as ``tune_cfg`` says, op by op.

    :param tune_cfg: per-op choices; ops set to a float precision must stay in it.
    :param calib_dataloader: calibration batches (inputs or ``(inputs, labels)``); use at
        most ``tune_cfg.calib_sampling_size`` samples. ``None`` only for approaches that
        need no calibration (dynamic, weight-only).
    :param train_func: for quantization-aware training: called with the prepared
        (fake-quantized) model, trains it in place and may return it.
    :return: the quantized model, which ``lpq_evaluate``, ``lpq_inspect_tensor`` and
        ``lpq_save_model`` accept — bare, or inside an :class:`lpq.QuantizeResult` with
        what the adaptor already knows (per-op precisions read from the converted model,
        the resolved tune_cfg, the size), so the trial asks no further hook for them;
        ``None`` if ``framework`` is not yours.

    Called once per trial. Raise :class:`lpq.ModelError` or :class:`lpq.DataError` for
    problems the user can fix. Must not modify ``model``.
    """


@hookspec(firstresult=True)
def lpq_evaluate(
    framework: str,
    model: Any,
    dataloader: Iterable[Any],
    postprocess: Postprocess | None,
    metrics: Sequence[Metric],
    measurer: LatencyMeasurer | None,
    iteration: int | None,
) -> EvalResult | None:
    """Run ``model`` over ``dataloader`` and compute ``metrics``.

    :param dataloader: batches of inputs or ``(inputs, labels)``.
    :param postprocess: applied to ``(preds, labels)`` of each batch before the metrics.
    :param metrics: reset them, ``update(preds, labels)`` per batch with numpy values.
    :param measurer: wrap only the framework's run call in ``measurer.measure()``.
    :param iteration: stop after this many batches (``None``: all).
    :return: the metric values and median latency, or ``None`` if not yours.

    Called for the fp32 baseline and for every trial's quantized model.
    """


@hookspec(firstresult=True)
def lpq_convert_bf16(
    framework: str, model: Any, op_names: Sequence[str], dtype: Literal["bf16", "fp16"]
) -> Any | None:
    """Run the named ops of ``model`` in bf16 or fp16, inserting casts around them.

    :return: the converted model (a new object), or ``None`` if not yours.
    :raises lpq.ModelError: when the framework has no kernel for an op in that dtype.
    """


@hookspec(firstresult=True)
def lpq_inspect_tensor(
    framework: str,
    model: Any,
    dataloader: Iterable[Any],
    op_names: Sequence[str] | None,
    kind: Literal["activation", "weight", "both"],
    iteration: int | None,
) -> Inspection | None:
    """Capture activations and/or weights of chosen ops, fp32 or quantized.

    :param model: an fp32 model or one returned by ``lpq_quantize``.
    :param op_names: fp32 op names to capture (``None``: every quantizable op).
    :param kind: which tensors to capture.
    :param iteration: number of batches to run.
    :return: an :class:`lpq.Inspection` keyed by fp32 op names, values dequantized, or
        ``None`` if not yours.

    Used by the ``mse`` and ``auto`` strategies to rank ops by quantization error, and by
    diagnosis reports.
    """


@hookspec(firstresult=True)
def lpq_quantized_ops(framework: str, model: Any) -> dict[str, str] | None:
    """Report, read from the converted model itself, the precision each op really runs in.

    :param model: a model returned by ``lpq_quantize``.
    :return: fp32 op name -> precision actually found in the converted graph (``int8``,
        ``uint8``, ``int4``, ``bf16``, ``fp16`` or ``fp32``) for every op the capability
        listed, or ``None`` if not yours.

    Called after every trial's quantization. lpq reports quantized and fallback op counts
    and the per-op table from this answer, never from the tune_cfg it asked for: a
    framework may silently leave an op in float. Optional: without it lpq reports the
    plan and says so.
    """


@hookspec(firstresult=True)
def lpq_output_names(framework: str, model: Any) -> list[str] | None:
    """Name the model's outputs, in the order ``lpq_evaluate`` passes them to metrics.

    :param model: a model ``lpq_evaluate`` accepts (the user's fp32 model or a quantized one).
    :return: the output names, or ``None`` if the framework is not yours or its outputs
        have no names.

    Called once when lpq picks a label-free metric from the fp32 model's outputs. Where
    the outputs' shapes leave the task open, a name settles it: an output named as hidden
    states or an embedding (``last_hidden_state``) is scored by cosine similarity, not by
    per-position top-1 agreement. Optional: without it lpq reads shapes only.
    """


@hookspec(firstresult=True)
def lpq_resolved_config(framework: str, model: Any) -> TuneConfig | None:
    """Say which tune_cfg this model really is, when the adaptor resolved a choice the
    tune_cfg left to it (lpq-onnxrt's ``auto`` range algorithm, resolved to ``mse``).

    :param model: a model returned by ``lpq_quantize``.
    :return: a tune_cfg that, passed to ``lpq_quantize`` again, gives this same model
        (every choice spelled out); ``None`` if not yours, or if nothing was resolved.

    Called after every trial's quantization. lpq answers a later proposal of that
    tune_cfg from this trial instead of spending a trial on it again: the tuner's
    calibration stage proposes each algorithm by name, and one of them is what ``auto``
    already chose. Optional. Return ``None`` when quantizing the resolved config again
    could give another model (for example, when it would measure latencies anew).
    """


@hookspec(firstresult=True)
def lpq_set_tensor(framework: str, model: Any, tensor_name: str, value: Any) -> Any | None:
    """Write ``value`` (a numpy array) into the named weight or bias tensor of ``model``.

    :param model: an fp32 model or one returned by ``lpq_quantize``.
    :param tensor_name: the tensor's name as ``lpq_inspect_tensor`` reports it in
        :attr:`lpq.Inspection.weights` (for quantized models: the fp32 name; the adaptor
        re-quantizes the value with the tensor's existing scale).
    :param value: the new value, same shape as the tensor.
    :return: the model with the tensor replaced (a new object or ``model`` itself), or
        ``None`` if not yours.

    Lets core-side algorithms (bias correction, weight equalization) work on any
    adaptor. Optional: lpq raises :class:`lpq.NoAdaptorError` when an algorithm needs it
    and the adaptor lacks it. Raise :class:`lpq.ModelError` for an unknown tensor name or
    a shape mismatch.
    """


@hookspec(firstresult=True)
def lpq_convert(framework: str, model: Any, target: str, options: dict[str, Any]) -> Any | None:
    """Convert ``model`` into another format.

    :param model: a model of this framework (fp32, quantized, or QAT-prepared).
    :param target: what to produce: ``"onnx"`` (an ONNX model; QDQ nodes where the model
        is quantized), ``"deploy"`` (a QAT / fake-quantized model to its deployable int8
        form), or an adaptor-specific name.
    :param options: target options (e.g. ``{"opset": 17, "example_inputs": ...}``).
    :return: the converted model (an ``onnx.ModelProto`` for ``"onnx"``), or ``None`` if
        not yours. Raise :class:`lpq.ModelError` for a target the adaptor does not offer,
        naming the targets it does.

    Called by ``lpq deploy`` and the Python API. Optional.
    """


@hookspec(firstresult=True)
def lpq_quantize_input(framework: str, model: Any, options: dict[str, Any]) -> Any | None:
    """Make a quantized model take and return integer tensors at its boundary.

    :param model: a model returned by ``lpq_quantize``.
    :param options: ``{"inputs": True, "outputs": True}`` and the integer dtype.
    :return: the model with the first quantize / last dequantize removed, so callers feed
        and read ``int8``/``uint8`` tensors directly (their scales and zero points are in
        the model's metadata), or ``None`` if not yours.

    For pipelines that already hold int8 data (camera ISPs, a previous int8 model).
    Optional.
    """


@hookspec(firstresult=True)
def lpq_save_model(framework: str, model: Any, path: Path) -> Path | None:
    """Write ``model`` (fp32 or quantized) to ``path`` atomically.

    Store what is needed to reload it without recalibration (tune_cfg, ranges).

    :return: the path(s) written (a file or a directory), or ``None`` if not yours.
    """


@hookspec(firstresult=True)
def lpq_load_model(framework: str, path: Path) -> Any | None:
    """Load a model written by ``lpq_save_model``.

    :return: the model, or ``None`` if not yours. Never unpickles arbitrary code.
    """
