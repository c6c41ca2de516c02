"""Proof that deploy is faithful: the exported QDQ model, run in ONNX Runtime, against the
simulated PyTorch model.

ONNX Runtime runs the QDQ graph node by node as ONNX defines it (graph optimizations off,
so its int8 kernel fusions do not change the arithmetic being checked; ``optimize=True``
measures those too). Two things are compared:

* every **model output**, end to end: the largest difference in units of that output's
  quantization step (its quantizer's scale, or for a float output the 8-bit step of its
  range). Float summation order differs between the two (a conv summed in another order
  can land a value on the other side of a rounding boundary), and backends that do not
  round ties to even (Vitis AI, TFLite) differ from ONNX Runtime on exact ties;
* every **quantizer in isolation**: ONNX Runtime's integer codes of a tensor against the
  simulated quantizer applied to ONNX Runtime's own float value of that tensor. This
  leaves out everything upstream, so with ONNX's rounding the codes must be identical:
  the QDQ nodes encode the simulated scale, zero point and integer range exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.fx.interpreter import Interpreter

from . import simulate
from .quantizers import FakeQuantizer


@contextlib.contextmanager
def rounding(sim: torch.nn.Module, mode: str | None) -> Iterator[None]:
    """Temporarily round every quantizer of ``sim`` with ``mode`` (``None``: unchanged)."""
    quantizers = list(simulate.quantizers(sim).values())
    saved = [q.spec for q in quantizers]
    try:
        if mode is not None:
            for q in quantizers:
                q.spec = dataclasses.replace(q.spec, rounding=mode)
        yield
    finally:
        for q, spec in zip(quantizers, saved, strict=True):
            q.spec = spec


class _Recorder(Interpreter):
    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[str, Any] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super().run_node(n)
        self.values[n.name] = result
        return result


def _activation_quantizers(sim: torch.fx.GraphModule) -> dict[str, tuple[str, FakeQuantizer]]:
    """quantizer node name -> (name of the tensor it quantizes, the quantizer)."""
    found = {}
    for node in sim.graph.nodes:
        if node.op != "call_module":
            continue
        module = sim.get_submodule(str(node.target))
        source = node.args[0]
        constant = isinstance(source, torch.fx.Node) and source.op == "get_attr"
        if isinstance(module, FakeQuantizer) and isinstance(source, torch.fx.Node) and not constant:
            found[node.name] = (source.name, module)
    return found


def compare(
    sim: torch.fx.GraphModule,
    onnx_model: Any,
    inputs: Sequence[np.ndarray],
    *,
    optimize: bool = False,
    round_mode: str | None = None,
) -> dict[str, Any]:
    """Run ``inputs`` (one array per batch, single-input models) through both models."""
    import onnx
    import onnxruntime as ort

    quantizers = _activation_quantizers(sim)
    probe = onnx.ModelProto()
    probe.CopyFrom(onnx_model)
    produced = {out for node in probe.graph.node for out in node.output}
    codes_of: dict[str, str] = {}
    for name, (tensor, _) in quantizers.items():
        codes = f"{tensor}_clipped" if f"{tensor}_clipped" in produced else f"{tensor}_quantized"
        if codes in produced:
            codes_of[name] = codes
            probe.graph.output.extend([onnx.ValueInfoProto(name=codes)])
            if tensor not in {o.name for o in probe.graph.output} | {
                i.name for i in probe.graph.input
            }:
                probe.graph.output.extend([onnx.ValueInfoProto(name=tensor)])
    options = ort.SessionOptions()
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        probe.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    input_name = session.get_inputs()[0].name
    n_outputs = len(onnx_model.graph.output)
    output_nodes = _output_nodes(sim)
    outputs: list[dict[str, float]] = [
        {"max_abs": 0.0, "step": float("inf"), "steps": 0.0} for _ in range(n_outputs)
    ]
    tensors: dict[str, dict[str, float]] = {}
    with rounding(sim, round_mode), torch.no_grad():
        for batch in inputs:
            results = session.run(None, {input_name: batch})
            recorder = _Recorder(sim)
            recorder.run(torch.from_numpy(batch))
            for index, node in enumerate(output_nodes):
                mine = recorder.values[node.name].numpy()
                theirs = results[index]
                step = _step(sim, node, mine)
                diff = float(np.abs(theirs - mine).max())
                entry = outputs[index]
                entry["max_abs"] = max(entry["max_abs"], diff)
                entry["step"] = min(entry["step"], step)
                entry["steps"] = max(entry["steps"], diff / step)
            by_name = dict(zip([o.name for o in session.get_outputs()], results, strict=True))
            by_name[input_name] = batch
            for name, ort_name in codes_of.items():
                tensor, quantizer = quantizers[name]
                mine_codes = quantizer.codes(torch.from_numpy(by_name[tensor])).numpy()
                delta = np.abs(by_name[ort_name].astype(np.float64) - mine_codes)
                entry = tensors.setdefault(
                    ort_name, {"max_code_diff": 0.0, "differing": 0.0, "n": 0.0}
                )
                entry["max_code_diff"] = max(entry["max_code_diff"], float(delta.max()))
                entry["differing"] += float((delta > 0).sum())
                entry["n"] += float(delta.size)
    for entry in tensors.values():
        entry["share_differing"] = entry.pop("differing") / max(entry.pop("n"), 1.0)
    return {
        "outputs": outputs,
        "tensors": tensors,
        "max_steps": max(o["steps"] for o in outputs),
        "max_code_diff": max((t["max_code_diff"] for t in tensors.values()), default=0.0),
    }


def _output_nodes(sim: torch.fx.GraphModule) -> list[torch.fx.Node]:
    output = next(n for n in sim.graph.nodes if n.op == "output")
    results = output.args[0]
    return list(results) if isinstance(results, list | tuple) else [results]


def _step(sim: torch.fx.GraphModule, node: torch.fx.Node, values: np.ndarray) -> float:
    """One quantization step of an output: its quantizer's scale, else 8 bits of its range."""
    if node.op == "call_module":
        module = sim.get_submodule(str(node.target))
        if isinstance(module, FakeQuantizer):
            return float(module.scale.max())
    return float(max(values.max() - values.min(), 1e-12) / 255.0)
