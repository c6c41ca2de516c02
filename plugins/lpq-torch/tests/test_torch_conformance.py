"""lpq-torch passes the same adaptor conformance suite as every lpq adaptor."""

from lpq.testing import AdaptorConformance


class TestConformance(AdaptorConformance):
    framework = "torch"
