"""lpq-torch passes the same adaptor conformance suite as every lpq adaptor."""

from lpq.testing import AdaptorConformance


class TestConformance(AdaptorConformance):
    framework = "torch"

    def known_op_types(self) -> set[str]:
        """Every ATen operator name (lpq-torch's YAML names ops by their ATen op), plus
        ``lm_head``, lpq-torch's own op type for a causal LM's output projection."""
        import torch

        aten = {
            schema.name.split("::", 1)[1]
            for schema in torch._C._jit_get_all_schemas()
            if schema.name.startswith("aten::")
        }
        return aten | {"lm_head"}
