"""The tune_cfg: one concrete quantization choice for every op of a model.

A strategy builds a :class:`TuneConfig` from the capability an adaptor reported; the
adaptor's ``lpq_quantize`` applies it node by node. It serializes to plain JSON so that
tuning history can be written after every trial and resumed later, and so that a trial is
an independent unit of work (model + tune_cfg + data in, measurements out).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import ConfigError

#: Precisions an op can be left in instead of being quantized.
FLOAT_PRECISIONS = ("fp32", "fp16", "bf16")


@dataclass(frozen=True)
class TensorConfig:
    """How one tensor (an op's weight or activation) is quantized."""

    dtype: str
    scheme: str = "sym"
    granularity: str = "per_tensor"
    algorithm: str = "minmax"
    #: Extra knobs a capability allows, e.g. ``{"block_size": 32}`` for int4 weight-only.
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)

    @property
    def reduce_range(self) -> bool:
        """The ``reduce_range`` knob: one bit less for the values (7-bit int8 weights, for
        x86 CPUs without VNNI). CLI spellings (``"true"``, ``"on"``, ...) count."""
        value = self.options.get("reduce_range", False)
        if isinstance(value, str):
            return value.strip().lower() in ("true", "yes", "on", "1")
        return bool(value)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "dtype": self.dtype,
            "scheme": self.scheme,
            "granularity": self.granularity,
            "algorithm": self.algorithm,
        }
        if self.options:
            data["options"] = dict(self.options)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TensorConfig:
        return cls(
            dtype=data["dtype"],
            scheme=data.get("scheme", "sym"),
            granularity=data.get("granularity", "per_tensor"),
            algorithm=data.get("algorithm", "minmax"),
            options=dict(data.get("options", {})),
        )


@dataclass(frozen=True)
class OpConfig:
    """The choice for one op: quantized (``precision`` int8, int4, ...) or a float fallback.

    ``mode`` is the quantization mode from the capability (``static``, ``dynamic``,
    ``weight_only``); it is ``None`` for float precisions.
    """

    precision: str
    mode: str | None = None
    weight: TensorConfig | None = None
    activation: TensorConfig | None = None

    @property
    def quantized(self) -> bool:
        return self.precision not in FLOAT_PRECISIONS

    @classmethod
    def fallback(cls, precision: str = "fp32") -> OpConfig:
        if precision not in FLOAT_PRECISIONS:
            raise ConfigError(
                f"fallback precision must be one of {', '.join(FLOAT_PRECISIONS)}, "
                f"not {precision!r}"
            )
        return cls(precision=precision)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"precision": self.precision}
        if self.mode is not None:
            data["mode"] = self.mode
        if self.weight is not None:
            data["weight"] = self.weight.to_json()
        if self.activation is not None:
            data["activation"] = self.activation.to_json()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OpConfig:
        return cls(
            precision=data["precision"],
            mode=data.get("mode"),
            weight=TensorConfig.from_json(data["weight"]) if data.get("weight") else None,
            activation=(
                TensorConfig.from_json(data["activation"]) if data.get("activation") else None
            ),
        )


#: An op is identified by its name and its op type, as in the adaptor's opwise capability.
OpKey = tuple[str, str]


@dataclass
class TuneConfig:
    """The full per-op configuration of one trial plus global options.

    ``ops`` maps ``(op_name, op_type)`` to its :class:`OpConfig`. Ops absent from ``ops``
    are left as they are in the fp32 model. ``options`` holds global adaptor options such
    as ``quant_format`` (``qdq`` / ``qoperator``) or the backend profile's settings.
    """

    ops: dict[OpKey, OpConfig] = field(default_factory=dict)
    calib_sampling_size: int = 100
    options: dict[str, Any] = field(default_factory=dict)

    def __iter__(self) -> Iterator[tuple[OpKey, OpConfig]]:
        return iter(self.ops.items())

    def quantized_ops(self) -> list[OpKey]:
        return [key for key, cfg in self.ops.items() if cfg.quantized]

    def fallback_ops(self) -> list[OpKey]:
        return [key for key, cfg in self.ops.items() if not cfg.quantized]

    def with_ops(self, changes: Mapping[OpKey, OpConfig]) -> TuneConfig:
        """A copy with some ops changed; the original is left untouched."""
        ops = dict(self.ops)
        ops.update(changes)
        return replace(self, ops=ops, options=dict(self.options))

    def with_fallbacks(self, names: Iterable[str]) -> TuneConfig:
        """A copy with the ops named ``names`` (every op type of each) as fp32 fallbacks:
        what an adaptor records for the ops its rules or measurements kept in float."""
        wanted = set(names)
        fallback = OpConfig.fallback()
        return self.with_ops({key: fallback for key in self.ops if key[0] in wanted})

    def with_options(self, changes: Mapping[str, Any]) -> TuneConfig:
        """A copy with some global ``options`` changed."""
        return replace(self, ops=dict(self.ops), options={**self.options, **changes})

    def to_json(self) -> dict[str, Any]:
        return {
            "ops": [
                {"name": name, "type": op_type, **cfg.to_json()}
                for (name, op_type), cfg in sorted(self.ops.items())
            ],
            "calib_sampling_size": self.calib_sampling_size,
            "options": self.options,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TuneConfig:
        try:
            ops = {(op["name"], op["type"]): OpConfig.from_json(op) for op in data["ops"]}
            return cls(
                ops=ops,
                calib_sampling_size=int(data.get("calib_sampling_size", 100)),
                options=dict(data.get("options", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"not a valid tune_cfg JSON document ({exc!r})",
                hint="pass a file written by lpq (history.json or a saved model's tune_cfg)",
            ) from exc

    def fingerprint(self) -> str:
        """A stable hash of the config: equal configs have equal fingerprints."""
        text = json.dumps(self.to_json(), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]
