"""New conformance checks warn for one minor version, then fail.

A plugin that passed the suite yesterday must not fail it today because core grew a
check. So each new check is marked with the core version that introduced it::

    @introduced("0.2")
    def test_something_new(self, ...): ...

While core's ``major.minor`` is at most the introducing version, a failing check emits a
:class:`ConformanceWarning` (shown in pytest's warnings summary; the test passes) that says
from which version it will fail. From the next minor version on it fails. Setting
``LPQ_CONFORMANCE_STRICT=1`` makes every such check fail now: lpq's own CI does, and
adaptor authors can too, to see what the next minor version will demand.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from packaging.version import Version

from .. import _version
from ..errors import LpqWarning

#: Set to ``1`` to make checks still in their warning period fail.
STRICT_ENV = "LPQ_CONFORMANCE_STRICT"

F = TypeVar("F", bound=Callable[..., Any])


class ConformanceWarning(LpqWarning):
    """A conformance check that failed during its warning period, or that could not run
    (for example, an optional hook the adaptor does not implement)."""


class ConformanceFailure(AssertionError):
    """A conformance check failed. An ``AssertionError``, so pytest reports it as a failed
    check with its message, and :func:`introduced` can turn it into a warning."""


def core_minor() -> tuple[int, int]:
    """Core's ``(major, minor)``, read at call time (tests monkeypatch the version)."""
    release = Version(_version.__version__).release
    return release[0], release[1] if len(release) > 1 else 0


def _minor(text: str) -> tuple[int, int]:
    release = Version(text).release
    return release[0], release[1] if len(release) > 1 else 0


def strict() -> bool:
    """Whether ``LPQ_CONFORMANCE_STRICT`` asks for every check to fail now."""
    return os.environ.get(STRICT_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def enforced(since: str) -> bool:
    """Whether a check introduced in core ``since`` fails (rather than warns) today."""
    return strict() or core_minor() > _minor(since)


def next_minor(since: str) -> str:
    major, minor = _minor(since)
    return f"{major}.{minor + 1}"


def not_run(message: str) -> None:
    """Say that a check could not run (never a failure: what it needs is optional)."""
    warnings.warn(ConformanceWarning(f"check not run: {message}"), stacklevel=2)


def introduced(since: str) -> Callable[[F], F]:
    """Mark a conformance test as new in core ``since`` (``"0.2"``): it warns while core
    is at most that minor version (unless ``LPQ_CONFORMANCE_STRICT=1``), then fails."""
    _minor(since)  # a malformed version fails at import, not in some adaptor's test run

    def mark(test: F) -> F:
        @functools.wraps(test)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return test(*args, **kwargs)
            except AssertionError as exc:
                if enforced(since):
                    raise
                warnings.warn(
                    ConformanceWarning(
                        f"{test.__name__} (new in lpq-core {since}; it fails from "
                        f"{next_minor(since)}, or now with {STRICT_ENV}=1): {exc}"
                    ),
                    stacklevel=2,
                )
                return None

        run.introduced = since  # type: ignore[attr-defined]
        return run  # type: ignore[return-value]

    return mark
