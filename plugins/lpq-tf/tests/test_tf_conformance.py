"""The core adaptor contract, run against the TensorFlow / LiteRT adaptor."""

from lpq.testing import AdaptorConformance


class TestConformance(AdaptorConformance):
    framework = "tf"

    def known_op_types(self) -> set[str]:
        """Every TFLite builtin operator (the names lpq-tf's YAML uses)."""
        from tensorflow.lite.python import schema_py_generated as schema

        return {name for name in vars(schema.BuiltinOperator) if name.isupper()}
