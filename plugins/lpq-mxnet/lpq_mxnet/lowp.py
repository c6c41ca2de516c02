"""lpq_convert_bf16: run chosen Convolution / FullyConnected ops in bfloat16 (oneDNN).

MXNet's AMP pass (``amp.convert_symbol``) inserts the casts around the chosen ops; the
parameters stay fp32 in the model and are cast by the graph. MXNet 1.9 has bf16 CPU
kernels for Convolution and FullyConnected only (``amp.list_lp16_ops``) and no fp16 CPU
kernels, so anything else is refused with a ModelError.

oneDNN's bf16 kernels need a CPU with AVX-512 BF16 or AMX-BF16. Without them MXNet fails
only when the model first runs ("could not create a primitive descriptor iterator"), so
the CPU is checked before converting: :func:`lpq.cpu_features` (which ``LPQ_CPU_FLAGS``
overrides, to plan for another CPU) must list ``avx512_bf16`` or ``amx_bf16``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lpq
from lpq import ModelError

from .framework import mxnet
from .graph import op_nodes
from .model_io import ModelInfo, fp32_graph

#: CPU flags (archspec's names) that give oneDNN bf16 kernels; any one is enough.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
#: What to do on a CPU without them.
NO_BF16_HINT = (
    "keep the model in fp32 (or quantize it to int8), or run on a CPU with AVX-512 BF16 "
    "or AMX (Intel Cooper Lake / Sapphire Rapids or later, AMD Zen 4 or later); MXNet has "
    "no fp16 CPU kernels either"
)


def check_bf16_cpu() -> None:
    """:raises lpq.ModelError: the CPU lpq plans for has no bf16 kernels for MXNet."""
    features = lpq.cpu_features()
    if features.flags & set(BF16_CPU_FLAGS):
        return
    raise ModelError(
        f"this CPU has no bf16 kernels for MXNet: oneDNN needs "
        f"{' or '.join(BF16_CPU_FLAGS)}, which the CPU does not have (flags from "
        f"{features.source})",
        hint=NO_BF16_HINT,
    )


def bf16_op_types() -> list[str]:
    """Op types MXNet's AMP runs in bf16 on this build."""
    from mxnet.contrib import amp
    from mxnet.contrib.amp.amp import bfloat16

    return list(amp.list_lp16_ops(bfloat16))


def cast_lowp(
    model: Any, op_names: Sequence[str], dtype: str, tune_cfg: dict[str, Any] | None = None
) -> Any:
    """A new block running ``op_names`` of the fp32 ``model`` in bf16.

    :param tune_cfg: the JSON of the tune_cfg this comes from, kept with the block.
    :raises lpq.ModelError: fp16, a CPU without bf16 kernels, an unknown op or an op type
        without a bf16 kernel.
    """
    mxnet()
    from mxnet.contrib import amp

    if dtype != "bf16":
        raise ModelError(
            f"MXNet has no {dtype} kernels on CPU",
            hint="use bf16 (oneDNN) or keep the ops in fp32",
        )
    check_bf16_cpu()

    graph = fp32_graph(model)
    types = dict(op_nodes(graph.json()))
    supported = bf16_op_types()
    for name in op_names:
        if name not in types:
            raise ModelError(
                f"the model has no op named {name}",
                hint="take op names from the adaptor's capability (lpq capability)",
            )
        if types[name] not in supported:
            raise ModelError(
                f"oneDNN has no bf16 kernel for {types[name]} (op {name})",
                hint=f"convert only {' / '.join(supported)} ops to bf16",
            )
    chosen = set(op_names)
    excluded = [n for n, t in types.items() if t in supported and n not in chosen]
    symbol = amp.convert_symbol(
        graph.symbol,
        "bfloat16",
        target_dtype_ops=supported,
        excluded_sym_names=excluded,
        data_names=list(graph.input_names),
    )
    info = ModelInfo(symbol, list(graph.input_names), "bf16", graph.tunable_ops(), tune_cfg)
    graph.symbol = symbol
    return graph.block(info)
