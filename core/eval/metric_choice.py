"""Which metric scores a model against the fp32 model's outputs when the data has no
labels: a task metric where the outputs say which task it is, else a generic one.

Its own module because it needs both the generic metrics (:mod:`.metrics`) and the task
metrics (:mod:`.task_metrics`, which build on the generic ones).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .metrics import _first
from .task_metrics import choose_task_metric


def label_free_metric(
    reference: Any, task: str | None = None, names: Sequence[str] | None = None
) -> tuple[str, str]:
    """The metric to compare a model with reference outputs when the data has no labels,
    chosen from the reference outputs (one batch of the fp32 model's), and why (said to
    the user).

    A task metric where the outputs say unambiguously which task the model does
    (:func:`lpq.eval.task_metrics.choose_task_metric`: a YOLO or SSD detector ->
    ``detection_f1``, a probability map -> ``mask_iou``, ...), or the one for ``task``
    when the caller names it (``"ctc"`` for a recognizer); ``names`` (the outputs' names,
    from the adaptor's ``lpq_output_names``) settle an output named as hidden states or an
    embedding. Otherwise, as before task
    metrics: class scores on the last axis (at least 2-D, two or more classes) get
    per-position top-1 agreement; anything else (a regression value, an embedding of
    shape ``(N,)``) gets cosine similarity, which works for any shape.
    """
    choice = choose_task_metric(reference, task=task, names=names)
    if choice is not None:
        return choice.metric, choice.reason
    output = _first(reference)
    if output.ndim >= 2 and output.shape[-1] >= 2:
        positions = "" if output.ndim == 2 else " at every position"
        return "agreement", (
            f"the output {tuple(output.shape)} looks like class scores: accuracy is the share "
            f"of samples{positions} whose top class matches the fp32 model's"
        )
    return "cosine", (
        f"the output {tuple(output.shape)} holds no class scores: accuracy is the cosine "
        "similarity with the fp32 model's outputs"
    )


def fidelity_metric(
    reference: Any,
    metric: str | None = None,
    options: Mapping[str, Any] | None = None,
    *,
    task: str | None = None,
    names: Sequence[str] | None = None,
    named: str = "named with --metric",
) -> tuple[str, str]:
    """The metric that scores a model against ``reference`` outputs, and why: ``metric``
    as named (``named``, with its ``options`` shown), else :func:`label_free_metric`'s
    choice. One rule for ``lpq quantize``'s fidelity gate and ``lpq diagnose``."""
    if metric is None:
        return label_free_metric(reference, task=task, names=names)
    shown = ", ".join(f"{key}={value}" for key, value in (options or {}).items())
    return metric, named + (f" ({shown})" if shown else "")
