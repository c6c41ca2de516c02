"""A small SVG chart writer: axes with ticks, scatter, bars and histograms, no plotting
library (lpq-core stays light).

Scales are outlier-robust on request: one wild value (a trial that took 100x longer, an
op whose error is 1000x the others) must not squash every other point into a corner, so
values far outside the bulk are drawn clamped at the edge with a marker that says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

FONT = 'font-family="sans-serif" font-size="12"'


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values (steps of 1, 2 or 5 x 10^k) covering [lo, hi]."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return []
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks


def tick_label(value: float, ticks: Sequence[float]) -> str:
    """A tick's text with just enough decimals to tell neighbouring ticks apart."""
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else abs(value) or 1.0
    decimals = max(0, -math.floor(math.log10(step))) if step < 1 else 0
    return f"{value:.{decimals}f}"


def robust_range(values: Sequence[float], keep: Sequence[float] = ()) -> tuple[float, float]:
    """The range to draw: every value of ``keep`` and the bulk of ``values``.

    With five or more values, those beyond 3 interquartile ranges from the quartiles are
    left out (drawn clamped at the edge); fewer values are all kept.
    """
    finite = sorted(v for v in values if math.isfinite(v))
    bulk = finite
    if len(finite) >= 5:
        q1, q3 = finite[len(finite) // 4], finite[(3 * len(finite)) // 4]
        spread = max(q3 - q1, 1e-12 * max(abs(q1), abs(q3), 1.0))
        bulk = [v for v in finite if q1 - 3 * spread <= v <= q3 + 3 * spread]
    chosen = bulk + [v for v in keep if math.isfinite(v)]
    if not chosen:
        return 0.0, 1.0
    lo, hi = min(chosen), max(chosen)
    pad = (hi - lo) * 0.05 or abs(hi) * 0.05 or 0.5
    return lo - pad, hi + pad


@dataclass
class Chart:
    """One chart: a plot area with linear x/y scales and the SVG elements drawn on it."""

    x_range: tuple[float, float]
    y_range: tuple[float, float]
    width: int = 640
    height: int = 400
    left: int = 70
    right: int = 190
    top: int = 40
    bottom: int = 55
    elements: list[str] = field(default_factory=list)

    @property
    def plot_width(self) -> float:
        return self.width - self.left - self.right

    @property
    def plot_height(self) -> float:
        return self.height - self.top - self.bottom

    def sx(self, value: float) -> float:
        lo, hi = self.x_range
        return self.left + (value - lo) / ((hi - lo) or 1) * self.plot_width

    def sy(self, value: float) -> float:
        lo, hi = self.y_range
        return self.height - self.bottom - (value - lo) / ((hi - lo) or 1) * self.plot_height

    def clamp_x(self, value: float) -> tuple[float, bool]:
        """Screen x of ``value``, clamped to the plot; True when it was clamped."""
        lo, hi = self.x_range
        return self.sx(min(max(value, lo), hi)), not lo <= value <= hi

    def clamp_y(self, value: float) -> tuple[float, bool]:
        lo, hi = self.y_range
        return self.sy(min(max(value, lo), hi)), not lo <= value <= hi

    def axes(
        self,
        x_label: str,
        y_label: str,
        *,
        y_ticks: bool = True,
        x_ticks: Sequence[tuple[float, str]] | None = None,
    ) -> None:
        """Axis lines, grid, tick marks with labels, and axis titles. ``x_ticks``: the x
        ticks as ``(position, label)`` (a log axis's decades) instead of nice round ones."""
        bottom, left = self.height - self.bottom, self.left
        right = self.left + self.plot_width
        add = self.elements.append
        ticks = nice_ticks(*self.x_range)
        labelled = x_ticks if x_ticks is not None else [(t, tick_label(t, ticks)) for t in ticks]
        for tick, text in labelled:
            x = self.sx(tick)
            add(f'<line x1="{x:.1f}" y1="{self.top}" x2="{x:.1f}" y2="{bottom}" stroke="#eee"/>')
            add(f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 5}" stroke="#000"/>')
            add(
                f'<text class="tick x" x="{x:.1f}" y="{bottom + 18}" text-anchor="middle">'
                f"{escape(text)}</text>"
            )
        ticks = nice_ticks(*self.y_range) if y_ticks else []
        for tick in ticks:
            y = self.sy(tick)
            add(f'<line x1="{left}" y1="{y:.1f}" x2="{right:.1f}" y2="{y:.1f}" stroke="#eee"/>')
            add(f'<line x1="{left - 5}" y1="{y:.1f}" x2="{left}" y2="{y:.1f}" stroke="#000"/>')
            add(
                f'<text class="tick y" x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">'
                f"{tick_label(tick, ticks)}</text>"
            )
        add(f'<line x1="{left}" y1="{bottom}" x2="{right:.1f}" y2="{bottom}" stroke="#000"/>')
        add(f'<line x1="{left}" y1="{self.top}" x2="{left}" y2="{bottom}" stroke="#000"/>')
        add(
            f'<text x="{left + self.plot_width / 2:.1f}" y="{self.height - 12}" '
            f'text-anchor="middle">{escape(x_label)}</text>'
        )
        mid = self.top + self.plot_height / 2
        add(
            f'<text x="16" y="{mid:.1f}" transform="rotate(-90 16 {mid:.1f})" '
            f'text-anchor="middle">{escape(y_label)}</text>'
        )

    def legend(self, entries: Sequence[tuple[str, str]]) -> None:
        """``(marker svg at 0,0, label)`` rows right of the plot area."""
        x0 = self.left + self.plot_width + 20
        for row, (marker, label) in enumerate(entries):
            y = self.top + 10 + 20 * row
            self.elements.append(
                f'<g class="legend" transform="translate({x0},{y})">{marker}'
                f'<text x="14" y="4">{escape(label)}</text></g>'
            )

    def svg(self, title: str) -> str:
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" '
            f'height="{self.height}" {FONT}>'
            f'<rect width="{self.width}" height="{self.height}" fill="white"/>'
            f'<text x="{self.width / 2}" y="22" text-anchor="middle" font-size="14">'
            f"{escape(title)}</text>" + "".join(self.elements) + "</svg>\n"
        )


def dot(colour: str, shape: str = "circle") -> str:
    """A legend / point marker centred on (0, 0)."""
    if shape == "square":
        return f'<rect x="-5" y="-5" width="10" height="10" fill="{colour}"/>'
    if shape == "triangle":
        return f'<path d="M0,-6 L6,5 L-6,5 Z" fill="none" stroke="{colour}" stroke-width="1.5"/>'
    if shape == "dash":
        return f'<line x1="-7" y1="0" x2="7" y2="0" stroke="{colour}" stroke-dasharray="4 3"/>'
    return f'<circle r="5" fill="{colour}"/>'


#: A bar chart switches to a log scale when its positive values span this factor or more:
#: on a linear scale the small bars would all be invisible slivers.
LOG_SCALE_SPAN = 100.0


def bar_scale(values: Sequence[float]) -> tuple[tuple[float, float], bool]:
    """The x range of a bar chart and whether it is logarithmic (then in log10 units).

    Every bar fits: the range ends at the largest value, never at an outlier-robust cut
    (the worst ops are the ones a reader must tell apart). Where positive values span
    :data:`LOG_SCALE_SPAN` or more, the scale is log10 from a decade below the smallest.
    """
    finite = [v for v in values if math.isfinite(v)]
    positive = [v for v in finite if v > 0]
    if len(positive) >= 2 and max(positive) / min(positive) >= LOG_SCALE_SPAN:
        low = math.log10(min(positive))
        start = math.floor(low)
        if low - start < 0.15:  # the smallest bar must still show
            start -= 1
        return (float(start), math.log10(max(positive)) + 0.02), True
    top = max(finite, default=0.0)
    bottom = min(0.0, min(finite, default=0.0))
    return (bottom, (top * 1.05) if top > 0 else 1.0), False


def _decade_label(power: int) -> str:
    return f"{10.0**power:g}" if -3 <= power <= 3 else f"1e{power}"


def bar_chart(
    title: str,
    labels: Sequence[str],
    values: Sequence[float],
    *,
    value_label: str,
    colours: Sequence[str],
    legend: Sequence[tuple[str, str]] = (),
) -> str:
    """Horizontal bars, one per label (top to bottom), on a scale that fits every bar
    (:func:`bar_scale`: linear, or log10 where the values span decades).

    Each bar carries its value (``data-value``) so that a test can check its width.
    """
    rows = max(len(labels), 1)
    x_range, log = bar_scale(values)
    chart = Chart(
        x_range=x_range,
        y_range=(0.0, float(rows)),
        height=70 + 22 * rows + 40,
        left=180,
    )
    if log:
        first, last = int(x_range[0]), math.floor(x_range[1])
        step = max(1, math.ceil((last - first) / 8))
        ticks = [(float(p), _decade_label(p)) for p in range(first, last + 1, step)]
        chart.axes(f"{value_label} (log scale)", "", y_ticks=False, x_ticks=ticks)
    else:
        chart.axes(value_label, "", y_ticks=False)
    for row, (label, value, colour) in enumerate(zip(labels, values, colours)):
        y_top = chart.sy(rows - row) + 3
        height = chart.plot_height / rows - 6
        if not math.isfinite(value):
            position = x_range[1]
        elif log:
            position = math.log10(value) if value > 0 else x_range[0]
        else:
            position = value
        x_end, _ = chart.clamp_x(position)
        x_start = chart.sx(x_range[0] if log else 0.0)
        chart.elements.append(
            f'<rect class="bar" x="{min(x_start, x_end):.1f}" y="{y_top:.1f}" '
            f'width="{abs(x_end - x_start):.1f}" height="{height:.1f}" fill="{colour}" '
            f'data-value="{value!r}"><title>{escape(label)}: {value:.4g}</title></rect>'
        )
        chart.elements.append(
            f'<text x="{chart.left - 6}" y="{y_top + height / 2 + 4:.1f}" text-anchor="end">'
            f"{escape(label)}</text>"
        )
    chart.legend(legend)
    return chart.svg(title)


def histogram(
    title: str,
    series: Sequence[tuple[str, Sequence[float], str]],
    *,
    value_label: str,
    bins: int = 40,
) -> str:
    """Overlaid step histograms of several value sets (e.g. fp32 vs quantized)."""
    values = [v for _, vs, _ in series for v in vs if math.isfinite(v)]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if hi <= lo:
        hi = lo + 1.0
    width = (hi - lo) / bins
    counts = []
    for _, vs, _ in series:
        row = [0] * bins
        for v in vs:
            if math.isfinite(v):
                row[min(int((v - lo) / width), bins - 1)] += 1
        counts.append(row)
    top = max((max(row) for row in counts), default=1) or 1
    chart = Chart(x_range=(lo, hi), y_range=(0.0, top * 1.05), width=520, height=300)
    chart.axes(value_label, "count")
    for (label, _, colour), row in zip(series, counts):
        points = []
        for i, count in enumerate(row):
            x0, x1 = chart.sx(lo + i * width), chart.sx(lo + (i + 1) * width)
            y = chart.sy(count)
            points += [f"{x0:.1f},{y:.1f}", f"{x1:.1f},{y:.1f}"]
        chart.elements.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
            f'points="{" ".join(points)}"><title>{escape(label)}</title></polyline>'
        )
    chart.legend([(dot(colour), label) for label, _, colour in series])
    return chart.svg(title)
