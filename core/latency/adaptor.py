"""What an adaptor calls around the latency search: whether the user asked for it
(:func:`enabled`) and telling them what it decided (:func:`announce`).

Every adaptor reads the ``latency_aware`` option and reports the decision the same way;
kept apart from the search so that an adaptor's quantize path can check the option
without importing the search.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from .decision import Decision


def enabled(options: Mapping[str, Any]) -> bool:
    """The ``latency_aware`` option: true/false (also "on"/"off", "yes"/"no", 1/0);
    absent or None (a YAML ``latency_aware:`` left empty, ``PostTrainingQuantConfig``'s
    "not chosen"): off. Off by default because a tuning trial must get the ops its
    tune_cfg asks for; ``lpq.quantize`` turns it on for adaptors that declare the recipe
    (and lpq-onnxrt's ``onnxrt-cpu`` backend profile sets it). Anything else is a
    :class:`~lpq.ConfigError` rather than a guess: every adaptor reads the option here,
    so one value means the same with each."""
    value = options.get("latency_aware")
    if value is None:
        return False
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("on", "true", "yes", "1", "auto"):
            return True
        if lowered in ("off", "false", "no", "0"):
            return False
    elif isinstance(value, bool | int) and value in (0, 1):
        return bool(value)
    raise ConfigError(
        f"latency_aware must be true or false, not {value!r}", hint="use true or false"
    )


def announce(decision: Decision, framework: str, logger: Any) -> None:
    """Log the decision's summary; when every quantized plan was slower than fp32, also
    warn (:class:`lpq.LpqWarning`): the result runs every op in float."""
    import warnings

    from ..errors import LpqWarning

    logger.info("%s: %s", framework, decision.summary())
    if decision.slower_than_float:
        best = decision.best_quantized_ms or 0.0
        fp32 = decision.fp32_ms or 0.0
        warnings.warn(
            f"{framework}: int8 is slower than fp32 on this machine for every plan tried "
            f"(best {best:.3f} ms against {fp32:.3f} ms fp32): every op was kept in float. "
            "Pass latency_aware=False (lpq quantize --no-latency-aware) to get the int8 "
            "model anyway, e.g. for another target device",
            LpqWarning,
            stacklevel=3,
        )
