"""lpq's own plugin: the built-in metrics, strategies and executors, registered like
anyone else's."""

from __future__ import annotations

from typing import Any

from ..eval.lm_metrics import Perplexity, TokenAgreement, TokenKL
from ..eval.metrics import BUILTIN_METRICS
from ..eval.task_metrics import TASK_METRICS
from ..hookspecs import hookimpl
from ..strategy import BUILTIN_STRATEGIES
from ..tuning.executors import ProcessPoolTrialExecutor, SerialExecutor
from .types import RegisterExecutor, RegisterMetric, RegisterStrategy


@hookimpl
def lpq_register_metrics(register: RegisterMetric) -> None:
    for name, factory in BUILTIN_METRICS.items():
        register(name, factory)
    for name, factory in TASK_METRICS.items():
        register(name, factory)
    register("perplexity", Perplexity)  # language models: logits against token ids
    register("token_agreement", TokenAgreement)  # next-token top-1 against fp32's logits
    register("token_kl", TokenKL)  # KL(fp32 || model) of next-token distributions


@hookimpl
def lpq_register_strategies(register: RegisterStrategy) -> None:
    for name, factory in BUILTIN_STRATEGIES.items():
        register(name, factory)


def _ray_executor(**options: Any) -> Any:
    from ..tuning.ray_executor import RayExecutor  # imports ray only when chosen

    return RayExecutor(**options)


@hookimpl
def lpq_register_executors(register: RegisterExecutor) -> None:
    register("serial", SerialExecutor)
    register("process", ProcessPoolTrialExecutor)
    register("ray", _ray_executor)
