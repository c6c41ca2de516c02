"""lpq's ONNX Runtime rows for the SmolLM2 bench (``run.py`` picks up ``variants()``).

Every row quantizes the builder's fp32 export (``ctx.fp32_onnx``) through lpq's public
API: ``lpq.quantize(path, PostTrainingQuantConfig(approach="weight_only", ...),
calib_dataloader=ArrayLoader(ctx.calib))`` and ``QuantizedModel.save``. lpq-onnxrt
writes the MatMulNBits nodes itself (docs/llm.md, ONNX Runtime).

lm_head: the genai builder's export reads the embedding through
``Transpose(lm_head.MatMul.weight)``; lpq-onnxrt folds that Transpose into a second
initializer when it loads the model (so its tied-lm_head detection sees the table, and
the saved file holds the fp32 table twice). The fp32 rows also name the head in
``op_name_dict`` besides ``adaptor_options={"lm_head": "fp32"}``; the int8 row can only
use the adaptor option (see ``_build``); the build log prints the report's
lm_head decision and the precisions found (``lpq-summary`` line).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

LM_HEAD = "/lm_head/MatMul"
CALIB_BATCH = 2


def _weight(algorithm: str, dtype: str = "int4", block: int = 32) -> dict[str, Any]:
    return {"weight": {"dtype": [dtype], "algorithm": [algorithm], "block_size": [block]}}


def _feeds(ctx: Any) -> dict[str, np.ndarray]:
    """The calibration windows with the mask and an empty KV cache given explicitly.

    lpq-onnxrt fills these itself from ``input_ids`` (``llm_io.fill_decoder_inputs``), but
    it sets every symbolic dim after the batch to 0, and the builder declares the cache
    as ``(batch_size, 3, past_sequence_length, kv_cache_dim)``: the head dim came out 0
    and GroupQueryAttention refused it ("Input 'past_key' dimension 3 should match the
    packed KV head dimension, got 0 expected 64"). Inputs already in the feed are kept.
    """
    import onnx

    ids = np.asarray(ctx.calib, dtype=np.int64)
    feeds: dict[str, np.ndarray] = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    model = onnx.load(str(ctx.fp32_onnx), load_external_data=False)
    for spec in model.graph.input:
        if spec.name.startswith("past_key_values."):
            feeds[spec.name] = np.zeros((len(ids), ctx.kv_heads, 0, ctx.head_dim), np.float32)
    return feeds


def _build(
    ctx: Any,
    algorithm: str,
    lm_head: str = "auto",
    names: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
) -> Path:
    import lpq
    from lpq_onnxrt.passes.weight_only import read_report

    # lm_head=int8 goes through the adaptor option only: an int8 op_name_dict entry beside
    # an int4 op_type_dict allows nothing ("op_name_dict['/lm_head/MatMul'] allows none of
    # the options the onnxrt adaptor supports"), the two are intersected; a string
    # override must be a float precision. So rows that set a dtype per name leave the
    # dtype out of the type dict (int4 is the first, default, weight-only precision).
    weight = _weight(algorithm)
    if names:
        del weight["weight"]["dtype"]
    heads = {LM_HEAD: "fp32"} if lm_head == "fp32" else {}
    conf = lpq.PostTrainingQuantConfig(
        approach="weight_only",
        op_type_dict={"MatMul": weight},
        op_name_dict={**heads, **(names or {})},
        latency_aware=False,
        adaptor_options={"lm_head": lm_head, **(options or {})},
    )
    calib = lpq.ArrayLoader(_feeds(ctx), batch_size=CALIB_BATCH)
    start = time.perf_counter()
    qmodel = lpq.quantize(str(ctx.fp32_onnx), conf, calib_dataloader=calib)
    quant_s = time.perf_counter() - start
    out = qmodel.save(ctx.out_dir / "model.onnx")
    report = read_report(qmodel.model.proto) or {}
    found = lpq.get_plugin_manager().quantized_ops(qmodel.framework, qmodel.model)
    counts: dict[str, int] = {}
    for precision in found.values():
        counts[precision] = counts.get(precision, 0) + 1
    summary = {
        "quantize_s": round(quant_s, 1),
        "lm_head_report": report.get("lm_head"),
        "lm_head_precision": found.get(LM_HEAD),
        "precisions": counts,
        "accuracy_level": report.get("accuracy_level"),
        "awq_skipped": len(report.get("awq_skipped", {})),
        "files": sorted(p.name for p in Path(out).parent.iterdir()),
    }
    print("lpq-summary " + json.dumps(summary, default=str), flush=True)
    return Path(out)


def _row(algorithm: str, lm_head: str = "auto", **kw: Any) -> Callable[[Any], Path]:
    def build(ctx: Any) -> Path:
        return _build(ctx, algorithm, lm_head, **kw)

    return build


_MLP = r".*/mlp/(gate|up|down)_proj/MatMul"


def variants() -> list[tuple[str, Callable[[Any], Path]]]:
    return [
        # lm_head=auto: int8 when it keeps next-token agreement on the calibration
        # windows (measured by the pass, recorded in the report), else fp32
        ("lpq-rtn", _row("rtn")),
        ("lpq-gptq", _row("gptq")),
        ("lpq-awq", _row("awq")),
        ("lpq-scale-search", _row("scale_search")),
        ("lpq-rtn-lmhead-int8", _row("rtn", "int8")),
        ("lpq-scale-search-lmhead-fp32", _row("scale_search", "fp32")),
        ("lpq-gptq-int8-mlp", _row("gptq", names={_MLP: {"weight": {"dtype": ["int8"]}}})),
    ]
