"""Label-free language-model metrics: ``perplexity``, ``token_agreement`` and ``token_kl``.

Built-in metrics (every adaptor's language model outputs logits ``(N, L, V)``), so that
``lpq.fit(..., eval_metric="perplexity")`` can tune an LLM against the user's own text on
any framework. The arithmetic is :mod:`lpq.weight_only.metrics`; these classes adapt it
to the :class:`lpq.Metric` protocol (``update(preds, labels)`` per batch).

* ``perplexity`` (lower is better): ``preds`` are the logits (or a list whose first item
  is), ``labels`` the token ids ``(N, L)`` the logits were computed from (pass the eval
  data as ``({"input_ids": ids}, ids)``). Summed over windows, one ``exp`` at the end.
* ``token_agreement`` (higher is better): fraction of positions whose top-1 next token
  matches the reference logits given as ``labels`` (what ``lpq.fit`` records from the
  fp32 model when the eval data has no labels).
* ``token_kl`` (lower is better): mean over positions of KL(fp32 || model) of the
  next-token distributions, in nats, with the reference logits as ``labels`` like
  ``token_agreement``. It sees what top-1 agreement cannot: a quantized model that keeps
  the argmax but flattens or sharpens the rest of the distribution (sampling, beam
  search and perplexity all read it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import DataError
from ..weight_only.metrics import mean_kl, nll_sum, perplexity_from_nll


def logits_of(preds: Any) -> npt.NDArray[np.floating]:
    """The logits among a model's outputs: the array itself or the first of a list."""
    while isinstance(preds, list | tuple):
        if not preds:
            raise DataError("the model returned no outputs", hint="return the logits first")
        preds = preds[0]
    return np.asarray(preds)


def _with_reference(
    name: str, preds: Any, labels: Any
) -> tuple[npt.NDArray[np.floating], npt.NDArray[np.floating]]:
    """``(reference, candidate)`` logits for a metric that compares with fp32's logits."""
    cand = logits_of(preds)
    ref = logits_of(labels)
    if ref.shape != cand.shape or cand.ndim < 2:
        raise DataError(
            f"{name} compares logits with the fp32 model's logits of the same shape; got "
            f"{cand.shape} and labels {ref.shape}",
            hint="evaluate on data without labels (lpq records the fp32 logits), or use "
            "eval_metric='perplexity' with the token ids as labels",
        )
    return ref, cand


class Perplexity:
    """Perplexity of the label token ids under the predicted logits, over all batches."""

    name = "perplexity"
    higher_is_better = False

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.total = 0.0
        self.count = 0

    def update(self, preds: Any, labels: Any) -> None:
        ids = logits_of(labels)
        if not np.issubdtype(ids.dtype, np.integer):
            raise DataError(
                "perplexity needs the token ids as labels, got float labels (reference outputs?)",
                hint="pass the evaluation data as ({'input_ids': ids}, ids), or use "
                "eval_metric='token_agreement' for data without labels",
            )
        total, count = nll_sum(logits_of(preds), ids)
        self.total += total
        self.count += count

    def result(self) -> float:
        return perplexity_from_nll(self.total, self.count)


class _PerPositionMean:
    """A mean over next-token positions of a comparison with the fp32 model's logits
    (given as ``labels``): subclasses say what one batch adds (:meth:`_batch_sum`)."""

    name = ""
    higher_is_better = True

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.total = 0.0
        self.count = 0

    def update(self, preds: Any, labels: Any) -> None:
        ref, cand = _with_reference(self.name, preds, labels)
        self.total += self._batch_sum(ref, cand)
        self.count += int(np.prod(cand.shape[:-1]))

    def _batch_sum(self, ref: npt.NDArray[np.floating], cand: npt.NDArray[np.floating]) -> float:
        raise NotImplementedError

    def result(self) -> float:
        if self.count == 0:
            raise DataError("no positions were compared", hint="pass non-empty data")
        return self.total / self.count


class TokenAgreement(_PerPositionMean):
    """Share of positions where the model's top-1 next token matches the reference's."""

    name = "token_agreement"
    higher_is_better = True

    def _batch_sum(self, ref: npt.NDArray[np.floating], cand: npt.NDArray[np.floating]) -> float:
        return float(np.count_nonzero(np.argmax(ref, axis=-1) == np.argmax(cand, axis=-1)))


class TokenKL(_PerPositionMean):
    """Mean KL divergence of the next-token distributions from the reference's (nats)."""

    name = "token_kl"
    higher_is_better = False

    def _batch_sum(self, ref: npt.NDArray[np.floating], cand: npt.NDArray[np.floating]) -> float:
        return mean_kl(ref, cand) * int(np.prod(cand.shape[:-1]))
