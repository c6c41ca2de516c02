"""The static pass hands ORT's quantizer a model already shape-inferred in memory, so ORT
skips its own round trip through temporary files (a deep copy, a save, file-to-file
inference and a load per build), and builds the same model."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import numpy_helper

import lpq

FW = "onnxrt"


@pytest.fixture
def pm() -> lpq.PluginManager:
    return lpq.get_plugin_manager()


def _cfg(pm: lpq.PluginManager, model: Any, loader: Any) -> lpq.TuneConfig:
    cap = pm.query_capability(FW, model, loader, {})
    return lpq.TuneConfig(
        ops={k: cap.default_op_config(k) for k in cap.opwise},
        calib_sampling_size=100,
        options={"quant_format": "qdq", "latency_aware": False},
    )


def test_no_file_round_trip_and_the_same_model(pm, lpq_sample_model, calib_loader, monkeypatch):
    from onnxruntime.quantization import base_quantizer

    from lpq_onnxrt.passes import static

    trips: list[int] = []
    original = base_quantizer.save_and_reload_model_with_shape_infer

    def counted(model: Any) -> Any:
        trips.append(1)
        return original(model)

    monkeypatch.setattr(base_quantizer, "save_and_reload_model_with_shape_infer", counted)
    cfg = _cfg(pm, lpq_sample_model, calib_loader)
    fast = pm.quantize(FW, lpq_sample_model, cfg, calib_loader).proto
    assert trips == []
    monkeypatch.setattr(static, "_with_inferred_shapes", lambda model: model)
    ort_path = pm.quantize(FW, lpq_sample_model, cfg, calib_loader).proto
    assert trips  # ORT's own path ran: the comparison below means something
    assert list(fast.graph.node) == list(ort_path.graph.node)
    ours = {t.name: numpy_helper.to_array(t) for t in fast.graph.initializer}
    theirs = {t.name: numpy_helper.to_array(t) for t in ort_path.graph.initializer}
    assert ours.keys() == theirs.keys()
    for name, value in ours.items():
        assert value.dtype == theirs[name].dtype and np.array_equal(value, theirs[name]), name
