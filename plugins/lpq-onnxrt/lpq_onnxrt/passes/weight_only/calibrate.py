"""Calibration for the weight-only pass: what each MatMul input must be summarised into
(:func:`needs`), and the run that summarises it one decoder layer at a time
(:class:`LayerwiseCalibration`), handing each layer to the quantizer as soon as its
statistics are complete and dropping them once no later layer reads them.

At the stage that makes ``lm_head``'s input, the embedding streams (:mod:`.embedding_choice`)
are compared with the float one: top-1 agreement and KL of their logits, computed in
numpy on a few hundred rows. Within a tuning run the statistics and the comparison are
written to the run's files by the first trial and read back by the others
(:class:`.reuse.Calibration`).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import weights
from ...data import iter_batches
from . import reuse, source
from .activations import Need, TensorStats, add
from .embedding_choice import REFERENCE
from .plan import LayerChoice, compare_logits
from .stages import Stage, StagedRun

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

#: MatMuls of attention (q/k/v and output projections), by node name: GPTQ weighs each
#: window's first token (the attention sink) as the rest of the window in their Hessians.
#: On SmolLM2-135M (int4 block 32, all MatMuls GPTQ) that took the logits' KL to fp32
#: from 0.264 to 0.167 (RTN: 0.334); weighting the MLP inputs too gave 0.226.
ATTENTION = re.compile(r"attn|attention|[qkvo]_proj|qkv", re.IGNORECASE)
#: Rows of lm_head's input kept to measure an int8 head (``lm_head=auto``).
HEAD_ROWS = 512
#: Token positions on which the int4/int8 embeddings' logits are compared with float.
COMPARE_ROWS = 512


def needs(
    model: onnx.ModelProto,
    choices: Mapping[str, LayerChoice],
    options: Mapping[str, Any],
    head_input: str | None = None,
) -> dict[str, Need]:
    """What each MatMul input tensor must be summarised into, merged over its readers
    (and ``lm_head``'s input rows, when its precision is to be measured)."""
    rows = int(options.get("awq_tokens", 512))
    found: dict[str, Need] = {}
    if head_input is not None:
        width = next(
            source.rows_of(model, n)
            for n in model.graph.node
            if n.input[:1] == [head_input] and n.op_type == "MatMul"
        )
        found[head_input] = Need(width, sample_rows=HEAD_ROWS)
    for node in model.graph.node:
        choice = choices.get(node.name)
        if choice is None or choice.algorithm == "rtn":
            continue
        k = source.rows_of(model, node)
        old = found.get(node.input[0], Need(k))
        if node.input[0] == head_input:
            old = Need(k, sample_rows=max(HEAD_ROWS, old.sample_rows))
        gptq = choice.algorithm == "gptq"
        found[node.input[0]] = Need(
            k,
            hessian=old.hessian or gptq,
            sample_rows=max(old.sample_rows, rows if choice.algorithm == "awq" else 0),
            first_token=old.first_token or (gptq and bool(ATTENTION.search(node.name))),
        )
    return found


class LayerwiseCalibration:
    """The calibration run of one pass over ``stages`` (see the module docstring).

    ``stats`` holds the statistics of the tensors some stage not yet quantized reads
    (and of ``keep``, to the end); ``compared`` the embedding streams' comparison."""

    def __init__(
        self,
        src: onnx.ModelProto,
        calib: Iterable[Any],
        choices: Mapping[str, LayerChoice],
        head: str | None,
        needs: Mapping[str, Need],
        keep: set[str],
        streams: Mapping[str, Any],
        formats: Mapping[int, tuple[int, bool]],
    ) -> None:
        self.src, self.choices, self.head, self.needs, self.keep = src, choices, head, needs, keep
        self.streams = dict(streams)
        self.feeds = [feed for feed, _ in iter_batches(src, calib, None)]
        self.stats: dict[str, TensorStats] = {}
        self.compared: dict[str, dict[str, float]] = {}
        self.files = reuse.Calibration.of(
            src,
            self.feeds,
            needs,
            list(self.streams or [REFERENCE]),
            [COMPARE_ROWS, sorted(formats.items())],
        )

    def run(self, stages: list[Stage]) -> Iterator[tuple[Stage, float]]:
        """Yield each stage with the seconds its calibration took, once the statistics
        of the tensors it reads are in :attr:`stats`; after the caller has quantized it,
        drop what no later stage reads."""
        files = self.files
        replay = files is not None and files.complete
        runner = None
        if files is not None and replay:  # an earlier trial of this run calibrated so
            self.compared = files.load_compared()
            log.info("weight-only calibration: read from this run's files (%s)", files.dir)
        else:
            runner = StagedRun(
                self.src,
                self.feeds,
                stages,
                self.streams or None,
                other_batches=_batches_for(self.feeds, COMPARE_ROWS),
            )
        stage_of = {node.name: i for i, stage in enumerate(stages) for node in stage.nodes}
        capture: dict[str, int] = {}  # tensor -> the stage whose run summarises it
        readers: dict[str, list[str]] = {}
        for node in self.src.graph.node:
            if (
                node.input
                and node.input[0] in self.needs
                and (node.name in self.choices or node.name == self.head)
            ):
                index = stage_of[node.name]
                capture[node.input[0]] = min(capture.get(node.input[0], index), index)
                readers.setdefault(node.input[0], []).append(node.name)
        compare = self._head_input_stage(stages) if len(self.streams) > 1 else None
        for index, stage in enumerate(stages):
            start = time.perf_counter()
            wanted = [t for t, i in capture.items() if i == index]
            if compare is not None and compare[1] == index:
                wanted.append(compare[0])
            mine = [t for t in wanted if t in self.needs]
            if runner is None and files is not None:
                for tensor in mine:
                    if tensor not in self.stats:
                        self.stats[tensor] = files.load(tensor)
            else:
                assert runner is not None
                for tensor in mine:
                    if tensor not in self.stats:
                        self.stats[tensor] = TensorStats.start(self.needs[tensor])
                self._run_stage(runner, index, wanted, compare)
                if files is not None:
                    for tensor in mine:
                        files.save(tensor, self.stats[tensor])
            yield stage, time.perf_counter() - start
            finished = {name for s in stages[: index + 1] for name in s.names}
            for tensor in list(self.stats):
                if tensor not in self.keep and all(r in finished for r in readers.get(tensor, [])):
                    del self.stats[tensor]
            weights.release_free_memory()
        if files is not None and not replay:
            files.save_compared(self.compared)
            files.finish()

    def _head_input_stage(self, stages: list[Stage]) -> tuple[str, int] | None:
        """lm_head's input tensor and the stage that makes it: where the embedding
        streams are compared."""
        node = next((n for n in self.src.graph.node if n.name == self.head), None)
        if node is None:
            return None
        for index, stage in enumerate(stages):
            if node.input[0] in {out for n in stage.nodes for out in n.output}:
                return node.input[0], index
        return None

    def _run_stage(
        self, runner: StagedRun, index: int, wanted: list[str], compare: tuple[str, int] | None
    ) -> None:
        """Run one stage: the reference stream feeds the statistics; at the stage that
        makes lm_head's input, every stream's logits are compared with the reference's."""
        at_head = compare is not None and compare[1] == index
        head_weight: np.ndarray | None = None
        pending: dict[str, np.ndarray] = {}
        for _, stream, values in runner.run(index, wanted):
            if stream == REFERENCE:
                for tensor, value in values.items():
                    if tensor in self.needs:
                        add(self.stats[tensor], self.needs[tensor], value)
            if not at_head or compare is None:
                continue
            pending[stream] = values[compare[0]]
            if len(pending) < len(runner.streams):
                continue
            if head_weight is None:
                node = next(n for n in self.src.graph.node if n.name == self.head)
                head_weight = source.weight(self.src, node)
            reference = pending.pop(REFERENCE)
            found = {name: self.compared.setdefault(name, {}) for name in pending}
            _accumulate(found, reference, pending, head_weight)
            pending = {}


def _accumulate(
    found: Mapping[str, dict[str, float]],
    reference: np.ndarray,
    hidden: Mapping[str, np.ndarray],
    head: np.ndarray,
) -> None:
    """Add top-1 agreement and KL of each stream's logits ``hidden[name] @ head`` against
    ``reference @ head`` to ``found[name]``, 64 rows at a time (a whole batch of LLM
    logits is 100 MB; the reference's are computed once for all streams)."""
    ref = reference.reshape(-1, reference.shape[-1])
    flat = {name: value.reshape(-1, value.shape[-1]) for name, value in hidden.items()}
    for start in range(0, len(ref), 64):
        expected = ref[start : start + 64] @ head
        for name, got in flat.items():
            compare_logits(found[name], expected, got[start : start + 64] @ head)


def _batches_for(feeds: list[dict[str, np.ndarray]], rows: int) -> int:
    """How many leading batches hold at least ``rows`` tokens (all when fewer)."""
    total = 0
    for index, feed in enumerate(feeds, 1):
        ids = next(iter(feed.values()))
        total += int(np.prod(ids.shape[:2])) if ids.ndim >= 2 else int(ids.size)
        if total >= rows:
            return index
    return len(feeds)
