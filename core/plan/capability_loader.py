"""Load, validate and version-match capability YAML files.

Files are parsed with a *safe* YAML loader that also rejects duplicate keys, validated
against ``schemas/capability.schema.json``, and checked for rules a schema cannot express
(one ``default`` block at most, capabilities only for declared precisions). Every error
names the file, the line where known, the JSON path and what was expected.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from packaging.version import InvalidVersion, Version

from ..errors import CapabilityError
from .capability import CapabilitySpec, QuantCapability, TensorOptions

JsonPath = tuple[str | int, ...]


def _find_duplicate_key(node: yaml.Node | None, path: JsonPath) -> tuple[JsonPath, int, int] | None:
    """The first mapping key defined twice, as (path, line, first line); PyYAML would
    silently keep the last one, hiding an edit that never takes effect."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key, line = key_node.value, key_node.start_mark.line + 1
            if key in seen:
                return (*path, key), line, seen[key]
            seen[key] = line
            found = _find_duplicate_key(value_node, (*path, key))
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            found = _find_duplicate_key(item, (*path, index))
            if found:
                return found
    return None


def _line_map(node: yaml.Node | None, path: JsonPath, out: dict[JsonPath, int]) -> None:
    if node is None:
        return
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            out[(*path, key)] = key_node.start_mark.line + 1
            _line_map(value_node, (*path, key), out)
            out[(*path, key)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _line_map(item, (*path, index), out)


def _format_path(path: Iterable[str | int]) -> str:
    text = "$"
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


def _line_of(lines: Mapping[JsonPath, int], path: JsonPath) -> int | None:
    while path not in lines and path:
        path = path[:-1]
    return lines.get(path)


@functools.cache
def _validator() -> Any:
    import jsonschema

    text = resources.files("lpq.schemas").joinpath("capability.schema.json").read_text()
    schema = json.loads(text)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _error(source: str, lines: Mapping[JsonPath, int], path: JsonPath, message: str) -> str:
    line = _line_of(lines, path)
    where = f"{source}:{line}" if line else source
    return f"{where}: at {_format_path(path)}: {message}"


def _read_blocks(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Parse and validate one capability file; return its version blocks."""
    file = Path(path)
    source = str(file)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CapabilityError(f"{source}: file not found", hint="check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CapabilityError(f"{source}: cannot read the file ({exc})") from exc
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        duplicate = _find_duplicate_key(node, ())
        data = None if duplicate else yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise CapabilityError(
            f"{where}: invalid YAML: {problem}", hint="fix the YAML syntax at that line"
        ) from None
    if duplicate:
        dup_path, line, first = duplicate
        raise CapabilityError(
            f"{source}:{line}: at {_format_path(dup_path)}: duplicate key {dup_path[-1]!r} "
            f"(first defined on line {first})",
            hint="remove or merge one of the two entries",
        )
    if data is None:
        raise CapabilityError(
            f"{source}: the file is empty",
            hint="a capability file is a list of version blocks; see docs/capability-yaml.md",
        )
    lines: dict[JsonPath, int] = {}
    _line_map(node, (), lines)
    if not isinstance(data, list):
        raise CapabilityError(
            _error(
                source, lines, (), f"expected a list of version blocks, got a {type(data).__name__}"
            ),
            hint="start each block with '- version:'; see docs/capability-yaml.md",
        )
    problems = _schema_problems(data, source, lines)
    if problems:
        others = "".join(f"\n  also: {problem}" for problem in problems[1:])
        raise CapabilityError(
            problems[0] + others,
            hint="see docs/capability-yaml.md for the allowed fields and values",
        )
    _check_semantics(data, source, lines)
    return data


def _schema_problems(data: Any, source: str, lines: Mapping[JsonPath, int]) -> list[str]:
    """Every schema violation as ``file:line: at $.path: what``, in file order."""
    found: dict[tuple[int, JsonPath], str] = {}
    for error in _validator().iter_errors(data):
        path: JsonPath = _refine_path(data, tuple(error.absolute_path), error)
        key = (_line_of(lines, path) or 0, path)
        found.setdefault(key, _error(source, lines, path, _describe(error)))
    return [found[key] for key in sorted(found, key=lambda k: (k[0], len(k[1])))]


def _refine_path(data: Any, path: JsonPath, error: Any) -> JsonPath:
    """Point at the offending key itself when a mapping has a bad or unknown key, so the
    reported line is the key's line rather than its parent's."""
    target = data
    for part in path:
        target = target[part]
    if not isinstance(target, dict):
        return path
    if error.validator == "additionalProperties":
        known = error.schema.get("properties", {})
        extra = [key for key in target if key not in known]
        return (*path, extra[0]) if extra else path
    if isinstance(error.instance, str) and error.instance in target:  # propertyNames
        return (*path, error.instance)
    return path


def _describe(error: Any) -> str:
    validator = error.validator
    where = [part for part in error.absolute_path if isinstance(part, str)]
    if validator == "enum":
        allowed = ", ".join(map(str, error.validator_value))
        return f"{error.instance!r} is not allowed; expected one of: {allowed}"
    if validator == "additionalProperties":
        known = list(error.schema.get("properties", {}))
        extra = [key for key in error.instance if key not in known]
        return f"unknown field {extra[0]!r}; expected one of: {', '.join(known)}"
    if validator == "required":
        return error.message
    if validator == "type":
        return (
            f"expected {error.validator_value}, got {type(error.instance).__name__} "
            f"{error.instance!r}"
        )
    if where[-2:] == ["version", "name"]:
        return (
            f"{error.instance!r} is not a framework version: write 'default', a quoted "
            "version such as '1.30', or a list of them (unquoted, YAML reads 1.30 as the "
            "number 1.3)"
        )
    if validator == "pattern" and "patterns" in where:
        return f"{error.instance!r} is not a fusion pattern: write op types joined by ' + '"
    if validator == "pattern" and "valid_mixed_precision" in where:
        return (
            f"{error.instance!r} is not a precision combination: write precisions joined "
            "by ' + ', e.g. 'int8 + fp32'"
        )
    return error.message


def _check_semantics(
    blocks: list[dict[str, Any]], source: str, lines: Mapping[JsonPath, int]
) -> None:
    default_at: int | None = None
    seen_versions: dict[str, int] = {}
    for index, block in enumerate(blocks):
        names = block["version"]["name"]
        for name in [names] if isinstance(names, str) else names:
            if name == "default":
                if default_at is not None:
                    raise CapabilityError(
                        _error(
                            source,
                            lines,
                            (index, "version", "name"),
                            f"a second 'default' block (the first is block {default_at})",
                        ),
                        hint="keep exactly one default block",
                    )
                default_at = index
            elif name in seen_versions:
                raise CapabilityError(
                    _error(
                        source,
                        lines,
                        (index, "version", "name"),
                        f"version {name} already has block {seen_versions[name]}",
                    ),
                    hint="give each framework version one block",
                )
            else:
                seen_versions[name] = index
        precisions = set(block["precisions"])
        for position, combination in enumerate(block.get("valid_mixed_precision", [])):
            unknown = [p for p in combination.split(" + ") if p not in precisions]
            if unknown:
                raise CapabilityError(
                    _error(
                        source,
                        lines,
                        (index, "valid_mixed_precision", position),
                        f"precision {unknown[0]!r} of combination {combination!r} is not "
                        "listed in 'precisions'",
                    ),
                    hint=f"add {unknown[0]} to the block's precisions or fix the combination",
                )
        for precision in block["ops"]:
            if precision not in precisions:
                raise CapabilityError(
                    _error(
                        source,
                        lines,
                        (index, "ops", precision),
                        f"precision {precision!r} is not listed in 'precisions'",
                    ),
                    hint=f"add {precision} to the block's precisions",
                )
        for position, recipe in enumerate(block.get("slow_recipes", [])):
            if recipe not in block.get("recipes", {}):
                raise CapabilityError(
                    _error(
                        source,
                        lines,
                        (index, "slow_recipes", position),
                        f"slow recipe {recipe!r} is not one of the block's 'recipes'",
                    ),
                    hint=f"declare {recipe} under 'recipes' or remove it from 'slow_recipes'",
                )
        for op_type, default in block.get("defaults", {}).items():
            if default in ("fp16", "bf16") and default not in precisions:
                raise CapabilityError(
                    _error(
                        source,
                        lines,
                        (index, "defaults", op_type),
                        f"default {default!r} for {op_type} is not listed in 'precisions'",
                    ),
                    hint=f"add {default} to the block's precisions or default to fp32",
                )
        for precision, modes in block.get("capabilities", {}).items():
            if precision not in precisions:
                raise CapabilityError(
                    _error(
                        source,
                        lines,
                        (index, "capabilities", precision),
                        f"precision {precision!r} is not listed in 'precisions'",
                    ),
                    hint=f"add {precision} to the block's precisions",
                )
            if precision in ("fp32", "fp16", "bf16"):
                raise CapabilityError(
                    _error(
                        source,
                        lines,
                        (index, "capabilities", precision),
                        "float precisions take no quantization capabilities",
                    ),
                    hint="list float fallbacks under 'ops' only",
                )
            declared_algorithms = block.get("algorithms")
            for mode, per_op in modes.items():
                for op_type, tensors in per_op.items():
                    for tensor, options in tensors.items():
                        for position, algorithm in enumerate(options.get("algorithm", [])):
                            if declared_algorithms is not None and (
                                algorithm not in declared_algorithms
                            ):
                                raise CapabilityError(
                                    _error(
                                        source,
                                        lines,
                                        (
                                            index,
                                            "capabilities",
                                            precision,
                                            mode,
                                            op_type,
                                            tensor,
                                            "algorithm",
                                            position,
                                        ),
                                        f"algorithm {algorithm!r} is not declared in this "
                                        f"block's 'algorithms' ({', '.join(declared_algorithms)})",
                                    ),
                                    hint="fix the name, or add it to 'algorithms' if the "
                                    "adaptor implements it",
                                )
                    declared = block["ops"].get(precision, [])
                    if op_type != "default" and op_type not in declared and "*" not in declared:
                        raise CapabilityError(
                            _error(
                                source,
                                lines,
                                (index, "capabilities", precision, mode, op_type),
                                f"op type {op_type!r} has {precision} {mode} capability but "
                                f"is not listed under ops.{precision}",
                            ),
                            hint=f"add {op_type} to ops.{precision}",
                        )


def validate_capability_file(path: str | os.PathLike[str]) -> int:
    """Validate one file; return its number of version blocks or raise CapabilityError."""
    return len(_read_blocks(path))


def _parse_version(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise CapabilityError(f"cannot parse framework version {text!r}") from None


def select_block(
    blocks: Sequence[Mapping[str, Any]], framework_version: str | None
) -> tuple[Mapping[str, Any], str]:
    """Pick the block for ``framework_version``: the highest block version not above it,
    else the ``default`` block. Returns the block and the name it was picked by."""
    default: Mapping[str, Any] | None = None
    candidates: list[tuple[Version, str, Mapping[str, Any]]] = []
    for block in blocks:
        names = block["version"]["name"]
        for name in [names] if isinstance(names, str) else names:
            if name == "default":
                default = block
            else:
                candidates.append((_parse_version(name), name, block))
    if framework_version is not None:
        installed = _parse_version(framework_version)
        # Compare on the release only, so 2.13.0+cpu matches a "2.13" block.
        installed_release = Version(".".join(map(str, installed.release)))
        eligible = [c for c in candidates if c[0] <= installed_release]
        if eligible:
            _version, name, block = max(eligible, key=lambda c: c[0])
            return block, name
    if default is not None:
        return default, "default"
    known = ", ".join(sorted(name for _, name, _ in candidates))
    raise CapabilityError(
        f"no capability block matches framework version {framework_version} "
        f"(blocks: {known}) and there is no default block",
        hint="add a 'default' block or a block for an older version",
    )


def _tensor_options(data: Mapping[str, Any] | None) -> TensorOptions | None:
    if data is None:
        return None
    extra = {key: tuple(data[key]) for key in ("block_size", "bits", "reduce_range") if key in data}
    return TensorOptions(
        dtype=tuple(data["dtype"]),
        scheme=tuple(data.get("scheme", ["sym"])),
        granularity=tuple(data.get("granularity", ["per_tensor"])),
        algorithm=tuple(data.get("algorithm", ["minmax"])),
        extra=extra,
    )


def _spec_from_block(
    block: Mapping[str, Any], framework: str, picked: str, source: str
) -> CapabilitySpec:
    capabilities: dict[str, list[QuantCapability]] = {}
    for precision, modes in block.get("capabilities", {}).items():
        for mode, per_op in modes.items():
            for op_type, tensors in per_op.items():
                capabilities.setdefault(op_type, []).append(
                    QuantCapability(
                        precision=precision,
                        mode=mode,
                        weight=_tensor_options(tensors.get("weight")),
                        activation=_tensor_options(tensors.get("activation")),
                    )
                )
    return CapabilitySpec(
        framework=framework,
        version_block=picked,
        source=source,
        precisions=tuple(block["precisions"]),
        ops={precision: tuple(op_types) for precision, op_types in block["ops"].items()},
        capabilities=capabilities,
        patterns=[tuple(p.split(" + ")) for p in block.get("patterns", [])],
        valid_mixed_precision=[
            tuple(c.split(" + ")) for c in block.get("valid_mixed_precision", [])
        ],
        recipes={name: tuple(values) for name, values in block.get("recipes", {}).items()},
        slow_recipes=tuple(block.get("slow_recipes", ())),
        defaults=dict(block.get("defaults", {})),
    )


def load_capability(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    framework: str,
    framework_version: str | None,
) -> CapabilitySpec:
    """Load one or more capability files for ``framework_version`` into one spec.

    Later files extend earlier ones: precisions and op lists are unioned, capabilities
    appended (so an extra file can add int4 for an op type), patterns appended.
    """
    files = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    if not files:
        raise CapabilityError(f"the {framework} adaptor names no capability file")
    merged: CapabilitySpec | None = None
    for file in files:
        block, picked = select_block(_read_blocks(file), framework_version)
        spec = _spec_from_block(block, framework, picked, str(file))
        if merged is None:
            merged = spec
            continue
        merged.precisions = tuple(dict.fromkeys((*merged.precisions, *spec.precisions)))
        for precision, op_types in spec.ops.items():
            merged.ops[precision] = tuple(
                dict.fromkeys((*merged.ops.get(precision, ()), *op_types))
            )
        for op_type, caps in spec.capabilities.items():
            merged.capabilities.setdefault(op_type, []).extend(caps)
        merged.patterns.extend(spec.patterns)
        merged.valid_mixed_precision.extend(
            c for c in spec.valid_mixed_precision if c not in merged.valid_mixed_precision
        )
        for name, values in spec.recipes.items():
            known = merged.recipes.get(name, ())
            merged.recipes[name] = (*known, *(v for v in values if v not in known))
        merged.slow_recipes = tuple(dict.fromkeys((*merged.slow_recipes, *spec.slow_recipes)))
        merged.defaults.update(spec.defaults)  # a later file may change a default
        merged.version_block += f", {picked} ({Path(file).name})"
        merged.source += f", {file}"
    assert merged is not None
    return merged
