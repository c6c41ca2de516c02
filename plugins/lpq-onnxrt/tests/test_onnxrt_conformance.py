"""The core adaptor contract, run against the ONNX Runtime adaptor."""

from lpq.testing import AdaptorConformance


class TestConformance(AdaptorConformance):
    framework = "onnxrt"
