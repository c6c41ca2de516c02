"""Fixtures: a small Gluon CNN trained on scikit-learn's digits, and its data.

MXNet is imported inside the fixtures, never at import time: ``test_mxnet_absent.py``
runs from this folder in the main environment too, where MXNet is not installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mxnet_testmodels import build_digits_cnn, digits_split, train_digits_cnn

import lpq


def pytest_configure(config: pytest.Config) -> None:
    # MXNet 1.9 predates numpy 1.23 and scipy 1.15: its own imports warn by the hundred.
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:mxnet.*")
    config.addinivalue_line("filterwarnings", "ignore:.*scipy.sparse.*:DeprecationWarning")


@pytest.fixture(scope="session")
def digits() -> dict[str, np.ndarray]:
    return digits_split()


@pytest.fixture(scope="session")
def digits_cnn(digits: dict[str, np.ndarray]) -> Any:
    """The trained digits CNN (not hybridized, as users usually hand it over)."""
    return train_digits_cnn(digits)


@pytest.fixture
def pm() -> Any:
    return lpq.get_plugin_manager()


@pytest.fixture
def top1(pm: Any) -> Any:
    return pm.create_metric("top1")


@pytest.fixture
def calib_loader(digits: dict[str, np.ndarray]) -> lpq.ArrayLoader:
    return lpq.ArrayLoader(digits["train_x"][:200], batch_size=50)


@pytest.fixture
def eval_loader(digits: dict[str, np.ndarray]) -> lpq.ArrayLoader:
    return lpq.ArrayLoader(digits["test_x"], digits["test_y"], batch_size=100)


@pytest.fixture
def exported(digits_cnn: Any, tmp_path: Path) -> Path:
    """The trained CNN as HybridBlock.export writes it; returns the prefix."""
    import mxnet as mx

    # Export a copy (exporting needs a hybridized block that ran; the fixture stays as is).
    digits_cnn.save_parameters(str(tmp_path / "trained.params"))
    copy = build_digits_cnn()
    copy.load_parameters(str(tmp_path / "trained.params"))
    copy.hybridize()
    copy(mx.nd.zeros((1, 1, 8, 8)))
    copy.export(str(tmp_path / "digits"), epoch=0)
    return tmp_path / "digits"


# ------------------------------------------------------------ the conformance suite's


@pytest.fixture
def lpq_sample_model(digits_cnn: Any) -> Any:
    return digits_cnn


@pytest.fixture
def lpq_sample_data(digits: dict[str, np.ndarray]) -> lpq.ArrayLoader:
    """160 held-out digits with labels, in batches of 32."""
    return lpq.ArrayLoader(digits["test_x"][:160], digits["test_y"][:160], batch_size=32)


@pytest.fixture
def lpq_misfit_data() -> lpq.ArrayLoader:
    """Inputs of the wrong spatial size (10x10 instead of 8x8)."""
    x = np.zeros((8, 1, 10, 10), dtype=np.float32)
    return lpq.ArrayLoader(x, np.zeros(8, dtype=np.int64), batch_size=4)
