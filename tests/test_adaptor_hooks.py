"""lpq.AdaptorHooks: one adaptor's jobs answer lpq's per-framework hooks for its framework
only, and a job it does not define stays unimplemented."""

from __future__ import annotations

from typing import Any

import pytest

import lpq
from lpq.plugins.adaptor_hooks import _DISPATCHERS, JOB_HOOKS
from lpq.plugins.manager import PluginManager


class _Hooks(lpq.AdaptorHooks):
    framework = "alpha"

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    @lpq.hookimpl
    def lpq_register_adaptors(self, register: Any) -> None:
        register(lpq.AdaptorInfo("alpha", "numpy", []))

    def detect(self, model: Any) -> bool:
        if model == "boom":
            raise RuntimeError("a detector that raises")
        return model == "alpha-model"

    def quantize(self, model: Any, tune_cfg: Any, calib_dataloader: Any, train_func: Any) -> Any:
        self.calls.append(("quantize", model))
        return f"q({model})"

    def quantized_ops(self, model: Any) -> dict[str, str]:
        return {"conv": "int8"}


@pytest.fixture
def manager() -> PluginManager:
    pm = PluginManager(use_entry_points=False)
    pm.register(_Hooks(), name="alpha-plugin")
    return pm


def test_every_job_maps_to_a_declared_hook_with_a_dispatcher():
    import lpq.hookspecs as specs

    for hook_name in JOB_HOOKS.values():
        assert hasattr(specs, hook_name)
        assert hook_name in _DISPATCHERS


def test_jobs_answer_their_own_framework(manager: PluginManager):
    assert manager.detect_framework("alpha-model") == "alpha"
    assert manager.quantize("alpha", "m", lpq.TuneConfig(ops={}), None) == "q(m)"
    assert manager.quantized_ops("alpha", "m") == {"conv": "int8"}


def test_a_foreign_framework_is_declined():
    hooks = _Hooks()
    assert hooks.lpq_quantize("beta", "m", lpq.TuneConfig(ops={}), None, None) is None
    assert hooks.calls == []
    assert hooks.lpq_quantized_ops("beta", "m") is None


def test_a_detector_that_raises_declines(manager: PluginManager):
    assert _Hooks().lpq_detect_framework("boom") is None
    with pytest.raises(lpq.LpqError):
        manager.detect_framework("boom")


def test_undefined_jobs_stay_unimplemented(manager: PluginManager):
    assert not hasattr(_Hooks, "lpq_evaluate")
    assert not manager.implements("lpq_set_tensor")
    assert manager.implements("lpq_quantized_ops")
    with pytest.raises(lpq.NoAdaptorError, match="does not implement lpq_evaluate"):
        manager.evaluate("alpha", "m", [], [])


def test_a_lazy_job_imports_its_function_on_first_call(manager: PluginManager, monkeypatch):
    import sys
    import types

    module = types.ModuleType("lpq_lazy_job_target")
    module.quantized_ops = lambda model: {"lazy": model}  # type: ignore[attr-defined]

    class Lazy(lpq.AdaptorHooks):
        framework = "lazyfw"
        quantized_ops = lpq.lazy_job("lpq_lazy_job_target:quantized_ops")

    hooks = Lazy()
    monkeypatch.setitem(sys.modules, "lpq_lazy_job_target", module)
    assert hooks.lpq_quantized_ops("lazyfw", "m") == {"lazy": "m"}
    assert hooks.lpq_quantized_ops("other", "m") is None
    with pytest.raises(ValueError, match=r"package\.module:function"):
        lpq.lazy_job("no_colon")
