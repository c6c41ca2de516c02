"""What the passes that call ONNX Runtime's quantizers share: lpq dtypes as ORT quant
types, a hashable key for tensor settings, and quieting the warnings ORT's quantizers
log about things lpq expects."""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections import Counter
from collections.abc import Iterator
from typing import Any

from lpq import ConfigError, OpConfig, TensorConfig

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
