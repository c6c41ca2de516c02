"""`lpq deploy`'s framework-neutral steps against the scripted fake adaptor: quantize with
the backend's scheme, convert through the adaptor's ``lpq_convert``, write the model and
the profile's parameter files, list them; and the errors a user can meet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lpq
from lpq import deploy
from lpq.testing.fake_adaptor import FakeAdaptorPlugin, FakeModel, FakeQuantizedModel

CALIB = [np.zeros((4, 1), np.float32)]
OPS = [("conv1", "Conv"), ("fc", "MatMul")]
WRITTEN: list[tuple[Any, Path, str]] = []


class FakeOnnx:
    """Stands in for an ``onnx.ModelProto``: deploy only serializes it."""

    def __init__(self, tune_cfg: lpq.TuneConfig) -> None:
        self.tune_cfg = tune_cfg

    def SerializeToString(self) -> bytes:
        return json.dumps(self.tune_cfg.to_json(), sort_keys=True).encode()


def write_npu_file(model: FakeOnnx, out_dir: Path, profile: lpq.BackendProfile) -> dict[str, str]:
    WRITTEN.append((model, out_dir, profile.name))
    (out_dir / "npu.bin").write_bytes(b"\x00")
    return {"npu.bin": "the NPU's parameters"}


class ConvertingFake(FakeAdaptorPlugin):
    @lpq.hookimpl
    def lpq_convert(self, framework: str, model: Any, target: str, options: dict[str, Any]) -> Any:
        if framework != "fake":
            return None
        if not isinstance(model, FakeQuantizedModel):
            raise lpq.ModelError("the fake model is not quantized")
        assert target == "onnx" and options["backend"]
        return FakeOnnx(model.tune_cfg)

    @lpq.hookimpl
    def lpq_register_backend_profiles(self, register: Any) -> None:
        register(
            lpq.BackendProfile(
                "npu",
                "fake",
                "a test NPU",
                scheme={
                    "activation": {"dtype": "uint8", "symmetric": False},
                    "float_ops": ["MatMul"],
                },
                writer=f"{__name__}:write_npu_file",
            )
        )
        register(lpq.BackendProfile("bad-writer", "fake", writer="no_such_module:write"))


@pytest.fixture
def fake(lpq_plugin: Any, tmp_path: Path) -> ConvertingFake:
    plugin = ConvertingFake(tmp_path)
    lpq_plugin(plugin, name="fake")
    WRITTEN.clear()
    return plugin


def test_deploy_quantizes_converts_and_writes_the_profiles_files(
    fake: ConvertingFake, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = deploy(FakeModel(ops=OPS), "npu", out, CALIB)
    assert set(result.files) == {"model.onnx", "npu.bin", "deploy.json"}
    stored = json.loads((out / "model.onnx").read_bytes())
    assert stored["options"]["backend"] == "npu"  # quantized under the backend's scheme
    matmul = next(op for op in stored["ops"] if op["name"] == "fc")
    assert matmul["precision"] == "fp32"  # its float_ops
    assert WRITTEN and WRITTEN[0][1:] == (out, "npu")
    manifest = json.loads((out / "deploy.json").read_text())
    assert manifest["backend"] == "npu" and manifest["files"]["npu.bin"] == "the NPU's parameters"


def test_deploy_takes_an_already_quantized_model(fake: ConvertingFake, tmp_path: Path) -> None:
    quantized = lpq.quantize(FakeModel(ops=OPS), lpq.PostTrainingQuantConfig(backend="npu"), CALIB)
    result = deploy(quantized, "npu", tmp_path)
    assert result.model is quantized.model
    with pytest.raises(lpq.ModelError, match="not quantized"):
        deploy(FakeModel(ops=OPS), "npu", tmp_path)  # no calibration data: taken as is


def test_deploy_errors_say_what_to_do(fake: ConvertingFake, tmp_path: Path) -> None:
    with pytest.raises(lpq.ConfigError, match="unknown backend profile 'gpu'"):
        deploy(FakeModel(ops=OPS), "gpu", tmp_path, CALIB)
    with pytest.raises(lpq.ConfigError, match="writer 'no_such_module:write' cannot be imported"):
        deploy(FakeModel(ops=OPS), "bad-writer", tmp_path, CALIB)
