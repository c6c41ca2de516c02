"""Backend quantization schemes as data, and how a scheme narrows a capability.

A framework's capability YAML says what its kernels *can* do; the hardware a model is
deployed on says what it *will* run. TensorRT wants symmetric int8 everywhere, Vitis AI's
DPU wants power-of-two scales (fixed-point positions), older x86 CPUs saturate unless
weights use 7 bits, SNPE/QNN quantize every tensor. A :class:`QuantScheme` writes that
down as plain data (it round-trips through JSON), so a backend profile is a few lines a
plugin registers with ``lpq_register_backend_profiles``.

:func:`narrow_capability` intersects an adaptor's capability with a scheme: the strategies
then search only what the backend runs, and every option removed is reported as a
:class:`RuledOut` saying which constraint removed it from which op types.

Simulating a scheme bit-exactly (observers, fake quantizers) and exporting it is the
adaptor's job (see ``lpq_torch.backends``); this module only describes it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import ConfigError
from .capability import FrameworkCapability, QuantCapability, TensorOptions
from .tune_config import OpKey

ROUNDINGS = ("half_even", "half_up", "half_away")
SCALES = ("float", "pow2")
PLACEMENTS = ("outputs", "inputs")
BIASES = ("float", "int32", "like_weight")
GRANULARITIES = ("per_tensor", "per_channel")
_DTYPE = re.compile(r"^(u?)int(\d+)$")


def _bits_of(dtype: str) -> tuple[bool, int]:
    match = _DTYPE.match(dtype)
    if match is None or not 2 <= int(match.group(2)) <= 16:
        raise ConfigError(
            f"scheme dtype {dtype!r} is not an integer type",
            hint="use int8, uint8, int4, uint4, ... (2 to 16 bits)",
        )
    return match.group(1) != "u", int(match.group(2))


@dataclass(frozen=True)
class TensorScheme:
    """How a backend quantizes one kind of tensor (weights or activations).

    ``narrow_range`` drops the most negative code of a signed type (TensorRT and TFLite
    weights use [-127, 127] so that negation is exact). ``reduce_range`` uses one bit
    less than the container (7-bit weights in int8: the VPMADDUBSW instruction of x86
    CPUs without VNNI saturates otherwise). ``scale="pow2"`` rounds every scale to a power
    of two (a fixed-point position: Vitis AI). ``rounding`` is how the backend rounds
    ``x / scale``: ``half_even`` (ONNX, TensorRT), ``half_up`` (floor(v + 0.5), Vitis
    AI's DPU) or ``half_away`` (std::round, TFLite).
    """

    dtype: str = "int8"
    symmetric: bool = True
    granularity: str = "per_tensor"
    narrow_range: bool = False
    reduce_range: bool = False
    scale: str = "float"
    rounding: str = "half_even"

    def __post_init__(self) -> None:
        _, bits = _bits_of(self.dtype)
        for name, value, allowed in (
            ("granularity", self.granularity, GRANULARITIES),
            ("scale", self.scale, SCALES),
            ("rounding", self.rounding, ROUNDINGS),
        ):
            if value not in allowed:
                raise ConfigError(
                    f"scheme {name} {value!r} is not one of {', '.join(allowed)}",
                    hint="see docs/backends.md for the scheme fields",
                )
        if self.reduce_range and bits <= 2:
            raise ConfigError(f"reduce_range needs more than 2 bits, not {self.dtype}")

    @property
    def signed(self) -> bool:
        return _bits_of(self.dtype)[0]

    @property
    def bits(self) -> int:
        """Bits the values really use (one less than the dtype with ``reduce_range``)."""
        return _bits_of(self.dtype)[1] - (1 if self.reduce_range else 0)

    @property
    def scheme(self) -> str:
        """The capability YAML's name for the symmetry: ``sym`` or ``asym``."""
        return "sym" if self.symmetric else "asym"

    def quant_range(self) -> tuple[int, int]:
        """``(qmin, qmax)``: the integer codes this scheme produces."""
        bits = self.bits
        if not self.signed:
            return 0, 2**bits - 1
        low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        return (low + 1 if self.narrow_range else low), high

    def with_dtype(self, dtype: str) -> TensorScheme:
        return replace(self, dtype=dtype)

    def describe(self) -> str:
        parts = [self.dtype, self.scheme, self.granularity]
        if self.narrow_range:
            parts.append("narrow")
        if self.reduce_range:
            parts.append(f"{self.bits}-bit")
        if self.scale == "pow2":
            parts.append("pow2 scales")
        parts.append(f"round {self.rounding}")
        return " ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "symmetric": self.symmetric,
            "granularity": self.granularity,
            "narrow_range": self.narrow_range,
            "reduce_range": self.reduce_range,
            "scale": self.scale,
            "rounding": self.rounding,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = "scheme") -> TensorScheme:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where} must be a mapping of tensor scheme fields")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"{where} has unknown field(s) {', '.join(unknown)}",
                hint=f"use {', '.join(sorted(known))}",
            )
        return cls(**dict(data))


@dataclass(frozen=True)
class QuantScheme:
    """Everything a backend fixes about quantization, as data.

    ``placement`` says where activation quantizers go: ``outputs`` quantizes every
    tensor an op produces (SNPE/QNN, Vitis AI, TFLite: the whole graph runs in integers;
    an activation such as ReLU right after an op is fused into it); ``inputs`` quantizes
    only the activation inputs of the quantized ops plus those of ``quantize_inputs_of``
    (TensorRT, OpenVINO: Q/DQ in front of the ops that have int8 kernels, float
    elsewhere). ``float_ops`` are op types the backend always runs in float.
    ``bias="int32"`` quantizes biases with scale ``input_scale * weight_scale``, as
    integer-only backends do; ``"like_weight"`` quantizes them per tensor with the weight
    rules and a scale of their own (Vitis AI's 8-bit fixed-point biases). ``modes`` are
    the quantization modes the backend can run (``static``: calibrated ranges baked into
    the graph).
    """

    weight: TensorScheme = field(default_factory=lambda: TensorScheme(granularity="per_channel"))
    activation: TensorScheme = field(default_factory=TensorScheme)
    placement: str = "outputs"
    quantize_inputs_of: tuple[str, ...] = ()
    float_ops: tuple[str, ...] = ()
    bias: str = "float"
    modes: tuple[str, ...] = ("static",)

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ConfigError(
                f"scheme placement {self.placement!r} is not one of {', '.join(PLACEMENTS)}"
            )
        if self.bias not in BIASES:
            raise ConfigError(
                f"scheme bias {self.bias!r} is not one of {', '.join(BIASES)}",
                hint="see docs/backends.md for what each means",
            )
        if self.activation.granularity != "per_tensor":
            raise ConfigError(
                "activations are quantized per_tensor by every backend lpq knows",
                hint="set the activation granularity to per_tensor",
            )

    def with_bits(self, weight: int | None = None, activation: int | None = None) -> QuantScheme:
        """The same scheme at another bit width (research: 4-bit under a backend's rules)."""

        def resize(tensor: TensorScheme, bits: int | None) -> TensorScheme:
            if bits is None:
                return tensor
            return tensor.with_dtype(f"{'' if tensor.signed else 'u'}int{bits}")

        return replace(
            self, weight=resize(self.weight, weight), activation=resize(self.activation, activation)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "weight": self.weight.to_json(),
            "activation": self.activation.to_json(),
            "placement": self.placement,
            "quantize_inputs_of": list(self.quantize_inputs_of),
            "float_ops": list(self.float_ops),
            "bias": self.bias,
            "modes": list(self.modes),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QuantScheme:
        """Parse a scheme written as plain data; mistakes raise :class:`lpq.ConfigError`."""
        if isinstance(data, QuantScheme):
            return data
        if not isinstance(data, Mapping):
            raise ConfigError(f"a quantization scheme must be a mapping, not {type(data).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"quantization scheme has unknown field(s) {', '.join(unknown)}",
                hint=f"use {', '.join(sorted(known))} (see docs/backends.md)",
            )
        values: dict[str, Any] = {}
        for key in ("weight", "activation"):
            if key in data:
                values[key] = TensorScheme.from_json(data[key], f"scheme {key}")
        if "weight" in values and "granularity" not in data["weight"]:
            values["weight"] = replace(values["weight"], granularity="per_channel")
        for key in ("placement", "bias"):
            if key in data:
                values[key] = str(data[key])
        for key in ("quantize_inputs_of", "float_ops", "modes"):
            if key in data:
                values[key] = tuple(str(v) for v in data[key])
        return cls(**values)


@dataclass(frozen=True)
class RuledOut:
    """One thing a constraint removed from the tuning space, for the tuner's report."""

    constraint: str
    removed: str
    op_types: tuple[str, ...]
    ops: int

    def text(self) -> str:
        types = ", ".join(self.op_types)
        return f"{self.constraint}: ruled out {self.removed} for {types} ({self.ops} op(s))"

    def to_json(self) -> dict[str, Any]:
        return {
            "constraint": self.constraint,
            "removed": self.removed,
            "op_types": list(self.op_types),
            "ops": self.ops,
        }


class _Report:
    """Collects (constraint, removed) -> op types and op count, in first-seen order."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, str], tuple[dict[str, None], set[OpKey]]] = {}

    def add(self, constraint: str, removed: str, key: OpKey) -> None:
        types, ops = self._items.setdefault((constraint, removed), ({}, set()))
        types[key[1]] = None
        ops.add(key)

    def items(self) -> list[RuledOut]:
        return [
            RuledOut(constraint, removed, tuple(types), len(ops))
            for (constraint, removed), (types, ops) in self._items.items()
        ]


def _narrow_tensor(
    options: TensorOptions, rule: TensorScheme, tensor: str, backend: str
) -> tuple[TensorOptions | None, list[tuple[str, str]]]:
    """Intersect one tensor's options with the scheme; return what each rule removed."""
    removed: list[tuple[str, str]] = []
    wanted: dict[str, tuple[Any, ...]] = {
        "dtype": (rule.dtype,),
        "scheme": (rule.scheme,),
        "granularity": (rule.granularity,),
    }
    kept: dict[str, tuple[Any, ...]] = {}
    for name, allowed in wanted.items():
        current: tuple[Any, ...] = getattr(options, name)
        kept[name] = tuple(v for v in current if v in allowed)
        dropped = [str(v) for v in current if v not in allowed]
        if dropped:
            removed.append(
                (f"{backend}: {tensor} {name} {allowed[0]}", f"{tensor} {name} {'/'.join(dropped)}")
            )
    extra = dict(options.extra)
    current_rr = extra.get("reduce_range", (False,))
    kept_rr = tuple(v for v in current_rr if bool(v) == rule.reduce_range)
    dropped_rr = [str(v).lower() for v in current_rr if bool(v) != rule.reduce_range]
    if dropped_rr:
        removed.append(
            (
                f"{backend}: {tensor} reduce_range {str(rule.reduce_range).lower()}",
                f"{tensor} reduce_range {'/'.join(dropped_rr)}",
            )
        )
    if "reduce_range" in extra or rule.reduce_range:
        extra["reduce_range"] = kept_rr
    if not all(kept.values()) or not kept_rr:
        return None, removed
    return (
        TensorOptions(
            dtype=kept["dtype"],
            scheme=kept["scheme"],
            granularity=kept["granularity"],
            algorithm=options.algorithm,
            extra=extra,
        ),
        removed,
    )


def _narrow_one(
    cap: QuantCapability, scheme: QuantScheme, key: OpKey, backend: str, report: _Report
) -> QuantCapability | None:
    if cap.mode not in scheme.modes:
        report.add(
            f"{backend}: runs {'/'.join(scheme.modes)} quantization only",
            f"{cap.precision} {cap.mode}",
            key,
        )
        return None
    narrowed: dict[str, TensorOptions | None] = {}
    alive = True
    for tensor, options, rule in (
        ("weight", cap.weight, scheme.weight),
        ("activation", cap.activation, scheme.activation),
    ):
        if options is None:
            narrowed[tensor] = None
            continue
        result, removed = _narrow_tensor(options, rule, tensor, backend)
        for constraint, what in removed:
            report.add(constraint, what, key)
        narrowed[tensor] = result
        alive = alive and result is not None
    if not alive:
        return None
    return QuantCapability(cap.precision, cap.mode, narrowed["weight"], narrowed["activation"])


def narrow_capability(
    capability: FrameworkCapability, scheme: QuantScheme, backend: str
) -> tuple[FrameworkCapability, list[RuledOut]]:
    """``capability`` ∩ ``scheme``: only the options the backend runs, and why others went.

    An op type in ``scheme.float_ops``, or an op none of whose options survive, keeps no
    quantized option (the tuning space then pins it to fp32); each such op is reported.
    """
    report = _Report()
    opwise: dict[OpKey, list[QuantCapability]] = {}
    for key, caps in capability.opwise.items():
        if key[1] in scheme.float_ops:
            if caps:
                report.add(f"{backend}: keeps {key[1]} in float", "quantization", key)
            opwise[key] = []
            continue
        kept = [c for cap in caps if (c := _narrow_one(cap, scheme, key, backend, report))]
        if caps and not kept:
            report.add(f"{backend}: no option of the capability fits", "quantization (fp32)", key)
        opwise[key] = kept
    optypewise: dict[str, list[QuantCapability]] = {}
    for (_, op_type), caps in opwise.items():
        optypewise.setdefault(op_type, caps)
    narrowed = replace(capability, opwise=opwise, optypewise=optypewise)
    return narrowed, report.items()
