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
def untie_embedding(proto: Any) -> Any:
    """Give the embedding ``Gather`` its own ``(vocab, hidden)`` initializer, in place.

    The genai builder ties SmolLM2's embedding to ``lm_head``: it stores one initializer,
    ``lm_head.MatMul.weight`` ``(hidden, vocab)``, and the embedding ``Gather`` reads it
    through a ``Transpose``. NNCF's ONNX backend looks for a ``Gather``'s table among the
    initializers and stops on the ``Transpose``'s output ("There is no tensor with the
    name /model/embed_tokens/Transpose/output_0"). Replacing ``Transpose`` -> ``Gather``
    with a ``Gather`` over the transposed copy computes exactly the same function (the
    copy is bit-identical, the embedding is just no longer shared with ``lm_head``), so
    NNCF sees the graph an untied export such as ``optimum``'s would give it.
    """
    from onnx import numpy_helper

    graph = proto.graph
    inits = {t.name: t for t in graph.initializer}
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    untied = 0
    for node in list(graph.node):
        if node.op_type != "Transpose" or node.input[0] not in inits:
            continue
        users = consumers.get(node.output[0], [])
        if not users or any(u.op_type != "Gather" or u.input[0] != node.output[0] for u in users):
            continue
        perm = [a.ints for a in node.attribute if a.name == "perm"]
        if perm and list(perm[0]) != [1, 0]:
            continue
        table = np.ascontiguousarray(numpy_helper.to_array(inits[node.input[0]]).T)
        name = node.output[0].replace("/", "_").strip("_") + "_untied"
        graph.initializer.append(numpy_helper.from_array(table, name))
        for user in users:
            user.input[0] = name
        graph.node.remove(node)
        untied += 1
    if not untied:
        raise ValueError("no Transpose -> Gather over an initializer to untie")
    return proto


def nncf_int4(
    ctx: BuildContext,
    sym: bool,
    group: int,
    ignore: tuple[str, ...] = (),
    backup: str | None = None,
    **options: bool,
) -> Path:
    """NNCF compress_weights on the (untied) ONNX model, every decoder MatMul int4 (ratio 1.0).

    NNCF's default keeps the embedding and the last MatMul (lm_head) in its 8-bit backup
    mode (int8 asym per channel); rows leave that default, as a user would, unless named
    ``-all`` (``all_layers=True``: both int4) or ``-lmhead4`` (``all_layers=True`` with the
    embedding ``Gather`` in ``ignored_scope``: lm_head int4, the embedding fp32) or
    ``-backup-none`` (``backup_mode=NONE``: both stay fp32). Why the variants: ONNX
    Runtime fuses NNCF's 4-bit ``DequantizeLinear`` + ``MatMul`` into ``MatMulNBits``
    but runs the int8 per-channel ``DequantizeLinear`` of the 49152 x 576 embedding and
    lm_head on every call, so the default rows are accurate but decode slowly.
    ``options`` go to ``compress_weights`` as they are (awq, scale_estimation, gptq, ...).
    Group 128 does not divide SmolLM2's 576-wide inputs; NNCF's default fallback is to
    raise, so rows use its ``GroupSizeFallbackMode.ADJUST``: those MatMuls get the largest
    power-of-two group that divides 576 (64), the 1536-wide down_proj keeps 128 (the
    ORT DEFAULT rows pad instead). Group 32 divides everything and is unaffected.
    With opset 22 NNCF writes blocked ``DequantizeLinear`` + ``MatMul``, which ONNX
    Runtime fuses into ``MatMulNBits`` (accuracy_level 4 by default) when the session
    is created: the same kernel as the ORT and builder rows.
    """
    import nncf

    proto = untie_embedding(_load_named(ctx.fp32_onnx))
    mode = nncf.CompressWeightsMode.INT4_SYM if sym else nncf.CompressWeightsMode.INT4_ASYM
    compressed = nncf.compress_weights(
        proto,
        mode=mode,
        ratio=1.0,
        group_size=group,
        dataset=nncf.Dataset(calib_feeds(ctx, ctx.fp32_onnx)),
        ignored_scope=nncf.IgnoredScope(names=list(ignore)) if ignore else None,
        backup_mode=nncf.BackupMode(backup) if backup else None,
        advanced_parameters=nncf.AdvancedCompressionParameters(
            group_size_fallback_mode=nncf.GroupSizeFallbackMode.ADJUST
        ),
        **options,
    )
    return _save(compressed, ctx.out_dir)


# ---------------------------------------------------------------------------- torchao
def torchao(ctx: BuildContext, kind: str) -> Any:
    """torchao weight-only on the HF torch model's Linear layers (lm_head included).

    What the installed torchao (0.18) runs on an x86 CPU, found by reading its source
    and trying each config on one Linear:

    * ``int8``: ``Int8WeightOnlyConfig`` on the fp32 model (``Int8Tensor``).
    * ``int4``: ``Int4WeightOnlyConfig`` has no CPU packing any more in 0.18 (``plain``
      needs the CUDA ``mslk`` kernels, ``tile_packed_to_4d`` is tinygemm on CUDA, the
      CPU ``opaque`` format was removed); the CPU int4 kernel
      (``aten._weight_int4pack_mm_for_cpu``) is reached through the prototype
      ``PrototypeInt4WeightOnlyConfig`` (``Int4OpaqueTensor``), which wants bfloat16
      activations (in fp32 it converts on every call and is ~15x slower per Linear), so
      this row runs the model in bfloat16, as torchao's int4 recipes do.
    * ``intx``: ``IntxWeightOnlyConfig`` int4, group 32 (``IntxUnpackedToInt8Tensor``):
      int4 values stored as int8 and dequantized per call, no fused kernel. The fused
      CPU variants (``Int8DynamicActivationIntxWeightConfig`` with an ``opaque_*``
      packing, the prototype da8w4) need KleidiAI (Arm) or torchao's C++ CPU kernels,
      which this wheel does not load on x86.
    """
    import torch
    from torchao import quantization as tq

    module = ctx.load_torch()
    if kind == "int8":
        config: Any = tq.Int8WeightOnlyConfig()
    elif kind == "int4":
        from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig

        module = module.to(torch.bfloat16)
        config = PrototypeInt4WeightOnlyConfig(group_size=32)
    else:
        config = tq.IntxWeightOnlyConfig(
            weight_dtype=torch.int4, granularity=tq.granularity.PerGroup(32)
        )
    tq.quantize_(module, config)
    return module


def torch_fp32(ctx: BuildContext) -> Any:
    """The fp32 torch model itself: the reference for torch rows' speed."""
    return ctx.load_torch()


def torch_bf16(ctx: BuildContext) -> Any:
    """The torch model in bfloat16: what torchao's int4 row gains over dtype alone."""
    import torch

    return ctx.load_torch().to(torch.bfloat16)


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
    for group in (32, 128):
        for sym in (True, False):
            s = "sym" if sym else "asym"
            rows.append(
                Peer(
                    f"nncf-int4-{s}-g{group}-awq-se",
                    partial(nncf_int4, sym=sym, group=group, awq=True, scale_estimation=True),
                    extras=True,
                    quick=sym and group == 32,
                )
            )
    # no AWQ / scale estimation: what the two algorithms add
    rows.append(Peer("nncf-int4-sym-g32", partial(nncf_int4, sym=True, group=32), extras=True))
    # all_layers: embedding and lm_head int4 too (NNCF's default keeps them int8)
    rows.append(
        Peer(
            "nncf-int4-sym-g32-awq-se-all",
            partial(
                nncf_int4, sym=True, group=32, awq=True, scale_estimation=True, all_layers=True
            ),
            extras=True,
        )
    )
    rows.append(
        Peer(
            "nncf-int4-sym-g32-awq-se-lmhead4",
            partial(
                nncf_int4,
                sym=True,
                group=32,
                ignore=("/model/embed_tokens/Gather",),
                awq=True,
                scale_estimation=True,
                all_layers=True,
            ),
            extras=True,
        )
    )
    rows.append(
        Peer(
            "nncf-int4-asym-g32-awq-se-backup-none",
            partial(nncf_int4, sym=False, group=32, backup="none", awq=True, scale_estimation=True),
            extras=True,
        )
    )
    rows.append(
        Peer(
            "nncf-int4-sym-g32-gptq", partial(nncf_int4, sym=True, group=32, gptq=True), extras=True
        )
    )
    rows += [
        Peer("torch-fp32", torch_fp32, quick=True),
        Peer("torch-bf16", torch_bf16),
        Peer("torchao-int8-wo", partial(torchao, kind="int8"), quick=True),
        Peer("torchao-int4-wo-g32", partial(torchao, kind="int4")),
        Peer("torchao-intx-int4-g32", partial(torchao, kind="intx")),
    ]
    return rows


PEERS: dict[str, Peer] = {p.name: p for p in _peers()}


def variants() -> list[tuple[str, Callable[[BuildContext], Any]]]:
    """The same ``variants()`` interface lpq's bench modules implement."""
    return [(p.name, p.build) for p in PEERS.values()]
