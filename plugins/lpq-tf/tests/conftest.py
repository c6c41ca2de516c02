"""Fixtures for lpq-tf's tests: the conformance suite's three plus a trained Keras CNN.

The CNN trains once per session (a few seconds); tests must not modify it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tf_testmodels import calib_loader, digits_cnn, eval_loader, top1

import lpq


@pytest.fixture(scope="session")
def cnn() -> Any:
    return digits_cnn()


@pytest.fixture(scope="session")
def cnn_capability(cnn: Any) -> lpq.FrameworkCapability:
    return lpq.get_plugin_manager().query_capability("tf", cnn, None, {})


@pytest.fixture(scope="session")
def cnn_fp32_accuracy(cnn: Any) -> float:
    """The fp32 CNN's top-1 on the 400 eval digits (run as its float .tflite in LiteRT)."""
    return top1(cnn)


@pytest.fixture
def calib() -> lpq.ArrayLoader:
    return calib_loader()


@pytest.fixture
def lpq_sample_model(cnn: Any) -> Any:
    return cnn


@pytest.fixture
def lpq_sample_data() -> lpq.ArrayLoader:
    return eval_loader(160, 32)


@pytest.fixture
def lpq_misfit_data() -> lpq.ArrayLoader:
    # 3 channels of 5x5 where the model takes 8x8x1 (NHWC).
    rng = np.random.default_rng(0)
    return lpq.ArrayLoader(rng.random((8, 5, 5, 3), dtype=np.float32), np.zeros(8, np.int64), 4)
