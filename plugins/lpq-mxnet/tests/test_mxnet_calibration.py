"""The calibration registry and its range algorithms on known distributions."""

from __future__ import annotations

import numpy as np
import pytest

import lpq
from lpq_mxnet.calibration import ALGORITHMS, Stats, tensor_range
from lpq_mxnet.info import capability_files


def streamed(batches: list[np.ndarray], histogram: bool = True) -> Stats:
    stats = Stats()
    for batch in batches:
        stats.update(batch, with_histogram=histogram)
    return stats


@pytest.fixture
def outliers() -> list[np.ndarray]:
    """Four batches of N(0, 1) with one 40-sigma outlier in the last."""
    rng = np.random.default_rng(0)
    batches = [rng.standard_normal(50_000).astype(np.float32) for _ in range(4)]
    batches[-1][0] = 40.0
    return batches


def test_the_yaml_declares_exactly_the_registered_algorithms() -> None:
    spec = lpq.load_capability(capability_files(), "mxnet", "1.9.1")
    used = {
        cfg.activation.algorithm
        for op_type in spec.quantizable_op_types()
        for cap in spec.for_op_type(op_type)
        for cfg in cap.configs()
        if cfg.activation is not None
    }
    assert used == set(ALGORITHMS) == {"minmax", "kl", "percentile"}


def test_minmax_keeps_the_outlier_and_clipping_algorithms_drop_it(
    outliers: list[np.ndarray],
) -> None:
    stats = streamed(outliers)
    assert tensor_range(stats, "minmax", signed=False) == pytest.approx((-40.0, 40.0))
    for algorithm in ("kl", "percentile"):
        low, high = tensor_range(stats, algorithm, signed=False)
        assert low == -high and 3.0 < high < 10.0, (algorithm, high)


def test_percentile_matches_numpy_within_a_bin(outliers: list[np.ndarray]) -> None:
    exact = np.percentile(np.abs(np.concatenate(outliers)), 99.99)
    _, high = tensor_range(streamed(outliers), "percentile", signed=False)
    assert abs(high - exact) <= 2 * 40.0 / 2001 * 2  # bins widen as the range grows


def test_non_negative_tensors_get_uint8_ranges_unless_signed() -> None:
    relu = [np.abs(np.random.default_rng(1).standard_normal(10_000)).astype(np.float32)]
    for algorithm in ALGORITHMS:
        low, high = tensor_range(streamed(relu), algorithm, signed=False)
        assert low == 0.0 and high > 0
        low, high = tensor_range(streamed(relu), algorithm, signed=True)
        assert low == -high < 0


def test_an_all_zero_tensor_gets_a_tiny_positive_range() -> None:
    low, high = tensor_range(
        streamed([np.zeros(100, np.float32)], histogram=False), "minmax", False
    )
    assert low == 0.0 and 0 < high < 1e-6
