"""A simulated (or fp32) model as an ONNX model with QDQ (``lpq_convert(target="onnx")``).

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

ONNX's QuantizeLinear rounds ``x / scale`` half to even; a scheme that rounds otherwise
(Vitis AI's DPU rounds half up, TFLite half away from zero) differs from it on exact
ties, by one step — the backend's own compiler applies its own rounding to the same
scales. With ``options={"exact_rounding": True}`` such quantizers are written instead as
``Div -> round -> Add zero point -> Clip -> Cast`` from standard ops (then
``DequantizeLinear``): a reference model ONNX Runtime runs with the backend's exact
rounding, for checking on a CPU what the hardware will compute.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from lpq import ModelError

from .. import graph as lpq_graph
from .. import model_io
from . import simulate
from .quantizers import BiasQuantizer, FakeQuantizer

DEFAULT_OPSET = 17
#: Metadata key holding every quantizer's parameters (JSON).
QUANT_METADATA = "lpq.quantization"


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
        example = options.get("example_inputs") or model_io.example_for(module)
        if example is None:
            raise ModelError(
                "the PyTorch adaptor needs example inputs to export this model",
                hint="pass options={'example_inputs': ((x,), {})} or query its capability first",
            )
        gm = model_io.exported(module, example)
        simulate.remove_guards(gm)
        simulate.fold_batch_norm(gm)
    emitter = Emitter(
        gm, int(options.get("opset", DEFAULT_OPSET)), bool(options.get("exact_rounding", False))
    )
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


class Emitter:
    """Writes ONNX nodes for an fx graph, one fx node at a time."""

    def __init__(self, gm: torch.fx.GraphModule, opset: int, exact_rounding: bool = False) -> None:
        self.gm, self.opset, self.exact_rounding = gm, opset, exact_rounding
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
        if self.exact_rounding and spec.rounding != "half_even":
            self.rounded_codes(tensor, scale_name, zero_name, spec, elem, quantized)
        else:
            self.emit("QuantizeLinear", [tensor, scale_name, zero_name], [quantized], quantized)
        if (spec.qmin, spec.qmax) != (low, high) and not self.exact_rounding:
            clipped = f"{tensor}_clipped"
            bounds = [self.const(spec.qmin, codes_type), self.const(spec.qmax, codes_type)]
            self.emit("Clip", [quantized, *bounds], [clipped], clipped)
            quantized = clipped
        output = f"{tensor}_dequantized"
        self.emit("DequantizeLinear", [quantized, scale_name, zero_name], [output], output)
        self.names[node] = output
        self.record(tensor, module, "activation")

    def rounded_codes(
        self, tensor: str, scale: str, zero: str, spec: Any, elem: int, output: str
    ) -> None:
        """QuantizeLinear with the backend's rounding, from standard ops (ONNX's own
        QuantizeLinear rounds half to even): ``Cast(Clip(round(x / scale) + zero))``."""
        v, r, shifted, clipped = (self.fresh(f"{tensor}_{p}") for p in ("v", "r", "z", "c"))
        self.emit("Div", [tensor, scale], [v], v)
        half = self.const(0.5)
        if spec.rounding == "half_up":  # floor(v + 0.5)
            plus = self.fresh(f"{tensor}_plus")
            self.emit("Add", [v, half], [plus], plus)
            self.emit("Floor", [plus], [r], r)
        else:  # half_away: sign(v) * floor(|v| + 0.5)
            magnitude, plus, floor, sign = (
                self.fresh(f"{tensor}_{p}") for p in ("abs", "plus", "floor", "sign")
            )
            self.emit("Abs", [v], [magnitude], magnitude)
            self.emit("Add", [magnitude, half], [plus], plus)
            self.emit("Floor", [plus], [floor], floor)
            self.emit("Sign", [v], [sign], sign)
            self.emit("Mul", [sign, floor], [r], r)
        zero_float = self.fresh(f"{tensor}_zero_float")
        self.emit("Cast", [zero], [zero_float], zero_float, to=self.onnx.TensorProto.FLOAT)
        self.emit("Add", [r, zero_float], [shifted], shifted)
        bounds = [self.const(float(spec.qmin)), self.const(float(spec.qmax))]
        self.emit("Clip", [shifted, *bounds], [clipped], clipped)
        self.emit("Cast", [clipped], [output], output, to=elem)

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
        from .onnx_ops import TRANSLATIONS

        translate = TRANSLATIONS.get(kind)
        if translate is None:
            raise ModelError(
                f"lpq cannot export the op {node.target} ({node.name}) to ONNX yet",
                hint=f"supported ops: {', '.join(sorted(TRANSLATIONS))}",
            )
        normalized = node.normalized_arguments(self.gm, normalize_to_only_use_kwargs=True)
        kwargs = dict(normalized.kwargs) if normalized is not None else {}
        key = lpq_graph.op_key(node)
        name = key[0] if key is not None else node.name
        self.names[node] = node.name
        translate(self, node, kwargs, name)
