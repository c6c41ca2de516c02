"""A per-op latency table: what one op costs in float and quantized, shared across models.

A latency-aware search on a new model need not time whole models to learn that a 3x3
conv of a given shape runs faster in int8 on this machine: another model (or an earlier
run) with the same op has measured it. The table keeps, per op *signature* (the
adaptor's description of the op: type, input/output shapes and dtypes, attributes, the
quantized variant such as QDQ or QOperator and its dtypes), the measured float and
quantized milliseconds, under a file per *machine* (CPU model, int8 ISA, cores, thread
count, framework and its version): ``<cache>/latency/table/<framework>-<digest>.json``.

Only ratios decide. A sample is a pair (float ms, quantized ms) measured together (the
adaptor interleaves the two models' runs: load that hits one hits both), so the pair's
ratio holds on a loaded machine where its milliseconds do not. A group of ops (an op
type's ops in one model) is decided from the table only when every op has an entry and
the group's ratio is beyond :data:`DECISIVE` either way *for every sample of every
entry* (the low and high ratio of each entry, weighted by float cost): a comparison
whose samples disagree is not decided here, and the adaptor measures it in context,
adding a sample. What the table cannot decide is measured, and recorded for next time.

Framework-neutral (``lpq.latency.table``): adaptors build the signatures and feed the
samples; :func:`lpq.latency.search.decide` callers ask :meth:`LatencyTable.verdict`.
"""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cache import content_key
from ..fileio import atomic_write

log = logging.getLogger("lpq.latency")

#: Bumped when what an entry means changes: older files are then never read.
FORMAT = "lpq-latency-table/1"
#: A group is decided from the table only when its quantized / float ratio is beyond this
#: factor (either way) at every sample: closer calls depend on the ops' neighbours (where
#: quantize/dequantize steps land) and are measured in the model.
DECISIVE = 1.3
#: Samples kept per entry (the newest): enough to see a disagreement, few enough that a
#: machine that changed (a new ORT build) is seen again soon.
MAX_SAMPLES = 5


def machine(*, framework: str, framework_version: str, threads: Any) -> dict[str, Any]:
    """What makes per-op timings of one machine comparable (JSON-normal)."""
    from .cache import json_normal, machine_identity

    value = {
        "format": FORMAT,
        "framework": framework,
        "framework_version": framework_version,
        "threads": threads,
        **machine_identity(),
    }
    return json_normal(value)


def folder(options: Mapping[str, Any]) -> Path:
    """``options['latency_cache_dir']``/table, else ``$LPQ_CACHE_DIR/latency/table``, else
    ``~/.cache/lpq/latency/table`` (beside the decision caches)."""
    chosen = options.get("latency_cache_dir")
    if chosen:
        return Path(str(chosen)) / "table"
    from .cache import cache_root

    return cache_root() / "latency" / "table"


@dataclass
class Entry:
    """The samples of one op signature: (float ms, quantized ms) pairs, oldest first."""

    samples: list[tuple[float, float]]

    @property
    def float_ms(self) -> float:
        return statistics.median(f for f, _ in self.samples)

    @property
    def quant_ms(self) -> float:
        return statistics.median(q for _, q in self.samples)

    def ratios(self) -> list[float]:
        """quantized / float of each sample."""
        return [q / f if f > 0 else float("inf") for f, q in self.samples]


@dataclass(frozen=True)
class Verdict:
    """What the table says about a group: ``quantize`` (True: quantized is faster, False:
    float is) and the group's ratio range over the samples, low and high."""

    quantize: bool
    low: float
    high: float

    def describe(self) -> str:
        return f"int8/fp32 {self.low:.2f}-{self.high:.2f} from the op latency table"


class LatencyTable:
    """Per-op float and quantized milliseconds for one machine, on disk (or in memory
    only, ``path=None``). Counts its hits and misses (``hits``, ``misses``) for reports."""

    def __init__(self, path: Path | None, machine_key: Mapping[str, Any]) -> None:
        self.path = path
        self.machine = dict(machine_key)
        self.entries: dict[str, Entry] = {}
        self._added: dict[str, list[tuple[float, float]]] = {}
        self.hits = 0
        self.misses = 0
        if path is not None:
            self.entries = _read(path, self.machine)

    @classmethod
    def open(cls, options: Mapping[str, Any], machine_key: Mapping[str, Any]) -> LatencyTable:
        """The table of ``machine_key`` under :func:`folder` (``options``)."""
        name = f"{machine_key.get('framework', 'any')}-{content_key(dict(machine_key))[:16]}.json"
        return cls(folder(options) / name, machine_key)

    @staticmethod
    def key(signature: Mapping[str, Any]) -> str:
        """The entry key of an op signature (any JSON-able description)."""
        return content_key(json.loads(json.dumps(signature, sort_keys=True, default=str)))

    def get(self, signature: Mapping[str, Any]) -> Entry | None:
        return self.entries.get(self.key(signature))

    def record(self, signature: Mapping[str, Any], float_ms: float, quant_ms: float) -> None:
        """Add one sample (measured together, see the module doc); kept in memory until
        :meth:`save`. Non-positive times (an op the profiler did not see) are ignored."""
        if not (float_ms > 0 and quant_ms > 0):
            return
        name = self.key(signature)
        entry = self.entries.setdefault(name, Entry([]))
        entry.samples = [*entry.samples, (float(float_ms), float(quant_ms))][-MAX_SAMPLES:]
        self._added.setdefault(name, []).append((float(float_ms), float(quant_ms)))

    def verdict(
        self, signatures: Sequence[Mapping[str, Any]], decisive: float = DECISIVE
    ) -> Verdict | None:
        """Whether the group ``signatures`` runs faster quantized, when every sample of
        every entry says so by ``decisive``; None (a miss) when an entry is missing or the
        samples do not decide."""
        entries = [self.get(signature) for signature in signatures]
        present = [entry for entry in entries if entry is not None and entry.samples]
        if not signatures or len(present) < len(entries):
            self.misses += 1
            return None
        weights = [entry.float_ms for entry in present]
        total = sum(weights)
        if total <= 0:
            self.misses += 1
            return None
        low = sum(w * min(e.ratios()) for w, e in zip(weights, present, strict=True)) / total
        high = sum(w * max(e.ratios()) for w, e in zip(weights, present, strict=True)) / total
        if high * decisive < 1.0:
            self.hits += 1
            return Verdict(True, low, high)
        if low > decisive:
            self.hits += 1
            return Verdict(False, low, high)
        self.misses += 1
        return None

    def save(self) -> None:
        """Merge the samples added since loading into the file (re-read first: another
        process may have added its own), atomically. A read-only folder is logged, not
        raised: the table only saves time."""
        if self.path is None or not self._added:
            return
        merged = _read(self.path, self.machine)
        for name, samples in self._added.items():
            entry = merged.setdefault(name, Entry([]))
            entry.samples = [*entry.samples, *samples][-MAX_SAMPLES:]
        data = {
            "machine": self.machine,
            "entries": {name: [list(s) for s in e.samples] for name, e in merged.items()},
        }
        try:
            with atomic_write(self.path, "w") as handle:
                json.dump(data, handle, sort_keys=True)
        except OSError as exc:
            log.info("op latency table not written (%s)", exc)
            return
        self.entries = merged
        self._added = {}


def _read(path: Path, machine_key: Mapping[str, Any]) -> dict[str, Entry]:
    """The entries of ``path`` when it is this machine's table (else none: a foreign or
    corrupt file is ignored and rewritten on the next save)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("machine") != dict(machine_key):
            return {}
        return {
            str(name): Entry([(float(f), float(q)) for f, q in samples][-MAX_SAMPLES:])
            for name, samples in data["entries"].items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
