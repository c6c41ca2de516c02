"""A diagnosis as files: ``diagnosis.json`` (every number) and ``diagnosis.html`` (the
same, readable, with charts: per-op error, the effect of each fallback, and activation
histograms of the worst ops)."""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

from ..fileio import atomic_write, write_json
from .analysis import Diagnosis, OpReport
from .svg import bar_chart, dot, histogram

QUANTIZED, FLOAT, FALLBACK = "#c84", "#999", "#48c"

_STYLE = """
body { font-family: sans-serif; margin: 2em; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
td.text, th.text { text-align: left; }
.note { color: #555; }
figure { display: inline-block; margin: 0.5em; }
"""


def _num(value: float | None, spec: str = ".4g") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "inf" if value == math.inf else "-"
    return format(value, spec)


def _row(rank: int, op: OpReport) -> str:
    fallback = op.fallback
    cells = [
        str(rank),
        f'<td class="text">{escape(op.name)}</td>',
        f'<td class="text">{escape(op.op_type)}</td>',
        f'<td class="text">{escape(op.precision)}</td>',
        f'<td class="text">{escape(op.scheme)}</td>',
        _num(op.added_error),
        _num(op.relative_error),
        _num(op.sqnr_db, ".1f"),
        _num(op.error_steps, ".2f"),
        f"{_num(op.fp32_range[0])} .. {_num(op.fp32_range[1])}",
        _num(fallback.output_error) if fallback else "",
        f"{fallback.gain * 100:.0f}%" if fallback else "",
        _num(fallback.fidelity) if fallback else "",
    ]
    return "<tr>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in cells) + "</tr>"


def render_html(diagnosis: Diagnosis, worst: int) -> str:
    d = diagnosis
    ops = d.ops
    error_chart = bar_chart(
        "error each op adds (to the largest relative error before it in graph order)",
        [op.name for op in ops],
        [op.added_error for op in ops],
        value_label="relative error added",
        colours=[QUANTIZED if op.quantized else FLOAT for op in ops],
        legend=[(dot(QUANTIZED), "runs quantized"), (dot(FLOAT), "runs in float")],
    )
    fallen = [op for op in ops if op.fallback is not None]
    fallback_chart = (
        bar_chart(
            "model output error with one op put back in fp32",
            ["(none: as quantized)"] + [op.name for op in fallen],
            [d.output_error] + [op.fallback.output_error for op in fallen if op.fallback],
            value_label="relative output error",
            colours=[QUANTIZED] + [FALLBACK] * len(fallen),
            legend=[(dot(QUANTIZED), "quantized model"), (dot(FALLBACK), "with that op in fp32")],
        )
        if fallen
        else ""
    )
    figures = []
    for name, (fp32, quantized) in d.values.items():
        series = [("fp32", fp32.tolist(), "#000"), ("quantized", quantized.tolist(), QUANTIZED)]
        chart = histogram(f"{name}: activation values", series, value_label="value")
        figures.append(f"<figure>{chart}</figure>")
    histograms = "".join(figures)
    agreement = f", top-1 agreement with fp32 {d.agreement:.4f}" if d.agreement is not None else ""
    fidelity = (
        f"<p>Fidelity <b>{d.fidelity:.4f}</b>: {escape(d.metric or '')} against the fp32 "
        f"model's outputs ({escape(d.metric_reason)}).</p>"
        if d.fidelity is not None
        else ""
    )
    if d.fallback_base_fidelity is not None and d.fallback_base_fidelity != d.fidelity:
        fidelity += (
            f"<p>The fallbacks below start from the model re-quantized with its "
            f"configuration: fidelity {d.fallback_base_fidelity:.4f}.</p>"
        )
    header = (
        "<tr><th>#</th><th class='text'>op</th><th class='text'>type</th>"
        "<th class='text'>runs in</th><th class='text'>scheme</th><th>error added</th>"
        "<th>relative error</th>"
        "<th>SQNR dB</th><th>error (int8 steps)</th><th>fp32 range</th>"
        "<th>output error if fp32</th><th>error removed</th><th>fidelity if fp32</th></tr>"
    )
    notes = "".join(f"<li>{escape(n)}</li>" for n in d.notes)
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>lpq diagnosis: {escape(d.model)}</title>
<style>{_STYLE}</style></head><body>
<h1>Quantization diagnosis</h1>
<p>fp32 model <b>{escape(d.model)}</b> ({escape(d.framework)}); quantized model
<b>{escape(d.quantized)}</b>; configuration: {escape(d.config_source)};
{d.samples} samples.</p>
<p>Model output: relative error {_num(d.output_error)}{agreement}.</p>
{fidelity}
<ul class="note">{notes}</ul>
<h2>Per-op error, worst first</h2>
{error_chart}
<table>{header}{"".join(_row(i + 1, op) for i, op in enumerate(ops))}</table>
<p class="note">Relative error: RMS(quantized - fp32) / RMS(fp32) of the op's output, which
includes the error of every op before it; "error added": how much the op raises the largest
relative error of the ops before it in graph order, which ranks the ops (on branching graphs
an estimate: the fallback column is measured). "Output error if fp32": the model's output error
with only that op put back in fp32 (the {worst} worst quantized ops); "error removed": the
share of the quantized model's output error that this saves; "fidelity if fp32": the task
metric above with only that op in fp32.</p>
<h2>Falling back the worst ops</h2>
{fallback_chart or "<p>No quantized op to fall back.</p>"}
<h2>Activations of the worst ops</h2>
{histograms}
</body></html>
"""


def write_report(diagnosis: Diagnosis, folder: str | Path, worst: int) -> tuple[Path, Path]:
    """Write ``diagnosis.html`` and ``diagnosis.json`` into ``folder`` (atomically)."""
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    html_path, json_path = target / "diagnosis.html", target / "diagnosis.json"
    with atomic_write(html_path) as handle:
        handle.write(render_html(diagnosis, worst))
    write_json(json_path, diagnosis.to_json())
    return html_path, json_path
