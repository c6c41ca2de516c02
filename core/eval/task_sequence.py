"""CTC recognizer fidelity without labels: greedy-decoded strings of the quantized model
against the fp32 model's (numpy only).

Why: per-position top-1 agreement over a ``(B, T, C)`` CTC output counts blank frames,
which dominate and rarely change, so it stays high while the decoded text changes; a
captcha recognizer with 0.99 position agreement can read 0.4 of its strings differently
(issue 26). These metrics decode first (argmax per frame, collapse repeats, drop blanks),
then compare strings.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError, DataError
from .task_detection import outputs_list

_CTC_HINT = (
    "CTC metrics take logits or probabilities (B, T, C) or (T, B, C) (classes last, blank "
    "index 0 unless given); for time-major outputs use create_metric(name, time_major=True), "
    "or register your own metric (docs/metrics.md)"
)


def ctc_greedy_decode(
    scores: np.ndarray, blank: int = 0, time_major: bool | None = None
) -> list[tuple[int, ...]]:
    """Greedy CTC decode: each frame's argmax, repeats collapsed, blanks dropped.

    ``scores`` is ``(B, T, C)``, ``(T, B, C)`` (``time_major=True``) or one sample
    ``(T, C)``. ``time_major=None`` reads ``(T, 1, C)`` as time-major and anything else
    as batch-major (PP-OCR, Keras); a PyTorch CRNN's ``(T, B, C)`` with B > 1 needs
    ``time_major=True``. Returns one tuple of class indices per sample.
    """
    scores = np.asarray(scores)
    if scores.ndim == 2:
        scores = scores[None]
    if scores.ndim != 3 or scores.shape[-1] < 2:
        raise DataError(f"ctc: cannot decode an output of shape {scores.shape}", hint=_CTC_HINT)
    if not -scores.shape[-1] <= blank < scores.shape[-1]:
        raise ConfigError(
            f"ctc: blank index {blank} is outside the {scores.shape[-1]} classes",
            hint="give the blank's class index (0 for PP-OCR, C-1 for TensorFlow's ctc)",
        )
    blank = blank % scores.shape[-1]
    if time_major is None:
        time_major = scores.shape[1] == 1 and scores.shape[0] > 1
    best = scores.argmax(axis=-1)
    if time_major:
        best = best.T
    decoded = []
    for path in best:
        keep = np.ones(len(path), bool)
        keep[1:] = path[1:] != path[:-1]
        keep &= path != blank
        decoded.append(tuple(int(c) for c in path[keep]))
    return decoded


def edit_distance(a: tuple[int, ...] | str, b: tuple[int, ...] | str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions all cost 1)."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


class _CTCAgreement:
    """Decode both models' outputs the same way and hand the string pairs on."""

    name = "ctc"
    higher_is_better = True

    def __init__(self, blank: int = 0, time_major: bool | None = None) -> None:
        self.blank = blank
        self.time_major = time_major
        self.reset()

    def reset(self) -> None:
        self.samples = 0

    def _pairs(self, preds: Any, labels: Any) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        if labels is None:
            raise DataError(
                f"{self.name} compares with the fp32 model's decoded strings, but no "
                "reference outputs were given",
                hint="score without labels: lpq then passes the fp32 model's outputs as labels",
            )
        got, ref = outputs_list(preds)[0], outputs_list(labels)[0]
        if got.shape != ref.shape:
            raise DataError(
                f"{self.name}: the model's output {got.shape} and the reference {ref.shape} differ",
                hint="CTC metrics take the fp32 model's outputs as labels, not "
                "text labels; evaluate without labels",
            )
        pairs = list(
            zip(
                ctc_greedy_decode(got, self.blank, self.time_major),
                ctc_greedy_decode(ref, self.blank, self.time_major),
            )
        )
        self.samples += len(pairs)
        return pairs


class CTCExact(_CTCAgreement):
    """Share of samples whose greedy-decoded CTC string equals the fp32 model's.

    What a recognizer's user sees: a string is right or wrong. ``blank`` (default 0) is the
    blank class; ``time_major`` as :func:`ctc_greedy_decode`. Picklable."""

    name = "ctc_exact"

    def reset(self) -> None:
        super().reset()
        self.equal = 0

    def update(self, preds: Any, labels: Any) -> None:
        self.equal += sum(g == r for g, r in self._pairs(preds, labels))

    def result(self) -> float:
        return self.equal / self.samples if self.samples else 0.0


class CTCCharAgreement(_CTCAgreement):
    """Per-character agreement of greedy-decoded CTC strings with the fp32 model's:
    ``1 - sum(edit distance) / sum(max(len(quantized), len(fp32)))`` over the evaluation
    set, in [0, 1] (1.0 when every string is empty). Unlike :class:`CTCExact` it tells one
    wrong character from a wrong string. Picklable."""

    name = "ctc_char_agreement"

    def reset(self) -> None:
        super().reset()
        self.edits = 0
        self.chars = 0

    def update(self, preds: Any, labels: Any) -> None:
        for got, ref in self._pairs(preds, labels):
            self.edits += edit_distance(got, ref)
            self.chars += max(len(got), len(ref))

    def result(self) -> float:
        return 1.0 - self.edits / self.chars if self.chars else 1.0
