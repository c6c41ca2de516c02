"""What the passes that call ONNX Runtime's quantizers share: lpq dtypes as ORT quant
types, a hashable key for tensor settings, the shape inference ORT's quantizers would
otherwise run through files, and quieting the warnings ORT's quantizers log about things
lpq expects."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from lpq import ConfigError, OpConfig, TensorConfig

from .. import model_io, weights
from . import channelwise

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

_DTYPES_8BIT = {"uint8": "QUInt8", "int8": "QInt8", "uint16": "QUInt16", "int16": "QInt16"}


def quant_type(dtype: str) -> Any:
    """ORT's ``QuantType`` for an lpq dtype; a ConfigError for one ORT cannot do here."""
    from onnxruntime.quantization import QuantType

    if dtype not in _DTYPES_8BIT:
        raise ConfigError(
            f"ONNX Runtime cannot quantize tensors to {dtype!r} in this mode",
            hint=f"choose one of: {', '.join(_DTYPES_8BIT)}",
        )
    return getattr(QuantType, _DTYPES_8BIT[dtype])


def tensor_key(tensor: TensorConfig) -> tuple[Any, ...]:
    """A hashable identity for a TensorConfig (its ``options`` is a dict)."""
    return (
        tensor.dtype,
        tensor.scheme,
        tensor.granularity,
        tensor.algorithm,
        tuple(sorted(tensor.options.items())),
    )


def most_common(tensors: list[TensorConfig], default: TensorConfig) -> TensorConfig:
    """The setting most of ``tensors`` share (ORT's defaults; the rest are overrides)."""
    if not tensors:
        return default
    counts = Counter(tensor_key(t) for t in tensors)
    best = counts.most_common(1)[0][0]
    return next(t for t in tensors if tensor_key(t) == best)


def per_channel(cfg: OpConfig) -> bool:
    return cfg.weight is not None and cfg.weight.granularity == "per_channel"


def reduce_range(tensor: TensorConfig | None) -> bool:
    """The capability's ``reduce_range`` knob: ORT's 7-bit weights ([-64, 64] signed,
    [0, 127] unsigned)."""
    return tensor is not None and tensor.reduce_range


def fast_rewiring(quantizer: Any) -> None:
    """Give ``quantizer``'s model a faster ``replace_input_of_all_nodes`` (same result).

    ORT's QDQ quantizer calls it once per tensor it quantizes, and ORT's version visits
    every input of every node in Python: O(nodes x tensors). ddddocr det (261 ops): a
    million calls, 3.2 of the 14.6 s its five candidate builds spent in ORT's quantizer.
    This one skips the nodes that do not read the tensor with protobuf's own membership
    test. Set on this instance only; a quantizer that no longer calls it is unaffected."""
    holder = getattr(quantizer, "model", None)
    if holder is None or not hasattr(holder, "replace_input_of_all_nodes"):
        return
    # A weak reference: the function is the holder's attribute, and a strong one would
    # make a cycle that keeps every build's model alive until the cyclic collector runs
    # (ddddocr rec: peak 730 -> 960 MB over five builds).
    owner = weakref.ref(holder)

    def replace_input_of_all_nodes(old_input_name: str, new_input_name: str) -> None:
        assert isinstance(old_input_name, str) and isinstance(new_input_name, str)
        model = owner()
        if model is None:
            return
        for node in model.model.graph.node:
            if old_input_name in node.input:
                for index, name in enumerate(node.input):
                    if name == old_input_name:
                        node.input[index] = new_input_name

    holder.replace_input_of_all_nodes = replace_input_of_all_nodes


class _NameIndex:
    """``find_by_name(name, items)`` as ORT's quant_utils has it (the first item of that
    name, or None), from an index per sequence instead of a scan of it.

    ORT's quantizers look an initializer up by scanning the model's whole initializer
    list, tens of thousands of times per model (most lookups miss: a name is checked
    before it is added): ddddocr det, 261 ops, 33 015 scans, 2.1 of the 7.4 s its builds
    spent in ORT's quantizer. The index of a sequence is extended when items were only
    appended since it was made (its last item still where it was), rebuilt on any other
    change (length or last item), and every hit is checked against the item itself. An
    item renamed in place in the middle would go unseen: ORT's quantizers name a tensor
    before they add it. Plain Python lists (ORT's copies of the node list, made per call)
    are scanned as ORT does."""

    def __init__(self) -> None:
        # id -> (the sequence, its length and last name when indexed, name -> position)
        self._entries: dict[int, tuple[Any, int, str | None, dict[str, int]]] = {}

    def find(self, name: str, items: Any) -> Any:
        if isinstance(items, list):
            return next((item for item in items if item.name == name), None)
        index = self._index(items)
        position = index.get(name)
        if position is not None and position < len(items) and items[position].name == name:
            return items[position]
        if position is not None:  # changed in place: index again, look again
            self._entries.pop(id(items), None)
            position = self._index(items).get(name)
            return None if position is None else items[position]
        return None

    def _index(self, items: Any) -> dict[str, int]:
        count = len(items)
        last = items[count - 1].name if count else None
        entry = self._entries.get(id(items))
        if entry is not None and entry[0] is items:
            _, known, known_last, index = entry
            if known == count and known_last == last:
                return index
            if known and count > known and items[known - 1].name == known_last:
                for position in range(known, count):  # appended since: index the tail
                    index.setdefault(items[position].name, position)
                self._entries[id(items)] = (items, count, last, index)
                return index
        index = {}
        for position in range(count):
            index.setdefault(items[position].name, position)
        self._entries[id(items)] = (items, count, last, index)
        return index


#: ORT's quantizer modules whose ``find_by_name`` :func:`fast_lookups` replaces.
_LOOKUP_MODULES = (
    "onnxruntime.quantization.base_quantizer",
    "onnxruntime.quantization.onnx_model",
    "onnxruntime.quantization.onnx_quantizer",
    "onnxruntime.quantization.qdq_quantizer",
)


@contextlib.contextmanager
def fast_lookups(quantizer: Any) -> Iterator[None]:
    """While ``quantizer`` runs, its initializer lookups by name use an index (see
    :class:`_NameIndex`; the same items found), and its model's ``initializer_extend``
    no longer re-checks every initializer the model already has at each call (a check
    that only ever finds something in float8 tensors, each checked when it was added:
    3.6 million checks on ddddocr det's builds). Nothing is changed where ORT no longer
    has these functions; ORT's modules get their own back when the block ends."""
    import importlib

    index = _NameIndex()
    saved: list[tuple[Any, Any]] = []
    for name in _LOOKUP_MODULES:
        try:
            module: Any = importlib.import_module(name)
        except ImportError:
            continue
        if callable(getattr(module, "find_by_name", None)):
            saved.append((module, module.find_by_name))
            module.find_by_name = index.find
    holder: Any = getattr(quantizer, "model", None)
    graph_of = getattr(getattr(holder, "model", None), "graph", None)
    owner = weakref.ref(holder) if graph_of is not None else None  # not a cycle through
    # the holder's own attributes
    if owner is not None and hasattr(holder, "get_initializer"):

        def get_initializer(name: str) -> Any:
            model = owner()
            return None if model is None else index.find(name, model.model.graph.initializer)

        holder.get_initializer = get_initializer
    if owner is not None and callable(getattr(holder, "_check_init", None)):

        def initializer_extend(inits: Any) -> None:
            model = owner()
            if model is None:
                return
            if len(inits) == 0:
                raise ValueError("Can add an empty list.")
            for init in inits:
                model._check_init(init)
                model.model.graph.initializer.append(init)

        holder.initializer_extend = initializer_extend
    try:
        yield
    finally:
        for module, original in saved:
            module.find_by_name = original


def with_inferred_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with onnx's shape inference, marked as ORT's quantizers mark it.

    Unmarked, ORT's quantizers start with ``save_and_reload_model_with_shape_infer``: a
    deep copy, saved to a temporary folder, shape-inferred file to file and loaded back
    (ddddocr rec, 54 MB: about 0.2 s and two extra copies of the model per build, and
    ``auto`` builds five; MiniLM's dynamic pass, 86 MB: the peak of its quantization).
    Here onnx infers on the graph without its weights' values
    (:func:`lpq_onnxrt.weights.for_shape_inference`) and the inferred nodes, outputs and
    value_info are set on ``model`` in place: the same model (byte for byte on ddddocr
    rec/det and MTCNN), and no copy of the weights (rec: peak 733 -> 640 MB). Over the
    protobuf limit, or where onnx's inference fails, ORT's own path (files) is left to
    run."""
    from onnxruntime.quantization.quant_utils import add_infer_metadata, model_has_infer_metadata

    if not model_has_infer_metadata(model) and _infer_in_place(model):
        add_infer_metadata(model)
    return model


def _infer_in_place(model: onnx.ModelProto) -> bool:
    """onnx's shape inference on ``model``'s graph without the weights' values, its nodes,
    outputs and value_info set on ``model``; False (nothing changed) over the protobuf
    limit or where onnx's inference fails."""
    import onnx

    light = weights.for_shape_inference(model)
    if over_proto_limit(model, light):
        return False
    try:
        inferred = onnx.shape_inference.infer_shapes(light)
    except Exception:  # onnx's own error types; ORT's path then runs as it always did
        return False
    graph = model.graph
    for field in ("node", "output", "value_info"):
        target = getattr(graph, field)
        del target[:]
        target.extend(getattr(inferred.graph, field))
    return True


_IN_MEMORY: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "lpq_onnxrt_shapes_in_memory", default=False
)


@contextlib.contextmanager
def shapes_inferred_in_memory() -> Iterator[None]:
    """While the block runs, ORT's dynamic quantizer re-infers shapes in memory.

    After it rewrites Gemms as MatMuls, ``ONNXQuantizer`` (dynamic) always calls
    ``save_and_reload_model_with_shape_infer``: a deep copy of the model written to a
    temporary folder with its weights, inferred file to file and loaded back (MiniLM, 86
    MB: the peak of a default ``lpq quantize``). Here the same inference runs on the
    model itself, which ORT then goes on with; ORT's function where that cannot be done.
    The written model has the same graph and values (ORT's round trip also left each
    tensor's ``data_location`` set to its default, so the bytes differ there)."""
    _patch_save_and_reload()
    token = _IN_MEMORY.set(True)
    try:
        yield
    finally:
        _IN_MEMORY.reset(token)


def _patch_save_and_reload() -> None:
    """Route ``onnx_quantizer.save_and_reload_model_with_shape_infer`` through
    :func:`_infer_in_place` inside :func:`shapes_inferred_in_memory`; outside it, ORT's
    function, unchanged. Done once per process."""
    from onnxruntime.quantization import onnx_quantizer
    from onnxruntime.quantization.quant_utils import add_infer_metadata

    original = onnx_quantizer.save_and_reload_model_with_shape_infer
    if getattr(original, "_lpq_in_memory", False):
        return

    def save_and_reload_model_with_shape_infer(model: onnx.ModelProto) -> onnx.ModelProto:
        if _IN_MEMORY.get() and _infer_in_place(model):
            add_infer_metadata(model)
            return model
        return original(model)

    save_and_reload_model_with_shape_infer._lpq_in_memory = True  # type: ignore[attr-defined]
    onnx_quantizer.save_and_reload_model_with_shape_infer = save_and_reload_model_with_shape_infer


def over_proto_limit(model: onnx.ModelProto, light: onnx.ModelProto) -> bool:
    """Whether ``model`` serializes to at least ``PROTO_LIMIT`` bytes, told without
    serializing it where the answer is clear: ``light`` (its graph without the weights'
    values) plus the bytes of the values left out, from their shapes. ``model.ByteSize()``
    serializes the whole model (ddddocr rec, 54 MB: 60 ms, in every build) and runs only
    where that estimate is within a margin of the limit."""
    kept = {init.name for init in light.graph.initializer}
    left_out = [init for init in model.graph.initializer if init.name not in kept]
    estimate = light.ByteSize() + sum(weights.tensor_bytes(init) for init in left_out)
    # headers (name, dims, type) of the left-out tensors, and a wide margin besides
    margin = (64 << 20) + 512 * len(left_out)
    if abs(estimate - model_io.PROTO_LIMIT) <= margin:
        return model.ByteSize() >= model_io.PROTO_LIMIT
    return estimate >= model_io.PROTO_LIMIT


class _QuantizerNoise(logging.Filter):
    """Moves ORT quantizer warnings that are expected under lpq to lpq's debug log."""

    EXPECTED = (
        # the dynamic pass runs on a model the static pass already gave Q/DQ nodes
        "already quantized",
        # ORT checks the int64 shape tensors around ops it quantizes (122 lines in one
        # default quantization of Silero VAD); what was quantized is read from the model
        "unsupported type to quantize",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(text in message for text in self.EXPECTED):
            log.debug("ORT quantizer: %s", message.splitlines()[0])
            return False
        return True


@contextlib.contextmanager
def quiet_quantizer() -> Iterator[None]:
    """ORT's quantizers warn on the root logger about things lpq expects (see
    :class:`_QuantizerNoise`): noise to a user, so they go to lpq's debug log."""
    root = logging.getLogger()
    quiet = _QuantizerNoise()
    root.addFilter(quiet)
    try:
        yield
    finally:
        root.removeFilter(quiet)


#: The weight cache of the build running in this context (see :meth:`WeightCache.active`),
#: with the digests of that build's weights by name.
_ACTIVE: contextvars.ContextVar[tuple[WeightCache, dict[str, bytes]] | None] = (
    contextvars.ContextVar("lpq_onnxrt_weight_cache", default=None)
)


def _digest(tensor: onnx.TensorProto) -> bytes:
    """The identity of a weight's values: type, shape and a hash of its bytes."""
    from onnx import numpy_helper

    digest = hashlib.sha1(f"{tensor.data_type}:{list(tensor.dims)}:".encode())
    digest.update(tensor.raw_data or numpy_helper.to_array(tensor).tobytes())
    return digest.digest()


def _array_key(value: Any) -> tuple[Any, ...]:
    array = np.asarray(value)
    return (array.dtype.str, array.shape, array.tobytes())


def _copy_params(params: Any) -> Any:
    """A copy of ORT's ``QuantizationParams`` whose arrays the caller may change (ORT's
    int32-bias check rescales a weight's scales in place)."""
    data = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in params.data.items()}
    return type(params)(**data)


class WeightCache:
    """Quantized weights shared by the builds of one quantize call.

    The latency search and the range choice build the same model many times with ORT's
    quantizer, and each build quantizes every weight again, per channel, in a Python loop
    over channels (ddddocr rec: its 8210-class Gemm weight; 13 builds, about 5 s). A
    weight's quantization depends only on its values and its settings, not on the
    activation ranges, so the builds of one call share it: ORT's own functions compute it
    once and their results are reused, keyed by the weight's name, a hash of its values
    and every setting ORT reads (quant type, axis, symmetry, reduce_range, overrides,
    the quantizer's options). What a build writes is the same, byte for byte.

    Use one cache per quantize call (it keeps each quantized weight: a quarter of the
    model's float weights per format); :meth:`active` around a quantizer's
    ``quantize_model``."""

    def __init__(self) -> None:
        self._params: dict[tuple[Any, ...], Any] = {}
        self._tensors: dict[tuple[Any, ...], onnx.TensorProto] = {}
        self._channels: dict[tuple[Any, ...], list[onnx.TensorProto]] = {}
        self.hits = 0
        self.misses = 0

    @contextlib.contextmanager
    def active(self, quantizer: Any) -> Iterator[None]:
        """Reuse this cache's weights in ``quantizer`` (a QDQQuantizer or ONNXQuantizer)
        while the block runs."""
        patch_quantize_onnx_initializer()
        digests: dict[str, bytes] = {}
        settings = _settings_key(quantizer)
        if hasattr(quantizer, "_calc_initializer_quant_params"):
            self._wrap_qdq_params(quantizer, digests, settings)
        if hasattr(quantizer, "quantize_weight_per_channel_impl"):
            self._wrap_per_channel(quantizer, digests, settings)
        token = _ACTIVE.set((self, digests))
        try:
            yield
        finally:
            _ACTIVE.reset(token)
            # The wrappers refer to the quantizer: left on it, they would make a cycle
            # that keeps each build's model alive until the cyclic collector runs
            # (ddddocr rec: peak 665 -> 790 MB).
            for name in ("_calc_initializer_quant_params", "quantize_weight_per_channel_impl"):
                vars(quantizer).pop(name, None)

    @staticmethod
    def _digest_of(digests: dict[str, bytes], tensor: onnx.TensorProto) -> bytes:
        found = digests.get(tensor.name)
        if found is None:
            found = digests[tensor.name] = _digest(tensor)
        return found

    def _wrap_qdq_params(
        self, quantizer: Any, digests: dict[str, bytes], settings: tuple[Any, ...]
    ) -> None:
        """QDQ: ``_calc_initializer_quant_params`` (scales and zero points of every
        weight, a loop over channels) computed only for the weights not seen before."""
        original = quantizer._calc_initializer_quant_params

        def calc() -> dict[str, Any]:
            every = quantizer.tensors_to_quantize
            initializers = {init.name: init for init in quantizer.model.initializer()}
            keys: dict[str, tuple[Any, ...]] = {}
            found: dict[str, Any] = {}
            todo = {}
            for name, info in every.items():
                init = initializers.get(name)
                if init is None:
                    continue
                key = (
                    "qdq-params",
                    name,
                    self._digest_of(digests, init),
                    repr(info.tensor_type),
                    info.axis,
                    _overrides_key(quantizer, name),
                    settings,
                )
                cached = self._params.get(key)
                if cached is not None:
                    found[name] = _copy_params(cached)
                    self.hits += 1
                else:
                    keys[name] = key
                    todo[name] = info
            if todo:
                quantizer.tensors_to_quantize = todo
                try:
                    fresh = original()
                finally:
                    quantizer.tensors_to_quantize = every
                for name, params in fresh.items():
                    self._params[keys[name]] = _copy_params(params)
                    self.misses += 1
                found.update(fresh)
            return {name: found[name] for name in every if name in found}

        quantizer._calc_initializer_quant_params = calc

    def _wrap_per_channel(
        self, quantizer: Any, digests: dict[str, bytes], settings: tuple[Any, ...]
    ) -> None:
        """QOperator: ``quantize_weight_per_channel_impl`` (adds the weight's scale, zero
        point and quantized initializers) replayed from the first build that made them."""
        original = quantizer.quantize_weight_per_channel_impl

        def impl(
            weight_name: str,
            weight_qType: Any,
            channel_axis: int,
            reduce_range: bool = True,
            keep_float_weight: bool = False,
        ) -> tuple[str, str, str]:
            init = quantizer.model.get_initializer(weight_name)
            if init is None:  # ORT's own error
                return original(
                    weight_name, weight_qType, channel_axis, reduce_range, keep_float_weight
                )
            key = (
                "per-channel",
                weight_name,
                self._digest_of(digests, init),
                weight_qType,
                channel_axis,
                reduce_range,
                keep_float_weight,
                _overrides_key(quantizer, weight_name),
                settings,
            )
            q_name = weight_name + "_quantized"
            names = (q_name, weight_name + "_zero_point", weight_name + "_scale")
            cached = self._channels.get(key)
            if cached is not None:
                quantizer.model.initializer_extend([_copy_tensor(t) for t in cached])
                self.hits += 1
                return names
            graph = quantizer.model.model.graph
            before = len(graph.initializer)
            got = original(weight_name, weight_qType, channel_axis, reduce_range, keep_float_weight)
            added = list(graph.initializer)[before:]
            if tuple(got) == names and {t.name for t in added} <= set(names):
                self._channels[key] = [_copy_tensor(t) for t in added]
                self.misses += 1
            return got

        quantizer.quantize_weight_per_channel_impl = impl

    def quantized_tensor(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """ORT's ``quantize_onnx_initializer`` result for ``key``, made once."""
        cached = self._tensors.get(key)
        if cached is None:
            cached = self._tensors[key] = _copy_tensor(make())
            self.misses += 1
        else:
            self.hits += 1
        return _copy_tensor(cached)


def _copy_tensor(tensor: onnx.TensorProto) -> onnx.TensorProto:
    import onnx

    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    return copy


def _overrides_key(quantizer: Any, name: str) -> str:
    helper = getattr(quantizer, "tensor_quant_overrides", None)
    overrides = getattr(helper, "overrides", None)
    return repr(overrides.get(name) if isinstance(overrides, Mapping) else None)


def _settings_key(quantizer: Any) -> tuple[Any, ...]:
    """What a quantizer reads besides a weight and its overrides when it quantizes it."""
    extra = getattr(quantizer, "extra_options", None) or {}
    options = repr(sorted((k, repr(v)) for k, v in extra.items() if k != "TensorQuantOverrides"))
    weight_type = getattr(quantizer, "weight_qType", None)
    activation_type = getattr(quantizer, "activation_qType", None)
    symmetric: tuple[Any, ...] = ()
    is_weight_symmetric = getattr(quantizer, "is_weight_symmetric", None)
    if callable(is_weight_symmetric):
        symmetric = (is_weight_symmetric(weight_type), is_weight_symmetric(activation_type))
    return (
        type(quantizer).__name__,
        weight_type,
        activation_type,
        getattr(quantizer, "is_activation_symmetric", None),
        symmetric,
        getattr(quantizer, "reduce_range", None),
        getattr(quantizer, "min_real_range", None),
        getattr(quantizer, "block_size", None),
        getattr(quantizer, "per_channel", None),
        options,
    )


def patch_quantize_onnx_initializer() -> None:
    """Route ``qdq_quantizer.quantize_onnx_initializer`` (a QDQ weight's values, per
    channel in a loop over channels) through the active :class:`WeightCache`, if any, and
    inside :func:`~lpq_onnxrt.passes.channelwise.vectorized` through its whole-array
    quantization; elsewhere it is ORT's function, unchanged. Done once per process."""
    from onnxruntime.quantization import qdq_quantizer

    original = qdq_quantizer.quantize_onnx_initializer
    if getattr(original, "_lpq_cached", False):
        return

    def quantize_onnx_initializer(
        weight: onnx.TensorProto,
        quant_type: Any,
        zero_point: np.ndarray,
        scale: np.ndarray,
        axis: int | None = None,
        quant_weight_name: str | None = None,
        block_size: int = 0,
    ) -> onnx.TensorProto:
        def make() -> onnx.TensorProto:
            if channelwise.active():
                name = quant_weight_name or weight.name + "_quantized"
                fast = channelwise.quantized_initializer(
                    weight, quant_type, zero_point, scale, axis, name, block_size
                )
                if fast is not None:
                    return fast
            return original(
                weight, quant_type, zero_point, scale, axis, quant_weight_name, block_size
            )

        active = _ACTIVE.get()
        if active is None:
            return make()
        cache, digests = active
        key = (
            "initializer",
            weight.name,
            cache._digest_of(digests, weight),
            quant_type,
            _array_key(zero_point),
            _array_key(scale),
            axis,
            quant_weight_name,
            block_size,
        )
        return cache.quantized_tensor(key, make)

    quantize_onnx_initializer._lpq_cached = True  # type: ignore[attr-defined]
    qdq_quantizer.quantize_onnx_initializer = quantize_onnx_initializer
