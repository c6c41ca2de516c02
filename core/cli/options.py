"""Command-line options several commands share: ``KEY=VALUE`` pairs (``--option``,
``--strategy-option``, ``--metric-option``) and the fidelity metric (``--metric`` of
`lpq quantize` and `lpq diagnose`), parsed and checked one way everywhere."""

from __future__ import annotations

import contextlib
from typing import Any

import click


def parse_options(pairs: tuple[str, ...], flag: str = "--option") -> dict[str, Any]:
    """``("latency_batch_size=8", ...)`` -> ``{"latency_batch_size": 8}`` (VALUE read as
    YAML; a pair without ``=`` is a usage error naming ``flag``)."""
    import yaml

    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint=flag)
        try:
            options[key.strip()] = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            options[key.strip()] = text
    return options


def key_values(flag: str, dest: str, help: str) -> Any:
    """A repeatable ``flag KEY=VALUE`` option parsed into the dict ``dest``."""
    return click.option(
        flag,
        dest,
        multiple=True,
        metavar="KEY=VALUE",
        callback=lambda ctx, param, value: parse_options(value, flag),
        help=help,
    )


#: ``--metric`` where it scores a model against the fp32 model's outputs.
FIDELITY_METRIC = click.option(
    "--metric",
    help="Fidelity metric against the fp32 model's outputs (detection_f1, ctc_exact, "
    "top1_agreement, cosine, ...; `lpq plugins list -v` lists them). Default: chosen from "
    "the model's outputs, and said which.",
)

METRIC_OPTION = key_values(
    "--metric-option",
    "metric_options",
    "An option of --metric's, e.g. --metric detection_f1 --metric-option "
    "score_threshold=0.5 for a detector read at 0.5 (repeat; VALUE is read as YAML).",
)


def metric_with_options(pm: Any, metric: str | None, options: dict[str, Any]) -> Any:
    """The metric ``--metric`` names, made with its ``--metric-option`` values, or None
    without options; checked before any work (a wrong option is a ConfigError listing
    those it takes). Its name carries the options, so a tuning run keyed by it is not
    resumed from a run scored another way."""
    if not options:
        return None
    if metric is None:
        raise click.UsageError(
            "--metric-option needs --metric: name the metric whose options these are "
            "(e.g. --metric detection_f1 --metric-option score_threshold=0.5)"
        )
    scorer = pm.create_metric(metric, **options)
    shown = ",".join(f"{key}={value}" for key, value in options.items())
    with contextlib.suppress(AttributeError):  # a metric whose name is read-only keeps it
        scorer.name = f"{scorer.name}[{shown}]"
    return scorer
