"""The digits data and the small Gluon CNN the tests and bench/bench_mxnet.py use.

MXNet is imported inside the functions: this module is imported by ``conftest.py``,
which also loads in the main environment, where MXNet is not installed.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def digits_split() -> dict[str, np.ndarray]:
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


def train_digits_cnn(digits: dict[str, np.ndarray], epochs: int = 8) -> Any:
    """The CNN trained with Adam (about 99% top-1 on the held-out digits; seconds)."""
    import mxnet as mx
    from mxnet import autograd, gluon

    mx.random.seed(0)
    np.random.seed(0)
    net = build_digits_cnn()
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 3e-3})
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    x, y = digits["train_x"], digits["train_y"]
    for _ in range(epochs):
        for start in range(0, len(x), 64):
            xb, yb = mx.nd.array(x[start : start + 64]), mx.nd.array(y[start : start + 64])
            with autograd.record():
                value = loss(net(xb), yb)
            value.backward()
            trainer.step(len(xb))
    net.hybridize(active=False)  # handed over as users usually have it: not hybridized
    return net
