"""The lpq hooks of lpq-acme-npu: one backend profile, registered as plain data.

Importing this module must stay cheap (``lpq plugins list`` imports it): no torch, no
onnx. The writer is named by its import path and imported only at deploy.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path

import lpq

#: The Acme NPU's arithmetic (docs/adding-a-backend.md, step 1): int8 symmetric weights,
#: one scale per output channel rounded to a power of two (its requantizer shifts);
#: int8 symmetric activations on every tensor, per tensor, power-of-two scales; round
#: half away from zero; int32 biases.
SCHEME = {
    "weight": {
        "dtype": "int8",
        "symmetric": True,
        "granularity": "per_channel",
        "narrow_range": True,
        "scale": "pow2",
        "rounding": "half_away",
    },
    "activation": {
        "dtype": "int8",
        "symmetric": True,
        "scale": "pow2",
        "rounding": "half_away",
    },
    "placement": "outputs",
    "bias": "int32",
    "float_ops": ["softmax", "_softmax", "layer_norm"],
}


def capability_file() -> Path:
    return Path(str(resources.files("lpq_acme_npu").joinpath("capabilities", "acme-npu.yaml")))


@lpq.hookimpl
def lpq_register_backend_profiles(register: Callable[[lpq.BackendProfile], None]) -> None:
    register(
        lpq.BackendProfile(
            name="acme-npu",
            framework="torch",
            description="Acme NPU: int8 symmetric, power-of-two scales, every tensor quantized",
            capability_file=capability_file(),
            scheme=SCHEME,
            writer="lpq_acme_npu.writer:write",
        )
    )
