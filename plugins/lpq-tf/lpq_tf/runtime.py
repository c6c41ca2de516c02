"""Running a ``.tflite`` model with ai-edge-litert's interpreter, batch by batch.

``tf.lite.Interpreter`` is deprecated; ``ai_edge_litert.interpreter.Interpreter`` is the
maintained runtime and imports no TensorFlow. :class:`Runner` resizes the inputs when the
batch size changes, feeds it batches checked by :mod:`lpq_tf.data` (a misfit is a
:class:`lpq.DataError` naming the input, not a C++ error) and dequantizes integer
outputs, so every model answers in float32.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from lpq import DataError, split_batch, take_samples

from .data import InputSpec, make_feed
from .tfenv import quietly


def create_interpreter(content: bytes, threads: int | None = None, preserve: bool = False) -> Any:
    """A LiteRT interpreter for ``content`` (``preserve`` keeps every intermediate tensor)."""
    from ai_edge_litert.interpreter import Interpreter

    from lpq import ModelError

    # LiteRT logs "Created TensorFlow Lite XNNPACK delegate" on stderr: shown on failure only.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # preserve_all_tensors warns it is for debugging
        return quietly(
            lambda: Interpreter(
                model_content=content,
                num_threads=threads,
                experimental_preserve_all_tensors=preserve,
            ),
            lambda exc, log: ModelError(
                f"LiteRT cannot load the model: {exc}".splitlines()[0],
                hint="the model may use custom ops or TF (Flex) ops that ai-edge-litert lacks\n"
                + log,
            ),
        )


class Runner:
    """One interpreter plus the bookkeeping to feed it batches of any size."""

    def __init__(self, content: bytes, threads: int | None = None, preserve: bool = False):
        self.interpreter = create_interpreter(content, threads, preserve)
        self.specs = input_specs(self.interpreter)
        self.outputs = self.interpreter.get_output_details()
        self._shapes: tuple[tuple[int, ...], ...] | None = None

    def feed(self, inputs: Any) -> list[np.ndarray]:
        """The arrays of one batch, checked and ordered like the model's inputs."""
        return make_feed(self.specs, inputs)

    def prepare(self) -> None:
        """Allocate the model for a batch of one: LiteRT checks every op's kernel here."""
        self._resize(tuple(tuple(1 if d is None else d for d in s.shape) for s in self.specs))

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Run one checked batch; float32 outputs in the model's output order."""
        interpreter = self.interpreter
        self._resize(tuple(a.shape for a in arrays))
        for spec, array in zip(self.specs, arrays):
            interpreter.set_tensor(spec.index, array)
        try:
            interpreter.invoke()
        except RuntimeError as exc:
            raise DataError(
                f"LiteRT could not run the batch: {exc}".splitlines()[0],
                hint="check the data's shapes and dtypes against the model's inputs",
            ) from None
        return [_to_float(d, interpreter.get_tensor(d["index"])) for d in self.outputs]

    def _resize(self, shapes: tuple[tuple[int, ...], ...]) -> None:
        interpreter = self.interpreter
        if shapes != self._shapes:
            try:
                for spec, shape in zip(self.specs, shapes):
                    interpreter.resize_tensor_input(spec.index, list(shape), strict=False)
                interpreter.allocate_tensors()
            except (ValueError, RuntimeError) as exc:
                raise DataError(
                    f"LiteRT cannot run inputs of shape {list(shapes)}: {exc}".splitlines()[0],
                    hint="the model may have a fixed batch size; batch the data to match",
                ) from None
            self._shapes = shapes

    def batches(
        self, dataloader: Iterable[Any], max_samples: int | None = None
    ) -> Iterator[tuple[list[np.ndarray], Any]]:
        """``(checked arrays, labels)`` per dataloader item; DataError on empty data."""
        for item in take_samples(dataloader, max_samples):
            inputs, labels = split_batch(item)
            yield self.feed(inputs), labels


def _to_float(detail: Mapping[str, Any], value: np.ndarray) -> np.ndarray:
    scale, zero = detail.get("quantization", (0.0, 0))
    if value.dtype.kind in "iu" and scale:
        return ((value.astype(np.float32) - zero) * scale).astype(np.float32)
    return np.array(value, copy=True)


def input_specs(interpreter: Any) -> list[InputSpec]:
    by_index: dict[int, str] = {}
    signatures = interpreter.get_signature_list()
    if len(signatures) == 1:
        runner_inputs = next(iter(signatures.values()))["inputs"]
        details = interpreter._get_full_signature_list()
        key = next(iter(details))
        by_index = {index: name for name, index in details[key]["inputs"].items()}
        if len(by_index) != len(runner_inputs):
            by_index = {}
    specs = []
    for detail in interpreter.get_input_details():
        signature = detail.get("shape_signature", detail["shape"])
        scale, zero = detail.get("quantization", (0.0, 0))
        specs.append(
            InputSpec(
                index=detail["index"],
                name=detail["name"],
                signature_name=by_index.get(detail["index"]),
                dtype=detail["dtype"],
                shape=tuple(None if int(d) < 0 else int(d) for d in signature),
                scale=float(scale),
                zero_point=int(zero),
            )
        )
    return specs
