"""Build the backend simulation of a model: fold batch norm, put quantizers where the
backend quantizes.

Input: the fp32 graph lpq-torch exports for every model (:func:`lpq_torch.model_io.
exported`: ATen ops, op names stamped), a scheme and a tune_cfg. Output: the same graph
with :class:`~lpq_torch.backends.quantizers.FakeQuantizer` modules inserted as
``call_module`` nodes:

* **batch norm** after a conv/linear is folded into its weight and bias first, as every
  backend's converter does, so the simulated weights are the deployed ones;
* **weights** of each quantized conv/linear get a weight quantizer (per channel along
  axis 0, or per tensor, as the scheme says); biases get an int32 quantizer (scale =
  input scale x weight scale) or one like the weights', when the scheme says so;
* **activations**, by the scheme's placement:
  ``inputs`` (TensorRT, OpenVINO): a quantizer on each float activation input of the
  quantized ops and of ``quantize_inputs_of``, shared by all consumers of a tensor;
  ``outputs`` (SNPE/QNN, Vitis AI, TFLite): every op the backend runs in integers
  quantizes its output, except an op whose only user is an activation (ReLU, ReLU6)
  fused into it, which is quantized after the activation. Ops that only move values
  (max pooling, reshapes) keep their input's quantization; ops in ``float_ops`` and ops
  the tune_cfg leaves in float produce float outputs (their integer consumers quantize
  them again).

Quantizers of a tunable op follow its tune_cfg entry (dtype, symmetry, granularity,
calibration algorithm), which must agree with the scheme; the others take the scheme's
activation rules and the most common calibration algorithm of the tune_cfg.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import torch

from lpq import ConfigError, TensorConfig, TuneConfig

from .. import graph as lpq_graph
from .observers import Spec
from .quantizers import BiasQuantizer, FakeQuantizer

#: Ops with a weight (argument 1) and a bias (argument 2).
WEIGHTED = {"conv1d", "conv2d", "linear"}
#: Activations a backend fuses into the op before them.
FUSED_ACTIVATIONS = {"relu", "relu_", "hardtanh", "hardtanh_", "relu6"}
#: Ops whose output values are some of their input values: they keep its quantization.
PASSTHROUGH = {
    "max_pool1d",
    "max_pool2d",
    "flatten",
    "view",
    "reshape",
    "_unsafe_view",
    "permute",
    "transpose",
    "squeeze",
    "unsqueeze",
    "contiguous",
    "clone",
    "dropout",
    "alias",
    "detach",
    "expand",
    "chunk",
    "split",
    "split_with_sizes",
    "unbind",
    "getitem",
}
#: Attributes set on the simulated module.
BACKEND_ATTR = "_lpq_backend"
#: Node metadata: the precision the backend runs a tunable op in (``fp32``: kept float).
PRECISION = "lpq_backend_precision"


def short_name(node: torch.fx.Node) -> str:
    """``aten.conv2d.default`` -> ``conv2d``; other callables by their name."""
    text = str(node.target)
    if text.startswith("aten."):
        return text.split(".")[1]
    return getattr(node.target, "__name__", text)


def is_float_tensor(node: Any) -> bool:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def tensor_spec(rule: Any, cfg: TensorConfig | None, where: str, *, axis: int | None) -> Spec:
    """The exact quantizer for one tensor: the scheme's rule, the tune_cfg's choices."""
    if cfg is not None:
        symmetric = cfg.scheme == "sym"
        if cfg.dtype != rule.dtype or symmetric != rule.symmetric:
            raise ConfigError(
                f"{where}: the tune_cfg asks for {cfg.dtype} {cfg.scheme}, but the backend "
                f"quantizes it as {rule.dtype} {rule.scheme}",
                hint="build the tune_cfg from the backend's narrowed capability "
                "(lpq.quantize/fit with backend=...)",
            )
        if cfg.granularity != rule.granularity:
            raise ConfigError(
                f"{where}: the tune_cfg asks for {cfg.granularity}, the backend for "
                f"{rule.granularity}"
            )
        reduce = bool(cfg.options.get("reduce_range", rule.reduce_range))
        if reduce != rule.reduce_range:
            raise ConfigError(
                f"{where}: the tune_cfg asks for reduce_range={reduce}, the backend for "
                f"{rule.reduce_range}"
            )
    qmin, qmax = rule.quant_range()
    return Spec(
        qmin=qmin,
        qmax=qmax,
        symmetric=rule.symmetric,
        signed=rule.signed,
        pow2=rule.scale == "pow2",
        rounding=rule.rounding,
        axis=axis,
    )


class _Builder:
    """Walks the graph once, inserting quantizers (see the module docstring)."""

    def __init__(self, gm: torch.fx.GraphModule, scheme: Any, tune_cfg: TuneConfig) -> None:
        self.gm, self.scheme, self.tune_cfg = gm, scheme, tune_cfg
        algorithms = Counter(
            cfg.activation.algorithm
            for cfg in tune_cfg.ops.values()
            if cfg.quantized and cfg.activation is not None
        )
        self.default_algorithm = algorithms.most_common(1)[0][0] if algorithms else "minmax"
        #: node -> the quantizer node whose grid its value lies on (None: float).
        self.grid: dict[torch.fx.Node, torch.fx.Node | None] = {}
        self.input_quantizer: dict[torch.fx.Node, torch.fx.Node] = {}
        self.names: set[str] = set()

    # -------------------------------------------------------------- classification

    def op_config(self, node: torch.fx.Node) -> Any:
        key = lpq_graph.op_key(node) if lpq_graph.op_type_of(node) else None
        return key, (self.tune_cfg.ops.get(key) if key is not None else None)

    def is_float_op(self, node: torch.fx.Node) -> bool:
        key, cfg = self.op_config(node)
        if short_name(node) in self.scheme.float_ops:
            return True
        return key is not None and (cfg is None or not cfg.quantized)

    def fused_into_next(self, node: torch.fx.Node) -> bool:
        """An op whose only user is an activation the backend fuses into it."""
        if len(node.users) != 1:
            return False
        user = next(iter(node.users))
        return (
            user.op == "call_function"
            and short_name(user) in FUSED_ACTIVATIONS
            and not self.is_float_op(user)
        )

    def is_fused_activation(self, node: torch.fx.Node) -> bool:
        producer = node.args[0] if node.args else None
        return (
            short_name(node) in FUSED_ACTIVATIONS
            and isinstance(producer, torch.fx.Node)
            and producer.op == "call_function"
            and short_name(producer) not in PASSTHROUGH
            and not self.is_float_op(producer)
            and self.fused_into_next(producer)
        )

    def needs_quantized_inputs(self, node: torch.fx.Node) -> bool:
        if self.is_float_op(node) or not is_float_tensor(node):
            return False
        kind = short_name(node)
        _, cfg = self.op_config(node)
        if self.scheme.placement == "inputs":
            return cfg is not None or kind in self.scheme.quantize_inputs_of
        return kind not in PASSTHROUGH and not self.is_fused_activation(node)

    def quantizes_output(self, node: torch.fx.Node) -> bool:
        return (
            self.scheme.placement == "outputs"
            and is_float_tensor(node)
            and not self.is_float_op(node)
            and short_name(node) not in PASSTHROUGH
            and not self.fused_into_next(node)
        )

    # -------------------------------------------------------------- insertion

    def _unique(self, base: str) -> str:
        name = base.replace(".", "_")
        index = 0
        while name in self.names or hasattr(self.gm, name):
            index += 1
            name = f"{base}_{index}".replace(".", "_")
        self.names.add(name)
        return name

    def add(self, after: torch.fx.Node, module: torch.nn.Module, prefix: str) -> torch.fx.Node:
        name = self._unique(f"{prefix}_{after.name}")
        self.gm.add_submodule(name, module)
        with self.gm.graph.inserting_after(after):
            node = self.gm.graph.call_module(name, (after,))
        node.meta["val"] = after.meta.get("val")
        return node

    def activation_quantizer(self, tensor: torch.fx.Node, cfg: Any, where: str) -> torch.fx.Node:
        act = cfg.activation if cfg is not None and cfg.quantized else None
        spec = tensor_spec(self.scheme.activation, act, where, axis=None)
        algorithm = act.algorithm if act is not None else self.default_algorithm
        node = self.add(tensor, FakeQuantizer(spec, algorithm), "aq")
        self.grid[node] = node
        return node

    def quantize_inputs(self, node: torch.fx.Node, cfg: Any, key: Any) -> None:
        for arg in list(node.all_input_nodes):
            if arg.op == "get_attr" or not is_float_tensor(arg) or self.grid.get(arg):
                continue
            quantizer = self.input_quantizer.get(arg)
            if quantizer is None:
                where = f"input of {key[0] if key else node.name}"
                quantizer = self.activation_quantizer(arg, cfg, where)
                self.input_quantizer[arg] = quantizer
            node.replace_input_with(arg, quantizer)

    def quantize_weights(self, node: torch.fx.Node, cfg: Any, key: Any) -> None:
        weight = node.args[1]
        assert isinstance(weight, torch.fx.Node)
        rule = self.scheme.weight
        axis = 0 if rule.granularity == "per_channel" else None
        spec = tensor_spec(rule, cfg.weight, f"weight of {key[0]}", axis=axis)
        wq = self.add(weight, FakeQuantizer(spec, "minmax", weight=True), "wq")
        node.replace_input_with(weight, wq)
        bias = node.args[2] if len(node.args) > 2 else None
        if not isinstance(bias, torch.fx.Node) or self.scheme.bias == "float":
            return
        if self.scheme.bias == "like_weight":
            bias_rule = dataclasses.replace(rule, granularity="per_tensor")
            bias_spec = tensor_spec(bias_rule, None, f"bias of {key[0]}", axis=None)
            bq = self.add(bias, FakeQuantizer(bias_spec, "minmax", weight=True), "bq")
            node.replace_input_with(bias, bq)
            return
        source = self.grid.get(node.args[0]) if isinstance(node.args[0], torch.fx.Node) else None
        if source is None:
            return  # a float input: the backend keeps the bias in float too
        graph = self.gm.graph
        name = self._unique(f"bq_{bias.name}")
        self.gm.add_submodule(name, BiasQuantizer())
        with graph.inserting_before(node):
            input_scale = graph.get_attr(f"{source.target}.scale")
            weight_scale = graph.get_attr(f"{wq.target}.scale")
            bq = graph.call_module(name, (bias, input_scale, weight_scale))
        bq.meta["val"] = bias.meta.get("val")
        node.replace_input_with(bias, bq)

    def run(self) -> None:
        for node in list(self.gm.graph.nodes):
            if node.op == "placeholder":
                self.grid[node] = None
                continue
            if node.op != "call_function":
                continue
            key, cfg = self.op_config(node)
            if key is not None:
                node.meta[PRECISION] = "fp32" if self.is_float_op(node) else cfg.precision
            if self.needs_quantized_inputs(node):
                self.quantize_inputs(node, cfg, key)
            if cfg is not None and cfg.quantized and short_name(node) in WEIGHTED:
                self.quantize_weights(node, cfg, key)
            first = node.args[0] if node.args else None
            if short_name(node) in PASSTHROUGH and isinstance(first, torch.fx.Node):
                self.grid[node] = self.grid.get(first)
            elif self.quantizes_output(node):
                quantizer = self.activation_quantizer(node, cfg, f"output of {node.name}")
                keep = quantizer
                node.replace_all_uses_with(quantizer, delete_user_cb=lambda u, q=keep: u is not q)
                self.grid[node] = None
            else:
                self.grid[node] = None


def remove_guards(gm: torch.fx.GraphModule) -> None:
    """Drop torch.export's input-shape guard call (a no-op the ONNX export cannot carry)."""
    for node in list(gm.graph.nodes):
        if (
            node.op == "call_module"
            and str(node.target).startswith("_guards_fn")
            and not node.users
        ):
            gm.graph.erase_node(node)


def fold_batch_norm(gm: torch.fx.GraphModule) -> int:
    """Fold eval-mode batch norms into the conv/linear before them; return how many."""
    folded = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or short_name(node) != "batch_norm":
            continue
        producer = node.args[0]
        if (
            not isinstance(producer, torch.fx.Node)
            or producer.op != "call_function"
            or short_name(producer) not in WEIGHTED
            or len(producer.users) != 1
            or any(not isinstance(a, torch.fx.Node) or a.op != "get_attr" for a in node.args[1:5])
            or not isinstance(producer.args[1], torch.fx.Node)
            or producer.args[1].op != "get_attr"
        ):
            continue
        gamma, beta, mean, var = (_attr(gm, a) for a in node.args[1:5])
        eps = float(node.args[7]) if len(node.args) > 7 else 1e-5
        weight = _attr(gm, producer.args[1])
        bias_node = producer.args[2] if len(producer.args) > 2 else None
        bias = (
            _attr(gm, bias_node)
            if isinstance(bias_node, torch.fx.Node)
            else torch.zeros(weight.shape[0])
        )
        with torch.no_grad():
            factor = gamma / torch.sqrt(var + eps)
            new_weight = weight * factor.reshape(-1, *([1] * (weight.dim() - 1)))
            new_bias = (bias - mean) * factor + beta
        base = str(producer.args[1].target).replace(".", "_")
        names = (f"{base}_folded", f"{base}_folded_bias")
        gm.register_parameter(names[0], torch.nn.Parameter(new_weight.detach().clone()))
        gm.register_parameter(names[1], torch.nn.Parameter(new_bias.detach().clone()))
        with gm.graph.inserting_before(producer):
            w_node, b_node = (gm.graph.get_attr(n) for n in names)
        w_node.meta["val"], b_node.meta["val"] = new_weight, new_bias
        args = list(producer.args)
        while len(args) < 3:
            args.append(None)
        args[1], args[2] = w_node, b_node
        producer.args = tuple(args)
        node.replace_all_uses_with(producer)
        gm.graph.erase_node(node)
        folded += 1
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return folded


def drop_unused_tensors(gm: torch.fx.GraphModule) -> None:
    """Delete the model tensors no node reads any more (the weights and statistics batch
    norm was folded from), keeping the quantizers' own state."""
    used = {str(node.target) for node in gm.graph.nodes if node.op == "get_attr"}
    for name, _ in [*gm.named_parameters(), *gm.named_buffers()]:
        owner_path, _, leaf = name.rpartition(".")
        owner = gm.get_submodule(owner_path) if owner_path else gm
        if name in used or isinstance(owner, FakeQuantizer | BiasQuantizer):
            continue
        if hasattr(owner, leaf):
            delattr(owner, leaf)


def _attr(gm: torch.fx.GraphModule, node: torch.fx.Node) -> torch.Tensor:
    value: Any = gm
    for part in str(node.target).split("."):
        value = getattr(value, part)
    return torch.as_tensor(value).detach().float()


def build(gm: torch.fx.GraphModule, scheme: Any, tune_cfg: TuneConfig) -> torch.fx.GraphModule:
    """The simulated model of ``gm`` (modified in place and returned)."""
    remove_guards(gm)
    fold_batch_norm(gm)
    _Builder(gm, scheme, tune_cfg).run()
    gm.graph.lint()
    gm.recompile()
    drop_unused_tensors(gm)
    setattr(gm, BACKEND_ATTR, {"scheme": scheme.to_json()})
    return gm


def quantizers(gm: torch.nn.Module) -> dict[str, FakeQuantizer]:
    """Every fake quantizer of a simulated model, by module name."""
    return {name: m for name, m in gm.named_modules() if isinstance(m, FakeQuantizer)}


def bias_quantizers(gm: torch.nn.Module) -> dict[str, BiasQuantizer]:
    return {name: m for name, m in gm.named_modules() if isinstance(m, BiasQuantizer)}


def is_simulated(model: Any) -> bool:
    return isinstance(model, torch.nn.Module) and hasattr(model, BACKEND_ATTR)


def _fed_by_quantizer(gm: torch.fx.GraphModule, arg: Any, depth: int = 8) -> FakeQuantizer | None:
    """The quantizer whose grid ``arg`` lies on (through ops that only move values)."""
    for _ in range(depth):
        if not isinstance(arg, torch.fx.Node):
            return None
        if arg.op == "call_module":
            module = gm.get_submodule(str(arg.target))
            return module if isinstance(module, FakeQuantizer) else None
        if arg.op != "call_function" or short_name(arg) not in PASSTHROUGH:
            return None
        arg = arg.args[0] if arg.args else None
    return None


def quantized_ops(gm: torch.fx.GraphModule) -> dict[str, str]:
    """``lpq_quantized_ops`` for a simulated model: read from its quantizers, per op.

    An op runs in integers when the backend runs it so (ops it keeps in float, such as
    Vitis AI's matmul, stay fp32 even when their inputs come quantized) and a quantizer
    feeds its weight or its first input; the precision is the container of the widest
    such quantizer (7-bit weights are int8).
    """
    found: dict[str, str] = {}
    for (name, _), node in lpq_graph.quantizable_nodes(gm):
        feeding = [q for arg in node.args[:2] if (q := _fed_by_quantizer(gm, arg)) is not None]
        if not feeding or node.meta.get(PRECISION) == "fp32":
            found[name] = "fp32"
            continue
        bits = max(int(q.describe()["bits"]) for q in feeding)
        found[name] = f"int{8 if bits > 4 else 4 if bits > 2 else 2}"
    return found
