"""Task metrics for label-free use: the quantized model's outputs scored against the fp32
model's outputs (the "labels" are the fp32 outputs, as :class:`lpq.eval.data.ReferenceLoader`
pairs them), and the rules that pick one from the outputs' shapes and values.

Why: a single generic score (output cosine, argmax agreement) hides what a user of the
model sees. A detector kept cosine 0.9988 with detection F1 0.35; argmax "agreement" over
a YOLO head's 2100 anchors scored 0.03-0.27 for every trial (issue 26). Each task gets the
score its users would compute, and :func:`choose_task_metric` picks one only where the
outputs say unambiguously which task it is; otherwise it returns ``None`` and the caller
falls back (:func:`lpq.eval.metric_choice.label_free_metric`) or asks for ``--metric``.

Registered names (``lpq_register_metrics`` in :mod:`lpq.plugins.builtin`):
``detection_f1``, ``detection_map50`` (:mod:`.task_detection`), ``ctc_exact``,
``ctc_char_agreement`` (:mod:`.task_sequence`), ``top1_agreement``, ``top5_agreement``,
``mask_iou``, ``regression_fidelity`` (here); embedding cosine is the built-in ``cosine``.
Every metric keeps plain attributes only, so it pickles for ``--workers`` process pools.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ..errors import ConfigError, DataError
from .metrics import TopK
from .task_detection import (
    DetectionF1,
    DetectionMAP50,
    Detections,
    anchor_pair,
    box_iou,
    decode,
    detect_layout,
    gfl_levels,
    in_unit,
    match,
    nms,
    outputs_list,
)
from .task_sequence import CTCCharAgreement, CTCExact, ctc_greedy_decode, edit_distance

__all__ = [
    "TASKS",
    "TASK_METRICS",
    "CTCCharAgreement",
    "CTCExact",
    "DetectionF1",
    "DetectionMAP50",
    "Detections",
    "MaskIoU",
    "MetricChoice",
    "RegressionFidelity",
    "TopKAgreement",
    "box_iou",
    "choose_task_metric",
    "ctc_greedy_decode",
    "decode",
    "detect_layout",
    "edit_distance",
    "match",
    "nms",
]


class TopKAgreement(TopK):
    """Share of samples whose fp32 top-1 class is among the quantized model's ``k`` best
    (``top5_agreement``), or equals its top-1 (``top1_agreement``, same as ``agreement``).
    With real class-index labels it is plain top-k accuracy. Picklable."""

    def __init__(self, k: int = 1) -> None:
        super().__init__(k)
        self.name = f"top{k}_agreement"


def _reference(metric: str, preds: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """First output of the model and of the reference, as float64, same shape."""
    if labels is None:
        raise DataError(
            f"{metric} compares with the fp32 model's outputs, but no reference outputs were given",
            hint="score without labels: lpq then passes the fp32 model's "
            "outputs as labels (or pass them yourself)",
        )
    got = outputs_list(preds)[0].astype(np.float64)
    ref = outputs_list(labels)[0].astype(np.float64)
    if got.shape != ref.shape:
        raise DataError(
            f"{metric}: the model's output {got.shape} and the reference {ref.shape} differ",
            hint=f"{metric} takes the fp32 model's outputs (same shape) as labels; evaluate "
            "without labels",
        )
    return got, ref


class MaskIoU:
    """IoU of the quantized model's masks with the fp32 model's.

    Binary maps ``(B, H, W)``, ``(B, 1, H, W)`` or ``(B, H, W, 1)`` are thresholded at
    ``threshold`` (0.5; maps with values outside [0, 1] are read as logits and cut at 0),
    and the IoU is micro over every pixel of the evaluation set (1.0 when both masks are
    empty everywhere). Multi-class ``(B, C, H, W)`` (or ``(B, H, W, C)``: the class axis is
    the smaller of axis 1 and the last, or ``class_axis``) takes the argmax per pixel and
    returns the mean over classes of each class's IoU accumulated over the set (mIoU).
    Why: text maps (DBNet) and segmentation are used as masks, and argmax "agreement"
    along the width axis or output cosine does not say how much of a mask moved. Picklable.
    """

    name = "mask_iou"
    higher_is_better = True

    def __init__(self, threshold: float = 0.5, class_axis: int | None = None) -> None:
        self.threshold = threshold
        self.class_axis = class_axis
        self.reset()

    def reset(self) -> None:
        self.intersection: dict[int, int] = {}
        self.union: dict[int, int] = {}
        self.binary: bool | None = None

    def _classes(self, scores: np.ndarray, reference: np.ndarray) -> tuple[np.ndarray, bool]:
        """Per-pixel class (0/1 for binary maps) and whether the maps are binary."""
        if scores.ndim < 3:
            raise DataError(
                f"mask_iou: an output of shape {scores.shape} is not a map",
                hint="mask_iou takes (B, H, W), (B, 1, H, W) or (B, C, H, W) maps; use "
                "regression_fidelity or cosine for other outputs",
            )
        axis = self.class_axis
        if axis is None and scores.ndim == 4:
            axis = 1 if scores.shape[1] <= scores.shape[-1] else -1
        if axis is None or scores.shape[axis] == 1:
            squeezed = scores if axis is None else np.take(scores, 0, axis=axis)
            cut = self.threshold
            if self.threshold == 0.5 and (reference.min() < 0 or reference.max() > 1):
                cut = 0.0  # logits: sigmoid(x) > 0.5 <=> x > 0
            return (squeezed > cut).astype(np.int64), True
        return scores.argmax(axis=axis), False

    def update(self, preds: Any, labels: Any) -> None:
        got, ref = _reference(self.name, preds, labels)
        got_cls, binary = self._classes(got, ref)
        ref_cls, _ = self._classes(ref, ref)
        self.binary = binary
        classes = [1] if binary else np.union1d(np.unique(got_cls), np.unique(ref_cls)).tolist()
        for cls in classes:
            g, r = got_cls == cls, ref_cls == cls
            self.intersection[cls] = self.intersection.get(cls, 0) + int((g & r).sum())
            self.union[cls] = self.union.get(cls, 0) + int((g | r).sum())

    def result(self) -> float:
        ious = [self.intersection[c] / u for c, u in self.union.items() if u]
        return float(np.mean(ious)) if ious else 1.0


class RegressionFidelity:
    """``1 - mean|q - f| / (mean|f| + eps)`` over every value of the evaluation set, where
    ``q`` is the quantized model's first output and ``f`` the fp32 model's.

    Higher is better: 1.0 is identical, 0.0 means the error is as large as the outputs
    themselves, and it goes below 0 for worse. Why: unlike cosine it sees a change of scale
    or offset, which regression, depth and score outputs care about. Picklable."""

    name = "regression_fidelity"
    higher_is_better = True

    def __init__(self, eps: float = 1e-12) -> None:
        self.eps = eps
        self.reset()

    def reset(self) -> None:
        self.error = 0.0
        self.magnitude = 0.0
        self.count = 0

    def update(self, preds: Any, labels: Any) -> None:
        got, ref = _reference(self.name, preds, labels)
        self.error += float(np.abs(got - ref).sum())
        self.magnitude += float(np.abs(ref).sum())
        self.count += ref.size

    def result(self) -> float:
        if not self.count:
            return 0.0
        return 1.0 - (self.error / self.count) / (self.magnitude / self.count + self.eps)


#: Every task metric by its registered name (factories take the metric's options).
TASK_METRICS: dict[str, Callable[..., Any]] = {
    "detection_f1": DetectionF1,
    "detection_map50": DetectionMAP50,
    "ctc_exact": CTCExact,
    "ctc_char_agreement": CTCCharAgreement,
    "top1_agreement": partial(TopKAgreement, k=1),
    "top5_agreement": partial(TopKAgreement, k=5),
    "mask_iou": MaskIoU,
    "regression_fidelity": RegressionFidelity,
}

#: What a caller may say the model is (``task=``), and the metric each task gets.
TASKS = {
    "detection": "detection_f1",
    "ctc": "ctc_exact",
    "recognition": "ctc_exact",
    "classification": "agreement",
    "embedding": "cosine",
    "segmentation": "mask_iou",
    "regression": "regression_fidelity",
}


#: Output names that say the output is hidden states or an embedding (rule 8 of
#: :func:`choose_task_metric`), as transformers and sentence-transformers exports name them.
EMBEDDING_NAME = re.compile(r"hidden_state|embedding|pooler_output", re.IGNORECASE)


@dataclass(frozen=True)
class MetricChoice:
    """A metric picked from a model's outputs: its registered name and a one-line reason
    to show the user (e.g. ``output (1, 84, 8400): YOLOv8-style head with 80 classes ->
    detection F1``)."""

    metric: str
    reason: str


def _softmax_along(x: np.ndarray, axis: int) -> bool:
    return bool(x.size and x.min() >= -1e-6 and np.allclose(x.sum(axis=axis), 1.0, atol=1e-2))


def _box_scores_plausible(boxes: np.ndarray, scores: np.ndarray) -> bool:
    """A raw YOLO head: box coordinates in pixels (some > 1, widths/heights >= 0) and
    class scores that are probabilities (within [0, 1]). Sequence outputs, embeddings and
    logits fail one of these."""
    return bool(boxes.size and boxes.max() > 1.0 and boxes[..., 2:4].min() >= 0 and in_unit(scores))


def _shape(x: np.ndarray) -> str:
    return str(tuple(int(d) for d in x.shape))


def _detection_choice(outs: list[np.ndarray]) -> MetricChoice | None:
    """YOLOv8 / YOLOv5 heads and SSD boxes+scores, with values that read as boxes."""
    if len(outs) >= 2:
        a, b = outs[0], outs[1]
        if a.ndim == 3 and b.ndim == 3 and a.shape[:2] == b.shape[:2] and a.shape[1] > 100:
            boxes, scores = (a, b) if a.shape[2] == 4 else (b, a)
            if boxes.shape[2] == 4 and scores.shape[2] >= 1 and in_unit(scores):
                return MetricChoice(
                    "detection_f1",
                    f"outputs {_shape(boxes)} + {_shape(scores)}: SSD-style boxes and "
                    f"{scores.shape[2]} class scores per anchor -> detection F1",
                )
    pair = anchor_pair(outs)
    if (
        pair is not None
        and pair[0].shape[2] != 4
        and pair[0].shape[1] > 100
        and gfl_levels(outs) is None
    ):
        regressions, scores = pair
        kind = "probabilities" if in_unit(scores) else "logits"
        return MetricChoice(
            "detection_f1",
            f"outputs {_shape(regressions)} + {_shape(scores)}: {regressions.shape[2]} "
            f"anchor-relative box values and {scores.shape[2]} class score(s) ({kind}) per "
            "anchor; without the model's anchors lpq cannot place the boxes -> detection F1 "
            "over anchors (an anchor whose score passes the threshold is a detection)",
        )
    levels = gfl_levels(outs)
    if levels is not None and levels[0][0].shape[1] > 100:
        scores, dists = levels[0]
        return MetricChoice(
            "detection_f1",
            f"{len(outs)} outputs, {_shape(scores)} + {_shape(dists)} first: GFL/PicoDet-style "
            f"head, {len(levels)} levels of {scores.shape[2]} class scores and box distance "
            f"distributions ({dists.shape[2] // 4} bins a side) -> detection F1 over anchors",
        )
    head = outs[0]
    if head.ndim != 3:
        return None
    _, k, a = head.shape
    many = k >= 5 and a > 100 and a >= 8 * k and not _softmax_along(head, -1)
    if many and _box_scores_plausible(np.moveaxis(head[:, :4, :], 1, -1), head[:, 4:, :]):
        return MetricChoice(
            "detection_f1",
            f"output {_shape(head)}: YOLOv8-style head with {k - 4} classes over {a} "
            "anchors -> detection F1",
        )
    a, k = head.shape[1], head.shape[2]
    many = k >= 6 and a > 100 and a >= 8 * k and not _softmax_along(head, -1)
    if many and _box_scores_plausible(head[..., :4], head[..., 4:]):
        return MetricChoice(
            "detection_f1",
            f"output {_shape(head)}: YOLOv5-style head (objectness) with {k - 5} classes "
            f"over {a} anchors -> detection F1",
        )
    return None


def _task_choice(task: str, outs: list[np.ndarray]) -> MetricChoice:
    """The metric for a task the caller named, after checking the outputs fit it."""
    if task not in TASKS:
        raise ConfigError(f"unknown task {task!r}", hint=f"use one of {sorted(TASKS)}")
    head = outs[0]
    metric = TASKS[task]
    if metric == "detection_f1":
        layout = detect_layout(outs)  # raises a DataError naming the shapes it reads
        return MetricChoice(metric, f"output {_shape(head)}: {layout} detections -> detection F1")
    if metric == "ctc_exact" and (head.ndim != 3 or head.shape[-1] < 2):
        raise DataError(
            f"the model is a recognizer, but its output {_shape(head)} is not (B, T, C) "
            "or (T, B, C) class scores",
            hint="name the output's metric with --metric",
        )
    if metric == "mask_iou" and head.ndim < 3:
        raise DataError(
            f"the model segments, but its output {_shape(head)} is not a map",
            hint="name the output's metric with --metric",
        )
    return MetricChoice(metric, f"output {_shape(head)}: the caller said {task} -> {metric}")


def choose_task_metric(
    outputs: Any, *, task: str | None = None, names: Sequence[str] | None = None
) -> MetricChoice | None:
    """The task metric for a model, from one batch of its fp32 outputs, and why; ``None``
    where the outputs do not say unambiguously which task it is (the caller then falls
    back, or asks the user for ``--metric``). ``task`` (a key of :data:`TASKS`, e.g.
    ``"ctc"`` for a recognizer) overrides the rules after checking the outputs fit.
    ``names``: the outputs' names, in order, where the adaptor gives them (rule 8).

    Rules, first match wins (B: batch; documented in docs/metrics.md):

    1. Two 3-D outputs ``(B, A, 4)`` + ``(B, A, C)``, A > 100, scores in [0, 1]: SSD ->
       ``detection_f1``; 3-D outputs that pair by ``(B, A)`` into class scores in [0, 1]
       and distance distributions ``(B, A, 4n)`` (logits), A > 100 on the largest level:
       a GFL / PicoDet head -> ``detection_f1`` (per anchor, before NMS).
    2. ``(B, 4+C, A)``, A > 100 and A >= 8 * (4+C), box rows in pixels (max > 1, w, h
       >= 0), score rows in [0, 1], last axis not a softmax: YOLOv8 -> ``detection_f1``.
    3. ``(B, A, 5+C)``, same conditions with anchors on axis 1: YOLOv5 -> ``detection_f1``.
    4. ``(B, 1, H, W)`` or ``(B, H, W, 1)``, H and W >= 16, values in [0, 1]:
       probability / text map -> ``mask_iou`` (threshold 0.5).
    5. ``(B, C, H, W)`` with 2 <= C <= 256, C < min(H, W), H and W >= 32: per-pixel class
       scores -> ``mask_iou`` (argmax, mIoU).
    6. ``(B, C)``, C >= 2, rows a softmax: classifier -> ``agreement`` (top-1).
    7. ``(B, D)``, D >= 64, rows of unit L2 norm, not a softmax: embedding -> ``cosine``.
    8. ``(B, D)`` or ``(B, T, D)``, D >= 16, not a softmax, the output *named* as hidden
       states or an embedding (:data:`EMBEDDING_NAME`: ``last_hidden_state``,
       ``sentence_embedding``, ``pooler_output``): embedding -> ``cosine``. MiniLM's
       ``last_hidden_state`` (1, 32, 384) was scored by per-token top-1 agreement over
       its 384 features (0.898) where its cosine reads 0.984.

    Everything else is ambiguous and returns ``None``: raw ``(B, C)`` scores (logits, an
    unnormalised embedding and a regression vector look alike), ``(B, T, C)`` sequences
    (CTC only when ``task="ctc"``: per-frame scores look the same for a tagger), ``(B, H,
    W)`` maps (the same shape as a sequence of per-frame scores), post-NMS
    ``(N, 6)`` rows (a 6-class classifier's shape), one value per sample.
    """
    outs = outputs_list(outputs)
    if task is not None:
        return _task_choice(task, outs)
    found = _detection_choice(outs)
    if found is not None:
        return found
    head = outs[0].astype(np.float64) if outs[0].dtype.kind in "fiu" else None
    if head is None or head.size == 0:
        return None
    shape = _shape(head)
    probabilities = in_unit(head)
    if head.ndim == 4 and 1 in (head.shape[1], head.shape[3]):
        h, w = (head.shape[2], head.shape[3]) if head.shape[1] == 1 else head.shape[1:3]
        if h >= 16 and w >= 16 and probabilities:
            return MetricChoice(
                "mask_iou", f"output {shape}: a probability map in [0, 1] -> mask IoU at 0.5"
            )
    if head.ndim == 4:
        c, h, w = head.shape[1], head.shape[2], head.shape[3]
        if 2 <= c <= 256 and c < min(h, w) and h >= 32 and w >= 32:
            return MetricChoice(
                "mask_iou",
                f"output {shape}: per-pixel scores for {c} classes -> mean IoU of the argmax masks",
            )
    if head.ndim == 2 and head.shape[1] >= 2:
        if _softmax_along(head, -1):
            return MetricChoice(
                "agreement",
                f"output {shape}: class probabilities -> top-1 agreement with fp32",
            )
        norms = np.linalg.norm(head, axis=1)
        if head.shape[1] >= 64 and np.allclose(norms, 1.0, atol=1e-2):
            return MetricChoice(
                "cosine",
                f"output {shape}: unit-length {head.shape[1]}-d embeddings -> mean cosine "
                "similarity",
            )
    named = names[0] if names else None
    if (
        named is not None
        and EMBEDDING_NAME.search(named)
        and head.ndim in (2, 3)
        and head.shape[-1] >= 16
        and not _softmax_along(head, -1)
    ):
        return MetricChoice(
            "cosine",
            f"output {named!r} {shape}: named as hidden states or an embedding -> mean "
            "cosine similarity",
        )
    return None
