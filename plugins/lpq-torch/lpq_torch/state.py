"""What lpq-torch remembers between hook calls of one run, in one small swappable object.

A tuning run calls the adaptor many times with the same fp32 model: capability query,
every trial's quantization, inspection, evaluation. Exporting that model (seconds for a
transformer) and compiling a model for timing are the expensive steps, so both are done
once and reused. Everything remembered lives in a :class:`RunState`, keyed by the model
*object* (weak references: nothing outlives the model; no ``id()`` keys that a new object
could reuse). Hooks reach it through :func:`current`: the object lives in lpq's run cache
(:func:`lpq.run_cache`), so one call of ``lpq.fit`` / ``lpq.quantize`` (capability query,
baseline, sensitivity, every trial) shares one state and lpq releases it when the call
returns; outside those calls it is the process's. :func:`use` pins a state explicitly (a
test that must start from nothing).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

import lpq

#: Positional and keyword arguments of one model call (see :mod:`lpq_torch.data`).
CallArgs = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass
class Exported:
    """One export of an fp32 model, valid while its weights are unchanged."""

    key: tuple[Any, ...]
    program: torch.export.ExportedProgram
    graph: torch.fx.GraphModule  # program.module(): what quantization starts from


@dataclass
class RunState:
    """Per-run memory: example inputs, exported graphs, compiled forwards, weights digests."""

    examples: weakref.WeakKeyDictionary[torch.nn.Module, CallArgs] = field(
        default_factory=weakref.WeakKeyDictionary
    )
    exports: weakref.WeakKeyDictionary[torch.nn.Module, Exported] = field(
        default_factory=weakref.WeakKeyDictionary
    )
    compiled: weakref.WeakKeyDictionary[torch.nn.Module, Callable[..., Any]] = field(
        default_factory=weakref.WeakKeyDictionary
    )
    #: Weights digests for latency-aware decisions (:mod:`lpq_torch.latency`, whose
    #: decisions core's :mod:`lpq.latency.cache` keeps): weights' identity -> digest.
    digests: weakref.WeakKeyDictionary[torch.nn.Module, tuple[Any, str]] = field(
        default_factory=weakref.WeakKeyDictionary
    )


_pinned: RunState | None = None


def current() -> RunState:
    """The state hooks read and write now: the pinned one, else the run cache's."""
    if _pinned is not None:
        return _pinned
    return lpq.run_cache().get_or_compute("lpq-torch-state", "run", RunState)


@contextlib.contextmanager
def use(state: RunState) -> Iterator[RunState]:
    """Make ``state`` current for the duration of the block (one run, or one test)."""
    global _pinned
    previous, _pinned = _pinned, state
    try:
        yield state
    finally:
        _pinned = previous
