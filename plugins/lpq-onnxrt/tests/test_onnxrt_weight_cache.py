"""The weight cache shared by the builds of one quantize call (``passes.quantizer.
WeightCache``): a build that reuses quantized weights writes the same bytes as one that
quantizes them itself, in both formats, and weights whose values or settings differ are
quantized again."""

from __future__ import annotations

from typing import Any

import onnx
import pytest
from onnx import numpy_helper


@pytest.fixture
def parts(digits_static: dict[str, Any]) -> dict[str, Any]:
    cfg = digits_static["cfg"]
    ops = {n: c for (n, _), c in cfg.ops.items() if c.quantized}
    model = digits_static["prepared"].model
    return {"model": model, "cfg": cfg, "stats": digits_static["stats"], "ops": ops}


def _build(parts: dict[str, Any], fmt: str, cache: Any = None, **kw: Any) -> onnx.ModelProto:
    from lpq_onnxrt import model_io
    from lpq_onnxrt.passes.static import static_pass

    model = kw.pop("model", parts["model"])
    ops = kw.pop("ops", parts["ops"])
    built, _ = static_pass(
        model_io.copy_model(model), ops, parts["cfg"], parts["stats"], fmt, weight_cache=cache
    )
    return built


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_cached_builds_write_the_same_bytes(parts, fmt):
    from lpq_onnxrt.passes.quantizer import WeightCache

    plain = _build(parts, fmt).SerializeToString()
    cache = WeightCache()
    first = _build(parts, fmt, cache).SerializeToString()
    assert cache.misses > 0 and cache.hits == 0
    misses = cache.misses
    # other activation ranges (narrowed): the weights are reused, the rest is rebuilt
    second = _build(parts, fmt, cache).SerializeToString()
    assert cache.hits >= misses and cache.misses == misses  # every weight reused
    assert first == plain and second == plain


def test_fewer_ops_and_other_formats_share_the_cache_soundly(parts):
    from lpq_onnxrt.passes.quantizer import WeightCache

    cache = WeightCache()
    some = dict(list(parts["ops"].items())[1:])  # the first op left float
    for fmt in ("qdq", "qoperator", "qdq"):
        assert (
            _build(parts, fmt, cache).SerializeToString() == _build(parts, fmt).SerializeToString()
        )
        got = _build(parts, fmt, cache, ops=some).SerializeToString()
        assert got == _build(parts, fmt, ops=some).SerializeToString()


def test_changed_weights_are_quantized_again(parts):
    from lpq_onnxrt import model_io
    from lpq_onnxrt.passes.quantizer import WeightCache

    cache = WeightCache()
    _build(parts, "qdq", cache)
    changed = model_io.copy_model(parts["model"])
    biggest = max(changed.graph.initializer, key=lambda t: numpy_helper.to_array(t).size)
    value = numpy_helper.to_array(biggest) * 3.0
    biggest.CopyFrom(numpy_helper.from_array(value, biggest.name))
    misses = cache.misses
    got = _build(parts, "qdq", cache, model=changed).SerializeToString()
    assert cache.misses > misses  # the changed weight is not served from the cache
    assert got == _build(parts, "qdq", model=changed).SerializeToString()


def test_without_a_cache_ort_is_unchanged(parts):
    """The patched ``quantize_onnx_initializer`` is ORT's function when no cache is
    active (after a cached build in this process)."""
    from onnxruntime.quantization import qdq_quantizer

    from lpq_onnxrt.passes.quantizer import WeightCache

    _build(parts, "qdq", WeightCache())
    assert getattr(qdq_quantizer.quantize_onnx_initializer, "_lpq_cached", False)
    from lpq_onnxrt.passes import quantizer

    assert quantizer._ACTIVE.get() is None
    assert _build(parts, "qdq").SerializeToString() == _build(parts, "qdq").SerializeToString()


def test_proto_limit_is_told_from_shapes_without_serializing(parts, monkeypatch):
    """``over_proto_limit`` answers as ``ByteSize`` would, and serializes the whole model
    only near the limit."""
    from lpq_onnxrt import model_io, weights
    from lpq_onnxrt.passes import quantizer

    model = model_io.copy_model(parts["model"])
    light = weights.for_shape_inference(model)
    size = model.ByteSize()
    calls: list[int] = []

    class Counted:
        def __init__(self, inner: onnx.ModelProto) -> None:
            self.graph = inner.graph
            self.inner = inner

        def ByteSize(self) -> int:
            calls.append(1)
            return int(self.inner.ByteSize())

    counted = Counted(model)
    for limit, over, exact in [
        (2_000_000_000, False, False),  # far above: no serialization
        (size + 10, False, True),  # within the margin: the exact answer
        (size - 10, True, True),
    ]:
        calls.clear()
        monkeypatch.setattr(model_io, "PROTO_LIMIT", limit)
        assert quantizer.over_proto_limit(counted, light) is over  # type: ignore[arg-type]
        assert bool(calls) is exact


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_a_cached_build_keeps_no_quantizer_alive(parts, fmt, monkeypatch):
    """The cache's wrappers are taken off the quantizer when its build ends: left on it,
    they refer to it (a cycle) and every build's model stayed alive until the cyclic
    collector ran (ddddocr rec: peak 665 -> 790 MB)."""
    import gc
    import weakref

    from lpq_onnxrt.passes import static
    from lpq_onnxrt.passes.quantizer import WeightCache

    seen: list[weakref.ref[Any]] = []
    original = static.fast_rewiring

    def remember(quantizer: Any) -> None:
        seen.append(weakref.ref(quantizer))
        original(quantizer)

    monkeypatch.setattr(static, "fast_rewiring", remember)
    cache = WeightCache()
    gc.collect()
    gc.disable()
    try:
        for _ in range(2):  # a miss, then a hit
            _build(parts, fmt, cache)
        assert len(seen) == 2 and cache.hits
        assert [ref() for ref in seen] == [None, None]  # freed by reference counting alone
    finally:
        gc.enable()


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_indexed_lookups_write_the_same_bytes(parts, fmt, monkeypatch):
    """ORT's quantizer with lpq's indexed name lookups (``fast_lookups``) writes the same
    model as with its own scans; ORT's modules get their functions back afterwards."""
    import contextlib

    from onnxruntime.quantization import onnx_model, qdq_quantizer

    from lpq_onnxrt.passes import static

    original = (onnx_model.find_by_name, qdq_quantizer.find_by_name)
    fast = _build(parts, fmt).SerializeToString()
    assert (onnx_model.find_by_name, qdq_quantizer.find_by_name) == original
    monkeypatch.setattr(static, "fast_lookups", lambda _: contextlib.nullcontext())
    assert _build(parts, fmt).SerializeToString() == fast


def test_the_name_index_finds_what_a_scan_finds():
    """Appends (named before they are added, as ORT's quantizers do), removals, renames
    of the last item and lookups of present and absent names, at random: the index
    answers as ORT's scan does (the first item of the name, or None); a plain list is
    scanned."""
    import random

    from onnx import TensorProto, helper
    from onnxruntime.quantization.quant_utils import find_by_name

    from lpq_onnxrt.passes.quantizer import _NameIndex

    rng = random.Random(0)
    graph = helper.make_graph([], "g", [], [])
    items = graph.initializer
    index = _NameIndex()

    def tensor(name: str) -> Any:
        return helper.make_tensor(name, TensorProto.FLOAT, [1], [0.0])

    for step in range(3000):
        action = rng.random()
        if action < 0.3:
            items.append(tensor(f"t{rng.randrange(400)}"))
        elif action < 0.35 and len(items):
            items.remove(items[rng.randrange(len(items))])
        elif action < 0.37 and len(items):
            items[len(items) - 1].name = f"t{rng.randrange(400)}"
        name = f"t{rng.randrange(400)}"
        found, expected = index.find(name, items), find_by_name(name, items)
        assert (found is None) == (expected is None), (step, name)
        if found is not None:
            assert found.name == name and found == expected
    copied = list(items)
    assert index.find(copied[-1].name, copied) is find_by_name(copied[-1].name, copied)
