"""ORT's optimizer gets large weights as a file (``model_io.SPILL_BYTES``): the prepared
model is the same as when it gets them as arrays."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from lpq_onnxrt import model_io, weights


def _prepared(model: onnx.ModelProto) -> onnx.ModelProto:
    light, blobs = weights.detach(model, min_bytes=1024)
    optimized = model_io.optimize(light, blobs)
    weights.attach(optimized, blobs)
    assert not blobs  # every value went back into the model
    return optimized


def test_optimized_model_is_the_same_whether_weights_go_as_a_file_or_arrays(
    lpq_sample_model, monkeypatch
):
    model = onnx.load(str(lpq_sample_model))
    monkeypatch.setattr(model_io, "SPILL_BYTES", 1 << 40)
    reference = _prepared(model)
    monkeypatch.setattr(model_io, "SPILL_BYTES", 0)
    got = _prepared(model)
    assert [n.op_type for n in got.graph.node] == [n.op_type for n in reference.graph.node]
    expected = {i.name: numpy_helper.to_array(i) for i in reference.graph.initializer}
    values = {i.name: numpy_helper.to_array(i) for i in got.graph.initializer}
    assert values.keys() == expected.keys()
    big = [name for name, value in expected.items() if value.nbytes >= 1024]
    assert big  # the digits CNN has weights over the detach size: the file path ran
    for name, value in expected.items():
        np.testing.assert_array_equal(values[name], value)
