"""What a latency search decided (:class:`Decision`) and each comparison it made
(:class:`Step`), with their JSON.

These records outlive the search: they go into the decision cache
(:mod:`lpq.latency.cache`), the quantize result and reports, and lpq-onnxrt's
``LatencyDecision`` subclasses :class:`Decision` to rename its JSON keys. Kept apart from
the search so that readers of a cached decision need none of the search's machinery.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class Step:
    """One comparison: ``change`` applied to the current plan, and what it measured (an
    untimed step, decided by the op latency table or a profile, says so in ``note``)."""

    change: str
    keep_float: list[str] = field(default_factory=list)
    before_ms: float | None = None
    after_ms: float | None = None
    #: after / before, the median of paired per-round ratios
    ratio: float | None = None
    #: how far the pessimistic bound lies above the ratio
    noise: float = 0.0
    kept: bool = False
    rounds: int = 0
    #: the candidate's variant and ops in the alternative mode (backends that have them)
    variant: str | None = None
    alternative: list[str] = field(default_factory=list)
    #: output error of the current plan and the candidate (backends with ``error``)
    error_before: float | None = None
    error_after: float | None = None
    #: why the change was decided without timing (table verdict, profile prediction)
    note: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Step:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class Decision:
    """What the measurements decided, and the numbers behind it."""

    #: the plan's quantized ops (names), in graph order
    ops: list[str]
    #: those kept in float, in graph order
    keep_float: list[str]
    #: the variant chosen (backends with :class:`Variants`)
    variant: str | None = None
    #: ops that run in the alternative mode (backends with :class:`Alternatives`)
    alternative: list[str] = field(default_factory=list)
    fp32_ms: float | None = None
    #: the plan as asked (every op quantized); None without step 1
    planned_ms: float | None = None
    #: the result (``fp32_ms`` when every op went back to float)
    chosen_ms: float | None = None
    #: relative noise of the final comparison (result against fp32)
    noise: float = 0.0
    #: every quantized candidate measured slower than fp32: the result is the float model
    slower_than_float: bool = False
    #: the fastest quantized candidate's time when ``slower_than_float``
    best_quantized_ms: float | None = None
    #: fp32 time / result time and fp32 time / plan-as-asked time, each the median of
    #: per-round paired ratios (what the decisions used; more robust than ratios of the
    #: medians above on a busy machine). 1.0 when the result is the float model.
    speedup: float | None = None
    planned_speedup: float | None = None
    steps: list[Step] = field(default_factory=list)
    #: from the decision cache, not measured now
    cached: bool = False

    @property
    def quantized(self) -> list[str]:
        return [name for name in self.ops if name not in set(self.keep_float)]

    def summary(self) -> str:
        """One line for logs and reports."""
        kept = (
            "every op kept in float"
            if self.ops and len(self.keep_float) == len(self.ops)
            else f"{len(self.keep_float)} of {len(self.ops)} ops kept in float"
        )
        if self.alternative:
            kept += f", {len(self.alternative)} in the alternative mode"
        if self.variant is not None:
            kept += f" ({self.variant})"
        speed = ""
        if self.speedup is not None and self.chosen_ms is not None and self.fp32_ms is not None:
            speed = (
                f"; {self.speedup:.2f}x fp32 ({self.chosen_ms:.3f} vs {self.fp32_ms:.3f} ms, "
                f"noise {self.noise:.0%}"
            )
            if self.planned_speedup is not None:
                speed += f"; the plan as asked: {self.planned_speedup:.2f}x"
            speed += ")"
        return f"latency-aware: {kept}{speed}{' (cached)' if self.cached else ''}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("cached")
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, cached: bool = False) -> Decision:
        """A decision from :meth:`to_json` (keys it does not know are ignored)."""
        known = {f.name for f in fields(cls)} - {"steps", "cached"}
        values = {k: v for k, v in data.items() if k in known}
        steps = [Step.from_json(step) for step in data.get("steps", [])]
        return cls(**values, steps=steps, cached=cached)
