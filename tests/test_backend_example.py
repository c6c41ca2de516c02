"""The worked example of docs/adding-a-backend.md: a backend profile in its own package.

``examples/lpq-acme-npu`` is made visible as an installed distribution (its real
``pyproject.toml`` metadata as a ``dist-info``, its folder on ``sys.path``), so lpq finds
it through the entry point exactly as after ``pip install``. Then the profile is used
end to end with lpq-torch: narrowing, simulation, deploy, and the example's own writer.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from core_testutil import REPO, FakeSite

import lpq
from lpq.plan.backend import QuantScheme

EXAMPLE = REPO / "examples" / "lpq-acme-npu"


@pytest.fixture
def acme_site(fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch) -> FakeSite:
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    info = fake_site.path / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    requires = "".join(f"Requires-Dist: {r}\n" for r in project["dependencies"])
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n{requires}"
    )
    entry_points = "".join(f"{k} = {v}\n" for k, v in project["entry-points"]["lpq"].items())
    (info / "entry_points.txt").write_text(f"[lpq]\n{entry_points}")
    monkeypatch.syspath_prepend(str(EXAMPLE))
    fake_site.modules += ["lpq_acme_npu", "lpq_acme_npu.plugin", "lpq_acme_npu.writer"]
    return fake_site


def test_the_example_installs_as_a_plugin_with_its_profile(acme_site: FakeSite) -> None:
    pm = lpq.get_plugin_manager()
    record = next(r for r in pm.records() if r.name == "acme-npu")
    assert record.status.value == "ok", record.message
    assert record.distribution == "lpq-acme-npu"
    assert "lpq_register_backend_profiles" in record.hooks
    profile = pm.backend_profile("acme-npu")
    assert profile.framework == "torch" and profile.writer == "lpq_acme_npu.writer:write"
    assert isinstance(profile.quant_scheme, QuantScheme)
    assert profile.quant_scheme.weight.scale == "pow2"
    assert lpq.validate_capability_file(profile.capability_file) == 1


def test_the_example_registers_without_importing_torch(acme_site: FakeSite) -> None:
    code = (
        "import sys, lpq; pm = lpq.get_plugin_manager(); pm.backend_profile('acme-npu'); "
        "print(sorted(m for m in ('torch', 'onnx') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=acme_site.env(PYTHONPATH=f"{acme_site.path}:{EXAMPLE}"),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_quantize_and_deploy_for_the_example_backend(acme_site: FakeSite, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="the end-to-end part needs lpq-torch")
    from torch import nn

    from lpq import deploy

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 10),
    ).eval()
    calib = [np.random.default_rng(i).random((16, 1, 8, 8), dtype=np.float32) for i in range(4)]
    quantized = lpq.quantize(model, lpq.PostTrainingQuantConfig(backend="acme-npu"), calib)
    for cfg in quantized.tune_cfg.ops.values():
        assert cfg.weight is not None and cfg.activation is not None
        assert (cfg.activation.dtype, cfg.activation.scheme) == ("int8", "sym")
        assert cfg.weight.granularity == "per_channel"
    result = deploy(quantized, "acme-npu", tmp_path)
    assert {"model.onnx", "acme_npu.json", "deploy.json"} <= set(result.files)
    written = json.loads((tmp_path / "acme_npu.json").read_text())["tensors"]
    metadata = {p.key: p.value for p in result.onnx_model.metadata_props}
    simulated = json.loads(metadata["lpq.quantization"])
    weights = [name for name, entry in simulated.items() if entry["kind"] == "weight"]
    assert len(weights) == 3
    for name, entry in simulated.items():
        if entry["kind"] == "bias":
            continue
        assert written[name]["shift"] == [round(-math.log2(s)) for s in entry["scale"]], name
        assert all(2.0**-shift in entry["scale"] for shift in written[name]["shift"])
