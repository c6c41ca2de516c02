"""The user-facing configuration of a quantization / tuning run.

Someone coming from Intel Neural Compressor will recognise the shape:
``PostTrainingQuantConfig(approach=..., op_type_dict=..., accuracy_criterion=...,
tuning_criterion=...)``. Every value is validated here, so mistakes surface before any
model is touched.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .errors import ConfigError
from .plan.tune_config import FLOAT_PRECISIONS

Approach = Literal["auto", "static", "dynamic", "weight_only"]
Objective = Literal["performance", "modelsize", "footprint"]
ExitPolicy = Literal["first_hit", "best"]

_APPROACHES = ("auto", "static", "dynamic", "weight_only")
_OBJECTIVES = ("performance", "modelsize", "footprint")
_EXIT_POLICIES = ("first_hit", "best")
_FORMATS = ("default", "qdq", "qoperator")
_TENSOR_FIELDS = (
    "dtype",
    "scheme",
    "granularity",
    "algorithm",
    "block_size",
    "bits",
    "reduce_range",
)


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")


@dataclass
class AccuracyCriterion:
    """How much accuracy the quantized model may lose against the fp32 baseline.

    ``relative``: ``0.01`` allows 1% of the baseline; ``absolute``: 0.01 allows 0.01 of
    the metric's units. ``higher_is_better`` defaults to the metric's own direction.
    """

    tolerable_loss: float = 0.01
    criterion: Literal["relative", "absolute"] = "relative"
    higher_is_better: bool | None = None

    def __post_init__(self) -> None:
        _choice("accuracy criterion", self.criterion, ("relative", "absolute"))
        loss = self.tolerable_loss
        if not isinstance(loss, int | float) or math.isnan(loss) or loss < 0:
            raise ConfigError(
                f"tolerable loss must be a number >= 0, not {loss!r}",
                hint="e.g. 0.01 for 1% relative loss",
            )
        if self.criterion == "relative" and loss >= 1:
            raise ConfigError(
                f"a relative tolerable loss must be below 1 (100%), not {loss}",
                hint="0.01 means 1%; use criterion='absolute' for a loss in metric units",
            )

    def goal(self, baseline: float, higher_is_better: bool) -> float:
        """The worst accuracy still within tolerance of ``baseline``."""
        if self.criterion == "relative":
            margin = abs(baseline) * self.tolerable_loss
        else:
            margin = self.tolerable_loss
        return baseline - margin if higher_is_better else baseline + margin

    def shortfall(self, baseline: float, accuracy: float, higher_is_better: bool) -> float:
        """How far ``accuracy`` falls short of the goal, in metric units (<= 0: within it)."""
        goal = self.goal(baseline, higher_is_better)
        return goal - accuracy if higher_is_better else accuracy - goal

    def meets(self, baseline: float, accuracy: float, higher_is_better: bool) -> bool:
        """Whether ``accuracy`` is within tolerance of ``baseline``."""
        if math.isnan(accuracy):
            return False
        return self.shortfall(baseline, accuracy, higher_is_better) <= 1e-12


@dataclass
class TuningCriterion:
    """How tuning searches and when it stops.

    ``exit_policy="first_hit"`` stops at the first config that meets the accuracy goal;
    ``"best"`` keeps searching (within ``max_trials`` / ``timeout`` seconds) for the best
    ``objective`` among configs that meet it.
    """

    strategy: str = "auto"
    max_trials: int = 50
    timeout: float = 0.0
    objective: Objective = "performance"
    exit_policy: ExitPolicy = "first_hit"
    seed: int = 1978
    strategy_options: dict[str, Any] = field(default_factory=dict)
    #: Trials run at once. 1 runs them in this process; more use ``executor``.
    workers: int = 1
    #: ``"auto"`` (serial for one worker, else a local process pool), ``"serial"``,
    #: ``"process"``, ``"ray"``, or one a plugin registered.
    executor: str = "auto"
    #: Passed to the executor, e.g. ``{"address": "ray://head:10001"}`` for Ray.
    executor_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ConfigError(f"workers must be a whole number >= 1, not {self.workers!r}")
        _choice("objective", self.objective, _OBJECTIVES)
        _choice("exit policy", self.exit_policy, _EXIT_POLICIES)
        if not isinstance(self.max_trials, int) or self.max_trials < 1:
            raise ConfigError(f"max_trials must be a whole number >= 1, not {self.max_trials!r}")
        if self.timeout < 0:
            raise ConfigError(f"timeout must be >= 0 seconds (0: none), not {self.timeout}")


@dataclass
class PostTrainingQuantConfig:
    """What to quantize and how; the search itself is set by the two criteria.

    ``op_type_dict`` / ``op_name_dict`` override the capability per op type or per op
    name (names are regular expressions matched in full). A value is either a float
    precision (``"fp32"``, ``"bf16"``, ``"fp16"``: keep those ops unquantized) or a dict
    restricting the options, e.g. ``{"activation": {"algorithm": ["kl"]},
    "weight": {"granularity": ["per_tensor"]}}``.
    """

    approach: Approach = "auto"
    quant_format: str = "default"
    calibration_sampling_size: int = 100
    op_type_dict: dict[str, Any] = field(default_factory=dict)
    op_name_dict: dict[str, Any] = field(default_factory=dict)
    excluded_precisions: list[str] = field(default_factory=list)
    #: Preferred options for every op, e.g. ``{"activation": {"algorithm": ["kl"]}}``. Unlike
    #: the op dicts this is lenient: an op that allows none of them keeps its own options.
    op_defaults: dict[str, Any] = field(default_factory=dict)
    backend: str | None = None
    framework: str | None = None
    #: Keep in fp32 what int8 makes slower on this machine (adaptors that declare the
    #: ``latency_aware`` recipe measure it). ``None``: on for ``lpq.quantize``, searched by
    #: ``lpq.fit``; ``True`` / ``False``: fixed.
    latency_aware: bool | None = None
    #: Extra capability YAML files merged into the adaptor's (e.g. int4 for an op type):
    #: what they allow becomes more choices for the op types the adaptor reports.
    capability_files: list[str] = field(default_factory=list)
    #: Options for the adaptor, fixed for every trial (the adaptor's docs list them, e.g.
    #: lpq-onnxrt's ``latency_batch_size``); they reach it in ``tune_cfg.options``, over a
    #: backend profile's, and fix a recipe of the same name instead of searching it.
    adaptor_options: dict[str, Any] = field(default_factory=dict)
    accuracy_criterion: AccuracyCriterion = field(default_factory=AccuracyCriterion)
    tuning_criterion: TuningCriterion = field(default_factory=TuningCriterion)

    def __post_init__(self) -> None:
        self.capability_files = [str(file) for file in self.capability_files]
        check_adaptor_option_syntax(self.adaptor_options)
        _choice("approach", self.approach, _APPROACHES)
        _choice("quant_format", self.quant_format, _FORMATS)
        if self.calibration_sampling_size < 1:
            raise ConfigError(
                f"calibration_sampling_size must be >= 1, not {self.calibration_sampling_size}"
            )
        for source, overrides in (
            ("op_type_dict", self.op_type_dict),
            ("op_name_dict", self.op_name_dict),
        ):
            for key, value in overrides.items():
                _check_override(source, key, value)
        if self.op_defaults:
            if not isinstance(self.op_defaults, dict) or "precision" in self.op_defaults:
                raise ConfigError("op_defaults must be a dict of 'weight'/'activation' options")
            _check_override("op_defaults", "*", self.op_defaults)
        for pattern in self.op_name_dict:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(
                    f"op_name_dict key {pattern!r} is not a valid regular expression ({exc})"
                ) from None

    def to_json(self) -> dict[str, Any]:
        """A plain-JSON form, written into the tuning history."""
        return asdict(self)

    def search_json(self) -> dict[str, Any]:
        """What decides which trials a run proposes and what they mean: the run key.

        The budget (``max_trials``, ``timeout``), the exit policy and how trials are
        executed are left out, so a re-run with a larger budget, another exit policy or
        more workers continues the same run instead of starting over.
        """
        data = self.to_json()
        for budget in (
            "max_trials",
            "timeout",
            "exit_policy",
            "workers",
            "executor",
            "executor_options",
        ):
            data["tuning_criterion"].pop(budget, None)
        return data


def _check_override(source: str, key: str, value: Any) -> None:
    if isinstance(value, str):
        if value not in FLOAT_PRECISIONS:
            raise ConfigError(
                f"{source}[{key!r}] = {value!r}: a string override must be a float precision "
                f"({', '.join(FLOAT_PRECISIONS)})",
                hint="use a dict such as {'activation': {'algorithm': ['kl']}} to restrict options",
            )
        return
    if not isinstance(value, dict):
        raise ConfigError(f"{source}[{key!r}] must be a precision string or a dict")
    for tensor, fields in value.items():
        if tensor not in ("weight", "activation", "precision"):
            raise ConfigError(
                f"{source}[{key!r}] has unknown key {tensor!r}",
                hint="use 'weight', 'activation' or 'precision'",
            )
        if tensor == "precision":
            continue
        if not isinstance(fields, dict):
            raise ConfigError(f"{source}[{key!r}][{tensor!r}] must be a dict of option lists")
        for name in fields:
            if name not in _TENSOR_FIELDS:
                raise ConfigError(
                    f"{source}[{key!r}][{tensor!r}] has unknown option {name!r}",
                    hint=f"options: {', '.join(_TENSOR_FIELDS)}",
                )


def check_adaptor_option_syntax(options: dict[str, Any]) -> None:
    """Adaptor option names are lower_case_with_underscores and values plain JSON scalars
    (they go into tune_cfg JSON, history and run keys)."""
    for key, value in options.items():
        if not isinstance(key, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", key):
            raise ConfigError(
                f"adaptor option name {key!r} is not lower_case_with_underscores",
                hint="the adaptor's docs list its options (e.g. docs/onnxrt.md)",
            )
        if not isinstance(value, str | int | float | bool | type(None)):
            raise ConfigError(
                f"adaptor option {key} = {value!r}: values are strings, numbers, "
                "booleans or null",
            )
