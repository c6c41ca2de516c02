"""lpq_quantized_ops: what really runs in which precision, read from the converted model.

Each tunable op of the fp32 model is reported as ``int8`` when its node runs an int8
kernel (a fused oneDNN subgraph with ``quantized=true``, or a ``_contrib_quantized_*``
node), ``bf16`` when its output is bfloat16 (type inference of the AMP-converted graph),
and ``fp32`` otherwise.
"""

from __future__ import annotations

from typing import Any

from .graph import group_of, groups
from .model_io import Graph, to_graph


def quantized_ops(model: Any) -> dict[str, str]:
    """fp32 op name -> precision it runs in, read from the model's graph."""
    graph = to_graph(model)
    precision = graph.info.precision if graph.info is not None else "fp32"
    ops = graph.tunable_ops()
    if precision == "bf16":
        dtypes = _output_dtypes(graph)
        return {
            name: "bf16" if "bfloat16" in str(dtypes.get(f"{name}_output")) else "fp32"
            for name, _ in ops
        }
    if precision != "int8":
        return {name: "fp32" for name, _ in ops}
    found = groups(graph.json())
    result = {}
    for name, _ in ops:
        group = group_of(found, name)
        result[name] = "int8" if group is not None and group.quantized else "fp32"
    return result


def _output_dtypes(graph: Graph) -> dict[str, Any]:
    internals = graph.symbol.get_internals()
    _, out_types, _ = internals.infer_type(**{n: "float32" for n in graph.input_names})
    return dict(zip(internals.list_outputs(), out_types or []))
