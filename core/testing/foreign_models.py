"""Files an adaptor's detection must decline: lpq's own data files and other frameworks'
models, written without any framework (right suffix and magic bytes, minimal content).

A detector that only checks "is a zip archive" takes lpq's ``.npz`` data (a zip) for a
model; one that only checks a suffix takes a text file. The conformance suite hands
every adaptor each of these files, except those of its own format.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: A minimal ONNX ModelProto: ir_version 8, an empty graph "g", opset 17.
_ONNX_BYTES = bytes([0x08, 0x08, 0x3A, 0x03, 0x12, 0x01, 0x67, 0x42, 0x02, 0x10, 0x11])


@dataclass(frozen=True)
class ForeignModel:
    """One kind of file; ``framework`` is the adaptor that may claim it (``None``: none)."""

    kind: str
    framework: str | None
    filename: str

    def write(self, folder: Path) -> Path:
        path = folder / self.filename
        path.parent.mkdir(parents=True, exist_ok=True)
        _WRITERS[self.kind](path)
        return path


def _npz(path: Path) -> None:
    np.savez(path, input=np.zeros((4, 3), np.float32), labels=np.zeros(4, np.int64))


def _zip(entries: dict[str, str]) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        with zipfile.ZipFile(path, "w") as archive:
            for name, text in entries.items():
                archive.writestr(name, text)

    return write


def _tflite(path: Path) -> None:
    path.write_bytes(b"\x1c\x00\x00\x00TFL3" + bytes(24))


def _mxnet(path: Path) -> None:
    path.write_text(json.dumps({"nodes": [], "arg_nodes": [], "heads": []}))
    (path.parent / path.name.replace("-symbol.json", "-0000.params")).write_bytes(bytes(16))


def _saved_model(path: Path) -> None:
    path.mkdir(exist_ok=True)
    (path / "saved_model.pb").write_bytes(b"\x08\x01")


_WRITERS = {
    "lpq-npz-data": _npz,
    "onnx": lambda path: path.write_bytes(_ONNX_BYTES),
    "torch-pt2": _zip({"archive/version": "1\n", "archive/data.pkl": ""}),
    "keras": _zip({"metadata.json": "{}", "config.json": "{}"}),
    "tflite": _tflite,
    "tf-saved-model": _saved_model,
    "mxnet": _mxnet,
}

FOREIGN_MODELS: tuple[ForeignModel, ...] = (
    ForeignModel("lpq-npz-data", None, "calib.npz"),
    ForeignModel("onnx", "onnxrt", "model.onnx"),
    ForeignModel("torch-pt2", "torch", "model.pt2"),
    ForeignModel("keras", "tf", "model.keras"),
    ForeignModel("tflite", "tf", "model.tflite"),
    ForeignModel("tf-saved-model", "tf", "saved_model"),
    ForeignModel("mxnet", "mxnet", "net-symbol.json"),
)
