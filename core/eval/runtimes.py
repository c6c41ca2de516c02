"""Runtimes (an adaptor's sessions, interpreters, compiled models) kept for one scope.

The fidelity check times the fp32 and the quantized model in three alternating rounds,
six ``evaluate`` calls, and an adaptor makes its runtime afresh for every call: ONNX
Runtime's session of MiniLM costs about 0.1 CPU s to make. Inside :func:`runtimes_kept`
an adaptor that asks :func:`kept_runtime` gets back the runtime it made for the same key
earlier in the scope. When the scope ends they are all dropped: nothing outlives it, so
no memory is held by runtimes nobody will run again. Outside a scope
:func:`kept_runtime` makes a new one each time, and adaptors that never ask work as
before.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Hashable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

_SCOPE: contextvars.ContextVar[dict[Hashable, tuple[Any, Any]] | None] = contextvars.ContextVar(
    "lpq_runtimes", default=None
)


@contextlib.contextmanager
def runtimes_kept() -> Iterator[None]:
    """Keep the runtimes :func:`kept_runtime` makes until the block ends (a nested block
    shares the outer one's)."""
    if _SCOPE.get() is not None:
        yield
        return
    token = _SCOPE.set({})
    try:
        yield
    finally:
        _SCOPE.reset(token)


def kept_runtime(key: Hashable, make: Callable[[], T], *, holds: Any = None) -> T:
    """The runtime ``make()`` returns for ``key``, made once per :func:`runtimes_kept`
    scope (and every time outside one).

    ``key`` must name everything the runtime depends on (the model, the options it runs
    with). A key made from ``id(model)`` passes the model as ``holds``: it is kept with
    the runtime, so no other object can take its id while the scope lasts, and a
    runtime is only returned for the very object it was made for."""
    scope = _SCOPE.get()
    if scope is None:
        return make()
    found = scope.get(key)
    if found is not None and found[0] is holds:
        runtime: T = found[1]
        return runtime
    runtime = make()
    scope[key] = (holds, runtime)
    return runtime
