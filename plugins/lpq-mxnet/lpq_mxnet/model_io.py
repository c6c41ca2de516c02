"""User input -> prepared model: every model lpq-mxnet accepts, as one form (a symbol, its
parameters, its input names).

Accepted: a Gluon ``HybridBlock`` (traced with symbolic inputs, which neither hybridizes
nor otherwise changes it), an exported ``PREFIX-symbol.json`` + ``PREFIX-NNNN.params``
pair (named by either file or the prefix; see :mod:`lpq_mxnet.info` for the layout), and
the blocks lpq-mxnet itself returns. The latter carry a :class:`ModelInfo` (attribute
``lpq_mxnet``) with the graph they run, so inspection, saving and op reports read the
converted graph itself. Reading an export (with lpq-mxnet's metadata file, checked
against the params file) is here too; writing one is :mod:`lpq_mxnet.persist`.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lpq import DataError, LpqError, ModelError

from . import data
from . import graph as graphs
from .framework import mxnet, quiet
from .info import INFO_ATTR, find_export

#: The ``format`` of lpq-mxnet's metadata file (``PREFIX-lpq.json``).
META_FORMAT = "lpq-mxnet/1"


@dataclass
class ModelInfo:
    """What lpq-mxnet knows about a block it built: the graph it runs and how it came about.

    ``precision`` is ``fp32``, ``int8`` or ``bf16``; ``ops`` are the fp32 model's tunable
    ops; ``tune_cfg`` is the JSON of the tune_cfg that produced it (``None``: none).
    """

    symbol: Any
    input_names: list[str]
    precision: str = "fp32"
    ops: list[tuple[str, str]] = field(default_factory=list)
    tune_cfg: dict[str, Any] | None = None


@dataclass
class Graph:
    """A model as a symbol plus parameters (``arg:NAME`` / ``aux:NAME`` -> NDArray, the
    layout of MXNet's ``.params`` files) and its input names, in call order."""

    symbol: Any
    params: dict[str, Any]
    input_names: list[str]
    info: ModelInfo | None = None

    def json(self) -> dict[str, Any]:
        return graphs.graph_json(self.symbol)

    def fused_json(self) -> dict[str, Any]:
        """The graph as oneDNN partitions it for quantization (what quantize_net_v2 does
        first); a quantized graph is already partitioned."""
        if self.info is not None and self.info.precision == "int8":
            return self.json()
        return graphs.graph_json(self.symbol.get_backend_symbol(backend_name()))

    def tunable_ops(self) -> list[tuple[str, str]]:
        if self.info is not None and self.info.ops:
            return list(self.info.ops)
        return graphs.tunable_ops(self.fused_json())

    def block(
        self, info: ModelInfo | None = None, hybridize: bool = True, fuse: bool | None = None
    ) -> Any:
        """A new SymbolBlock running this graph on copies of the parameters, hybridized
        with ``static_alloc`` and ``static_shape`` (MXNet's fast inference path).

        An fp32 graph is also given oneDNN's fp32 fusions (``backend="MKLDNN"``: conv +
        BatchNorm + activation, ...), MXNet's fastest fp32 path: fp32 baselines are
        measured at their best (MobileNet v2 runs 6x faster fused than plainly
        hybridized here). ``fuse`` overrides that choice.
        """
        info = info or self.info or self.default_info()
        mx = mxnet()
        with quiet():
            block = mx.gluon.SymbolBlock(self.symbol, [mx.sym.var(n) for n in self.input_names])
            try:
                block.collect_params().load_dict(
                    {k: v.copy() for k, v in self.params.items()},
                    ctx=mx.cpu(),
                    ignore_extra=True,
                    cast_dtype=True,
                    dtype_source="saved",
                )
            except AssertionError as exc:  # how Gluon reports a parameter it cannot find
                raise ModelError(
                    f"the model's parameters do not match its graph: {str(exc)[:300]}",
                    hint="export the symbol and its parameters together (HybridBlock.export)",
                ) from exc
        if fuse is None:
            fuse = info.precision == "fp32"
        if hybridize:
            backend = fp32_backend_name() if fuse else None
            block.hybridize(static_alloc=True, static_shape=True, backend=backend)
        setattr(block, INFO_ATTR, info)
        return block

    def default_info(self) -> ModelInfo:
        return ModelInfo(self.symbol, list(self.input_names), "fp32", self.tunable_ops())


def fp32_backend_name() -> str:
    """oneDNN's fp32 partitioner: ``MKLDNN`` in MXNet 1.x (renamed ``ONEDNN`` in 2.0)."""
    return "MKLDNN" if str(mxnet().__version__).startswith("1.") else "ONEDNN"


def backend_name() -> str:
    """oneDNN's quantization partitioner (``MKLDNN_QUANTIZE`` in MXNet 1.x)."""
    return f"{fp32_backend_name()}_QUANTIZE"


def info_of(model: Any) -> ModelInfo | None:
    info = getattr(model, INFO_ATTR, None)
    return info if isinstance(info, ModelInfo) else None


def input_names(count: int) -> list[str]:
    """Gluon's names for a block's inputs: ``data``, or ``data0``, ``data1``, ..."""
    return ["data"] if count == 1 else [f"data{i}" for i in range(count)]


def to_graph(model: Any, example: Any = None) -> Graph:
    """Any accepted model as a :class:`Graph`.

    :param example: one batch of inputs, when there is data: it tells how many inputs a
        HybridBlock takes (else its ``hybrid_forward`` signature does) and completes the
        deferred initialization of a block that never ran.
    :raises lpq.ModelError: for anything else, naming what was given and what to pass.
    """
    if isinstance(model, str | Path):
        return read_export(model)
    mx = mxnet()
    info = info_of(model)
    if info is not None:
        return Graph(info.symbol, block_params(model, info.symbol), list(info.input_names), info)
    if isinstance(model, mx.gluon.SymbolBlock):
        names = [s.name for s in model._cached_graph[0]]  # the symbol inputs it was built on
        symbol = model(*[mx.sym.var(n) for n in names])
        return Graph(symbol, block_params(model, symbol), names)
    if isinstance(model, mx.gluon.HybridBlock):
        return _trace(model, example)
    if isinstance(model, mx.gluon.Block):
        raise ModelError(
            f"{type(model).__name__} ({model.name}) is a gluon.Block, which MXNet cannot "
            "export to a graph",
            hint="derive it from gluon.HybridBlock (hybrid_forward) so it can be quantized",
        )
    raise ModelError(
        f"the MXNet adaptor takes a Gluon HybridBlock or an exported model, not a "
        f"{type(model).__module__}.{type(model).__name__}",
        hint="pass a gluon.HybridBlock, or PREFIX-symbol.json / PREFIX-NNNN.params from "
        "HybridBlock.export(PREFIX)",
    )


def fp32_graph(model: Any, example: Any = None) -> Graph:
    """``model`` as a graph (see :func:`to_graph`), refusing one already quantized."""
    graph = to_graph(model, example)
    if (graph.info is not None and graph.info.precision != "fp32") or graphs.is_quantized(
        graph.json()
    ):
        raise ModelError(
            "the model is already quantized (or converted to bf16)",
            hint="pass the fp32 model: lpq quantizes from fp32",
        )
    return graph


def block_params(block: Any, symbol: Any) -> dict[str, Any]:
    """The parameters ``symbol`` needs, from ``block``, in ``.params`` layout."""
    aux = set(symbol.list_auxiliary_states())
    wanted = set(symbol.list_arguments()) | aux
    params = {}
    for name, param in block.collect_params().items():
        if name not in wanted:
            continue
        try:
            value = param.data()
        except Exception as exc:  # DeferredInitializationError, RuntimeError: not initialized
            raise ModelError(
                f"parameter {name} of the Gluon block has no value yet ({exc})",
                hint="initialize the block (net.initialize() or net.load_parameters(...)) "
                "and run it once on an input",
            ) from exc
        params[("aux:" if name in aux else "arg:") + name] = value
    return params


def _signature_inputs(block: Any) -> int:
    """Positional inputs of ``hybrid_forward(self, F, x, ...)``, at least one."""
    try:
        params = list(inspect.signature(block.hybrid_forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return 1
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    return max(1, len(positional))


def _trace(block: Any, example: Any) -> Graph:
    """Build the block's graph by calling it on symbols (what ``hybridize`` does
    internally, without changing the block); a layer that cannot take symbolic inputs is
    reported by name."""
    mx = mxnet()
    count = data.num_inputs(example) if example is not None else _signature_inputs(block)
    names = input_names(count)
    with _layer_stack(block) as stack:
        try:
            out = block(*[mx.sym.var(n) for n in names])
        except LpqError:
            raise
        except Exception as exc:
            if isinstance(exc, TypeError) and len(stack) == 1 and "positional" in str(exc):
                raise DataError(
                    f"the batch holds {count} input(s), which {stack[0]} does not take ({exc})",
                    hint="pass one array per input of the block's hybrid_forward",
                ) from exc
            layer = stack[-1] if stack else f"{type(block).__name__} ({block.name})"
            raise ModelError(
                f"the Gluon block cannot be hybridized: layer {layer} fails on symbolic "
                f"inputs ({type(exc).__name__}: {exc})",
                hint="write that layer's hybrid_forward with F.* operators only (no NDArray "
                "methods such as asnumpy/asscalar, no Python branches on tensor values), "
                f"and check the block takes {count} input(s)",
            ) from exc
    if isinstance(out, list | tuple):
        out = mx.sym.Group(list(out))
    if not isinstance(out, mx.sym.Symbol):
        raise ModelError(
            f"{type(block).__name__} returned {type(out).__name__} for symbolic inputs",
            hint="hybrid_forward must return F.* results",
        )
    extra = [n for n in out.list_inputs() if n not in names and n not in _param_names(block)]
    if extra:
        raise DataError(
            f"the block's graph has inputs {extra} besides {names}",
            hint="pass one array per model input (a tuple or a dict per batch)",
        )
    try:
        params = block_params(block, out)
    except ModelError as uninitialized:
        if example is None:
            raise
        # Deferred initialization (shapes unknown until the first call): run it once.
        try:
            block(*[data.to_nd(v) for v in data.ordered(example, names)])
        except Exception:
            raise uninitialized from None
        params = block_params(block, out)
    return Graph(out, params, names)


def _param_names(block: Any) -> set[str]:
    return set(block.collect_params().keys())


@contextmanager
def _layer_stack(block: Any) -> Iterator[list[str]]:
    """Track which (sub-)block is running, via forward hooks removed afterwards."""
    stack: list[str] = []
    handles: list[Any] = []

    def push(layer: Any, _args: Any) -> None:
        stack.append(f"{type(layer).__name__} ({layer.name})")

    def pop(_layer: Any, _args: Any, _out: Any) -> None:
        if stack:
            stack.pop()

    def attach(layer: Any) -> None:
        handles.append(layer.register_forward_pre_hook(push))
        handles.append(layer.register_forward_hook(pop))

    block.apply(attach)
    try:
        yield stack
    finally:
        for handle in handles:
            handle.detach()


def read_export(path: str | Path) -> Graph:
    """An export on disk as a :class:`Graph` (with its lpq metadata when present)."""
    mx = mxnet()
    found = find_export(path)
    if found is None:
        raise ModelError(
            f"{path} is not an MXNet model: no PREFIX-symbol.json there",
            hint="pass PREFIX-symbol.json, PREFIX-NNNN.params or PREFIX, as written by "
            "HybridBlock.export(PREFIX) or lpq",
        )
    if found.params is None:
        raise ModelError(
            f"{found.symbol} has no parameter file beside it",
            hint=f"put {found.prefix.name}-0000.params (from HybridBlock.export) next to it",
        )
    meta = _read_meta(found.meta, found.params)
    try:
        symbol = mx.sym.load(str(found.symbol))
        params = mx.nd.load(str(found.params))
    except mx.base.MXNetError as exc:
        raise ModelError(
            f"cannot read the MXNet model {found.symbol}: {str(exc).splitlines()[0][:300]}",
            hint="re-export it with HybridBlock.export",
        ) from exc
    if not isinstance(params, dict) or not all(k[:4] in ("arg:", "aux:") for k in params):
        raise ModelError(
            f"{found.params} does not hold arg:/aux: parameters",
            hint="use the .params file HybridBlock.export wrote (not save_parameters)",
        )
    if meta is not None:
        names = list(meta["inputs"])
    else:
        known = {k[4:] for k in params}
        names = [n for n in symbol.list_inputs() if n not in known]
    graph = Graph(symbol, params, names)
    if meta is not None:
        ops = [(str(name), str(op_type)) for name, op_type in meta["ops"]]
        graph.info = ModelInfo(symbol, names, meta["precision"], ops, meta.get("tune_cfg"))
    elif graphs.is_quantized(graph.json()):  # someone's quantized export: its own fused graph
        graph.info = ModelInfo(symbol, names, "int8", graphs.tunable_ops(graph.json()))
    return graph


def _read_meta(meta: Path, params: Path) -> dict[str, Any] | None:
    if not meta.is_file():
        return None
    try:
        content: dict[str, Any] = json.loads(meta.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read {meta}: {exc}", hint="save the model again") from exc
    if content.get("format") != META_FORMAT:
        raise ModelError(
            f"{meta} is not an lpq-mxnet file (format {content.get('format')!r})",
            hint="save the model again with this version of lpq-mxnet",
        )
    digest = hashlib.sha256(params.read_bytes()).hexdigest()
    if digest != content.get("params_sha256"):
        raise ModelError(
            f"{params} does not belong to {meta} (an interrupted save, or files from "
            "two different saves)",
            hint="save the model again",
        )
    return content
