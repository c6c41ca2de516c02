"""Bad input gives lpq errors; inputs in every accepted form; save/load; framework-free import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_testmodels import DigitsMLP, calib_loader, eval_loader

import lpq
from lpq import TopK


class DataDependent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # Python branch on a tensor value: not exportable
            return self.fc(x.flatten(1))
        return -self.fc(x.flatten(1))


class TwoInputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(64, 10)
        self.b = torch.nn.Linear(4, 10)

    def forward(self, image: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        return self.a(image.flatten(1)) + self.b(extra)


def test_importing_and_registering_does_not_import_torch() -> None:
    code = (
        "import sys, lpq\n"
        "import lpq_torch.plugin as p\n"
        "seen = []\n"
        "p.plugin.lpq_register_adaptors(seen.append)\n"
        "assert seen[0].framework == 'torch'\n"
        "assert p.plugin.lpq_detect_framework(object()) is None\n"
        "assert p.plugin.lpq_detect_framework('model.onnx') is None\n"
        "assert p.plugin.lpq_query_fw_capability('onnxrt', None, None, {}) is None\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_not_a_module_is_a_model_error() -> None:
    pm = lpq.get_plugin_manager()
    with pytest.raises(lpq.ModelError, match=r"nn\.Module"):
        pm.quantize("torch", "not a model", lpq.TuneConfig(), calib_loader())


def test_unexportable_model_names_the_construct() -> None:
    pm = lpq.get_plugin_manager()
    with pytest.raises(lpq.ModelError) as err:
        pm.query_capability("torch", DataDependent(), calib_loader())
    assert "data-dependent control flow" in str(err.value)
    assert "torch.cond" in str(err.value)


def test_misfit_example_inputs_are_a_data_error() -> None:
    pm = lpq.get_plugin_manager()
    bad = lpq.ArrayLoader(np.zeros((4, 3, 5, 5), np.float32), batch_size=2)
    with pytest.raises(lpq.DataError, match="shapes and dtypes"):
        pm.query_capability("torch", DigitsMLP(), bad)
    with pytest.raises(lpq.DataError):
        pm.query_capability("torch", DigitsMLP(), None)


def test_unknown_op_in_tune_cfg_is_a_config_error() -> None:
    pm = lpq.get_plugin_manager()
    cfg = lpq.TuneConfig(ops={("nope", "linear"): lpq.OpConfig.fallback()})
    with pytest.raises(lpq.ConfigError, match="nope"):
        pm.quantize("torch", DigitsMLP(), cfg, calib_loader())


def test_tensor_tuple_dict_inputs_and_torch_dataloader() -> None:
    torch.manual_seed(0)
    model = TwoInputs().eval()
    images = torch.rand(12, 1, 8, 8)
    extra = torch.rand(12, 4)
    labels = torch.randint(0, 10, (12,))
    tuple_items = [((images[i : i + 4], extra[i : i + 4]), labels[i : i + 4]) for i in (0, 4, 8)]
    dict_items = [
        ({"image": images[i : i + 4], "extra": extra[i : i + 4]}, labels[i : i + 4])
        for i in (0, 4, 8)
    ]
    dataset = torch.utils.data.TensorDataset(images.flatten(1), labels)
    pm = lpq.get_plugin_manager()
    for data in (tuple_items, dict_items):
        cap = pm.query_capability("torch", model, data)
        cfg = lpq.TuneConfig({k: cap.default_op_config(k) for k in cap.opwise})
        qmodel = pm.quantize("torch", model, cfg, data)
        result = pm.evaluate("torch", qmodel, data, [TopK(1)])
        assert result.samples == 12
    mlp = DigitsMLP().eval()
    loader = torch.utils.data.DataLoader(dataset, batch_size=5)  # last batch of 2
    cap = pm.query_capability("torch", mlp, loader)
    qmodel = pm.quantize(
        "torch", mlp, lpq.TuneConfig({k: cap.default_op_config(k) for k in cap.opwise}), loader
    )
    assert pm.evaluate("torch", qmodel, loader, [TopK(1)]).samples == 12


def test_batch_of_one_still_exports_a_dynamic_batch() -> None:
    mlp = DigitsMLP().eval()
    images = eval_loader().inputs
    one = lpq.ArrayLoader(images[:3], batch_size=1)
    pm = lpq.get_plugin_manager()
    cap = pm.query_capability("torch", mlp, one)
    qmodel = pm.quantize(
        "torch", mlp, lpq.TuneConfig({k: cap.default_op_config(k) for k in cap.opwise}), one
    )
    assert qmodel(torch.from_numpy(images[:7])).shape == (7, 10)


def test_saved_file_is_detected_and_reloads_without_recalibration(
    digits_mlp: torch.nn.Module, tmp_path: Path
) -> None:
    pm = lpq.get_plugin_manager()
    cap = pm.query_capability("torch", digits_mlp, calib_loader())
    cfg = lpq.TuneConfig({k: cap.default_op_config(k) for k in cap.opwise})
    qmodel = pm.quantize("torch", digits_mlp, cfg, calib_loader())
    path = pm.save_model("torch", qmodel, tmp_path / "mlp")
    assert path.suffix == ".pt2" and pm.detect_framework(path) == "torch"
    assert not list(tmp_path.glob(".*.tmp*")), "no temporary files left behind"
    loaded = pm.load_model("torch", path)
    assert loaded._lpq_tune_cfg == cfg.to_json()
    assert {k for k, _ in cap.opwise} <= set(
        pm.inspect_tensor("torch", loaded, eval_loader(), None, "weight", 1).weights
    )
    x = torch.from_numpy(eval_loader().inputs[:9])
    torch.testing.assert_close(loaded(x), qmodel(x))
    (tmp_path / "junk.pt2").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(lpq.ModelError):
        pm.load_model("torch", tmp_path / "junk.pt2")


class _Touch:
    """Unpickling this creates a file: stands in for code a malicious archive would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (Path.touch, (self.marker,))


def _rewrite(src: Path, dst: Path, change: dict[str, bytes]) -> None:
    import zipfile

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            for suffix, new in change.items():
                if info.filename.endswith(suffix):
                    data = new
            zout.writestr(info, data)


def test_loading_never_runs_pickled_code(digits_mlp: torch.nn.Module, tmp_path: Path) -> None:
    import io
    import json
    import zipfile

    pm = lpq.get_plugin_manager()
    cap = pm.query_capability("torch", digits_mlp, calib_loader())
    qmodel = pm.quantize(
        "torch",
        digits_mlp,
        lpq.TuneConfig({k: cap.default_op_config(k) for k in cap.opwise}),
        calib_loader(),
    )
    good = pm.save_model("torch", qmodel, tmp_path / "good.pt2")
    marker = tmp_path / "pwned"
    payload = io.BytesIO()
    torch.save({"x": _Touch(marker)}, payload)  # torch.export.load would fall back to
    evil_inputs = tmp_path / "evil-inputs.pt2"  # weights_only=False on this
    _rewrite(good, evil_inputs, {"data/sample_inputs/model.pt": payload.getvalue()})
    with pytest.raises(lpq.ModelError, match="refusing"):
        pm.load_model("torch", evil_inputs)
    assert not marker.exists()

    with zipfile.ZipFile(good) as z:
        name = next(n for n in z.namelist() if n.endswith("model_weights_config.json"))
        config = json.loads(z.read(name))
    first = next(iter(config["config"].values()))
    first["use_pickle"] = True
    evil_weights = tmp_path / "evil-weights.pt2"
    _rewrite(good, evil_weights, {"model_weights_config.json": json.dumps(config).encode()})
    with pytest.raises(lpq.ModelError, match="stored pickled"):
        pm.load_model("torch", evil_weights)
