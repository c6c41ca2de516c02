"""Model preparation: from the model a user has to a clean exported graph lpq can quantize.

Every job starts here: :func:`require_module` takes what the user passed (an
``nn.Module`` or a ``.pt2`` file) and :func:`exported` gives its prepared graph.

Each step answers a case met on published models:

1. **TorchScript** (``torch.jit.load`` / ``torch.jit.script``, e.g. Silero VAD's ``.jit``):
   converted with torch's TorchScript -> ExportedProgram converter, then exported like any
   module. A construct it cannot convert (``prim::If``: Python control flow compiled into
   TorchScript) is a :class:`lpq.ModelError` naming it and saying what to pass instead.
2. **Inference tensors** (made under ``torch.inference_mode``): inputs are cloned into
   normal tensors (:func:`lpq_torch.data.to_tensor`); weights made that way are a
   ModelError saying to build the model under ``torch.no_grad()``.
3. **Export** with ``torch.export`` and a dynamic batch dimension.
4. **Dead code elimination**: values nothing returns (``AutoModel``'s pooler when only
   ``last_hidden_state`` is used leaves a dead ``linear -> tanh``) are removed; torchao's
   x86 recipe fails on a fused pattern whose output has no user.
5. **One module path per call**: a module called twice (torchvision's ``BasicBlock`` calls
   ``self.relu`` twice) gives one source partition with two outputs, which the x86 recipe
   refuses. Each later call gets its own path (``layer1.0.relu@1``), as ``torch.export``
   already distinguishes calls in its ``nn_module_stack`` keys.
6. **Op names** stamped on the quantizable nodes (:mod:`lpq_torch.graph`).

The export is the slow step (seconds for a transformer), so :func:`exported` keeps one per
model in the run state (:mod:`lpq_torch.state`), keyed by the inputs' shapes and the
weights' identity and version: changing a weight in place forces a new export.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import os
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from lpq import ModelError

from . import archive, graph, state
from .data import CallArgs, at_least_two, describe, run
from .errors import first_line
from .info import EXAMPLE_ATTR, MODEL_SUFFIX
from .state import Exported


def is_causal_lm(module: Any) -> bool:
    """A Hugging Face causal LM (``generate`` and a ``config.model_type``), by duck typing.

    Such models are not exported: their Linears are listed by module path (capability)
    and they are evaluated eagerly (compiling a decoder costs minutes and the weight-only
    kernels are plain aten ops, which compilation does not speed up).
    """
    return callable(getattr(module, "generate", None)) and hasattr(
        getattr(module, "config", None), "model_type"
    )


def linear_ops(module: torch.nn.Module) -> list[tuple[str, str]]:
    """``(module path, op type)`` of every ``nn.Linear``, without exporting the model.

    The output projection of a causal LM (``get_output_embeddings()``) is op type
    ``lm_head`` so the capability can keep it float by default (it is often tied to the
    token embedding, and perplexity is most sensitive to it).
    """
    head = None
    get_head = getattr(module, "get_output_embeddings", None)
    if callable(get_head):
        with contextlib.suppress(Exception):
            head = get_head()
    return [
        (name, "lm_head" if sub is head else "linear")
        for name, sub in module.named_modules()
        if isinstance(sub, torch.nn.Linear) and name
    ]


def require_module(model: Any) -> torch.nn.Module:
    """``model`` itself, or the model in a ``.pt2`` file (``torch.export.save`` format)."""
    if isinstance(model, str | os.PathLike) and str(model).endswith(MODEL_SUFFIX):
        return archive.read(Path(model))
    if not isinstance(model, torch.nn.Module):
        raise ModelError(
            f"the PyTorch adaptor needs a torch.nn.Module, got {type(model).__qualname__}",
            hint="pass the nn.Module itself, or a .pt2 file written by torch.export.save",
        )
    return model


def export(model: Any, args: CallArgs, *, training: bool = False) -> torch.export.ExportedProgram:
    """Prepare and export ``model`` (steps 1-6 above); uncached.

    The model is run eagerly first so that inputs which do not fit are reported as a
    :class:`lpq.DataError`, separately from constructs ``torch.export`` cannot capture
    (:class:`lpq.ModelError`). The model's train/eval mode is restored afterwards.
    """
    module = require_module(model)
    args = at_least_two(args)
    _refuse_inference_weights(module)
    if isinstance(module, torch.jit.ScriptModule):
        module = from_torchscript(module, args)
    was_training = module.training
    _set_mode(module, training)
    try:
        with torch.no_grad():
            run(module, args)
        program = _export(module, args)
    finally:
        _set_mode(module, was_training)
    clean(program.graph_module)
    return program


def exported(model: torch.nn.Module, args: CallArgs, *, copy_graph: bool = True) -> Any:
    """The prepared fp32 graph of ``model`` (eval mode), exported once per run.

    :param copy_graph: return a deep copy (callers that insert observers or casts change
        the graph); ``False`` for read-only use (capability query, inspection).
    """
    found = _exported(model, args)
    if not copy_graph:
        return found.graph
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own pytree deprecation, from deepcopy
        return copy.deepcopy(found.graph)


def exported_program(model: torch.nn.Module, args: CallArgs) -> torch.export.ExportedProgram:
    """The run's export of ``model`` as a program (what ``torch.export.save`` writes)."""
    return _exported(model, args).program


def _exported(model: torch.nn.Module, args: CallArgs) -> Exported:
    _refuse_inference_weights(model)
    key = _cache_key(model, at_least_two(args))
    found = state.current().exports.get(model)
    if found is None or found.key != key:
        program = export(model, args)
        found = Exported(key, program, program.module())
        with contextlib.suppress(TypeError):  # a module that refuses weak references
            state.current().exports[model] = found
    return found


def _cache_key(model: torch.nn.Module, args: CallArgs) -> tuple[Any, ...]:
    def signature(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return (str(value.dtype), tuple(value.shape))
        if isinstance(value, list | tuple):
            return tuple(signature(v) for v in value)
        if isinstance(value, dict):
            return tuple((k, signature(v)) for k, v in sorted(value.items()))
        return repr(value)

    tensors = [*model.named_parameters(), *model.named_buffers()]
    weights = tuple((name, t.data_ptr(), t._version) for name, t in tensors)
    return signature(args[0]), signature(args[1]), weights


def clean(gm: torch.fx.GraphModule) -> None:
    """Steps 4-6 on an exported graph, in place."""
    gm.graph.eliminate_dead_code()
    gm.recompile()
    split_module_calls(gm)
    graph.stamp_op_names(gm)


_CALL_SUFFIX = re.compile(r"@(\d+)$")


def split_module_calls(gm: torch.fx.GraphModule) -> None:
    """Give every call of a module called several times its own module path.

    ``torch.export`` keys the n-th call of a module ``...@n`` in ``nn_module_stack`` but
    keeps the same fully qualified name; pattern matching groups nodes by that name.
    """
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if not stack:
            continue
        for key, (fqn, cls) in list(stack.items()):
            match = _CALL_SUFFIX.search(str(key))
            if match and not str(fqn).endswith(match.group(0)):
                stack[key] = (f"{fqn}{match.group(0)}", cls)


def from_torchscript(module: torch.jit.ScriptModule, args: CallArgs) -> torch.nn.Module:
    """A TorchScript module as an exportable module, via torch's converter."""
    try:
        from torch._export.converter import TS2EPConverter
    except ImportError as exc:  # moved or removed in a later torch
        raise ModelError(
            "this torch has no TorchScript -> ExportedProgram converter, so lpq cannot "
            "quantize a TorchScript (torch.jit) model",
            hint="pass the model's Python nn.Module (load the TorchScript model's "
            "state_dict() into it)",
        ) from exc
    positional, keywords = args
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = TS2EPConverter(module, positional, keywords or None).convert()
    except Exception as exc:
        messages = [first_line(e) for e in (exc, exc.__cause__) if e is not None]
        found = [m.group(1) for text in messages for m in re.finditer(r"(prim::\w+)", text)]
        construct = " / ".join(dict.fromkeys(found)) or "a TorchScript construct"
        raise ModelError(
            f"torch's TorchScript converter cannot convert this model: {construct} "
            f"({type(exc).__name__}: {'; '.join(messages)})",
            hint=_torchscript_hint(construct, _schema(module), args),
        ) from exc
    return program.module()


def _schema(module: torch.jit.ScriptModule) -> str:
    with contextlib.suppress(Exception):
        return str(module.forward.schema)  # type: ignore[attr-defined]
    return "forward(...)"


def _torchscript_hint(construct: str, schema: str, args: CallArgs) -> str:
    why = {
        "prim::If": "an if/else compiled into TorchScript",
        "prim::SetAttr": "forward() writing module attributes (streaming state)",
        "prim::Loop": "a Python loop compiled into TorchScript",
    }
    reasons = [why[c] for c in construct.split(" / ") if c in why]
    passed = len(args[0]) + len(args[1])
    arity = (
        f"the TorchScript forward is {schema} and the data passes {passed} input(s): pass "
        "every argument (TorchScript defaults are not converted), or "
        if schema.count(",") + 1 > passed + 1
        else ""
    )
    return (
        f"{arity}pass the model's Python nn.Module instead"
        + (f" ({'; '.join(reasons)} cannot be exported)" if reasons else "")
        + ": build it from the model's source and load the TorchScript model's state_dict() "
        "into it"
    )


def _refuse_inference_weights(module: torch.nn.Module) -> None:
    tensors = [*module.named_parameters(), *module.named_buffers()]
    made = [name for name, t in tensors if t.is_inference()]
    if made:
        raise ModelError(
            f"the model's weights ({', '.join(made[:3])}) were created under "
            "torch.inference_mode(); torch.export cannot trace them",
            hint="build or load the model under torch.no_grad() instead of "
            "torch.inference_mode(), or clone its weights outside it",
        )


def _set_mode(module: torch.nn.Module, training: bool) -> None:
    """train()/eval(), except on exported graphs, which refuse it (they are already fixed)."""
    with contextlib.suppress(NotImplementedError):
        module.train(training)


def _export(module: torch.nn.Module, args: CallArgs) -> torch.export.ExportedProgram:
    positional, keywords = args
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.export.export(
                module, positional, keywords, dynamic_shapes=_batch_dynamic(module, args)
            )
    except Exception as exc:  # torch raises many types; all mean "cannot export"
        raise ModelError(
            f"torch.export could not capture the model ({type(exc).__name__}): {first_line(exc)}",
            hint=_export_hint(str(exc)) + f" (example inputs: {describe(args)})",
        ) from exc


def _batch_dynamic(module: torch.nn.Module, args: CallArgs) -> dict[str, Any] | None:
    """Mark dim 0 of every tensor input AUTO-dynamic (export keeps it static if it must)."""
    try:
        bound = inspect.signature(module.forward).bind(*args[0], **args[1])
    except (TypeError, ValueError):
        return None  # no signature (a compiled method) or a mismatch export reports itself
    specs: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        param = bound.signature.parameters[name]
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            return None
        specs[name] = _dim0(value)
    return specs


def _dim0(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return {0: torch.export.Dim.AUTO} if value.dim() > 0 else None
    if isinstance(value, list | tuple):
        return type(value)(_dim0(v) for v in value)
    if isinstance(value, dict):
        return {k: _dim0(v) for k, v in value.items()}
    return None


def _export_hint(message: str) -> str:
    lowered = message.lower()
    if "inference tensors" in lowered or "inference mode" in lowered:
        return (
            "tensors created under torch.inference_mode() reach the model; create them "
            "under torch.no_grad() instead, or clone them outside inference mode"
        )
    if "data-dependent" in lowered or "data dependent" in lowered or "guardondata" in lowered:
        return (
            "forward() branches or loops on tensor values (data-dependent control flow); "
            "rewrite it with torch.where / torch.cond, or move the decision out of forward()"
        )
    if "unsupported" in lowered or "graph break" in lowered:
        return (
            "forward() uses a Python construct torch.export cannot trace (e.g. calls into "
            "non-torch libraries, .item()/.numpy(), print of tensors); keep forward() pure torch"
        )
    return "torch.export could not trace forward(); the message above names the construct"


def remember_example(model: torch.nn.Module, args: CallArgs) -> None:
    """Keep example inputs for ``model`` (later hooks without data export it with them)."""
    with contextlib.suppress(TypeError):
        state.current().examples[model] = at_least_two(args)


def example_for(model: torch.nn.Module) -> CallArgs | None:
    """The example inputs lpq kept for ``model`` (on the model it made, or in the run state)."""
    found: CallArgs | None = getattr(model, EXAMPLE_ATTR, None)
    if found is not None:
        return found
    return state.current().examples.get(model)
