"""Built-in examples shipped with the adaptor (small files inside the package)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent


def digits_example() -> dict[str, Any]:
    """The ``digits`` example: a small CNN trained on scikit-learn's bundled digits.

    Returns the model path, the calibration ``.npz`` (200 samples, one array named as the
    model input), the evaluation ``.npz`` (400 held-out samples plus ``labels``) and the
    metric to tune for. Regenerate the files with ``scripts/make_digits_example.py``.
    """
    folder = _HERE / "digits"
    return {
        "model": folder / "model.onnx",
        "calib": folder / "calib.npz",
        "eval": folder / "eval.npz",
        "metric": "top1",
    }
