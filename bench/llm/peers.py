"""The peers' weight-only int4/int8 variants of the same SmolLM2 model.

Each entry builds one quantized model from the shared fp32 ONNX export (or the fp32
torch model) and is run by ``run.py`` in a child process, so its wall time and peak
memory are its own. Why these: they are what a user would reach for today: ONNX
Runtime's ``MatMulNBitsQuantizer`` (its DEFAULT RTN and the INC-derived RTN / k-quant /
GPTQ paths, and HQQ), onnxruntime-genai's model builder, NNCF ``compress_weights`` on
the ONNX model and torchao's weight-only configs on the torch model. Settings follow
each tool's documented defaults, except ``accuracy_level=4`` (int8 activations) on ORT
rows so that they can use the fast MatMulNBits kernel, as the builder does by default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import model as llm_model
import numpy as np
from model import BuildContext


@dataclass(frozen=True)
class Peer:
    name: str
    build: Callable[[BuildContext], Any]
    extras: bool = False  # runs in the overlay venv (onnxruntime-genai, NNCF)
    quick: bool = False  # part of --quick


# ---------------------------------------------------------------------- ONNX helpers
def _load_named(path: Path):
    """Load with external data and give every node a unique name.

    MatMulNBitsQuantizer keys per-node configs (and its INC-derived RTN/GPTQ paths)
    by node name; unnamed nodes would collide.
    """
    import onnx

    proto = onnx.load(str(path))
    seen: set[str] = set()
    for i, node in enumerate(proto.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}"
        seen.add(node.name)
    return proto


def _save(proto: Any, out_dir: Path) -> Path:
    import onnx

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.onnx"
    onnx.save_model(
        proto,
        str(path),
        save_as_external_data=True,
        location="model.onnx.data",
        size_threshold=1024,
    )
    return path


def calib_feeds(ctx: BuildContext, path: Path) -> list[dict[str, np.ndarray]]:
    """Decoder inputs for each calibration window: full window, mask of ones, empty cache."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    names = [i.name for i in graph.input]
    feeds = []
    for window in ctx.calib:
        feed: dict[str, np.ndarray] = {"input_ids": window[None].astype(np.int64)}
        if "attention_mask" in names:
            feed["attention_mask"] = np.ones((1, window.size), dtype=np.int64)
        for n in names:
            if n.startswith("past_key_values."):
                feed[n] = np.zeros((1, ctx.kv_heads, 0, ctx.head_dim), dtype=np.float32)
        feeds.append(feed)
    return feeds


# ------------------------------------------------------------------ ONNX Runtime
def ort_nbits(ctx: BuildContext, algo: str, block: int, sym: bool, accuracy_level: int = 4) -> Path:
    """ORT MatMulNBitsQuantizer, 4 bits, MatMul weights only (embeddings stay fp32)."""
    from onnxruntime.quantization import matmul_nbits_quantizer as mnq

    proto = _load_named(ctx.fp32_onnx)
    config: Any = None
    if algo == "rtn":
        config = mnq.RTNWeightOnlyQuantConfig()
    elif algo == "k_quant":
        config = mnq.KQuantWeightOnlyQuantConfig()
    elif algo == "hqq":  # asymmetric by construction (float zero points)
        config = mnq.HQQWeightOnlyQuantConfig(block_size=block, bits=4)
    elif algo == "gptq":
        config = mnq.GPTQWeightOnlyQuantConfig(
            calibration_data_reader=_Reader(calib_feeds(ctx, ctx.fp32_onnx)), block_size=128
        )
    quant = mnq.MatMulNBitsQuantizer(
        proto,
        bits=4,
        block_size=block,
        is_symmetric=sym,
        accuracy_level=accuracy_level,
        algo_config=config,
    )
    quant.process()
    result = quant.model
    return _save(getattr(result, "model", result), ctx.out_dir)


class _Reader:
    """A CalibrationDataReader over precomputed feeds (copyable: GPTQ deep-copies it)."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self.feeds, self.i = feeds, 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.i >= len(self.feeds):
            return None
        self.i += 1
        return self.feeds[self.i - 1]

    def __iter__(self):
        return iter(self.feeds)

    def rewind(self) -> None:
        self.i = 0


# ---------------------------------------------------------- onnxruntime-genai builder
def builder(ctx: BuildContext, name: str, extra: dict[str, str]) -> Path:
    """The genai model builder's own int4 export, from the HF checkpoint (not from fp32 ONNX)."""
    import shutil

    shutil.rmtree(ctx.cache / "onnx" / name, ignore_errors=True)  # time a real build
    return llm_model.build_onnx(name, "int4", extra, cache=ctx.cache)


# ------------------------------------------------------------------------------ NNCF
def nncf_int4(ctx: BuildContext, sym: bool, group: int, **algorithms: bool) -> Path:
    """NNCF compress_weights on the ONNX model, every MatMul int4 (ratio 1.0).

    NNCF's default keeps embeddings and the last MatMul (lm_head) in its 8-bit backup
    mode; we leave that default, as a user would.
    """
    import nncf

    proto = _load_named(ctx.fp32_onnx)
    mode = nncf.CompressWeightsMode.INT4_SYM if sym else nncf.CompressWeightsMode.INT4_ASYM
    compressed = nncf.compress_weights(
        proto,
        mode=mode,
        ratio=1.0,
        group_size=group,
        dataset=nncf.Dataset(calib_feeds(ctx, ctx.fp32_onnx)),
        **algorithms,
    )
    return _save(compressed, ctx.out_dir)


# ---------------------------------------------------------------------------- torchao
def torchao(ctx: BuildContext, kind: str) -> Any:
    """torchao weight-only on the HF torch model's Linear layers (lm_head included)."""
    import torch
    from torchao import quantization as tq

    module = ctx.load_torch()
    if kind == "int8":
        config: Any = tq.Int8WeightOnlyConfig()
    elif kind == "int4":  # the CPU int4 kernel needs the "opaque" packing
        config = tq.Int4WeightOnlyConfig(group_size=32, int4_packing_format="opaque")
    else:  # intx: int4 values, group 32, no special kernel
        config = tq.IntxWeightOnlyConfig(
            weight_dtype=torch.int4, granularity=tq.granularity.PerGroup(32)
        )
    tq.quantize_(module, config)
    return module


def torch_fp32(ctx: BuildContext) -> Any:
    """The fp32 torch model itself: the reference for torch rows' speed."""
    return ctx.load_torch()


# -------------------------------------------------------------------------- registry
def _peers() -> list[Peer]:
    rows: list[Peer] = []
    for block in (32, 128):
        for sym in (True, False):
            tag = f"b{block}-{'sym' if sym else 'asym'}"
            quick = block == 32
            rows.append(
                Peer(
                    f"ort-default-{tag}",
                    partial(ort_nbits, algo="default", block=block, sym=sym),
                    quick=quick and sym,
                )
            )
            rows.append(
                Peer(f"ort-rtn-{tag}", partial(ort_nbits, algo="rtn", block=block, sym=sym))
            )
            rows.append(
                Peer(
                    f"ort-kquant-{tag}",
                    partial(ort_nbits, algo="k_quant", block=block, sym=sym),
                    quick=quick and not sym,
                )
            )
    rows.append(
        Peer(
            "ort-default-b32-sym-acc0",
            partial(ort_nbits, algo="default", block=32, sym=True, accuracy_level=0),
        )
    )
    rows.append(Peer("ort-gptq-b128-asym", partial(ort_nbits, algo="gptq", block=128, sym=False)))
    rows.append(Peer("ort-gptq-b32-sym", partial(ort_nbits, algo="gptq", block=32, sym=True)))
    for block in (32, 128):
        rows.append(
            Peer(
                f"ort-hqq-b{block}-asym",
                partial(ort_nbits, algo="hqq", block=block, sym=False),
                quick=block == 128,
            )
        )
    rows += [
        Peer(
            "builder-int4", partial(builder, name="builder-int4", extra={}), extras=True, quick=True
        ),
        Peer(
            "builder-int4-lmhead-fp32",
            partial(
                builder,
                name="builder-int4-lmhead-fp32",
                extra={"nodes_to_exclude": "/lm_head/MatMul"},
            ),
            extras=True,
        ),
        Peer(
            "builder-int4-lmhead-int8",
            partial(
                builder,
                name="builder-int4-lmhead-int8",
                extra={"matmul_mixed_precision": "last_matmul:int8"},
            ),
            extras=True,
        ),
        Peer(
            "builder-int4-kquant-mixed",
            partial(
                builder, name="builder-int4-kquant-mixed", extra={"algo_config": "k_quant_mixed"}
            ),
            extras=True,
        ),
    ]
    for sym in (True, False):
        s = "sym" if sym else "asym"
        rows.append(
            Peer(
                f"nncf-int4-{s}-g32-awq-se",
                partial(nncf_int4, sym=sym, group=32, awq=True, scale_estimation=True),
                extras=True,
                quick=sym,
            )
        )
    rows.append(
        Peer(
            "nncf-int4-sym-g32-gptq", partial(nncf_int4, sym=True, group=32, gptq=True), extras=True
        )
    )
    rows.append(
        Peer(
            "nncf-int4-sym-g128-awq-se",
            partial(nncf_int4, sym=True, group=128, awq=True, scale_estimation=True),
            extras=True,
        )
    )
    rows += [
        Peer("torch-fp32", torch_fp32, quick=True),
        Peer("torchao-int8-wo", partial(torchao, kind="int8"), quick=True),
        Peer("torchao-int4-wo-g32", partial(torchao, kind="int4")),
        Peer("torchao-intx-int4-g32", partial(torchao, kind="intx")),
    ]
    return rows


PEERS: dict[str, Peer] = {p.name: p for p in _peers()}


def variants() -> list[tuple[str, Callable[[BuildContext], Any]]]:
    """The same ``variants()`` interface lpq's bench modules implement."""
    return [(p.name, p.build) for p in PEERS.values()]
