"""Naming the quantizable ops of an exported graph (see :mod:`lpq_torch.model_io` for export).

Op names must survive export -> prepare -> convert -> save -> load, so each quantizable
node is stamped with ``node.meta["custom"]["lpq_op"]``; ``torch.export`` serialises the
``custom`` metadata, so a reloaded model still maps its nodes back to fp32 op names.

Naming rule: the fully qualified name of the innermost ``nn.Module`` that produced the node
(``features.0``) when that module owns exactly one quantizable node, otherwise
``<module path>/<node name>`` (functional calls, several matmuls in one attention block).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from lpq import ConfigError, OpKey, TuneConfig

#: ATen ops lpq can quantize, mapped to the op type used in the capability YAML.
QUANTIZABLE = {
    "aten.conv1d.default": "conv1d",
    "aten.conv2d.default": "conv2d",
    "aten.linear.default": "linear",
    "aten.matmul.default": "matmul",
}
LPQ_OP = "lpq_op"


def op_type_of(node: torch.fx.Node) -> str | None:
    if node.op != "call_function":
        return None
    return QUANTIZABLE.get(str(node.target))


def stamp_op_names(gm: torch.fx.GraphModule) -> None:
    """Give every quantizable node its lpq op name (see the module docstring).

    Nodes that already carry a name (a re-exported lpq graph) keep it.
    """
    nodes = [
        (n, t) for n in gm.graph.nodes if (t := op_type_of(n)) is not None and op_key(n) is None
    ]
    owners: dict[str, int] = {}
    for node, _ in nodes:
        owners[_owner(node)] = owners.get(_owner(node), 0) + 1
    for node, op_type in nodes:
        owner = _owner(node)
        if owner and owners[owner] == 1:
            name = owner
        else:
            name = f"{owner}/{node.name}" if owner else node.name
        node.meta.setdefault("custom", {})[LPQ_OP] = f"{name}|{op_type}"


def _owner(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    fqn = list(stack.values())[-1][0]
    return str(fqn)


def op_key(node: torch.fx.Node) -> OpKey | None:
    """The ``(op name, op type)`` stamped on ``node``, if it is a quantizable op."""
    tag = (node.meta.get("custom") or {}).get(LPQ_OP)
    if not tag:
        return None
    name, op_type = str(tag).rsplit("|", 1)
    return name, op_type


def quantizable_nodes(gm: torch.fx.GraphModule) -> Iterator[tuple[OpKey, torch.fx.Node]]:
    """Quantizable nodes of an exported/converted graph, in graph order."""
    for node in gm.graph.nodes:
        key = op_key(node)
        if key is not None and op_type_of(node) is not None:
            yield key, node


def check_ops(tune_cfg: TuneConfig, gm: torch.fx.GraphModule) -> None:
    """Refuse a tune_cfg naming ops ``gm`` does not have (before any pass runs)."""
    present = {key for key, _ in quantizable_nodes(gm)}
    unknown = [key for key in tune_cfg.ops if key not in present]
    if unknown:
        shown = ", ".join(f"{name} ({op_type})" for name, op_type in unknown[:5])
        raise ConfigError(
            f"the tune_cfg names ops the model does not have: {shown}",
            hint="use op names and types from the capability query (module paths such as "
            "'features.0' with op types conv2d/linear/matmul)",
        )


def tensor_name(op: str, label: str) -> str:
    """The name of an op's weight (``label`` ``weight``) or bias in inspection and set_tensor."""
    return f"{op}.{label}"


def weight_args(node: torch.fx.Node) -> dict[str, torch.fx.Node]:
    """``{"weight": ..., "bias": ...}``: the nodes feeding a conv/linear op's weight and bias."""
    if op_type_of(node) == "matmul":
        return {}  # activation x activation: no weights
    return {
        label: arg
        for label, arg in zip(("weight", "bias"), node.args[1:3])
        if isinstance(arg, torch.fx.Node)
    }
