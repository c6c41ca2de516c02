"""The core adaptor contract, run against the ONNX Runtime adaptor."""

from lpq.testing import AdaptorConformance


class TestConformance(AdaptorConformance):
    framework = "onnxrt"

    def known_op_types(self) -> set[str]:
        """Every op type ONNX defines, in every domain (ai.onnx and com.microsoft too)."""
        import onnx.defs
        from onnxruntime.capi import _pybind_state

        names = {schema.name for schema in onnx.defs.get_all_schemas_with_history()}
        return names | {schema.name for schema in _pybind_state.get_all_operator_schema()}
