"""``lpq_convert`` for lpq-torch: a simulated (or fp32) model as an ONNX model with QDQ.

The exported graph is written node by node from the simulation's ATen graph, so the ONNX
model encodes exactly what the simulation computes:

* an activation quantizer becomes ``QuantizeLinear -> DequantizeLinear`` with the
  quantizer's float32 scale and integer zero point (plus a ``Clip`` on the integers when
  the scheme's range is narrower than the int8/uint8 container: 4-bit, 7-bit);
* a weight quantizer becomes an integer initializer holding the codes the simulation
  computed, followed by ``DequantizeLinear`` (per-channel along axis 0 where the scheme
  is per channel); an int32 bias likewise, with scale ``input scale x weight scale``;
* every ATen op maps to its ONNX op (Conv, Gemm, MatMul, Relu, Clip, Add, MaxPool,
  GlobalAveragePool, Flatten, Reshape, Concat, ...); an op without a mapping is a
  :class:`lpq.ModelError` naming it.

Tensor names are stable and readable: the graph input keeps its argument name, weights
and biases are ``<op name>.weight`` / ``<op name>.bias`` (the tune_cfg's op names), an
activation keeps the name of the node that produced it, its quantized copy is
``<name>_quantized`` and its dequantized copy ``<name>_dequantized``. The parameter
files of :mod:`~lpq_torch.backends.params` refer to tensors by these names. Every
quantizer's parameters are also stored as JSON in the model's metadata
(``lpq.quantization``), for tools and tests.

ONNX Runtime rounds ``x / scale`` half to even, as ONNX specifies; a scheme that rounds
otherwise (Vitis AI's DPU rounds half up, TFLite half away from zero) differs from
ONNX Runtime only on exact ties, by one step. The backend's own compiler applies its own
rounding to the same scales.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from lpq import ModelError

from .. import graph as lpq_graph
from .. import prepare
from ..data import require_module
from . import simulate
from .profiles import parse_scheme
from .quantizers import BiasQuantizer, FakeQuantizer

DEFAULT_OPSET = 17
#: Metadata key holding every quantizer's parameters (JSON).
QUANT_METADATA = "lpq.quantization"
TARGETS = ("onnx", "deploy")


def convert(model: Any, target: str, options: dict[str, Any]) -> Any:
    """``lpq_convert``: ``onnx`` (a QDQ ``onnx.ModelProto``) or ``deploy`` (the frozen model)."""
    if target not in TARGETS:
        raise ModelError(
            f"lpq-torch cannot convert to {target!r}", hint=f"targets: {', '.join(TARGETS)}"
        )
    module = require_module(model)
    wanted = options.get("backend_scheme")
    if wanted is not None:
        _check_backend(module, wanted, options.get("backend"))
    if target == "deploy":
        if not simulate.is_simulated(module):
            raise ModelError(
                "only a model lpq quantized for a backend has a deployable form here",
                hint="quantize with a backend profile first (backend='tensorrt', ...)",
            )
        return module
    return to_onnx(module, options)


def _check_backend(module: torch.nn.Module, scheme: Any, backend: Any) -> None:
    """A deploy for a backend takes a model simulated with exactly that backend's scheme."""
    name = f"backend {backend!r}" if backend else "this backend"
    if not simulate.is_simulated(module):
        raise ModelError(
            f"the model is not quantized for {name}",
            hint="pass calibration data to quantize it, or a model lpq quantized with "
            f"backend={backend!r}",
        )
    built = getattr(module, simulate.BACKEND_ATTR)["scheme"]
    if parse_scheme(built) != parse_scheme(scheme):
        raise ModelError(
            f"the model was quantized with another scheme than {name}'s "
            f"({getattr(module, simulate.BACKEND_ATTR).get('backend') or 'a custom scheme'})",
            hint="quantize the fp32 model for this backend, or register a profile for the "
            "scheme you simulated",
        )


def to_onnx(module: torch.nn.Module, options: dict[str, Any]) -> Any:
    """The model as ONNX: QDQ where it is quantized (see the module docstring)."""
    try:
        import onnx
    except ImportError as exc:  # pragma: no cover - onnx ships with lpq-torch's deploy extra
        raise ModelError(
            "exporting to ONNX needs the onnx package", hint="pip install onnx"
        ) from exc
    gm: torch.fx.GraphModule
    if isinstance(module, torch.fx.GraphModule) and simulate.is_simulated(module):
        gm = module
    elif isinstance(module, torch.fx.GraphModule) and any(
        "quantize" in str(n.target) for n in module.graph.nodes if n.op == "call_function"
    ):
        raise ModelError(
            "this model was quantized by lpq-torch's x86 PT2E path, which has no ONNX export",
            hint="quantize it with a backend profile (e.g. backend='x86' or 'tensorrt') to "
            "deploy it as QDQ ONNX",
        )
    else:
        example = options.get("example_inputs") or prepare.example_for(module)
        if example is None:
            raise ModelError(
                "the PyTorch adaptor needs example inputs to export this model",
                hint="pass options={'example_inputs': ((x,), {})} or query its capability first",
            )
        gm = prepare.exported(module, example)
        simulate.remove_guards(gm)
        simulate.fold_batch_norm(gm)
    emitter = _Emitter(gm, int(options.get("opset", DEFAULT_OPSET)))
    model = emitter.build(onnx)
    backend = getattr(gm, simulate.BACKEND_ATTR, None)
    if backend:
        entry = model.metadata_props.add()
        entry.key, entry.value = "lpq.backend", json.dumps(backend, sort_keys=True)
    entry = model.metadata_props.add()
    entry.key, entry.value = QUANT_METADATA, json.dumps(emitter.quantization, sort_keys=True)
    onnx.checker.check_model(model)
    return model


def _container(qmin: int, qmax: int) -> tuple[Any, int, int]:
    """The ONNX integer type holding codes in [qmin, qmax], and its own range."""
    from onnx import TensorProto

    if qmin >= 0 and qmax <= 255:
        return TensorProto.UINT8, 0, 255
    if qmin >= -128 and qmax <= 127:
        return TensorProto.INT8, -128, 127
    if qmin >= 0 and qmax <= 65535:
        return TensorProto.UINT16, 0, 65535
    return TensorProto.INT16, -32768, 32767


_NUMPY = {2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32}


class _Emitter:
    """Writes ONNX nodes for an fx graph, one fx node at a time."""

    def __init__(self, gm: torch.fx.GraphModule, opset: int) -> None:
        self.gm, self.opset = gm, opset
        self.nodes: list[Any] = []
        self.initializers: dict[str, Any] = {}
        self.names: dict[torch.fx.Node, str] = {}
        self.counter = 0
        self.quantization: dict[str, dict[str, Any]] = {}
        self.friendly = self._friendly_names()
        self.onnx: Any = None

    # ----------------------------------------------------------------- helpers

    def _friendly_names(self) -> dict[torch.fx.Node, str]:
        """``<op name>.weight`` / ``.bias`` for the parameters of weighted ops."""
        found: dict[torch.fx.Node, str] = {}
        for (name, _), node in lpq_graph.quantizable_nodes(self.gm):
            if simulate.short_name(node) not in simulate.WEIGHTED:
                continue
            for index, suffix in ((1, "weight"), (2, "bias")):
                arg = node.args[index] if len(node.args) > index else None
                while isinstance(arg, torch.fx.Node) and arg.op == "call_module":
                    arg = arg.args[0]
                if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
                    found[arg] = f"{name}.{suffix}"
        return found

    def fresh(self, base: str) -> str:
        self.counter += 1
        return f"{base}__{self.counter}"

    def attr_value(self, node: torch.fx.Node) -> torch.Tensor:
        value: Any = self.gm
        for part in str(node.target).split("."):
            value = getattr(value, part)
        return torch.as_tensor(value).detach()

    def add_init(self, name: str, array: np.ndarray) -> str:
        from onnx import numpy_helper

        if name not in self.initializers:
            self.initializers[name] = numpy_helper.from_array(np.ascontiguousarray(array), name)
        return name

    def const(self, value: Any, dtype: Any = np.float32) -> str:
        return self.add_init(self.fresh("const"), np.asarray(value, dtype=dtype))

    def emit(
        self, op_type: str, inputs: list[str], outputs: list[str], name: str, **attrs: Any
    ) -> None:
        self.nodes.append(self.onnx.helper.make_node(op_type, inputs, outputs, name=name, **attrs))

    def value(self, arg: Any) -> str:
        """The ONNX tensor name of an fx argument (constants become initializers)."""
        if isinstance(arg, torch.fx.Node):
            if arg in self.names:
                return self.names[arg]
            if arg.op == "get_attr":
                name = self.friendly.get(arg, str(arg.target))
                array = self.attr_value(arg).float().numpy()
                self.names[arg] = self.add_init(name, array)
                return self.names[arg]
            raise ModelError(f"internal: node {arg.name} used before it was exported")
        if isinstance(arg, bool | int | float):
            return self.const(float(arg))
        raise ModelError(f"cannot export the constant {arg!r} to ONNX")

    @staticmethod
    def rank(node: Any) -> int:
        value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor):
            raise ModelError(f"no shape is known for {getattr(node, 'name', node)}")
        return value.dim()

    # ----------------------------------------------------------------- quantizers

    def quantizer(self, node: torch.fx.Node, module: FakeQuantizer) -> None:
        source = node.args[0]
        assert isinstance(source, torch.fx.Node)
        spec = module.spec
        elem, low, high = _container(spec.qmin, spec.qmax)
        codes_type = _NUMPY[elem]
        scale = module.scale.detach().float().numpy().reshape(-1)
        zero = module.zero_point.detach().numpy().reshape(-1).astype(codes_type)
        per_channel = spec.axis is not None and scale.size > 1
        if source.op == "get_attr":  # a constant (weight, or a bias like the weights)
            name = self.friendly.get(source, str(source.target))
            codes = module.codes(self.attr_value(source).float()).numpy().astype(codes_type)
            inputs = [
                self.add_init(f"{name}_quantized", codes),
                self.add_init(f"{name}_scale", scale if per_channel else scale.reshape(())),
                self.add_init(f"{name}_zero_point", zero if per_channel else zero.reshape(())),
            ]
            attrs = {"axis": spec.axis} if per_channel else {}
            self.emit("DequantizeLinear", inputs, [name], f"{name}_DequantizeLinear", **attrs)
            self.names[node] = name
            self.record(name, module, "bias" if name.endswith(".bias") else "weight")
            return
        tensor = self.value(source)
        scale_name = self.add_init(f"{tensor}_scale", scale.reshape(()))
        zero_name = self.add_init(f"{tensor}_zero_point", zero.reshape(()))
        quantized = f"{tensor}_quantized"
        self.emit("QuantizeLinear", [tensor, scale_name, zero_name], [quantized], quantized)
        if (spec.qmin, spec.qmax) != (low, high):
            clipped = f"{tensor}_clipped"
            bounds = [self.const(spec.qmin, codes_type), self.const(spec.qmax, codes_type)]
            self.emit("Clip", [quantized, *bounds], [clipped], clipped)
            quantized = clipped
        output = f"{tensor}_dequantized"
        self.emit("DequantizeLinear", [quantized, scale_name, zero_name], [output], output)
        self.names[node] = output
        self.record(tensor, module, "activation")

    def bias(self, node: torch.fx.Node, module: BiasQuantizer) -> None:
        source, input_scale, weight_scale = node.args[:3]
        assert isinstance(source, torch.fx.Node)
        name = self.friendly.get(source, str(source.target))
        if not module.active:
            self.names[node] = self.value(source)
            return
        scale = module.scale_of(
            self.attr_value(input_scale),  # type: ignore[arg-type]
            self.attr_value(weight_scale),  # type: ignore[arg-type]
        )
        codes = module.codes(self.attr_value(source).float(), scale).numpy().astype(np.int32)
        scale_np = scale.numpy().reshape(-1)
        per_channel = scale_np.size > 1
        inputs = [
            self.add_init(f"{name}_quantized", codes),
            self.add_init(f"{name}_scale", scale_np if per_channel else scale_np.reshape(())),
            self.add_init(
                f"{name}_zero_point", np.zeros(scale_np.shape if per_channel else (), np.int32)
            ),
        ]
        attrs = {"axis": 0} if per_channel else {}
        self.emit("DequantizeLinear", inputs, [name], f"{name}_DequantizeLinear", **attrs)
        self.names[node] = name
        self.quantization[name] = {
            "kind": "bias",
            "scale": [float(v) for v in scale_np],
            "zero_point": [0] * scale_np.size,
            "qmin": BiasQuantizer.INT32[0],
            "qmax": BiasQuantizer.INT32[1],
            "bits": 32,
            "signed": True,
            "symmetric": True,
            "axis": 0 if per_channel else None,
        }

    def record(self, tensor: str, module: FakeQuantizer, kind: str) -> None:
        entry = module.describe()
        entry["kind"] = kind
        self.quantization[tensor] = entry

    # ----------------------------------------------------------------- graph

    def build(self, onnx: Any) -> Any:
        self.onnx = onnx
        helper = onnx.helper
        inputs, outputs = [], []
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.names[node] = node.name
                inputs.append(self.value_info(node.name, node))
            elif node.op == "get_attr":
                continue  # emitted where used
            elif node.op == "call_module":
                module = self.gm.get_submodule(str(node.target))
                if isinstance(module, FakeQuantizer):
                    self.quantizer(node, module)
                elif isinstance(module, BiasQuantizer):
                    self.bias(node, module)
                else:
                    raise ModelError(
                        f"cannot export module {node.target} ({type(module).__name__})"
                    )
            elif node.op == "call_function":
                self.function(node)
            elif node.op == "output":
                results = node.args[0]
                for result in results if isinstance(results, list | tuple) else [results]:
                    outputs.append(self.value_info(self.value(result), result))
        graph = helper.make_graph(
            self.nodes, "lpq", inputs, outputs, list(self.initializers.values())
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", self.opset)], producer_name="lpq"
        )
        model.ir_version = 8
        return model

    def value_info(self, name: str, node: torch.fx.Node) -> Any:
        value = node.meta.get("val")
        shape: list[Any] = []
        if isinstance(value, torch.Tensor):
            for index, dim in enumerate(value.shape):
                shape.append(dim if isinstance(dim, int) else ("batch" if index == 0 else None))
        return self.onnx.helper.make_tensor_value_info(
            name, self.onnx.TensorProto.FLOAT, shape or None
        )

    def function(self, node: torch.fx.Node) -> None:
        kind = simulate.short_name(node)
        if kind == "sym_size":
            return  # sizes for reshapes: read from the graph's shapes instead
        if kind == "getitem":  # one output of a multi-output op (chunk, split)
            source, index = node.args[0], node.args[1]
            assert isinstance(source, torch.fx.Node)
            self.names[node] = f"{self.value(source)}_{index}"
            return
        translate = _TRANSLATIONS.get(kind)
        if translate is None:
            raise ModelError(
                f"lpq cannot export the op {node.target} ({node.name}) to ONNX yet",
                hint=f"supported ops: {', '.join(sorted(_TRANSLATIONS))}",
            )
        normalized = node.normalized_arguments(self.gm, normalize_to_only_use_kwargs=True)
        kwargs = dict(normalized.kwargs) if normalized is not None else {}
        key = lpq_graph.op_key(node)
        name = key[0] if key is not None else node.name
        self.names[node] = node.name
        translate(self, node, kwargs, name)


# ---------------------------------------------------------------------- ATen -> ONNX

Translation = Callable[[_Emitter, torch.fx.Node, dict[str, Any], str], None]
_TRANSLATIONS: dict[str, Translation] = {}


def _register(*kinds: str) -> Callable[[Translation], Translation]:
    def decorate(func: Translation) -> Translation:
        for kind in kinds:
            _TRANSLATIONS[kind] = func
        return func

    return decorate


def _ints(value: Any, count: int) -> list[int]:
    values = list(value) if isinstance(value, list | tuple) else [value]
    if len(values) == 1 and count > 1:
        values = values * count
    return [int(v) for v in values]


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


@_register("conv1d", "conv2d")
def _conv(e: _Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    weight = kw["weight"]
    spatial = e.rank(weight) - 2 if isinstance(weight, torch.fx.Node) else 2
    inputs = [e.value(kw["input"]), e.value(weight)]
    if kw.get("bias") is not None:
        inputs.append(e.value(kw["bias"]))
    attrs: dict[str, Any] = {
        "strides": _ints(kw.get("stride", 1), spatial),
        "dilations": _ints(kw.get("dilation", 1), spatial),
        "group": int(kw.get("groups", 1)),
    }
    padding = kw.get("padding", 0)
    if padding == "same":
        attrs["auto_pad"] = "SAME_UPPER"
    elif padding != "valid":
        attrs["pads"] = _ints(padding, spatial) * 2
    e.emit("Conv", inputs, [node.name], name, **attrs)


@_register("linear")
def _linear(e: _Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    x, weight = e.value(kw["input"]), e.value(kw["weight"])
    bias = e.value(kw["bias"]) if kw.get("bias") is not None else None
    if e.rank(kw["input"]) == 2:
        e.emit("Gemm", [x, weight, *([bias] if bias else [])], [node.name], name, transB=1)
        return
    transposed = e.fresh(f"{weight}_transposed")
    e.emit("Transpose", [weight], [transposed], transposed, perm=[1, 0])
    product = e.fresh(f"{node.name}_matmul") if bias else node.name
    e.emit("MatMul", [x, transposed], [product], name)
    if bias:
        e.emit("Add", [product, bias], [node.name], f"{name}_bias")


@_register("matmul", "mm", "bmm")
def _matmul(e: _Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    a = kw.get("input", kw.get("self"))
    e.emit("MatMul", [e.value(a), e.value(kw.get("other", kw.get("mat2")))], [node.name], name)


def _unary(op_type: str, **attrs: Any) -> Translation:
    def translate(e: _Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
        source = kw.get("input", kw.get("self"))
        e.emit(op_type, [e.value(source)], [node.name], name, **attrs)

    return translate


for _kind, _op in (
    ("relu", "Relu"),
    ("relu_", "Relu"),
    ("sigmoid", "Sigmoid"),
    ("tanh", "Tanh"),
    ("hardswish", "HardSwish"),
    ("hardswish_", "HardSwish"),
    ("dropout", "Identity"),
    ("clone", "Identity"),
    ("contiguous", "Identity"),
    ("alias", "Identity"),
    ("detach", "Identity"),
):
    _TRANSLATIONS[_kind] = _unary(_op)
_TRANSLATIONS["hardsigmoid"] = _unary("HardSigmoid", alpha=1 / 6, beta=0.5)


@_register("hardtanh", "hardtanh_", "clamp", "clip")
def _clip(e: _Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    source = kw.get("input", kw.get("self"))
    low = kw.get("min_val", kw.get("min", -1.0 if "hardtanh" in str(node.target) else None))
    high = kw.get("max_val", kw.get("max", 1.0 if "hardtanh" in str(node.target) else None))
    inputs = [e.value(source)]
    inputs.append(e.const(float(low)) if low is not None else "")
    inputs.append(e.const(float(high)) if high is not None else "")
    e.emit("Clip", inputs, [node.name], name)


def _binary(op_type: str) -> Translation:
    def translate(e: _Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
        other = e.value(kw["other"])
        alpha = kw.get("alpha", 1)
        if alpha not in (None, 1):
            scaled = e.fresh(f"{node.name}_alpha")
            e.emit("Mul", [other, e.const(float(alpha))], [scaled], scaled)
            other = scaled
        e.emit(op_type, [e.value(kw.get("input", kw.get("self"))), other], [node.name], name)

    return translate


for _kind, _op in (("add", "Add"), ("add_", "Add"), ("sub", "Sub"), ("mul", "Mul"), ("div", "Div")):
    _TRANSLATIONS[_kind] = _binary(_op)


@_register("max_pool1d", "max_pool2d")
def _max_pool(e: _Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    spatial = e.rank(kw["input"]) - 2
    kernel = _ints(kw["kernel_size"], spatial)
    stride = kw.get("stride") or kernel
    e.emit(
        "MaxPool",
        [e.value(kw["input"])],
        [node.name],
        name,
        kernel_shape=kernel,
        strides=_ints(stride, spatial),
        pads=_ints(kw.get("padding", 0), spatial) * 2,
        dilations=_ints(kw.get("dilation", 1), spatial),
        ceil_mode=int(bool(kw.get("ceil_mode", False))),
    )


@_register("avg_pool1d", "avg_pool2d")
def _avg_pool(e: _Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    if kw.get("divisor_override") is not None:
        raise ModelError(f"{node.name}: avg_pool with divisor_override has no ONNX equivalent")
    spatial = e.rank(kw["input"]) - 2
    kernel = _ints(kw["kernel_size"], spatial)
    stride = kw.get("stride") or kernel
    e.emit(
        "AveragePool",
        [e.value(kw["input"])],
        [node.name],
        name,
        kernel_shape=kernel,
        strides=_ints(stride, spatial),
        pads=_ints(kw.get("padding", 0), spatial) * 2,
        ceil_mode=int(bool(kw.get("ceil_mode", False))),
        count_include_pad=int(bool(kw.get("count_include_pad", True))),
    )


@_register("adaptive_avg_pool1d", "adaptive_avg_pool2d")
def _adaptive_avg_pool(e: _Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    size = _ints(kw["output_size"], e.rank(kw["input"]) - 2)
    if any(s != 1 for s in size):
        raise ModelError(
            f"{node.name}: adaptive average pooling to {size} has no ONNX equivalent",
            hint="pool to 1 (global average pooling), or use avg_pool2d",
        )
    e.emit("GlobalAveragePool", [e.value(kw["input"])], [node.name], name)


@_register("mean")
def _mean(e: _Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    source = kw.get("input", kw.get("self"))
    rank = e.rank(source)
    axes = [_axis(int(a), rank) for a in _ints(kw.get("dim") or list(range(rank)), 1)]
    keep = int(bool(kw.get("keepdim", False)))
    if e.opset >= 18:
        e.emit(
            "ReduceMean",
            [e.value(source), e.const(axes, np.int64)],
            [node.name],
            name,
            keepdims=keep,
        )
    else:
        e.emit("ReduceMean", [e.value(source)], [node.name], name, axes=axes, keepdims=keep)


def _reshape_to(e: _Emitter, node: torch.fx.Node, source: Any, shape: list[Any], name: str) -> None:
    dims: list[int] = []
    for index, dim in enumerate(shape):
        if isinstance(dim, int):
            dims.append(dim)
        elif index == 0:
            dims.append(0)  # the (dynamic) batch dimension: copy it from the input
        elif -1 not in dims:
            dims.append(-1)
        else:
            raise ModelError(f"{node.name}: a reshape with two dynamic sizes cannot be exported")
    e.emit("Reshape", [e.value(source), e.const(dims, np.int64)], [node.name], name)


@_register("view", "reshape", "_unsafe_view")
def _view(e: _Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    size = kw.get("size", kw.get("shape"))
    assert size is not None
    _reshape_to(e, node, kw.get("self", kw.get("input")), list(size), name)


@_register("flatten")
def _flatten(e: _Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    source = kw.get("input", kw.get("self"))
    rank = e.rank(source)
    start = _axis(int(kw.get("start_dim", 0)), rank)
    end = _axis(int(kw.get("end_dim", -1)), rank)
    if start == 1 and end == rank - 1:
        e.emit("Flatten", [e.value(source)], [node.name], name, axis=1)
        return
    assert isinstance(source, torch.fx.Node)
    tail = [int(d) for d in source.meta["val"].shape[end + 1 :]]
    shape: list[Any] = [0] * start + [-1] + tail
    e.emit("Reshape", [e.value(source), e.const(shape, np.int64)], [node.name], name)


@_register("cat", "concat")
def _cat(e: _Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    tensors = list(kw["tensors"])
    axis = _axis(int(kw.get("dim", 0)), e.rank(tensors[0]))
    e.emit("Concat", [e.value(t) for t in tensors], [node.name], name, axis=axis)


@_register("permute")
def _permute(e: _Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    source = kw.get("self", kw.get("input"))
    rank = e.rank(source)
    perm = [_axis(int(d), rank) for d in kw["dims"]]
    e.emit("Transpose", [e.value(source)], [node.name], name, perm=perm)


@_register("transpose")
def _transpose(e: _Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    source = kw.get("self", kw.get("input"))
    rank = e.rank(source)
    perm = list(range(rank))
    a, b = _axis(int(kw["dim0"]), rank), _axis(int(kw["dim1"]), rank)
    perm[a], perm[b] = perm[b], perm[a]
    e.emit("Transpose", [e.value(source)], [node.name], name, perm=perm)


@_register("chunk", "split", "split_with_sizes", "unbind")
def _split(e: _Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    source = kw.get("input", kw.get("self"))
    axis = _axis(int(kw.get("dim", 0)), e.rank(source))
    parts = node.meta["val"]
    sizes = [int(part.shape[axis]) if part.dim() == e.rank(source) else 1 for part in parts]
    outputs = [f"{node.name}_{i}" for i in range(len(parts))]
    if simulate.short_name(node) == "unbind":
        split = [f"{o}_kept" for o in outputs]
        e.emit("Split", [e.value(source), e.const(sizes, np.int64)], split, name, axis=axis)
        for kept, output in zip(split, outputs, strict=True):
            axes = e.const([axis], np.int64)
            e.emit("Squeeze", [kept, axes], [output], f"{output}_squeeze")
        return
    e.emit("Split", [e.value(source), e.const(sizes, np.int64)], outputs, name, axis=axis)


@_register("softmax", "_softmax")
def _softmax(e: _Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    source = kw.get("self", kw.get("input"))
    axis = _axis(int(kw["dim"]), e.rank(source))
    e.emit("Softmax", [e.value(source)], [node.name], name, axis=axis)


@_register("silu", "silu_")
def _silu(e: _Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    source = e.value(kw.get("input", kw.get("self")))
    gate = e.fresh(f"{node.name}_sigmoid")
    e.emit("Sigmoid", [source], [gate], gate)
    e.emit("Mul", [source, gate], [node.name], name)


@_register("gelu")
def _gelu(e: _Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    if kw.get("approximate", "none") != "none":
        raise ModelError(f"{node.name}: the tanh-approximated GELU is not exported yet")
    x = e.value(kw.get("self", kw.get("input")))
    scaled, erf, one, half = (e.fresh(f"{node.name}_{p}") for p in ("div", "erf", "add", "mul"))
    e.emit("Div", [x, e.const(math.sqrt(2.0))], [scaled], scaled)
    e.emit("Erf", [scaled], [erf], erf)
    e.emit("Add", [erf, e.const(1.0)], [one], one)
    e.emit("Mul", [x, one], [half], half)
    e.emit("Mul", [half, e.const(0.5)], [node.name], name)


@_register("batch_norm")
def _batch_norm(e: _Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    inputs = [e.value(kw[k]) for k in ("input", "weight", "bias", "running_mean", "running_var")]
    e.emit("BatchNormalization", inputs, [node.name], name, epsilon=float(kw.get("eps", 1e-5)))


@_register("layer_norm")
def _layer_norm(e: _Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    axis = -len(list(kw["normalized_shape"]))
    inputs = [e.value(kw["input"]), e.value(kw["weight"])]
    if kw.get("bias") is not None:
        inputs.append(e.value(kw["bias"]))
    e.emit(
        "LayerNormalization",
        inputs,
        [node.name],
        name,
        axis=axis,
        epsilon=float(kw.get("eps", 1e-5)),
    )


@_register("unsqueeze", "squeeze")
def _squeeze(e: _Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    source = kw.get("self", kw.get("input"))
    kind = simulate.short_name(node)
    rank = e.rank(node) if kind == "unsqueeze" else e.rank(source)
    dims = kw.get("dim")
    inputs = [e.value(source)]
    if dims is not None:
        inputs.append(e.const([_axis(int(d), rank) for d in _ints(dims, 1)], np.int64))
    e.emit("Unsqueeze" if kind == "unsqueeze" else "Squeeze", inputs, [node.name], name)
