"""Files of the digits example (model.onnx, calib.npz, eval.npz); see ``digits_example``."""
