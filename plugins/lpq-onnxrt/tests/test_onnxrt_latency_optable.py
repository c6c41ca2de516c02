"""lpq-onnxrt and the op latency table (lpq.latency.table): op signatures, a decision read
from the table with no timing, real ORT profiles filling it for later runs, and the same
plan at two loads."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest
from onnxrt_testutil import decide, digits_builds

from lpq.latency import timing as core_timing
from lpq.latency.table import LatencyTable, machine
from lpq_onnxrt import model_io
from lpq_onnxrt.latency import blame, signature

FEED = {"input": np.zeros((1, 1, 8, 8), np.float32)}


@pytest.fixture(scope="module")
def digits() -> dict[str, Any]:
    return digits_builds()


def _int8_ops(model: onnx.ModelProto, names: list[str]) -> set[str]:
    """Ops of ``names`` that run int8 in ``model`` (QDQ: read a DequantizeLinear)."""
    from lpq_onnxrt.precision import INTEGER_KERNELS, owner_of

    producer = {out: node for node in model.graph.node for out in node.output}
    found = set()
    for node in model.graph.node:
        owner = owner_of(node.name, names)
        if owner is not None and node.op_type in INTEGER_KERNELS:
            found.add(owner)
        if node.name in names and any(
            producer.get(i) is not None and producer[i].op_type == "DequantizeLinear"
            for i in node.input
        ):
            found.add(node.name)
    return found


def _costs(digits: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """(fp32, int8) seconds: convs 3x faster in int8, the Gemm and MatMul 2x slower."""
    return {n: (1.0, 0.33) if t == "Conv" else (1.0, 2.0) for n, t in digits["ops"]}


class Load:
    """A shared machine: load drifting between 1x and ``peak``x, spikes (2-5x) on a tenth
    of the runs, and 10% log-normal noise on every run."""

    def __init__(self, seed: int, peak: float) -> None:
        self.rng = np.random.default_rng(seed)
        self.peak, self.runs = peak, 0
        self.phase = self.rng.uniform(0, 2 * math.pi)

    def factor(self) -> float:
        self.runs += 1
        drift = 1.0 + (self.peak - 1.0) * 0.5 * (1 + math.sin(self.phase + self.runs / 7.0))
        spike = self.rng.uniform(2, 5) if self.rng.random() < 0.1 else 1.0
        return drift * spike * float(np.exp(self.rng.normal(0, 0.1)))


class ScriptedTimer:
    """Whole-model seconds (a fixed 1 s plus each op's fp32 or int8 cost) at ``load``,
    through the real interleaved statistics; counts its comparisons."""

    takes_edges = True

    def __init__(self, costs: dict[str, tuple[float, float]], load: Load | None = None) -> None:
        self.costs, self.load = costs, load
        self.calls = 0

    def seconds(self, model: onnx.ModelProto) -> float:
        int8 = _int8_ops(model, list(self.costs))
        return 1.0 + sum(c[1] if n in int8 else c[0] for n, c in self.costs.items())

    def __call__(
        self, models: dict[str, onnx.ModelProto], feed: Any, edges: Any = ()
    ) -> dict[str, float]:
        self.calls += 1
        load = self.load

        def run(model: onnx.ModelProto) -> Callable[[], float]:
            base = self.seconds(model)
            return lambda: base * (load.factor() if load is not None else 1.0)

        runs = {label: run(model) for label, model in models.items()}
        return core_timing.sequential_compare(runs, edges=edges, budget_s=200.0)


def _table(digits: dict[str, Any]) -> blame.TableParts:
    key = machine(framework="onnxrt-test", framework_version="0", threads=1)
    sigs = signature.signatures(digits["prepared"].model, digits["plan"], FEED)
    return blame.TableParts(LatencyTable(None, key), sigs)


def _profile_into(parts: blame.TableParts, costs: dict[str, tuple[float, float]], load: Load):
    """What a profile records: each op's median over 10 interleaved runs of the fp32 and
    the all-int8 model (as :func:`lpq_onnxrt.latency.blame._node_times`), at ``load``."""
    fp32 = {n: [] for n in costs}
    int8 = {n: [] for n in costs}
    for _ in range(10):
        factor = load.factor()
        for name, (f, _) in costs.items():
            fp32[name].append(f * factor)
        factor = load.factor()
        for name, (_, q) in costs.items():
            int8[name].append(q * factor)
    for name in costs:
        signature_ = parts.signature(name, "qdq")
        assert signature_ is not None
        parts.table.record(signature_, float(np.median(fp32[name])), float(np.median(int8[name])))


def test_signatures_are_shared_by_the_same_op_in_another_model(digits):
    model = digits["prepared"].model
    sigs = signature.signatures(model, digits["plan"], FEED)
    assert set(sigs) == set(digits["plan"]) and all(s is not None for s in sigs.values())
    conv1 = sigs["conv1"]
    assert conv1 is not None and conv1["op_type"] == "Conv"
    assert conv1["inputs"][0] == [onnx.TensorProto.FLOAT, [1, 1, 8, 8]]  # the feed's batch
    assert "algorithm" not in str(conv1["config"])  # ranges change values, not kernels
    # Another model with the same conv under other names: one table entry serves both.
    other = model_io.copy_model(model)
    rename = {"conv1": "stem", "input": "image"}
    for node in other.graph.node:
        node.name = rename.get(node.name, node.name)
        node.input[:] = [rename.get(i, i) for i in node.input]
    other.graph.input[0].name = "image"
    plan = {rename.get(n, n): c for n, c in digits["plan"].items()}
    theirs = signature.signatures(other, plan, {"image": FEED["input"]})
    assert LatencyTable.key(theirs["stem"] or {}) == LatencyTable.key(conv1)
    # ... but not at another batch, nor with another stride.
    at8 = signature.signatures(model, digits["plan"], {"input": np.zeros((8, 1, 8, 8))})
    assert LatencyTable.key(at8["conv1"] or {}) != LatencyTable.key(conv1)
    strided = model_io.copy_model(model)
    conv = next(node for node in strided.graph.node if node.name == "conv1")
    kept = [a for a in conv.attribute if a.name != "strides"]
    conv.ClearField("attribute")
    conv.attribute.extend([*kept, onnx.helper.make_attribute("strides", [2, 2])])
    changed = signature.signatures(strided, digits["plan"], FEED)["conv1"]
    assert changed is not None and changed["attributes"]["strides"] == [2, 2]
    assert LatencyTable.key(changed) != LatencyTable.key(conv1)


def test_signatures_read_weights_as_types_and_shapes_not_values(digits, monkeypatch):
    """Shape inference gets the graph with the large weights as typed inputs (it
    serializes what it is given): their signature is their type and shape all the same."""
    model = digits["prepared"].model
    given: list[int] = []
    infer = onnx.shape_inference.infer_shapes

    def counted(proto: onnx.ModelProto, *args: Any, **kwargs: Any) -> onnx.ModelProto:
        given.append(proto.ByteSize())
        return infer(proto, *args, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", counted)
    sigs = signature.signatures(model, digits["plan"], FEED)
    large = [i for i in model.graph.initializer if i.ByteSize() >= 1024]
    assert large and given and max(given) < model.ByteSize() - sum(i.ByteSize() for i in large)
    inits = {init.name: init for init in model.graph.initializer}
    checked = 0
    for node in model.graph.node:
        found = sigs.get(node.name)
        if found is None:
            continue
        for position, name in enumerate(node.input):
            if name in inits:
                expected = [inits[name].data_type, list(inits[name].dims)]
                assert found["inputs"][position] == expected
                checked += inits[name] in large
    assert checked


def test_op_types_are_decided_from_the_table_without_timing_them(digits):
    """The table finds the convs 3x faster in int8: kept int8, not built, not timed. It
    finds the Gemm and MatMul 2x slower: that direction is timed in the model (an op's
    int8 cost carries Q/DQ nodes its int8 neighbours need anyway), and they go to fp32."""
    costs = _costs(digits)
    parts = _table(digits)
    _profile_into(parts, costs, Load(0, 1.0))
    profiler = blame.Profiler({}, FEED, digits["prepared"].model, list(costs), parts)
    timer = ScriptedTimer(costs)
    with_table = decide(
        digits["build"],
        digits["prepared"].model,
        digits["ops"],
        FEED,
        formats=("qdq",),
        timer=timer,
        verdict=profiler.verdict,
    )
    slow = {n for n, t in digits["ops"] if t != "Conv"}
    assert set(with_table.fp32_ops) == slow
    from_table = [s for s in with_table.steps if s.note and "op latency table" in s.note]
    assert [s.change.split(": ")[1].split(" ")[0] for s in from_table] == ["Conv"]
    assert all(s.before_ms is None and not s.kept for s in from_table)
    timed = [s.change for s in with_table.steps if s.before_ms is not None]
    assert timed == [
        "qdq: Gemm (1 ops) -> float",
        "qdq: MatMul (1 ops) -> float",
        "result -> every op float",
    ]
    assert timer.calls == 3
    assert profiler.profiles == 0 and parts.table.hits == 3  # Conv, Gemm, MatMul
    # The same plan as timing every op type, for one comparison less.
    timed = ScriptedTimer(costs)
    measured = decide(
        digits["build"],
        digits["prepared"].model,
        digits["ops"],
        FEED,
        formats=("qdq",),
        timer=timed,
    )
    assert set(measured.fp32_ops) == slow and timed.calls > timer.calls


def test_an_undecided_table_leaves_the_op_type_to_timing(digits):
    costs = _costs(digits)
    parts = _table(digits)
    types = dict(digits["ops"])
    close = {n: (1.0, 0.9) if types[n] == "Conv" else c for n, c in costs.items()}
    _profile_into(parts, close, Load(0, 1.0))  # convs only 10% faster: not decisive
    profiler = blame.Profiler({}, FEED, digits["prepared"].model, list(costs), parts)
    timer = ScriptedTimer(costs)
    decided = decide(
        digits["build"],
        digits["prepared"].model,
        digits["ops"],
        FEED,
        formats=("qdq",),
        timer=timer,
        verdict=profiler.verdict,
    )
    timed = [s.change for s in decided.steps if s.before_ms is not None]
    assert any("Conv" in change for change in timed)
    assert not any(
        "Conv" in s.change for s in decided.steps if s.note and "op latency table" in s.note
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_same_plan_from_tables_filled_at_two_loads(digits, seed):
    """One machine idle, the same machine at load drifting to 3x with spikes: the tables
    their profiles fill decide alike, and the plans (timed at those loads) are the same."""
    costs = _costs(digits)
    plans = []
    for load in (Load(seed, 1.0), Load(100 + seed, 3.0)):
        parts = _table(digits)
        _profile_into(parts, costs, load)
        profiler = blame.Profiler({}, FEED, digits["prepared"].model, list(costs), parts)
        decided = decide(
            digits["build"],
            digits["prepared"].model,
            digits["ops"],
            FEED,
            formats=("qdq",),
            timer=ScriptedTimer(costs, load),
            verdict=profiler.verdict,
        )
        plans.append((tuple(sorted(decided.fp32_ops)), decided.quant_format))
    assert plans[0] == plans[1]
    assert set(plans[0][0]) == {n for n, t in digits["ops"] if t != "Conv"}


def test_real_profiles_fill_the_table_for_the_next_run(digits, tmp_path):
    """A real ORT profile (fp32 and the all-int8 model interleaved) records every int8
    op it times; a later run on the same machine reads them back without a profile."""
    options = {"latency_cache_dir": str(tmp_path)}
    key = machine(framework="onnxrt-test", framework_version="0", threads=1)
    sigs = signature.signatures(digits["prepared"].model, digits["plan"], FEED)
    names = [n for n, _ in digits["ops"]]
    convs = [n for n, t in digits["ops"] if t == "Conv"]
    model = digits["build"](frozenset(), "qdq")
    parts = blame.TableParts(LatencyTable.open(options, key), sigs)
    first = blame.Profiler(options, FEED, digits["prepared"].model, names, parts)
    first.verdict(convs, "qdq", model, frozenset())
    assert first.profiles == 1
    recorded = {n for n in names if parts.table.get(parts.signature(n, "qdq") or {}) is not None}
    assert set(convs) <= recorded
    for name in recorded:
        entry = parts.table.get(parts.signature(name, "qdq") or {})
        assert entry is not None and entry.float_ms > 0 and entry.quant_ms > 0
    later_parts = blame.TableParts(LatencyTable.open(options, key), sigs)
    later = blame.Profiler(options, FEED, digits["prepared"].model, names, later_parts)
    later.verdict(convs, "qdq", model, frozenset())
    assert later.profiles == 0, "the table on disk was not read"
    assert later_parts.table.hits + later_parts.table.misses == 1


def test_a_type_the_profile_predicts_much_slower_in_fp32_is_not_timed(digits):
    """No table entry: the current model's own profile predicts the Gemm and MatMul 2x
    slower in fp32 (far past every band a change could be kept in): kept int8 untimed.
    The convs, predicted only 5% slower, are timed."""
    costs = {n: (1.0, 0.5) for n, _ in digits["ops"]}
    types = dict(digits["ops"])
    asked: list[tuple[str, ...]] = []

    def slowdown(names: Any, model: onnx.ModelProto, fp32_ops: frozenset[str]) -> float:
        asked.append(tuple(sorted(names)))
        return 0.05 if all(types[n] == "Conv" for n in names) else 1.0

    timer = ScriptedTimer(costs)
    decided = decide(
        digits["build"],
        digits["prepared"].model,
        digits["ops"],
        FEED,
        formats=("qdq",),
        timer=timer,
        slowdown=slowdown,
    )
    predicted = [s for s in decided.steps if s.note and "profile" in s.note]
    assert {s.change.split(": ")[1].split(" ")[0] for s in predicted} == {"Gemm", "MatMul"}
    assert all(not s.kept and s.before_ms is None for s in predicted)
    timed = [s.change for s in decided.steps if s.before_ms is not None]
    assert any("Conv" in change for change in timed)
    assert decided.fp32_ops == []
    assert len(asked) == len(set(types.values()))


def _chain_profile() -> tuple[onnx.ModelProto, dict[str, Any], dict[str, Any]]:
    """fp32 x -> Conv c1 -> Sigmoid s1 -> Conv c2 -> y, and a profile of its int8 model
    (ORT's optimized QDQ graph: QLinearConvs, the Sigmoid between a DequantizeLinear and
    a QuantizeLinear) beside one of the fp32 model, per node in ms."""
    from onnx import helper

    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1_out"], name="c1"),
        helper.make_node("Sigmoid", ["c1_out"], ["s1_out"], name="s1"),
        helper.make_node("Conv", ["s1_out", "w2"], ["y"], name="c2"),
    ]
    fp32 = helper.make_model(helper.make_graph(nodes, "chain", [], []))
    timed = blame._Timed
    int8 = {
        "q_in": timed("QuantizeLinear", ["x"], ["xq"], 1.0),
        "c1_quant": timed("QLinearConv", ["xq"], ["c1q"], 4.0),
        "dq1": timed("DequantizeLinear", ["c1q"], ["c1f"], 0.5),
        "s1": timed("Sigmoid", ["c1f"], ["s1f"], 0.3),
        "q2": timed("QuantizeLinear", ["s1f"], ["s1q"], 0.5),
        "c2_quant": timed("QLinearConv", ["s1q"], ["c2q"], 4.0),
        "dq_out": timed("DequantizeLinear", ["c2q"], ["y"], 0.7),
    }
    fp32_times = {
        "c1": timed("Conv", ["x"], ["c1_out"], 4.0),
        "s1": timed("Sigmoid", ["c1_out"], ["s1_out"], 0.5),
        "c2": timed("Conv", ["s1_out"], ["y"], 4.0),
    }
    return fp32, int8, fp32_times


@pytest.mark.parametrize(
    ("quantized", "names", "spent"),
    [
        # the Sigmoid and the Q/DQ pair around it; the QLinearConvs are other ops'
        (["c1", "s1", "c2"], ["s1"], 0.3 + 0.5 + 0.5),
        # c1, the input's Q and the DQ after it; the Sigmoid is another quantized op's
        (["c1", "s1", "c2"], ["c1"], 4.0 + 1.0 + 0.5),
        # s1 a float op: ORT may fuse it with c1 once c1 is float (two steps away,
        # through the DQ); the Q after it is three steps away and stays for c2
        (["c1", "c2"], ["c1"], 4.0 + 1.0 + 0.5 + 0.3),
        (["c1", "s1", "c2"], ["c1", "s1", "c2"], 11.0),
    ],
)
def test_the_gain_bound_counts_an_ops_nodes_and_the_float_and_qdq_ones_beside_them(
    monkeypatch, quantized, names, spent
):
    fp32, int8, fp32_times = _chain_profile()
    monkeypatch.setattr(blame, "_node_times", lambda *a, **k: [int8, fp32_times])
    profiler = blame.Profiler({}, {}, fp32, quantized)
    model = onnx.ModelProto()
    bound = profiler.gain_bound(names, model, frozenset())
    assert bound == pytest.approx(spent / 11.0)
    assert profiler.profiles == 1
    profiler.gain_bound(names, model, frozenset())
    assert profiler.profiles == 1  # one profile per model


def test_the_gain_bound_is_at_least_the_int8_cost_the_profiler_blames(digits):
    """On a real ORT profile of the all-int8 digits model: each op type's bound covers
    its int8 cost (own nodes and its share of the Q/DQ beside them), and all types
    together cover at least as much as any one."""
    names = [n for n, _ in digits["ops"]]
    profiler = blame.Profiler({}, FEED, digits["prepared"].model, names)
    model = digits["build"](frozenset(), "qdq")
    costs = profiler.costs(model, frozenset())
    total = profiler._total
    by_type: dict[str, list[str]] = {}
    for name, op_type in digits["ops"]:
        by_type.setdefault(op_type, []).append(name)
    bounds = {t: profiler.gain_bound(group, model, frozenset()) for t, group in by_type.items()}
    for op_type, group in by_type.items():
        int8 = sum(costs[name][1] for name in group)
        assert bounds[op_type] >= int8 / total - 1e-9, op_type
    every = profiler.gain_bound(names, model, frozenset())
    assert max(bounds.values()) <= every <= 1.0 + 1e-9
    assert profiler.profiles == 1


def test_the_profiler_blames_an_op_only_beyond_its_clock_ticks():
    """ORT's profiler counts whole microseconds: an op 2 us over int8/fp32 1.1 (7 -> 9
    us, x1.29) is not blamed; one 4.6 us over (4 -> 9 us) is; so is a large op 10% slower
    by more than the floor, and not one within the 10%."""
    fp32, _, _ = _chain_profile()
    profiler = blame.Profiler({}, {}, fp32, ["c1", "s1", "c2"])
    model = onnx.ModelProto()
    costs = {"c1": (0.004, 0.009), "s1": (0.007, 0.009), "c2": (0.100, 0.115)}
    profiler._last = (model, costs)
    assert profiler(model, frozenset()) == ["c1", "c2"]
    profiler._last = (model, {**costs, "c2": (0.100, 0.109)})
    assert profiler(model, frozenset()) == ["c1"]
