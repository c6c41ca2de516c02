"""TuneConfig: JSON round trip (history, resume) and a fingerprint stable across runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import lpq
from lpq import OpConfig, TensorConfig, TuneConfig


def sample() -> TuneConfig:
    w8 = TensorConfig("int8", "sym", "per_channel", "minmax")
    a8 = TensorConfig("uint8", "asym", "per_tensor", "kl")
    w4 = TensorConfig("int4", "sym", "per_block", "rtn", {"block_size": 32})
    return TuneConfig(
        ops={
            ("conv1", "Conv"): OpConfig("int8", "static", w8, a8),
            ("fc", "MatMul"): OpConfig("int4", "weight_only", w4, None),
            ("add", "Add"): OpConfig.fallback("bf16"),
            ("head", "Gemm"): OpConfig.fallback(),
        },
        calib_sampling_size=64,
        options={"quant_format": "qdq", "providers": ["CPUExecutionProvider"]},
    )


def test_json_round_trip_is_exact():
    cfg = sample()
    text = json.dumps(cfg.to_json())
    again = TuneConfig.from_json(json.loads(text))
    assert again == cfg
    assert again.ops[("fc", "MatMul")].weight.options == {"block_size": 32}
    assert again.fingerprint() == cfg.fingerprint()


def test_json_is_plain_and_readable():
    data = sample().to_json()
    assert data["ops"][0] == {"name": "add", "type": "Add", "precision": "bf16"}
    assert {"name": "conv1", "type": "Conv", "precision": "int8", "mode": "static"}.items() <= (
        data["ops"][1].items()
    )
    assert data["calib_sampling_size"] == 64


def test_fingerprint_ignores_op_order_and_sees_every_change():
    cfg = sample()
    reordered = TuneConfig(dict(reversed(list(cfg.ops.items()))), 64, dict(cfg.options))
    assert reordered.fingerprint() == cfg.fingerprint()
    changed = cfg.with_ops({("add", "Add"): OpConfig.fallback()})
    assert changed.fingerprint() != cfg.fingerprint()
    assert cfg.ops[("add", "Add")].precision == "bf16", "with_ops leaves the original alone"
    other_size = TuneConfig(dict(cfg.ops), 65, dict(cfg.options))
    assert other_size.fingerprint() != cfg.fingerprint()
    assert len(cfg.fingerprint()) == 16


def test_fingerprint_is_stable_across_processes():
    script = (
        "import json, sys; from lpq import TuneConfig; "
        "print(TuneConfig.from_json(json.loads(sys.argv[1])).fingerprint())"
    )
    arg = json.dumps(sample().to_json())
    prints = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        result = subprocess.run(
            [sys.executable, "-c", script, arg], capture_output=True, text=True, env=env
        )
        assert result.returncode == 0, result.stderr
        prints.add(result.stdout.strip())
    assert prints == {sample().fingerprint()}


def test_quantized_and_fallback_ops():
    cfg = sample()
    assert cfg.quantized_ops() == [("conv1", "Conv"), ("fc", "MatMul")]
    assert cfg.fallback_ops() == [("add", "Add"), ("head", "Gemm")]


@pytest.mark.parametrize(
    "bad", [{}, {"ops": [{"name": "x"}]}, {"ops": "nope"}, {"ops": [], "calib_sampling_size": "x"}]
)
def test_invalid_json_is_a_config_error(bad):
    with pytest.raises(lpq.ConfigError, match="not a valid tune_cfg"):
        TuneConfig.from_json(bad)


def test_fallback_must_be_a_float_precision():
    with pytest.raises(lpq.ConfigError, match="fp32, fp16, bf16"):
        OpConfig.fallback("int8")


def test_with_fallbacks_makes_the_named_ops_fp32_and_leaves_the_rest():
    cfg = sample()
    fallen = cfg.with_fallbacks(["conv1", "add", "not-an-op"])
    assert fallen.ops[("conv1", "Conv")] == OpConfig.fallback()
    assert fallen.ops[("add", "Add")] == OpConfig.fallback()  # bf16 -> fp32
    assert fallen.ops[("fc", "MatMul")] == cfg.ops[("fc", "MatMul")]
    assert set(fallen.ops) == set(cfg.ops) and fallen.options == cfg.options
    assert cfg.ops[("conv1", "Conv")].quantized  # the original is left untouched
