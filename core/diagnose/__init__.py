"""Diagnosis: where a quantized model loses accuracy, op by op (``lpq diagnose``).

:func:`diagnose` compares every quantizable op's output in the fp32 and the quantized
model, ranks the ops by error with their type, precision and scheme, and measures how much
of the model's output error each of the worst ops' fallback would remove.
:func:`write_report` writes it as ``diagnosis.html`` (charts included) and
``diagnosis.json``. Framework-free: everything goes through the plugin manager's hooks.
"""

from .analysis import Diagnosis, FallbackEffect, OpReport, diagnose
from .render import write_report
from .workspace import TunedRun, tuned_run

__all__ = [
    "Diagnosis",
    "FallbackEffect",
    "OpReport",
    "TunedRun",
    "diagnose",
    "tuned_run",
    "write_report",
]
