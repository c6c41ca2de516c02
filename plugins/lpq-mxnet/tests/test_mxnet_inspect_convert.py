"""lpq_inspect_tensor (fp32 vs int8, per op) and lpq_convert_bf16.

bf16 needs a CPU with AVX-512 BF16 or AMX-BF16 (oneDNN's bf16 kernels), and lpq-mxnet
refuses it where ``lpq.cpu_features()`` lists neither. The suite plans for an AVX2 CPU
(``LPQ_CPU_FLAGS``), so the bf16 tests plan for a bf16 CPU explicitly; the one that runs
a bf16 model is skipped where the real CPU lacks the kernels.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import lpq
from lpq_mxnet.model_io import info_of

#: A CPU with oneDNN bf16 kernels, as LPQ_CPU_FLAGS names it.
BF16_CPU_FLAGS = "avx2 avx512bw avx512_bf16"


def real_cpu_flags() -> frozenset[str]:
    """This machine's CPU flags as archspec reads them, whatever LPQ_CPU_FLAGS says."""
    try:
        from archspec.cpu.detect import detected_info

        return frozenset(detected_info().features)
    except Exception:  # an unknown platform: no flags
        return frozenset()


@pytest.fixture
def bf16_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plan for a CPU with bf16 kernels (enough for tests that do not run the model)."""
    monkeypatch.setenv("LPQ_CPU_FLAGS", BF16_CPU_FLAGS)


@pytest.fixture
def bf16_cpu(bf16_plan: None) -> None:
    """Plan for a bf16 CPU and run on one: skipped where this CPU has no bf16 kernels."""
    if not real_cpu_flags() & {"avx512_bf16", "amx_bf16"}:
        pytest.skip(
            "needs a CPU with AVX-512 BF16 or AMX-BF16 (archspec finds neither here): "
            "MXNet's oneDNN has no bf16 kernels on this CPU"
        )


@pytest.fixture
def qnet(pm: Any, digits_cnn: Any, calib_loader: Any) -> Any:
    cap = pm.query_capability("mxnet", digits_cnn, calib_loader, {})
    cfg = lpq.TuneConfig(ops={k: cap.default_op_config(k) for k in cap.opwise})
    cfg = cfg.with_ops(
        {  # per-tensor FullyConnected: int8 weights stored in the model, readable
            k: lpq.OpConfig(
                op.precision, op.mode, lpq.TensorConfig("int8", granularity="per_tensor"),
                op.activation,
            )
            for k, op in cfg.ops.items()
            if k[1] == "FullyConnected"
        }
    )  # fmt: skip
    return pm.quantize("mxnet", digits_cnn, cfg, calib_loader)


def test_int8_activations_track_fp32_op_by_op(
    pm: Any, digits_cnn: Any, qnet: Any, eval_loader: Any
) -> None:
    fp32 = pm.inspect_tensor("mxnet", digits_cnn, eval_loader, None, "activation", 2)
    int8 = pm.inspect_tensor("mxnet", qnet, eval_loader, None, "activation", 2)
    assert list(fp32.activations) == list(int8.activations) == [
        "digits_conv0_fwd", "digits_conv1_fwd", "digits_pool0_fwd",
        "digits_flatten0_flatten0", "digits_dense0_fwd", "digits_dense1_fwd",
    ]  # fmt: skip
    for name, batches in fp32.activations.items():
        assert len(batches) == len(int8.activations[name]) == 2
        a, b = batches[0], int8.activations[name][0]
        assert a.shape == b.shape and b.dtype == np.float32
        rel = np.linalg.norm(a - b) / np.linalg.norm(a)
        assert 0 < rel < 0.05, (name, rel)  # dequantized int8: close, but not identical
    # conv0 is fused with BatchNorm + ReLU: both captures are taken after the ReLU.
    assert fp32.activations["digits_conv0_fwd"][0].min() >= 0


def test_weights_fp32_and_stored_int8(
    pm: Any, digits_cnn: Any, qnet: Any, eval_loader: Any
) -> None:
    fp32 = pm.inspect_tensor("mxnet", digits_cnn, eval_loader, None, "weight", 1)
    assert set(fp32.weights["digits_conv0_fwd"]) == {"digits_conv0_weight", "digits_conv0_bias"}
    int8 = pm.inspect_tensor("mxnet", qnet, eval_loader, ["digits_dense0_fwd"], "weight", 1)
    w32 = fp32.weights["digits_dense0_fwd"]["digits_dense0_weight"]
    w8 = int8.weights["digits_dense0_fwd"]["digits_dense0_weight"]
    step = np.abs(w32).max() / 127
    # Within one level of a per-tensor int8 grid (MXNet's dequantize divides by 128 where
    # its quantize multiplied by 127, so not always within half a level).
    assert np.abs(w8 - w32).max() <= step
    assert 128 < len(np.unique(w8)) <= 255


def test_inspecting_one_op(pm: Any, qnet: Any, eval_loader: Any) -> None:
    found = pm.inspect_tensor("mxnet", qnet, eval_loader, ["digits_conv1_fwd"], "activation", 1)
    assert [a.shape for a in found.activations["digits_conv1_fwd"]] == [(100, 32, 8, 8)]


def test_inspecting_an_unknown_op_is_a_model_error(
    pm: Any, digits_cnn: Any, eval_loader: Any
) -> None:
    with pytest.raises(lpq.ModelError, match="no op named nope"):
        pm.inspect_tensor("mxnet", digits_cnn, eval_loader, ["nope"], "activation", 1)


def test_bf16_runs_chosen_convolutions_in_bf16(
    pm: Any, digits_cnn: Any, eval_loader: Any, top1: Any, bf16_cpu: None
) -> None:
    chosen = ["digits_conv0_fwd", "digits_dense0_fwd"]
    model = pm.convert_bf16("mxnet", digits_cnn, chosen, "bf16")
    found = pm.quantized_ops("mxnet", model)
    assert {n for n, p in found.items() if p == "bf16"} == set(chosen)
    assert found["digits_conv1_fwd"] == found["digits_dense1_fwd"] == "fp32"
    fp32 = pm.evaluate("mxnet", digits_cnn, eval_loader, [top1]).accuracy
    assert pm.evaluate("mxnet", model, eval_loader, [top1]).accuracy >= fp32 * 0.99
    outputs = pm.inspect_tensor("mxnet", model, eval_loader, chosen, "activation", 1)
    reference = pm.inspect_tensor("mxnet", digits_cnn, eval_loader, chosen, "activation", 1)
    for name in chosen:
        a, b = reference.activations[name][0], outputs.activations[name][0]
        assert 0 < np.linalg.norm(a - b) / np.linalg.norm(a) < 0.02  # bf16: 8 mantissa bits


def test_bf16_refuses_ops_without_kernels_and_fp16(
    pm: Any, digits_cnn: Any, bf16_plan: None
) -> None:
    with pytest.raises(lpq.ModelError, match="no bf16 kernel for Pooling"):
        pm.convert_bf16("mxnet", digits_cnn, ["digits_pool0_fwd"], "bf16")
    with pytest.raises(lpq.ModelError, match="no fp16 kernels"):
        pm.convert_bf16("mxnet", digits_cnn, ["digits_conv0_fwd"], "fp16")


def test_bf16_fallbacks_in_a_tune_cfg(
    pm: Any, digits_cnn: Any, calib_loader: Any, bf16_plan: None
) -> None:
    conv0 = ("digits_conv0_fwd", "Convolution")
    only_bf16 = lpq.TuneConfig(ops={conv0: lpq.OpConfig.fallback("bf16")})
    model = pm.quantize("mxnet", digits_cnn, only_bf16, calib_loader)
    assert pm.quantized_ops("mxnet", model)["digits_conv0_fwd"] == "bf16"
    info = info_of(model)
    assert info is not None and info.tune_cfg == only_bf16.to_json()
    cap = pm.query_capability("mxnet", digits_cnn, calib_loader, {})
    mixed = lpq.TuneConfig(ops={k: cap.default_op_config(k) for k in cap.opwise}).with_ops(
        {conv0: lpq.OpConfig.fallback("bf16")}
    )
    with pytest.raises(lpq.ConfigError, match="cannot mix int8 and"):
        pm.quantize("mxnet", digits_cnn, mixed, calib_loader)


def test_bf16_on_a_cpu_without_bf16_kernels_is_a_clear_model_error(
    pm: Any, digits_cnn: Any, calib_loader: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LPQ_CPU_FLAGS", "avx2")
    with pytest.raises(lpq.ModelError, match="CPU has no bf16 kernels for MXNet") as raised:
        pm.convert_bf16("mxnet", digits_cnn, ["digits_conv0_fwd"], "bf16")
    assert "keep the model in fp32" in str(raised.value)
    assert "AVX-512 BF16 or AMX" in str(raised.value)
    conv0 = ("digits_conv0_fwd", "Convolution")
    only_bf16 = lpq.TuneConfig(ops={conv0: lpq.OpConfig.fallback("bf16")})
    with pytest.raises(lpq.ModelError, match="CPU has no bf16 kernels for MXNet"):
        pm.quantize("mxnet", digits_cnn, only_bf16, calib_loader)


def test_onednn_without_a_bf16_kernel_at_run_time_is_not_a_data_error() -> None:
    """What MXNet raises when a bf16 model runs on a CPU without bf16 kernels (if the
    check before converting was bypassed, e.g. by LPQ_CPU_FLAGS): a ModelError about
    the CPU, not a complaint about the inputs' shape."""
    import mxnet as mx

    from lpq_mxnet.data import run
    from lpq_mxnet.info import INFO_ATTR

    def fails(*_inputs: Any) -> Any:
        raise mx.base.MXNetError("MXNetError: could not create a primitive descriptor iterator")

    block = type("Block", (), {"__call__": staticmethod(fails)})()
    setattr(block, INFO_ATTR, SimpleNamespace(precision="bf16"))
    inputs = [mx.nd.zeros((1, 1, 8, 8))]
    with pytest.raises(lpq.ModelError, match="no bf16 kernel for this model on this CPU"):
        run(block, inputs)
    setattr(block, INFO_ATTR, SimpleNamespace(precision="fp32"))
    with pytest.raises(lpq.DataError):
        run(block, inputs)
