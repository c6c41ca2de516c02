"""The core adaptor contract, run against the MXNet adaptor (a trained Gluon CNN)."""

from lpq.testing import AdaptorConformance


class TestConformance(AdaptorConformance):
    framework = "mxnet"
