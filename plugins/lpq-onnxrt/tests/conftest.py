"""Fixtures for the adaptor's tests: the digits example model and small built graphs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lpq
from lpq_onnxrt.examples import digits_example


@pytest.fixture(scope="session")
def digits() -> dict[str, Any]:
    """The digits example: paths plus its calibration and evaluation arrays."""
    files = digits_example()
    with np.load(files["calib"]) as calib, np.load(files["eval"]) as ev:
        return {
            **files,
            "calib_x": calib["input"],
            "eval_x": ev["input"],
            "eval_y": ev["labels"],
        }


@pytest.fixture
def lpq_sample_model(digits: dict[str, Any]) -> Path:
    """A small trained CNN (Conv, Gemm, MatMul) as an .onnx file: IR 8, opset 17."""
    return Path(digits["model"])


@pytest.fixture
def lpq_sample_data(digits: dict[str, Any]) -> lpq.ArrayLoader:
    """160 held-out digits with labels, in batches of 32."""
    return lpq.ArrayLoader(digits["eval_x"][:160], digits["eval_y"][:160], batch_size=32)


@pytest.fixture
def lpq_misfit_data(digits: dict[str, Any]) -> lpq.ArrayLoader:
    """Inputs of the wrong spatial size (10x10 instead of 8x8)."""
    x = np.zeros((8, 1, 10, 10), dtype=np.float32)
    return lpq.ArrayLoader(x, np.zeros(8, dtype=np.int64), batch_size=4)


@pytest.fixture
def calib_loader(digits: dict[str, Any]) -> lpq.ArrayLoader:
    return lpq.ArrayLoader(digits["calib_x"], batch_size=50)


@pytest.fixture
def eval_loader(digits: dict[str, Any]) -> lpq.ArrayLoader:
    return lpq.ArrayLoader(digits["eval_x"], digits["eval_y"], batch_size=100)
