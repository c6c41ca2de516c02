"""lpq_inspect_tensor: capture per-op activations and weights, fp32 or quantized alike.

A PT2E graph has no submodule per conv/linear (they are ``call_function`` nodes), so
``nn.Module`` forward hooks cannot see its ops. Instead both the fp32 model (exported on
the fly) and the quantized graph run under a :class:`torch.fx.Interpreter` whose
``run_node`` acts as a per-node forward hook, keyed by the lpq op name stamped on each
node (:mod:`lpq_torch.graph`).

What is captured for an op: its output, taken *after* a directly following batch norm.
prepare_pt2e folds batch norm into the conv weights, so the quantized conv node already
produces "conv + bn"; capturing after the fp32 batch norm makes both sides comparable.
Quantized values are captured as the dequantized float tensors the graph computes with.
Weights are the values feeding the op (dequantized for quantized models), named
``<op name>.weight`` / ``<op name>.bias`` (for an ``nn.Module`` op that is the parameter's
qualified name, e.g. ``features.0.weight``): unique in the model, the same for the fp32
and the quantized model, and what :func:`lpq_torch.edit.set_tensor` takes. A quantized
conv1d that lpq runs as a conv2d (:mod:`lpq_torch.lowering`) is shown 3-D, as in fp32.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

from lpq import ConfigError, DataError, Inspection, split_batch

from . import graph, lowering, model_io
from .data import CallArgs, call_args, describe, first_batch
from .errors import first_line, framework_error, stage
from .graph import tensor_name, weight_args
from .info import DYNAMIC_ATTR, TUNE_CFG_ATTR
from .model_io import require_module

_BATCH_NORM = {"aten.batch_norm.default", "aten._native_batch_norm_legit_no_training.default"}


def _to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().float().cpu().numpy()
    return np.asarray(value, dtype=np.float32)


def _activation_node(node: torch.fx.Node) -> torch.fx.Node:
    if len(node.users) == 1:
        user = next(iter(node.users))
        if str(user.target) in _BATCH_NORM:
            if str(user.target).endswith("default") and "legit" in str(user.target):
                getitems = [u for u in user.users if u.args[1:] == (0,)]
                return getitems[0] if getitems else node
            return user
    return node


class _Capture(torch.fx.Interpreter):
    """Runs a graph and records the outputs of chosen nodes (a node-level forward hook)."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        wanted: dict[torch.fx.Node, Any],
        squeeze: set[torch.fx.Node] | None = None,
    ) -> None:
        super().__init__(gm)
        self.wanted = wanted
        self.squeeze = squeeze or set()
        self.seen: dict[Any, Any] = {}
        self.node: torch.fx.Node | None = None

    def run_node(self, n: torch.fx.Node) -> Any:
        self.node = n
        result = super().run_node(n)
        if n in self.wanted:
            self.seen[self.wanted[n]] = result.squeeze(-1) if n in self.squeeze else result
        return result

    def where(self) -> str:
        """The node that failed, by lpq op name when it has one."""
        if self.node is None:
            return "the graph's inputs"
        key = graph.op_key(self.node)
        if key is not None:
            return f"op {key[0]}"
        fed = [k[0] for user in self.node.users if (k := graph.op_key(user)) is not None]
        feeding = f", feeding op {', '.join(fed)}" if fed else ""
        return f"node {self.node.name} ({self.node.target}{feeding})"


def _run(capture: _Capture, args: CallArgs, quantized: bool) -> None:
    """Run one batch; a failure in a model lpq made is the framework's, not the data's."""
    try:
        capture.run(*_flat_inputs(args))
    except Exception as exc:
        if quantized:
            raise framework_error("inspect", exc, capture.where()) from exc
        raise DataError(
            f"the model could not run on the inspection data at {capture.where()}: "
            f"{first_line(exc)}",
            hint=f"pass inputs with the shapes the model expects (got {describe(args)})",
        ) from exc


def _graph_of(model: Any, dataloader: Iterable[Any]) -> torch.fx.GraphModule:
    module = require_module(model)
    if isinstance(module, torch.fx.GraphModule) and any(graph.quantizable_nodes(module)):
        return module
    return model_io.exported(module, first_batch(dataloader), copy_graph=False)


def _flat_inputs(args: CallArgs) -> list[Any]:
    leaves, _ = pytree.tree_flatten((args[0], args[1]))
    return leaves


def inspect_tensor(
    model: Any,
    dataloader: Iterable[Any],
    op_names: Sequence[str] | None,
    kind: str,
    iteration: int | None,
) -> Inspection:
    module = require_module(model)
    if hasattr(module, DYNAMIC_ATTR):
        return _inspect_modules(module, dataloader, op_names, kind, iteration)
    quantized = hasattr(module, TUNE_CFG_ATTR)
    gm = _graph_of(module, dataloader)
    nodes = {key[0]: node for key, node in graph.quantizable_nodes(gm)}
    names = list(nodes) if op_names is None else list(op_names)
    missing = [name for name in names if name not in nodes]
    if missing:
        raise ConfigError(
            f"no quantizable op named {', '.join(missing[:5])} in the model",
            hint="use op names from the capability query",
        )
    wanted: dict[torch.fx.Node, Any] = {}
    squeeze: set[torch.fx.Node] = set()  # 3-D tensors lpq computes 4-D (conv1d as conv2d)
    if kind in ("activation", "both"):
        for name in names:
            wanted[_activation_node(nodes[name])] = ("act", name)
            if lowering.is_conv1d_as_conv2d(nodes[name]):
                squeeze.add(nodes[name])
    if kind in ("weight", "both"):
        for name in names:
            for label, arg in weight_args(nodes[name]).items():
                wanted[arg] = ("w", name, tensor_name(name, label))
                if label == "weight" and lowering.is_conv1d_as_conv2d(nodes[name]):
                    squeeze.add(arg)
    result = Inspection()
    batches = 0
    with torch.no_grad():
        for item in dataloader:
            if iteration is not None and batches >= iteration:
                break
            capture = _Capture(gm, wanted, squeeze)
            _run(capture, call_args(split_batch(item)[0]), quantized)
            for tag, value in capture.seen.items():
                if tag[0] == "act":
                    result.activations.setdefault(tag[1], []).append(_to_numpy(value))
                elif batches == 0:
                    result.weights.setdefault(tag[1], {})[tag[2]] = _to_numpy(value)
            batches += 1
    if batches == 0:
        raise DataError("the inspection dataloader yielded no batches", hint="pass data")
    return result


def _inspect_modules(
    module: torch.nn.Module,
    dataloader: Iterable[Any],
    op_names: Sequence[str] | None,
    kind: str,
    iteration: int | None,
) -> Inspection:
    """Forward hooks on the Linear modules of a model from torchao's dynamic path.

    Its ops are modules (no exported graph); names that are not modules (matmuls) stay in
    fp32 there and are left out.
    """
    modules = dict(module.named_modules())
    names = [n for n in (op_names or getattr(module, DYNAMIC_ATTR)) if n in modules]
    result = Inspection()
    if kind in ("weight", "both"):
        for name in names:
            weight = getattr(modules[name], "weight", None)
            if isinstance(weight, torch.Tensor):
                value = weight.dequantize() if hasattr(weight, "dequantize") else weight
                result.weights[name] = {tensor_name(name, "weight"): _to_numpy(value)}
    seen: dict[str, Any] = {}
    handles = [
        modules[name].register_forward_hook(
            lambda _m, _i, out, name=name: seen.__setitem__(name, out)
        )
        for name in names
    ]
    batches = 0
    try:
        with torch.no_grad():
            for item in dataloader:
                if iteration is not None and batches >= iteration:
                    break
                args = call_args(split_batch(item)[0])
                with stage("inspect", "the dynamic int8 model"):
                    module(*args[0], **args[1])
                if kind in ("activation", "both"):
                    for name, value in seen.items():
                        result.activations.setdefault(name, []).append(_to_numpy(value))
                batches += 1
    finally:
        for handle in handles:
            handle.remove()
    if batches == 0:
        raise DataError("the inspection dataloader yielded no batches", hint="pass data")
    return result
