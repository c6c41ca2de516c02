"""Quantize one ONNX model with AMD Quark; run by run.py inside the Quark venv.

    quark_worker.py MODEL OUT CALIB.npz default|best

``default``: Quark's default int8 config for the model's kind on CPU (``INT8_CNN_DEFAULT``,
``INT8_TRANSFORMER_DEFAULT`` for MatMul models: U8S8 QDQ, MinMax). ``best``: its
best-accuracy int8 config (``INT8_CNN_ACCURATE`` / ``INT8_TRANSFORMER_ACCURATE``:
percentile calibration and AdaRound fast fine-tuning), for CNNs with per-channel weights
and cross-layer equalization. Prints one JSON line with the config used.
"""

from __future__ import annotations

import copy
import json
import sys
from collections import defaultdict

import numpy as np
import onnx


def main() -> None:
    source, target, calib_file, kind = sys.argv[1:5]
    from quark.onnx import ModelQuantizer
    from quark.onnx.quantization.config.config import Config
    from quark.onnx.quantization.config.custom_config import get_default_config

    model = onnx.load(source)
    transformer = sum(n.op_type == "MatMul" for n in model.graph.node) > sum(
        n.op_type == "Conv" for n in model.graph.node
    )
    family = "TRANSFORMER" if transformer else "CNN"
    name = f"INT8_{family}_{'DEFAULT' if kind == 'default' else 'ACCURATE'}"
    config = copy.deepcopy(get_default_config(name))
    if kind == "best":
        # Quark's transformer QDQ quantizer has no per-channel weights (AttributeError
        # 'quantize_weight_per_channel' inside Quark 0.x): per-channel for CNNs only.
        config.per_channel = not transformer
        config.include_cle = not transformer
    with np.load(calib_file) as data:
        feeds: dict[int, dict[str, np.ndarray]] = defaultdict(dict)
        for key in data.files:
            index, input_name = key.split("__", 1)
            feeds[int(index)][input_name] = data[key]
    items = [feeds[i] for i in sorted(feeds)]

    class Reader:
        def __init__(self) -> None:
            self.it = iter(items)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.it, None)

        def rewind(self) -> None:
            self.it = iter(items)

    ModelQuantizer(Config(global_quant_config=config)).quantize_model(source, target, Reader())
    print(
        json.dumps({"config": name, "per_channel": config.per_channel, "cle": config.include_cle})
    )


if __name__ == "__main__":
    main()
