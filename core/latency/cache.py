"""Latency decisions kept on disk, so a model quantized again gets the same plan for free.

A decision depends on the model, the plan (which ops, quantized how), the input shapes it
was timed at, the machine (CPU model, int8 ISA from :func:`lpq.cpu_features`, cores), the
thread count, the framework's version and the margin: :func:`context` gathers them and
:func:`key` hashes them. Files live in ``options['latency_cache_dir']``, else
``$LPQ_CACHE_DIR/latency/<framework>``, else ``~/.cache/lpq/latency/<framework>``; one
JSON file per key, written atomically. A corrupt or foreign file is ignored (measured
again). Decisions are also kept in memory for the process, per folder (a tuning run asks for the
same plan more than once).
"""

from __future__ import annotations

import json
import logging
import os
import platform
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..cache import content_key
from ..fileio import atomic_write
from ..hardware import cpu_features
from .decision import Decision

log = logging.getLogger("lpq.latency")

#: Bumped when what a decision means changes: older files are then never read.
FORMAT = "lpq-latency/1"
_memory: dict[str, dict[str, Any]] = {}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_identity() -> dict[str, Any]:
    """The machine part of every latency key: CPU model, int8 ISA, core count (timings
    from another machine are never read as this one's)."""
    return {"cpu": cpu_name(), "isa": cpu_features().isa, "cores": os.cpu_count()}


def json_normal(value: Mapping[str, Any]) -> dict[str, Any]:
    """``value`` as it reads back from JSON, so a stored key compares equal to a fresh one."""
    normal: dict[str, Any] = json.loads(json.dumps(value, sort_keys=True, default=str))
    return normal


def cache_root() -> Path:
    """``$LPQ_CACHE_DIR``, else ``$XDG_CACHE_HOME/lpq``, else ``~/.cache/lpq``."""
    root = os.environ.get("LPQ_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "lpq"
    )
    return Path(root)


def context(
    *,
    framework: str,
    framework_version: str,
    model_digest: str,
    plan: Any,
    shapes: Any,
    threads: int | None,
    margin: float,
) -> dict[str, Any]:
    """Everything a decision depends on, JSON-normal (so a stored one compares equal)."""
    value = {
        "format": FORMAT,
        "framework": framework,
        "framework_version": framework_version,
        "model": model_digest,
        "plan": plan,
        "shapes": shapes,
        "threads": threads,
        "margin": margin,
        **machine_identity(),
    }
    return json_normal(value)


def key(ctx: Mapping[str, Any]) -> str:
    return content_key(json.dumps(ctx, sort_keys=True))


def folder(framework: str, options: Mapping[str, Any]) -> Path:
    chosen = options.get("latency_cache_dir")
    if chosen:
        return Path(str(chosen))
    return cache_root() / "latency" / framework


def load(where: Path | None, ctx: Mapping[str, Any]) -> Decision | None:
    """The stored decision for ``ctx``, or None."""
    name = key(ctx)
    data = _memory.get(f"{where}/{name}")
    if data is None and where is not None:
        path = where / f"{name}.json"
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
            if stored.get("context") == dict(ctx):
                data = stored["decision"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            data = None
    if data is None:
        return None
    try:
        return Decision.from_json(data, cached=True)
    except (TypeError, ValueError):
        return None


def store(where: Path | None, ctx: Mapping[str, Any], decision: Decision) -> None:
    name = key(ctx)
    data = decision.to_json()
    _memory[f"{where}/{name}"] = data
    if where is None:
        return
    try:
        with atomic_write(where / f"{name}.json", "w") as handle:
            json.dump({"context": dict(ctx), "decision": data}, handle, indent=1)
    except OSError as exc:  # a read-only cache folder costs a measurement next time only
        log.info("latency cache not written (%s)", exc)


def cached_decide(
    decide: Callable[[], Decision], where: Path | None, ctx: Mapping[str, Any]
) -> Decision:
    """The stored decision for ``ctx``, else ``decide()`` (then stored)."""
    found = load(where, ctx)
    if found is not None:
        return found
    decision = decide()
    store(where, ctx, decision)
    return decision
