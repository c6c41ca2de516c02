"""lpq.ranges.narrowing_pays: narrowing runs for small plans on cheap calibration data
only (a count of activation values, the same on every machine)."""

from __future__ import annotations

from lpq.ranges import NARROW_MAX_OPS, NARROW_MAX_VALUES, narrowing_pays


def test_narrowing_pays_for_small_plans_on_cheap_data_only():
    assert narrowing_pays(NARROW_MAX_OPS, NARROW_MAX_VALUES)
    assert narrowing_pays(1, 0)
    assert not narrowing_pays(NARROW_MAX_OPS + 1, 1)  # a large plan
    assert not narrowing_pays(1, NARROW_MAX_VALUES + 1)  # a tiny model on costly data
    # the two real models the bounds were set on
    assert narrowing_pays(10, 857_568)  # Silero VAD, 4 streams: narrowed
    assert not narrowing_pays(5, 211_234_248)  # MTCNN P-Net, 51 pictures of 320x240
