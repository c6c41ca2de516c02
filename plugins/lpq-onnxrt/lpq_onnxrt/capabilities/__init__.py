"""Capability YAML files of the ONNX Runtime adaptor."""
