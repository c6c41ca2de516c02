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

This relies on ``X86InductorQuantizer._annotate_with_config`` and
``_annotate_output_for_int8_in_int8_out_pattern_entry`` (private, pinned by
``torchao==0.18.0``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torchao.quantization.pt2e.quantizer.utils import QuantizationConfig
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    propagation_quantizable_ops,
)

from .graph import op_key, op_type_of

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
        self._annotate_output_for_int8_in_int8_out_pattern_entry(model)
        return model

    def validate(self, model: torch.fx.GraphModule) -> None:
        return None
