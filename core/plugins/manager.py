"""The typed facade over pluggy: the only place in lpq that calls hooks.

Phase two of discovery happens here: plugins found by :mod:`lpq.discovery` are imported
the first time anything needs them, registered with pluggy, validated against the hook
specs and asked to register their adaptors, strategies, metrics and backend profiles.
A plugin that fails any of that is recorded with status ``error`` and unregistered; the
others keep working. In strict mode (``LPQ_PLUGINS_STRICT=1``) the failure is raised.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import pluggy

from .. import hookspecs
from ..errors import ConfigError, NoAdaptorError, PluginError
from ..eval.evaluation import EvalResult, Inspection, LatencyMeasurer, Metric, Postprocess
from ..plan.capability import FrameworkCapability
from ..plan.tune_config import TuneConfig
from .discovery import (
    DiscoveredEntryPoint,
    PluginRecord,
    PluginStatus,
    discover,
    installed_version,
    strict_mode,
)
from .model_formats import missing_framework_error, unrecognised_model_error
from .registry import Registry
from .types import AdaptorInfo, BackendProfile, Example, QuantizeResult

#: Module of lpq's own plugin (built-in metrics, strategies, executors).
BUILTIN_PLUGIN = "lpq.plugins.builtin"


class PluginManager:
    """Loads plugins and calls their hooks with typed signatures.

    Use :func:`get_plugin_manager` for the process-wide instance.
    """

    def __init__(self, *, use_entry_points: bool = True) -> None:
        self._pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self._pm.add_hookspecs(hookspecs)
        self._use_entry_points = use_entry_points
        self._records: dict[str, PluginRecord] = {}
        self._loaded = False
        self._lock = threading.RLock()
        self.adaptors: Registry[AdaptorInfo] = Registry(
            "adaptor", none_installed_hint="none (pip install lpq-onnxrt or lpq-torch)"
        )
        self.strategies: Registry[Callable[..., Any]] = Registry("strategy")
        self.metrics: Registry[Callable[..., Any]] = Registry("metric")
        self.backend_profiles: Registry[BackendProfile] = Registry("backend profile")
        self.examples: Registry[Example] = Registry(
            "example", none_installed_hint="none (pip install lpq-onnxrt)"
        )
        self.executors: Registry[Callable[..., Any]] = Registry("executor")

    # ------------------------------------------------------------------ loading

    def load(self) -> None:
        """Import and register every enabled plugin (idempotent)."""
        with self._lock:
            if self._loaded:
                self._raise_strict_failure()
                return
            self._loaded = True
            # lpq's own plugin is loaded by name, like every entry-point plugin: the
            # manager depends on no strategy, metric or executor module.
            builtin = importlib.import_module(BUILTIN_PLUGIN)
            self.register(builtin, name="lpq-builtin", record=False)
            if self._use_entry_points:
                for item in discover():
                    self._load_entry_point(item)

    def _raise_strict_failure(self) -> None:
        """In strict mode, a plugin that failed raises on every use, not only the first."""
        if not strict_mode():
            return
        for record in self._records.values():
            if record.status in (PluginStatus.ERROR, PluginStatus.INCOMPATIBLE):
                raise PluginError(f"plugin {record.name!r}: {record.message}", hint=record.hint)

    def _load_entry_point(self, item: DiscoveredEntryPoint) -> None:
        record = item.record
        self._records[record.name] = record
        if record.status is not PluginStatus.PENDING:
            if record.status in (PluginStatus.ERROR, PluginStatus.INCOMPATIBLE) and strict_mode():
                raise PluginError(f"plugin {record.name!r}: {record.message}", hint=record.hint)
            return
        try:
            plugin = item.entry_point.load()
        except Exception as exc:
            self._fail(
                record,
                f"import failed: {type(exc).__name__}: {exc}",
                f"reinstall {record.distribution} or disable it with LPQ_DISABLE_PLUGINS="
                f"{record.name}",
                exc,
            )
            return
        self.register(plugin, name=record.name)

    def register(self, plugin: object, name: str, *, record: bool = True) -> None:
        """Register a plugin object (a module or an instance with hookimpls).

        Validates it against the hook specs and runs its registration hooks. Used for
        entry-point plugins and by :mod:`lpq.testing` to add a plugin for one test.
        """
        with self._lock:
            rec = self._records.get(name)
            if rec is None:
                rec = PluginRecord(
                    name=name, distribution="<registered>", version="", entry_point=""
                )
                if record:
                    self._records[name] = rec
            try:
                self._pm.register(plugin, name=name)
                self._pm.check_pending()
                self._check_framework_parameter(plugin)
            except Exception as exc:
                if self._pm.is_registered(plugin):
                    self._pm.unregister(plugin)
                self._fail(
                    rec,
                    f"hook validation failed: {type(exc).__name__}: {exc}",
                    "the plugin's hook implementations do not match lpq's hook specs; "
                    "upgrade the plugin or see docs/writing-a-plugin.md",
                    exc,
                )
                return
            try:
                self._run_registration_hooks(name)
            except Exception as exc:
                listed = self._records.get(name) is rec
                self.unregister(name)
                if listed:  # keep the failure visible in `lpq plugins list`
                    self._records[name] = rec
                self._fail(
                    rec,
                    f"registration failed: {type(exc).__name__}: {exc}",
                    f"the plugin's lpq_register_* hooks raised; upgrade {rec.distribution} "
                    f"or disable it with LPQ_DISABLE_PLUGINS={name}",
                    exc,
                )
                return
            rec.status = PluginStatus.OK
            rec.hooks = sorted(caller.name for caller in self._pm.get_hookcallers(plugin) or [])
            rec.registered = self._registered_by(name)
            rec.frameworks = [
                {
                    "framework": info.framework,
                    "distribution": info.framework_distribution,
                    "installed": installed_version(info.framework_distribution),
                }
                for info in self.adaptors.values()
                if self.adaptors.owner(info.framework) == name
            ]

    def _check_framework_parameter(self, plugin: object) -> None:
        """Per-framework hooks must take ``framework``: an implementation without it cannot
        decline other frameworks and, dispatched first-result, would answer for all."""
        for caller in self._pm.get_hookcallers(plugin) or []:
            if caller.spec is None or "framework" not in caller.spec.argnames:
                continue
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin and "framework" not in impl.argnames:
                    raise PluginError(
                        f"{caller.name} must take the 'framework' parameter and return None "
                        "for frameworks that are not its own"
                    )

    def unregister(self, name: str) -> None:
        with self._lock:
            plugin = self._pm.get_plugin(name)
            if plugin is not None:
                self._pm.unregister(plugin)
            for registry in self._registries():
                registry.drop_owner(name)
            self._records.pop(name, None)

    def _fail(self, record: PluginRecord, message: str, hint: str, exc: BaseException) -> None:
        record.status = PluginStatus.ERROR
        record.message = message
        record.hint = hint
        if strict_mode():
            raise PluginError(f"plugin {record.name!r}: {message}", hint=hint or None) from exc

    def builtin_registered(self) -> dict[str, list[str]]:
        """What lpq-core itself registers (its strategies, metrics and executors)."""
        self.load()
        return self._registered_by("lpq-builtin")

    def _registered_by(self, owner: str) -> dict[str, list[str]]:
        """The names ``owner`` registered, per kind, for ``lpq plugins list -v``."""
        found: dict[str, list[str]] = {}
        for registry in self._registries():
            names = sorted(name for name in registry if registry.owner(name) == owner)
            if names:
                found[registry.kind] = names
        return found

    def _registries(self) -> tuple[Registry[Any], ...]:
        return (
            self.adaptors,
            self.strategies,
            self.metrics,
            self.backend_profiles,
            self.examples,
            self.executors,
        )

    def _run_registration_hooks(self, plugin_name: str) -> None:
        """Call the plugin's ``lpq_register_*`` hooks with callbacks into the registries."""
        callbacks: dict[str, Callable[..., None]] = {
            "lpq_register_adaptors": lambda info: self.adaptors.add(
                info.framework, info, plugin_name
            ),
            "lpq_register_strategies": lambda name, factory: self.strategies.add(
                name, factory, plugin_name
            ),
            "lpq_register_metrics": lambda name, factory: self.metrics.add(
                name, factory, plugin_name
            ),
            "lpq_register_backend_profiles": lambda profile: self.backend_profiles.add(
                profile.name, profile, plugin_name
            ),
            "lpq_register_examples": lambda example: self.examples.add(
                example.name, example, plugin_name
            ),
            "lpq_register_executors": lambda name, factory: self.executors.add(
                name, factory, plugin_name
            ),
        }
        for hook_name, callback in callbacks.items():
            for impl in getattr(self._pm.hook, hook_name).get_hookimpls():
                if impl.plugin_name == plugin_name:
                    impl.function(register=callback)

    # ------------------------------------------------------------------ queries

    def records(self) -> list[PluginRecord]:
        """Every entry-point plugin (and test-registered one) with its status."""
        self.load()
        return sorted(self._records.values(), key=lambda r: r.name)

    def adaptor(self, framework: str) -> AdaptorInfo:
        self.load()
        try:
            return self.adaptors[framework]
        except KeyError:
            raise missing_framework_error(framework, self.adaptors, self.records()) from None

    def create_metric(self, name: str, **kwargs: Any) -> Metric:
        """The metric ``name`` made with ``kwargs`` (``--metric-option``); an option its
        factory does not take is a :class:`ConfigError` listing those it takes, with
        their defaults."""
        self.load()
        factory = self.metrics.get_or_raise(name)
        known = _keywords(factory)
        takes = ", ".join(f"{key}={value!r}" for key, value in (known or {}).items()) or "none"
        unknown = sorted(set(kwargs) - set(known)) if known is not None else []
        if unknown:
            raise ConfigError(
                f"metric {name} has no option {', '.join(unknown)}",
                hint=f"{name}'s options (with their defaults): {takes}",
            )
        try:
            metric: Metric = factory(**kwargs)
        except (TypeError, ValueError) as exc:
            if not kwargs:
                raise
            raise ConfigError(
                f"metric {name} does not take these options: {exc}",
                hint=f"{name}'s options (with their defaults): {takes}",
            ) from None
        return metric

    def create_strategy(self, name: str, **kwargs: Any) -> Any:
        """The strategy ``name`` made with the user's ``strategy_options``; a keyword its
        factory does not take is a :class:`ConfigError` naming it (not a bare TypeError)."""
        self.load()
        factory = self.strategies.get_or_raise(name)
        try:
            return factory(**kwargs)
        except TypeError as exc:
            if not kwargs:
                raise
            raise ConfigError(
                f"strategy {name!r} does not take the options {sorted(kwargs)}: {exc}",
                hint="check the --strategy-option / strategy_options keys against the "
                "strategy's documentation",
            ) from exc

    def create_executor(self, name: str, **kwargs: Any) -> Any:
        self.load()
        return self.executors.get_or_raise(name)(**kwargs)

    def backend_profile(self, name: str) -> BackendProfile:
        self.load()
        return self.backend_profiles.get_or_raise(name)

    def example(self, name: str) -> Example:
        self.load()
        return self.examples.get_or_raise(name)

    # ------------------------------------------------------------------ per-framework hooks

    def _dispatch(self, hook_name: str, framework: str, **kwargs: Any) -> Any:
        self.adaptor(framework)  # clear error when no plugin provides the framework
        result = getattr(self._pm.hook, hook_name)(framework=framework, **kwargs)
        if result is None:
            raise NoAdaptorError(
                f"the {framework!r} adaptor does not implement {hook_name}",
                hint="upgrade the adaptor plugin, or choose another framework",
            )
        return result

    def detect_framework(self, model: Any) -> str:
        self.load()
        framework = self._pm.hook.lpq_detect_framework(model=model)
        if framework is None:
            raise unrecognised_model_error(model, self.adaptors, self.records())
        return str(framework)

    def query_capability(
        self,
        framework: str,
        model: Any,
        dataloader: Iterable[Any] | None = None,
        options: dict[str, Any] | None = None,
    ) -> FrameworkCapability:
        result: FrameworkCapability = self._dispatch(
            "lpq_query_fw_capability",
            framework,
            model=model,
            dataloader=dataloader,
            options=dict(options or {}),
        )
        return result

    def query_fused_patterns(self, framework: str, model: Any) -> list[tuple[str, ...]]:
        result: list[tuple[str, ...]] = self._dispatch(
            "lpq_query_fused_patterns", framework, model=model
        )
        return result

    def quantize(
        self,
        framework: str,
        model: Any,
        tune_cfg: TuneConfig,
        calib_dataloader: Iterable[Any] | None,
        train_func: Callable[[Any], Any] | None = None,
    ) -> Any:
        """The quantized model (unwrapped, when the adaptor returned a QuantizeResult)."""
        return self.quantize_result(framework, model, tune_cfg, calib_dataloader, train_func).model

    def quantize_result(
        self,
        framework: str,
        model: Any,
        tune_cfg: TuneConfig,
        calib_dataloader: Iterable[Any] | None,
        train_func: Callable[[Any], Any] | None = None,
    ) -> QuantizeResult:
        """The quantized model with what the adaptor said about it (a bare model is
        wrapped with every field ``None``: the trial then asks the hooks)."""
        result = self._dispatch(
            "lpq_quantize",
            framework,
            model=model,
            tune_cfg=tune_cfg,
            calib_dataloader=calib_dataloader,
            train_func=train_func,
        )
        return result if isinstance(result, QuantizeResult) else QuantizeResult(result)

    def evaluate(
        self,
        framework: str,
        model: Any,
        dataloader: Iterable[Any],
        metrics: Sequence[Metric],
        *,
        postprocess: Postprocess | None = None,
        measurer: LatencyMeasurer | None = None,
        iteration: int | None = None,
    ) -> EvalResult:
        result: EvalResult = self._dispatch(
            "lpq_evaluate",
            framework,
            model=model,
            dataloader=dataloader,
            postprocess=postprocess,
            metrics=list(metrics),
            measurer=measurer,
            iteration=iteration,
        )
        return result

    def convert_bf16(
        self,
        framework: str,
        model: Any,
        op_names: Sequence[str],
        dtype: Literal["bf16", "fp16"] = "bf16",
    ) -> Any:
        return self._dispatch(
            "lpq_convert_bf16", framework, model=model, op_names=list(op_names), dtype=dtype
        )

    def inspect_tensor(
        self,
        framework: str,
        model: Any,
        dataloader: Iterable[Any],
        op_names: Sequence[str] | None = None,
        kind: Literal["activation", "weight", "both"] = "activation",
        iteration: int | None = 1,
    ) -> Inspection:
        result: Inspection = self._dispatch(
            "lpq_inspect_tensor",
            framework,
            model=model,
            dataloader=dataloader,
            op_names=list(op_names) if op_names is not None else None,
            kind=kind,
            iteration=iteration,
        )
        return result

    def quantized_ops(self, framework: str, model: Any) -> dict[str, str] | None:
        """Per-op precision read from a converted model, or None if the adaptor cannot say."""
        self.adaptor(framework)
        result = self._pm.hook.lpq_quantized_ops(framework=framework, model=model)
        return dict(result) if result is not None else None

    def resolved_config(self, framework: str, model: Any) -> TuneConfig | None:
        """The tune_cfg a quantized model really is, when the adaptor resolved choices the
        requested one left open; None when it did not say (an optional hook)."""
        self.adaptor(framework)
        result = self._pm.hook.lpq_resolved_config(framework=framework, model=model)
        return result if isinstance(result, TuneConfig) else None

    def output_names(self, framework: str, model: Any) -> list[str] | None:
        """The model's output names in the order evaluation passes them to metrics; None
        when the adaptor does not say (an optional hook)."""
        self.adaptor(framework)
        result = self._pm.hook.lpq_output_names(framework=framework, model=model)
        return [str(name) for name in result] if result is not None else None

    def implements(self, hook_name: str) -> bool:
        """Whether any loaded plugin implements ``hook_name`` (for optional hooks)."""
        self.load()
        return any(
            impl.plugin_name != "lpq-builtin"
            for impl in getattr(self._pm.hook, hook_name).get_hookimpls()
        )

    def set_tensor(self, framework: str, model: Any, tensor_name: str, value: Any) -> Any:
        return self._dispatch(
            "lpq_set_tensor", framework, model=model, tensor_name=tensor_name, value=value
        )

    def convert(
        self, framework: str, model: Any, target: str, options: dict[str, Any] | None = None
    ) -> Any:
        return self._dispatch(
            "lpq_convert", framework, model=model, target=target, options=dict(options or {})
        )

    def quantize_input(
        self, framework: str, model: Any, options: dict[str, Any] | None = None
    ) -> Any:
        return self._dispatch(
            "lpq_quantize_input", framework, model=model, options=dict(options or {})
        )

    def save_model(self, framework: str, model: Any, path: str | Path) -> Path:
        result: Path = self._dispatch("lpq_save_model", framework, model=model, path=Path(path))
        return result

    def load_model(self, framework: str, path: str | Path) -> Any:
        return self._dispatch("lpq_load_model", framework, path=Path(path))


_manager: PluginManager | None = None
_manager_lock = threading.Lock()


def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager, created on first use."""
    global _manager
    with _manager_lock:
        if _manager is None:
            _manager = PluginManager()
        manager = _manager
    if manager._loaded:
        manager.load()  # strict mode: a failed plugin raises on every call
    return manager


def reset_plugin_manager() -> None:
    """Drop the process-wide manager so the next call re-discovers plugins (tests)."""
    global _manager
    with _manager_lock:
        _manager = None


def _keywords(factory: Any) -> dict[str, Any] | None:
    """The keyword arguments a factory takes, with their defaults (None: no default);
    None where they cannot be listed (it takes ``**kwargs``, or has no signature)."""
    import inspect

    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return {
        p.name: None if p.default is inspect.Parameter.empty else p.default
        for p in parameters
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
