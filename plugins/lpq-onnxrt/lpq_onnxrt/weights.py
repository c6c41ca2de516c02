"""Large initializers kept out of the ``ModelProto`` while the graph is worked on.

A 540 MB LLM export costs a full copy every time the whole proto is serialized (an ORT
session from bytes, onnx's shape inference and version converter, which run in C++ on
a serialized copy), and ORT copies the initializers again (and pre-packs MatMul
weights). Most of that work needs only the graph and the tensors' shapes. So a model is
*detached*: its large initializers become header-only tensors (name, dims, type) marked
as external data at :data:`DETACHED`, and their values are held once, as numpy arrays
(``blobs``). ORT sessions get the arrays through ``add_external_initializers`` (no copy,
no pre-packing); :func:`attach` puts them back into the proto when the data is needed
(quantizing, saving).

Nothing here changes a model passed in except :func:`attach`, which fills the proto it
is given.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx
    import onnxruntime

#: The external-data location of a detached initializer (no such file is ever written).
DETACHED = "lpq-detached"
#: Initializers from this size on are detached.
MIN_BYTES = 1 << 20

Blobs = dict[str, np.ndarray]


def _np_dtype(data_type: int) -> np.dtype[Any] | None:
    """The numpy dtype of a tensor type stored one element per item (None for packed
    types: int4, bfloat16, float8, strings)."""
    from onnx import TensorProto

    plain: dict[int, type[Any]] = {
        TensorProto.FLOAT: np.float32,
        TensorProto.DOUBLE: np.float64,
        TensorProto.FLOAT16: np.float16,
        TensorProto.INT8: np.int8,
        TensorProto.UINT8: np.uint8,
        TensorProto.INT16: np.int16,
        TensorProto.UINT16: np.uint16,
        TensorProto.INT32: np.int32,
        TensorProto.UINT32: np.uint32,
        TensorProto.INT64: np.int64,
        TensorProto.UINT64: np.uint64,
    }
    kind = plain.get(data_type)
    return None if kind is None else np.dtype(kind).newbyteorder("<")


def nbytes(tensor: onnx.TensorProto) -> int:
    """The tensor's size from its header (0 for types :func:`detach` leaves inline)."""
    dtype = _np_dtype(tensor.data_type)
    return 0 if dtype is None else int(np.prod(tensor.dims, dtype=np.int64)) * dtype.itemsize


def tensor_bytes(tensor: onnx.TensorProto) -> int:
    """The tensor's bytes without serializing it: :func:`nbytes` for the types stored one
    element per item, the serialized size for the others (packed types, strings)."""
    if _np_dtype(tensor.data_type) is not None:
        return nbytes(tensor)
    return int(tensor.ByteSize())


def is_detached(tensor: onnx.TensorProto) -> bool:
    return any(e.key == "location" and e.value == DETACHED for e in tensor.external_data)


def _external(tensor: onnx.TensorProto) -> dict[str, str]:
    from onnx import TensorProto

    if tensor.data_location != TensorProto.EXTERNAL:
        return {}
    return {e.key: e.value for e in tensor.external_data}


def _header(tensor: onnx.TensorProto) -> onnx.TensorProto:
    from onnx import TensorProto

    head = TensorProto(name=tensor.name, data_type=tensor.data_type, doc_string=tensor.doc_string)
    head.dims.extend(tensor.dims)
    head.data_location = TensorProto.EXTERNAL
    head.external_data.add(key="location", value=DETACHED)
    return head


def _value(tensor: onnx.TensorProto, base_dir: Path | None) -> np.ndarray:
    """The tensor's values, read once (from its external file when it has one)."""
    from onnx import numpy_helper

    dtype = _np_dtype(tensor.data_type)
    ext = _external(tensor)
    if ext and dtype is not None and base_dir is not None:
        count = int(np.prod(tensor.dims, dtype=np.int64))
        offset = int(ext.get("offset", 0) or 0)
        with open(base_dir / ext["location"], "rb") as handle:
            handle.seek(offset)
            value = np.fromfile(handle, dtype=dtype, count=count)
        return value.reshape(tuple(tensor.dims))
    if not ext:
        return array(tensor)
    return np.asarray(numpy_helper.to_array(tensor, str(base_dir or "")))


def array(tensor: onnx.TensorProto) -> np.ndarray:
    """The values of an in-memory tensor as a read-only array, copied once: protobuf
    hands ``raw_data`` out as a new ``bytes`` object, which the array views (onnx's
    ``to_array`` copies it a second time)."""
    from onnx import numpy_helper

    dtype = _np_dtype(tensor.data_type)
    if dtype is not None and tensor.HasField("raw_data") and not _external(tensor):
        return np.frombuffer(tensor.raw_data, dtype=dtype).reshape(tuple(tensor.dims))
    return np.asarray(numpy_helper.to_array(tensor))


def header(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """A header-only copy of ``tensor`` (name, dims, type) marked detached: its values
    go to a session as an array (:func:`session`)."""
    return _header(tensor)


def bare(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model``'s fields but its graph (IR version, opsets, local functions):
    the start of a sub-model."""
    import onnx

    light = onnx.ModelProto()
    _copy_fields(light, model, "graph")
    return light


def shell(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` without a single initializer (graph, inputs, outputs, opsets,
    metadata): the start of a model written tensor by tensor."""
    import onnx

    light = onnx.ModelProto()
    _copy_fields(light, model, "graph")
    _copy_fields(light.graph, model.graph, "initializer")
    return light


#: Float initializers at least this large enter :func:`for_shape_inference` as typed
#: inputs, without their values (weights: only their shapes matter there).
SHAPE_ONLY_BYTES = 1024


def for_shape_inference(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` for shape inference only: large float initializers become typed
    graph inputs (no data copied); integer and small initializers keep their values (they
    compute shapes: Reshape targets, Resize scales). onnx's inference serializes the model
    it is given and parses its result back: with the weights, three copies of them."""
    from onnx import TensorProto, helper

    source = model.graph
    light = shell(model)
    graph = light.graph
    listed = {given.name for given in source.input}
    for init in source.initializer:
        integer = init.data_type in (TensorProto.INT64, TensorProto.INT32)
        if integer or tensor_bytes(init) < SHAPE_ONLY_BYTES:
            graph.initializer.append(init)
        elif init.name not in listed:
            graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, init.dims))
    return light


def _copy_fields(dst: Any, src: Any, skip: str) -> None:
    for field, value in src.ListFields():
        if field.name == skip:
            continue
        if hasattr(value, "extend"):  # repeated (protobuf 6 has no FieldDescriptor.label)
            getattr(dst, field.name).extend(value)
        elif field.message_type is not None:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


def detach(
    model: onnx.ModelProto,
    min_bytes: int | None = None,
    base_dir: str | os.PathLike[str] | None = None,
    blobs: Blobs | None = None,
    inline: Collection[str] = (),
) -> tuple[onnx.ModelProto, Blobs]:
    """A copy of ``model`` (not modified) whose initializers of ``min_bytes`` or more are
    header-only, and their values by name. ``base_dir`` is where external data files of
    ``model`` are (a model loaded with ``load_external_data=False``). Initializers already
    detached stay so, their values taken from ``blobs``. Without ``base_dir``, tensors
    whose data is in external files stay as they are; so do those named in ``inline``."""
    import onnx

    base = Path(base_dir) if base_dir is not None else None
    min_bytes = MIN_BYTES if min_bytes is None else min_bytes
    light = onnx.ModelProto()
    _copy_fields(light, model, "graph")
    _copy_fields(light.graph, model.graph, "initializer")
    out: Blobs = {}
    for init in model.graph.initializer:
        if is_detached(init):
            light.graph.initializer.append(init)
            if blobs is not None and init.name in blobs:
                out[init.name] = blobs[init.name]
            continue
        size = nbytes(init)
        if (
            size
            and size >= min_bytes
            and init.name not in inline
            and (base is not None or not _external(init))
        ):
            out[init.name] = np.ascontiguousarray(_value(init, base))
            light.graph.initializer.append(_header(init))
        elif _external(init) and base is not None:
            light.graph.initializer.append(_inline(init, _value(init, base)))
        else:
            light.graph.initializer.append(init)
    return light, out


def _inline(tensor: onnx.TensorProto, value: np.ndarray) -> onnx.TensorProto:
    from onnx import numpy_helper

    fresh = numpy_helper.from_array(np.asarray(value), tensor.name)
    fresh.doc_string = tensor.doc_string
    return fresh


def load_detached(
    path: str | os.PathLike[str], min_bytes: int | None = None
) -> tuple[onnx.ModelProto, Blobs]:
    """An ONNX file as :func:`detach` returns it, each external tensor read once."""
    import onnx

    file = Path(path)
    proto = onnx.load(str(file), load_external_data=False)
    return detach(proto, min_bytes, base_dir=file.parent)


def attach(model: onnx.ModelProto, blobs: Blobs, names: Iterable[str] | None = None) -> int:
    """Put the values of detached initializers (all, or those in ``names``) back into
    ``model`` (in place), dropping each from ``blobs`` as it goes; return how many."""
    from onnx import TensorProto

    wanted = None if names is None else set(names)
    done = 0
    for init in model.graph.initializer:
        if not is_detached(init) or (wanted is not None and init.name not in wanted):
            continue
        value = blobs.pop(init.name) if wanted is None else blobs[init.name]
        del init.external_data[:]
        init.data_location = TensorProto.DEFAULT
        init.raw_data = np.ascontiguousarray(value).astype(value.dtype.newbyteorder("<")).tobytes()
        done += 1
    return done


def release_free_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``; nothing
    elsewhere). A layer-by-layer pass frees each layer's session, weights and statistics,
    but glibc keeps the freed pages of many mid-sized blocks, so the process's resident
    memory grows by every layer's leftovers unless they are returned."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def has_detached(model: onnx.ModelProto) -> bool:
    return any(is_detached(init) for init in model.graph.initializer)


def session(
    light: onnx.ModelProto,
    blobs: Mapping[str, np.ndarray],
    opts: onnxruntime.SessionOptions,
    providers: list[str],
    *,
    prepacking: bool = False,
    light_bytes: bytes | None = None,
    **kwargs: Any,
) -> onnxruntime.InferenceSession:
    """An ORT session of a detached model: the arrays are handed to ORT as they are
    (``add_external_initializers``, no copy). Pre-packing is off unless asked for: it
    copies every MatMul weight (an LLM's memory), but sessions that are timed need it,
    as the user's own sessions have it. The arrays are kept alive with the session;
    ``opts`` is for this session only (it now names the arrays). ``light_bytes``: ``light``
    serialized already, where the caller has it."""
    import onnxruntime as ort

    names = [init.name for init in light.graph.initializer if is_detached(init)]
    values = [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(blobs[n])) for n in names]
    if names:
        opts.add_external_initializers(names, values)
        if not prepacking:
            opts.add_session_config_entry("session.disable_prepacking", "1")
    data = light_bytes if light_bytes is not None else light.SerializeToString()
    made = ort.InferenceSession(data, opts, providers=providers, **kwargs)
    made._lpq_keepalive = values  # ORT reads the buffers
    return made


def spill(
    light: onnx.ModelProto, blobs: Blobs, model_file: Path, data_name: str = "weights.data"
) -> None:
    """Write a detached model as an ONNX file with external data next to it, array by
    array, then empty ``blobs``: ORT can open the file itself (it maps the data instead of
    copying the arrays it is handed), and the arrays' memory is free while it works.
    ``light`` is not modified."""
    import onnx

    out = onnx.ModelProto()
    _copy_fields(out, light, "graph")
    _copy_fields(out.graph, light.graph, "initializer")
    with open(model_file.parent / data_name, "wb") as handle:
        for init in light.graph.initializer:
            if not is_detached(init):
                out.graph.initializer.append(init)
                continue
            value = np.ascontiguousarray(blobs.pop(init.name))
            raw = value.astype(value.dtype.newbyteorder("<"), copy=False).tobytes()
            del value
            out.graph.initializer.append(_append_external(handle, init, raw, data_name))
    blobs.clear()
    onnx.save_model(out, str(model_file))


def _append_external(
    handle: Any, tensor: onnx.TensorProto, raw: bytes, location: str
) -> onnx.TensorProto:
    """Append ``raw`` to the open data file at a 4 KiB-aligned offset; return the header
    of ``tensor`` pointing there."""
    from onnx import TensorProto

    handle.write(b"\0" * (-handle.tell() % 4096))
    start = handle.tell()
    handle.write(raw)
    head = _header(tensor)
    del head.external_data[:]
    head.data_location = TensorProto.EXTERNAL
    for key, value in (
        ("location", location),
        ("offset", str(start)),
        ("length", str(handle.tell() - start)),
    ):
        head.external_data.add(key=key, value=value)
    return head


def write_split(
    model: onnx.ModelProto, data_file: Path, location: str, min_bytes: int = 1024
) -> onnx.ModelProto:
    """Write ``model``'s initializers of ``min_bytes`` or more to ``data_file`` (one tensor
    at a time, each at a 4 KiB-aligned offset) and return a copy of ``model`` that refers
    to them at ``location``; ``model`` is not modified and never copied whole."""
    import onnx

    light = onnx.ModelProto()
    _copy_fields(light, model, "graph")
    _copy_fields(light.graph, model.graph, "initializer")
    with open(data_file, "wb") as handle:
        for init in model.graph.initializer:
            if nbytes(init) < min_bytes or not init.HasField("raw_data"):
                light.graph.initializer.append(init)
                continue
            light.graph.initializer.append(_append_external(handle, init, init.raw_data, location))
        handle.flush()
        os.fsync(handle.fileno())
    return light
