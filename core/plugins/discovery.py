"""Phase one of plugin discovery: read entry-point metadata, import nothing.

Everything here works from installed distributions' metadata, so it is cheap and safe to
call from ``lpq plugins list``. Importing a plugin (phase two) is :mod:`lpq.manager`'s job.
"""

from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import metadata

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from .._version import __version__ as CORE_VERSION
from ..errors import LpqWarning

ENTRY_POINT_GROUP = "lpq"
CORE_DISTRIBUTION = "lpq-core"

#: Comma-separated plugin names: only these are loaded.
ENV_ALLOW = "LPQ_LOAD_PLUGINS"
#: Comma-separated plugin names: these are never loaded.
ENV_DENY = "LPQ_DISABLE_PLUGINS"
#: ``1``: a plugin that fails to load raises instead of being reported.
ENV_STRICT = "LPQ_PLUGINS_STRICT"


class PluginStatus(StrEnum):
    OK = "ok"
    DISABLED = "disabled"
    INCOMPATIBLE = "incompatible"
    ERROR = "error"
    PENDING = "not loaded"


@dataclass
class PluginRecord:
    """Everything ``lpq plugins list`` shows about one plugin."""

    name: str
    distribution: str
    version: str
    entry_point: str
    requires_core: str | None = None
    status: PluginStatus = PluginStatus.PENDING
    message: str = ""
    hint: str = ""
    frameworks: list[dict[str, str | None]] = field(default_factory=list)
    hooks: list[str] = field(default_factory=list)
    #: What the plugin registered, by kind ("strategy", "metric", "backend profile", ...).
    registered: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "entry_point": self.entry_point,
            "requires_core": self.requires_core,
            "status": self.status.value,
            "message": self.message,
            "hint": self.hint,
            "frameworks": self.frameworks,
            "hooks": self.hooks,
            "registered": self.registered,
        }


@dataclass(frozen=True)
class DiscoveredEntryPoint:
    record: PluginRecord
    entry_point: metadata.EntryPoint


def _names_from_env(variable: str) -> set[str] | None:
    raw = os.environ.get(variable)
    if raw is None or not raw.strip():
        return None
    return {name.strip() for name in raw.split(",") if name.strip()}


def strict_mode() -> bool:
    return os.environ.get(ENV_STRICT, "").strip().lower() in {"1", "true", "yes", "on"}


def _core_requirement(dist: metadata.Distribution) -> str | None:
    for line in dist.requires or ():
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name.lower().replace("_", "-") != CORE_DISTRIBUTION:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        return str(req.specifier) or None
    return None


def core_satisfies(specifier: str | None) -> bool:
    if not specifier:
        return True
    try:
        return Requirement(f"{CORE_DISTRIBUTION}{specifier}").specifier.contains(
            Version(CORE_VERSION), prereleases=True
        )
    except (InvalidRequirement, InvalidVersion):
        return False


@functools.cache
def _read_entry_points() -> tuple[metadata.EntryPoint, ...]:
    """Entry points of the ``lpq`` group, read from metadata once per process."""
    return tuple(metadata.entry_points(group=ENTRY_POINT_GROUP))


def clear_cache() -> None:
    """Forget the cached metadata (after installing a distribution at run time)."""
    _read_entry_points.cache_clear()


def discover() -> list[DiscoveredEntryPoint]:
    """Every plugin entry point with its pre-import status: disabled, incompatible, error
    (two distributions claim the name) or pending (to be imported)."""
    allow, deny = _names_from_env(ENV_ALLOW), _names_from_env(ENV_DENY)
    found: list[DiscoveredEntryPoint] = []
    seen: dict[tuple[str, str], bool] = {}
    for ep in _read_entry_points():
        dist = ep.dist
        dist_name = dist.metadata["Name"] if dist is not None else "<unknown>"
        key = (ep.name, dist_name)
        if key in seen:  # the same distribution visible twice on sys.path
            continue
        seen[key] = True
        record = PluginRecord(
            name=ep.name,
            distribution=dist_name,
            version=dist.version if dist is not None else "?",
            entry_point=ep.value,
            requires_core=_core_requirement(dist) if dist is not None else None,
        )
        if (allow is not None and ep.name not in allow) or (deny and ep.name in deny):
            record.status = PluginStatus.DISABLED
            record.message = f"disabled by {ENV_DENY if deny and ep.name in deny else ENV_ALLOW}"
        elif not core_satisfies(record.requires_core):
            record.status = PluginStatus.INCOMPATIBLE
            record.message = (
                f"requires lpq-core{record.requires_core}, but lpq-core {CORE_VERSION} is installed"
            )
            record.hint = (
                f"install a {record.distribution} release built for lpq-core {CORE_VERSION}, "
                f"or pip install 'lpq-core{record.requires_core}'"
            )
        found.append(DiscoveredEntryPoint(record, ep))

    _warn_unknown_names(allow, deny, {item.record.name for item in found})
    by_name: dict[str, list[DiscoveredEntryPoint]] = {}
    for item in found:
        by_name.setdefault(item.record.name, []).append(item)
    for name, items in by_name.items():
        if len(items) > 1:
            dists = " and ".join(sorted(i.record.distribution for i in items))
            for item in items:
                item.record.status = PluginStatus.ERROR
                item.record.message = f"plugin name {name!r} is claimed by {dists}"
                item.record.hint = "uninstall one of them, or disable one via " + ENV_DENY
    return found


def _warn_unknown_names(allow: set[str] | None, deny: set[str] | None, known: set[str]) -> None:
    """A typo in an allow/deny list would silently do nothing: say so."""
    for variable, names in ((ENV_ALLOW, allow), (ENV_DENY, deny)):
        for name in sorted((names or set()) - known):
            warnings.warn(
                f"{variable} names {name!r}, which is not an installed plugin "
                f"(installed: {', '.join(sorted(known)) or 'none'})",
                LpqWarning,
                stacklevel=3,
            )


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
