"""AWQ: the MatMuls that read one tensor share one per-channel scale ``s``, searched on
their concatenated weights and folded into the normalization that produces the tensor
(:mod:`.awq_fold`); a group with nowhere safe to fold ``s`` falls back to RTN."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from lpq.weight_only import BlockQuantized, awq_search

from . import source
from .activations import TensorStats
from .awq_fold import FoldSite, apply_fold, fold_site
from .matmuls import split
from .output import Output
from .plan import LayerChoice

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)


def awq_groups(
    model: onnx.ModelProto, choices: Mapping[str, LayerChoice]
) -> dict[str, dict[str, tuple[object, ...]]]:
    """AWQ MatMuls grouped by input tensor, each with its (bits, block, scheme) key."""
    groups: dict[str, dict[str, tuple[object, ...]]] = {}
    for node in model.graph.node:
        choice = choices.get(node.name)
        if choice is not None and choice.algorithm == "awq":
            key = (choice.bits, choice.block_size, choice.symmetric)
            groups.setdefault(node.input[0], {})[node.name] = key
    return groups


class Awq:
    """The foldable AWQ groups of one pass, searched and folded as their layer comes.

    Finding the groups (on the untouched graph) switches the MatMuls of unfoldable groups
    to RTN in ``choices``, with the reason in ``report["awq_skipped"]``."""

    def __init__(
        self,
        src: onnx.ModelProto,
        choices: dict[str, LayerChoice],
        options: Mapping[str, Any],
        report: dict[str, Any],
    ) -> None:
        self.src, self.choices, self.options, self.report = src, choices, options, report
        self.nodes = {node.name: node for node in src.graph.node}
        self.sites: dict[str, FoldSite] = {}
        for tensor, members in awq_groups(src, choices).items():
            site = fold_site(src, tensor, members, set(choices))
            if isinstance(site, str):
                for name in members:
                    report["awq_skipped"][name] = site
                    choices[name] = replace(choices[name], algorithm="rtn")
                    log.info("AWQ skipped for %s: %s; using RTN", name, site)
                continue
            self.sites[tensor] = site

    def layer(
        self, names: list[str], stats: Mapping[str, TensorStats], out: Output
    ) -> dict[str, BlockQuantized]:
        """AWQ for the groups whose members are all in ``names``: weights concatenated,
        one ``s``, folded into ``out``."""
        results: dict[str, BlockQuantized] = {}
        here = set(names)
        for tensor, site in list(self.sites.items()):
            if not set(site.awq) <= here:
                continue
            del self.sites[tensor]
            results.update(self._group(site, stats[tensor], out))
        return results

    def _group(self, site: FoldSite, stats: TensorStats, out: Output) -> dict[str, BlockQuantized]:
        mats = [source.weight(self.src, self.nodes[name]) for name in site.awq]
        first = self.choices[site.awq[0]]
        result = awq_search(
            np.concatenate(mats, axis=1),
            stats.sample(),
            first.bits,
            first.block_size,
            first.symmetric,
            n_grid=int(self.options.get("awq_grid", 20)),
        )
        out.ensure([*site.divide, *(self.nodes[f].input[1] for f in site.floats)])
        apply_fold(out.model, site, result.scales)
        for name in site.awq:
            self.report["layers"][name] = {"awq_alpha": result.alpha, "awq_group": list(site.awq)}
        return split(result.quantized, list(site.awq), [m.shape[1] for m in mats])
