"""The shared-scale rule (``lpq.ranges.shared_scale``): which merging ops keep fp32 from
their inputs' calibrated ranges alone. lpq-onnxrt's real quantization of such a head is
tested in plugins/lpq-onnxrt/tests/test_onnxrt_shared_scale.py."""

from __future__ import annotations

import logging

import pytest

import lpq
import lpq.ranges
from lpq.ranges import MAX_SPREAD, max_spread, spread, unshareable

# NudeNet's 320n.onnx, calibrated: its head's final Concat, and one Concat of its neck.
HEAD = [(0.0, 318.9), (0.0, 0.855)]
NECK = [(0.0, 39.5), (0.0, 19.5), (0.0, 9.5)]


def test_spread_is_widest_over_narrowest_width():
    assert spread(NECK) == pytest.approx(39.5 / 9.5)
    assert spread([(-2.0, 2.0), (0.0, 1.0)]) == pytest.approx(4.0)
    # Zero-width ranges quantize exactly and are left out; one range has no spread.
    assert spread([(0.0, 0.0), (0.0, 5.0)]) is None
    assert spread([(0.0, 0.0), (-1.0, 1.0), (0.0, 0.5)]) == pytest.approx(4.0)


def test_the_yolov8_head_concat_is_found_and_the_neck_is_not():
    found = unshareable({"/model.22/Concat_25": HEAD, "/model.4/Concat": NECK})
    assert [f.op for f in found] == ["/model.22/Concat_25"]
    (head,) = found
    assert head.spread == pytest.approx(318.9 / 0.855)
    assert head.narrowest == (0.0, 0.855) and head.widest == (0.0, 318.9)
    assert head.levels < 1.0
    said = head.describe()
    assert "373x" in said and "0.855" in said and "0.7 levels" in said


def test_the_limit_is_a_strict_bound_and_zero_turns_the_rule_off():
    at_limit = {"c": [(0.0, MAX_SPREAD), (0.0, 1.0)]}
    assert unshareable(at_limit) == []
    assert [f.op for f in unshareable(at_limit, limit=MAX_SPREAD / 2)] == ["c"]
    assert unshareable({"c": HEAD}, limit=0) == []


def test_the_option_reads_numbers_and_refuses_the_rest():
    assert max_spread({}) == MAX_SPREAD
    assert max_spread({"concat_max_spread": 64}) == 64.0
    assert max_spread({"concat_max_spread": "8"}) == 8.0
    assert max_spread({"concat_max_spread": 0}) == 0.0
    for bad in ("wide", 0.5, -3, None):
        with pytest.raises(lpq.ConfigError, match="concat_max_spread"):
            max_spread({"concat_max_spread": bad})


def test_keep_float_makes_the_found_ops_fallbacks_and_says_why(caplog):
    int8 = lpq.OpConfig("int8", "static", activation=lpq.TensorConfig(dtype="uint8"))
    cfg = lpq.TuneConfig(ops={("head", "Concat"): int8, ("conv", "Conv"): int8})
    found = unshareable({"head": HEAD})
    with caplog.at_level("INFO", logger="test.shared_scale"):
        kept = lpq.ranges.keep_float(cfg, found, logging.getLogger("test.shared_scale"))
    assert not kept.ops[("head", "Concat")].quantized
    assert kept.ops[("conv", "Conv")] == int8
    assert cfg.ops[("head", "Concat")] == int8  # the given tune_cfg is not modified
    assert [r.getMessage() for r in caplog.records] == [f"kept fp32: {found[0].describe()}"]
