"""The adaptor conformance suite: one contract, every adaptor.

An adaptor package proves it honours lpq's plugin contract with::

    from lpq.testing import AdaptorConformance

    class TestConformance(AdaptorConformance):
        framework = "myfw"

and three fixtures in its ``conftest.py``:

* ``lpq_sample_model`` - a small fp32 model of the framework (object or path),
* ``lpq_sample_data`` - a re-iterable dataloader of ``(inputs, labels)`` for it, with at
  least two batches,
* ``lpq_misfit_data`` - a dataloader whose inputs do *not* fit the model.

The adaptor must be *installed* (its ``lpq`` entry point visible, e.g. ``pip install -e
.``): the suite finds it exactly as lpq does. Each test then runs with only that plugin
loaded (as ``LPQ_LOAD_PLUGINS=<its name>`` would), so another installed plugin that is
broken fails its own check, ``test_other_installed_plugins_load``, and nothing else.

The tests use only the public facade, exactly as the tuner does. They are grouped by what
they prove: registration, detection, capability, quantization, inspection, persistence,
errors.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Iterator
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
    batch_size,
    split_batch,
    validate_capability_file,
)
from lpq.eval.data import OutputRecorder
from lpq.eval.metrics import TopK
from lpq.plan.capability import FrameworkCapability
from lpq.plugins.discovery import ENV_ALLOW, ENV_DENY
from lpq.testing.foreign_models import FOREIGN_MODELS, ForeignModel
from lpq.testing.isolation import broken, fresh_plugin_manager, survey_plugins

#: A quantized model's outputs may differ from fp32 by this many quantization steps (RMS),
#: a step being the output's range / 255. Adaptors in this repo: 0.3 to 1.8.
OUTPUT_STEPS = 4.0
#: The typical op (median over quantized ops) may differ by this many steps of its own
#: activation range (RMS). Correct int8 gives 0.2 to 0.4; scales 10x too coarse give ~3.
OP_STEPS = 1.0


class AdaptorConformance:
    """Base class of the conformance suite; set ``framework`` in the subclass."""

    framework: str = ""

    # ------------------------------------------------------------------ helpers

    @pytest.fixture
    def pm(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
        """A plugin manager that loads only the plugin providing ``framework``."""
        if not self.framework:
            pytest.fail("set `framework = '<name>'` on your AdaptorConformance subclass")
        records, owners = survey_plugins()
        owner = owners.get(self.framework)
        if owner is None:
            found = ", ".join(f"{r.name} ({r.status.value})" for r in records) or "none"
            pytest.fail(
                f"no installed plugin provides the {self.framework!r} framework (plugins "
                f"found: {found}). Install your package (pip install -e .) so that its "
                "'lpq' entry point is visible, and check `lpq plugins list`."
            )
        monkeypatch.setenv(ENV_ALLOW, owner)
        monkeypatch.delenv(ENV_DENY, raising=False)
        with fresh_plugin_manager() as manager:
            yield manager

    @pytest.fixture
    def capability(
        self, pm: Any, lpq_sample_model: Any, lpq_sample_data: Any
    ) -> FrameworkCapability:
        cap: FrameworkCapability = pm.query_capability(
            self.framework, lpq_sample_model, lpq_sample_data, {}
        )
        return cap

    @staticmethod
    def default_tune_cfg(cap: FrameworkCapability, calib_samples: int = 16) -> TuneConfig:
        return TuneConfig(
            ops={key: cap.default_op_config(key) for key in cap.opwise},
            calib_sampling_size=calib_samples,
        )

    def _quantize(self, pm: Any, cap: FrameworkCapability, model: Any, data: Any) -> Any:
        return pm.quantize(self.framework, model, self.default_tune_cfg(cap), data)

    def _outputs(self, pm: Any, model: Any, data: Any) -> list[Any]:
        recorder = OutputRecorder()
        pm.evaluate(self.framework, model, data, [recorder])
        return recorder.outputs

    # ------------------------------------------------------------------ registration

    def test_adaptor_is_registered_with_valid_capability_files(self, pm: Any) -> None:
        info = pm.adaptor(self.framework)
        assert info.capability_files, "an adaptor ships at least one capability YAML"
        for file in info.capability_files:
            assert validate_capability_file(file) >= 1

    def test_other_installed_plugins_load(self) -> None:
        """Not the adaptor's fault: a plugin installed beside it that fails to load."""
        records, owners = survey_plugins()
        mine = owners.get(self.framework)
        failed = [r for r in broken(records) if r.name != mine]
        assert not failed, "; ".join(
            f"plugin {r.name!r} ({r.distribution} {r.version}) did not load: "
            f"{r.message.splitlines()[0]} - it is not part of the {self.framework} adaptor: "
            f"fix or uninstall it (or set LPQ_DISABLE_PLUGINS={r.name})"
            for r in failed
        )

    # ------------------------------------------------------------------ detection

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

    @pytest.mark.parametrize("foreign", FOREIGN_MODELS, ids=lambda f: f.kind)
    def test_declines_lpq_data_and_other_frameworks_models(
        self, pm: Any, tmp_path: Path, foreign: ForeignModel
    ) -> None:
        """lpq's own ``.npz`` data files, and other adaptors' model files, are not yours."""
        suffixes = tuple(s.lower() for s in pm.adaptor(self.framework).model_suffixes)
        if foreign.framework == self.framework or foreign.filename.lower().endswith(suffixes):
            return  # a file of this adaptor's own format: nothing to decline
        path = foreign.write(tmp_path)
        with pytest.raises(NoAdaptorError):
            claimed = pm.detect_framework(path)
            pytest.fail(f"{self.framework} claimed a {foreign.kind} file ({claimed!r})")

    # ------------------------------------------------------------------ capability

    def test_capability_lists_quantizable_ops(self, capability: FrameworkCapability) -> None:
        assert capability.framework == self.framework
        assert capability.opwise, "the sample model should have quantizable ops"
        for key, caps in capability.opwise.items():
            assert caps, f"{key} has an empty capability list"
            for cfg in capability.op_configs(key):
                assert any(cap.allows(cfg) for cap in caps)
            assert "fp32" in capability.fallback_precisions(key)

    # ------------------------------------------------------------------ quantization

    def test_quantized_model_runs_and_scores(
        self, pm: Any, capability: FrameworkCapability, lpq_sample_model: Any, lpq_sample_data: Any
    ) -> None:
        qmodel = self._quantize(pm, capability, lpq_sample_model, lpq_sample_data)
        fp32 = pm.evaluate(self.framework, lpq_sample_model, lpq_sample_data, [TopK(1)])
        int8 = pm.evaluate(self.framework, qmodel, lpq_sample_data, [TopK(1)])
        assert 0.0 <= int8.accuracy <= 1.0
        assert int8.samples == fp32.samples > 0

    def test_quantized_outputs_stay_within_a_few_quantization_steps(
        self, pm: Any, capability: FrameworkCapability, lpq_sample_model: Any, lpq_sample_data: Any
    ) -> None:
        """Output error against the output's quantization step: scales that are too coarse
        (or wrongly computed) show here long before top-1 accuracy moves."""
        qmodel = self._quantize(pm, capability, lpq_sample_model, lpq_sample_data)
        fp32 = _stacked(self._outputs(pm, lpq_sample_model, lpq_sample_data))
        quantized = _stacked(self._outputs(pm, qmodel, lpq_sample_data))
        assert quantized.shape == fp32.shape
        steps = _rms(quantized - fp32) / _step(fp32)
        assert steps <= OUTPUT_STEPS, (
            f"quantized outputs differ from fp32 by {steps:.2f} quantization steps (RMS; a "
            f"step is the output range / 255); expected at most {OUTPUT_STEPS}"
        )

    def test_each_op_error_is_about_one_quantization_step(
        self, pm: Any, capability: FrameworkCapability, lpq_sample_model: Any, lpq_sample_data: Any
    ) -> None:
        cfg = self.default_tune_cfg(capability)
        names = [name for (name, _), op in cfg.ops.items() if op.quantized]
        qmodel = pm.quantize(self.framework, lpq_sample_model, cfg, lpq_sample_data)
        fp32 = pm.inspect_tensor(
            self.framework, lpq_sample_model, lpq_sample_data, names, "activation", 1
        )
        int8 = pm.inspect_tensor(self.framework, qmodel, lpq_sample_data, names, "activation", 1)
        steps = {
            name: _rms(int8.activations[name][0] - fp32.activations[name][0])
            / _step(fp32.activations[name][0])
            for name in names
        }
        typical = statistics.median(steps.values())
        assert typical <= OP_STEPS, (
            f"the typical quantized op's output differs from fp32 by {typical:.2f} steps of "
            f"its own range (RMS; expected at most {OP_STEPS}): "
            + ", ".join(f"{name} {value:.2f}" for name, value in steps.items())
        )

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

    def test_quantize_leaves_the_callers_model_unchanged(
        self, pm: Any, capability: FrameworkCapability, lpq_sample_model: Any, lpq_sample_data: Any
    ) -> None:
        """Every trial quantizes the same fp32 model: changing it in place corrupts them all."""
        digest = _file_digest(lpq_sample_model)
        before = self._outputs(pm, lpq_sample_model, lpq_sample_data)
        self._quantize(pm, capability, lpq_sample_model, lpq_sample_data)
        assert _file_digest(lpq_sample_model) == digest, "quantize rewrote the model file"
        after = self._outputs(pm, lpq_sample_model, lpq_sample_data)
        for a, b in zip(before, after):
            np.testing.assert_allclose(
                np.asarray(_first(b)),
                np.asarray(_first(a)),
                rtol=1e-5,
                atol=1e-5,
                err_msg="the fp32 model computes something else after quantize: it was "
                "modified in place",
            )

    def test_calibration_reads_at_most_the_sampling_size(
        self, pm: Any, capability: FrameworkCapability, lpq_sample_model: Any, lpq_sample_data: Any
    ) -> None:
        """``tune_cfg.calib_sampling_size`` bounds the samples read in one pass over the
        calibration data (``lpq.take_samples`` does this)."""
        first = next(iter(lpq_sample_data))
        per_batch = batch_size(split_batch(first)[0])
        counting = _CountingLoader(lpq_sample_data)
        if counting.total_samples() < 2 * per_batch:
            pytest.fail("lpq_sample_data must hold at least two batches for this check")
        cfg = self.default_tune_cfg(capability, calib_samples=per_batch)
        pm.quantize(self.framework, lpq_sample_model, cfg, counting)
        assert counting.most_in_one_pass <= per_batch, (
            f"calibration read {counting.most_in_one_pass} samples in one pass with "
            f"calib_sampling_size={per_batch}"
        )

    # ------------------------------------------------------------------ inspection

    def test_inspect_tensor_gives_per_op_arrays(
        self, pm: Any, capability: FrameworkCapability, lpq_sample_model: Any, lpq_sample_data: Any
    ) -> None:
        names = [name for name, _ in capability.opwise]
        qmodel = self._quantize(pm, capability, lpq_sample_model, lpq_sample_data)
        fp32 = pm.inspect_tensor(
            self.framework, lpq_sample_model, lpq_sample_data, names, "both", 1
        )
        int8 = pm.inspect_tensor(self.framework, qmodel, lpq_sample_data, names, "activation", 1)
        assert set(fp32.activations) == set(names) == set(int8.activations)
        for name in names:
            a, b = fp32.activations[name][0], int8.activations[name][0]
            assert a.shape == b.shape and a.dtype == np.float32 and b.dtype == np.float32
        assert fp32.weights, "weights of quantizable ops should be captured"

    # ------------------------------------------------------------------ persistence

    def test_save_load_round_trip(
        self,
        pm: Any,
        capability: FrameworkCapability,
        lpq_sample_model: Any,
        lpq_sample_data: Any,
        tmp_path: Path,
    ) -> None:
        qmodel = self._quantize(pm, capability, lpq_sample_model, lpq_sample_data)
        written = pm.save_model(self.framework, qmodel, tmp_path / "saved")
        assert Path(written).exists()
        loaded = pm.load_model(self.framework, written)
        for a, b in zip(
            self._outputs(pm, qmodel, lpq_sample_data), self._outputs(pm, loaded, lpq_sample_data)
        ):
            np.testing.assert_allclose(
                np.asarray(_first(b)), np.asarray(_first(a)), rtol=1e-5, atol=1e-5
            )

    # ------------------------------------------------------------------ optional hooks
    # An adaptor may leave these out; then the facade must say so (NoAdaptorError), which
    # is what these tests check instead of skipping.

    def test_set_tensor_writes_a_weight_and_leaves_the_callers_model(
        self, pm: Any, capability: FrameworkCapability, lpq_sample_model: Any, lpq_sample_data: Any
    ) -> None:
        names = [name for name, _ in capability.opwise]
        weights = pm.inspect_tensor(
            self.framework, lpq_sample_model, lpq_sample_data, names, "weight", 1
        ).weights
        op, tensors = next((op, t) for op, t in weights.items() if t)
        tensor, value = next(iter(tensors.items()))
        if not pm.implements("lpq_set_tensor"):
            with pytest.raises(NoAdaptorError):
                pm.set_tensor(self.framework, lpq_sample_model, tensor, value)
            return
        halved = (np.asarray(value) * 0.5).astype(np.asarray(value).dtype)
        edited = pm.set_tensor(self.framework, lpq_sample_model, tensor, halved)
        after = pm.inspect_tensor(self.framework, edited, lpq_sample_data, [op], "weight", 1)
        np.testing.assert_allclose(after.weights[op][tensor], halved, rtol=1e-6, atol=1e-7)
        before = pm.inspect_tensor(
            self.framework, lpq_sample_model, lpq_sample_data, [op], "weight", 1
        )
        np.testing.assert_array_equal(before.weights[op][tensor], value)
        with pytest.raises(LpqError):
            pm.set_tensor(self.framework, lpq_sample_model, tensor, np.zeros((1, 2, 3, 4, 5)))

    def test_convert_names_the_targets_it_offers(self, pm: Any, lpq_sample_model: Any) -> None:
        if not pm.implements("lpq_convert"):
            with pytest.raises(NoAdaptorError):
                pm.convert(self.framework, lpq_sample_model, "onnx")
            return
        with pytest.raises(LpqError):
            pm.convert(self.framework, lpq_sample_model, "no-such-target")

    def test_quantize_input_gives_a_model_or_says_why_not(
        self, pm: Any, capability: FrameworkCapability, lpq_sample_model: Any, lpq_sample_data: Any
    ) -> None:
        qmodel = self._quantize(pm, capability, lpq_sample_model, lpq_sample_data)
        if not pm.implements("lpq_quantize_input"):
            with pytest.raises(NoAdaptorError):
                pm.quantize_input(self.framework, qmodel, {})
            return
        try:
            integer = pm.quantize_input(self.framework, qmodel, {"outputs": False})
        except LpqError as exc:  # e.g. the model's first op stays in float
            assert exc.hint, "say what to do instead"
            return
        assert integer is not None and integer is not qmodel

    # ------------------------------------------------------------------ errors

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


class _CountingLoader:
    """Passes a dataloader through, counting the samples read in each pass."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.most_in_one_pass = 0

    def total_samples(self) -> int:
        return sum(batch_size(split_batch(item)[0]) for item in self.loader)

    def __iter__(self) -> Iterator[Any]:
        seen = 0
        for item in self.loader:
            seen += batch_size(split_batch(item)[0])
            self.most_in_one_pass = max(self.most_in_one_pass, seen)
            yield item


def _first(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return value[0]
    if isinstance(value, dict):
        return next(iter(value.values()))
    return value


def _stacked(outputs: list[Any]) -> np.ndarray:
    return np.concatenate([np.asarray(_first(o), np.float64) for o in outputs])


def _rms(values: Any) -> float:
    return float(np.sqrt(np.mean(np.square(np.asarray(values, np.float64)))))


def _step(values: Any) -> float:
    """The int8 quantization step of a tensor's range (zero always representable)."""
    array = np.asarray(values, np.float64)
    return max(float(max(array.max(), 0.0) - min(array.min(), 0.0)) / 255, 1e-12)


def _file_digest(model: Any) -> str | None:
    if not isinstance(model, str | Path) or not Path(model).is_file():
        return None
    return hashlib.sha256(Path(model).read_bytes()).hexdigest()
