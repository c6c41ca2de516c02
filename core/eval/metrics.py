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


def _class_indices(labels: Any, preds: np.ndarray) -> np.ndarray:
    labels = _first(labels)
    if labels.shape == preds.shape and preds.ndim > 1:
        return labels.argmax(axis=-1).reshape(-1)
    return labels.reshape(-1).astype(np.int64)


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
        scores = _first(preds).reshape(len(_first(preds)), -1)
        target = _class_indices(labels, scores)
        if len(target) != len(scores):
            raise DataError(
                f"{len(scores)} predictions but {len(target)} labels in a batch",
                hint="give one label per sample",
            )
        top = np.argsort(-scores, axis=1)[:, : self.k]
        self.correct += int((top == target[:, None]).any(axis=1).sum())
        self.total += len(target)

    def result(self) -> float:
        return self.correct / self.total if self.total else 0.0


class Agreement(TopK):
    """Top-1 agreement with reference outputs (the fp32 model's, when there are no labels)."""

    def __init__(self) -> None:
        super().__init__(k=1)
        self.name = "agreement"


class MSE:
    """Mean squared error between predictions and targets (lower is better)."""

    name = "mse"
    higher_is_better = False

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.sum = 0.0
        self.count = 0

    def update(self, preds: Any, labels: Any) -> None:
        _require_labels(self.name, labels)
        p, t = _first(preds).astype(np.float64), _first(labels).astype(np.float64)
        if p.size != t.size:
            raise DataError(f"mse: predictions have {p.size} values, targets {t.size}")
        self.sum += float(np.square(p.reshape(-1) - t.reshape(-1)).sum())
        self.count += p.size

    def result(self) -> float:
        return self.sum / self.count if self.count else 0.0


class CosineSimilarity:
    """Mean per-sample cosine similarity between predictions and targets."""

    name = "cosine"
    higher_is_better = True

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.sum = 0.0
        self.count = 0

    def update(self, preds: Any, labels: Any) -> None:
        _require_labels(self.name, labels)
        p = _first(preds).astype(np.float64)
        p = p.reshape(len(p), -1)
        t = _first(labels).astype(np.float64).reshape(p.shape)
        denom = np.linalg.norm(p, axis=1) * np.linalg.norm(t, axis=1)
        sims = np.where(denom > 0, (p * t).sum(axis=1) / np.maximum(denom, 1e-30), 1.0)
        self.sum += float(sims.sum())
        self.count += len(sims)

    def result(self) -> float:
        return self.sum / self.count if self.count else 0.0


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
        self.labels.append(_class_indices(labels, scores))

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
