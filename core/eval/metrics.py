"""Built-in metrics: framework-neutral, numpy only.

Adaptors hand each batch's outputs to ``update`` as numpy: one array, or a list of arrays
for multi-output models, in which case metrics use the first output. Labels are class
indices (``(N,)``) or one-hot / reference outputs of the same shape as the predictions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import DataError


def _first(value: Any) -> np.ndarray:
    if isinstance(value, list | tuple):
        if not value:
            raise DataError("the model produced no outputs to score")
        value = value[0]
    if isinstance(value, dict):
        value = next(iter(value.values()))
    return np.asarray(value)


def _scores_and_targets(preds: Any, labels: Any, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Class scores ``(positions, classes)`` and one class index per position.

    A classifier's output ``(N, C)`` with labels ``(N,)`` has N positions; a sequence
    model's ``(N, T, C)`` with labels ``(N, T)``, or with reference outputs of its own
    shape, has N*T. Outputs like ``(N, C, 1, 1)`` with labels ``(N,)`` are one position
    per sample. Reference outputs (the fp32 model's, or one-hot labels) give their argmax.
    """
    scores, target = _first(preds), _first(labels)
    if scores.ndim == 0 or (scores.ndim == 1 and target.shape != scores.shape):
        raise DataError(
            f"{metric}: the model's output has shape {scores.shape}: no class scores to rank",
            hint="use the 'cosine' or 'mse' metric for outputs that are not class scores",
        )
    if target.ndim == 1 and scores.ndim > 1 and len(target) == len(scores):
        return scores.reshape(len(scores), -1), target.astype(np.int64)
    if target.shape == scores.shape:
        if scores.ndim == 1:  # one score per sample: nothing to rank
            raise DataError(
                f"{metric}: the model's output has shape {scores.shape}: no class scores to rank",
                hint="use the 'cosine' or 'mse' metric for outputs that are not class scores",
            )
        target = target.argmax(axis=-1)
    if target.shape != scores.shape[:-1]:
        raise DataError(
            f"{metric}: the model's output has shape {scores.shape} but the labels have shape "
            f"{target.shape}",
            hint="give one class index per sample (or per position of a sequence output), "
            "or labels shaped like the output",
        )
    return scores.reshape(-1, scores.shape[-1]), target.reshape(-1).astype(np.int64)


def _require_labels(metric: str, labels: Any) -> None:
    if labels is None:
        raise DataError(
            f"the {metric!r} metric needs labels, but the evaluation data has none",
            hint="yield (inputs, labels) from the dataloader, add a 'labels' array to the "
            ".npz file, or use the 'agreement' metric to compare with the fp32 model",
        )


class TopK:
    """Fraction of samples whose label is among the ``k`` highest-scoring classes."""

    higher_is_better = True

    def __init__(self, k: int = 1) -> None:
        self.k = k
        self.name = "top1" if k == 1 else f"top{k}"
        self.reset()

    def reset(self) -> None:
        self.correct = 0
        self.total = 0

    def update(self, preds: Any, labels: Any) -> None:
        _require_labels(self.name, labels)
        scores, target = _scores_and_targets(preds, labels, self.name)
        top = np.argsort(-scores, axis=1)[:, : self.k]
        self.correct += int((top == target[:, None]).any(axis=1).sum())
        self.total += len(target)

    def result(self) -> float:
        return self.correct / self.total if self.total else 0.0


class Agreement(TopK):
    """Top-1 agreement with reference outputs (the fp32 model's, when there are no labels):
    the fraction of positions whose highest-scoring class (argmax of the last axis) is the
    reference's. One position per sample for a classifier, one per time step or pixel for
    ``(N, T, C)`` or ``(N, H, W, C)`` outputs."""

    def __init__(self) -> None:
        super().__init__(k=1)
        self.name = "agreement"


class _Mean:
    """A metric that is the mean of per-value (or per-sample) scores over all batches."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.sum = 0.0
        self.count = 0

    def result(self) -> float:
        return self.sum / self.count if self.count else 0.0


class MSE(_Mean):
    """Mean squared error between predictions and targets (lower is better)."""

    name = "mse"
    higher_is_better = False

    def update(self, preds: Any, labels: Any) -> None:
        _require_labels(self.name, labels)
        p, t = _first(preds).astype(np.float64), _first(labels).astype(np.float64)
        if p.size != t.size:
            raise DataError(f"mse: predictions have {p.size} values, targets {t.size}")
        self.sum += float(np.square(p.reshape(-1) - t.reshape(-1)).sum())
        self.count += p.size


class CosineSimilarity(_Mean):
    """Mean per-sample cosine similarity between predictions and targets.

    For outputs of one value per sample (``(N,)`` or ``(N, 1)``), where a per-sample cosine
    would only compare signs, each batch's values form the vector, weighted by its size.
    """

    name = "cosine"
    higher_is_better = True

    def update(self, preds: Any, labels: Any) -> None:
        _require_labels(self.name, labels)
        p = _first(preds).astype(np.float64)
        p = p.reshape(len(p), -1)
        t = _first(labels).astype(np.float64).reshape(p.shape)
        if p.shape[1] == 1:
            p, t = p.reshape(1, -1), t.reshape(1, -1)
            weight = p.shape[1]
        else:
            weight = 1
        denom = np.linalg.norm(p, axis=1) * np.linalg.norm(t, axis=1)
        sims = np.where(denom > 0, (p * t).sum(axis=1) / np.maximum(denom, 1e-30), 1.0)
        self.sum += float(sims.sum()) * weight
        self.count += len(sims) * weight


class F1:
    """Macro-averaged F1 over classes (binary F1 when there are two classes)."""

    name = "f1"
    higher_is_better = True

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.preds: list[np.ndarray] = []
        self.labels: list[np.ndarray] = []

    def update(self, preds: Any, labels: Any) -> None:
        _require_labels(self.name, labels)
        scores = _first(preds)
        scores = scores.reshape(len(scores), -1)
        if scores.shape[1] == 1:
            predicted = (scores[:, 0] > 0.5).astype(np.int64)
        else:
            predicted = scores.argmax(axis=1)
        self.preds.append(predicted)
        self.labels.append(_scores_and_targets(scores, labels, self.name)[1])

    def result(self) -> float:
        if not self.preds:
            return 0.0
        pred, true = np.concatenate(self.preds), np.concatenate(self.labels)
        classes = np.union1d(pred, true)
        if len(classes) == 2 and set(classes.tolist()) == {0, 1}:
            classes = np.array([1])
        scores = []
        for cls in classes:
            tp = float(((pred == cls) & (true == cls)).sum())
            fp = float(((pred == cls) & (true != cls)).sum())
            fn = float(((pred != cls) & (true == cls)).sum())
            scores.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0)
        return float(np.mean(scores))


BUILTIN_METRICS = {
    "top1": lambda: TopK(1),
    "accuracy": lambda: TopK(1),
    "top5": lambda: TopK(5),
    "topk": TopK,
    "agreement": Agreement,
    "mse": MSE,
    "cosine": CosineSimilarity,
    "f1": F1,
}
