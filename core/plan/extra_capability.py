"""Extra capability files the user passes: core merges them, so every adaptor gets them.

The design promises that a new data type for an op type is a few lines of YAML. An
adaptor may read ``options["capability_files"]`` itself, but one that ignores ``options``
must still honour the user's file: after asking the adaptor, core adds what the extra
files allow for the op types the adaptor reported. The adaptor's choices stay first (its
defaults stay the defaults); choices it already offered are not repeated.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from .capability import FrameworkCapability, QuantCapability
from .capability_loader import load_capability


def _added(
    existing: Sequence[QuantCapability], extra: Sequence[QuantCapability]
) -> list[QuantCapability]:
    return [*existing, *(cap for cap in extra if cap not in existing)]


def merge_capability_files(
    capability: FrameworkCapability, files: Sequence[str | os.PathLike[str]]
) -> FrameworkCapability:
    """``capability`` extended with what ``files`` allow (validated, version-matched)."""
    if not files:
        return capability
    spec = load_capability(list(files), capability.framework, capability.framework_version)
    opwise = {
        key: _added(caps, spec.for_op_type(key[1])) for key, caps in capability.opwise.items()
    }
    optypewise = {
        op_type: _added(caps, spec.for_op_type(op_type))
        for op_type, caps in capability.optypewise.items()
    }
    fallbacks = {
        op_type: tuple(dict.fromkeys((*precisions, *spec.float_fallbacks(op_type))))
        for op_type, precisions in capability.fallbacks.items()
    }
    patterns = [*capability.patterns, *(p for p in spec.patterns if p not in capability.patterns)]
    return dataclasses.replace(
        capability,
        opwise=opwise,
        optypewise=optypewise,
        fallbacks=fallbacks,
        patterns=patterns,
        version_block=f"{capability.version_block} + {spec.version_block} ({spec.source})",
    )
