"""Dataloader helpers, .npz data files and atomic writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import lpq
from lpq import ArrayLoader, atomic_write, batch_size, load_npz, split_batch, take_samples


def test_array_loader_batches_and_reiterates():
    x, y = np.arange(20, dtype=np.float32).reshape(10, 2), np.arange(10)
    loader = ArrayLoader(x, y, batch_size=4)
    assert len(loader) == 3
    batches = list(loader)
    assert [len(b[0]) for b in batches] == [4, 4, 2]
    np.testing.assert_array_equal(batches[2][1], [8, 9])
    assert len(list(loader)) == 3, "re-iterable for repeated evaluation"
    assert [batch_size(b) for b in ArrayLoader(x, batch_size=8)] == [8, 2]


def test_array_loader_with_named_inputs():
    loader = ArrayLoader({"a": np.zeros((3, 2)), "b": np.ones((3, 5))}, batch_size=2)
    first = next(iter(loader))
    assert set(first) == {"a", "b"} and first["b"].shape == (2, 5)
    assert batch_size(first) == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"inputs": np.zeros((0, 2))}, "holds no samples"),
        ({"inputs": np.zeros((4, 2)), "batch_size": 0}, "batch size must be at least 1"),
        ({"inputs": np.zeros((4, 2)), "labels": np.zeros(3)}, "3 labels for 4 samples"),
        (
            {"inputs": {"a": np.zeros((4, 2)), "b": np.zeros((5, 2))}},
            "input 'b' has 5 samples, expected 4",
        ),
    ],
)
def test_array_loader_errors(kwargs, message):
    with pytest.raises(lpq.DataError, match=message):
        ArrayLoader(**kwargs)


def test_split_batch():
    x, y = np.zeros((2, 3)), np.zeros(2)
    assert split_batch((x, y)) == (x, y)
    assert split_batch(x) == (x, None)
    triple = (x, x, x)
    assert split_batch(triple) == (triple, None)


def test_take_samples_stops_and_complains_when_empty():
    loader = ArrayLoader(np.zeros((10, 1)), batch_size=3)
    assert sum(batch_size(b) for b in take_samples(loader, 5)) == 6  # whole batches
    assert len(list(take_samples(loader, None))) == 4
    with pytest.raises(lpq.DataError, match="yielded no batches"):
        list(take_samples([], 5))


def test_load_npz(tmp_path: Path):
    single, multi = tmp_path / "single.npz", tmp_path / "multi.npz"
    np.savez(single, x=np.zeros((5, 2), np.float32), labels=np.arange(5))
    np.savez(multi, a=np.zeros((5, 2)), b=np.ones((5, 1)))
    loader = load_npz(single, batch_size=2)
    assert isinstance(loader.inputs, np.ndarray) and loader.labels is not None
    assert len(loader) == 3
    loader = load_npz(multi)
    assert set(loader.inputs) == {"a", "b"} and loader.labels is None


def test_load_npz_errors(tmp_path: Path):
    with pytest.raises(lpq.DataError, match="does not exist"):
        load_npz(tmp_path / "missing.npz")
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(b"this is not a zip file")
    with pytest.raises(lpq.DataError, match="cannot read") as info:
        load_npz(corrupt)
    assert "numpy.savez" in (info.value.hint or "")
    only_labels = tmp_path / "labels.npz"
    np.savez(only_labels, labels=np.arange(3))
    with pytest.raises(lpq.DataError, match="holds no input arrays"):
        load_npz(only_labels)
    pickled = tmp_path / "objects.npz"
    np.savez(pickled, x=np.array([{"evil": 1}], dtype=object))
    with pytest.raises(lpq.DataError, match="cannot read"):
        load_npz(pickled)
    ragged = tmp_path / "ragged.npz"
    np.savez(ragged, a=np.zeros((3, 1)), b=np.zeros((4, 1)))
    with pytest.raises(lpq.DataError, match="input 'b' has 4 samples"):
        load_npz(ragged)


def test_atomic_write_replaces_on_success(tmp_path: Path):
    target = tmp_path / "sub" / "history.json"
    lpq.write_json(target, {"trials": [1, 2]})
    assert target.read_text() == '{\n  "trials": [\n    1,\n    2\n  ]\n}\n'
    with atomic_write(target, "wb") as handle:
        handle.write(b"binary")
    assert target.read_bytes() == b"binary"
    assert [p.name for p in target.parent.iterdir()] == ["history.json"]


def test_atomic_write_keeps_the_old_file_when_the_writer_raises(tmp_path: Path):
    target = tmp_path / "model.bin"
    target.write_text("the good old content")
    with pytest.raises(RuntimeError, match="crash"), atomic_write(target) as handle:
        handle.write("half of the new cont")
        raise RuntimeError("crash while writing")
    assert target.read_text() == "the good old content"
    assert [p.name for p in tmp_path.iterdir()] == ["model.bin"], "no temporary file left"


def test_atomic_write_survives_keyboard_interrupt(tmp_path: Path):
    target = tmp_path / "history.json"
    lpq.write_json(target, {"done": 3})
    with pytest.raises(KeyboardInterrupt), atomic_write(target) as handle:
        handle.write("{")
        raise KeyboardInterrupt
    assert target.read_text().startswith('{\n  "done": 3')
    assert len(list(tmp_path.iterdir())) == 1


def test_write_json_failing_midway_keeps_old_file(tmp_path: Path):
    target = tmp_path / "report.json"
    lpq.write_json(target, {"ok": True})
    circular: dict[str, object] = {"first": list(range(1000))}
    circular["self"] = circular  # json.dump fails after streaming part of the document
    with pytest.raises(ValueError, match="Circular reference"):
        lpq.write_json(target, circular)
    assert target.read_text() == '{\n  "ok": true\n}\n'
    assert len(list(tmp_path.iterdir())) == 1


def test_two_item_lists_are_inputs_and_labels_like_torch_dataloader_batches():
    x, y = np.zeros((4, 3), np.float32), np.arange(4)
    inputs, labels = lpq.split_batch([x, y])
    assert inputs is x and labels is y
    assert lpq.split_batch([x, y, y])[1] is None
