"""`lpq diagnose`: where a quantized model loses accuracy, op by op."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..errors import ConfigError
from .options import FIDELITY_METRIC, METRIC_OPTION, metric_with_options


@click.command("diagnose")
@click.argument("model", required=False)
@click.option(
    "--data",
    type=click.Path(dir_okay=False),
    required=True,
    help="Data to run both models on (.npz, one array per model input; labels not needed).",
)
@click.option(
    "--quantized",
    type=click.Path(),
    help="The quantized model (as `lpq quantize` / `lpq tune` wrote it) [default: with "
    "--workspace, the model the run saved; else MODEL quantized with lpq's defaults].",
)
@click.option(
    "--workspace",
    type=click.Path(file_okay=False),
    help="Diagnose the chosen configuration of this `lpq tune` workspace (MODEL, framework "
    "and configuration are read from its history).",
)
@click.option("--run", help="With --workspace: the run folder's name [default: the latest].")
@click.option(
    "--calib",
    type=click.Path(dir_okay=False),
    help="Calibration data for re-quantizing (.npz) [default: --data].",
)
@click.option("--framework", help="Adaptor to use [default: detected from MODEL].")
@click.option(
    "--worst",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="Fall back each of this many worst quantized ops, one at a time, and measure the "
    "model's output error again.",
)
@click.option(
    "--batches",
    type=click.IntRange(min=1),
    help="Batches of --data to run [default: all].",
)
@click.option(
    "--batch-size", type=click.IntRange(min=1), default=32, show_default=True, help="Batch size."
)
@FIDELITY_METRIC
@METRIC_OPTION
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    help="Folder for diagnosis.html and diagnosis.json [default: <run folder>/diagnosis with "
    "--workspace, else lpq-diagnosis].",
)
def diagnose_command(
    model: str | None,
    data: str,
    quantized: str | None,
    workspace: str | None,
    run: str | None,
    calib: str | None,
    framework: str | None,
    worst: int,
    batches: int | None,
    batch_size: int,
    metric: str | None,
    metric_options: dict[str, Any],
    out: str | None,
) -> None:
    """Rank MODEL's ops by quantization error and measure what falling back each is worth.

    Compares every quantizable op's output in the fp32 and the quantized model on --data
    (with its type, the precision it runs in and its scheme), then puts each of the
    --worst quantized ops back in fp32 alone and measures the model output again, with
    the same task metric as `lpq quantize`'s fidelity check (chosen from the outputs, or
    --metric). Writes an HTML report with charts and the same numbers as JSON.
    """
    from ..diagnose import diagnose, tuned_run, write_report
    from ..eval.data import load_npz
    from ..plugins.manager import get_plugin_manager
    from .console import make_console, print_table, table

    pm = get_plugin_manager()
    # A wrong metric name or option, or an option without --metric, fails before any work.
    if metric is not None and not metric_options:
        pm.create_metric(metric)
    metric_with_options(pm, metric, metric_options)
    tune_cfg = None
    source = ""
    folder = Path(out) if out else Path("lpq-diagnosis")
    if workspace:
        tuned = tuned_run(workspace, run)
        model = model or tuned.model
        framework = framework or tuned.framework
        tune_cfg = tuned.tune_cfg
        source = f"trial {tuned.trial}, the configuration chosen by the run in {tuned.folder}"
        quantized = quantized or (str(tuned.quantized) if tuned.quantized else None)
        folder = Path(out) if out else tuned.folder / "diagnosis"
    if not model:
        raise ConfigError(
            "give the fp32 MODEL, or --workspace of an `lpq tune` run",
            hint="e.g. lpq diagnose model.onnx --quantized model-int8.onnx --data eval.npz",
        )
    if not Path(model).exists():
        raise ConfigError(f"model {model} does not exist", hint="check the path")
    from .checks import check_data_paths, check_out_folder

    check_data_paths(data, calib)
    check_out_folder(folder, "--out")
    framework = framework or pm.detect_framework(model)
    qmodel: Any = pm.load_model(framework, quantized) if quantized else None
    console = make_console()
    console.print(f"[bold]lpq diagnose[/] {model}" + (f" vs {quantized}" if quantized else ""))
    result = diagnose(
        model,
        load_npz(data, batch_size),
        quantized=qmodel,
        tune_cfg=tune_cfg,
        calib=load_npz(calib, batch_size) if calib else None,
        framework=framework,
        worst=worst,
        batches=batches,
        config_source=source,
        quantized_label=quantized or "",
        metric=metric,
        metric_options=metric_options,
    )
    agreement = f", top-1 agreement {result.agreement:.4f}" if result.agreement is not None else ""
    console.print(f"model output: relative error {result.output_error:.4g}{agreement}")
    if result.fidelity is not None:
        console.print(
            f"fidelity {result.fidelity:.4f} ({result.metric} against fp32: {result.metric_reason})"
        )
    if (
        result.fallback_base_fidelity is not None
        and result.fallback_base_fidelity != result.fidelity
    ):
        console.print(
            f"fallbacks are measured from the model re-quantized with its configuration: "
            f"fidelity {result.fallback_base_fidelity:.4f} (see the note below)"
        )
    if_fp32 = f"if fp32: {result.metric}"
    shown = table(
        "ops by the error they add (worst first); 'removes': share of the output error "
        f"that falling the op back to fp32 removes; '{if_fp32}': the model's fidelity then",
        [
            "#",
            "op",
            "type",
            "runs in",
            "error added",
            "relative error",
            "if fp32: removes",
            if_fp32,
        ],
        right=("#", "error added", "relative error", "if fp32: removes", if_fp32),
    )
    for rank, op in enumerate(result.ops[: max(worst, 10)], start=1):
        shown.add_row(
            str(rank),
            op.name,
            op.op_type,
            op.precision,
            f"{op.added_error:.4g}",
            f"{op.relative_error:.4g}",
            f"{op.fallback.gain * 100:.0f}%" if op.fallback else "",
            _value(op.fallback.fidelity) if op.fallback else "",
        )
    print_table(console, shown)
    for note in result.notes:
        console.print(f"note: {note}")
    html, json_path = write_report(result, folder, worst)
    console.print(f"report: {html}; data: {json_path}")


def _value(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"
