"""Which quantized ops int8 makes slower than fp32, from ORT's per-node profiles."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .timing import measuring_options

if TYPE_CHECKING:
    import numpy as np
    import onnx


def profile_blame(
    options: Mapping[str, Any],
    feed: Mapping[str, np.ndarray],
    fp32_model: onnx.ModelProto,
    ops: Sequence[str],
) -> Callable[[onnx.ModelProto, frozenset[str]], list[str]]:
    """A ``blame`` function: quantized ops whose int8 cost exceeds their fp32 cost.

    ORT's profiler gives each node of the optimized graph its time. An op's int8 cost is
    the time of the nodes named after it (``QLinearConv`` keeps the op's name as prefix)
    plus a share of the QuantizeLinear / DequantizeLinear nodes next to them; its fp32
    cost is the time of its nodes in the fp32 model (matched by name or output tensor).
    """
    options = measuring_options(options)
    fp32_profile: list[dict[str, _Timed]] = []  # profiled on the first call only
    by_output = {out: node.name for node in fp32_model.graph.node for out in node.output}

    def blame(model: onnx.ModelProto, fp32_ops: frozenset[str]) -> list[str]:
        quantized = [name for name in ops if name not in fp32_ops]
        if not fp32_profile:
            fp32_profile.append(_node_times(fp32_model, options, feed))
        fp32_times = fp32_profile[0]
        int8_times = _node_times(model, options, feed)
        int8_cost = _attribute(int8_times, quantized, by_output, with_qdq=True)
        fp32_cost = _attribute(fp32_times, quantized, by_output, with_qdq=False)
        return [
            name
            for name in quantized
            if int8_cost.get(name, 0.0) > 1.1 * fp32_cost.get(name, 0.0) + 1e-3
        ]

    return blame


@dataclass
class _Timed:
    op_type: str
    inputs: list[str]
    outputs: list[str]
    ms: float


def _node_times(
    model: onnx.ModelProto,
    options: Mapping[str, Any],
    feed: Mapping[str, np.ndarray],
    runs: int = 10,
) -> dict[str, _Timed]:
    """Per-node time (ms per run) of the ORT-optimized ``model``, with its wiring."""
    import tempfile

    import onnx

    from ..session import create_session

    with tempfile.TemporaryDirectory(prefix="lpq-profile-") as tmp:
        optimized = os.path.join(tmp, "optimized.onnx")
        session = create_session(
            model,
            {
                **options,
                "enable_profiling": os.path.join(tmp, "profile"),
                "optimized_model_filepath": optimized,
            },
        )
        for _ in range(runs + 2):
            session.run(None, dict(feed))
        profile = session.end_profiling()
        events = json.loads(Path(profile).read_text(encoding="utf-8"))
        graph = onnx.load(optimized, load_external_data=False).graph
    wiring = {node.name: node for node in graph.node}
    times: dict[str, _Timed] = {}
    skip = 2  # the first runs are warm-up
    seen_runs: dict[str, int] = {}
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        name = event["name"][: -len("_kernel_time")]
        seen_runs[name] = seen_runs.get(name, 0) + 1
        if seen_runs[name] <= skip:
            continue
        node = wiring.get(name)
        entry = times.get(name)
        if entry is None:
            entry = times[name] = _Timed(
                event["args"].get("op_name", ""),
                list(node.input) if node is not None else [],
                list(node.output) if node is not None else [],
                0.0,
            )
        entry.ms += event["dur"] / 1000.0 / runs
    return times


_QDQ = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}


def _owner(
    node_name: str, timed: _Timed, names: Sequence[str], by_output: Mapping[str, str]
) -> str | None:
    """The op (by fp32 name) an optimized node computes: its name, a prefix of its name,
    or the op whose output tensor it writes (ORT names NCHWc convs after their output)."""
    from ..precision import owner_of

    best = owner_of(node_name, names)
    if best is not None:
        return best
    wanted = set(names)
    for tensor in (*timed.outputs, node_name.removesuffix("_nchwc")):
        owner = by_output.get(tensor.removesuffix("_quantized"))
        if owner in wanted:
            return owner
    return None


def _attribute(
    times: Mapping[str, _Timed],
    ops: Sequence[str],
    by_output: Mapping[str, str],
    *,
    with_qdq: bool,
) -> dict[str, float]:
    """Per op: the time of its own nodes, plus (int8) its share of adjacent Q/DQ nodes.

    ``by_output`` maps fp32 tensor names to the op that writes them.
    """
    cost: dict[str, float] = dict.fromkeys(ops, 0.0)
    owners: dict[str, str | None] = {}
    for name, timed in times.items():
        if timed.op_type in _QDQ:
            owners[name] = None
            continue
        owner = _owner(name, timed, ops, by_output)
        owners[name] = owner
        if owner is not None:
            cost[owner] += timed.ms
    if not with_qdq:
        return cost
    producer = {out: name for name, t in times.items() for out in t.outputs}
    consumers: dict[str, list[str]] = {}
    for name, timed in times.items():
        for tensor in timed.inputs:
            consumers.setdefault(tensor, []).append(name)
    for timed in times.values():
        if timed.op_type not in _QDQ:
            continue
        near = {owners.get(n) for t in timed.outputs for n in consumers.get(t, [])}
        near |= {owners.get(producer.get(t, "")) for t in timed.inputs}
        near.discard(None)
        for owner in near:
            if owner is not None:
                cost[owner] += timed.ms / len(near)
    return cost
