"""Human-readable output of a tuning run: trial table, summary, accuracy/latency plot."""

from __future__ import annotations

import math
from html import escape
from pathlib import Path
from typing import Any

from ..fileio import atomic_write
from ..tuning.records import TrialRecord


def _fmt(value: float | None, spec: str = ".4f", missing: str = "-") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return format(value, spec)


def trials_table(baseline: TrialRecord, trials: list[TrialRecord], best_index: int) -> Any:
    from rich.table import Table

    table = Table(title="trials")
    for column in ("#", "stage", "accuracy", "latency ms", "quantized", "fp32", "goal", "time s"):
        table.add_column(column, justify="right" if column not in ("stage",) else "left")
    table.add_row(
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
        table.add_row(
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
    return table


def summary_lines(summary: dict[str, Any]) -> list[str]:
    goal = "[green]met[/]" if summary["goal_met"] else "[yellow]NOT met[/]"
    loss = summary.get("relative_accuracy_loss")
    reason = summary["stop_reason"]
    lines = [
        f"accuracy goal {goal}" + (f" ({reason})" if reason != "accuracy goal met" else ""),
        f"{summary['metric']}: fp32 {_fmt(summary['baseline_accuracy'])} -> quantized "
        f"{_fmt(summary['final_accuracy'])}"
        + (f" (relative loss {loss * 100:.2f}%)" if loss is not None else ""),
    ]
    if summary.get("latency_speedup"):
        lines.append(
            f"latency: {_fmt(summary['baseline_latency_ms'], '.3f')} ms -> "
            f"{_fmt(summary['final_latency_ms'], '.3f')} ms "
            + (
                f"({summary['latency_speedup']:.2f}x faster)"
                if summary["latency_speedup"] >= 1
                else f"({1 / summary['latency_speedup']:.2f}x slower)"
            )
        )
    speedup = summary.get("latency_speedup")
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
    lines.append(
        f"{summary['quantized_ops']} ops quantized, {summary['fallback_ops']} left in float; "
        f"{summary['trials']} trial(s); history: {summary['history']}"
    )
    return lines


def write_plot(path: Path, baseline: TrialRecord, trials: list[TrialRecord], best: int) -> bool:
    """An SVG scatter of accuracy against latency over the trials (no plotting library)."""
    points = [t for t in trials if t.status == "ok" and t.latency_ms and not math.isnan(t.accuracy)]
    if not points or not baseline.latency_ms:
        return False
    xs = [t.latency_ms or 0.0 for t in points] + [baseline.latency_ms]
    ys = [t.accuracy for t in points] + [baseline.accuracy]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    w, h, pad = 480, 320, 50

    def sx(v: float) -> float:
        return pad + (v - x0) / ((x1 - x0) or 1) * (w - 2 * pad)

    def sy(v: float) -> float:
        return h - pad - (v - y0) / ((y1 - y0) or 1) * (h - 2 * pad)

    dots = [
        f'<circle cx="{sx(t.latency_ms or 0):.1f}" cy="{sy(t.accuracy):.1f}" r="5" '
        f'fill="{"#2a2" if t.index == best else ("#48c" if t.meets_goal else "#c84")}">'
        f"<title>trial {t.index} {escape(t.stage)}</title></circle>"
        for t in points
    ]
    dots.append(
        f'<rect x="{sx(baseline.latency_ms) - 5:.1f}" y="{sy(baseline.accuracy) - 5:.1f}"'
        ' width="10" height="10" fill="#000"><title>fp32</title></rect>'
    )
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        'font-family="sans-serif" font-size="12">'
        f'<rect width="{w}" height="{h}" fill="white"/>'
        f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#000"/>'
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="#000"/>'
        f'<text x="{w / 2}" y="{h - 15}" text-anchor="middle">latency (ms): '
        f"{x0:.3f} .. {x1:.3f}</text>"
        f'<text x="15" y="{h / 2}" transform="rotate(-90 15 {h / 2})" text-anchor="middle">'
        f"accuracy: {y0:.4f} .. {y1:.4f}</text>"
        f'<text x="{w / 2}" y="20" text-anchor="middle">accuracy vs latency '
        "(black: fp32, green: chosen, blue: meets goal)</text>" + "".join(dots) + "</svg>\n"
    )
    with atomic_write(path) as handle:
        handle.write(svg)
    return True
