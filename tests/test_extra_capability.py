"""Extra capability files are merged by core (issue 11, item 15).

A data type added "in YAML alone" used to work only with adaptors that read
``options["capability_files"]`` themselves. Core now merges the files the user passes
(config field ``capability_files``, CLI ``--capability``) into whatever the adaptor answers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lpq
from lpq.cli import main
from lpq.testing.fake_adaptor import FakeAdaptorPlugin, FakeModel

INT4_CONV = """\
- version:
    name: default
  precisions: [int4]
  ops:
    int4: [Conv]
  capabilities:
    int4:
      static:
        Conv:
          weight: {dtype: [int4], scheme: [sym], granularity: [per_channel]}
          activation: {dtype: [uint4], scheme: [asym]}
"""
CALIB = [np.zeros((4, 1), np.float32)]
MODEL = FakeModel(ops=[("c1", "Conv"), ("m1", "MatMul")])


class OptionsRecorder(FakeAdaptorPlugin):
    """The fake adaptor, which ignores ``options``, recording what it was given."""

    seen: list[dict[str, Any]]

    @lpq.hookimpl
    def lpq_query_fw_capability(self, framework, model, dataloader, options):  # type: ignore[override]
        if framework == "fake":
            self.seen.append(dict(options))
        return super().lpq_query_fw_capability(framework, model, dataloader, options)


@pytest.fixture
def fake(lpq_plugin, tmp_path: Path) -> OptionsRecorder:
    plugin = OptionsRecorder(tmp_path)
    plugin.seen = []
    lpq_plugin(plugin, name="fake")
    return plugin


@pytest.fixture
def int4_file(tmp_path: Path) -> Path:
    path = tmp_path / "int4-conv.yaml"
    path.write_text(INT4_CONV)
    return path


def test_an_adaptor_that_ignores_options_still_gets_the_extra_choices(fake, int4_file):
    conf = lpq.PostTrainingQuantConfig(capability_files=[int4_file])
    default = lpq.quantize(MODEL, conf, CALIB).tune_cfg
    assert default.ops[("c1", "Conv")].precision == "int8", "the adaptor's default stays first"
    assert fake.seen[-1]["capability_files"] == [str(int4_file)], "and it is told about them"

    narrowed = lpq.PostTrainingQuantConfig(
        capability_files=[int4_file], op_type_dict={"Conv": {"weight": {"dtype": ["int4"]}}}
    )
    cfg = lpq.quantize(MODEL, narrowed, CALIB).tune_cfg
    conv = cfg.ops[("c1", "Conv")]
    assert (conv.precision, conv.weight.dtype, conv.activation.dtype) == ("int4", "int4", "uint4")
    assert cfg.ops[("m1", "MatMul")].precision == "int8", "only Conv gets int4"


def test_without_the_file_int4_is_not_offered(fake):
    narrowed = lpq.PostTrainingQuantConfig(op_type_dict={"Conv": {"weight": {"dtype": ["int4"]}}})
    with pytest.raises(lpq.ConfigError, match="allows none of the options"):
        lpq.quantize(MODEL, narrowed, CALIB)


def test_the_cli_flag_sets_the_config_field(int4_file):
    from lpq.cli.tuning import _build_config

    kw = {
        "approach": "auto",
        "quant_format": "default",
        "calib_size": 10,
        "exclude_op_type": (),
        "exclude_op_name": (),
        "capability_files": (str(int4_file),),
    }
    assert _build_config(kw).capability_files == [str(int4_file)]


def test_an_invalid_extra_file_is_a_clear_cli_error(tmp_path, capsys):
    from lpq_onnxrt.examples import digits_example

    files = digits_example()
    broken = tmp_path / "broken.yaml"
    broken.write_text(INT4_CONV.replace("scheme: [sym]", "scheme: [symmetric]"))
    code = main(
        [
            "quantize",
            str(files["model"]),
            "--calib",
            str(files["calib"]),
            "--capability",
            str(broken),
            "--out",
            str(tmp_path / "q.onnx"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert f"{broken}:10: at $[0].capabilities.int4.static.Conv.weight.scheme[0]" in err
