"""What ``lpq quantize`` costs, kept down without changing a number it decides by: the
latency search's output error (:func:`lpq_onnxrt.latency.fidelity.output_error`) is the
pooled relative L2 error over every feed, measured one run at a time, its fp32 reference
copied out of ORT's buffers; evaluation outputs are copied too; a session's model is
serialized once."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxrt_testutil import KeepPredictions

from lpq_onnxrt import batches
from lpq_onnxrt import session as session_module
from lpq_onnxrt.latency import fidelity


def _two_outputs(scale: float = 1.0) -> onnx.ModelProto:
    """y = x W (8 values a sample) and z = sigmoid(x V) (3 values): two float outputs of
    different size, so their mean error is not one pooled error."""
    rng = np.random.default_rng(0)
    weights = {"W": scale * rng.normal(0, 0.5, (6, 8)), "V": rng.normal(0, 0.5, (6, 3))}
    weights["V"][0] *= scale
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["y"], name="mm_y"),
            helper.make_node("MatMul", ["x", "V"], ["v"], name="mm_v"),
            helper.make_node("Sigmoid", ["v"], ["z"], name="sig"),
        ],
        "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 3]),
        ],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(count: int = 12) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{"x": rng.normal(0, 1, (4, 6)).astype(np.float32)} for _ in range(count)]


def _pooled(reference: onnx.ModelProto, model: onnx.ModelProto, feeds: Any) -> float:
    """The definition: per output, ||a - b|| / ||a|| over every feed's values
    concatenated in float64; the mean over outputs."""
    import onnxruntime as ort

    def outputs(proto: onnx.ModelProto) -> list[np.ndarray]:
        session = ort.InferenceSession(proto.SerializeToString())
        runs = [session.run(None, feed) for feed in feeds]
        return [
            np.concatenate([run[k].astype(np.float64).ravel() for run in runs])
            for k in range(len(runs[0]))
        ]

    per = [
        np.linalg.norm(a - b) / np.linalg.norm(a)
        for a, b in zip(outputs(reference), outputs(model), strict=True)
    ]
    return float(np.mean(per))


def test_output_error_is_the_pooled_relative_error_of_each_output():
    fp32, other, feeds = _two_outputs(), _two_outputs(1.2), _feeds()
    error = fidelity.output_error({}, feeds, fp32)
    assert error(fp32) == 0.0
    expected = _pooled(fp32, other, feeds)
    assert expected > 0.01
    np.testing.assert_allclose(error(other), expected, rtol=1e-12)
    # Parts: every n-th feed from the k-th.
    part = fidelity.output_error({}, feeds, fp32, part=(1, 3))(other)
    np.testing.assert_allclose(part, _pooled(fp32, other, feeds[1::3]), rtol=1e-12)


def test_output_error_holds_one_run_of_a_candidate_at_a_time(monkeypatch):
    """A candidate's outputs are compared run by run and dropped: at most the run being
    compared is alive when the next one is made (32 batches of MTCNN P-Net's score maps
    at batch 32 were 0.9 GB held as float64)."""
    fp32, other, feeds = _two_outputs(), _two_outputs(1.2), _feeds(16)
    made = session_module.create_session
    alive: list[weakref.ref[np.ndarray]] = []
    most = [0]

    class Watched:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def run(self, *args: Any, **kwargs: Any) -> list[np.ndarray]:
            most[0] = max(most[0], sum(ref() is not None for ref in alive))
            values = self.inner.run(*args, **kwargs)
            alive.extend(weakref.ref(value) for value in values)
            return values

    def create(model: Any, *args: Any, **kwargs: Any) -> Any:
        inner = made(model, *args, **kwargs)
        return Watched(inner) if model is other else inner

    monkeypatch.setattr(session_module, "create_session", create)
    error = fidelity.output_error({}, feeds, fp32)
    error(other)
    assert len(alive) == 2 * len(feeds)
    assert most[0] <= 2  # one run's two outputs


class _Counting:
    """A model proto whose ``ByteSize`` and ``SerializeToString`` calls are counted."""

    def __init__(self, proto: onnx.ModelProto) -> None:
        self.proto, self.graph, self.sizes, self.serialized = proto, proto.graph, 0, 0

    def ByteSize(self) -> int:
        self.sizes += 1
        return self.proto.ByteSize()

    def SerializeToString(self) -> bytes:
        self.serialized += 1
        return self.proto.SerializeToString()


def test_a_session_serializes_its_model_once(monkeypatch):
    model = _Counting(_two_outputs())
    session = session_module.create_session(model)  # type: ignore[arg-type]
    assert (model.sizes, model.serialized) == (0, 1)
    assert [out.name for out in session.get_outputs()] == ["y", "z"]
    # Over the limit: through a file with external data, as before.
    monkeypatch.setattr(session_module, "PROTO_LIMIT", 100)
    assert session_module.serialized(_two_outputs()) is None
    from_file = session_module.create_session(_two_outputs())
    feed = _feeds(1)[0]
    np.testing.assert_array_equal(from_file.run(None, feed)[0], session.run(None, feed)[0])


def _wide(columns: int) -> onnx.ModelProto:
    """y = relu(x W + b) with W of 64 x ``columns`` floats."""
    rng = np.random.default_rng(2)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
            helper.make_node("Add", ["m", "b"], ["a"], name="add"),
            helper.make_node("Relu", ["a"], ["y"], name="relu"),
        ],
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", columns])],
        [
            numpy_helper.from_array(rng.normal(0, 0.1, (64, columns)).astype(np.float32), "W"),
            numpy_helper.from_array(rng.normal(0, 0.1, (columns,)).astype(np.float32), "b"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_large_weights_go_to_the_session_as_arrays(monkeypatch):
    """An in-memory model's initializers of HANDED_BYTES or more are not serialized with
    it: the session gets them as arrays (pre-packing on, as in the user's sessions), the
    outputs are the same, and the caller's model is not changed."""
    import onnxruntime as ort

    model = _wide(512)  # W: 128 KiB, b: 2 KiB
    before = model.SerializeToString()
    sizes: list[int] = []
    made_with: list[Any] = []
    real_serialized, real_session = session_module.serialized, session_module.weights.session

    def serialized(proto: onnx.ModelProto) -> bytes | None:
        data = real_serialized(proto)
        sizes.append(len(data or b""))
        return data

    def handed(light: Any, blobs: Any, opts: Any, *args: Any, **kwargs: Any) -> Any:
        made_with.append((sorted(blobs), kwargs.get("prepacking"), kwargs.get("light_bytes")))
        session = real_session(light, blobs, opts, *args, **kwargs)
        try:
            made_with.append(opts.get_session_config_entry("session.disable_prepacking"))
        except RuntimeError:  # not set
            made_with.append("")
        return session

    monkeypatch.setattr(session_module, "serialized", serialized)
    monkeypatch.setattr(session_module.weights, "session", handed)
    session = session_module.create_session(model)
    assert made_with[0][:2] == (["W"], True)
    # the wiring serialized once, and those bytes make the session
    assert len(sizes) == 1 and len(made_with[0][2]) == sizes[0]
    assert made_with[1] in ("", "0")
    assert max(sizes) < 64 * 512 * 4 // 4  # the wiring and the bias, not W
    assert model.SerializeToString() == before
    feed = {"x": np.random.default_rng(3).normal(0, 1, (5, 64)).astype(np.float32)}
    plain = ort.InferenceSession(before, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, feed)[0], plain.run(None, feed)[0])
    # Small weights: the model is serialized whole, as before.
    sizes.clear()
    made_with.clear()
    session_module.create_session(_wide(8))
    assert made_with == [] and len(sizes) == 1


def test_fp32_conv_weights_stay_serialized(monkeypatch):
    """ORT reorders an fp32 conv's weight into its own layout and drops the original; an
    array handed to it would stay held beside the copy."""
    rng = np.random.default_rng(4)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "C"], ["c"], name="conv"),
            helper.make_node("Flatten", ["c"], ["f"], name="flat"),
            helper.make_node("MatMul", ["f", "W"], ["y"], name="mm"),
        ],
        "conv_then_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])],
        [
            numpy_helper.from_array(rng.normal(0, 0.1, (512, 64, 1, 1)).astype(np.float32), "C"),
            numpy_helper.from_array(rng.normal(0, 0.1, (4608, 256)).astype(np.float32), "W"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    handed: list[list[str]] = []
    real = session_module.weights.session

    def watched(light: Any, blobs: Any, *args: Any, **kwargs: Any) -> Any:
        handed.append(sorted(blobs))
        return real(light, blobs, *args, **kwargs)

    monkeypatch.setattr(session_module.weights, "session", watched)
    session = session_module.create_session(model)
    assert handed == [["W"]]  # C (128 KiB) is a conv weight: serialized
    feed = {"x": rng.normal(0, 1, (1, 64, 3, 3)).astype(np.float32)}
    import onnxruntime as ort

    plain = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, feed)[0], plain.run(None, feed)[0])


def test_evaluation_outputs_do_not_hold_ort_buffers():
    """A metric may keep what the model returned (the fidelity check's fp32 reference):
    ORT's outputs are views of its buffers, and one kept view keeps the session's whole
    memory arena alive after the session is gone."""
    from lpq_onnxrt import evaluate

    kept = KeepPredictions()
    data = [(feed["x"], None) for feed in _feeds(2)]
    evaluate.evaluate(_two_outputs(), data, None, [kept], None, None)
    arrays = [array for preds in kept.seen for array in preds]
    assert len(arrays) == 4
    assert all(array.flags["OWNDATA"] for array in arrays)


def test_large_error_batches_run_in_chunks_with_the_same_error(monkeypatch):
    """A batch whose inputs pass CHUNK_BYTES runs in pieces (ORT holds every intermediate
    tensor of a run at once) where the model's inputs and outputs share a symbolic batch
    axis and nothing in it depends on the whole batch; the error is the same."""
    made = session_module.create_session
    shapes: list[tuple[int, ...]] = []

    class Watched:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def run(self, names: Any, feed: Any) -> Any:
            shapes.append(tuple(np.shape(feed["x"])))
            return self.inner.run(names, feed)

    monkeypatch.setattr(session_module, "create_session", lambda *a, **k: Watched(made(*a, **k)))
    fp32, other = _two_outputs(), _two_outputs(1.2)
    for model in (fp32, other):  # "n" in _two_outputs: one symbolic batch axis
        assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "n"
    feeds = [{"x": np.concatenate([f["x"] for f in _feeds(3)])}]  # one batch of 12
    whole = fidelity.output_error({}, feeds, fp32)(other)
    assert shapes == [(12, 6), (12, 6)]
    shapes.clear()
    monkeypatch.setattr(batches, "CHUNK_BYTES", 5 * 6 * 4)  # 5 samples a piece
    chunked = fidelity.output_error({}, feeds, fp32)(other)
    assert shapes == [(5, 6), (5, 6), (2, 6)] * 2
    assert chunked == whole
    # Dynamic quantization's ranges are the whole batch's: such a model runs whole.
    dynamic = _two_outputs(1.2)
    dynamic.graph.node.insert(
        0, helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="dq")
    )
    shapes.clear()
    fidelity.output_error({}, feeds, fp32)(dynamic)
    assert shapes == [(5, 6), (5, 6), (2, 6), (12, 6)]
    # A fixed batch axis (or none shared): whole batches.
    fixed = _two_outputs()
    fixed.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 12
    shapes.clear()
    fidelity.output_error({}, feeds, fixed)(other)
    assert shapes == [(12, 6), (12, 6)]


def test_the_ort_timer_drops_a_stale_session_before_making_a_new_one(monkeypatch):
    """The timer keeps the last comparison's two sessions (the current model is compared
    again and again); the one of a model not compared now is dropped before a new
    session is made, not after: at most the reused one is alive beside a new one."""
    from lpq_onnxrt.latency import timing

    made = session_module.create_session
    alive: list[weakref.ref[Any]] = []
    most = [0]

    class Session:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def run(self, *args: Any, **kwargs: Any) -> Any:
            return self.inner.run(*args, **kwargs)

    def create(*args: Any, **kwargs: Any) -> Any:
        most[0] = max(most[0], sum(ref() is not None for ref in alive))
        session = Session(made(*args, **kwargs))
        alive.append(weakref.ref(session))
        return session

    monkeypatch.setattr(session_module, "create_session", create)
    timer = timing.OrtTimer({}, budget_s=0.001, min_runs=2)
    current, feed = _two_outputs(), _feeds(1)[0]
    for scale in (1.1, 1.2, 1.3):
        timer({"current": current, "candidate": _two_outputs(scale)}, feed, (0.97,))
    assert timer.sessions_made == 4
    assert most[0] == 1


def test_the_output_error_runs_in_the_timers_session_when_lent(monkeypatch):
    """The search asks for the error of the two models it has just timed: with the
    timer's sessions lent (as latency_decision does), they run there, the same error."""
    from lpq_onnxrt.latency import timing

    made = session_module.create_session
    created: list[Any] = []

    def create(model: Any, *args: Any, **kwargs: Any) -> Any:
        created.append(model)
        return made(model, *args, **kwargs)

    monkeypatch.setattr(session_module, "create_session", create)
    fp32, current, candidate, feeds = _two_outputs(), _two_outputs(1.1), _two_outputs(1.2), _feeds()
    error = fidelity.output_error({}, feeds, fp32)
    alone = [error(current), error(candidate)]
    timer = timing.OrtTimer({}, budget_s=0.001, min_runs=2)
    timer({"current": current, "candidate": candidate}, feeds[0], (0.97,))
    assert timer.session_for(current) is not None and timer.session_for(fp32) is None
    error.lend(timer.session_for)
    created.clear()
    assert [error(current), error(candidate)] == alone
    assert created == []  # both ran in the timer's sessions
    assert error(_two_outputs(1.3)) > 0 and len(created) == 1  # one it has not: a new one
    error.lend(None)
    created.clear()
    error(current)
    assert len(created) == 1


def test_the_timer_times_on_the_error_samples_and_the_error_reads_their_outputs(monkeypatch):
    """OrtTimer.watch: each round runs both models on the same sample of the error's rows,
    in turn, and hands the outputs back; the error then runs only the rows it was not
    handed, and reads the same value as running them all."""
    from lpq_onnxrt.latency import timing

    fp32, candidate, feeds = _two_outputs(), _two_outputs(1.2), _feeds(3)
    full = fidelity.output_error({}, feeds, fp32)(candidate)
    error = fidelity.output_error({}, feeds, fp32)
    assert error(fp32) == 0.0  # records the fp32 outputs
    rows = error.rows()
    assert [row["x"].shape for row in rows] == [(1, 6)] * 12
    np.testing.assert_array_equal(
        np.concatenate([r["x"] for r in rows]), np.concatenate([f["x"] for f in feeds])
    )
    seen: dict[int, list[int]] = {id(fp32): [], id(candidate): []}

    def observe(model: Any, index: int, outputs: Any) -> None:
        seen[id(model)].append(index)
        error.observe(model, index, outputs)

    timer = timing.OrtTimer({}, budget_s=0.0, min_runs=5)
    timer.watch(rows, observe)
    timer({"current": fp32, "candidate": candidate}, rows[0], ())
    assert seen[id(fp32)] == seen[id(candidate)] == [0, 1, 2, 3, 4]  # paired, in turn
    timer({"current": fp32, "candidate": candidate}, rows[0], ())  # goes on from there
    assert seen[id(candidate)] == [*range(10)]
    made = session_module.create_session
    runs: list[int] = []

    class Counted:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def run(self, names: Any, feed: Any) -> Any:
            runs.append(len(feed["x"]))
            return self.inner.run(names, feed)

    monkeypatch.setattr(session_module, "create_session", lambda *a, **k: Counted(made(*a, **k)))
    assert error(candidate) == pytest.approx(full, rel=1e-12)
    assert runs == [1] * 2  # the 12 rows less the 10 the timer ran
    # Before a profile only the profiled model's runs stay: the fp32 model's go, and so
    # does the model (held no longer)
    error.forget_timed_except(candidate)
    assert [found[0] for found in error._seen.values()] == [candidate]
    runs.clear()
    assert error(candidate) == pytest.approx(full, rel=1e-12) and runs == [1] * 2
    error.forget_timed()  # the search is over: the models it held go
    assert error(candidate) == pytest.approx(full, rel=1e-12) and len(runs) > 4
    # Samples shaped otherwise than the timed feed: timed on the feed, nothing handed back.
    timer.watch([{"x": feeds[0]["x"][:2]}], observe)
    timer({"current": fp32, "candidate": _two_outputs(1.3)}, rows[0], ())
    assert len(seen[id(fp32)]) == 10


def test_a_batch_wide_model_is_not_read_from_single_samples():
    """Dynamic quantization's ranges are the whole batch's: one sample run alone is not
    its row of a batch run, so the error of such a model runs its batches as before."""
    identity = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"], name="id")],
        "id",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 6])],
    )
    fp32 = helper.make_model(identity, opset_imports=[helper.make_opsetid("", 17)])
    wide = helper.make_graph(
        [
            helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"], name="dq"),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="deq"),
        ],
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 6])],
    )
    dynamic = helper.make_model(wide, opset_imports=[helper.make_opsetid("", 17)])
    feeds = _feeds(2)
    error = fidelity.output_error({}, feeds, fp32)
    whole = error(dynamic)
    row = error.rows()[0]
    error.observe(dynamic, 0, session_module.create_session(dynamic).run(None, row))
    assert not error._seen and error(dynamic) == whole


def test_a_model_file_runs_as_its_proto_and_holds_no_weights(tmp_path):
    """The latency search's fp32 side is a ModelFile: ORT opens the file (weights in a
    file beside it), lpq reads the weightless graph; a timer, the profiler and the output
    error take it where they take a proto, with the same outputs."""
    from lpq_onnxrt.latency import timing
    from lpq_onnxrt.model_io import ModelFile, copy_model

    rng = np.random.default_rng(2)
    wide = rng.normal(0, 0.5, (6, 512)).astype(np.float32)  # 12 KB: written apart
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 512])],
        [numpy_helper.from_array(wide, "W")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = _feeds()
    model = ModelFile.write(copy_model(proto), tmp_path)
    assert model.graph_only.ByteSize() < proto.ByteSize() / 10  # the weights stay on disk
    assert [node.name for node in model.graph.node] == ["mm"]
    expected = session_module.create_session(proto).run(None, feeds[0])[0]
    np.testing.assert_array_equal(
        session_module.create_session(model).run(None, feeds[0])[0], expected
    )
    assert fidelity.output_error({}, feeds, proto)(model) == 0.0
    timed = timing.OrtTimer({}, budget_s=0.001, min_runs=2)(
        {"current": proto, "candidate": model}, feeds[0], (0.97,)
    )
    assert timed["candidate"] > 0


def test_the_timer_gives_freed_memory_back_when_it_drops_sessions(monkeypatch):
    """Dropped sessions' memory goes back to the system (glibc's malloc_trim) when the
    timer drops the rejected candidate's session and when it is released: the search
    made dozens of sessions and the allocator kept what they freed (ddddocr rec: 0.3 GB
    once the search ended)."""
    import platform

    from lpq_onnxrt.latency import timing

    trims: list[int] = []
    monkeypatch.setattr(session_module, "release_freed_memory", lambda: trims.append(1))
    timer = timing.OrtTimer({}, budget_s=0.001, min_runs=2)
    current, feed = _two_outputs(), _feeds(1)[0]
    timer({"current": current, "candidate": _two_outputs(1.1)}, feed, (0.97,))
    assert trims == []  # nothing dropped yet
    timer({"current": current, "candidate": _two_outputs(1.2)}, feed, (0.97,))
    assert trims == [1]  # the first candidate's session
    timer.release()
    assert trims == [1, 1]
    if platform.libc_ver()[0] == "glibc":  # Linux with glibc: the real call is found
        assert session_module._malloc_trim() is not None
    monkeypatch.undo()
    session_module.release_freed_memory()  # never raises, whatever the C library


def test_a_model_file_is_read_once_while_it_is_unchanged(tmp_path, monkeypatch):
    """Evaluation opens a user's file in ORT and reads its graph for the input specs: the
    graph (weights header-only) is read once per file state, not at every evaluation;
    a changed file is read again."""
    import os

    from lpq_onnxrt import evaluate

    path = tmp_path / "model.onnx"

    def save(scale: float) -> None:
        model = _two_outputs(scale)
        model.ir_version = 9  # as ORT takes it: opened from the file
        onnx.save_model(model, str(path))

    save(1.0)
    loads: list[str] = []
    load = onnx.load

    def counting(*args: Any, **kwargs: Any) -> Any:
        loads.append(str(args[0]))
        return load(*args, **kwargs)

    monkeypatch.setattr(onnx, "load", counting)
    evaluate._file_graph.cache_clear()
    first = evaluate.runnable(str(path))
    second = evaluate.runnable(str(path))
    assert len(loads) == 1 and first[1] is second[1]
    feed = _feeds(1)[0]
    np.testing.assert_array_equal(first[0].run(None, feed)[0], second[0].run(None, feed)[0])
    save(1.5)
    os.utime(path, ns=(1, 1))  # a new state even within the clock's resolution
    third = evaluate.runnable(str(path))
    assert len(loads) == 2
    assert not np.array_equal(third[0].run(None, feed)[0], first[0].run(None, feed)[0])


def test_the_backend_lends_the_timers_sessions_while_the_search_runs():
    """OrtBackend.sessions_lent: the output error runs in the timer's sessions during the
    search only; with a scripted timer (no sessions) nothing is lent."""
    from lpq_onnxrt.latency import timing
    from lpq_onnxrt.latency.backend import OrtBackend

    fp32, feeds = _two_outputs(), _feeds()
    error = fidelity.output_error({}, feeds, fp32)
    timer = timing.OrtTimer({}, budget_s=0.001, min_runs=2)
    backend = OrtBackend(
        lambda *_: fp32, fp32, [], feeds[0], formats=("qdq",), timer=timer, error=error
    )
    other = _two_outputs(scale=2.0)
    timer({"current": fp32, "candidate": other}, feeds[0])
    with backend.sessions_lent():
        assert error.sessions is not None
        assert error.sessions(fp32) is timer.session_for(fp32) is not None
        assert error.sessions(other) is timer.session_for(other) is not None
        # a model the timer has not timed: its session is made after the timer drops
        # every session but the one last lent
        assert error.sessions(_two_outputs(scale=3.0)) is None
        assert timer.session_for(fp32) is None and timer.session_for(other) is not None
    assert error.sessions is None
    scripted = OrtBackend(
        lambda *_: fp32, fp32, [], feeds[0], formats=("qdq",), timer=lambda *a: {}, error=error
    )
    with scripted.sessions_lent():
        assert error.sessions is None


def test_output_errors_are_measured_on_at_most_32_samples_in_batches_of_8():
    """Two calibration batches of 32 (64 samples) of a model with a batch axis: the
    error runs on every other sample, 32 in all, in four batches of 8, in order."""
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.normal(0, 1, (32, 6)).astype(np.float32)} for _ in range(2)]
    chosen = fidelity.sample_rows(feeds)
    assert [feed["x"].shape for feed in chosen] == [(8, 6)] * 4
    every = np.concatenate([feed["x"] for feed in feeds])
    np.testing.assert_array_equal(np.concatenate([f["x"] for f in chosen]), every[::2])
    # uneven batches: evenly spaced over all samples all the same
    uneven = [{"x": every[:40]}, {"x": every[40:45]}, {"x": every[45:]}]
    np.testing.assert_array_equal(
        np.concatenate([f["x"] for f in fidelity.sample_rows(uneven)]), every[::2]
    )
    # as they are: few samples, or inputs that are not one batch of samples
    few = _feeds(3)
    assert [f["x"].shape for f in fidelity.sample_rows(few)] == [(4, 6)] * 3
    mixed = [{"x": every[:40], "mask": np.ones((1, 6), np.float32)}]
    assert fidelity.sample_rows(mixed)[0]["x"].shape == (40, 6)


def test_error_feeds_cut_batches_into_samples_only_where_the_model_has_a_batch_axis():
    import lpq

    rng = np.random.default_rng(4)
    batches_of_32 = [{"x": rng.normal(0, 1, (32, 6)).astype(np.float32)} for _ in range(3)]
    cfg = lpq.TuneConfig(ops={}, calib_sampling_size=1000)
    feeds, found, batched = fidelity.error_feeds(_two_outputs(), cfg, batches_of_32)
    assert found is None and batched
    assert sum(len(f["x"]) for f in feeds) == fidelity.ERROR_SAMPLES
    fixed = _two_outputs()
    for value in [*fixed.graph.input, *fixed.graph.output]:
        value.type.tensor_type.shape.dim[0].dim_value = 32
    feeds, _, batched = fidelity.error_feeds(fixed, cfg, batches_of_32)
    assert sum(len(f["x"]) for f in feeds) == 96 and not batched  # a fixed batch: whole


def test_a_batch_axis_seen_by_running_runs_in_chunks_on_every_sample(monkeypatch):
    """The output's batch axis named apart from the input's (as paddle2onnx names
    them): the batches run in chunks, with the same error, but every sample is kept (a
    subset reads another error: see :func:`fidelity.error_feeds`)."""
    import lpq
    from lpq_onnxrt import batches

    rng = np.random.default_rng(5)
    batches_of_32 = [{"x": rng.normal(0, 1, (32, 6)).astype(np.float32)} for _ in range(3)]
    cfg = lpq.TuneConfig(ops={}, calib_sampling_size=1000)
    apart = _two_outputs()
    apart.graph.output[1].type.tensor_type.shape.dim[0].dim_param = "m"
    feeds, found, batched = fidelity.error_feeds(apart, cfg, batches_of_32)
    assert found is None and batched and sum(len(f["x"]) for f in feeds) == 96
    chunked: list[int] = []
    run_in_chunks = batches.run_in_chunks

    def counted(run: Any, feed: Any, limit: int | None = None) -> Any:
        chunked.append(len(feed["x"]))
        return run_in_chunks(run, feed, 8 * 6 * 4)  # 8 samples a chunk

    monkeypatch.setattr(batches, "run_in_chunks", counted)
    quantized = _two_outputs(scale=1.01)
    in_chunks = fidelity.output_error({}, feeds, apart, None, batched=batched)(quantized)
    assert chunked == [32] * 6  # the fp32 reference's batches, then the candidate's
    whole = fidelity.output_error({}, feeds, apart, None, batched=False)(quantized)
    assert chunked == [32] * 6  # not chunked
    assert in_chunks == pytest.approx(whole, rel=1e-9) and in_chunks > 0
