"""`lpq quantize` (one configuration) and `lpq tune` (accuracy-aware search).

CLI data are ``.npz`` files: one array per model input name (or a single array for a
single-input model) and an optional ``labels`` array. Without labels, `lpq tune` compares
with the fp32 model's outputs (top-1 agreement for class scores, else cosine similarity)
and says which it chose.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from ..errors import ConfigError
from .options import FIDELITY_METRIC, METRIC_OPTION, key_values, metric_with_options

_CALIB_HELP = (
    "Calibration data (.npz, one array per model input). Required for the static and auto "
    "approaches; dynamic and weight_only need none."
)
_OUT_HELP = (
    "Where to write the quantized model [default: MODEL-quantized.SUFFIX in the current "
    "folder, SUFFIX the adaptor's model suffix, e.g. model-quantized.onnx]."
)
_METRIC_HELP = (
    "How accuracy is scored. With labels in --eval: top1 / accuracy (a class index per "
    "sample, or per position of a sequence output), top5, f1 (macro F1), mse (labels are "
    "target values; lower is better), cosine (mean cosine similarity with the targets). "
    "Without labels, against the fp32 model's outputs: agreement (share of top-1 classes "
    "that match; chosen for class-score outputs of any shape), cosine (chosen otherwise) or "
    "mse. Plugins may register more (`lpq plugins list -v`). [default: top1 with labels, "
    "chosen as above without]"
)


_QUANT_OPTIONS = [
    click.option("--framework", help="Adaptor to use (default: detected from the model)."),
    click.option(
        "--approach",
        type=click.Choice(["auto", "static", "dynamic", "weight_only"]),
        default="auto",
        show_default=True,
        help="static: int8 activations with ranges calibrated on --calib (required); "
        "dynamic: activation ranges computed at run time, no --calib needed; weight_only: "
        "low-bit weights only (e.g. int4), no --calib needed for round-to-nearest; auto: "
        "static and dynamic where the adaptor offers them (needs --calib).",
    ),
    click.option(
        "--format",
        "quant_format",
        type=click.Choice(["default", "qdq", "qoperator"]),
        default="default",
        show_default=True,
        help="Quantized graph format.",
    ),
    click.option("--activation-dtype", help="Preferred activation dtype, e.g. uint8 or int8."),
    click.option("--weight-dtype", help="Preferred weight dtype, e.g. int8 or int4."),
    click.option("--algorithm", help="Preferred calibration algorithm: minmax, kl, percentile."),
    click.option(
        "--granularity",
        type=click.Choice(["per_channel", "per_tensor"]),
        help="Preferred weight granularity.",
    ),
    click.option("--exclude-op-type", multiple=True, help="Keep this op type in fp32 (repeat)."),
    click.option(
        "--exclude-op-name",
        multiple=True,
        help="Keep ops whose name matches this regular expression in fp32 (repeat).",
    ),
    click.option("--backend", help="Backend profile name (see the adaptor's docs)."),
    click.option(
        "--latency-aware/--no-latency-aware",
        default=None,
        help="Keep in fp32 what int8 makes slower on this machine (adaptors that measure "
        "it, e.g. onnxrt). Default: on for `quantize`, searched by `tune`.",
    ),
    click.option(
        "--capability",
        "capability_files",
        multiple=True,
        type=click.Path(dir_okay=False),
        help="Extra capability YAML merged into the adaptor's (e.g. int4 for an op type; "
        "repeat for several files). See docs/adding-a-data-type.md.",
    ),
    key_values(
        "--option",
        "adaptor_options",
        "An adaptor option for every trial, e.g. --option latency_batch_size=8 "
        "(repeat; the adaptor's docs list them; VALUE is read as YAML: 8, 0.5, true, text).",
    ),
    click.option(
        "--calib-size",
        type=click.IntRange(min=1),
        default=100,
        show_default=True,
        help="Calibration samples to read from --calib.",
    ),
    click.option(
        "--batch-size",
        type=click.IntRange(min=1),
        default=32,
        show_default=True,
        help="Batch size for reading .npz data; latency is reported per batch of this many "
        "samples.",
    ),
]


_FORCE = click.option(
    "--force",
    is_flag=True,
    help="Write --out even where it is a file this run reads (the model or its data), "
    "overwriting it.",
)


def _with_options(options: list[Any]) -> Any:
    def decorate(func: Any) -> Any:
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


def _build_config(kw: dict[str, Any], accuracy: Any = None, tuning: Any = None) -> Any:
    from ..config import PostTrainingQuantConfig

    defaults: dict[str, Any] = {}
    if kw.get("activation_dtype"):
        defaults.setdefault("activation", {})["dtype"] = [kw["activation_dtype"]]
    if kw.get("algorithm"):
        defaults.setdefault("activation", {})["algorithm"] = [kw["algorithm"]]
    if kw.get("weight_dtype"):
        defaults.setdefault("weight", {})["dtype"] = [kw["weight_dtype"]]
    if kw.get("granularity"):
        defaults.setdefault("weight", {})["granularity"] = [kw["granularity"]]
    extra: dict[str, Any] = {}
    if accuracy is not None:
        extra["accuracy_criterion"] = accuracy
    if tuning is not None:
        extra["tuning_criterion"] = tuning
    return PostTrainingQuantConfig(
        approach=kw["approach"],
        quant_format=kw["quant_format"],
        calibration_sampling_size=kw["calib_size"],
        op_type_dict={t: "fp32" for t in kw["exclude_op_type"]},
        op_name_dict={n: "fp32" for n in kw["exclude_op_name"]},
        op_defaults=defaults,
        backend=kw.get("backend"),
        framework=kw.get("framework"),
        capability_files=list(kw.get("capability_files") or ()),
        latency_aware=kw.get("latency_aware"),
        adaptor_options=dict(kw.get("adaptor_options") or {}),
        **extra,
    )


#: What a model file of a suffix is, for "X is a directory" messages.
_FILE_KINDS = {".onnx": "an ONNX model file", ".pt2": "a PyTorch .pt2 export file"}


def _model_arg(model: str) -> str:
    """The model path; one that is not a file may still name a model (an MXNet export's
    prefix, a SavedModel folder) if an installed adaptor recognises it. A folder named like
    a model file (``x.onnx/``) is said to be a folder, not a model in another form."""
    from ..errors import ModelError, NoAdaptorError
    from ..plugins.manager import get_plugin_manager

    path = Path(model)
    if path.is_dir():
        pm = get_plugin_manager()
        pm.load()
        suffixes = {suffix for info in pm.adaptors.values() for suffix in info.model_suffixes}
        suffix = next(
            (s for s in sorted(suffixes, key=len, reverse=True) if path.name.endswith(s)), None
        )
        if suffix is None and path.suffix in _FILE_KINDS:
            suffix = path.suffix
        if suffix is not None:
            kind = _FILE_KINDS.get(suffix, f"a {suffix} model file")
            raise ModelError(f"{model} is a directory, lpq expected {kind}", hint="check the path")
    if not path.exists():
        try:
            get_plugin_manager().detect_framework(model)
        except NoAdaptorError:
            raise ConfigError(f"model {model} does not exist", hint="check the path") from None
    return model


def _batch_given() -> bool:
    """Whether the user typed --batch-size (then lpq must not change it on its own)."""
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    return ctx is not None and ctx.get_parameter_source("batch_size") in (
        ParameterSource.COMMANDLINE,
        ParameterSource.ENVIRONMENT,
    )


def _save(result: Any, target: Path) -> Path:
    """Write the model; an OS failure (disk full, permissions) is a clear error."""
    from ..errors import ModelError

    try:
        written: Path = result.save(target)
    except OSError as exc:
        raise ModelError(
            f"cannot write the quantized model {target} ({exc.strerror or exc})",
            hint="choose another --out (a folder you can write to, with free space)",
        ) from exc
    return written


def _default_out(framework: str, model: str) -> Path:
    """``<name>-quantized<suffix>`` beside the current folder, where ``<name>`` is the
    model's file name without the adaptor's own suffix (``net-symbol.json`` -> ``net``)."""
    from ..plugins.manager import get_plugin_manager

    suffixes = get_plugin_manager().adaptor(framework).model_suffixes
    name = Path(model).name
    own = next((s for s in suffixes if name.endswith(s) and name != s), None)
    stem = name[: -len(own)] if own else Path(model).stem
    return Path(f"{stem}-quantized{suffixes[0] if suffixes else ''}")


@click.command("quantize")
@click.argument("model")
@click.option("--calib", type=click.Path(dir_okay=False), help=_CALIB_HELP)
@click.option("--out", type=click.Path(), help=_OUT_HELP)
@click.option(
    "--eval",
    "eval_data",
    type=click.Path(dir_okay=False),
    help="Held-out data (.npz) for the fidelity check. Without it, the last fifth of --calib "
    "is held out (and not calibrated on).",
)
@FIDELITY_METRIC
@METRIC_OPTION
@click.option(
    "--min-fidelity",
    type=click.FloatRange(min=0),
    help="Fail (exit 2, nothing written) when the fidelity is below this value.",
)
@click.option(
    "--no-fidelity-check", is_flag=True, help="Skip the held-out fidelity check (not advised)."
)
@_FORCE
@_with_options(_QUANT_OPTIONS)
def quantize_command(
    model: str,
    calib: str | None,
    out: str | None,
    eval_data: str | None,
    metric: str | None,
    metric_options: dict[str, Any],
    min_fidelity: float | None,
    no_fidelity_check: bool,
    force: bool,
    **kw: Any,
) -> None:
    """Quantize MODEL with one configuration (the adaptor's defaults plus your options),
    then check it: fidelity against the fp32 model on held-out samples, with a task metric,
    beside speedup and size.

    Use `lpq tune` to search for the fastest configuration that keeps an accuracy goal.
    Static and auto need --calib; an approach that cannot quantize anything here is an
    error, never an unquantized file. A fidelity below --min-fidelity is an error; below
    0.95 it is said plainly.
    """
    from ..api import quantize
    from ..errors import ModelError
    from ..eval.data import load_npz
    from ..eval.fidelity import measure_fidelity
    from ..plugins.manager import get_plugin_manager
    from ..tuning.runner import op_counts
    from .checks import (
        check_calib,
        check_data_paths,
        check_names,
        check_options,
        check_out_file,
        probe_data,
    )
    from .console import make_console, stage_lines

    console = make_console()
    pm = get_plugin_manager()
    model = _model_arg(model)
    framework = kw.get("framework") or pm.detect_framework(model)
    kw["framework"] = framework
    check_names(pm, backend=kw.get("backend"), metric=metric)
    metric_with_options(pm, metric, metric_options)  # a wrong option fails here
    check_data_paths(calib, eval_data)
    check_calib(kw["approach"], calib)
    check_options(pm, framework, kw.get("adaptor_options") or {}, kw.get("backend"))
    target = Path(out) if out else _default_out(framework, model)
    check_out_file(
        target, {"the model": model, "the --calib data": calib, "the --eval data": eval_data}, force
    )
    calib_data = load_npz(calib, kw["batch_size"]) if calib else None
    if calib_data is not None:
        calib_data, _ = probe_data(
            pm, framework, model, calib_data, "calibration", batch_given=_batch_given()
        )
    held_out, held_out_from = None, ""
    if not no_fidelity_check:
        calib_data, held_out, held_out_from = _held_out(
            pm, framework, model, calib_data, eval_data, kw
        )
    _progress(console, "quantizing")
    with stage_lines(console):
        result = quantize(model, _build_config(kw), calib_data)
    quantized, fallback, source, _ = op_counts(
        result.framework, result.model, result.tune_cfg, result.quantized_ops
    )
    counted = "read from the model" if source == "model" else "as planned; the adaptor cannot say"
    _refuse_unquantized(result, quantized, source)
    fidelity = None
    if held_out is not None:
        _progress(console, f"measuring fidelity on {held_out.num_samples} held-out samples")
        fidelity = measure_fidelity(
            pm,
            framework,
            model,
            result.model,
            held_out,
            held_out_from=held_out_from,
            metric=metric,
            metric_options=metric_options,
            timing_batch=_latency_batch(kw.get("adaptor_options") or {}),
        )
        if min_fidelity is not None and fidelity.value < min_fidelity:
            raise ModelError(
                f"fidelity {fidelity.value:.3f} ({fidelity.metric} against fp32 on "
                f"{fidelity.samples} held-out samples) is below --min-fidelity {min_fidelity:g}: "
                "nothing written",
                hint="try `lpq tune` with this model and data, which keeps ops that lose "
                "accuracy in float, or another --approach / --backend",
            )
    written = _save(result, target)
    console.print(
        f"quantized {quantized} of {quantized + fallback} ops ({counted}; {result.framework}); "
        f"wrote {written}"
    )
    if fidelity is not None:
        _print_fidelity(console, fidelity, model, written)


def _latency_batch(options: dict[str, Any]) -> int:
    """The batch latency-aware decisions are timed at (``latency_batch_size``, else one
    sample): the fidelity check reports speed at the same batch."""
    try:
        return max(1, int(options.get("latency_batch_size") or 1))
    except (TypeError, ValueError):
        return 1  # the adaptor rejects the option itself, with its own message


def _progress(console: Any, what: str) -> None:
    """A progress line, also when stdout is a file or a pipe (rich prints nothing
    animated there)."""
    console.print(f"[dim]lpq: {what}...[/]")


def _held_out(
    pm: Any, framework: str, model: str, calib_data: Any, eval_data: str | None, kw: dict[str, Any]
) -> tuple[Any, Any, str]:
    """``(calibration, held-out, where from)``: ``--eval`` if given, else the last fifth of
    the calibration samples (which then do not calibrate)."""
    from ..eval.data import load_npz
    from ..eval.fidelity import HELD_OUT_SHARE, split_held_out
    from .checks import probe_data

    if eval_data:
        held = load_npz(eval_data, kw["batch_size"])
        held, _ = probe_data(pm, framework, model, held, "evaluation", batch_given=_batch_given())
        return calib_data, held, f"--eval ({held.num_samples} samples)"
    if calib_data is None:
        return None, None, ""  # dynamic / weight-only without data: nothing to check on
    calib_part, held = split_held_out(calib_data)
    share = f"{HELD_OUT_SHARE:.0%}"
    return (
        calib_part,
        held,
        (
            f"the last {held.num_samples} of {calib_data.num_samples} --calib samples "
            f"({share}, not calibrated on)"
        ),
    )


def _refuse_unquantized(result: Any, quantized: int, source: str) -> None:
    """A model whose converted graph runs every op in float is no quantized model: an
    error, never a file written with exit 0."""
    from ..errors import ModelError

    if quantized or source != "model":
        return
    asked = result.requested_tune_cfg or result.tune_cfg  # before the adaptor's decisions
    planned = len(asked.quantized_ops())
    if planned:
        raise ModelError(
            f"the configuration quantizes {planned} op(s), but the converted model runs all "
            f"of them in float (the {result.framework} adaptor left them: on this CPU none "
            "was faster quantized, or its kernels refused them): nothing written",
            hint="pass --option latency_aware=false to keep int8 ops slower than float, or "
            "see the adaptor's documentation for when it leaves ops in float",
        )
    raise ModelError(
        "no op was quantized with these options: nothing written",
        hint=f"`lpq capability show {result.framework}` lists what each op type supports",
    )


#: The fidelity check's speed ratio under which ``lpq quantize`` warns that the model it
#: wrote is slower than fp32 (below 1 by more than that short timing's noise).
SLOWER_WARN_BELOW = 0.95


def _print_fidelity(console: Any, fidelity: Any, model: str, written: Path) -> None:
    """Fidelity beside speedup and size; below the warning bound, said plainly."""
    from ..eval.fidelity import DEFAULT_WARN_BELOW

    speed = "speed not measured"
    if fidelity.speedup:
        batch = f" (batch {fidelity.timed_batch})" if fidelity.timed_batch else ""
        speed = f"{fidelity.speedup:.2f}x fp32 speed{batch}"
    size = ""
    try:
        before, after = Path(model).stat().st_size, written.stat().st_size
        if after and Path(model).is_file():
            ratio = before / after
            size = f", {ratio:.2f}x smaller" if ratio >= 1 else f", {1 / ratio:.2f}x larger"
    except OSError:
        pass
    color = "green" if fidelity.value >= DEFAULT_WARN_BELOW else "yellow"
    console.print(
        f"fidelity [{color}]{fidelity.value:.3f}[/] ({fidelity.metric} against fp32 on "
        f"{fidelity.held_out_from}); {speed}{size}"
    )
    console.print(f"  ({fidelity.metric}: {fidelity.reason})")
    if fidelity.speedup is not None and fidelity.speedup < SLOWER_WARN_BELOW:
        console.print(
            f"[yellow]warning[/]: the written model ran {1 / fidelity.speedup:.2f}x slower "
            "than fp32 in this check: on this CPU int8 does not pay for this model (small "
            "models and models with many float ops gain little). Time it where it will be "
            "served, or keep the fp32 model."
        )
    if fidelity.value < DEFAULT_WARN_BELOW:
        console.print(
            f"[yellow]warning[/]: fidelity {fidelity.value:.3f} is below "
            f"{DEFAULT_WARN_BELOW}: this model no longer does much of what the fp32 model "
            "does. `lpq tune` keeps the ops that lose it in float; --min-fidelity makes this "
            "an error."
        )


@click.command("tune")
@click.argument("model", required=False)
@click.option("--example", help="Run a built-in example instead of MODEL (e.g. digits).")
@click.option("--calib", type=click.Path(dir_okay=False), help=_CALIB_HELP)
@click.option(
    "--eval",
    "eval_data",
    type=click.Path(dir_okay=False),
    help="Evaluation data (.npz), always required: accuracy is measured on it, against its "
    "'labels' array or, without one, against the fp32 model's outputs.",
)
@click.option("--metric", help=_METRIC_HELP)
@METRIC_OPTION
@click.option(
    "--tolerable-loss",
    type=float,
    default=0.01,
    show_default=True,
    help="Accuracy loss allowed against fp32: relative (0.01 = 1% of the fp32 score, below "
    "1), or in the metric's own units with --absolute.",
)
@click.option("--absolute", is_flag=True, help="Tolerable loss is absolute, in metric units.")
@click.option(
    "--strategy",
    default="auto",
    show_default=True,
    help="auto, basic, conservative, mse, exhaustive, random, or a plugin's "
    "(docs/tuning.md compares them).",
)
@key_values(
    "--strategy-option",
    "strategy_options",
    "An option of the strategy, e.g. --strategy-option fallback_rate=0.3 for random "
    "(repeat; VALUE is read as YAML; the strategy's docs list its options).",
)
@click.option(
    "--max-trials",
    type=click.IntRange(min=1),
    default=50,
    show_default=True,
    help="Most trials to run; a trial quantizes and evaluates one configuration. Re-running "
    "with a larger value continues the same run.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=0,
    help="A limit in seconds (0: none): no trial starts that the trials so far say cannot "
    "finish inside it, and trials still running at the limit are stopped (not recorded: "
    "re-running with a larger --timeout resumes and runs them).",
)
@click.option(
    "--objective",
    type=click.Choice(["performance", "modelsize", "footprint"]),
    default="performance",
    show_default=True,
    help="What 'best' means among configs that meet the accuracy goal: performance = lowest "
    "latency (a candidate slower than fp32 never meets the goal), modelsize = smallest "
    "saved model, footprint = lowest peak memory while evaluating.",
)
@click.option(
    "--exit-policy",
    type=click.Choice(["first_hit", "best"]),
    default="first_hit",
    show_default=True,
    help="Stop at the first config meeting the goal, or search the budget for the best objective.",
)
@click.option(
    "--workspace",
    type=click.Path(file_okay=False),
    default="lpq-workspace",
    show_default=True,
    help="History folder; re-running the same command resumes from it.",
)
@click.option(
    "--seed",
    type=int,
    default=1978,
    show_default=True,
    help="Seed of the strategy's random choices: the same seed proposes the same trials, "
    "which is what lets a re-run resume.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Trials run at once (a strategy's independent candidates; latency is still "
    "measured with the machine to itself).",
)
@click.option(
    "--executor",
    default="auto",
    show_default=True,
    help="How trials run: auto (serial for 1 worker, else process), serial, process "
    "(local worker processes), ray, or a plugin's.",
)
@click.option(
    "--ray-address",
    help="Join a running Ray cluster (e.g. ray://head:10001); implies --executor ray. "
    "Without it, --executor ray starts a local Ray on 127.0.0.1.",
)
@click.option("--out", type=click.Path(), help=_OUT_HELP)
@_FORCE
@_with_options(_QUANT_OPTIONS)
def tune_command(
    model: str | None,
    example: str | None,
    calib: str | None,
    eval_data: str | None,
    metric: str | None,
    metric_options: dict[str, Any],
    tolerable_loss: float,
    absolute: bool,
    strategy: str,
    strategy_options: dict[str, Any],
    max_trials: int,
    timeout: float,
    objective: str,
    exit_policy: str,
    workspace: str,
    seed: int,
    workers: int,
    executor: str,
    ray_address: str | None,
    out: str | None,
    force: bool,
    **kw: Any,
) -> None:
    """Find the fastest quantized MODEL whose accuracy stays within the tolerable loss.

    Needs --eval (accuracy is measured on it) and, for the static and auto approaches,
    --calib. Writes the chosen model (--out), and history.json, summary.json and an
    accuracy-vs-latency plot into the workspace. Ctrl-C stops; re-running resumes.
    """
    from ..config import AccuracyCriterion, TuningCriterion
    from ..eval.data import load_npz
    from ..plugins.manager import get_plugin_manager
    from ..tuning.lock import workspace_lock
    from .checks import (
        cap_workers,
        check_calib,
        check_data_paths,
        check_labels,
        check_names,
        check_options,
        check_out_file,
        check_out_folder,
        probe_data,
    )

    pm = get_plugin_manager()
    example_name = None
    if example:
        if model or calib or eval_data:
            raise ConfigError("--example runs a built-in example; don't pass MODEL/--calib/--eval")
        chosen = pm.example(example)
        model, calib, eval_data = str(chosen.model), str(chosen.calib), str(chosen.eval)
        metric = metric or chosen.metric
        kw["framework"] = kw.get("framework") or chosen.framework
        example_name = f"{example}-quantized{chosen.model.suffix}"
    if not model:
        raise ConfigError(
            "give a MODEL to tune, or --example NAME",
            hint="e.g. lpq tune model.onnx --calib calib.npz --eval eval.npz",
        )
    if not eval_data:
        raise ConfigError(
            "lpq tune needs --eval DATA to measure accuracy",
            hint="use `lpq quantize` for one configuration without tuning",
        )
    if not absolute and tolerable_loss >= 1:
        raise ConfigError(
            f"a relative tolerable loss must be below 1 (100%), not {tolerable_loss:g}",
            hint="0.01 means 1%; add --absolute for a loss in the metric's own units",
        )
    # Everything that can be checked without running the model, before any work.
    model = _model_arg(model)
    executor = "ray" if ray_address else executor
    check_names(pm, strategy=strategy, metric=metric, backend=kw.get("backend"), executor=executor)
    scorer = metric_with_options(pm, metric, metric_options)
    pm.create_strategy(strategy, **strategy_options)  # its options are checked now, not later
    framework = kw.get("framework") or pm.detect_framework(model)
    kw["framework"] = framework
    check_data_paths(calib, eval_data)
    check_calib(kw["approach"], calib)
    check_options(pm, framework, kw.get("adaptor_options") or {}, kw.get("backend"))
    workers = cap_workers(workers)
    reads = {"the model": model, "the --calib data": calib, "the --eval data": eval_data}
    check_out_folder(workspace, "--workspace")
    target = Path(out) if out else None
    if target is None and example_name is None:
        target = _default_out(framework, model)
    if target is not None:
        check_out_file(target, reads, force)
    config = _build_config(
        kw,
        AccuracyCriterion(
            tolerable_loss=tolerable_loss, criterion="absolute" if absolute else "relative"
        ),
        TuningCriterion(
            strategy=strategy,
            strategy_options=strategy_options,
            max_trials=max_trials,
            timeout=timeout,
            objective=objective,  # type: ignore[arg-type]
            exit_policy=exit_policy,  # type: ignore[arg-type]
            seed=seed,
            workers=workers,
            executor=executor,
            executor_options={"address": ray_address} if ray_address else {},
        ),
    )
    with workspace_lock(workspace):
        batch_given = _batch_given()
        calib_data = load_npz(calib, kw["batch_size"]) if calib else None
        eval_loader = load_npz(eval_data, kw["batch_size"])
        # One batch through the fp32 model: shapes, names, a fixed batch, the class count.
        if calib_data is not None:
            calib_data, _ = probe_data(
                pm, framework, model, calib_data, "calibration", batch_given=batch_given
            )
        eval_loader, outputs = probe_data(
            pm, framework, model, eval_loader, "evaluation", batch_given=batch_given
        )
        check_labels(eval_loader, outputs, metric)
        _run_tuning(
            model, config, calib_data, eval_loader, scorer or metric, workspace, target,
            example_name,
        )  # fmt: skip


def _run_tuning(
    model: str,
    config: Any,
    calib: Any,
    eval_loader: Any,
    metric: Any,
    workspace: str,
    target: Path | None,
    default_name: str | None = None,
) -> None:
    """Tune, then write the model, summary and plot. Without ``target`` the model goes into
    the run folder as ``default_name``: one run, one folder (history, summary, plot, model).
    ``metric``: a metric name, or the metric object ``--metric-option`` made.
    """
    from ..api import fit
    from ..fileio import write_json
    from .console import make_console, print_table, run_progress
    from .report import summary_lines, trials_table, write_plot

    console = make_console()
    console.print(
        f"[bold]lpq tune[/] {model} (strategy {config.tuning_criterion.strategy}, "
        f"tolerable loss {config.accuracy_criterion.tolerable_loss:g} "
        f"{config.accuracy_criterion.criterion})"
    )
    started = time.time()
    with run_progress(console, config.tuning_criterion.max_trials) as advance:

        def on_trial(record: Any) -> None:
            status = "meets goal" if record.meets_goal else (record.error or "misses goal")
            advance(f"#{record.index} {record.stage}: {record.accuracy:.4f} ({status})")
            console.print(
                f"  trial {record.index:>2} {record.stage:<28} accuracy "
                f"{record.accuracy:.4f}  {'goal met' if record.meets_goal else ''}"
                f"{' (resumed)' if record.resumed else ''}"
            )

        try:
            result = fit(
                model,
                config,
                calib,
                eval_dataloader=eval_loader,
                eval_metric=metric,
                workspace=workspace,
                on_trial=on_trial,
            )
        except KeyboardInterrupt:
            console.print(f"[yellow]interrupted[/]: {_saved_history(workspace, started)}")
            raise SystemExit(130) from None

    print_table(
        console,
        trials_table(result.baseline, result.trials, result.best.index, result.latency_batch_size),
    )
    folder = result.history_path.parent if result.history_path else Path(workspace)
    if target is None:
        target = folder / (default_name or _default_out(result.framework, model).name)
    written = _save(result, target)
    summary = {**result.summary(), "model": str(written), "tune_cfg": result.tune_cfg.to_json()}
    write_json(folder / "summary.json", summary)
    plotted = write_plot(
        folder / "accuracy_vs_latency.svg",
        result.baseline,
        result.trials,
        result.best.index,
        goal=_goal_accuracy(config, result.baseline.accuracy, result.higher_is_better),
        batch_size=result.latency_batch_size,
    )
    for line in summary_lines(summary):
        console.print(line)
    console.print(f"run folder: {folder}")
    console.print(f"quantized model: {written}")
    console.print(
        f"summary: {folder / 'summary.json'}"
        + (f"; plot: {folder / 'accuracy_vs_latency.svg'}" if plotted else "")
    )


def _goal_accuracy(config: Any, baseline: float, higher_is_better: bool) -> float:
    """The accuracy a candidate needs to meet the goal (the plot's goal line)."""
    criterion = config.accuracy_criterion
    margin = criterion.tolerable_loss * (abs(baseline) if criterion.criterion == "relative" else 1)
    return baseline - margin if higher_is_better else baseline + margin


def _saved_history(workspace: str, started: float) -> str:
    """What an interrupted run left behind: say trials are saved only where they are."""
    for history in sorted(Path(workspace).glob("*/history.json")):
        if history.stat().st_mtime < started:
            continue
        try:
            data = json.loads(history.read_text())
            trials = len(data["trials"]) if isinstance(data, dict) else 0
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if trials:
            return (
                f"{trials} finished trial(s) are saved in {history}; run the same command "
                "again to resume"
            )
    return "no trial had finished, so nothing was saved; run the same command again to start"
