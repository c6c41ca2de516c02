"""Fixtures: a small Gluon CNN trained on scikit-learn's digits, and its data.

MXNet is imported inside the fixtures, never at import time: ``test_mxnet_absent.py``
runs from this folder in the main environment too, where MXNet is not installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lpq


def pytest_configure(config: pytest.Config) -> None:
    # MXNet 1.9 predates numpy 1.23 and scipy 1.15: its own imports warn by the hundred.
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:mxnet.*")
    config.addinivalue_line("filterwarnings", "ignore:.*scipy.sparse.*:DeprecationWarning")


@pytest.fixture(scope="session")
def digits() -> dict[str, np.ndarray]:
    """The 1797 digits as (N, 1, 8, 8) float32 in [0, 1]: 1397 to train / calibrate,
    400 held out for evaluation (a fixed shuffle)."""
    from sklearn.datasets import load_digits

    raw = load_digits()
    x = (raw.images / 16.0).astype(np.float32)[:, None]
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], raw.target[order].astype(np.int64)
    return {"train_x": x[400:], "train_y": y[400:], "test_x": x[:400], "test_y": y[:400]}


def build_digits_cnn(prefix: str = "digits_") -> Any:
    """Conv-BN-ReLU, Conv-ReLU, MaxPool, Dense-ReLU, Dense: every fusion oneDNN offers a
    CNN (conv+bn+relu, conv+relu, fc+relu) plus standalone Pooling and Flatten."""
    import mxnet as mx
    from mxnet.gluon import nn

    net = nn.HybridSequential(prefix=prefix)
    with net.name_scope():
        net.add(
            nn.Conv2D(16, 3, padding=1),
            nn.BatchNorm(),
            nn.Activation("relu"),
            nn.Conv2D(32, 3, padding=1, activation="relu"),
            nn.MaxPool2D(2),
            nn.Flatten(),
            nn.Dense(64, activation="relu"),
            nn.Dense(10),
        )
    net.initialize(mx.init.Xavier())
    return net


@pytest.fixture(scope="session")
def digits_cnn(digits: dict[str, np.ndarray]) -> Any:
    """The CNN trained for 8 epochs (about 99% top-1 on the held-out digits; seconds)."""
    import mxnet as mx
    from mxnet import autograd, gluon

    mx.random.seed(0)
    np.random.seed(0)
    net = build_digits_cnn()
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 3e-3})
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    x, y = digits["train_x"], digits["train_y"]
    for _ in range(8):
        for start in range(0, len(x), 64):
            xb, yb = mx.nd.array(x[start : start + 64]), mx.nd.array(y[start : start + 64])
            with autograd.record():
                value = loss(net(xb), yb)
            value.backward()
            trainer.step(len(xb))
    net.hybridize(active=False)  # handed over as users usually have it: not hybridized
    return net


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
