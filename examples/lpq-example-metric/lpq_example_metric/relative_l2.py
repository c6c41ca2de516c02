"""``rel_l2``: relative L2 error of the model's outputs, ``||y - t|| / ||t||``.

The error and the reference's energy are summed over every value of every batch, so the
result is the same however the data is batched. Lower is better; 0 is a perfect match.

* **With labels**, ``t`` are the targets, shaped like the outputs (a regression, a
  denoiser, an embedding to reproduce). Class indices are not targets: use ``top1``.
* **Without labels** (label-free tuning), lpq records the fp32 model's outputs first and
  passes them to ``update`` as the labels: ``t`` is the fp32 output, the fp32 baseline
  scores exactly 0, and a trial's score is its quantization noise relative to the
  signal (``1 / sqrt(SQNR)``). A relative tolerance of a 0 baseline is 0: tune with an
  absolute one, e.g. ``AccuracyCriterion(criterion="absolute", tolerable_loss=0.05)`` (at
  most 5% relative error).

The metric is a module-level class holding only numbers, so it pickles (``--executor
ray`` ships it to other machines; a plugin that should run there must be installed
there too).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import lpq


def outputs(value: Any) -> list[Any]:
    """A model's outputs as a list: adaptors pass one array, or a list (or tuple) of
    arrays for a model with several outputs; a dict is taken in its order."""
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


class RelativeL2:
    """Relative L2 error against targets, or against the fp32 outputs without labels.

    ``output``: score only that output of a multi-output model (its index); ``None``
    (default) pools every output when the labels have one array per output, and scores
    the first output against a single target array otherwise.
    """

    name = "rel_l2"
    higher_is_better = False

    def __init__(self, output: int | None = None) -> None:
        self.output = output
        # The name is the metric's key in results and part of a tuning run's key: an
        # instance configured differently must not share the default's name.
        if output is not None:
            self.name = f"rel_l2[{output}]"
        self.reset()

    def reset(self) -> None:
        """Forget every batch: called before each evaluation (the fp32 baseline and every
        trial use the same instance)."""
        self.error = 0.0
        self.energy = 0.0

    def update(self, preds: Any, labels: Any) -> None:
        if labels is None:
            raise lpq.DataError(
                f"the {self.name!r} metric needs targets, but the evaluation data has none",
                hint="lpq.fit and lpq tune compare with the fp32 outputs when the data has "
                "no labels; elsewhere pass targets shaped like the model's outputs",
            )
        for pred, target in self._pairs(preds, labels):
            y = np.asarray(pred, dtype=np.float64)
            t = np.asarray(target, dtype=np.float64)
            if y.shape != t.shape:
                if y.size != t.size:
                    raise lpq.DataError(
                        f"{self.name}: the model's output has shape {y.shape} but the "
                        f"targets have shape {t.shape}",
                        hint="rel_l2 compares outputs with targets of the same shape; for "
                        "class indices use top1, or tune without labels",
                    )
                t = t.reshape(y.shape)  # e.g. (N, 1) outputs against (N,) targets
            self.error += float(np.square(y - t).sum())
            self.energy += float(np.square(t).sum())

    def _pairs(self, preds: Any, labels: Any) -> list[tuple[Any, Any]]:
        ys, ts = outputs(preds), outputs(labels)
        if not ys:
            raise lpq.DataError(f"{self.name}: the model produced no outputs to score")
        if self.output is not None:
            if self.output >= len(ys):
                raise lpq.DataError(
                    f"{self.name}: the model has {len(ys)} output(s), no output {self.output}"
                )
            return [(ys[self.output], ts[self.output] if len(ts) > 1 else ts[0])]
        if len(ts) == 1:
            return [(ys[0], ts[0])]
        if len(ts) != len(ys):
            raise lpq.DataError(
                f"{self.name}: the model has {len(ys)} outputs but there are {len(ts)} targets"
            )
        return list(zip(ys, ts, strict=True))

    def result(self) -> float:
        if self.energy > 0:
            return math.sqrt(self.error / self.energy)
        # All-zero targets: any error is infinitely large relative to them.
        return 0.0 if self.error == 0 else math.inf
