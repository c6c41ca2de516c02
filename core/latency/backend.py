"""What the latency search asks of a framework: :class:`Backend` (required) and the
optional methods that turn on its further steps (:class:`Variants`,
:class:`Alternatives`, :class:`Blamer`, :class:`Comparer`).

The contract an adaptor implements, apart from the search that uses it: an adaptor's
backend module needs to read only this file to know what to write. The optional methods
are looked up by name on the backend (:mod:`lpq.latency.steps`); the protocols here name
and type them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from .timing import Comparison, Run

C = TypeVar("C")


class Backend(Protocol[C]):
    """What the search asks a framework: the plan's ops, a candidate with some of them in
    float, and one inference of a candidate at the measuring input.

    A backend with :class:`Variants` or :class:`Alternatives` takes them in ``build``:
    ``build(keep_float, variant, alternative)`` (``alternative``: the ops to run in the
    alternative mode); the optional methods are looked up by name and may be None."""

    def ops(self) -> Sequence[tuple[str, str]]:
        """The plan's quantized ops, ``(name, op type)``, in graph order."""
        ...

    def build(self, keep_float: frozenset[str]) -> C:
        """The model with the ops ``keep_float`` in float (all of them: the float model)."""
        ...

    def runner(self, candidate: C) -> Run:
        """A callable that runs ``candidate`` once on the measuring input."""
        ...


@runtime_checkable
class Blamer(Protocol):
    """Optional backend method: the ops of ``candidate`` a profiler finds slower in int8
    than in float (lpq-onnxrt's ORT profiler does this)."""

    def blame(self, candidate: Any, keep_float: frozenset[str]) -> Sequence[str]: ...


@runtime_checkable
class Variants(Protocol):
    """Optional: the ways the whole plan can be quantized (lpq-onnxrt: "qdq",
    "qoperator"), the default first."""

    def variants(self) -> Sequence[str]: ...


@runtime_checkable
class Alternatives(Protocol):
    """Optional: ops that may run in another quantized mode instead of float (lpq-onnxrt:
    dynamic int8). ``every=False``: those worth trying all at once (step 3); True: every
    op that can (step 7). They run in the first variant."""

    def alternatives(self, every: bool = False) -> Sequence[str]: ...


@runtime_checkable
class GainBound(Protocol):
    """Optional: at most how much faster (a share of its time) ``candidate`` could run
    with ``names`` back in float, from its own profile (lpq-onnxrt: the time of their
    nodes and the quantize/dequantize and float nodes beside them). An upper bound, not
    a prediction: an op type under ``Rules.least_gain`` is not timed (step 4)."""

    def gain_bound(
        self, names: Sequence[str], candidate: Any, keep_float: frozenset[str]
    ) -> float: ...


@runtime_checkable
class Comparer(Protocol):
    """Optional: times ``candidate`` against ``current`` itself (instead of
    :func:`decide`'s ``timer``); ``edges``: the thresholds on candidate / current the
    rules decide by, the deciding one (``1 - need``) first."""

    def compare(self, current: Any, candidate: Any, edges: Sequence[float]) -> Comparison: ...
