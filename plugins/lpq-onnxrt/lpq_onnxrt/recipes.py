"""Accuracy recipes: fp32 model transforms applied before calibration, chosen by option.

Each is a function registered under a tune_cfg option name; the tuner searches them as
global options (``docs/onnxrt.md``). All the maths is numpy; ORT is only run (through
:func:`channel_statistics`) to collect per-channel input statistics.

- ``cross_layer_equalization`` (bool): for Conv -> (Relu | nothing) -> Conv pairs whose
  middle tensor has one reader, rescale output channel ``i`` of the first conv by
  ``1 / s_i`` and input channel ``i`` of the second by ``s_i`` with
  ``s_i = sqrt(r1_i / r2_i)`` (``r`` = per-channel weight ranges), so both get equal
  per-channel ranges (Nagel et al., 2019). ReLU is positively homogeneous, so fp32 outputs
  are unchanged; per-tensor weight quantization loses much less.
- ``smoothquant`` (alpha in (0, 1], or false): for MatMuls with a constant 2-D weight
  reading a LayerNormalization output, move activation outliers into the weights:
  ``s_k = max|X_k|**alpha / max|W_k|**(1 - alpha)``; LayerNormalization's scale and bias
  are divided by ``s``, each weight's rows multiplied by it (Xiao et al., 2023). Exact in
  fp32; no op is added.
- ``bias_correction`` (bool): after choosing weight quantization, shift each bias by
  ``-(W_q - W) . E[x]`` so the expected output of every Conv/Gemm/MatMul+Add equals
  fp32's (Nagel et al., 2019, empirical variant). ``W_q`` is computed exactly as ORT
  quantizes (symmetric int8 in [-127, 127], round half to even).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from lpq import ConfigError, OpConfig

from .qrange import weight_qmax

if TYPE_CHECKING:
    import onnx

#: option name -> (transform, needs calibration data)
Recipe = Callable[..., "onnx.ModelProto"]
RECIPES: dict[str, Recipe] = {}


def recipe(name: str) -> Callable[[Recipe], Recipe]:
    def add(function: Recipe) -> Recipe:
        RECIPES[name] = function
        return function

    return add


def requested(options: Mapping[str, Any]) -> dict[str, Any]:
    """The recipes ``options`` turns on, with their values, in registry order."""
    chosen = {}
    for name in RECIPES:
        value = options.get(name)
        if value not in (None, False, 0, "off", "false"):
            chosen[name] = value
    return chosen


def apply(
    model: onnx.ModelProto,
    options: Mapping[str, Any],
    feeds: Callable[[], Iterable[dict[str, np.ndarray]]] | None,
    ops: Mapping[str, OpConfig],
) -> onnx.ModelProto:
    """``model`` with every requested recipe applied (a copy; the input is unchanged)."""
    from .model_io import copy_model

    chosen = requested(options)
    if not chosen:
        return model
    work = copy_model(model)
    for name, value in chosen.items():
        work = RECIPES[name](work, value=value, feeds=feeds, ops=ops)
    return work


# --------------------------------------------------------------------------- helpers


def _inits(model: onnx.ModelProto) -> dict[str, Any]:
    return {init.name: init for init in model.graph.initializer}


def _array(model: onnx.ModelProto, name: str) -> np.ndarray | None:
    from onnx import numpy_helper

    init = _inits(model).get(name)
    return None if init is None else numpy_helper.to_array(init).copy()


def _weight(model: onnx.ModelProto, name: str) -> np.ndarray:
    value = _array(model, name)
    if value is None:
        raise KeyError(name)
    return value


def _set(model: onnx.ModelProto, name: str, value: np.ndarray) -> None:
    from onnx import numpy_helper

    for index, init in enumerate(model.graph.initializer):
        if init.name == name:
            model.graph.initializer[index].CopyFrom(numpy_helper.from_array(value, name))
            return
    model.graph.initializer.append(numpy_helper.from_array(value, name))


def _readers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    found: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            found.setdefault(name, []).append(node)
    return found


def _use_count(model: onnx.ModelProto, name: str) -> int:
    return sum(name == i for node in model.graph.node for i in node.input)


def _group(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "group"), 1)


def channel_statistics(
    model: onnx.ModelProto,
    tensors: Mapping[str, int],
    feeds: Iterable[dict[str, np.ndarray]],
) -> dict[str, dict[str, np.ndarray]]:
    """Per-channel ``mean`` and ``absmax`` of each tensor (name -> channel axis),
    reduced batch by batch (memory flat in the number of samples)."""
    from .model_io import copy_model
    from .session import create_session

    work = copy_model(model)
    existing = {out.name for out in work.graph.output}
    for name in tensors:
        if name not in existing:
            work.graph.output.add().name = name
    session = create_session(work, {"graph_optimization_level": "disable"}, purpose="statistics")
    names = list(tensors)
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    peaks: dict[str, np.ndarray] = {}
    for feed in feeds:
        for name, value in zip(names, session.run(names, feed)):
            axis = tensors[name] % value.ndim
            moved = np.moveaxis(value.astype(np.float64), axis, -1).reshape(-1, value.shape[axis])
            sums[name] = sums.get(name, 0.0) + moved.sum(axis=0)
            counts[name] = counts.get(name, 0) + moved.shape[0]
            peak = np.abs(moved).max(axis=0)
            peaks[name] = np.maximum(peaks[name], peak) if name in peaks else peak
    return {n: {"mean": sums[n] / counts[n], "absmax": peaks[n]} for n in sums}


def fake_quant_weight(
    weight: np.ndarray, axis: int | None, bits: int = 8, qmax: int | None = None
) -> np.ndarray:
    """Symmetric signed quantize-dequantize as ORT does it for weights: range
    ``[-qmax, qmax]`` (default ``2**(bits-1) - 1``; 64 for ORT's 7-bit ``reduce_range``),
    round half to even; per channel along ``axis`` (None: per tensor)."""
    qmax = qmax if qmax is not None else 2 ** (bits - 1) - 1
    if axis is None:
        peak = np.abs(weight).max()
    else:
        others = tuple(i for i in range(weight.ndim) if i != axis)
        peak = np.abs(weight).max(axis=others, keepdims=True)
    scale = np.where(peak > 0, peak / qmax, 1.0).astype(np.float32)
    return (np.clip(np.round(weight / scale), -qmax, qmax) * scale).astype(np.float32)


# --------------------------------------------------------------------------- CLE


@recipe("cross_layer_equalization")
def cross_layer_equalization(model: onnx.ModelProto, **_: Any) -> onnx.ModelProto:
    """Equalize Conv -> (Relu) -> Conv pairs in place; see the module docstring."""
    readers = _readers(model)
    producer = {out: node for node in model.graph.node for out in node.output}
    for second in model.graph.node:
        if second.op_type != "Conv" or len(second.input) < 2:
            continue
        middle = second.input[0]
        between = producer.get(middle)
        first = between
        if between is not None and between.op_type == "Relu":
            if len(readers.get(between.input[0], [])) != 1:
                continue
            first = producer.get(between.input[0])
        if first is None or first.op_type != "Conv" or len(readers.get(middle, [])) != 1:
            continue
        w1, w2 = _array(model, first.input[1]), _array(model, second.input[1])
        if w1 is None or w2 is None or _group(first) not in (1, w1.shape[0]):
            continue
        if _use_count(model, first.input[1]) != 1 or _use_count(model, second.input[1]) != 1:
            continue
        channels = w1.shape[0]
        depthwise = _group(second) == channels and w2.shape[1] == 1
        if not depthwise and (_group(second) != 1 or w2.shape[1] != channels):
            continue
        r1 = np.abs(w1.reshape(channels, -1)).max(axis=1)
        if depthwise:
            r2 = np.abs(w2.reshape(channels, -1)).max(axis=1)
        else:
            r2 = np.abs(np.moveaxis(w2, 1, 0).reshape(channels, -1)).max(axis=1)
        ok = (r1 > 0) & (r2 > 0)
        scale = np.ones(channels, np.float32)
        scale[ok] = np.sqrt(r1[ok] / r2[ok]).astype(np.float32)
        shape1 = [channels] + [1] * (w1.ndim - 1)
        _set(model, first.input[1], (w1 / scale.reshape(shape1)).astype(np.float32))
        if len(first.input) > 2 and first.input[2]:
            bias = _array(model, first.input[2])
            if bias is not None and _use_count(model, first.input[2]) == 1:
                _set(model, first.input[2], (bias / scale).astype(np.float32))
            else:
                continue
        shape2 = (
            [channels] + [1] * (w2.ndim - 1) if depthwise else [1, channels] + [1] * (w2.ndim - 2)
        )
        _set(model, second.input[1], (w2 * scale.reshape(shape2)).astype(np.float32))
    return model


# --------------------------------------------------------------------------- SmoothQuant


@recipe("smoothquant")
def smoothquant(
    model: onnx.ModelProto,
    *,
    value: Any,
    feeds: Callable[[], Iterable[dict[str, np.ndarray]]] | None,
    **_: Any,
) -> onnx.ModelProto:
    """Migrate activation outliers of LayerNorm-fed MatMuls into their weights."""
    alpha = 0.5 if value is True else float(value)
    if not 0.0 < alpha <= 1.0:
        raise ConfigError(f"smoothquant alpha must be in (0, 1], not {value!r}")
    if feeds is None:
        raise ConfigError("smoothquant needs calibration data (per-channel activation ranges)")
    readers = _readers(model)
    groups: dict[str, tuple[onnx.NodeProto, list[onnx.NodeProto]]] = {}
    for norm in model.graph.node:
        if norm.op_type != "LayerNormalization" or len(norm.input) < 2:
            continue
        users = readers.get(norm.output[0], [])
        matmuls = [u for u in users if u.op_type == "MatMul" and u.input[0] == norm.output[0]]
        weights = [_array(model, m.input[1]) for m in matmuls]
        if (
            not matmuls
            or len(matmuls) != len(users)
            or any(w is None or w.ndim != 2 for w in weights)
        ):
            continue
        if any(_use_count(model, m.input[1]) != 1 for m in matmuls):
            continue
        if _use_count(model, norm.input[1]) != 1 or (
            len(norm.input) > 2 and norm.input[2] and _use_count(model, norm.input[2]) != 1
        ):
            continue
        groups[norm.output[0]] = (norm, matmuls)
    if not groups:
        return model
    stats = channel_statistics(model, dict.fromkeys(groups, -1), feeds())
    for tensor, (norm, matmuls) in groups.items():
        x_max = stats[tensor]["absmax"]
        w_max = np.max([np.abs(_weight(model, m.input[1])).max(axis=1) for m in matmuls], axis=0)
        ok = (x_max > 0) & (w_max > 0)
        s = np.ones_like(x_max)
        s[ok] = x_max[ok] ** alpha / w_max[ok] ** (1.0 - alpha)
        s = np.clip(s, 1e-5, 1e5).astype(np.float32)
        gamma = _array(model, norm.input[1])
        _set(model, norm.input[1], (gamma / s).astype(np.float32))
        if len(norm.input) > 2 and norm.input[2]:
            beta = _array(model, norm.input[2])
            _set(model, norm.input[2], (beta / s).astype(np.float32))
        for m in matmuls:
            w = _array(model, m.input[1])
            _set(model, m.input[1], (w * s[:, None]).astype(np.float32))
    return model


# --------------------------------------------------------------------------- bias correction


@recipe("bias_correction")
def bias_correction(
    model: onnx.ModelProto,
    *,
    feeds: Callable[[], Iterable[dict[str, np.ndarray]]] | None,
    ops: Mapping[str, OpConfig],
    **_: Any,
) -> onnx.ModelProto:
    """Correct each quantized layer's bias for the mean error its int8 weight adds."""
    if feeds is None:
        raise ConfigError("bias_correction needs calibration data (per-channel input means)")
    readers = _readers(model)
    # node, bias, axis, kind, the weight's largest integer code
    targets: list[tuple[onnx.NodeProto, str, int | None, str, int]] = []
    for node in model.graph.node:
        cfg = ops.get(node.name)
        if cfg is None or not cfg.quantized or cfg.weight is None or cfg.weight.dtype != "int8":
            continue
        if cfg.weight.scheme != "sym" or len(node.input) < 2:
            continue
        weight = _array(model, node.input[1])
        if weight is None or _use_count(model, node.input[1]) != 1:
            continue
        per_channel = cfg.weight.granularity == "per_channel"
        if node.op_type == "Conv" and len(node.input) > 2 and node.input[2] and _group(node) == 1:
            targets.append(
                (node, node.input[2], 0 if per_channel else None, "conv", weight_qmax(cfg.weight))
            )
        elif node.op_type == "MatMul" and weight.ndim == 2:
            users = readers.get(node.output[0], [])
            if len(users) == 1 and users[0].op_type == "Add":
                add = users[0]
                bias = next((i for i in add.input if i != node.output[0]), "")
                b = _array(model, bias)
                if b is not None and b.shape == (weight.shape[1],):
                    axis = 1 if per_channel else None
                    targets.append((node, bias, axis, "matmul", weight_qmax(cfg.weight)))
    targets = [t for t in targets if _use_count(model, t[1]) == 1]
    if not targets:
        return model
    axes = {t[0].input[0]: (1 if t[3] == "conv" else -1) for t in targets}
    stats = channel_statistics(model, axes, feeds())
    for node, bias_name, axis, kind, qmax in targets:
        weight = _array(model, node.input[1])
        bias = _array(model, bias_name)
        assert weight is not None and bias is not None
        error = fake_quant_weight(weight, axis, qmax=qmax) - weight
        mean = stats[node.input[0]]["mean"]
        if kind == "conv":
            shift = error.reshape(error.shape[0], error.shape[1], -1).sum(axis=-1) @ mean
        else:
            shift = mean @ error
        _set(model, bias_name, (bias - shift).astype(np.float32))
    return model


# --------------------------------------------------------------------------- AdaRound


@recipe("adaround")
def adaround(
    model: onnx.ModelProto,
    *,
    value: Any,
    feeds: Callable[[], Iterable[dict[str, np.ndarray]]] | None,
    ops: Mapping[str, OpConfig],
    **_: Any,
) -> onnx.ModelProto:
    """Learned rounding of int8 weights, layer by layer; see :mod:`.adaround`."""
    from .adaround import adaround_model

    if feeds is None:
        raise ConfigError("adaround needs calibration data (layer inputs)")
    iterations = 300 if value is True else int(value)
    if iterations < 1:
        raise ConfigError(f"adaround iterations must be >= 1, not {value!r}")
    return adaround_model(model, feeds, ops, iterations)
