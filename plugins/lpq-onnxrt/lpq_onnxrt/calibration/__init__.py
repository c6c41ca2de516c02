"""Calibration: streaming statistics and range algorithms (numpy only, in
:mod:`.histogram` and :mod:`.algorithms`), filled by running ONNX Runtime
(:mod:`.collect`)."""

from .algorithms import ALGORITHMS
from .collect import DEFAULT_MEMORY_BUDGET, MEMORY_ENV, collect_statistics, memory_budget
from .histogram import CalibrationStats

__all__ = [
    "ALGORITHMS",
    "DEFAULT_MEMORY_BUDGET",
    "MEMORY_ENV",
    "CalibrationStats",
    "collect_statistics",
    "memory_budget",
]
