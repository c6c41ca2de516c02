"""How much each op's quantization hurts: per-op activation error, ranked.

The strategy asks for it between trials (``ctx.op_sensitivity``); no trial is spent.
The adaptor's ``lpq_inspect_tensor`` captures each op's output in the fp32 model and in
the quantized candidate; the error is measured per op and turned into a *marginal*
score (what the op adds to the error already upstream of it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..errors import LpqError, NoAdaptorError
from ..eval.evaluation import Inspection
from ..plan.tune_config import OpKey, TuneConfig
from ..plan.tuning_space import TuningSpace
from ..plugins.manager import get_plugin_manager

logger = logging.getLogger("lpq")


def relative_error(reference: np.ndarray, quantized: np.ndarray) -> float:
    """Quantization error of one activation, robust to outlier channels.

    A plain MSE relative to the tensor's energy is dominated by its largest channels: an
    outlier channel that forces a coarse scale onto a per-tensor quantizer destroys every
    other channel, yet hardly moves that ratio. So the error is taken relative to each
    slice along an axis (a channel, a feature), averaged over slices; the channel axis is
    not known to lpq, so every non-batch axis is tried and the worst is kept.
    """
    ref = np.asarray(reference, np.float64)
    diff = np.asarray(quantized, np.float64).reshape(ref.shape) - ref
    floor = 1e-5 * float(np.mean(ref**2)) + 1e-12  # dead slices must not dominate
    if ref.ndim < 2:
        return float(np.mean(diff**2)) / (float(np.mean(ref**2)) + 1e-12)
    worst = 0.0
    for axis in range(1, ref.ndim):
        others = tuple(a for a in range(ref.ndim) if a != axis)
        per_slice = np.mean(diff**2, axis=others) / (np.mean(ref**2, axis=others) + floor)
        worst = max(worst, float(np.mean(per_slice)))
    return worst


def marginal_errors(raw: dict[OpKey, float]) -> dict[OpKey, float]:
    """Each op's error *added* to what came before it, in graph order.

    Activation error accumulates downstream, so raw errors rank late ops first even when
    an early op did the damage. An op's score is how much it raises the largest error
    seen so far; its raw error breaks ties (scaled down so it never outranks a rise).
    """
    scores: dict[OpKey, float] = {}
    worst_so_far = 0.0
    for key, error in raw.items():  # dicts keep the capability's graph order
        scores[key] = max(error - worst_so_far, 0.0) + 1e-3 * error
        worst_so_far = max(worst_so_far, error)
    return scores


class SensitivityProbe:
    """Per-op marginal error of a config, cached per config fingerprint.

    ``quantized_model(cfg)`` returns the candidate's model (reusing a trial's if the
    driver still holds it). A framework error while inspecting is not fatal: it is logged
    and the strategy falls back to trial-based probing, as without inspection.
    """

    def __init__(
        self,
        framework: str,
        model: Any,
        space: TuningSpace,
        data: Iterable[Any] | None,
        quantized_model: Callable[[TuneConfig], Any],
    ) -> None:
        self.framework = framework
        self.model = model
        self.space = space
        self.data = data
        self.quantized_model = quantized_model
        self._cache: dict[str, dict[OpKey, float] | None] = {}
        self._fp32: Inspection | None = None

    def __call__(self, cfg: TuneConfig) -> dict[OpKey, float] | None:
        if not cfg.quantized_ops():
            return {}
        fingerprint = cfg.fingerprint()
        if fingerprint not in self._cache:
            self._cache[fingerprint] = self._measure(cfg) if self.data is not None else None
        return self._cache[fingerprint]

    def _measure(self, cfg: TuneConfig) -> dict[OpKey, float] | None:
        try:
            return self._inspect_errors(cfg)
        except NoAdaptorError:
            return None
        except Exception as exc:  # the framework failed to inspect: probe with trials
            kind = "lpq" if isinstance(exc, LpqError) else type(exc).__name__
            logger.warning(
                "inspecting per-op error failed (%s: %s); ranking ops with trials instead",
                kind,
                str(exc).splitlines()[0] if str(exc) else "",
            )
            return None

    def _inspect(self, model: Any, names: list[str]) -> Inspection:
        assert self.data is not None
        return get_plugin_manager().inspect_tensor(
            self.framework, model, self.data, names, "activation", 2
        )

    def _inspect_errors(self, cfg: TuneConfig) -> dict[OpKey, float]:
        """Marginal activation error of every quantized tunable op of ``cfg``.

        All tunable ops are inspected, fallen-back ones included, because their outputs
        still carry upstream damage that the marginal score must subtract.
        """
        keys = self.space.tunable_ops
        names = [name for name, _ in keys]
        if self._fp32 is None:
            self._fp32 = self._inspect(self.model, names)
        int8 = self._inspect(self.quantized_model(cfg), names)
        raw: dict[OpKey, float] = {}
        for key in keys:
            ref, got = self._fp32.activations.get(key[0]), int8.activations.get(key[0])
            raw[key] = (
                float(np.mean([relative_error(r, g) for r, g in zip(ref, got)]))
                if ref and got
                else 0.0
            )
        logger.debug("per-op relative activation error: %s", raw)
        scores = marginal_errors(raw)
        return {key: score for key, score in scores.items() if cfg.ops[key].quantized}
