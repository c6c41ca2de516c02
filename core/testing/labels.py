"""Check that ``lpq_evaluate`` scores against the labels it is given (issue 28: an evaluate
that scored the model against its own predictions passed the suite, and every trial then
"kept 100% accuracy").

The sample model is evaluated twice over ``lpq_sample_data``: with its labels, and with
the same labels deranged (every sample gets another sample's label, chosen so that as few
as possible keep their class). An evaluate that reads the labels scores an accurate model
lower the second time; one that ignores them scores both the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..eval.data import split_batch
from ..eval.metrics import TopK
from .introduced import ConformanceFailure, not_run
from .subject import Subject

#: The sample model must score at least this top-1 on its own data for the check to say
#: anything (a chance-level model scores the same on any labels).
MIN_ACCURACY = 0.5


def deranged(labels: np.ndarray) -> np.ndarray:
    """``labels`` permuted so that no sample keeps its own label entry, and (for class
    indices) as few as possible keep their class: sort by class and shift by the largest
    class's size, so each sample gets a label from another class's block."""
    count = len(labels)
    if labels.ndim != 1:
        return np.roll(labels, 1, axis=0)
    order = np.argsort(labels, kind="stable")
    _, sizes = np.unique(labels, return_counts=True)
    shift = int(sizes.max()) if int(sizes.max()) < count else 1
    result = np.empty_like(labels)
    result[order] = labels[np.roll(order, shift)]
    return result


def _relabelled(batches: list[tuple[Any, Any]], labels: np.ndarray) -> list[tuple[Any, Any]]:
    out, start = [], 0
    for inputs, original in batches:
        size = len(np.asarray(original))
        out.append((inputs, labels[start : start + size]))
        start += size
    return out


def check_evaluate_uses_labels(subject: Subject) -> None:
    """Deranged labels score an accurate model lower than its true labels."""
    batches = [split_batch(item) for item in subject.data]
    if any(labels is None for _, labels in batches):
        not_run("lpq_sample_data has no labels")
        return
    labels = np.concatenate([np.asarray(labels) for _, labels in batches])
    if np.unique(labels).size < 2:
        not_run("every sample of lpq_sample_data has the same label")
        return
    true = subject.pm.evaluate(subject.framework, subject.model, batches, [TopK(1)]).accuracy
    if true < MIN_ACCURACY:
        not_run(
            f"the sample model scores top-1 {true:.2f} on lpq_sample_data (needs at least "
            f"{MIN_ACCURACY}): give it labels it predicts, e.g. its own argmax"
        )
        return
    relabelled = _relabelled(batches, deranged(labels))
    permuted = subject.pm.evaluate(subject.framework, subject.model, relabelled, [TopK(1)])
    if not permuted.accuracy < true:
        raise ConformanceFailure(
            f"lpq_evaluate scored top-1 {permuted.accuracy:.3f} with the eval set's labels "
            f"deranged and {true:.3f} with the true labels: it must score predictions "
            "against the labels it is given (not against the model's own predictions)"
        )
