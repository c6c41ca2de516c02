"""Latency-aware quantization in lpq-tf: core's search fed by LiteRT timings.

Assertions are on the decision's own measurements and on what the returned .tflite runs
(read back from the file), never on wall-clock times. Scripted timers make the
"an op type is slower" and "everything is slower" cases deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from tf_testmodels import calib_loader

import lpq
from lpq.latency import Timing
from lpq_tf import graph
from lpq_tf import latency as tf_latency
from lpq_tf.model_io import prepare
from lpq_tf.naming import match_ops
from lpq_tf.precision import op_precision

pm = lpq.get_plugin_manager()


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LPQ_CACHE_DIR", str(tmp_path / "cache"))


def check_matches(qmodel: Any) -> dict[str, Any]:
    """The decision recorded on the model agrees with what the .tflite runs."""
    decision = qmodel.latency
    assert decision is not None
    found = pm.quantized_ops("tf", qmodel)
    for name in decision["ops"]:
        assert found[name] == ("fp32" if name in decision["keep_float"] else "int8"), name
    kept = {key[0] for key, cfg in qmodel.tune_cfg.ops.items() if not cfg.quantized}
    assert set(decision["keep_float"]) <= kept
    return dict(decision)


def test_default_quantize_is_never_slower_than_float_beyond_its_noise(cnn: Any) -> None:
    result = lpq.quantize(cnn, lpq.PostTrainingQuantConfig(), calib_loader())
    decision = check_matches(result.model)
    assert decision["ops"] == ["conv1", "conv2", "fc1", "logits"]
    # the result against fp32, as the search measured it (paired rounds, same session)
    assert decision["speedup"] >= 1.0 - decision["noise"]
    if decision["slower_than_float"]:
        assert decision["keep_float"] == decision["ops"]
    assert decision["steps"][0]["change"] == "plan as asked -> every op float"


def test_the_same_model_quantized_again_gets_the_same_plan(cnn: Any) -> None:
    first = lpq.quantize(cnn, lpq.PostTrainingQuantConfig(), calib_loader()).model.latency
    again = lpq.quantize(cnn, lpq.PostTrainingQuantConfig(), calib_loader()).model.latency
    assert again["keep_float"] == first["keep_float"]
    assert again["steps"] == first["steps"]  # from the decision cache, not re-measured


def precisions_of(cnn: Any):
    float_ops = prepare(cnn).ops()

    def precisions(content: bytes) -> dict[str, str]:
        converted = graph.read(content)
        matched = match_ops(float_ops, converted)
        return {name: op_precision(converted, op) for name, op in matched.items()}

    return precisions


def scripted(cost: Any) -> Any:
    """A timer whose candidate times come from ``cost(precisions)``, identical rounds."""

    def make(backend: Any, **_: Any) -> Any:
        def timer(candidates: Mapping[str, bytes]) -> Timing:
            return Timing({label: [cost(c) / 1e3] * 20 for label, c in candidates.items()})

        return timer

    return make


def test_an_op_type_slower_in_int8_stays_float(cnn: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    precisions = precisions_of(cnn)

    def cost(content: bytes) -> float:  # int8 convs fast, int8 fully-connected slow
        found = precisions(content)
        return 1.0 + sum(
            (-0.3 if name.startswith("conv") else 0.5)
            for name, p in found.items()
            if p == "int8" and name in ("conv1", "conv2", "fc1", "logits")
        )

    monkeypatch.setattr(tf_latency, "runner_timer", scripted(cost))
    qmodel = lpq.quantize(cnn, lpq.PostTrainingQuantConfig(), calib_loader()).model
    decision = check_matches(qmodel)
    assert decision["keep_float"] == ["fc1", "logits"]
    assert not decision["slower_than_float"]
    assert pm.quantized_ops("tf", qmodel) == {
        "conv1": "int8", "conv2": "int8", "fc1": "fp32", "logits": "fp32"
    }  # fmt: skip
    # the returned model says what it runs: quantizing with its tune_cfg gives it again
    again = pm.quantize("tf", cnn, qmodel.tune_cfg, calib_loader())
    assert again.latency is None and again.content == qmodel.content


def test_a_model_slower_in_int8_everywhere_is_float_and_said_so(
    cnn: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    precisions = precisions_of(cnn)

    def cost(content: bytes) -> float:
        return 1.0 + 0.2 * sum(p == "int8" for p in precisions(content).values())

    monkeypatch.setattr(tf_latency, "runner_timer", scripted(cost))
    with pytest.warns(lpq.LpqWarning, match="slower than fp32"):
        qmodel = lpq.quantize(cnn, lpq.PostTrainingQuantConfig(), calib_loader()).model
    decision = check_matches(qmodel)
    assert decision["slower_than_float"] and decision["keep_float"] == decision["ops"]
    assert set(pm.quantized_ops("tf", qmodel).values()) == {"fp32"}


def test_latency_aware_off_and_integer_only_models_are_not_searched(
    cnn: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*_: Any, **__: Any) -> Any:
        raise AssertionError("searched")

    monkeypatch.setattr(tf_latency, "decide", fail)
    off = lpq.PostTrainingQuantConfig(latency_aware=False)
    assert lpq.quantize(cnn, off, calib_loader()).model.latency is None
    integer = lpq.PostTrainingQuantConfig(backend="tflite-int8-io")
    assert lpq.quantize(cnn, integer, calib_loader()).model.latency is None
