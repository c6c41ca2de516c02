"""Check that every op type a capability YAML names exists in the framework (issue 28: a
YAML declaring an op type the framework does not have passed the suite; such an entry is
silently never matched, so the ops it meant stay unquantized).

Which names a framework knows is framework knowledge core does not have, so the adaptor's
conformance subclass supplies it by overriding ``known_op_types()`` (ONNX: the
``onnx.defs`` schema names; torch: the module / aten names its YAML uses). Without it the
check does not run and says so with a :class:`ConformanceWarning`.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from typing import Any

import yaml

from .introduced import ConformanceFailure, not_run

#: Keys of a YAML ``capabilities`` block that are not op types.
NOT_OP_TYPES = frozenset({"*", "default"})


def _block_op_types(block: dict[str, Any]) -> set[str]:
    names: set[str] = set()
    for op_types in (block.get("ops") or {}).values():
        names.update(op_types or ())
    for modes in (block.get("capabilities") or {}).values():
        for per_type in (modes or {}).values():
            names.update(per_type or {})
    for pattern in block.get("patterns") or ():  # "Conv + Add + Relu"
        names.update(part.strip() for part in str(pattern).split("+"))
    return {str(name) for name in names} - NOT_OP_TYPES


def capability_op_types(files: Iterable[str | os.PathLike[str]]) -> dict[str, list[str]]:
    """Op type -> the capability files (every version block) that name it."""
    found: dict[str, list[str]] = {}
    for file in files:
        with open(file, encoding="utf-8") as handle:
            blocks = yaml.safe_load(handle) or []
        for block in blocks:
            for op_type in _block_op_types(block):
                where = found.setdefault(op_type, [])
                if str(file) not in where:
                    where.append(str(file))
    return found


def check_op_types_known(
    files: Iterable[str | os.PathLike[str]], known: Collection[str] | None, framework: str
) -> None:
    """Capability op types ∩ types the framework does not know = ∅."""
    if known is None:
        not_run(
            f"the {framework} conformance class does not implement known_op_types(), so "
            "the op types its capability YAML names were not checked against the framework"
        )
        return
    declared = capability_op_types(files)
    unknown = sorted(set(declared) - set(known))
    if unknown:
        raise ConformanceFailure(
            f"the capability YAML names op types the {framework} framework does not know: "
            + ", ".join(f"{op} ({', '.join(declared[op])})" for op in unknown)
            + " - a typo or a removed op never matches, so those ops stay unquantized"
        )
