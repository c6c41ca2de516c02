"""The tuning space: every op's allowed choices after applying the user's config.

Built once per run from the adaptor's :class:`FrameworkCapability` and the user's
:class:`PostTrainingQuantConfig`. Strategies only ever pick from here, so overrides,
excluded precisions and the approach are honoured by every strategy alike.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..config import PostTrainingQuantConfig
from ..errors import ConfigError
from .approach import check_approach
from .backend import RuledOut
from .capability import FrameworkCapability
from .tune_config import FLOAT_PRECISIONS, OpConfig, OpKey, TensorConfig, TuneConfig

_MODE_ORDER = {"static": 0, "dynamic": 1, "weight_only": 2, "qat": 3}
#: Tensor knobs kept in ``TensorConfig.options`` rather than as fields.
_EXTRA_FIELDS = ("block_size", "bits", "reduce_range")


@dataclass
class TuningSpace:
    """Per-op quantized choices (default first), float fallbacks and forced choices."""

    choices: dict[OpKey, list[OpConfig]]
    fallbacks: dict[OpKey, tuple[str, ...]]
    forced: dict[OpKey, OpConfig] = field(default_factory=dict)
    calib_sampling_size: int = 100
    options: dict[str, Any] = field(default_factory=dict)
    #: What the backend profile and the capability's ``valid_mixed_precision`` removed.
    ruled_out: list[RuledOut] = field(default_factory=list)
    #: Model-wide options the strategy may vary (capability ``recipes`` the user did not
    #: fix): name -> values, the default (already in ``options``) first.
    recipes: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    #: Ops the default config keeps in a float precision (capability ``defaults``); a
    #: strategy may still quantize them with any of their ``choices``.
    float_defaults: dict[OpKey, str] = field(default_factory=dict)
    #: Recipes of ``recipes`` whose trial costs many times a plain one (capability
    #: ``slow_recipes``): a strategy may try them last.
    slow_recipes: frozenset[str] = frozenset()

    @property
    def ops(self) -> list[OpKey]:
        """Every op of the space in graph order."""
        return list(self.choices)

    @property
    def tunable_ops(self) -> list[OpKey]:
        """Ops whose choice a strategy may change (not forced by the user)."""
        return [key for key in self.choices if key not in self.forced]

    def op_types(self) -> list[str]:
        return list(dict.fromkeys(op_type for _, op_type in self.tunable_ops))

    def fallback(self, key: OpKey) -> OpConfig:
        return OpConfig.fallback(self.fallbacks[key][0])

    def make(self, ops: Mapping[OpKey, OpConfig]) -> TuneConfig:
        """A TuneConfig from per-op choices; forced ops always keep their forced choice."""
        merged = {key: ops[key] if key in ops else self.default_choice(key) for key in self.choices}
        merged.update(self.forced)
        return TuneConfig(
            ops=merged, calib_sampling_size=self.calib_sampling_size, options=dict(self.options)
        )

    def default_choice(self, key: OpKey) -> OpConfig:
        """What the default config does with op ``key``."""
        if key in self.float_defaults:
            return OpConfig.fallback(self.float_defaults[key])
        return self.choices[key][0]

    def default(self) -> TuneConfig:
        return self.make({})

    def all_fallback(self) -> TuneConfig:
        return self.make({key: self.fallback(key) for key in self.choices})

    def recipe_variants(
        self, cfg: TuneConfig, *, slow: bool | None = None
    ) -> list[tuple[str, TuneConfig]]:
        """``cfg`` with one recipe changed to each of its other values, labelled
        ``"name=value"``. ``slow``: only the slow recipes (True), only the others (False),
        or all (None)."""
        variants = []
        for name, values in self.recipes.items():
            if slow is not None and (name in self.slow_recipes) != slow:
                continue
            for value in values:
                if cfg.options.get(name) != value:
                    variants.append((f"{name}={value}", cfg.with_options({name: value})))
        return variants

    def calibration_variants(self, cfg: TuneConfig) -> list[tuple[str, TuneConfig]]:
        """``cfg`` with every op's activation algorithm switched to each other algorithm
        the space allows (ops that don't allow it keep theirs), labelled by algorithm."""
        current = {c.activation.algorithm for c in cfg.ops.values() if c.quantized and c.activation}
        algorithms = dict.fromkeys(
            choice.activation.algorithm
            for key in self.tunable_ops
            for choice in self.choices[key]
            if choice.quantized and choice.activation is not None
        )
        variants = []
        for algorithm in algorithms:
            if algorithm in current:
                continue
            changes = {}
            for key in self.tunable_ops:
                op = cfg.ops[key]
                if not op.quantized or op.activation is None:
                    continue
                wanted = replace(op, activation=replace(op.activation, algorithm=algorithm))
                if wanted in self.choices[key]:
                    changes[key] = wanted
            if changes:
                variants.append((algorithm, cfg.with_ops(changes)))
        return variants

    def wider(self, key: OpKey, choice: OpConfig) -> OpConfig | None:
        """The next wider quantized choice of op ``key`` than ``choice``, or ``None``.

        Wider means more integer bits in the same mode (int4 -> int8 weight-only), never
        fewer on any tensor; of the nearest width, the choice most like ``choice`` (same
        algorithm, block size, scheme, granularity), the space's order breaking ties. It
        lets a strategy step an op up one precision before falling back to float, which
        costs an LLM far more speed. Static and dynamic int8 spaces, whose choices all
        have 8-bit weights and activations, have no wider choice.
        """
        if not choice.quantized:
            return None
        width = bit_width(choice)
        if width is None:
            return None
        options: list[tuple[int, OpConfig]] = []
        for candidate in self.choices.get(key, []):
            other = bit_width(candidate) if candidate.mode == choice.mode else None
            if other is None or other == width:
                continue
            if all(b >= a for a, b in zip(width, other)):
                options.append((sum(other), candidate))
        if not options:
            return None
        nearest = min(bits for bits, _ in options)
        closest = [candidate for bits, candidate in options if bits == nearest]
        # max() keeps the first of equals: the space's order breaks ties
        return max(closest, key=lambda candidate: _likeness(candidate, choice))

    def finer(self, key: OpKey, choice: OpConfig) -> OpConfig | None:
        """``choice`` with the next smaller weight ``block_size`` the space allows for op
        ``key`` (same dtype and other options), or ``None``.

        A separate, finer knob than :meth:`wider`: a smaller block costs a little size
        and speed for accuracy within the same bit width. ``auto``'s widening stage tries
        it on what had to stay wider (docs/tuning.md, "Widening", step 4)."""
        weight = choice.weight
        block = weight.options.get("block_size") if weight is not None else None
        if weight is None or not isinstance(block, int):
            return None
        best: tuple[int, OpConfig] | None = None
        for candidate in self.choices.get(key, []):
            other = candidate.weight
            size = other.options.get("block_size") if other is not None else None
            if other is None or not isinstance(size, int) or size >= block:
                continue
            same = replace(other, options={**other.options, "block_size": block})
            if (
                candidate.mode == choice.mode
                and candidate.activation == choice.activation
                and same == weight
                and (best is None or size > best[0])
            ):
                best = (size, candidate)
        return best[1] if best is not None else None

    def op_type_variants(self, op_type: str) -> list[OpConfig]:
        """Distinct configs every tunable op of ``op_type`` allows, the default first."""
        keys = [key for key in self.tunable_ops if key[1] == op_type]
        if not keys:
            return []
        common = list(self.choices[keys[0]])
        for key in keys[1:]:
            allowed = set(self.choices[key])
            common = [cfg for cfg in common if cfg in allowed]
        return common


def _bits(tensor: TensorConfig | None) -> int | None:
    """Integer bits of a tensor's dtype (int4 -> 4, uint8 -> 8); 0 for a float tensor
    (not quantized); None for a dtype without an integer width (fp8, ...)."""
    if tensor is None:
        return 0
    found = re.fullmatch(r"u?int(\d+)", tensor.dtype)
    return int(found.group(1)) if found else None


def bit_width(choice: OpConfig) -> tuple[int, int] | None:
    """(weight bits, activation bits) of a quantized choice (0: a float tensor); None
    for a float choice or a dtype without an integer width."""
    weight, activation = _bits(choice.weight), _bits(choice.activation)
    if weight is None or activation is None or (weight, activation) == (0, 0):
        return None
    return weight, activation


def _likeness(candidate: OpConfig, choice: OpConfig) -> tuple[int, ...]:
    """How much ``candidate`` keeps of ``choice``: per tensor, the algorithm, the extra
    options (block size, ...), the scheme and the granularity, in that order."""
    score: list[int] = []
    for a, b in ((candidate.weight, choice.weight), (candidate.activation, choice.activation)):
        if a is None or b is None:
            score += [0, 0, 0, 0]
            continue
        score += [
            int(a.algorithm == b.algorithm),
            int(dict(a.options) == dict(b.options)),
            int(a.scheme == b.scheme),
            int(a.granularity == b.granularity),
        ]
    return tuple(score)


def build_tuning_space(
    capability: FrameworkCapability,
    config: PostTrainingQuantConfig,
    *,
    has_calib_data: bool,
    extra_options: Mapping[str, Any] | None = None,
) -> TuningSpace:
    """Apply approach, excluded precisions and op overrides to ``capability``."""
    check_approach(capability, config.approach, has_calib_data)
    excluded = set(config.excluded_precisions)
    choices: dict[OpKey, list[OpConfig]] = {}
    fallbacks: dict[OpKey, tuple[str, ...]] = {}
    forced: dict[OpKey, OpConfig] = {}
    float_defaults: dict[OpKey, str] = {}
    override_hits: dict[str, int] = {}

    for key in capability.opwise:
        name, op_type = key
        fallbacks[key] = tuple(
            p for p in capability.fallback_precisions(key) if p == "fp32" or p not in excluded
        )
        configs = [
            cfg
            for cfg in capability.op_configs(key)
            if _mode_allowed(cfg.mode, config.approach, has_calib_data)
            and not _uses_excluded(cfg, excluded)
        ]
        default = capability.defaults.get(op_type)
        configs.sort(key=lambda cfg: (cfg.mode != default, _MODE_ORDER.get(cfg.mode or "", 9)))
        if default in FLOAT_PRECISIONS and default in fallbacks[key]:
            float_defaults[key] = default
        preferred = [cfg for cfg in configs if _matches(cfg, config.op_defaults)]
        configs = preferred or configs
        for source, pattern, override in _overrides_for(config, name, op_type):
            override_hits[f"{source}[{pattern!r}]"] = (
                override_hits.get(f"{source}[{pattern!r}]", 0) + 1
            )
            float_defaults.pop(key, None)  # the user said what this op should be
            precision = override if isinstance(override, str) else override.get("precision")
            if precision in FLOAT_PRECISIONS:
                forced[key] = OpConfig.fallback(precision)
                continue
            if isinstance(override, dict):
                before = len(configs)
                configs = [cfg for cfg in configs if _matches(cfg, override)]
                if before and not configs:
                    raise ConfigError(
                        f"{source}[{pattern!r}] allows none of the options the "
                        f"{capability.framework} adaptor supports for op {name} ({op_type})",
                        hint=f"run `lpq capability show {capability.framework}` to see them",
                    )
        if not configs and key not in forced:
            forced[key] = OpConfig.fallback("fp32")
        choices[key] = configs or [forced[key]]

    for source, overrides in (
        ("op_type_dict", config.op_type_dict),
        ("op_name_dict", config.op_name_dict),
    ):
        for pattern in overrides:
            if f"{source}[{pattern!r}]" not in override_hits:
                raise ConfigError(
                    f"{source}[{pattern!r}] matches no quantizable op of the model",
                    hint="check the op type / name (lpq lists them in the tuning report)",
                )

    ruled_out = _keep_valid_mix(capability, choices, fallbacks, forced)
    options: dict[str, Any] = dict(extra_options or {})
    if config.quant_format != "default":
        options["quant_format"] = config.quant_format
    if config.latency_aware is not None:
        options["latency_aware"] = config.latency_aware
    recipes = {}
    # Recipes act on integer-kernel (static / dynamic) ops: latency-aware int8, SmoothQuant,
    # bias correction, ... A space with none of those (weight-only LLM quantization) would
    # spend trials on recipes that change nothing.
    integer_ops = any(
        cfg.mode in ("static", "dynamic")
        for configs in [*choices.values(), *([c] for c in forced.values())]
        for cfg in configs
        if cfg.quantized
    )
    applicable = capability.recipes if integer_ops else {}
    for name, values in applicable.items():
        if name not in options:  # a value the user or a backend profile set is fixed
            options[name] = values[0]
            recipes[name] = values
    return TuningSpace(
        choices,
        fallbacks,
        forced,
        config.calibration_sampling_size,
        options,
        ruled_out,
        recipes,
        {key: p for key, p in float_defaults.items() if key not in forced and choices[key]},
        frozenset(name for name in capability.slow_recipes if name in recipes),
    )


def _keep_valid_mix(
    capability: FrameworkCapability,
    choices: dict[OpKey, list[OpConfig]],
    fallbacks: dict[OpKey, tuple[str, ...]],
    forced: dict[OpKey, OpConfig],
) -> list[RuledOut]:
    """Keep the space inside one ``valid_mixed_precision`` combination, in place.

    Every config a strategy can build mixes the precisions of the space, so a space whose
    precisions all belong to one combination can never leave it. The combination kept is
    the one that keeps the most quantized precisions, then the most float ones (the first
    listed on a tie).
    """
    combinations = capability.valid_mixed_precision
    if not combinations:
        return []
    quantized = {cfg.precision for cfgs in choices.values() for cfg in cfgs if cfg.quantized}
    floats = {p for fb in fallbacks.values() for p in fb} | {"fp32"}
    chosen = max(
        combinations,
        key=lambda c: (len(quantized & set(c)), len(floats & set(c)), -combinations.index(c)),
    )
    allowed = set(chosen)
    label = f"valid_mixed_precision '{' + '.join(chosen)}'"
    removed: dict[str, tuple[dict[str, None], set[OpKey]]] = {}
    for key in choices:
        for precision in {cfg.precision for cfg in choices[key]} | set(fallbacks[key]):
            if precision not in allowed and key not in forced:
                types, ops = removed.setdefault(precision, ({}, set()))
                types[key[1]] = None
                ops.add(key)
        if key in forced:
            if forced[key].precision not in allowed:
                raise ConfigError(
                    f"op {key[0]} ({key[1]}) is set to {forced[key].precision}, which the "
                    f"target's {label} does not allow",
                    hint=f"use one of {', '.join(chosen)} for it",
                )
            continue
        fallbacks[key] = tuple(p for p in fallbacks[key] if p in allowed)
        if not fallbacks[key]:
            raise ConfigError(
                f"{label} leaves op {key[0]} ({key[1]}) no float precision to fall back to",
                hint="add a float precision (fp32, fp16 or bf16) to that combination",
            )
        kept = [cfg for cfg in choices[key] if cfg.precision in allowed]
        if not kept:
            forced[key] = OpConfig.fallback(fallbacks[key][0])
            kept = [forced[key]]
        choices[key] = kept
    return [
        RuledOut(label, precision, tuple(types), len(ops))
        for precision, (types, ops) in removed.items()
    ]


def _mode_allowed(mode: str | None, approach: str, has_calib_data: bool) -> bool:
    if mode == "static" and not has_calib_data:
        return False
    if approach == "auto":
        return mode in ("static", "dynamic")
    return mode == approach


def _uses_excluded(cfg: OpConfig, excluded: set[str]) -> bool:
    dtypes = {cfg.precision}
    dtypes |= {t.dtype for t in (cfg.weight, cfg.activation) if t is not None}
    return bool(dtypes & excluded)


def _overrides_for(
    config: PostTrainingQuantConfig, name: str, op_type: str
) -> list[tuple[str, str, Any]]:
    found: list[tuple[str, str, Any]] = []
    if op_type in config.op_type_dict:
        found.append(("op_type_dict", op_type, config.op_type_dict[op_type]))
    for pattern, override in config.op_name_dict.items():
        if re.fullmatch(pattern, name):
            found.append(("op_name_dict", pattern, override))
    return found


def _tensor_matches(tensor: TensorConfig | None, allowed: Mapping[str, Any]) -> bool:
    if tensor is None:
        return True
    for field_name, values in allowed.items():
        values = values if isinstance(values, list | tuple) else [values]
        actual = (
            tensor.options.get(field_name)
            if field_name in _EXTRA_FIELDS
            else getattr(tensor, field_name)
        )
        if actual not in values:
            return False
    return True


def _matches(cfg: OpConfig, override: Mapping[str, Any]) -> bool:
    return _tensor_matches(cfg.weight, override.get("weight", {})) and _tensor_matches(
        cfg.activation, override.get("activation", {})
    )
