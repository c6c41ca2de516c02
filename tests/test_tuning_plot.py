"""The accuracy-vs-latency plot (issue 11, item 18): axis ticks, a goal line, a legend for
every colour, and a scale that one outlier does not squash."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from lpq.cli.report import COLOURS, write_plot
from lpq.diagnose.svg import nice_ticks, robust_range
from lpq.tuning.records import TrialRecord

NS = {"s": "http://www.w3.org/2000/svg"}


def trial(index: int, accuracy: float, latency: float, meets: bool) -> TrialRecord:
    return TrialRecord(
        index,
        f"f{index}",
        {},
        stage=f"f{index}",
        accuracy=accuracy,
        latency_ms=latency,
        meets_goal=meets,
    )


def plot(tmp_path: Path) -> ET.Element:
    baseline = TrialRecord(-1, "fp32", None, accuracy=0.95, latency_ms=10.0)
    trials = [
        trial(0, 0.90, 4.0, False),
        trial(1, 0.94, 4.5, True),
        trial(2, 0.945, 5.0, True),
        trial(3, 0.93, 4.2, False),
        trial(4, 0.94, 900.0, True),  # a trial that ran beside a busy neighbour
        trial(5, 0.10, 4.1, False),  # a broken config
    ]
    path = tmp_path / "plot.svg"
    assert write_plot(path, baseline, trials, best=1, goal=0.9405, batch_size=32)
    return ET.parse(path).getroot()


def texts(root: ET.Element, cls: str) -> list[str]:
    return [e.text or "" for e in root.iter(f"{{{NS['s']}}}text") if e.get("class") == cls]


def test_both_axes_have_ticks_and_the_unit(tmp_path):
    root = plot(tmp_path)
    assert len(texts(root, "tick x")) >= 3 and len(texts(root, "tick y")) >= 3
    labels = [e.text for e in root.iter(f"{{{NS['s']}}}text")]
    assert "latency (ms per batch of 32)" in labels


def test_the_goal_is_a_line_and_every_colour_has_a_legend_entry(tmp_path):
    root = plot(tmp_path)
    goal = [e for e in root.iter(f"{{{NS['s']}}}line") if e.get("class") == "goal"]
    assert len(goal) == 1
    legend = " ".join(
        t.text or ""
        for g in root.iter(f"{{{NS['s']}}}g")
        if g.get("class") == "legend"
        for t in g
        if t.text
    )
    for label in (
        "fp32 baseline",
        "chosen",
        "meets the goal",
        "misses the goal",
        "goal: accuracy 0.9405",
    ):
        assert label in legend, label
    used = {
        (g.get("class") or "").split()[1]
        for g in root.iter(f"{{{NS['s']}}}g")
        if (g.get("class") or "").startswith("point ")
    }
    assert used == set(COLOURS)


def test_outliers_do_not_squash_the_other_points(tmp_path):
    root = plot(tmp_path)
    points = {}
    for g in root.iter(f"{{{NS['s']}}}g"):
        if (g.get("class") or "").startswith("point "):
            x, y = g.get("transform", "")[len("translate(") : -1].split(",")
            title = next(t.text for t in g.iter(f"{{{NS['s']}}}title"))
            points[title.split(":")[0]] = (float(x), float(y), title)
    bulk = [points[f"trial {i} f{i}"][0] for i in (0, 1, 2, 3)] + [points["fp32"][0]]
    assert max(bulk) - min(bulk) > 200, "the bulk spreads over the plot (480 px wide)"
    outlier_x, _, outlier_title = points["trial 4 f4"]
    assert outlier_x >= max(bulk) and "off the scale" in outlier_title
    assert "off the scale (edge)" in ET.tostring(root, encoding="unicode")
    _, _, broken_title = points["trial 5 f5"]
    assert "off the scale" in broken_title, "an accuracy far below the rest is clamped too"


def test_nice_ticks_and_robust_range():
    assert nice_ticks(0.0, 1.0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(3.2, 7.9)[0] == 4.0
    lo, hi = robust_range([4.0, 4.1, 4.2, 4.5, 5.0, 900.0], keep=[10.0])
    assert lo < 4.0 and 10.0 < hi < 20.0
