"""What the weight-only pass does to each op: the tune_cfg read into :class:`LayerChoice`,
and the ``lm_head`` decision.

The tune_cfg speaks in capability terms (``int4``/``uint4``/``int8`` weight dtype,
``sym``/``asym`` scheme, ``block_size`` and ``algorithm`` options); this module turns them
into the few numbers the maths in :mod:`lpq.weight_only` takes, once, with errors that
name the op.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from lpq import ConfigError, OpConfig

if TYPE_CHECKING:
    import onnx

#: Weight dtypes of the capability -> bits of the packed codes.
BITS = {"int4": 4, "uint4": 4, "int8": 8, "uint8": 8}
#: Algorithms this pass runs; the calibrated ones need activations.
ALGORITHMS = ("rtn", "gptq", "awq", "scale_search")
CALIBRATED = ("gptq", "awq")
#: ``lm_head`` option values (see :func:`decide_lm_head`).
LM_HEAD_CHOICES = ("auto", "fp32", "int8", "tuned")


@dataclass(frozen=True)
class LayerChoice:
    """How one MatMul (or Gather) weight is quantized."""

    name: str
    op_type: str
    bits: int
    block_size: int
    symmetric: bool
    algorithm: str

    def to_json(self) -> dict[str, Any]:
        return {
            "bits": self.bits,
            "block_size": self.block_size,
            "scheme": "sym" if self.symmetric else "asym",
            "algorithm": self.algorithm,
        }


def read_choices(
    ops: Mapping[str, OpConfig], op_types: Mapping[str, str]
) -> dict[str, LayerChoice]:
    """One :class:`LayerChoice` per op of the tune_cfg; ConfigError naming a bad op."""
    choices = {}
    for name, cfg in ops.items():
        weight = cfg.weight
        if weight is None or weight.dtype not in BITS:
            raise ConfigError(
                f"op {name}: weight-only quantization needs an int4, uint4 or int8 weight "
                f"config, got {None if weight is None else weight.dtype!r}",
                hint="use the weight_only options `lpq capability show onnxrt` lists",
            )
        algorithm = str(weight.algorithm or "rtn")
        if algorithm not in ALGORITHMS:
            raise ConfigError(
                f"op {name}: unknown weight-only algorithm {algorithm!r}",
                hint="use one of " + ", ".join(ALGORITHMS),
            )
        choices[name] = LayerChoice(
            name=name,
            op_type=op_types.get(name, "MatMul"),
            bits=BITS[weight.dtype],
            block_size=int(weight.options.get("block_size", 32)),
            symmetric=weight.scheme != "asym",
            algorithm=algorithm,
        )
    return choices


@dataclass(frozen=True)
class LmHead:
    """The MatMul that maps hidden states to the vocabulary, and whether its weight is the
    embedding table transposed (a tied ``lm_head``)."""

    name: str
    tied: bool


def find_lm_head(model: onnx.ModelProto) -> LmHead | None:
    """The last MatMul whose constant weight has as many columns as an embedding Gather
    has rows (the vocabulary), or None for a model without one."""
    from onnx import numpy_helper

    inits = {init.name: init for init in model.graph.initializer}
    tables = [
        inits[node.input[0]]
        for node in model.graph.node
        if node.op_type == "Gather" and node.input and node.input[0] in inits
    ]
    tables = [t for t in tables if len(t.dims) == 2]
    for node in reversed(model.graph.node):
        if node.op_type != "MatMul" or len(node.input) < 2 or node.input[1] not in inits:
            continue
        weight = inits[node.input[1]]
        for table in tables:
            if list(weight.dims) == [table.dims[1], table.dims[0]]:
                tied = bool(
                    np.array_equal(numpy_helper.to_array(weight), numpy_helper.to_array(table).T)
                )
                return LmHead(node.name, tied)
    return None


def decide_lm_head(
    choices: dict[str, LayerChoice], head: LmHead | None, option: Any
) -> dict[str, Any] | None:
    """Apply the ``lm_head`` option to ``choices`` in place; return what was decided.

    ``auto`` (default): a tied ``lm_head`` stays float (on SmolLM2 int4 RTN of the tied
    head cost about 5 of the 12 perplexity points int4 lost), an untied one is quantized
    as the tune_cfg says; ``fp32``: always float; ``int8``: 8-bit whatever the tune_cfg
    says; ``tuned``: as the tune_cfg says.
    """
    value = str(option if option is not None else "auto").lower()
    if value not in LM_HEAD_CHOICES:
        raise ConfigError(
            f"unknown lm_head option {option!r}", hint="use " + ", ".join(LM_HEAD_CHOICES)
        )
    if head is None:
        return None
    requested = choices.get(head.name)
    if requested is None:
        return {"name": head.name, "tied": head.tied, "kept": "fp32", "reason": "tune_cfg"}
    if value == "fp32" or (value == "auto" and head.tied):
        del choices[head.name]
        reason = "tied to the embedding: kept float" if head.tied else "lm_head=fp32"
        return {"name": head.name, "tied": head.tied, "kept": "fp32", "reason": reason}
    if value == "int8":
        choices[head.name] = replace(requested, bits=8)
    final = choices[head.name]
    return {"name": head.name, "tied": head.tied, "kept": f"int{final.bits}", "reason": value}
