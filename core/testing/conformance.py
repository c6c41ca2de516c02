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
they prove: registration, detection, capability, quantization, proof that quantization
happened, labels, inspection, persistence, errors.

**Calibration and scoring share samples.** Every quantizing check calibrates on the first
16 samples of ``lpq_sample_data`` (``calib_sampling_size=16``, the batches
``lpq.take_samples`` yields) and then scores *every* batch of it, those 16 included. The
step bounds below are measured that way; a model calibrated on too few samples for its
data sees its later batches clip.

**New checks warn first.** A check marked ``@introduced("0.2")`` only emits a
:class:`ConformanceWarning` while core is at most 0.2, and fails from 0.3 on (or at once
with ``LPQ_CONFORMANCE_STRICT=1``); see :mod:`lpq.testing.introduced`.

**Optional:** override :meth:`AdaptorConformance.known_op_types` to have the op types of
your capability YAML checked against the framework's.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Collection, Iterator
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
from lpq.testing.arrays import CountingLoader, rms, stacked, step
from lpq.testing.arrays import first as _first
from lpq.testing.foreign_models import FOREIGN_MODELS, ForeignModel
from lpq.testing.introduced import introduced
from lpq.testing.isolation import broken, fresh_plugin_manager, survey_plugins
from lpq.testing.labels import check_evaluate_uses_labels
from lpq.testing.op_types import check_op_types_known
from lpq.testing.proof import (
    check_outputs_differ_from_fp32,
    check_reports_integer_ops,
    check_weights_are_quantized,
)
from lpq.testing.subject import CALIB_SAMPLES, Subject, default_tune_cfg

#: A quantized model's outputs may differ from fp32 by this many quantization steps (RMS
#: over every sample of ``lpq_sample_data``, after calibrating on its first 16), a step
#: being the output's range / 255. Adaptors in this repo: 0.3 to 1.8.
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

    @pytest.fixture
    def lpq_subject(
        self, pm: Any, capability: FrameworkCapability, lpq_sample_model: Any, lpq_sample_data: Any
    ) -> Subject:
        """The adaptor, sample model and data the new checks (plain functions) run on."""
        return Subject(pm, self.framework, capability, lpq_sample_model, lpq_sample_data)

    def known_op_types(self) -> Collection[str] | None:
        """Override to return every op type name the framework has (as your capability
        YAML spells them), so that ``test_capability_op_types_exist_in_the_framework``
        can report YAML op types the framework does not know. ``None``: not checked."""
        return None

    @staticmethod
    def default_tune_cfg(
        cap: FrameworkCapability, calib_samples: int = CALIB_SAMPLES
    ) -> TuneConfig:
        """Every op at its default config, calibrating on ``calib_samples`` samples."""
        return default_tune_cfg(cap, calib_samples)

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
        (or wrongly computed) show here long before top-1 accuracy moves.

        Calibrates on the first 16 samples of ``lpq_sample_data``, then scores all of it
        (the 16 included): data whose later batches range wider than the first 16 clip."""
        qmodel = self._quantize(pm, capability, lpq_sample_model, lpq_sample_data)
        fp32 = stacked(self._outputs(pm, lpq_sample_model, lpq_sample_data))
        quantized = stacked(self._outputs(pm, qmodel, lpq_sample_data))
        assert quantized.shape == fp32.shape
        steps = rms(quantized - fp32) / step(fp32)
        assert steps <= OUTPUT_STEPS, (
            f"quantized outputs differ from fp32 by {steps:.2f} quantization steps; expected "
            f"at most {OUTPUT_STEPS} (RMS over all {len(fp32)} samples of lpq_sample_data, "
            f"after calibrating on its first {CALIB_SAMPLES}; a step is the fp32 output's "
            "range / 255; correct int8 gives 0.3 to 1.8)"
        )

    def test_each_op_error_is_about_one_quantization_step(
        self, pm: Any, capability: FrameworkCapability, lpq_sample_model: Any, lpq_sample_data: Any
    ) -> None:
        """Each quantized op's first output against fp32's, on the first batch of
        ``lpq_sample_data`` (part of the 16 calibration samples when batches are small)."""
        cfg = self.default_tune_cfg(capability)
        names = [name for (name, _), op in cfg.ops.items() if op.quantized]
        qmodel = pm.quantize(self.framework, lpq_sample_model, cfg, lpq_sample_data)
        fp32 = pm.inspect_tensor(
            self.framework, lpq_sample_model, lpq_sample_data, names, "activation", 1
        )
        int8 = pm.inspect_tensor(self.framework, qmodel, lpq_sample_data, names, "activation", 1)
        steps = {
            name: rms(int8.activations[name][0] - fp32.activations[name][0])
            / step(fp32.activations[name][0])
            for name in names
        }
        typical = statistics.median(steps.values())
        assert typical <= OP_STEPS, (
            f"the typical quantized op's output differs from fp32 by {typical:.2f} steps of "
            f"its own range; expected at most {OP_STEPS} (median over quantized ops of the "
            f"RMS on the first batch of lpq_sample_data, after calibrating on its first "
            f"{CALIB_SAMPLES} samples; a step is the op's fp32 output range / 255; correct "
            "int8 gives 0.2 to 0.4): "
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
        counting = CountingLoader(lpq_sample_data)
        if counting.total_samples() < 2 * per_batch:
            pytest.fail("lpq_sample_data must hold at least two batches for this check")
        cfg = self.default_tune_cfg(capability, calib_samples=per_batch)
        pm.quantize(self.framework, lpq_sample_model, cfg, counting)
        assert counting.most_in_one_pass <= per_batch, (
            f"calibration read {counting.most_in_one_pass} samples in one pass with "
            f"calib_sampling_size={per_batch}"
        )

    # ------------------------------------------------------------------ proof of work
    # New in 0.2 (warnings until 0.3, failures from then on, or now in strict mode): an
    # adaptor whose quantize returned the fp32 model while claiming int8 passed them all.

    @introduced("0.2")
    def test_quantized_ops_report_an_integer_precision(self, lpq_subject: Subject) -> None:
        """``lpq_quantized_ops`` on a default-config model names at least one op in
        int8/uint8/int4 (when the capability offers any; not run without that hook)."""
        check_reports_integer_ops(lpq_subject, lpq_subject.quantize())

    @introduced("0.2")
    def test_int8_weights_lie_on_a_grid_and_differ_from_fp32(self, lpq_subject: Subject) -> None:
        """Weights of ops reported int8 (``lpq_inspect_tensor(kind="weight")``, dequantized,
        keyed by fp32 op names) are ``scale * integer`` per tensor or per channel, with at
        most 256 values a channel, and not all equal to fp32's."""
        check_weights_are_quantized(lpq_subject)

    @introduced("0.2")
    def test_quantized_outputs_differ_from_fp32(self, lpq_subject: Subject) -> None:
        """On the calibration batches (the first 16 samples), the quantized model's outputs
        are not bit-identical to fp32's, as an identity quantizer's would be."""
        check_outputs_differ_from_fp32(lpq_subject)

    # ------------------------------------------------------------------ labels

    @introduced("0.2")
    def test_evaluate_scores_against_the_labels(self, lpq_subject: Subject) -> None:
        """The fp32 sample model scores lower on ``lpq_sample_data`` with its labels
        deranged than with its true labels (needs a model scoring top-1 >= 0.5 on it)."""
        check_evaluate_uses_labels(lpq_subject)

    @introduced("0.2")
    def test_capability_op_types_exist_in_the_framework(self, pm: Any) -> None:
        """Every op type the capability YAML names is in ``known_op_types()`` (override
        it in your subclass; without it the check warns that it did not run)."""
        files = pm.adaptor(self.framework).capability_files
        check_op_types_known(files, self.known_op_types(), self.framework)

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


def _file_digest(model: Any) -> str | None:
    if not isinstance(model, str | Path) or not Path(model).is_file():
        return None
    return hashlib.sha256(Path(model).read_bytes()).hexdigest()
