"""Groups of ops a strategy switches together: decoder layers and projection kinds.

Trials on an LLM are expensive (each quantizes the whole model), so a strategy cannot
probe its 200 MatMuls one by one. Exporters name ops by module path, and the path says
where an op sits: the onnxruntime-genai builder writes ``/model/layers.3/attn/qkv_proj/
MatMul``, optimum ``/model/layers.3/self_attn/q_proj/MatMul``, torch module names read
``model.layers.3.mlp.down_proj``. :func:`op_place` splits such a name into the *layer*
(``model/layers`` and 3) and the *kind* (``attn/qkv_proj``: the same in every layer);
the kind's first segment is its *family* (``attn``, ``mlp``). Names without a layer
index (``/lm_head/MatMul``, ``MatMul_12``) have no place: each is a group of its own.

:func:`split_groups` cuts a set of ops into a few groups at the coarsest level that
separates them (families, then kinds, then blocks of consecutive layers, then runs of
consecutive ops in graph order): a strategy probes the groups of one level in one
batch, then splits the groups that matter again.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .tune_config import OpKey

#: Path separators in op names: ONNX node names use ``/``, torch module names ``.``.
_SEPARATORS = re.compile(r"[/.]")
#: A segment that is a layer index by itself (``layers.3``) or ends in one (``h3``, ``l0``,
#: ``block_3``).
_INDEX = re.compile(r"\d+")
_NAMED_INDEX = re.compile(r"([A-Za-z]+)_?(\d+)")
#: The op's own node name at the end of an ONNX path (``MatMul``, ``MatMul_1``, ``Gemm``).
_NODE = re.compile(r"[A-Z][A-Za-z0-9]*(_\d+)?")


@dataclass(frozen=True)
class OpPlace:
    """Where an op sits in a stack of repeated layers."""

    #: What holds the layers (``model/layers``): encoder and decoder stacks differ.
    stack: str
    layer: int
    #: The op's path inside its layer, ``/``-separated (``mlp/down_proj``).
    kind: str

    @property
    def family(self) -> str:
        """The kind's first segment (``mlp`` of ``mlp/down_proj``), or the kind."""
        return self.kind.split("/", 1)[0]


def op_place(name: str) -> OpPlace | None:
    """The layer and kind of op ``name``, or ``None`` if its name shows no layer index.

    The first index in the path is the layer: a numeric segment after a named one
    (``layers.3``, ``h.0``) or a segment of letters and digits (``layer3``, ``l0``). The
    rest of the path, less a trailing ONNX node name (``MatMul``, ``MatMul_1``), is the
    kind; a name with nothing after the index has no place.
    """
    segments = [s for s in _SEPARATORS.split(name) if s]
    for i, segment in enumerate(segments):
        if _INDEX.fullmatch(segment) and i > 0:
            stack, layer = "/".join(segments[:i]), int(segment)
        elif named := _NAMED_INDEX.fullmatch(segment):
            stack = "/".join([*segments[:i], named.group(1)])
            layer = int(named.group(2))
        else:
            continue
        rest = segments[i + 1 :]
        if len(rest) > 1 and _NODE.fullmatch(rest[-1]):
            rest = rest[:-1]
        if not rest:
            return None
        return OpPlace(stack, layer, "/".join(rest))
    return None


#: A group: a label for reports and its ops, in graph order.
Group = tuple[str, list[OpKey]]


def split_groups(keys: Sequence[OpKey], parts: int = 4) -> list[Group]:
    """``keys`` cut at the coarsest level that separates them into 2..``parts`` groups.

    Levels, coarsest first: family (``attn`` / ``mlp``), kind (``mlp/down_proj``),
    ``parts`` blocks of consecutive layers, ``parts`` runs of consecutive ops in graph
    order (a single op at the end). Ops without a place form groups of their own beside
    the placed ones at every level. A single op gives ``[]``: nothing to split.
    """
    keys = list(keys)
    if len(keys) <= 1:
        return []
    places = {key: op_place(key[0]) for key in keys}
    placed = [key for key in keys if places[key] is not None]
    loose: list[Group] = [(key[0], [key]) for key in keys if places[key] is None]
    levels: list[Callable[[], list[Group]]] = [
        lambda: _by(placed, lambda p: f"{p.stack}/*/{p.family}", places),
        lambda: _by(placed, lambda p: f"{p.stack}/*/{p.kind}", places),
        lambda: _layer_blocks(placed, places, parts),
    ]
    if placed:
        for level in levels:
            groups = level() + loose
            if 2 <= len(groups) <= parts:
                return groups
    return _runs(keys, parts)


def _by(
    keys: list[OpKey],
    label: Callable[[OpPlace], str],
    places: dict[OpKey, OpPlace | None],
) -> list[Group]:
    groups: dict[str, list[OpKey]] = {}
    for key in keys:
        place = places[key]
        assert place is not None
        groups.setdefault(label(place), []).append(key)
    return list(groups.items())


def _layer_blocks(
    keys: list[OpKey], places: dict[OpKey, OpPlace | None], parts: int
) -> list[Group]:
    """The ops of ``parts`` blocks of consecutive layers (per stack), in layer order."""
    layers = sorted({(p.stack, p.layer) for key in keys if (p := places[key]) is not None})
    if len(layers) < 2:
        return []
    size = -(-len(layers) // parts)  # ceil: at most ``parts`` blocks
    block_of = {layer: i // size for i, layer in enumerate(layers)}
    groups: dict[int, list[OpKey]] = {}
    for key in keys:
        place = places[key]
        assert place is not None
        groups.setdefault(block_of[(place.stack, place.layer)], []).append(key)
    out = []
    for block, members in sorted(groups.items()):
        first, last = layers[block * size], layers[min((block + 1) * size, len(layers)) - 1]
        span = f"{first[1]}" if first == last else f"{first[1]}-{last[1]}"
        kinds = {p.kind for key in members if (p := places[key]) is not None}
        families = {kind.split("/", 1)[0] for kind in kinds}
        what = kinds.pop() if len(kinds) == 1 else families.pop() if len(families) == 1 else ""
        out.append((f"{first[0]}.{span}" + (f"/{what}" if what else ""), members))
    return out


def _runs(keys: list[OpKey], parts: int) -> list[Group]:
    """``keys`` in at most ``parts`` runs of consecutive ops (one op each if few)."""
    size = -(-len(keys) // parts)
    runs = [keys[i : i + size] for i in range(0, len(keys), size)]
    return [(run[0][0] if len(run) == 1 else f"{run[0][0]}..{run[-1][0]}", run) for run in runs]
