"""The adaptor conformance suite: one contract, every adaptor.

An adaptor package proves it honours lpq's plugin contract with::

    from lpq.testing import AdaptorConformance

    class TestConformance(AdaptorConformance):
        framework = "myfw"

and three fixtures in its ``conftest.py``:

* ``lpq_sample_model`` - a small fp32 model of the framework (object or path),
* ``lpq_sample_data`` - a re-iterable dataloader of ``(inputs, labels)`` for it,
* ``lpq_misfit_data`` - a dataloader whose inputs do *not* fit the model.

The tests use only the public facade, exactly as the tuner does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lpq import (
    DataError,
    LpqError,
    NoAdaptorError,
    OpConfig,
    TuneConfig,
    get_plugin_manager,
    validate_capability_file,
)
from lpq.eval.data import OutputRecorder
from lpq.eval.metrics import TopK
from lpq.plan.capability import FrameworkCapability


class AdaptorConformance:
    """Base class of the conformance suite; set ``framework`` in the subclass."""

    framework: str = ""

    # ------------------------------------------------------------------ helpers

    @pytest.fixture
    def pm(self) -> Any:
        if not self.framework:
            pytest.fail("set `framework = '<name>'` on your AdaptorConformance subclass")
        return get_plugin_manager()

    @pytest.fixture
    def capability(
        self, pm: Any, lpq_sample_model: Any, lpq_sample_data: Any
    ) -> FrameworkCapability:
        cap: FrameworkCapability = pm.query_capability(
            self.framework, lpq_sample_model, lpq_sample_data, {}
        )
        return cap

    @staticmethod
    def default_tune_cfg(cap: FrameworkCapability) -> TuneConfig:
        return TuneConfig(
            ops={key: cap.default_op_config(key) for key in cap.opwise}, calib_sampling_size=16
        )

    def _outputs(self, pm: Any, model: Any, data: Any) -> list[Any]:
        recorder = OutputRecorder()
        pm.evaluate(self.framework, model, data, [recorder])
        return recorder.outputs

    # ------------------------------------------------------------------ the contract

    def test_adaptor_is_registered_with_valid_capability_files(self, pm: Any) -> None:
        info = pm.adaptor(self.framework)
        assert info.capability_files, "an adaptor ships at least one capability YAML"
        for file in info.capability_files:
            assert validate_capability_file(file) >= 1

    def test_detects_its_own_models(self, pm: Any, lpq_sample_model: Any) -> None:
        assert pm.detect_framework(lpq_sample_model) == self.framework

    @pytest.mark.parametrize("foreign", ["text-file", "object", "missing-path"])
    def test_declines_foreign_models(self, pm: Any, tmp_path: Path, foreign: str) -> None:
        model: Any = {
            "text-file": tmp_path / "notes.txt",
            "object": object(),
            "missing-path": tmp_path / "missing" / "model.bin",
        }[foreign]
        if foreign == "text-file":
            model.write_text("not a model")
        with pytest.raises(NoAdaptorError):
            pm.detect_framework(model)

    def test_capability_lists_quantizable_ops(self, capability: FrameworkCapability) -> None:
        assert capability.framework == self.framework
        assert capability.opwise, "the sample model should have quantizable ops"
        for key, caps in capability.opwise.items():
            assert caps, f"{key} has an empty capability list"
            for cfg in capability.op_configs(key):
                assert any(cap.allows(cfg) for cap in caps)
            assert "fp32" in capability.fallback_precisions(key)

    def test_quantized_model_runs_and_scores(
        self, pm: Any, capability: FrameworkCapability, lpq_sample_model: Any, lpq_sample_data: Any
    ) -> None:
        qmodel = pm.quantize(
            self.framework, lpq_sample_model, self.default_tune_cfg(capability), lpq_sample_data
        )
        fp32 = pm.evaluate(self.framework, lpq_sample_model, lpq_sample_data, [TopK(1)])
        int8 = pm.evaluate(self.framework, qmodel, lpq_sample_data, [TopK(1)])
        assert 0.0 <= int8.accuracy <= 1.0
        assert int8.samples == fp32.samples > 0
        assert int8.accuracy >= fp32.accuracy - 0.25, "quantization broke the sample model"

    def test_full_fallback_reproduces_fp32(
        self, pm: Any, capability: FrameworkCapability, lpq_sample_model: Any, lpq_sample_data: Any
    ) -> None:
        cfg = TuneConfig(ops={key: OpConfig.fallback() for key in capability.opwise})
        model = pm.quantize(self.framework, lpq_sample_model, cfg, lpq_sample_data)
        expected = self._outputs(pm, lpq_sample_model, lpq_sample_data)
        got = self._outputs(pm, model, lpq_sample_data)
        for a, b in zip(expected, got):
            np.testing.assert_allclose(
                np.asarray(_first(b)), np.asarray(_first(a)), rtol=1e-4, atol=1e-4
            )

    def test_inspect_tensor_gives_per_op_arrays(
        self, pm: Any, capability: FrameworkCapability, lpq_sample_model: Any, lpq_sample_data: Any
    ) -> None:
        names = [name for name, _ in capability.opwise]
        qmodel = pm.quantize(
            self.framework, lpq_sample_model, self.default_tune_cfg(capability), lpq_sample_data
        )
        fp32 = pm.inspect_tensor(
            self.framework, lpq_sample_model, lpq_sample_data, names, "both", 1
        )
        int8 = pm.inspect_tensor(self.framework, qmodel, lpq_sample_data, names, "activation", 1)
        assert set(fp32.activations) == set(names) == set(int8.activations)
        for name in names:
            a, b = fp32.activations[name][0], int8.activations[name][0]
            assert a.shape == b.shape and a.dtype == np.float32 and b.dtype == np.float32
        assert fp32.weights, "weights of quantizable ops should be captured"

    def test_save_load_round_trip(
        self,
        pm: Any,
        capability: FrameworkCapability,
        lpq_sample_model: Any,
        lpq_sample_data: Any,
        tmp_path: Path,
    ) -> None:
        qmodel = pm.quantize(
            self.framework, lpq_sample_model, self.default_tune_cfg(capability), lpq_sample_data
        )
        written = pm.save_model(self.framework, qmodel, tmp_path / "saved")
        assert Path(written).exists()
        loaded = pm.load_model(self.framework, written)
        for a, b in zip(
            self._outputs(pm, qmodel, lpq_sample_data), self._outputs(pm, loaded, lpq_sample_data)
        ):
            np.testing.assert_allclose(
                np.asarray(_first(b)), np.asarray(_first(a)), rtol=1e-5, atol=1e-5
            )

    def test_empty_data_is_a_clear_error(self, pm: Any, lpq_sample_model: Any) -> None:
        with pytest.raises(DataError):
            pm.evaluate(self.framework, lpq_sample_model, [], [TopK(1)])

    def test_misfit_data_is_a_clear_error(
        self, pm: Any, capability: FrameworkCapability, lpq_sample_model: Any, lpq_misfit_data: Any
    ) -> None:
        with pytest.raises(DataError):
            pm.evaluate(self.framework, lpq_sample_model, lpq_misfit_data, [TopK(1)])
        with pytest.raises(DataError):
            pm.quantize(
                self.framework, lpq_sample_model, self.default_tune_cfg(capability), lpq_misfit_data
            )

    def test_loading_a_missing_file_is_a_clear_error(self, pm: Any, tmp_path: Path) -> None:
        with pytest.raises(LpqError):
            pm.load_model(self.framework, tmp_path / "does-not-exist")


def _first(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return value[0]
    if isinstance(value, dict):
        return next(iter(value.values()))
    return value
