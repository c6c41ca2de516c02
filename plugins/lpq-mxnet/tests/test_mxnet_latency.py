"""Latency-aware quantization in lpq-mxnet: core's search fed by Gluon block timings.

Assertions are on the decision's own measurements and on what the returned block runs
(read from its graph), never on wall-clock times. A scripted timer makes the
"everything is slower" and "an op type is slower" cases deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import lpq
from lpq.latency import Timing

LATENCY_ATTR = "_lpq_latency"


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LPQ_CACHE_DIR", str(tmp_path / "cache"))


def check_matches(pm: Any, block: Any) -> dict[str, Any]:
    decision = getattr(block, LATENCY_ATTR)
    found = pm.quantized_ops("mxnet", block)
    for name in decision["ops"]:
        assert found[name] == ("fp32" if name in decision["keep_float"] else "int8"), name
    return dict(decision)


def test_default_quantize_is_never_slower_than_float_beyond_its_noise(
    pm: Any, digits_cnn: Any, calib_loader: Any, eval_loader: Any, top1: Any
) -> None:
    result = lpq.quantize(digits_cnn, lpq.PostTrainingQuantConfig(), calib_loader)
    decision = check_matches(pm, result.model)
    assert "digits_conv0_fwd" in decision["ops"]
    assert decision["speedup"] >= 1.0 - decision["noise"]
    if decision["slower_than_float"]:
        assert decision["keep_float"] == decision["ops"]
    fp32 = pm.evaluate("mxnet", digits_cnn, eval_loader, [top1]).accuracy
    assert pm.evaluate("mxnet", result.model, eval_loader, [top1]).accuracy >= fp32 * 0.98


def scripted(pm: Any, cost: Any) -> Any:
    def make(backend: Any, **_: Any) -> Any:
        def timer(candidates: Mapping[str, Any]) -> Timing:
            return Timing(
                {
                    label: [cost(pm.quantized_ops("mxnet", block)) / 1e3] * 20
                    for label, block in candidates.items()
                }
            )

        return timer

    return make


def convs_fast_dense_slow(found: dict[str, str]) -> float:
    """A scripted model time: int8 convolutions save time, int8 dense layers cost it."""
    return 1.0 + sum(
        (-0.3 if "conv" in name else 0.5 if "dense" in name else 0.0)
        for name, p in found.items()
        if p == "int8"
    )


def test_an_op_type_slower_in_int8_stays_float(
    pm: Any, digits_cnn: Any, calib_loader: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lpq_mxnet import latency

    monkeypatch.setattr(latency, "runner_timer", scripted(pm, convs_fast_dense_slow))
    block = lpq.quantize(digits_cnn, lpq.PostTrainingQuantConfig(), calib_loader).model
    decision = check_matches(pm, block)
    assert decision["keep_float"] == ["digits_dense0_fwd", "digits_dense1_fwd"]
    found = pm.quantized_ops("mxnet", block)
    assert found["digits_conv0_fwd"] == found["digits_conv1_fwd"] == "int8"


def test_lpq_quantize_returns_the_decided_config_and_it_makes_the_same_block(
    pm: Any, digits_cnn: Any, calib_loader: Any, eval_loader: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lpq.quantize``'s tune_cfg is the block's resolved config (lpq_resolved_config):
    the dense layers the decision kept fp32 are fallbacks and latency_aware is off, so
    quantizing with it again runs the same ops in int8 and gives the same outputs, with
    nothing measured."""
    import numpy as np

    from lpq.eval.data import OutputRecorder
    from lpq_mxnet import latency

    monkeypatch.setattr(latency, "runner_timer", scripted(pm, convs_fast_dense_slow))
    result = lpq.quantize(digits_cnn, lpq.PostTrainingQuantConfig(), calib_loader)
    cfg = result.tune_cfg
    assert cfg.options["latency_aware"] is False and result.requested_tune_cfg is not None
    assert {name for (name, _), c in cfg.ops.items() if not c.quantized} >= {
        "digits_dense0_fwd",
        "digits_dense1_fwd",
    }

    def measured(*_: Any, **__: Any) -> Any:
        raise AssertionError("the resolved config measured again")

    monkeypatch.setattr(latency, "runner_timer", measured)
    again = lpq.quantize(digits_cnn, None, calib_loader, tune_cfg=cfg).model
    assert pm.quantized_ops("mxnet", again) == pm.quantized_ops("mxnet", result.model)
    outputs = []
    for block in (again, result.model):
        recorder = OutputRecorder()
        pm.evaluate("mxnet", block, eval_loader, [recorder])
        outputs.append(np.concatenate([np.asarray(o) for o in recorder.outputs]))
    assert np.array_equal(outputs[0], outputs[1])


def test_a_model_slower_in_int8_everywhere_is_float_and_said_so(
    pm: Any, digits_cnn: Any, calib_loader: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lpq_mxnet import latency

    def cost(found: dict[str, str]) -> float:
        return 1.0 + 0.2 * sum(p == "int8" for p in found.values())

    monkeypatch.setattr(latency, "runner_timer", scripted(pm, cost))
    with pytest.warns(lpq.LpqWarning, match="slower than fp32"):
        block = lpq.quantize(digits_cnn, lpq.PostTrainingQuantConfig(), calib_loader).model
    decision = check_matches(pm, block)
    assert decision["slower_than_float"] and decision["keep_float"] == decision["ops"]
    assert set(pm.quantized_ops("mxnet", block).values()) == {"fp32"}


def test_latency_aware_off_is_not_searched(
    digits_cnn: Any, calib_loader: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lpq_mxnet import latency

    def fail(*_: Any, **__: Any) -> Any:
        raise AssertionError("searched")

    monkeypatch.setattr(latency, "decide", fail)
    off = lpq.PostTrainingQuantConfig(latency_aware=False)
    block = lpq.quantize(digits_cnn, off, calib_loader).model
    assert getattr(block, LATENCY_ATTR, None) is None
