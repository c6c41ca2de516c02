"""lpq's exception types.

Every error a user can cause derives from :class:`LpqError`. The CLI prints such errors
as one readable message (no traceback) and exits non-zero, so each message must say
what went wrong *and* what to do about it.
"""

from __future__ import annotations


class LpqError(Exception):
    """Base class of every error lpq raises on purpose.

    ``hint`` is an optional second sentence telling the user how to fix the problem.
    """

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message


class PluginError(LpqError):
    """A plugin could not be found, imported, validated or is incompatible."""


class NoAdaptorError(PluginError):
    """No installed plugin recognises the model or framework the user asked for."""


class CapabilityError(LpqError):
    """A capability YAML file is missing, unparsable or fails schema validation."""


class ConfigError(LpqError):
    """A quantization, accuracy or tuning configuration value is invalid."""


class ModelError(LpqError):
    """A model file or object cannot be read, loaded, exported or run."""


class DataError(LpqError):
    """Calibration or evaluation data is empty or does not fit the model."""


class TuningError(LpqError):
    """Tuning cannot continue (e.g. the fp32 baseline itself cannot be evaluated)."""


class LpqWarning(UserWarning):
    """Something lpq went on with but the user should know (e.g. an unknown plugin name in
    ``LPQ_DISABLE_PLUGINS``). The CLI prints it as ``warning: ...``."""


class LpqDeprecationWarning(LpqWarning, DeprecationWarning):
    """A public name or behaviour that a later minor release removes: it warns for at least
    one minor release first (CHANGELOG.md, "Deprecated"). Raise it with
    :func:`warn_deprecated`."""


def warn_deprecated(what: str, *, since: str, removal: str, instead: str) -> None:
    """Warn that ``what`` is deprecated since ``since`` and goes in ``removal``."""
    import warnings

    warnings.warn(
        f"{what} is deprecated since lpq-core {since} and will be removed in {removal}: "
        f"{instead}",
        LpqDeprecationWarning,
        stacklevel=3,
    )
