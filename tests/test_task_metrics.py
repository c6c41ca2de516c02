"""Task metrics for label-free use (issue 26, item 3): detection, CTC, classification,
embedding, mask and regression fidelity against the fp32 model's outputs, and the rules
that pick one from the outputs.

Detection is checked against a deliberately plain reference written here (python loops
over anchors, greedy NMS and matching), on synthetic heads with planted boxes.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import lpq
from lpq.eval.metric_choice import label_free_metric
from lpq.eval.metrics import CosineSimilarity
from lpq.eval.task_metrics import (
    TASK_METRICS,
    CTCCharAgreement,
    CTCExact,
    DetectionF1,
    DetectionMAP50,
    MaskIoU,
    RegressionFidelity,
    TopKAgreement,
    choose_task_metric,
    ctc_greedy_decode,
    edit_distance,
)

# ------------------------------------------------------------------ plain reference


def ref_iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def ref_decode_v8(head: np.ndarray, thr: float = 0.25, nms_iou: float = 0.45) -> list:
    """(4+C, A) -> [(score, class, box)], one anchor at a time, greedy NMS per class."""
    found = []
    for a in range(head.shape[1]):
        column = [float(v) for v in head[:, a]]
        scores = column[4:]
        cls = max(range(len(scores)), key=lambda c: scores[c])
        if scores[cls] > thr:
            cx, cy, w, h = column[:4]
            found.append((scores[cls], cls, (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)))
    found.sort(key=lambda d: -d[0])
    kept: list = []
    for det in found:
        if all(k[1] != det[1] or ref_iou(k[2], det[2]) <= nms_iou for k in kept):
            kept.append(det)
    return kept


def ref_counts(got: list, ref: list, iou: float = 0.5) -> tuple[int, int, int]:
    """(TP, FP, FN): each quantized detection, by score, takes the unmatched fp32
    detection of its class with the highest IoU >= iou."""
    taken = [False] * len(ref)
    tp = 0
    for _score, cls, box in sorted(got, key=lambda d: -d[0]):
        best, best_iou = -1, iou
        for j, (_, rcls, rbox) in enumerate(ref):
            overlap = ref_iou(box, rbox)
            if not taken[j] and rcls == cls and overlap >= best_iou:
                best, best_iou = j, overlap
        if best >= 0:
            taken[best] = True
            tp += 1
    return tp, len(got) - tp, len(ref) - tp


# ------------------------------------------------------------------ synthetic heads

CLASSES = 3
ANCHORS = 400
#: planted objects: cx, cy, w, h, class, score
PLANTED = [
    (40, 40, 30, 20, 0, 0.9),
    (120, 60, 24, 40, 1, 0.8),
    (200, 200, 50, 50, 2, 0.95),
    (260, 100, 20, 20, 0, 0.7),
    (80, 250, 36, 30, 1, 0.6),
    (300, 300, 16, 16, 2, 0.85),
    (200, 200, 50, 50, 1, 0.75),  # same place as #2, other class: class-wise NMS keeps both
]


def v8_head(planted=PLANTED, seed: int = 0) -> np.ndarray:
    """(1, 4+C, A): background anchors score below 0.2; each object fills 5 anchors whose
    boxes jitter by a pixel (NMS must merge them) and whose scores fall off."""
    rng = np.random.default_rng(seed)
    head = np.zeros((4 + CLASSES, ANCHORS), np.float32)
    head[0:2] = rng.uniform(0, 320, (2, ANCHORS))
    head[2:4] = rng.uniform(5, 60, (2, ANCHORS))
    head[4:] = rng.uniform(0, 0.2, (CLASSES, ANCHORS))
    for i, (cx, cy, w, h, cls, score) in enumerate(planted):
        for j in range(5):
            a = 10 + i * 7 + j
            head[:4, a] = [cx + j * 0.5, cy - j * 0.5, w + j * 0.3, h]
            head[4:, a] = rng.uniform(0, 0.1, CLASSES)
            head[4 + cls, a] = score - 0.05 * j
    return head[None]


def quantized_v8_head() -> np.ndarray:
    """The fp32 head with object 1 dropped, object 3 moved by its width, object 4 turned
    into class 2, and small noise everywhere."""
    planted = list(PLANTED)
    planted[1] = (120, 60, 24, 40, 1, 0.1)  # below the threshold: missed
    planted[3] = (280, 100, 20, 20, 0, 0.7)  # moved one width: no IoU with the original
    planted[4] = (80, 250, 36, 30, 2, 0.6)  # wrong class
    head = v8_head(planted)
    rng = np.random.default_rng(1)
    head[:, :4] += rng.normal(0, 0.2, head[:, :4].shape).astype(np.float32)
    return head


def test_detection_f1_matches_the_plain_reference_and_the_hand_count():
    fp32, quantized = v8_head(), quantized_v8_head()
    ref = ref_decode_v8(fp32[0])
    got = ref_decode_v8(quantized[0])
    assert len(ref) == 7  # every planted object once: jittered copies merged, classes kept
    tp, fp, fn = ref_counts(got, ref)
    # dropped: FN; moved: FP + FN; reclassified: FP + FN; 4 of 7 kept
    assert (tp, fp, fn) == (4, 2, 3)
    metric = DetectionF1()
    metric.update(quantized, fp32)
    assert (metric.tp, metric.fp, metric.fn) == (tp, fp, fn)
    assert metric.result() == pytest.approx(2 * 4 / (2 * 4 + 2 + 3))
    assert metric.reference_detections == 7
    assert metric.precision == pytest.approx(4 / 6) and metric.recall == pytest.approx(4 / 7)


def test_identical_heads_score_one_and_accumulate_over_batches():
    metric = DetectionF1()
    metric.update(v8_head(), v8_head())
    assert metric.result() == 1.0
    metric.update(quantized_v8_head(), v8_head())  # micro over the set: 11 TP, 2 FP, 3 FN
    assert metric.result() == pytest.approx(22 / (22 + 2 + 3))
    metric.reset()
    assert metric.tp == metric.fp == metric.fn == 0


def test_a_batch_of_two_images_is_decoded_per_image():
    fp32 = np.concatenate([v8_head(), v8_head(seed=5)])
    quantized = np.concatenate([quantized_v8_head(), v8_head(seed=5)])
    metric = DetectionF1()
    metric.update(quantized, fp32)
    assert metric.images == 2
    assert (metric.tp, metric.fp, metric.fn) == (4 + 7, 2, 3)


def test_logit_scores_decode_like_probabilities():
    def logits(head):
        out = head.copy()
        p = np.clip(out[:, 4:], 1e-6, 1 - 1e-6)
        out[:, 4:] = np.log(p / (1 - p))
        return out

    probs, raw = DetectionF1(), DetectionF1()
    probs.update(quantized_v8_head(), v8_head())
    raw.update(logits(quantized_v8_head()), logits(v8_head()))
    assert (raw.tp, raw.fp, raw.fn) == (probs.tp, probs.fp, probs.fn)


def test_yolov5_layout_with_objectness():
    def v5(head):  # (1, 4+C, A) -> (1, A, 5+C): objectness 1 keeps every score
        rows = head[0].T
        return np.concatenate([rows[:, :4], np.ones((ANCHORS, 1)), rows[:, 4:]], 1)[None]

    metric = DetectionF1()
    metric.update(v5(quantized_v8_head()), v5(v8_head()))
    assert (metric.tp, metric.fp, metric.fn) == (4, 2, 3)
    # objectness multiplies: at 0.3 only the objects scoring 0.9, 0.95 and 0.85 stay above
    # 0.25 (0.27, 0.285, 0.255)
    low = v5(v8_head())
    low[..., 4] = 0.3
    metric.reset()
    metric.update(low, v5(v8_head()))
    assert (metric.tp, metric.fp, metric.fn) == (3, 0, 4)


def test_a_transposed_yolov8_head_is_read_when_named():
    metric = DetectionF1(layout="yolov8t")
    metric.update(quantized_v8_head().transpose(0, 2, 1), v8_head().transpose(0, 2, 1))
    assert (metric.tp, metric.fp, metric.fn) == (4, 2, 3)


def test_ssd_layout_with_softmax_background():
    ref = ref_decode_v8(v8_head()[0])
    got = ref_decode_v8(quantized_v8_head()[0])

    def ssd(head):
        rows = head[0].T
        boxes = np.concatenate([rows[:, :2] - rows[:, 2:4] / 2, rows[:, :2] + rows[:, 2:4] / 2], 1)
        cls = rows[:, 4:]
        background = np.clip(1 - cls.sum(1, keepdims=True), 0, None)
        scores = np.concatenate([background, cls], 1)
        return [boxes[None], (scores / scores.sum(1, keepdims=True))[None]]

    metric = DetectionF1()
    metric.update(ssd(quantized_v8_head()), ssd(v8_head()))
    assert metric.reference_detections == len(ref)
    assert (metric.tp, metric.fp, metric.fn) == ref_counts(got, ref)


def gfl_head(seed: int, drop: tuple[int, ...] = (), widen: tuple[int, ...] = ()) -> list:
    """A two-level GFL/PicoDet head, scores first then distributions as PicoDet exports
    it: 256 + 64 anchors, 3 classes, 8 bins a side. Eight anchors are confident; ``drop``
    lowers some of them below the threshold, ``widen`` moves all four sides' mass of
    others far out (no IoU with the original box)."""
    rng = np.random.default_rng(0)
    counts, bins = (256, 64), 8
    scores = [rng.uniform(0, 0.2, (1, n, CLASSES)).astype(np.float32) for n in counts]
    dists = [rng.normal(0, 1, (1, n, 4 * bins)).astype(np.float32) for n in counts]
    confident = [
        (0, 3, 0),
        (0, 40, 1),
        (0, 41, 1),
        (0, 100, 2),
        (0, 200, 0),
        (1, 5, 2),
        (1, 6, 2),
        (1, 60, 1),
    ]
    for k, (level, anchor, cls) in enumerate(confident):
        scores[level][0, anchor, cls] = 0.9 if k not in drop else 0.1
        logits = dists[level][0, anchor].reshape(4, bins)
        logits[:, 2 if k not in widen else 7] += 8.0  # the mass on bin 2, or far out on 7
    noise = np.random.default_rng(seed)
    dists = [d + noise.normal(0, 0.05, d.shape).astype(np.float32) for d in dists]
    return [*scores, *dists]


def ref_gfl_counts(
    got: list, ref: list, thr: float = 0.25, iou: float = 0.5
) -> tuple[int, int, int]:
    """Per anchor: detected where its best class scores over ``thr``; a quantized
    detection is a hit when fp32 detects the same anchor, with the same class and boxes
    around the anchor's centre (expected distance per side) of IoU >= ``iou``."""

    def anchors(outputs):
        half = len(outputs) // 2
        found = {}
        for level, (scores, dists) in enumerate(zip(outputs[:half], outputs[half:])):
            for a in range(scores.shape[1]):
                row = [float(v) for v in scores[0, a]]
                cls = max(range(len(row)), key=lambda c: row[c])
                if row[cls] > thr:
                    sides = []
                    for side in range(4):
                        logits = [float(v) for v in dists[0, a, side * 8 : side * 8 + 8]]
                        top = max(logits)
                        weights = [np.exp(v - top) for v in logits]
                        sides.append(sum(i * w for i, w in enumerate(weights)) / sum(weights))
                    found[(level, a)] = (cls, (-sides[0], -sides[1], sides[2], sides[3]))
        return found

    mine, theirs = anchors(got), anchors(ref)
    tp = sum(
        1
        for key, (cls, box) in mine.items()
        if key in theirs and theirs[key][0] == cls and ref_iou(box, theirs[key][1]) >= iou
    )
    return tp, len(mine) - tp, len(theirs) - tp


def test_gfl_head_is_scored_per_anchor_against_a_plain_reference():
    """PicoDet-style heads (rapid-layout): read as ``gfl``, not as a YOLOv5 head (its first
    output (1, 256, 3) has YOLOv5's shape), and scored per anchor: class and the box the
    distance distributions give."""
    from lpq.eval.task_detection import detect_layout

    ref, got = gfl_head(seed=1), gfl_head(seed=2, drop=(1,), widen=(5,))
    assert detect_layout(ref) == "gfl"
    metric = DetectionF1()
    metric.update(got, ref)
    assert (metric.tp, metric.fp, metric.fn) == ref_gfl_counts(got, ref) == (6, 1, 2)
    same = DetectionF1()
    same.update(gfl_head(seed=3), ref)
    assert same.result() == 1.0  # small noise in the distributions moves no box far
    # The quantized scores may stray a rounding step above 1: paired as fp32's are.
    strayed = gfl_head(seed=3)
    strayed[0][0, 3, 0] = 1.0001
    same.reset()
    same.update(strayed, ref)
    assert same.result() == 1.0
    choice = choose_task_metric(ref)
    assert choice is not None and choice.metric == "detection_f1"
    assert "GFL/PicoDet-style head, 2 levels of 3 class scores" in choice.reason
    assert "8 bins a side" in choice.reason


def blazeface_head(seed: int = 0) -> list[np.ndarray]:
    """MediaPipe BlazeFace's raw outputs: ``regressors`` (1, 896, 16), a box and six
    keypoints relative to anchors the model does not output, and ``classificators``
    (1, 896, 1), face logits (a few anchors on faces, the rest far below zero)."""
    rng = np.random.default_rng(seed)
    regressors = rng.normal(0, 40, (1, 896, 16)).astype(np.float32)
    logits = rng.normal(-60, 8, (1, 896, 1)).astype(np.float32)
    logits[0, [10, 11, 300, 301, 302, 700], 0] = [2.0, 0.5, 3.0, 1.2, -0.5, 4.0]
    return [regressors, logits]


def test_an_anchor_head_without_anchors_is_scored_per_anchor():
    """BlazeFace: not ``agreement`` over 16 box values read as class scores (0.166 on the
    real model), nor a YOLOv5 head (its (1, 896, 16) has that shape): detection F1 over
    anchors whose face score passes the threshold."""
    from lpq.eval.task_detection import detect_layout

    ref = blazeface_head()
    assert detect_layout(ref) == "anchors"
    choice = choose_task_metric(ref)
    assert choice is not None and choice.metric == "detection_f1"
    assert "16 anchor-relative box values and 1 class score(s) (logits)" in choice.reason
    same = DetectionF1()
    same.update(ref, ref)
    # sigmoid(logit) > 0.25: the five anchors above -1.1 (one at -0.5 passes, 0.38).
    assert (same.result(), same.reference_detections) == (1.0, 6)
    got = blazeface_head()
    got[1][0, 10, 0] = -5.0  # a face lost
    got[1][0, 500, 0] = 1.0  # a face found where fp32 saw none
    got[0] += 3.0  # the regressions are not scored
    moved = DetectionF1()
    moved.update(got, ref)
    assert (moved.tp, moved.fp, moved.fn) == (5, 1, 1)


def test_map50_of_post_nms_rows_by_hand():
    fp32 = np.array([[0, 0, 10, 10, 0.9, 0], [20, 20, 30, 30, 0.8, 0]], np.float32)
    quantized = np.array(
        [
            [0, 0, 10, 10, 0.9, 0],  # TP
            [50, 50, 60, 60, 0.8, 0],  # FP, ranked between the two TPs
            [20, 20, 30, 31, 0.7, 0],  # TP (IoU 10/11)
        ],
        np.float32,
    )
    metric = DetectionMAP50()
    metric.update(quantized, fp32)
    # precision 1 up to recall 0.5, then 2/3 at recall 1
    assert metric.result() == pytest.approx(0.5 * 1 + 0.5 * 2 / 3)
    assert metric.f1() == pytest.approx(4 / 5)
    same = DetectionMAP50()
    same.update(fp32, fp32)
    assert same.result() == 1.0


def test_post_nms_rows_with_batch_index_and_swapped_columns():
    # (N, 7): batch index, corners, class, score (YOLOv7 end-to-end order)
    fp32 = np.array([[0, 0, 0, 10, 10, 1, 0.9], [1, 5, 5, 15, 15, 0, 0.8]], np.float32)
    quantized = np.array([[1, 5, 5, 15, 15, 0, 0.8]], np.float32)
    metric = DetectionF1()
    metric.update(quantized, fp32)
    assert (metric.tp, metric.fp, metric.fn, metric.images) == (1, 0, 1, 2)


def test_detection_refuses_annotations_and_unreadable_outputs():
    with pytest.raises(lpq.DataError, match="do not match") as info:
        DetectionF1().update(v8_head(), np.array([3]))
    assert "evaluate without labels" in (info.value.hint or "")
    with pytest.raises(lpq.DataError, match=r"cannot read detections from outputs \(4, 4\)"):
        DetectionF1().update(np.zeros((4, 4)), np.zeros((4, 4)))
    with pytest.raises(lpq.DataError, match="no reference outputs"):
        DetectionF1().update(v8_head(), None)
    with pytest.raises(lpq.ConfigError, match="unknown detection layout"):
        DetectionF1(layout="yolov9")


# ------------------------------------------------------------------ CTC


def ctc_scores(paths: list[list[int]], classes: int = 5) -> np.ndarray:
    """(B, T, C) one-hot-ish probabilities following each frame path."""
    out = np.full((len(paths), len(paths[0]), classes), 0.01, np.float32)
    for b, path in enumerate(paths):
        out[b, np.arange(len(path)), path] = 0.96
    return out


def test_ctc_greedy_decode_by_hand():
    scores = ctc_scores([[0, 1, 1, 0, 2, 2, 2, 3], [1, 0, 1, 1, 0, 0, 4, 0]])
    assert ctc_greedy_decode(scores) == [(1, 2, 3), (1, 1, 4)]
    assert ctc_greedy_decode(scores.transpose(1, 0, 2), time_major=True) == [(1, 2, 3), (1, 1, 4)]
    assert ctc_greedy_decode(scores[:1].transpose(1, 0, 2)) == [(1, 2, 3)]  # (T, 1, C)
    # blank 1: 0 1 0 2 3 and 1 0 1 0 4 0 after collapsing, then the 1s go
    assert ctc_greedy_decode(scores, blank=1) == [(0, 0, 2, 3), (0, 0, 4, 0)]
    with pytest.raises(lpq.ConfigError, match="blank index 9"):
        ctc_greedy_decode(scores, blank=9)


def test_edit_distance_by_hand():
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance((), (1, 2)) == 2
    assert edit_distance((1, 2, 3), (1, 3)) == 1


def test_ctc_exact_and_character_agreement():
    fp32 = ctc_scores([[0, 1, 1, 0, 2, 2, 2, 3], [1, 0, 1, 1, 0, 0, 4, 0]])
    quantized = ctc_scores([[0, 1, 1, 0, 0, 0, 0, 3], [1, 0, 1, 1, 0, 0, 4, 0]])  # (1, 3)
    exact, chars = CTCExact(), CTCCharAgreement()
    for metric in (exact, chars):
        metric.update(quantized, fp32)
    assert exact.result() == 0.5
    # one edit over max(2, 3) + max(3, 3) characters
    assert chars.result() == pytest.approx(1 - 1 / 6)
    with pytest.raises(lpq.DataError, match=r"\(2, 8, 5\) and the reference \(2, 8\) differ"):
        CTCExact().update(quantized, np.zeros((2, 8)))


# ------------------------------------------------------------------ dense outputs


def test_top_k_agreement():
    fp32 = np.array([[0.1, 0.7, 0.2], [0.6, 0.3, 0.1]])
    quantized = np.array([[0.5, 0.3, 0.2], [0.6, 0.3, 0.1]])  # sample 0: fp32's class 2nd
    top1, top2 = TopKAgreement(1), TopKAgreement(2)
    for metric in (top1, top2):
        metric.update(quantized, fp32)
    assert (top1.result(), top2.result()) == (0.5, 1.0)
    assert top1.name == "top1_agreement"


def test_embedding_cosine():
    rng = np.random.default_rng(0)
    fp32 = rng.normal(size=(4, 128))
    metric = CosineSimilarity()
    metric.update(fp32 * 3.0, fp32)
    assert metric.result() == pytest.approx(1.0)
    other = np.zeros_like(fp32)
    other[:, 0], fp32[:, 0] = 1.0, 0.0
    metric.reset()
    metric.update(other, fp32)
    assert metric.result() == pytest.approx(0.0)


def test_mask_iou_binary_and_multiclass_by_hand():
    fp32 = np.zeros((1, 1, 20, 20), np.float32)
    fp32[0, 0, :10, :10] = 0.9  # 100 pixels
    quantized = np.zeros_like(fp32)
    quantized[0, 0, 5:15, :10] = 0.8  # 50 shared, 150 in the union
    metric = MaskIoU()
    metric.update(quantized, fp32)
    assert metric.result() == pytest.approx(50 / 150)
    metric.update(fp32 * 0.4, fp32 * 0.4)  # both empty at 0.5: adds nothing
    assert metric.result() == pytest.approx(50 / 150)

    labels = np.zeros((1, 4, 4), np.int64)
    labels[0, :2] = 1  # 8 pixels of class 1, 8 of class 0
    moved = labels.copy()
    moved[0, 2, :2] = 1  # class 1 grows by 2
    onehot = lambda x: np.moveaxis(np.eye(3)[x], -1, 1)  # noqa: E731 -> (1, 3, 4, 4)
    seg = MaskIoU()
    seg.update(onehot(moved), onehot(labels))
    assert seg.result() == pytest.approx((6 / 8 + 8 / 10) / 2)


def test_regression_fidelity():
    fp32 = np.array([[1.0, -2.0], [3.0, 4.0]])
    metric = RegressionFidelity()
    metric.update(fp32, fp32)
    assert metric.result() == 1.0
    metric.reset()
    metric.update(fp32 * 1.1, fp32)
    assert metric.result() == pytest.approx(0.9)
    metric.reset()
    metric.update(np.zeros_like(fp32), fp32)
    assert metric.result() == pytest.approx(0.0)


# ------------------------------------------------------------------ automatic choice


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def realistic_v8(classes: int, anchors: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    head = np.empty((1, 4 + classes, anchors), np.float32)
    head[0, :2] = rng.uniform(0, 320, (2, anchors))
    head[0, 2:4] = rng.uniform(2, 200, (2, anchors))
    head[0, 4:] = 1 / (1 + np.exp(-rng.normal(-4, 2, (classes, anchors))))
    return head


def test_the_issues_2100_anchor_head_is_a_detector_not_argmax_agreement():
    head = realistic_v8(18, 2100)
    choice = choose_task_metric([head])
    assert choice is not None and choice.metric == "detection_f1"
    assert "(1, 22, 2100)" in choice.reason and "18 classes" in choice.reason
    assert label_free_metric([head])[0] == "detection_f1"


@pytest.mark.parametrize(
    ("outputs", "metric", "phrase"),
    [
        ([realistic_v8(80, 8400)], "detection_f1", "YOLOv8-style head with 80 classes"),
        (
            [
                np.concatenate(
                    [
                        realistic_v8(80, 8400)[0, :4],
                        np.full((1, 8400), 0.5),
                        realistic_v8(80, 8400)[0, 4:],
                    ]
                ).T[None]
            ],
            "detection_f1",
            "YOLOv5-style head (objectness) with 80 classes",
        ),
        (
            [
                np.random.default_rng(0).uniform(0, 300, (1, 3000, 4)),
                softmax(np.random.default_rng(1).normal(size=(1, 3000, 21))),
            ],
            "detection_f1",
            "SSD-style",
        ),
        ([softmax(np.random.default_rng(0).normal(size=(8, 1000)))], "agreement", "probabilities"),
        ([np.random.default_rng(0).normal(size=(8, 1000))], None, None),  # logits or embedding?
        ([softmax(np.random.default_rng(0).normal(size=(8, 26, 6625)))], None, None),  # CTC?
        ([np.random.default_rng(0).uniform(size=(2, 500, 10))], None, None),  # tagger or map?
        ([np.random.default_rng(0).uniform(size=(2, 1, 64, 64))], "mask_iou", "probability map"),
        ([np.random.default_rng(0).normal(size=(2, 21, 128, 128))], "mask_iou", "21 classes"),
        ([np.array([[0, 0, 10, 10, 0.9, 1.0]] * 8)], None, None),  # post-NMS or 6 classes?
        ([np.zeros((8, 1))], None, None),
        ([np.zeros((8,))], None, None),
    ],
)
def test_automatic_choice_rules(outputs, metric, phrase):
    choice = choose_task_metric(outputs)
    if metric is None:
        assert choice is None
    else:
        assert choice is not None and choice.metric == metric
        assert phrase in choice.reason and str(outputs[0].shape[:2])[:-1] in choice.reason


def test_unit_length_embeddings_get_cosine():
    emb = np.random.default_rng(0).normal(size=(8, 512))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    choice = choose_task_metric(emb)
    assert choice is not None and choice.metric == "cosine" and "512-d" in choice.reason


def test_an_output_named_as_hidden_states_or_an_embedding_gets_cosine():
    """MiniLM's ``last_hidden_state`` (1, 32, 384): ambiguous by shape, settled by name."""
    hidden = np.random.default_rng(0).normal(size=(2, 32, 384))
    assert choose_task_metric(hidden) is None
    for name in ("last_hidden_state", "sentence_embedding", "pooler_output", "Embeddings"):
        choice = choose_task_metric(hidden, names=[name, "other"])
        assert choice is not None and choice.metric == "cosine", name
        assert repr(name) in choice.reason and "(2, 32, 384)" in choice.reason
    assert label_free_metric([hidden], names=["last_hidden_state"])[0] == "cosine"
    # Other names, a softmax, or a narrow last axis: the rules and fallback as before.
    assert choose_task_metric(hidden, names=["logits"]) is None
    probs = softmax(np.random.default_rng(1).normal(size=(2, 26, 50)))
    assert choose_task_metric(probs, names=["embedding"]) is None
    assert choose_task_metric(hidden[..., :8], names=["last_hidden_state"]) is None
    # Only the first output's name counts (it is the one scored).
    assert choose_task_metric(hidden, names=["logits", "last_hidden_state"]) is None


def test_ambiguous_outputs_fall_back_as_before():
    assert label_free_metric([np.zeros((8, 26, 6625))])[0] == "agreement"
    assert label_free_metric([np.zeros((8, 1))])[0] == "cosine"
    assert label_free_metric([np.random.default_rng(0).normal(size=(8, 1000))])[0] == "agreement"


def test_a_named_task_overrides_the_rules_when_the_outputs_fit():
    probs = softmax(np.random.default_rng(0).normal(size=(8, 26, 6625)))
    assert label_free_metric([probs], task="ctc")[0] == "ctc_exact"
    with pytest.raises(lpq.DataError, match=r"recognizer.*\(8, 10\)"):
        choose_task_metric(np.zeros((8, 10)), task="ctc")
    with pytest.raises(lpq.DataError, match="cannot read detections"):
        choose_task_metric(np.zeros((8, 10)), task="detection")
    with pytest.raises(lpq.ConfigError, match="unknown task 'ocr'") as info:
        choose_task_metric(np.zeros((8, 10)), task="ocr")
    assert "ctc" in (info.value.hint or "")


# ------------------------------------------------------------------ registration, pickling

SAMPLES = {
    "detection_f1": (quantized_v8_head(), v8_head()),
    "detection_map50": (quantized_v8_head(), v8_head()),
    "ctc_exact": (ctc_scores([[0, 1, 2]]), ctc_scores([[0, 1, 1]])),
    "ctc_char_agreement": (ctc_scores([[0, 1, 2]]), ctc_scores([[0, 1, 1]])),
    "top1_agreement": (np.eye(3), np.eye(3)[[0, 2, 1]]),
    "top5_agreement": (np.eye(6), np.eye(6)[::-1]),
    "mask_iou": (np.full((1, 1, 4, 4), 0.7), np.eye(4)[None, None]),
    "regression_fidelity": (np.ones((2, 3)), np.full((2, 3), 2.0)),
}


def test_every_task_metric_is_registered_and_pickles(lpq_plugin_manager):
    assert set(SAMPLES) == set(TASK_METRICS)
    for name, (preds, labels) in SAMPLES.items():
        metric = lpq_plugin_manager.create_metric(name)
        assert isinstance(metric, lpq.Metric) and metric.name == name
        assert metric.higher_is_better
        fresh = pickle.loads(pickle.dumps(metric))  # what a --workers pool does
        metric.update(preds, labels)
        value = metric.result()
        assert 0.0 <= value <= 1.0
        copy = pickle.loads(pickle.dumps(metric))
        assert copy.result() == value, name
        fresh.update(preds, labels)
        assert fresh.result() == value, name
    assert (
        lpq_plugin_manager.create_metric(
            "detection_f1", score_threshold=0.5
        ).options.score_threshold
        == 0.5
    )
