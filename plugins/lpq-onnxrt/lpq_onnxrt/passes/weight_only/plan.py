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
from lpq.weight_only import BlockQuantized

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
    #: the embedding table initializer (the Gather's), when it is a separate initializer
    table: str | None = None


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
                return LmHead(node.name, tied, table.name if table.name != weight.name else None)
    return None


def decide_lm_head(
    choices: dict[str, LayerChoice], head: LmHead | None, option: Any, measurable: bool = False
) -> dict[str, Any] | None:
    """Apply the ``lm_head`` option to ``choices`` in place; return what was decided.

    ``auto`` (default): with calibration data (``measurable``) the head is set to int8
    here with ``kept: "measure"``, and :func:`measure_lm_head` then keeps it int8 or float
    by its next-token agreement; without data, a tied ``lm_head`` stays float (on SmolLM2
    int4 RTN of the tied head cost about 5 of the 12 perplexity points int4 lost), an
    untied one is quantized as the tune_cfg says; ``fp32``: always float; ``int8``: 8-bit
    whatever the tune_cfg says; ``tuned``: as the tune_cfg says.
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
    if value == "auto" and measurable:
        choices[head.name] = replace(requested, bits=8, algorithm="rtn")
        return {"name": head.name, "tied": head.tied, "kept": "measure", "reason": "auto"}
    if value == "fp32" or (value == "auto" and head.tied):
        del choices[head.name]
        reason = "tied to the embedding: kept float" if head.tied else "lm_head=fp32"
        return {"name": head.name, "tied": head.tied, "kept": "fp32", "reason": reason}
    if value == "int8":
        choices[head.name] = replace(requested, bits=8)
    final = choices[head.name]
    return {"name": head.name, "tied": head.tied, "kept": f"int{final.bits}", "reason": value}


#: ``lm_head=auto`` keeps an int8 head when its next-token top-1 agreement with the float
#: head on the calibration windows is at least this, and its mean KL at most the next.
LM_HEAD_MIN_AGREEMENT = 0.99
LM_HEAD_MAX_KL = 0.01


def measure_lm_head(
    weight: np.ndarray,
    hidden: np.ndarray,
    quantized: BlockQuantized,
    options: Mapping[str, Any],
) -> dict[str, Any]:
    """fp32 against int8 (``quantized``: the head's RTN codes) logits of the head on
    ``hidden`` (its input rows from the calibration windows): top-1 agreement, mean KL,
    and whether int8 is kept (``options``: ``lm_head_min_agreement``, ``lm_head_max_kl``)."""
    found: dict[str, float] = {}
    for start in range(0, len(hidden), 128):  # (128, vocab) logits at a time
        x = np.asarray(hidden[start : start + 128], dtype=np.float32)
        compare_logits(found, x @ weight, dequantized_product(x, quantized))
    rows = int(found.get("rows", 0))
    agreement = found.get("top1", 0.0) / max(rows, 1)
    kl = found.get("kl", 0.0) / max(rows, 1)
    need = float(options.get("lm_head_min_agreement", LM_HEAD_MIN_AGREEMENT))
    most = float(options.get("lm_head_max_kl", LM_HEAD_MAX_KL))
    return {
        "int8_top1_agreement": round(agreement, 5),
        "int8_mean_kl": round(kl, 6),
        "rows": rows,
        "thresholds": {"min_agreement": need, "max_kl": most},
        "int8": bool(rows and agreement >= need and kl <= most),
    }


def dequantized_product(
    x: np.ndarray, quantized: BlockQuantized, columns: int = 4096
) -> np.ndarray:
    """``x @ quantized.dequantize()``, dequantizing a few thousand columns at a time: the
    whole float head (49152 wide) and its temporaries would take 400 MB more."""
    from lpq.weight_only import dequantize_blocks

    out = np.empty((x.shape[0], quantized.shape[1]), dtype=np.float32)
    for at in range(0, quantized.shape[1], columns):
        part = slice(at, at + columns)
        deq = dequantize_blocks(
            quantized.codes[:, part],
            quantized.scales[:, part],
            quantized.zero_points[:, part],
            quantized.block_size,
        )
        out[:, part] = x @ deq
    return out


def compare_logits(found: dict[str, float], reference: np.ndarray, candidate: np.ndarray) -> None:
    """Add the top-1 agreement and KL sums of ``candidate`` against ``reference`` logits
    (rows, vocab) to ``found`` (``top1``, ``kl``, ``rows``), 16 rows at a time: the
    metrics work in float64, 6 MB a row-set of 16 at SmolLM2's 49152 tokens."""
    from lpq.weight_only.metrics import mean_kl, top1_agreement

    for start in range(0, len(reference), 16):
        a, b = reference[start : start + 16], candidate[start : start + 16]
        found["top1"] = found.get("top1", 0.0) + top1_agreement(a, b) * len(a)
        found["kl"] = found.get("kl", 0.0) + mean_kl(a, b) * len(a)
        found["rows"] = found.get("rows", 0.0) + len(a)
