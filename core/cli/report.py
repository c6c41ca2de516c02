"""Human-readable output of a tuning run: trial table, summary, accuracy/latency plot."""

from __future__ import annotations

import math
from html import escape
from pathlib import Path
from typing import Any

from ..diagnose.svg import Chart, dot, robust_range
from ..fileio import atomic_write
from ..tuning.records import TrialRecord
from .console import table


def _fmt(value: float | None, spec: str = ".4f", missing: str = "-") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return format(value, spec)


def latency_unit(batch_size: int | None) -> str:
    """What a latency number means: milliseconds per batch of the latency data."""
    return f"ms per batch of {batch_size}" if batch_size else "ms per batch"


def trials_table(
    baseline: TrialRecord,
    trials: list[TrialRecord],
    best_index: int,
    batch_size: int | None = None,
) -> Any:
    latency = f"latency ({latency_unit(batch_size)})"
    # "float ops": ops left in float; not "fp32", which names the baseline row
    columns = ["#", "stage", "accuracy", latency, "quantized", "float ops", "goal", "time s"]
    result = table(
        "trials", columns, right=("#", "accuracy", latency, "quantized", "float ops", "time s")
    )
    result.add_row(
        "fp32",
        "baseline",
        _fmt(baseline.accuracy),
        _fmt(baseline.latency_ms, ".3f"),
        "0",
        "-",
        "",
        _fmt(baseline.duration_s, ".1f"),
    )
    for t in trials:
        mark = "[green]yes[/]" if t.meets_goal else ("[red]error[/]" if t.status != "ok" else "no")
        style = "bold" if t.index == best_index else ""
        result.add_row(
            str(t.index) + (" *" if t.index == best_index else ""),
            t.stage,
            _fmt(t.accuracy),
            _fmt(t.latency_ms, ".3f"),
            str(t.quantized_ops),
            str(t.fallback_ops),
            mark,
            _fmt(t.duration_s, ".1f") + (" (resumed)" if t.resumed else ""),
            style=style,
        )
    return result


def summary_lines(summary: dict[str, Any]) -> list[str]:
    verdict = summary.get("verdict") or (
        "accuracy goal met" if summary["goal_met"] else "accuracy goal NOT met"
    )
    color = "green" if summary["goal_met"] else "yellow"
    loss = summary.get("relative_accuracy_loss")
    reason = summary["stop_reason"]
    lines = [
        f"[{color}]{verdict}[/]" + (f" ({reason})" if reason != "accuracy goal met" else ""),
        f"{summary['metric']}: fp32 {_fmt(summary['baseline_accuracy'])} -> quantized "
        f"{_fmt(summary['final_accuracy'])}"
        + (f" (relative loss {loss * 100:.2f}%)" if loss is not None else ""),
    ]
    if summary.get("metric_note"):
        lines.append(f"  ({summary['metric']}: {summary['metric_note']})")
    speedup = summary.get("latency_speedup")
    if speedup:
        lines.append(
            f"latency ({latency_unit(summary.get('latency_batch_size'))}): "
            f"{_fmt(summary['baseline_latency_ms'], '.3f')} -> "
            f"{_fmt(summary['final_latency_ms'], '.3f')} "
            + (f"({speedup:.2f}x faster)" if speedup >= 1 else f"({1 / speedup:.2f}x slower)")
        )
    if speedup is not None and speedup < 1.0:
        lines.append(
            f"[yellow]warning[/]: the chosen model is {1 / speedup:.2f}x slower than fp32 here; "
            "small models and models with many fp32 fallbacks gain little from int8. "
            "Try --exit-policy best, or keep the fp32 model."
        )
    if summary.get("size_reduction"):
        lines.append(
            f"size: {summary['baseline_size_bytes'] / 1e6:.2f} MB -> "
            f"{summary['final_size_bytes'] / 1e6:.2f} MB ({summary['size_reduction']:.2f}x smaller)"
        )
    for item in summary.get("backend_ruled_out") or []:
        lines.append(f"backend: {item.get('text') or item}")
    lines.append(
        f"{summary['quantized_ops']} ops quantized, {summary['fallback_ops']} left in float; "
        f"{summary['trials']} trial(s); history: {summary['history']}"
    )
    return lines


#: Point colours of the accuracy/latency plot; every one has a legend entry.
COLOURS = {"fp32": "#000", "chosen": "#2a2", "meets": "#48c", "misses": "#c84"}


def write_plot(
    path: Path,
    baseline: TrialRecord,
    trials: list[TrialRecord],
    best: int,
    *,
    goal: float | None = None,
    batch_size: int | None = None,
) -> bool:
    """An SVG scatter of accuracy against latency over the trials.

    Both axes have ticks; the accuracy the goal needs is a dashed line; every colour is in
    the legend. The scale follows the bulk of the trials, always including fp32, the chosen
    trial and the goal: a far-off trial is drawn at the edge as a hollow triangle, with its
    real values in its tooltip.
    """
    points = [t for t in trials if t.status == "ok" and t.latency_ms and not math.isnan(t.accuracy)]
    if not points or not baseline.latency_ms:
        return False
    chosen = [t for t in points if t.index == best]
    keep_x = [baseline.latency_ms] + [t.latency_ms or 0.0 for t in chosen]
    keep_y = (
        [baseline.accuracy] + [t.accuracy for t in chosen] + ([goal] if goal is not None else [])
    )
    chart = Chart(
        x_range=robust_range([t.latency_ms or 0.0 for t in points], keep_x),
        y_range=robust_range([t.accuracy for t in points], keep_y),
    )
    chart.axes(f"latency ({latency_unit(batch_size)})", "accuracy")
    used = {"fp32"}
    clamped_any = False
    for t in points:
        kind = "chosen" if t.index == best else ("meets" if t.meets_goal else "misses")
        used.add(kind)
        x, cx = chart.clamp_x(t.latency_ms or 0.0)
        y, cy = chart.clamp_y(t.accuracy)
        clamped_any |= cx or cy
        tip = (
            f"trial {t.index} {escape(t.stage)}: accuracy {t.accuracy:.4f}, "
            f"latency {t.latency_ms:.3f} ms" + (" (off the scale)" if cx or cy else "")
        )
        marker = dot(COLOURS[kind], "triangle" if cx or cy else "circle")
        chart.elements.append(
            f'<g class="point {kind}" transform="translate({x:.1f},{y:.1f})">{marker}'
            f"<title>{tip}</title></g>"
        )
    bx, by = chart.sx(baseline.latency_ms), chart.sy(baseline.accuracy)
    chart.elements.append(
        f'<g class="point fp32" transform="translate({bx:.1f},{by:.1f})">'
        f"{dot(COLOURS['fp32'], 'square')}"
        f"<title>fp32: accuracy {baseline.accuracy:.4f}, latency {baseline.latency_ms:.3f} ms"
        "</title></g>"
    )
    if goal is not None:
        gy = chart.sy(goal)
        chart.elements.append(
            f'<line class="goal" x1="{chart.left}" y1="{gy:.1f}" '
            f'x2="{chart.left + chart.plot_width:.1f}" y2="{gy:.1f}" stroke="#a00" '
            f'stroke-dasharray="6 4"><title>accuracy goal {goal:.4f}</title></line>'
        )
    labels = {
        "fp32": ("square", "fp32 baseline"),
        "chosen": ("circle", "chosen"),
        "meets": ("circle", "meets the goal"),
        "misses": ("circle", "misses the goal"),
    }
    entries = [(dot(COLOURS[k], labels[k][0]), labels[k][1]) for k in COLOURS if k in used]
    if goal is not None:
        entries.append((dot("#a00", "dash"), f"goal: accuracy {goal:.4f}"))
    if clamped_any:
        entries.append((dot("#555", "triangle"), "off the scale (edge)"))
    chart.legend(entries)
    with atomic_write(path) as handle:
        handle.write(chart.svg("accuracy vs latency over the trials"))
    return True
