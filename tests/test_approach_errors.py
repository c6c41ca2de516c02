"""No silent no-ops (issue 11, item 3): an approach that cannot quantize anything is an error.

`lpq quantize model --approach static` without calibration data used to exit 0 having
quantized nothing, `lpq tune` without `--calib` silently tuned dynamic quantization only,
and `--approach dynamic` on an adaptor without dynamic capability wrote an fp32 model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import lpq
from lpq.cli import main
from lpq.testing.fake_adaptor import FakeAdaptorPlugin, FakeModel

EVAL = [(np.zeros((10, 1), np.float32), np.arange(10))]
CALIB = [np.zeros((10, 1), np.float32)]
CONV_ONLY = FakeModel(ops=[("c1", "Conv"), ("c2", "Conv")])  # no dynamic capability
MIXED = FakeModel(ops=[("c1", "Conv"), ("m1", "MatMul")])  # MatMul also has dynamic


@pytest.fixture
def fake(lpq_plugin, tmp_path: Path) -> FakeAdaptorPlugin:
    plugin = FakeAdaptorPlugin(tmp_path)
    lpq_plugin(plugin, name="fake")
    return plugin


def test_static_without_calibration_data_is_an_error(fake):
    conf = lpq.PostTrainingQuantConfig(approach="static")
    with pytest.raises(lpq.ConfigError, match="static quantization needs calibration data") as e:
        lpq.quantize(MIXED, conf)
    assert "--approach dynamic" in (e.value.hint or "")
    assert lpq.quantize(MIXED, conf, CALIB).tune_cfg.quantized_ops(), "with data it works"


def test_auto_without_calibration_data_is_an_error_not_dynamic_only(fake, tmp_path):
    with pytest.raises(lpq.ConfigError, match="'auto' approach tries static quantization") as e:
        lpq.fit(MIXED, eval_dataloader=EVAL, workspace=tmp_path)
    assert "dynamic (--approach dynamic)" in (e.value.hint or "")


def test_dynamic_without_calibration_data_still_works(fake):
    result = lpq.quantize(MIXED, lpq.PostTrainingQuantConfig(approach="dynamic"))
    assert [name for name, _ in result.tune_cfg.quantized_ops()] == ["m1"]


def test_an_approach_the_adaptor_does_not_offer_is_an_error(fake):
    with pytest.raises(lpq.ConfigError, match="offers no dynamic quantization") as e:
        lpq.quantize(CONV_ONLY, lpq.PostTrainingQuantConfig(approach="dynamic"))
    assert "approaches it offers here: static" in (e.value.hint or "")


def test_the_cli_exits_2_with_the_reason(tmp_path, capsys, monkeypatch):
    from lpq_onnxrt.examples import digits_example

    files = digits_example()
    monkeypatch.chdir(tmp_path)
    code = main(["quantize", str(files["model"]), "--approach", "static"])
    err = capsys.readouterr().err
    assert code == 2
    assert "the 'static' approach quantizes activations with ranges calibrated on data" in err
    assert not list(tmp_path.iterdir()), "nothing is written"
    code = main(
        [
            "tune",
            str(files["model"]),
            "--eval",
            str(files["eval"]),
            "--workspace",
            str(tmp_path / "ws"),
        ]
    )
    assert code == 2
    assert "calibrated on data, and no --calib was given" in capsys.readouterr().err
