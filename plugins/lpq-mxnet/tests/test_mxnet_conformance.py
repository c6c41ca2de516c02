"""The core adaptor contract, run against the MXNet adaptor (a trained Gluon CNN)."""

from lpq.testing import AdaptorConformance


class TestConformance(AdaptorConformance):
    framework = "mxnet"

    def known_op_types(self) -> set[str]:
        """Every operator registered with MXNet (the symbol op names lpq-mxnet's YAML uses)."""
        import mxnet as mx

        return set(mx.operator.get_all_registered_operators())
