"""A decoder run one layer at a time over the calibration windows.

GPTQ, AWQ and the scale search need the inputs of the MatMuls they quantize. Running the
whole model with those inputs as extra outputs holds a second copy of every weight in
the session (540 MB for SmolLM2-135M, on top of the model being quantized) and, for an
LLM, more activations than memory allows. So the graph is cut into *stages*, found from
node names in graph order (``/model/layers.3/...``, ``/transformer/h.3/...``, ``l3.q``):
the nodes before the first decoder layer, one stage per layer, and the nodes after the
last one (final norm, ``lm_head``). Each stage becomes a small model with only its own
weights (handed to ONNX Runtime as arrays, one copy), runs every calibration batch from
the tensors earlier stages left (hidden state, residual, attention-mask helpers), and is
dropped before the next one is built. Between stages only the tensors a later stage
reads are kept, per batch.

Any contiguous cut of a topological order computes the same function as the whole
graph, so the statistics are those of the fp32 model (up to ORT fusing fewer kernels
across a cut). A ``Gather`` over a constant 2-D table (the token embedding) runs in
numpy as a stage of its own, so that other *streams* of the same batches can start from
a different table (a quantized embedding, to measure what it costs downstream).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from lpq import ModelError

from ... import weights
from ...session import build_session_options, providers

if TYPE_CHECKING:
    import onnx
    import onnxruntime

#: A decoder layer's index in a node name: ``layers.3``, ``layer_3``, ``h.3``, ``blocks.3``,
#: ``l3``, each after the start or a ``/ . _`` and followed by one (or the end).
LAYER = re.compile(r"(?:^|[/._])(?:layers|layer|blocks|block|h|l)[._]?(\d+)(?=[/._]|$)")
#: A stream's embedding rows for some token ids (None: the table of the model itself).
RowsFn = Callable[[np.ndarray], np.ndarray]


def layer_of(name: str) -> int | None:
    """The decoder layer a node name says it belongs to, or None."""
    found = LAYER.search(name)
    return int(found.group(1)) if found else None


@dataclass
class Stage:
    """Consecutive nodes of the graph run as one small model (or a numpy Gather)."""

    label: str
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    #: a Gather over a constant table, run in numpy (see the module docstring)
    gather: bool = False

    @property
    def names(self) -> set[str]:
        return {node.name for node in self.nodes}


def _is_table_gather(node: onnx.NodeProto, inits: Mapping[str, onnx.TensorProto]) -> bool:
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    table = inits.get(node.input[0]) if node.input else None
    return node.op_type == "Gather" and axis == 0 and table is not None and len(table.dims) == 2


def _checkable(model: onnx.ModelProto) -> bool:
    """Graph order is topological and no node holds a sub-graph (which may read outer
    tensors no stage would carry)."""
    from onnx import AttributeProto

    known = {value.name for value in model.graph.input}
    known |= {init.name for init in model.graph.initializer} | {""}
    for node in model.graph.node:
        if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute):
            return False
        if any(name not in known for name in node.input):
            return False
        known.update(node.output)
    return True


def plan_stages(model: onnx.ModelProto) -> list[Stage] | None:
    """The stages of ``model`` (see the module docstring), or None when it cannot be cut
    layer by layer: fewer than two layers named, nodes out of topological order, a
    control-flow node, or layers so interleaved that stages would not follow layers."""
    if not _checkable(model):
        return None
    nodes = list(model.graph.node)
    keys = [layer_of(node.name) for node in nodes]
    layered = [index for index, key in enumerate(keys) if key is not None]
    layers = {key for key in keys if key is not None}
    if len(layers) < 2:
        return None
    inits = {init.name: init for init in model.graph.initializer}
    first, last = layered[0], layered[-1]
    stages: list[Stage] = []
    current: str | None = None
    for index, node in enumerate(nodes):
        if _is_table_gather(node, inits):
            stages.append(Stage("embedding", [node], gather=True))
            continue
        key = keys[index]
        if index < first:
            label = "prefix"
        elif index > last:
            label = "suffix"
        else:
            label = f"layer {key}" if key is not None else (current or "prefix")
        if not stages or stages[-1].gather or label != current:
            stages.append(Stage(label))
        stages[-1].nodes.append(node)
        current = label
    if len(stages) > 2 * len(layers) + 4:
        return None
    return stages


def _needed(nodes: Sequence[onnx.NodeProto], outputs: Iterable[str]) -> list[onnx.NodeProto]:
    """The nodes (in order) that ``outputs`` depend on: ORT runs every node of a model,
    and the last stage's ``lm_head`` (49152 wide on SmolLM2) is not needed to read its
    input."""
    needed = set(outputs)
    kept = []
    for node in reversed(nodes):
        if any(out in needed for out in node.output):
            kept.append(node)
            needed.update(name for name in node.input if name)
    return kept[::-1]


class StagedRun:
    """Calibration batches carried through ``stages`` of ``model``, one stage at a time.

    ``streams`` maps a stream name to the embedding rows it starts from (None: the
    model's own table). The first stream is the reference and runs every batch; the
    others run the first ``other_batches`` (all when None). ``model`` is read, never
    changed.
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        feeds: Sequence[Mapping[str, np.ndarray]],
        stages: Sequence[Stage],
        streams: Mapping[str, RowsFn | None] | None = None,
        options: Mapping[str, Any] | None = None,
        other_batches: int | None = None,
    ) -> None:
        self.model, self.feeds, self.stages = model, list(feeds), list(stages)
        self.streams: dict[str, RowsFn | None] = dict(streams or {"fp32": None})
        self.reference = next(iter(self.streams))
        self.other_batches = len(self.feeds) if other_batches is None else other_batches
        self.options = dict(options or {})
        self.inits = {init.name: init for init in model.graph.initializer}
        self.last_use: dict[str, int] = {}
        for index, stage in enumerate(self.stages):
            for node in stage.nodes:
                for name in node.input:
                    self.last_use[name] = index
        self.values: dict[str, list[dict[str, np.ndarray]]] = {
            name: [{} for _ in self.feeds] for name in self.streams
        }

    def stage_of(self) -> dict[str, int]:
        """Node name -> index of its stage."""
        return {node.name: i for i, stage in enumerate(self.stages) for node in stage.nodes}

    def run(
        self, index: int, wanted: Iterable[str] = ()
    ) -> Iterator[tuple[int, str, dict[str, np.ndarray]]]:
        """Run stage ``index`` on every batch (outer) and stream (inner), yielding
        ``(batch, stream, {name: value})`` for the ``wanted`` tensors the stage reads or
        writes; afterwards only tensors later stages read are kept."""
        stage = self.stages[index]
        wanted = list(dict.fromkeys(wanted))
        produced = [out for node in stage.nodes for out in node.output if out]
        made = set(produced)
        outputs = list(
            dict.fromkeys(
                [name for name in produced if self.last_use.get(name, -1) > index]
                + [name for name in wanted if name in made]
            )
        )
        nodes = _needed(stage.nodes, outputs)
        inner = {out for node in nodes for out in node.output}
        inputs = list(
            dict.fromkeys(
                name
                for node in nodes
                for name in node.input
                if name and name not in inner and name not in self.inits
            )
        )
        inputs += [name for name in wanted if name not in made and name not in inputs]
        read = {name for node in nodes for name in node.input}
        session: onnxruntime.InferenceSession | None = None
        table: np.ndarray | None = None
        for batch, given in enumerate(self.feeds):
            for stream, rows in self.streams.items():
                if stream != self.reference and batch >= self.other_batches:
                    continue
                state = self.values[stream][batch]
                feed = {name: self._value(name, state, given, stage) for name in inputs}
                if stage.gather:
                    ids = feed[stage.nodes[0].input[1]]
                    if rows is None:
                        if table is None:
                            table = weights.array(self.inits[stage.nodes[0].input[0]])
                        got = np.take(table, ids, axis=0)
                    else:
                        got = rows(ids)
                    result = {stage.nodes[0].output[0]: got}
                elif outputs:
                    if session is None:
                        session = self._session(stage, nodes, inputs, outputs, feed)
                    given_inputs = {name: feed[name] for name in inputs if name in read}
                    result = dict(zip(outputs, session.run(outputs, given_inputs)))
                else:
                    result = {}
                yield batch, stream, {n: result[n] if n in result else feed[n] for n in wanted}
                state.update(result)
                for name in [n for n in state if self.last_use.get(n, -1) <= index]:
                    del state[name]
        del session, table

    def _value(
        self, name: str, state: Mapping[str, np.ndarray], given: Mapping[str, Any], stage: Stage
    ) -> np.ndarray:
        if name in state:
            return state[name]
        if name in given:
            return np.asarray(given[name])
        raise ModelError(
            f"stage {stage.label!r} reads {name!r}, which neither the data nor an earlier "
            "stage provides",
            hint="feed every graph input (for a decoder: input_ids; lpq fills the rest)",
        )

    def _session(
        self,
        stage: Stage,
        nodes: Sequence[onnx.NodeProto],
        inputs: Sequence[str],
        outputs: Sequence[str],
        feed: Mapping[str, np.ndarray],
    ) -> onnxruntime.InferenceSession:
        """The stage as a model holding only its own weights, the large ones as arrays."""
        import onnx

        sub = weights.bare(self.model)
        sub.graph.name = "lpq_stage"
        sub.graph.node.extend(nodes)
        read = {name for node in nodes for name in node.input}
        sub.graph.input.extend(
            onnx.helper.make_tensor_value_info(
                name, onnx.helper.np_dtype_to_tensor_dtype(feed[name].dtype), None
            )
            for name in inputs
            if name in read
        )
        sub.graph.output.extend(onnx.ValueInfoProto(name=name) for name in outputs)
        blobs: weights.Blobs = {}
        used = dict.fromkeys(n for node in nodes for n in node.input if n in self.inits)
        for name in used:
            init = self.inits[name]
            if weights.nbytes(init) >= weights.MIN_BYTES:
                sub.graph.initializer.append(weights.header(init))
                blobs[name] = weights.array(init)
            else:
                sub.graph.initializer.append(init)
        try:
            return weights.session(
                sub, blobs, build_session_options(self.options), providers(self.options)
            )
        except Exception as exc:
            raise ModelError(
                f"ONNX Runtime cannot run stage {stage.label!r} of the model for weight-only "
                f"calibration ({type(exc).__name__}: {exc})",
                hint="check the model with onnx.checker.check_model",
            ) from None
