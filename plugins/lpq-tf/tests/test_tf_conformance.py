"""The core adaptor contract, run against the TensorFlow / LiteRT adaptor."""

from lpq.testing import AdaptorConformance


class TestConformance(AdaptorConformance):
    framework = "tf"
