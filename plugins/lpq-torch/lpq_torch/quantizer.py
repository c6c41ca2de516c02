"""An X86InductorQuantizer that applies lpq's tune_cfg op by op.

PyTorch's ``X86InductorQuantizer`` knows the x86 int8 recipe: which patterns fuse
(conv + bn + relu, linear + add + relu, ...), where observers go so Inductor can lower
``dq -> conv -> relu -> q`` into one oneDNN int8 kernel, and which int8-in/int8-out ops
(max_pool2d, cat, flatten, ...) inherit quantization. Its public knobs select configs by
module name or op type only, and a module-name config misses fused patterns whose nodes
come from sibling modules (``Conv2d`` then ``ReLU`` in a ``Sequential``).

:class:`LpqX86Quantizer` keeps the recipe and swaps the selection: ops are grouped by
identical config, and each group is annotated with a filter that accepts a pattern when
its conv/linear/matmul node is one of the group's lpq op names (see :mod:`lpq_torch.graph`);
propagated ops follow the group of the quantized op that feeds them. fp32-fallback ops are
annotated first with a ``None`` config, which marks them "do not quantize".

The recipe finds its patterns by *module type* (``nn.Conv1d`` then ``nn.ReLU``), so it
misses conv1d followed by ``F.relu`` and a conv1d alone (Silero VAD's convs), leaving
them in float while lpq's plan says int8. A last pass annotates every op of a quantized
group the recipe left untouched by graph structure instead: conv1d/conv2d (with a directly
following ``relu`` fused, as Inductor's int8 kernels fuse it) and linear. What really got
quantized is read back from the converted graph (:mod:`lpq_torch.precision`), never assumed.

This relies on ``X86InductorQuantizer._annotate_with_config`` and
``_annotate_output_for_int8_in_int8_out_pattern_entry`` (private, pinned by
``torchao==0.18.0``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torchao.quantization.pt2e.quantizer.utils import QuantizationConfig
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    QUANT_ANNOTATION_KEY,
    X86InductorQuantizer,
    _is_any_annotated,
    _X86InductorQuantizationAnnotation,
    propagation_quantizable_ops,
)

from .graph import op_key, op_type_of, quantizable_nodes

#: One group: the op names it covers and their config (``None``: keep in fp32).
Group = tuple[frozenset[str], QuantizationConfig | None]


def _producer_op(node: torch.fx.Node, limit: int = 32) -> str | None:
    """The lpq op name of the quantizable node feeding ``node`` through propagated ops."""
    current = node
    for _ in range(limit):
        inputs = current.all_input_nodes
        if not inputs:
            return None
        current = inputs[0]
        key = op_key(current)
        if key is not None and op_type_of(current) is not None:
            return key[0]
    return None


_RELU = {torch.ops.aten.relu.default, torch.ops.aten.relu_.default}


def _single_relu_user(node: torch.fx.Node) -> torch.fx.Node | None:
    """The relu that alone consumes ``node`` (fused into the int8 conv), if any."""
    if len(node.users) != 1:
        return None
    user = next(iter(node.users))
    if user.op == "call_function" and user.target in _RELU and not _is_any_annotated([user]):
        return user
    return None


def _group_filter(names: frozenset[str]) -> Callable[[list[torch.fx.Node]], bool]:
    def accept(nodes: list[torch.fx.Node]) -> bool:
        anchors = [key[0] for n in nodes if (key := op_key(n)) is not None and op_type_of(n)]
        if anchors:
            return all(name in names for name in anchors)
        if all(n.target in propagation_quantizable_ops for n in nodes):
            return all(_producer_op(n) in names for n in nodes)
        return False  # e.g. standalone elementwise mul: lpq leaves it in float

    return accept


class LpqX86Quantizer(X86InductorQuantizer):
    """X86 int8 recipe, configured per lpq op name instead of per module or op type."""

    def __init__(self, groups: Sequence[Group]) -> None:
        super().__init__()
        # Fallback groups first: once a node is annotated, later groups skip it.
        self.groups = sorted(groups, key=lambda group: group[1] is not None)

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        for names, config in self.groups:
            self._annotate_with_config(model, config, _group_filter(names))
        for names, config in self.groups:
            if config is not None:
                self._annotate_missed(model, config, names)
        self._annotate_output_for_int8_in_int8_out_pattern_entry(model)
        return model

    def _annotate_missed(
        self, model: torch.fx.GraphModule, config: QuantizationConfig, names: frozenset[str]
    ) -> None:
        """Annotate the group's conv/linear nodes the module-type patterns did not match."""
        for (name, op_type), node in list(quantizable_nodes(model)):
            if name not in names or _is_any_annotated([node]):
                continue
            if op_type in ("conv1d", "conv2d"):
                relu = _single_relu_user(node)
                self._annotate_conv_node_helper(node, relu is None, config)
                if relu is not None:
                    relu.meta[QUANT_ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                        _annotated=True, _is_output_of_quantized_pattern=True
                    )
            elif op_type == "linear":
                self._annotate_linear_node_helper(node, True, config)

    def validate(self, model: torch.fx.GraphModule) -> None:
        return None
