"""Choosing MatMulNBits' ``accuracy_level`` by measurement.

``accuracy_level`` 4 lets ORT quantize the activations to int8 inside MatMulNBits; on
SmolLM2 that is where the whole int4 decode speedup comes from (21 ms vs 70 ms a token at
level 0), but it adds activation rounding error, and on CPUs without fast int8 dot
products it need not be faster. So lpq times both levels on one representative decoder
layer per bit width (:func:`representative`: never lm_head or an embedding, at most
:data:`MAX_TIMED_WEIGHTS` weights, so one run stays in the milliseconds) at batch 1 (one
row, one intra-op thread, interleaved rounds) and keeps level 4 only when it is faster
and its extra output error is small: at most half the weight quantization's own error,
or at most :data:`MAX_EXTRA_REL` of the output norm.

The weight error is floored at the grid's expected rounding error (``scale**2 / 12`` per
weight): weights already on the int8 grid (SmolLM2's Q8_0-sourced lm_head) have a zero
weight error, and dividing by it gave "extra error 9.7e13" while ORT's level-4 error
there is the usual 0.56% of the output. The absolute bound matters for int8: level 4's
activation rounding (~0.5% of the output on SmolLM2) is as large as the int8 weight
error, while level 0 int8 MatMulNBits has no fast kernel in ORT 1.2x (lm_head 576x49152:
137 ms against 5 ms fp32 and 2.2 ms level 4). Cached per (K, N, bits, block, scheme).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from lpq import ConfigError
from lpq.weight_only import BlockQuantized, dequantize_blocks, quantize_rtn

from . import source
from .activations import TensorStats
from .nodes import MS_DOMAIN
from .plan import LayerChoice

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

LEVELS = (0, 4)
_ROUNDS = 5
_RUNS = 20
#: Largest K*N timed (SmolLM2's 576x1536 MLP fits; its 576x49152 lm_head, 711 ms a run
#: at level 0 int8 on a shared core, does not).
MAX_TIMED_WEIGHTS = 1 << 20
#: Level 4's extra error accepted regardless of the weight error: 1% of the output norm.
MAX_EXTRA_REL = 0.01
_CACHE: dict[tuple[int, int, int, int, bool], dict[str, Any]] = {}


def _one_node(quantized: BlockQuantized, level: int) -> Any:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from lpq.weight_only import pack_matmulnbits

    packed = pack_matmulnbits(quantized)
    inits = [
        numpy_helper.from_array(packed.b, "B"),
        numpy_helper.from_array(packed.scales, "scales"),
    ]
    names = ["x", "B", "scales"]
    if packed.zero_points is not None:
        inits.append(numpy_helper.from_array(packed.zero_points, "zp"))
        names.append("zp")
    node = helper.make_node(
        "MatMulNBits", names, ["y"], domain=MS_DOMAIN, accuracy_level=level, **packed.attributes()
    )
    graph = helper.make_graph(
        [node],
        "nbits",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, packed.k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, packed.n])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS_DOMAIN, 1)]
    )
    model.ir_version = 10
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _time(session: Any, x: np.ndarray) -> float:
    start = time.perf_counter()
    for _ in range(_RUNS):
        session.run(None, {"x": x})
    return (time.perf_counter() - start) / _RUNS * 1e3


def representative(
    shapes: Mapping[str, tuple[int, int]], exclude: set[str], prefer: set[str]
) -> str | None:
    """The MatMul to time ``accuracy_level`` on: not in ``exclude`` (lm_head, embeddings),
    from ``prefer`` (the layers of this bit width) when one fits, the largest with
    ``K*N <= MAX_TIMED_WEIGHTS``, else the smallest; None when ``shapes`` has none."""
    names = [name for name in shapes if name not in exclude]
    for pool in ([n for n in names if n in prefer], names):
        fits = [n for n in pool if shapes[n][0] * shapes[n][1] <= MAX_TIMED_WEIGHTS]
        if fits:
            return max(fits, key=lambda n: shapes[n][0] * shapes[n][1])
    if not names:
        return None
    return min(names, key=lambda n: shapes[n][0] * shapes[n][1])


def grid_error(x: np.ndarray, quantized: BlockQuantized) -> float:
    """Expected ``||x @ E||`` for a rounding error ``E`` uniform in half a step of each
    weight's block scale: what the grid costs weights that are not already on it."""
    k = quantized.shape[0]
    step2 = np.repeat(np.asarray(quantized.scales, np.float64) ** 2, quantized.block_size, 0)
    return float(np.sqrt(np.sum(np.asarray(x, np.float64) ** 2 @ step2[:k]) / 12.0))


def measure(
    weight: np.ndarray, quantized: BlockQuantized, activations: np.ndarray | None = None
) -> dict[str, Any]:
    """Time and error of each level for one layer: ``{"chosen", "ms", "extra_error"}``."""
    k, n = quantized.shape
    key = (k, n, quantized.bits, quantized.block_size, quantized.symmetric)
    if key in _CACHE:
        return _CACHE[key]
    rng = np.random.default_rng(0)
    x = activations[:64] if activations is not None and len(activations) else None
    if x is None:
        x = rng.standard_normal((64, k)).astype(np.float32)
    sessions = {level: _one_node(quantized, level) for level in LEVELS}
    outputs = {level: sessions[level].run(None, {"x": x})[0] for level in LEVELS}
    deq = dequantize_blocks(
        quantized.codes, quantized.scales, quantized.zero_points, quantized.block_size
    )
    reference = x @ weight
    weight_error = float(np.linalg.norm(reference - x @ deq))
    scale = max(weight_error, grid_error(x, quantized), 1e-30)
    difference = float(np.linalg.norm(outputs[4] - outputs[0]))
    extra = difference / scale
    extra_rel = difference / max(float(np.linalg.norm(reference)), 1e-30)
    row = x[:1]
    times: dict[int, list[float]] = {level: [] for level in LEVELS}
    for _ in range(_ROUNDS):  # interleaved: drift on a shared machine hits both levels
        for level in LEVELS:
            times[level].append(_time(sessions[level], row))
    ms = {level: float(np.median(times[level])) for level in LEVELS}
    small = extra <= 0.5 or extra_rel <= MAX_EXTRA_REL
    chosen = 4 if ms[4] < 0.95 * ms[0] and small else 0
    result = {
        "chosen": chosen,
        "ms": ms,
        "extra_error": extra,
        "extra_rel": extra_rel,
        "weight_rel": weight_error / max(float(np.linalg.norm(reference)), 1e-30),
        "shape": [k, n],
    }
    log.info(
        "MatMulNBits %dx%d %d-bit: accuracy_level 0 %.3f ms, 4 %.3f ms, extra error %.2f "
        "of the weight error (%.2e of the output) -> %d",
        k,
        n,
        quantized.bits,
        ms[0],
        ms[4],
        extra,
        extra_rel,
        chosen,
    )
    _CACHE[key] = result
    return result


# ------------------------------------------------------------- the pass's choice
def fixed_level(options: Mapping[str, Any]) -> int | None:
    """The ``accuracy_level`` option as an int, or None for ``auto``."""
    value = options.get("accuracy_level", "auto")
    if value in (None, "auto"):
        return None
    level = int(value)
    if not 0 <= level <= 4:
        raise ConfigError(f"accuracy_level must be 0..4 or auto, got {value!r}", hint="use auto")
    return level


def level_inputs(
    model: onnx.ModelProto,
    choices: Mapping[str, LayerChoice],
    head: str | None,
    options: Mapping[str, Any],
) -> set[str]:
    """Input tensors of the MatMuls ``auto`` times (their statistics are kept to the end
    of the pass, for :func:`measure_levels`)."""
    if fixed_level(options) is not None:
        return set()
    nodes = {node.name: node for node in model.graph.node}
    shapes = source.shapes(model)
    exclude = {head} if head else set()
    found = set()
    for bits in {c.bits for c in choices.values()}:
        mine = {n for n, c in choices.items() if c.bits == bits}
        name = representative(shapes, exclude, mine)
        if name is not None:
            found.add(nodes[name].input[0])
    return found


def measure_levels(
    model: onnx.ModelProto,
    choices: Mapping[str, LayerChoice],
    head: str | None,
    stats: Mapping[str, TensorStats],
    report: dict[str, Any],
) -> None:
    """``accuracy_level`` per bit width (``auto``), timed on a representative decoder
    MatMul (:func:`representative`: never lm_head or a Gather, capped in size) quantized
    RTN with that bit width's block and scheme; results in ``report``."""
    nodes = {node.name: node for node in model.graph.node}
    shapes = source.shapes(model)
    exclude = {head} if head is not None else set()
    for bits in sorted({c.bits for c in choices.values()}):
        mine = {name for name, c in choices.items() if c.bits == bits}
        first = choices[next(name for name in choices if name in mine)]
        name = representative(shapes, exclude, mine)
        if name is None:  # only the head: a column slice of it
            name = next(iter(mine))
            if name not in shapes:
                continue
        node = nodes[name]
        weight = source.weight(model, node)
        cols = max(1, MAX_TIMED_WEIGHTS // weight.shape[0])
        weight = np.ascontiguousarray(weight[:, :cols])
        quantized = quantize_rtn(weight, bits, first.block_size, first.symmetric)
        found = stats.get(node.input[0])
        sample = found.sample() if found is not None and found.rows else None
        result = measure(weight, quantized, sample)
        report["accuracy_level"][f"int{bits}"] = {**result, "layer": name}


def level(bits: int, options: Mapping[str, Any], report: Mapping[str, Any]) -> int:
    """``accuracy_level`` for a layer of ``bits``: the option, or the measured one."""
    fixed = fixed_level(options)
    if fixed is not None:
        return fixed
    return int(report["accuracy_level"].get(f"int{bits}", {}).get("chosen", 0))
