"""The backend profiles lpq-torch ships, as data (no torch import: registration stays cheap).

Each profile is a :class:`lpq.BackendProfile` whose ``scheme`` says how the hardware
quantizes (see docs/backends.md for the sources and what each field means), whose
``capability_file`` is what the simulator can do (``capabilities/simulation.yaml``; the
scheme narrows it), and whose ``writer`` writes the backend's parameter file at deploy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import lpq

FRAMEWORK = "torch"
_WRITERS = "lpq_torch.backends.params"

#: Weights as TensorRT, TFLite and ONNX Runtime take them: int8, symmetric, one scale per
#: output channel, [-127, 127] so that -w is representable.
_INT8_PER_CHANNEL: dict[str, Any] = {
    "dtype": "int8",
    "symmetric": True,
    "granularity": "per_channel",
    "narrow_range": True,
}

PROFILES: dict[str, dict[str, Any]] = {
    "tensorrt": {
        "description": "NVIDIA TensorRT (explicit Q/DQ, or implicit INT8 with a calibration "
        "cache): symmetric int8, per-channel weights, per-tensor activations quantized at "
        "the inputs of conv/linear/matmul",
        "scheme": {
            "weight": _INT8_PER_CHANNEL,
            "activation": {"dtype": "int8", "symmetric": True},
            "placement": "inputs",
        },
        "writer": f"{_WRITERS}:write_tensorrt",
    },
    "snpe": {
        "description": "Qualcomm SNPE / QNN HTP: every tensor quantized (uint8 asymmetric "
        "activations, int8 symmetric per-channel weights, int32 bias); encodings JSON for "
        "--quantization_overrides",
        "scheme": {
            "weight": {"dtype": "int8", "symmetric": True, "granularity": "per_channel"},
            "activation": {"dtype": "uint8", "symmetric": False},
            "placement": "outputs",
            "bias": "int32",
        },
        "writer": f"{_WRITERS}:write_snpe",
    },
    "vitis": {
        "description": "AMD/Xilinx Vitis AI DPU: power-of-two scales (fixed-point "
        "positions), symmetric int8 per tensor, every tensor quantized, DPU rounding "
        "(activations half up, weights std::round); matmul and softmax stay on the CPU",
        "scheme": {
            "weight": {
                "dtype": "int8",
                "symmetric": True,
                "granularity": "per_tensor",
                "scale": "pow2",
                "rounding": "half_away",
            },
            "activation": {
                "dtype": "int8",
                "symmetric": True,
                "scale": "pow2",
                "rounding": "half_up",
            },
            "placement": "outputs",
            "bias": "like_weight",
            "float_ops": ["matmul", "softmax", "_softmax", "layer_norm", "gelu"],
        },
        "writer": f"{_WRITERS}:write_vitis",
    },
    "openvino": {
        "description": "Intel OpenVINO CPU (reads QDQ ONNX): uint8 asymmetric activations at "
        "the inputs of quantized ops, int8 per-channel weights in 7 bits (the overflow fix "
        "for CPUs without VNNI)",
        "scheme": {
            "weight": {**_INT8_PER_CHANNEL, "reduce_range": True},
            "activation": {"dtype": "uint8", "symmetric": False},
            "placement": "inputs",
            "quantize_inputs_of": ["add", "mul", "cat", "avg_pool2d", "adaptive_avg_pool2d"],
        },
        "writer": f"{_WRITERS}:write_summary",
    },
    "tflite": {
        "description": "TensorFlow Lite full-integer int8: asymmetric int8 activations on "
        "every tensor, symmetric per-channel weights in [-127, 127], int32 bias, "
        "round half away from zero",
        "scheme": {
            "weight": {**_INT8_PER_CHANNEL, "rounding": "half_away"},
            "activation": {"dtype": "int8", "symmetric": False, "rounding": "half_away"},
            "placement": "outputs",
            "bias": "int32",
        },
        "writer": f"{_WRITERS}:write_summary",
    },
    "x86": {
        "description": "x86 CPU reference (ONNX Runtime / oneDNN QDQ): uint8 asymmetric "
        "activations, int8 per-channel weights, int32 bias; the unconstrained baseline the "
        "other profiles are compared with",
        "scheme": {
            "weight": _INT8_PER_CHANNEL,
            "activation": {"dtype": "uint8", "symmetric": False},
            "placement": "inputs",
            "quantize_inputs_of": ["add", "mul", "cat", "avg_pool2d", "adaptive_avg_pool2d"],
            "bias": "int32",
        },
        "writer": f"{_WRITERS}:write_summary",
    },
}


def simulation_capability() -> Path:
    """What the simulator can do: the capability every profile's scheme narrows."""
    return Path(
        str(resources.files("lpq_torch.backends").joinpath("capabilities", "simulation.yaml"))
    )


def profile(name: str) -> lpq.BackendProfile:
    entry = PROFILES[name]
    return lpq.BackendProfile(
        name=name,
        framework=FRAMEWORK,
        description=entry["description"],
        capability_file=simulation_capability(),
        scheme=entry["scheme"],
        writer=entry["writer"],
    )


def register_all(register: Callable[[lpq.BackendProfile], None]) -> None:
    for name in PROFILES:
        register(profile(name))


def parse_scheme(data: Mapping[str, Any] | Any) -> Any:
    """A scheme (``QuantScheme``) from its JSON form, through lpq's public API.

    ``lpq.QuantScheme`` is not exported yet (core request); a throwaway profile parses
    and validates the data exactly the same way.
    """
    scheme = lpq.BackendProfile(name="scheme", framework=FRAMEWORK, scheme=data).quant_scheme
    if scheme is None:
        raise lpq.ConfigError("no quantization scheme given")
    return scheme


def scheme_of(backend: str | Any) -> Any:
    """The scheme of a registered profile by name (any plugin's), or ``backend`` itself
    when it is a scheme or its JSON form."""
    if isinstance(backend, str):
        found = lpq.get_plugin_manager().backend_profile(backend).quant_scheme
        if found is None:
            raise lpq.ConfigError(
                f"backend profile {backend!r} declares no quantization scheme",
                hint="lpq-torch simulates profiles with a scheme (docs/backends.md)",
            )
        return found
    return parse_scheme(backend)
