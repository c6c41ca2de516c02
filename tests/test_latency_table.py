"""lpq.latency.table: per-op float / quantized costs shared across models and runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lpq.latency.table import DECISIVE, MAX_SAMPLES, LatencyTable, machine


def _conv(width: int = 64, stride: int = 1) -> dict[str, object]:
    return {
        "op_type": "Conv",
        "inputs": [[1, [1, 16, width, width]], [1, [32, 16, 3, 3]]],
        "attributes": {"strides": [stride, stride], "group": 1},
        "format": "qdq",
    }


def _machine(threads: int = 1) -> dict[str, object]:
    return machine(framework="fake", framework_version="1.0", threads=threads)


def test_keys_follow_the_signature_not_its_spelling() -> None:
    same = {"format": "qdq", **{k: v for k, v in reversed(list(_conv().items()))}}
    assert LatencyTable.key(_conv()) == LatencyTable.key(same)
    assert LatencyTable.key(_conv()) != LatencyTable.key(_conv(width=32))
    assert LatencyTable.key(_conv()) != LatencyTable.key(_conv(stride=2))
    assert LatencyTable.key(_conv()) != LatencyTable.key({**_conv(), "format": "qoperator"})


def test_machine_key_holds_isa_threads_and_framework() -> None:
    key = _machine()
    assert {"isa", "threads", "cpu", "cores", "framework", "framework_version"} <= set(key)
    assert _machine(1) != _machine(2)


def test_a_missing_op_is_a_miss_and_decisive_samples_are_hits() -> None:
    table = LatencyTable(None, _machine())
    assert table.verdict([_conv()]) is None
    assert (table.hits, table.misses) == (0, 1)
    table.record(_conv(), float_ms=1.0, quant_ms=0.4)
    faster = table.verdict([_conv()])
    assert faster is not None and faster.quantize
    assert faster.low == pytest.approx(0.4) and faster.high == pytest.approx(0.4)
    table.record(_conv(32), float_ms=0.1, quant_ms=0.3)
    slower = table.verdict([_conv(32)])
    assert slower is not None and not slower.quantize
    # A group is weighed by float cost: 1.0 -> 0.4 and 0.1 -> 0.3 is 0.7 / 1.1 overall.
    both = table.verdict([_conv(), _conv(32)])
    assert both is not None and both.quantize
    assert both.high == pytest.approx(0.7 / 1.1)
    assert table.hits == 3


def test_a_close_or_disputed_entry_decides_nothing() -> None:
    table = LatencyTable(None, _machine())
    table.record(_conv(), 1.0, 1.0 / DECISIVE + 0.05)  # faster, not by the decisive factor
    assert table.verdict([_conv()]) is None
    table.record(_conv(32), 1.0, 0.4)
    table.record(_conv(32), 1.0, 1.6)  # another run says the opposite: measured in context
    assert table.verdict([_conv(32)]) is None
    assert table.verdict([_conv(32)], decisive=1.0) is None  # low 0.4, high 1.6
    assert table.hits == 0 and table.misses == 3


def test_unmeasurable_samples_are_not_recorded() -> None:
    table = LatencyTable(None, _machine())
    table.record(_conv(), 0.0, 0.5)  # fused away in float: no ratio to learn
    assert table.get(_conv()) is None


def test_samples_are_capped_to_the_newest() -> None:
    table = LatencyTable(None, _machine())
    for k in range(MAX_SAMPLES + 3):
        table.record(_conv(), 1.0, 0.1 * (k + 1))
    entry = table.get(_conv())
    assert entry is not None and len(entry.samples) == MAX_SAMPLES
    assert entry.samples[-1] == (1.0, pytest.approx(0.1 * (MAX_SAMPLES + 3)))


def test_the_table_is_shared_through_disk_and_merged(tmp_path: Path) -> None:
    options = {"latency_cache_dir": str(tmp_path)}
    first = LatencyTable.open(options, _machine())
    second = LatencyTable.open(options, _machine())  # another process, opened at the same time
    first.record(_conv(), 1.0, 0.4)
    second.record(_conv(32), 0.2, 0.5)
    first.save()
    second.save()  # re-reads before writing: the first one's entry survives
    later = LatencyTable.open(options, _machine())
    assert later.get(_conv()) is not None and later.get(_conv(32)) is not None
    verdict = later.verdict([_conv()])
    assert verdict is not None and verdict.quantize
    files = list((tmp_path / "table").glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["machine"] == _machine()


def test_another_machines_table_is_not_read(tmp_path: Path) -> None:
    options = {"latency_cache_dir": str(tmp_path)}
    table = LatencyTable.open(options, _machine(1))
    table.record(_conv(), 1.0, 0.4)
    table.save()
    assert LatencyTable.open(options, _machine(2)).get(_conv()) is None
    path = table.path
    assert path is not None
    path.write_text("{not json", encoding="utf-8")  # a corrupt file is measured again
    assert LatencyTable.open(options, _machine(1)).get(_conv()) is None


def test_a_read_only_folder_does_not_fail(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x", encoding="utf-8")
    table = LatencyTable(blocker / "table" / "t.json", _machine())
    table.record(_conv(), 1.0, 0.4)
    table.save()  # logged, not raised
    assert table.get(_conv()) is not None
