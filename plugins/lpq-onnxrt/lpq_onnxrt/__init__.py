"""lpq-onnxrt: the ONNX Runtime adaptor for lpq."""
