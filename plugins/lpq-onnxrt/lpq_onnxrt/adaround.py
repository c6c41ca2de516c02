"""AdaRound: learn whether each int8 weight rounds up or down (numpy only).

Rounding to nearest is not what minimizes a layer's *output* error: Nagel et al. (2020)
learn, per weight, ``h in [0, 1]`` in ``W_q = s * clip(floor(W / s) + h, -127, 127)`` by
gradient descent on ``||X W^T - X W_q^T||^2`` over the layer's real inputs ``X`` plus a
regularizer that pushes every ``h`` to 0 or 1 (annealed), then round ``h``. Here, per
Conv (any groups, via sampled im2col patches), Gemm and MatMul with a constant weight
that the tune_cfg quantizes to symmetric int8:

- inputs come from the fp32 model on the calibration data, a few hundred sampled rows
  (conv patches) per feed, streamed one sample at a time;
- 80% of the rows train, 20% are held out: a layer keeps the learned rounding only when
  its held-out output error beats rounding to nearest (Quark's AdaRound scored 0.97 IoU on
  its calibration images and 0.89 on held-out ones: this is the guard against that);
- the learned weights are written back *on ORT's grid*: the scale ORT will compute
  (``max|W_c| / 127`` per channel, or per tensor) is unchanged because the largest
  weight is exactly representable, so ORT's own quantizer reproduces them exactly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from lpq import OpConfig

from .qrange import weight_qmax

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

_ROWS_PER_FEED = 256
_MAX_ROWS = 4096
_ZETA, _GAMMA = 1.1, -0.1  # rectified sigmoid stretch (the paper's values)


@dataclass
class _Layer:
    node: onnx.NodeProto
    weight: np.ndarray  # (O, G*Kg) rows grouped: (G, Og, Kg) view below
    groups: int
    axis: int | None  # per-channel axis of the ORT weight (0 for conv/gemm-transB, 1 matmul)
    kind: str  # conv | matmul | gemm
    qmax: int  # largest integer code ORT gives this weight (127, or 64 with reduce_range)


def rectified_sigmoid(v: np.ndarray) -> np.ndarray:
    return np.clip(1.0 / (1.0 + np.exp(-v)) * (_ZETA - _GAMMA) + _GAMMA, 0.0, 1.0)


def learn_rounding(
    w: np.ndarray,
    scale: np.ndarray,
    x_train: np.ndarray,
    iterations: int,
    seed: int = 0,
    reg: float = 0.01,
    qmax: int = 127,
) -> np.ndarray:
    """Integer weights (``w / scale`` rounded up or down) minimizing the output error.

    ``w``: (G, O, K) per group, ``scale``: broadcastable to it, ``x_train``: (N, G, K).
    Adam on the soft rounding, beta annealed 20 -> 2, the reconstruction term normalized
    by the output energy so the regularizer weight is scale-free.
    """
    base = np.floor(w / scale)
    rest = w / scale - base
    # start where rounding to nearest is: h(v) = rest
    p = np.clip((rest - _GAMMA) / (_ZETA - _GAMMA), 1e-4, 1 - 1e-4)
    v = np.log(p / (1 - p))
    target = np.einsum("ngk,gok->ngo", x_train, w)
    energy = float(np.mean(target**2)) + 1e-12
    m, s2 = np.zeros_like(v), np.zeros_like(v)
    lr, b1, b2 = 0.05, 0.9, 0.999
    rng = np.random.default_rng(seed)
    batch = min(len(x_train), 512)
    for step in range(1, iterations + 1):
        rows = (
            rng.choice(len(x_train), batch, replace=False) if batch < len(x_train) else slice(None)
        )
        x = x_train[rows]
        sig = 1.0 / (1.0 + np.exp(-v))
        h = np.clip(sig * (_ZETA - _GAMMA) + _GAMMA, 0.0, 1.0)
        wq = (base + h) * scale
        err = np.einsum("ngk,gok->ngo", x, wq) - target[rows]
        grad_wq = 2.0 * np.einsum("ngo,ngk->gok", err, x) / (err.size * energy)
        inside = ((sig * (_ZETA - _GAMMA) + _GAMMA) > 0) & ((sig * (_ZETA - _GAMMA) + _GAMMA) < 1)
        dh_dv = inside * (_ZETA - _GAMMA) * sig * (1 - sig)
        grad = grad_wq * scale * dh_dv
        warm = step > iterations // 5  # reconstruction only at first, then round
        if warm:
            beta = 20.0 - (20.0 - 2.0) * (step - iterations // 5) / max(
                1, iterations - iterations // 5
            )
            d = 2 * h - 1
            # d/dh of (1 - |2h - 1|^beta)
            grad += reg * (-beta * np.abs(d) ** (beta - 1) * np.sign(d) * 2) * dh_dv / h.size * 1e3
        m = b1 * m + (1 - b1) * grad
        s2 = b2 * s2 + (1 - b2) * grad**2
        v -= lr * (m / (1 - b1**step)) / (np.sqrt(s2 / (1 - b2**step)) + 1e-8)
    hard = (rectified_sigmoid(v) >= 0.5).astype(w.dtype)
    learned = np.clip(base + hard, -qmax, qmax)
    # The largest weights keep their nearest value: ORT derives the scale from them.
    return np.where(np.abs(w / scale) >= qmax - 0.5, np.round(w / scale), learned)


def _output_error(x: np.ndarray, w: np.ndarray, wq: np.ndarray) -> float:
    return float(np.mean((np.einsum("ngk,gok->ngo", x, wq - w)) ** 2))


def _scale(w: np.ndarray, axis: int | None, qmax: int) -> np.ndarray:
    if axis is None:
        peak = np.abs(w).max()
    else:
        others = tuple(i for i in range(w.ndim) if i != axis)
        peak = np.abs(w).max(axis=others, keepdims=True)
    return np.where(peak > 0, peak / qmax, 1.0).astype(np.float32)


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _layers(model: onnx.ModelProto, ops: Mapping[str, OpConfig]) -> list[_Layer]:
    from onnx import numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    uses: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    found = []
    for node in model.graph.node:
        cfg = ops.get(node.name)
        if cfg is None or not cfg.quantized or cfg.weight is None:
            continue
        if cfg.weight.dtype != "int8" or cfg.weight.scheme != "sym" or len(node.input) < 2:
            continue
        if node.input[1] not in inits or uses.get(node.input[1]) != 1:
            continue
        w = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
        per_channel = cfg.weight.granularity == "per_channel"
        qmax = weight_qmax(cfg.weight)
        if node.op_type == "Conv" and w.ndim == 4:
            groups = int(_attr(node, "group", 1))
            found.append(_Layer(node, w, groups, 0 if per_channel else None, "conv", qmax))
        elif node.op_type == "MatMul" and w.ndim == 2:
            found.append(_Layer(node, w, 1, 1 if per_channel else None, "matmul", qmax))
        elif node.op_type == "Gemm" and w.ndim == 2 and not _attr(node, "transA", 0):
            trans = bool(_attr(node, "transB", 0))
            axis = (0 if trans else 1) if per_channel else None
            found.append(_Layer(node, w, 1, axis, "gemm", qmax))
    return found


def _grouped(layer: _Layer, w: np.ndarray) -> np.ndarray:
    """The weight as (G, Og, Kg): output rows per group over that group's inputs."""
    if layer.kind == "conv":
        o = w.shape[0]
        return w.reshape(layer.groups, o // layer.groups, -1)
    if layer.kind == "gemm" and bool(_attr(layer.node, "transB", 0)):
        return w[None]
    return w.T[None]  # MatMul / Gemm without transB: y = x @ W -> rows of W.T


def _ungrouped(layer: _Layer, g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if layer.kind == "conv":
        return g.reshape(shape)
    if layer.kind == "gemm" and bool(_attr(layer.node, "transB", 0)):
        return g[0]
    return g[0].T


def _sample_rows(layer: _Layer, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(n, G, Kg) input rows of the layer from one activation tensor."""
    if layer.kind != "conv":
        flat = x.reshape(-1, x.shape[-1])
        pick = rng.choice(len(flat), min(len(flat), _ROWS_PER_FEED), replace=False)
        return flat[pick][:, None, :]
    kh, kw = layer.weight.shape[2:]
    strides = _attr(layer.node, "strides", [1, 1])
    dil = _attr(layer.node, "dilations", [1, 1])
    pads = _attr(layer.node, "pads", [0, 0, 0, 0])
    if _attr(layer.node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        pads = [(kh - 1) * dil[0] // 2, (kw - 1) * dil[1] // 2] * 2
    padded = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    n, c, hp, wp = padded.shape
    oh = (hp - (kh - 1) * dil[0] - 1) // strides[0] + 1
    ow = (wp - (kw - 1) * dil[1] - 1) // strides[1] + 1
    count = min(n * oh * ow, _ROWS_PER_FEED)
    ns = rng.integers(0, n, count)
    ys = rng.integers(0, oh, count) * strides[0]
    xs = rng.integers(0, ow, count) * strides[1]
    ky = (np.arange(kh) * dil[0])[:, None]
    kx = (np.arange(kw) * dil[1])[None, :]
    patches = padded[
        ns[:, None, None, None],
        np.arange(c)[None, :, None, None],
        (ys[:, None, None, None] + ky[None, None]),
        (xs[:, None, None, None] + kx[None, None]),
    ]  # (count, C, kh, kw)
    return patches.reshape(count, layer.groups, -1).astype(np.float32)


def adaround_model(
    model: onnx.ModelProto,
    feeds: Callable[[], Iterable[dict[str, np.ndarray]]],
    ops: Mapping[str, OpConfig],
    iterations: int,
) -> onnx.ModelProto:
    """``model`` (modified in place and returned) with learned-rounding int8 weights."""
    from onnx import numpy_helper

    from .model_io import copy_model
    from .session import create_session

    layers = _layers(model, ops)
    if not layers:
        return model
    work = copy_model(model)
    inputs = list(dict.fromkeys(layer.node.input[0] for layer in layers))
    graph_inputs = {i.name for i in work.graph.input}
    for name in inputs:
        if name not in graph_inputs and name not in {o.name for o in work.graph.output}:
            work.graph.output.add().name = name
    session = create_session(work, {"graph_optimization_level": "disable"}, purpose="AdaRound")
    fetch = [n for n in inputs if n not in graph_inputs]
    rows: dict[str, list[np.ndarray]] = {layer.node.name: [] for layer in layers}
    rng = np.random.default_rng(0)
    for feed in feeds():
        values = dict(zip(fetch, session.run(fetch, feed))) if fetch else {}
        values.update({k: v for k, v in feed.items() if k in inputs})
        for layer in layers:
            if sum(len(r) for r in rows[layer.node.name]) < _MAX_ROWS:
                rows[layer.node.name].append(_sample_rows(layer, values[layer.node.input[0]], rng))
        del values
    kept = 0
    for layer in layers:
        x = np.concatenate(rows.pop(layer.node.name))
        split = max(1, int(0.8 * len(x)))
        order = rng.permutation(len(x))
        train, hold = x[order[:split]], x[order[split:]] if len(x) > split else x[order[:split]]
        shape = layer.weight.shape
        scale_full = _scale(layer.weight, layer.axis, layer.qmax)
        w = _grouped(layer, layer.weight)
        scale = _grouped(layer, np.broadcast_to(scale_full, shape).astype(np.float32))
        nearest = np.clip(np.round(w / scale), -layer.qmax, layer.qmax) * scale
        learned = learn_rounding(w, scale, train, iterations, qmax=layer.qmax) * scale
        if _output_error(hold, w, learned) < _output_error(hold, w, nearest):
            new = _ungrouped(layer, learned.astype(np.float32), shape)
            for index, init in enumerate(model.graph.initializer):
                if init.name == layer.node.input[1]:
                    model.graph.initializer[index].CopyFrom(numpy_helper.from_array(new, init.name))
            kept += 1
    log.info(
        "AdaRound: learned rounding kept for %d of %d layers (held-out check)", kept, len(layers)
    )
    return model
