"""What a framework can quantize, in the form strategies consume.

An adaptor's capability YAML (see ``docs/capability-yaml.md``) is loaded and validated by
:mod:`lpq.capability_loader` into a :class:`CapabilitySpec` for the installed framework
version. The adaptor then pairs the spec with the ops of a concrete model to build a
:class:`FrameworkCapability`: ``optypewise`` (per op type) and ``opwise`` (per op, keyed by
``(op_name, op_type)``). Each entry is an ordered list of :class:`QuantCapability`; the
first one is the default.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .tune_config import FLOAT_PRECISIONS, OpConfig, OpKey, TensorConfig


@dataclass(frozen=True)
class TensorOptions:
    """The options allowed for one tensor of an op; the first of each list is the default."""

    dtype: tuple[str, ...]
    scheme: tuple[str, ...] = ("sym",)
    granularity: tuple[str, ...] = ("per_tensor",)
    algorithm: tuple[str, ...] = ("minmax",)
    #: Extra knobs with their allowed values, e.g. ``{"block_size": (32, 128)}``.
    extra: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    def default(self) -> TensorConfig:
        return TensorConfig(
            dtype=self.dtype[0],
            scheme=self.scheme[0],
            granularity=self.granularity[0],
            algorithm=self.algorithm[0],
            options={key: values[0] for key, values in self.extra.items()},
        )

    def choices(self) -> list[TensorConfig]:
        """Every combination of the allowed options, the default first."""
        extra_keys = list(self.extra)
        combos = itertools.product(
            self.dtype,
            self.scheme,
            self.granularity,
            self.algorithm,
            *(self.extra[key] for key in extra_keys),
        )
        return [
            TensorConfig(dtype, scheme, gran, algo, dict(zip(extra_keys, rest)))
            for dtype, scheme, gran, algo, *rest in combos
        ]

    def allows(self, config: TensorConfig) -> bool:
        return (
            config.dtype in self.dtype
            and config.scheme in self.scheme
            and config.granularity in self.granularity
            and config.algorithm in self.algorithm
            and all(config.options.get(k, v[0]) in v for k, v in self.extra.items())
        )


@dataclass(frozen=True)
class QuantCapability:
    """One way an op type can be quantized: a precision, a mode and per-tensor options."""

    precision: str
    mode: str
    weight: TensorOptions | None = None
    activation: TensorOptions | None = None

    def default_config(self) -> OpConfig:
        return OpConfig(
            precision=self.precision,
            mode=self.mode,
            weight=self.weight.default() if self.weight else None,
            activation=self.activation.default() if self.activation else None,
        )

    def configs(self) -> list[OpConfig]:
        """Every op config this capability allows, the default first."""
        weights: list[TensorConfig | None] = list(self.weight.choices()) if self.weight else [None]
        acts: list[TensorConfig | None] = (
            list(self.activation.choices()) if self.activation else [None]
        )
        return [
            OpConfig(self.precision, self.mode, weight, act)
            for weight, act in itertools.product(weights, acts)
        ]

    def allows(self, config: OpConfig) -> bool:
        if (config.precision, config.mode) != (self.precision, self.mode):
            return False
        for options, chosen in ((self.weight, config.weight), (self.activation, config.activation)):
            if options is None and chosen is not None:
                return False
            if options is not None and (chosen is None or not options.allows(chosen)):
                return False
        return True


@dataclass
class CapabilitySpec:
    """One validated version block of a capability YAML file, ready to query.

    ``capabilities[op_type]`` lists the ways that op type can be quantized; the key
    ``"default"`` applies to op types of ``ops`` without an entry of their own.
    """

    framework: str
    version_block: str
    source: str
    precisions: tuple[str, ...]
    ops: dict[str, tuple[str, ...]]
    capabilities: dict[str, list[QuantCapability]]
    patterns: list[tuple[str, ...]] = field(default_factory=list)
    #: Precision combinations the target supports (empty: any mix of ``precisions``).
    valid_mixed_precision: list[tuple[str, ...]] = field(default_factory=list)
    #: Model-wide options the tuner may search: name -> values, the default first.
    recipes: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    #: Recipes whose trial costs many times a plain one (``slow_recipes`` in the YAML).
    slow_recipes: tuple[str, ...] = ()
    #: Op type -> what the default config does with it (``defaults`` in the YAML).
    defaults: dict[str, str] = field(default_factory=dict)

    def quantizable_op_types(self) -> list[str]:
        return sorted(
            {
                op_type
                for precision, op_types in self.ops.items()
                if precision not in FLOAT_PRECISIONS
                for op_type in op_types
                if op_type != "*"
            }
        )

    def for_op_type(self, op_type: str) -> list[QuantCapability]:
        """How ``op_type`` can be quantized, the default first (empty: not quantizable)."""
        result: list[QuantCapability] = []
        for cap in self.capabilities.get(op_type, []):
            if op_type in self.ops.get(cap.precision, ()):
                result.append(cap)
        covered = {(c.precision, c.mode) for c in result}
        for cap in self.capabilities.get("default", []):
            if (cap.precision, cap.mode) in covered:
                continue
            if op_type in self.ops.get(cap.precision, ()):
                result.append(cap)
        return result

    def float_fallbacks(self, op_type: str) -> tuple[str, ...]:
        """Float precisions ``op_type`` may run in; fp32 is always possible."""
        found = [
            precision
            for precision in ("fp16", "bf16")
            if precision in self.precisions
            and (op_type in self.ops.get(precision, ()) or "*" in self.ops.get(precision, ()))
        ]
        return ("fp32", *found)

    def build(self, ops: Iterable[OpKey], framework_version: str | None) -> FrameworkCapability:
        """Pair this spec with a model's ops; ops no capability covers are left out."""
        opwise: dict[OpKey, list[QuantCapability]] = {}
        optypewise: dict[str, list[QuantCapability]] = {}
        fallbacks: dict[str, tuple[str, ...]] = {}
        for name, op_type in ops:
            caps = self.for_op_type(op_type)
            if not caps:
                continue
            opwise[(name, op_type)] = caps
            optypewise.setdefault(op_type, caps)
            fallbacks.setdefault(op_type, self.float_fallbacks(op_type))
        return FrameworkCapability(
            framework=self.framework,
            framework_version=framework_version,
            version_block=self.version_block,
            opwise=opwise,
            optypewise=optypewise,
            fallbacks=fallbacks,
            patterns=list(self.patterns),
            valid_mixed_precision=list(self.valid_mixed_precision),
            recipes=dict(self.recipes),
            slow_recipes=self.slow_recipes,
            defaults={t: d for t, d in self.defaults.items() if t in optypewise},
        )


@dataclass
class FrameworkCapability:
    """What an adaptor can do with one concrete model; returned by ``lpq_query_fw_capability``.

    ``opwise`` holds every quantizable op of the model in graph order.
    """

    framework: str
    framework_version: str | None
    version_block: str
    opwise: dict[OpKey, list[QuantCapability]]
    optypewise: dict[str, list[QuantCapability]]
    fallbacks: dict[str, tuple[str, ...]] = field(default_factory=dict)
    patterns: list[tuple[str, ...]] = field(default_factory=list)
    #: Precision combinations the target supports; a tuning run never leaves one of them.
    valid_mixed_precision: list[tuple[str, ...]] = field(default_factory=list)
    #: Model-wide options the tuner may search (``recipes`` in the YAML), default first.
    recipes: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    #: Recipes whose trial costs many times a plain one: the default strategy tries them
    #: after the fallback stages (``slow_recipes`` in the YAML).
    slow_recipes: tuple[str, ...] = ()
    #: Op type -> a float precision its ops keep by default (the tuner may still
    #: quantize them), or the mode of their default quantized choice.
    defaults: dict[str, str] = field(default_factory=dict)

    def default_op_config(self, key: OpKey) -> OpConfig:
        default = self.defaults.get(key[1])
        if default in FLOAT_PRECISIONS:
            return OpConfig.fallback(default)
        if default is not None:
            return self.op_configs(key)[0]
        return self.opwise[key][0].default_config()

    def op_configs(self, key: OpKey) -> list[OpConfig]:
        """Every quantized config allowed for op ``key``, the default first (a
        ``defaults`` mode moves that mode's configs to the front)."""
        configs = [cfg for cap in self.opwise[key] for cfg in cap.configs()]
        mode = self.defaults.get(key[1])
        return sorted(configs, key=lambda cfg: cfg.mode != mode) if mode else configs

    def fallback_precisions(self, key: OpKey) -> tuple[str, ...]:
        return self.fallbacks.get(key[1], ("fp32",))
