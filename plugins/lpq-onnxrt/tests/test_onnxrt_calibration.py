"""Streaming calibration checked against exact numpy reference values and a real ORT run."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import lpq
from lpq_onnxrt.calibration import CalibrationStats, collect_statistics

NUM_BINS = 2048


def _stats(data: np.ndarray, chunks: int = 1, num_bins: int = NUM_BINS) -> CalibrationStats:
    stats = CalibrationStats(num_bins)
    for chunk in np.array_split(data, chunks):
        stats.update("t", chunk)
    return stats


def _bin_width(data: np.ndarray, num_bins: int = NUM_BINS) -> float:
    """Upper bound of the histogram bin width: range is below 2 * max|x|."""
    return 2.0 * float(np.max(np.abs(data))) / num_bins


@pytest.fixture(scope="module")
def gaussian() -> np.ndarray:
    rng = np.random.default_rng(0)
    data = rng.normal(0.3, 1.0, size=200_000).astype(np.float32)
    data[rng.choice(data.size, 6, replace=False)] = [40.0, -35.0, 55.0, 60.0, -70.0, 48.0]
    return data


def test_minmax_is_exact(gaussian: np.ndarray) -> None:
    stats = _stats(gaussian, chunks=7)
    lo, hi = float(gaussian.min()), float(gaussian.max())
    assert stats.compute_range("t", "minmax", symmetric=False) == (lo, hi)
    t = max(-lo, hi)
    assert stats.compute_range("t", "minmax", symmetric=True) == (-t, t)


def test_minmax_range_includes_zero() -> None:
    stats = CalibrationStats()
    stats.update("pos", np.array([2.0, 3.0, 5.0]))
    stats.update("neg", np.array([-4.0, -1.5]))
    assert stats.compute_range("pos", "minmax", symmetric=False) == (0.0, 5.0)
    assert stats.compute_range("neg", "minmax", symmetric=False) == (-4.0, 0.0)


@pytest.mark.parametrize("percentile", [99.0, 99.9, 99.999])
def test_percentile_within_one_bin_of_numpy(gaussian: np.ndarray, percentile: float) -> None:
    stats = _stats(gaussian, chunks=5)
    width = _bin_width(gaussian)
    lo, hi = stats.compute_range("t", "percentile", symmetric=True, percentile=percentile)
    expected = np.percentile(np.abs(gaussian), percentile)
    assert lo == -hi
    assert abs(hi - expected) <= width
    lo, hi = stats.compute_range("t", "percentile", symmetric=False, percentile=percentile)
    exp_lo, exp_hi = np.percentile(gaussian, [100.0 - percentile, percentile])
    assert abs(lo - exp_lo) <= width
    assert abs(hi - exp_hi) <= width


def test_percentile_100_is_the_exact_extreme(gaussian: np.ndarray) -> None:
    stats = _stats(gaussian)
    assert stats.compute_range("t", "percentile", symmetric=True, percentile=100.0) == (-70.0, 70.0)


def test_kl_clips_outliers_but_not_the_bulk(gaussian: np.ndarray) -> None:
    stats = _stats(gaussian)
    lo, hi = stats.compute_range("t", "kl", symmetric=True, num_quant_levels=256)
    sigma = float(gaussian.std())
    assert lo == -hi
    assert 3.0 * sigma < hi < 0.25 * float(np.abs(gaussian).max())


def test_kl_keeps_nearly_the_full_range_of_uniform_data() -> None:
    data = np.random.default_rng(1).uniform(-3.0, 3.0, size=100_000)
    stats = _stats(data)
    _, hi = stats.compute_range("t", "kl", symmetric=True)
    assert hi >= 0.97 * float(np.abs(data).max())
    lo, hi = stats.compute_range("t", "kl", symmetric=False)
    assert lo <= -0.97 * 3.0 and hi >= 0.97 * 3.0


def test_kl_asymmetric_after_relu_starts_at_zero(gaussian: np.ndarray) -> None:
    relu = np.maximum(gaussian, 0.0)
    stats = _stats(relu)
    lo, hi = stats.compute_range("t", "kl", symmetric=False)
    assert lo == 0.0
    assert 3.0 < hi < float(relu.max())


def test_streaming_matches_one_shot(gaussian: np.ndarray) -> None:
    one = _stats(gaussian, chunks=1)
    # Shuffle so early chunks have a small range and the histogram must widen many times.
    order = np.argsort(np.abs(gaussian), kind="stable")
    many = _stats(gaussian[order], chunks=50)
    for algorithm in ("minmax", "percentile", "kl"):
        for symmetric in (True, False):
            expected = one.compute_range("t", algorithm, symmetric=symmetric)
            got = many.compute_range("t", algorithm, symmetric=symmetric)
            assert got == pytest.approx(expected, rel=1e-9, abs=1e-9), (algorithm, symmetric)


def test_range_widens_as_data_grows() -> None:
    stats = CalibrationStats(64)
    stats.update("t", np.linspace(0.0, 1.0, 1000))
    first = stats.compute_range("t", "percentile", symmetric=True, percentile=100.0)
    stats.update("t", np.linspace(-100.0, 100.0, 1000))
    assert first == (-1.0, 1.0)
    assert stats.compute_range("t", "minmax", symmetric=False) == (-100.0, 100.0)
    data = np.concatenate([np.linspace(0.0, 1.0, 1000), np.linspace(-100.0, 100.0, 1000)])
    lo, hi = stats.compute_range("t", "percentile", symmetric=False, percentile=90.0)
    exp_lo, exp_hi = np.percentile(data, [10.0, 90.0])
    assert abs(lo - exp_lo) <= _bin_width(data, 64)
    assert abs(hi - exp_hi) <= _bin_width(data, 64)


def test_histogram_memory_is_independent_of_sample_count() -> None:
    stats = CalibrationStats(256)
    rng = np.random.default_rng(2)
    stats.update("t", rng.normal(size=10))
    sizes = [h.positive.nbytes + h.negative.nbytes for h in stats._tensors.values()]
    for _ in range(20):
        stats.update("t", rng.normal(size=10_000) * 10)
    assert [h.positive.nbytes + h.negative.nbytes for h in stats._tensors.values()] == sizes
    assert stats.count("t") == 200_010


def test_nan_and_inf_are_ignored_and_counted() -> None:
    data = np.array([1.0, np.nan, -2.0, np.inf, 3.0, -np.inf], dtype=np.float32)
    stats = CalibrationStats()
    stats.update("t", data)
    assert stats.nonfinite_count("t") == 3
    assert stats.count("t") == 3
    for algorithm in ("minmax", "kl", "percentile"):
        lo, hi = stats.compute_range("t", algorithm, symmetric=False, percentile=100.0)
        assert np.isfinite([lo, hi]).all()
        assert -2.0 <= lo <= 0.0 <= hi <= 3.0
    assert stats.compute_range("t", "minmax", symmetric=False) == (-2.0, 3.0)


def test_only_nonfinite_values_raise_data_error_naming_the_tensor() -> None:
    stats = CalibrationStats()
    stats.update("conv1_out", np.array([np.nan, np.inf]))
    with pytest.raises(lpq.DataError, match="conv1_out"):
        stats.compute_range("conv1_out", "minmax", symmetric=True)


def test_empty_arrays_register_but_raise_until_data_arrives() -> None:
    stats = CalibrationStats()
    stats.update("t", np.zeros((0, 3), dtype=np.float32))
    assert stats.tensor_names() == ["t"]
    with pytest.raises(lpq.DataError, match="no values"):
        stats.compute_range("t", "kl", symmetric=True)
    stats.update("t", np.array([0.5]))
    assert stats.compute_range("t", "minmax", symmetric=True) == (-0.5, 0.5)


@pytest.mark.parametrize("algorithm", ["minmax", "kl", "percentile", "mse"])
def test_constant_and_zero_tensors(algorithm: str) -> None:
    stats = CalibrationStats()
    stats.update("c", np.full((4, 5), 2.5, dtype=np.float32))
    stats.update("neg", np.full(7, -3.0))
    stats.update("z", np.zeros(100, dtype=np.float32))
    assert stats.compute_range("c", algorithm, symmetric=False) == (0.0, 2.5)
    assert stats.compute_range("c", algorithm, symmetric=True) == (-2.5, 2.5)
    assert stats.compute_range("neg", algorithm, symmetric=False) == (-3.0, 0.0)
    assert stats.compute_range("z", algorithm, symmetric=True) == (0.0, 0.0)
    assert stats.compute_range("z", algorithm, symmetric=False) == (0.0, 0.0)


def test_zeros_before_data_stay_counted() -> None:
    stats = CalibrationStats()
    stats.update("t", np.zeros(900))
    stats.update("t", np.linspace(0.0, 1.0, 100))
    _, hi = stats.compute_range("t", "percentile", symmetric=True, percentile=90.0)
    data = np.concatenate([np.zeros(900), np.linspace(0.0, 1.0, 100)])
    assert abs(hi - np.percentile(data, 90.0)) <= _bin_width(data)


def test_bad_arguments_raise_lpq_errors() -> None:
    stats = CalibrationStats()
    stats.update("t", np.arange(10.0))
    with pytest.raises(lpq.ConfigError, match="algorithm"):
        stats.compute_range("t", "entropy_v2", symmetric=True)
    with pytest.raises(lpq.ConfigError, match="percentile"):
        stats.compute_range("t", "percentile", symmetric=True, percentile=0.0)
    with pytest.raises(lpq.DataError, match="missing"):
        stats.compute_range("missing", "minmax", symmetric=True)
    with pytest.raises(lpq.ConfigError, match="num_bins"):
        CalibrationStats(1000)
    with pytest.raises(lpq.DataError, match="dtype"):
        stats.update("s", np.array(["a", "b"]))


# ---------------------------------------------------------------- real ONNX Runtime runs


def _mlp_model(width: int = 16) -> tuple[object, dict[str, np.ndarray]]:
    """x[N,8] -> MatMul w1[8,width] -> Add b1 -> Relu -> MatMul w2[width,4] -> y,
    IR 9 / opset 17."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    weights = {
        "w1": rng.normal(size=(8, width)).astype(np.float32),
        "b1": rng.normal(size=width).astype(np.float32),
        "w2": rng.normal(size=(width, 4)).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Add", ["h", "b1"], ["h_b"], name="add1"),
        helper.make_node("Relu", ["h_b"], ["r"], name="relu1"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model, weights


def test_collect_statistics_matches_numpy_activations() -> None:
    model, w = _mlp_model()
    rng = np.random.default_rng(4)
    batches = [rng.normal(size=(5, 8)).astype(np.float32) * (i + 1) for i in range(6)]
    names = ["x", "h_b", "r", "y", "w1"]
    stats = collect_statistics(model, names, ({"x": b} for b in batches), num_bins=1024)
    assert set(stats.tensor_names()) == set(names)

    x = np.concatenate(batches)
    h_b = x @ w["w1"] + w["b1"]
    r = np.maximum(h_b, 0.0)
    expected = {"x": x, "h_b": h_b, "r": r, "y": r @ w["w2"], "w1": w["w1"]}
    for name, values in expected.items():
        lo, hi = stats.compute_range(name, "minmax", symmetric=False)
        assert lo == pytest.approx(min(float(values.min()), 0.0), rel=1e-5, abs=1e-6), name
        assert hi == pytest.approx(max(float(values.max()), 0.0), rel=1e-5, abs=1e-6), name
        _, t = stats.compute_range(name, "percentile", symmetric=True, percentile=95.0)
        assert abs(t - np.percentile(np.abs(values), 95.0)) <= _bin_width(values, 1024), name
    assert stats.count("h_b") == h_b.size
    assert len(model.graph.output) == 1  # the caller's model is not modified


def test_collect_statistics_rejects_bad_input() -> None:
    model, _ = _mlp_model()
    good = {"x": np.ones((2, 8), dtype=np.float32)}
    with pytest.raises(lpq.ModelError, match="nope"):
        collect_statistics(model, ["nope"], [good])
    with pytest.raises(lpq.DataError, match="no feeds"):
        collect_statistics(model, ["r"], [])
    with pytest.raises(lpq.DataError, match="lacks model inputs"):
        collect_statistics(model, ["r"], [{"z": good["x"]}])
    with pytest.raises(lpq.DataError, match="could not run"):
        collect_statistics(model, ["r"], [{"x": np.ones((2, 3), dtype=np.float32)}])


def test_kl_with_more_levels_than_bins_keeps_the_full_range(gaussian: np.ndarray) -> None:
    stats = _stats(gaussian)
    assert stats.compute_range("t", "kl", symmetric=True, num_quant_levels=65536) == (-70.0, 70.0)


def test_kl_one_sided_negative_data() -> None:
    data = -np.abs(np.random.default_rng(5).normal(size=50_000))
    data[:3] = [-40.0, -50.0, -45.0]
    lo, hi = _stats(data).compute_range("t", "kl", symmetric=False)
    assert hi == 0.0
    assert -50.0 < lo < -3.0


def test_save_and_load_round_trip(gaussian: np.ndarray, tmp_path) -> None:
    stats = _stats(gaussian, chunks=3)
    stats.update("nan", np.array([np.nan, 1.0]))
    stats.update("empty", np.zeros(0))
    path = tmp_path / "stats.npz"
    stats.save(path)
    loaded = CalibrationStats.load(path)
    assert loaded.tensor_names() == stats.tensor_names()
    assert loaded.nonfinite_count("nan") == 1
    for algorithm in ("minmax", "kl", "percentile"):
        for symmetric in (True, False):
            expected = stats.compute_range("t", algorithm, symmetric=symmetric)
            assert loaded.compute_range("t", algorithm, symmetric=symmetric) == expected
    loaded.update("t", np.array([100.0]))  # still streams after loading
    assert loaded.compute_range("t", "minmax", symmetric=False)[1] == 100.0
    (tmp_path / "bad.npz").write_bytes(b"not a zip file")
    with pytest.raises(lpq.DataError, match="calibrate again"):
        CalibrationStats.load(tmp_path / "bad.npz")


def test_collect_statistics_leaves_the_callers_session_options_alone() -> None:
    import onnxruntime

    model, _ = _mlp_model()
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    level = options.graph_optimization_level
    feeds = [{"x": np.ones((2, 8), dtype=np.float32)}]
    stats = collect_statistics(model, ["r"], feeds, session_options=options)
    assert stats.count("r") == 32
    assert options.graph_optimization_level == level


def test_collect_statistics_on_a_model_too_large_to_serialize_inline(monkeypatch) -> None:
    from lpq_onnxrt import session

    monkeypatch.setattr(session, "PROTO_LIMIT", 0)  # take the external-data path
    model, w = _mlp_model()
    x = np.random.default_rng(6).normal(size=(3, 8)).astype(np.float32)
    stats = collect_statistics(model, ["h_b"], [{"x": x}])
    h_b = x @ w["w1"] + w["b1"]
    assert stats.compute_range("h_b", "minmax", symmetric=False) == pytest.approx(
        (min(h_b.min(), 0.0), max(h_b.max(), 0.0)), rel=1e-5
    )


def test_kl_coarse_to_fine_search_matches_exhaustive_search(
    gaussian: np.ndarray, monkeypatch
) -> None:
    from lpq_onnxrt.calibration import algorithms

    data = np.concatenate([gaussian, np.abs(gaussian[:50_000]) * 3.0])  # skewed, heavier tail
    fast = _stats(data).compute_range("t", "kl", symmetric=True)
    monkeypatch.setattr(algorithms, "_KL_COARSE_STEPS", 10**9)  # every threshold
    exhaustive = _stats(data).compute_range("t", "kl", symmetric=True)
    assert abs(fast[1] - exhaustive[1]) <= 8 * _bin_width(data)


def test_memory_budget_bounds_every_run_and_changes_no_statistic(monkeypatch) -> None:
    """A 64-sample batch under a budget below one sample's activations: runs of at most the
    budget, in tensor groups, and histograms identical to one unbounded run."""
    from lpq_onnxrt.calibration import collect as calibration

    model, _ = _mlp_model()
    rng = np.random.default_rng(5)
    batches = [rng.normal(size=(64, 8)).astype(np.float32) for _ in range(3)]
    names = ["h_b", "r", "y"]
    per_sample = 4 * (16 + 16 + 4)  # float32 bytes of one sample of the three tensors
    budget = 2 * 16 * 4  # smaller than one sample of all three: groups are needed
    fetched: list[int] = []
    original = calibration._run

    def recording(session, group, feed, index):
        outputs = original(session, group, feed, index)
        fetched.append(sum(o.nbytes for o in outputs))
        return outputs

    monkeypatch.setattr(calibration, "_run", recording)
    bounded = collect_statistics(
        model, names, ({"x": b} for b in batches), memory_budget_bytes=budget
    )
    assert max(fetched) <= budget < per_sample  # the probe too
    assert len(fetched) > 3 * 64  # many small runs
    monkeypatch.setattr(calibration, "_run", original)
    unbounded = collect_statistics(model, names, ({"x": b} for b in batches))
    for name in names:
        for algorithm in ("minmax", "kl", "percentile"):
            assert bounded.compute_range(name, algorithm, symmetric=False) == (
                unbounded.compute_range(name, algorithm, symmetric=False)
            )
        assert bounded.count(name) == unbounded.count(name) == 3 * 64 * (4 if name == "y" else 16)


def test_the_probe_fetches_tensors_in_groups_within_the_budget(monkeypatch) -> None:
    """Sizes are probed in a few runs (declared or inferred shapes pack the groups), not one
    run per tensor, and the plan sees every tensor's real size; a tensor of unknown shape
    is probed on its own."""
    from onnx import helper, shape_inference

    from lpq_onnxrt.calibration import collect as calibration

    bare, _ = _mlp_model()
    model = shape_inference.infer_shapes(bare)  # as a prepared model has them
    names = ["h_b", "r", "y"]
    runs: list[list[str]] = []
    original = calibration._run
    plans: list[dict[str, int]] = []
    original_plan = calibration._plan

    def recording(session, group, feed, index):
        runs.append(list(group))
        return original(session, group, feed, index)

    def planning(sizes, budget, batch):
        plans.append(dict(sizes))
        return original_plan(sizes, budget, batch)

    monkeypatch.setattr(calibration, "_run", recording)
    monkeypatch.setattr(calibration, "_plan", planning)
    x = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)
    collect_statistics(model, names, [{"x": x}], memory_budget_bytes=1 << 20)
    assert runs[0] == names  # one probe run for all three
    assert plans[-1] == {"h_b": 4 * 16, "r": 4 * 16, "y": 4 * 4}  # measured, per sample
    runs.clear()
    collect_statistics(model, names, [{"x": x}], memory_budget_bytes=80)
    assert runs[:2] == [["h_b"], ["r", "y"]]  # 64 + 64 + 16 bytes, split to fit 80
    runs.clear()
    # no declared inner shapes: onnx's inference with the input fixed to the feed's shape
    collect_statistics(bare, names, [{"x": x}], memory_budget_bytes=1 << 20)
    assert runs[0] == names
    assert plans[-1] == {"h_b": 4 * 16, "r": 4 * 16, "y": 4 * 4}
    runs.clear()
    monkeypatch.setattr(calibration, "_inferred_bytes", lambda *args: {})
    collect_statistics(bare, names, [{"x": x}], memory_budget_bytes=1 << 20)
    # the graph output's shape is declared; the others, unknown: one first, then a
    # group twice as large while it fits the budget by the sizes seen
    assert runs[:3] == [["y"], ["h_b"], ["r"]]  # the last one left
    runs.clear()
    wide = [f"t{k}" for k in range(9)]
    for k, name in enumerate(wide):  # nine unknown tensors of 64 bytes a sample
        node = helper.make_node("Identity", ["h_b"], [name], name=f"copy{k}")
        bare.graph.node.append(node)
    collect_statistics(bare, wide, [{"x": x}], memory_budget_bytes=1 << 20)
    assert [len(run) for run in runs[:4]] == [1, 2, 4, 2]
    runs.clear()
    collect_statistics(bare, wide, [{"x": x}], memory_budget_bytes=2 * 64 * 2)
    assert [len(run) for run in runs[:5]] == [1, 2, 2, 2, 2]  # 2 x 64 x 2 fits two


def test_memory_budget_knob(monkeypatch) -> None:
    from lpq_onnxrt.calibration import DEFAULT_MEMORY_BUDGET, MEMORY_ENV, memory_budget

    monkeypatch.delenv(MEMORY_ENV, raising=False)
    assert memory_budget({}) == DEFAULT_MEMORY_BUDGET
    monkeypatch.setenv(MEMORY_ENV, "256")
    assert memory_budget({}) == 256 << 20
    assert memory_budget({"calibration_memory_mb": 64}) == 64 << 20
    with pytest.raises(lpq.ConfigError, match="MiB"):
        memory_budget({"calibration_memory_mb": "lots"})


def test_inputs_without_a_common_batch_axis_are_not_split() -> None:
    """A recurrent model's state input has the batch on axis 1: feeds run whole."""
    from lpq_onnxrt.calibration.collect import _batch_of

    assert _batch_of({"x": np.zeros((4, 8)), "sr": np.array(16000)}) == 4
    assert _batch_of({"x": np.zeros((4, 8)), "state": np.zeros((2, 4, 128))}) is None


def _fake_quant_mse(x: np.ndarray, lo: float, hi: float, levels: int = 256) -> float:
    """Mean squared error of numpy quantize-dequantize of ``x`` to ``[lo, hi]``."""
    scale = (hi - lo) / (levels - 1)
    zero = np.round(-lo / scale)
    q = np.clip(np.round(x / scale) + zero, 0, levels - 1)
    return float(np.mean(((q - zero) * scale - x) ** 2))


@pytest.mark.parametrize("shape", ["gaussian", "heavy_tail", "relu"])
def test_mse_range_is_near_the_numpy_brute_force_optimum(shape: str) -> None:
    rng = np.random.default_rng(11)
    x = rng.normal(size=200_000).astype(np.float32)
    if shape == "heavy_tail":
        x = rng.standard_t(2, size=200_000).astype(np.float32)
    if shape == "relu":
        x = np.maximum(x, 0) * rng.exponential(1.0, size=x.size).astype(np.float32)
    stats = _stats(x)
    symmetric = shape != "relu"
    lo, hi = stats.compute_range("t", "mse", symmetric=symmetric)
    # numpy reference: the best of 400 clipping thresholds, by real fake-quant error
    top = float(np.abs(x).max())
    grid = np.linspace(top / 400, top, 400)
    errors = [_fake_quant_mse(x, -t if symmetric else 0.0, t, 256) for t in grid]
    best = float(min(errors))
    ours = _fake_quant_mse(x, lo, hi)
    minmax = _fake_quant_mse(x, *stats.compute_range("t", "minmax", symmetric=symmetric))
    assert ours <= best * 1.10, (ours, best)
    if shape == "heavy_tail":
        assert ours < 0.9 * minmax  # clipping outliers pays off
    assert ours <= minmax * 1.001


def test_binning_in_slices_counts_every_value_once_in_its_bin() -> None:
    """A chunk larger than one binning slice: the sign-split histograms equal a numpy
    count of floor(|x| / bin width), over all the values."""
    from lpq_onnxrt.calibration import histogram

    rng = np.random.default_rng(7)
    data = rng.normal(0.0, 2.0, size=3 * histogram._BIN_SLICE + 7).clip(-7.9, 7.9)
    data = data.astype(np.float32)
    data[:5] = [0.0, -0.0, 7.99, -7.99, 1e-9]
    data[-1] = 8.0  # the bound: the last bin
    stats = CalibrationStats(NUM_BINS)
    stats.update("t", data)
    tensor = stats._tensors["t"]
    assert tensor.bound == 8.0
    index = np.minimum(np.floor(np.abs(data.astype(np.float64)) * NUM_BINS / 8.0), NUM_BINS - 1)
    index = index.astype(np.int64)
    positive = np.bincount(index[~(data < 0)], minlength=NUM_BINS)
    negative = np.bincount(index[data < 0], minlength=NUM_BINS)
    assert np.array_equal(tensor.positive, positive)
    assert np.array_equal(tensor.negative, negative)
    assert int(tensor.positive.sum() + tensor.negative.sum()) == data.size


# ------------------------------------------- run budget: a small model, a small run
# Calibration runs of a small model return activations in proportion to the model
# (``calibration.collect.run_budget``), not up to the whole memory budget: a batch runs
# in chunks of samples, with the same statistics.


def test_run_budget_scales_with_the_weights_between_a_floor_and_the_budget():
    from lpq_onnxrt.calibration.collect import RUN_FLOOR, RUN_WEIGHTS, run_budget

    small, large = _mlp_model(16)[0], _mlp_model(1 << 16)[0]  # 832 bytes, 3.25 MiB
    assert run_budget(small, 1 << 30) == RUN_FLOOR
    assert run_budget(large, 1 << 40) == max(RUN_FLOOR, RUN_WEIGHTS * 13 * 4 * (1 << 16))
    assert run_budget(small, 1 << 20) == 1 << 20  # never above the budget


def test_a_small_model_runs_its_batch_in_chunks_with_the_same_statistics(monkeypatch):
    from lpq_onnxrt.calibration import collect as calibration
    from lpq_onnxrt.calibration import collect_statistics

    model, _ = _mlp_model(16)
    names = ["h", "r", "y"]
    per_sample = 4 * (16 + 16 + 4)
    weights = 4 * (8 * 16 + 16 + 16 * 4)
    rng = np.random.default_rng(5)
    batches = [rng.normal(size=(64, 8)).astype(np.float32) for _ in range(3)]
    fetched: list[int] = []
    original = calibration._run

    def recording(session: Any, group: Any, feed: Any, index: int) -> Any:
        outputs = original(session, group, feed, index)
        fetched.append(sum(o.nbytes for o in outputs))
        return outputs

    monkeypatch.setattr(calibration, "_run", recording)
    monkeypatch.setattr(calibration, "RUN_FLOOR", 0)  # the weights alone set the chunk
    chunked = collect_statistics(model, names, ({"x": b} for b in batches))
    chunk = calibration.RUN_WEIGHTS * weights // per_sample  # samples per run
    assert 1 < chunk < 64
    assert max(fetched) <= calibration.RUN_WEIGHTS * weights
    assert len(fetched) == 1 + 3 * -(-64 // chunk)  # the probe, then chunks of each batch
    fetched.clear()
    monkeypatch.setattr(calibration, "RUN_FLOOR", 1 << 30)
    whole = collect_statistics(model, names, ({"x": b} for b in batches))
    assert len(fetched) == 1 + 3  # the probe, then each batch in one run
    for name in names:
        for algorithm in ("minmax", "kl", "percentile"):
            assert chunked.compute_range(name, algorithm, symmetric=False) == (
                whole.compute_range(name, algorithm, symmetric=False)
            )
        assert chunked.count(name) == whole.count(name)


def test_calibration_sessions_do_not_spin_and_the_callers_options_are_untouched(monkeypatch):
    import onnxruntime as ort

    from lpq_onnxrt.calibration import collect as calibration
    from lpq_onnxrt.calibration import collect_statistics

    given = ort.SessionOptions()
    given.intra_op_num_threads = 1
    made: list[Any] = []
    original = calibration._unoptimized_copy

    def remember(options: Any) -> Any:
        made.append(original(options))
        return made[-1]

    monkeypatch.setattr(calibration, "_unoptimized_copy", remember)
    x = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)
    collect_statistics(_mlp_model(16)[0], ["h"], [{"x": x}], session_options=given)
    (options,) = made
    assert options.get_session_config_entry(calibration.SPINNING) == "0"
    assert options.intra_op_num_threads == 1
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    with pytest.raises(RuntimeError):  # ORT's "does not have configuration with key"
        given.get_session_config_entry(calibration.SPINNING)
    assert given.graph_optimization_level != ort.GraphOptimizationLevel.ORT_DISABLE_ALL


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_histogram_counts_match_a_numpy_reference(dtype: type) -> None:
    """The binned counts, value by value as defined: |x| in bins of width bound / n (the
    last bin takes the bound itself), x < 0 in the negative half, -0.0 and NaN handled as
    the definition says (-0.0 is not negative; NaN and inf are not binned, but counted)."""
    from lpq_onnxrt.calibration.histogram import _BIN_SLICE, _TensorHistogram

    rng = np.random.default_rng(7)
    data = rng.normal(0.0, 3.0, size=3 * _BIN_SLICE + 123).astype(dtype)
    data[:50] = -0.0
    data[50:60] = 16.0  # the bound itself (a power of two above every other value)
    data[60:70] = -1.0 * 16.0 / 64  # exactly on bin edges
    data[70:75] = [np.nan, np.inf, -np.inf, np.nan, 2.0]
    data[75:80] = -16.0  # minus the bound: the negative half's last bin
    data[80:90] = -1e-9  # negatives in bin 0 (they share an index with the positives')
    data[90:95] = 16.0 / 64 * 0.999  # just under a bin edge, both signs
    data[95:100] = -16.0 / 64 * 0.999
    histogram = _TensorHistogram(64)
    histogram.add(data)
    finite = data[np.isfinite(data)]
    assert histogram.bound == 16.0 and histogram.nonfinite == 4
    index = np.minimum(np.floor(np.abs(finite.astype(np.float64)) * 64 / 16.0), 63).astype(int)
    negative = finite < 0
    np.testing.assert_array_equal(histogram.positive, np.bincount(index[~negative], minlength=64))
    np.testing.assert_array_equal(histogram.negative, np.bincount(index[negative], minlength=64))
    assert (histogram.minimum, histogram.maximum) == (float(finite.min()), float(finite.max()))
