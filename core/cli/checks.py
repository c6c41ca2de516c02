"""Checks the CLI runs before any work, so a mistake costs seconds, not a long fp32 pass.

Each check raises an :class:`lpq.LpqError` saying what to do, or warns
(:class:`lpq.LpqWarning`, printed as ``warning: ...``) where lpq can go on and says what it
did. The data probe runs the fp32 model on *one* batch of each data set: that is where
shapes, input names, a fixed batch size and the number of classes show, at the cost of a
single batch instead of a full pass.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, DataError, LpqError, LpqWarning

logger = logging.getLogger("lpq")

#: Metrics that read labels as class indices (top-k style): their labels must be whole
#: numbers in the model's class range.
CLASS_INDEX_METRICS = frozenset({"top1", "accuracy", "top5", "topk", "f1"})

#: Adaptor options core itself understands (whatever the adaptor).
CORE_OPTIONS = frozenset({"latency_aware", "backend", "backend_scheme", "capability_files"})


def refuse_overwrite(
    out: str | os.PathLike[str], reads: Mapping[str, str | None], force: bool
) -> None:
    """Refuse an output path that is a file this run reads (the fp32 model, the data).

    ``reads`` maps what a file is ("the model") to its path. Writing over the input would
    silently destroy the user's fp32 model, so it needs ``--force``.
    """
    from ..fileio import same_file

    if force:
        return
    for what, path in reads.items():
        if path and same_file(out, path):
            raise ConfigError(
                f"--out {out} is {what} ({path}): writing there would overwrite a file "
                "this run reads",
                hint="choose another --out, or pass --force to overwrite it anyway",
            )


def check_out_file(
    out: str | os.PathLike[str], reads: Mapping[str, str | None], force: bool
) -> None:
    """``--out`` is writable and not an input (see :func:`refuse_overwrite`)."""
    from ..fileio import check_writable

    refuse_overwrite(out, reads, force)
    check_writable(out, "--out")


def check_out_folder(folder: str | os.PathLike[str], what: str) -> None:
    """A folder lpq will write files into can be created and written."""
    from ..fileio import check_writable

    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise ConfigError(
            f"{what} {path} is a file, lpq needs a folder there",
            hint="pass a folder path (it is created if missing)",
        )
    check_writable(path / ".lpq-write-check", what)


def check_names(
    pm: Any,
    *,
    strategy: str | None = None,
    metric: str | None = None,
    backend: str | None = None,
    executor: str | None = None,
) -> None:
    """Every plugin-registered name the user typed exists (lists the installed ones)."""
    pm.load()
    if strategy is not None:
        pm.strategies.get_or_raise(strategy)
    if metric is not None:
        pm.metrics.get_or_raise(metric)
    if backend is not None:
        pm.backend_profiles.get_or_raise(backend)
    if executor is not None and executor != "auto":
        pm.executors.get_or_raise(executor)


def check_options(pm: Any, framework: str, options: Mapping[str, Any], backend: str | None) -> None:
    """Unknown ``--option`` keys are an error, where the adaptor lists the keys it reads.

    The set is the adaptor's :attr:`lpq.AdaptorInfo.known_options`, plus core's own keys
    and the backend profile's. An adaptor that lists none is not checked (its options
    cannot be known here).
    """
    if not options:
        return
    from ..config import check_adaptor_option_syntax

    check_adaptor_option_syntax(dict(options))  # a malformed key says so first
    info = pm.adaptor(framework)
    known = info.known_options
    if not known:
        logger.debug("the %s adaptor lists no options: --option keys not checked", framework)
        return
    allowed = set(known) | CORE_OPTIONS
    if backend:
        allowed |= set(pm.backend_profile(backend).options)
    unknown = sorted(key for key in options if key not in allowed)
    if unknown:
        raise ConfigError(
            f"unknown --option key(s) for the {framework} adaptor: {', '.join(unknown)}",
            hint="known: " + ", ".join(sorted(allowed)),
        )


def cap_workers(workers: int) -> int:
    """More workers than cores only makes trials fight for them: cap with a note."""
    cores = os.cpu_count() or 1
    if workers > cores:
        warnings.warn(
            f"--workers {workers} is more than this machine's {cores} CPU core(s): "
            f"running {cores} at a time",
            LpqWarning,
            stacklevel=2,
        )
        return cores
    return workers


def check_data_paths(*paths: str | None) -> None:
    """Every data file given exists and is a file (before the slower checks)."""
    for path in paths:
        if path is None:
            continue
        if Path(path).is_dir():
            raise DataError(
                f"{path} is a directory, lpq expected an .npz data file",
                hint="pass the .npz file (numpy.savez(path, input_name=array, labels=labels))",
            )
        if not Path(path).is_file():
            raise DataError(f"data file {path} does not exist", hint="check the path")


def check_calib(approach: str, calib: str | None) -> None:
    """Static and auto quantization calibrate activation ranges: they need --calib."""
    if calib is None and approach in ("static", "auto"):
        raise ConfigError(
            f"the {approach!r} approach quantizes activations with ranges calibrated on data, "
            "and no --calib was given",
            hint="pass --calib DATA.npz (one array per model input), or choose an approach "
            "that needs none: --approach dynamic or --approach weight_only",
        )


# ----------------------------------------------------------------------------- data probe


def _first_array(value: Any) -> np.ndarray | None:
    if isinstance(value, list | tuple):
        value = value[0] if value else None
    if isinstance(value, Mapping):
        value = next(iter(value.values()), None)
    return None if value is None else np.asarray(value)


def _one_batch(pm: Any, framework: str, model: Any, inputs: Any) -> Any:
    """The fp32 model's output on one batch of inputs."""
    from ..eval.data import OutputRecorder

    recorder = OutputRecorder()
    pm.evaluate(framework, model, [inputs], [recorder], iteration=1)
    return recorder.outputs[0] if recorder.outputs else None


def _named(exc: DataError, stage: str, loader: Any) -> DataError:
    """``exc`` saying which data set it is about (as the tuner's own passes do)."""
    from ..eval.watch import describe

    if exc.message.startswith(f"the {stage} data"):
        return exc
    held = describe(loader)
    named = DataError(
        f"the {stage} data{f' ({held})' if held else ''}: {exc.message}", hint=exc.hint
    )
    named.__cause__ = exc
    return named


def probe_data(
    pm: Any,
    framework: str,
    model: Any,
    loader: Any,
    stage: str,
    *,
    batch_given: bool,
) -> tuple[Any, Any]:
    """Run the fp32 model on the first batch of ``loader`` (an :class:`lpq.ArrayLoader`).

    Returns ``(loader, outputs)``: the loader re-batched to one sample when the model takes
    a fixed batch of 1 (with a warning; an error if ``--batch-size`` was given), and the
    model's outputs on that batch (``None`` when the adaptor failed in a way that is not
    the data's fault; the run then reports it as it always did).

    Says once when a single-array file's array name is not one of the model's input names
    and the array is fed to the model's only input by position.
    """
    from ..eval.data import ArrayLoader, head, split_batch

    if not isinstance(loader, ArrayLoader):
        return loader, None
    inputs = split_batch(next(iter(loader)))[0]
    source = loader.source or f"the {stage} data"
    try:
        names = getattr(loader, "names", None) or []
        if not isinstance(inputs, Mapping) and len(names) == 1:
            try:
                return loader, _one_batch(pm, framework, model, {names[0]: inputs})
            except DataError:
                pass  # not the model's input name: try by position below
            outputs = _one_batch(pm, framework, model, inputs)
            warnings.warn(
                f"{source}: the array {names[0]!r} is not named after a model input; lpq "
                "feeds it to the model's only input by position",
                LpqWarning,
                stacklevel=2,
            )
            return loader, outputs
        return loader, _one_batch(pm, framework, model, inputs)
    except DataError as exc:
        if loader.batch_size == 1 or _samples(inputs) <= 1:
            raise _named(exc, stage, loader) from None
        try:
            outputs = _one_batch(pm, framework, model, head(inputs))
        except Exception:
            raise _named(exc, stage, loader) from None
        if batch_given:
            raise DataError(
                f"the model takes a fixed batch of 1 sample, and --batch-size is "
                f"{loader.batch_size}",
                hint="pass --batch-size 1",
            ) from exc
        warnings.warn(
            f"the model takes a fixed batch of 1 sample: reading {source} one sample at a "
            "time (as --batch-size 1)",
            LpqWarning,
            stacklevel=2,
        )
        rebatched = ArrayLoader(loader.inputs, loader.labels, batch_size=1)
        rebatched.source = loader.source
        rebatched.names = getattr(loader, "names", None)
        return rebatched, outputs
    except LpqError:
        raise
    except Exception as exc:
        logger.debug("data probe skipped: %s", exc)
        return loader, None


def _samples(inputs: Any) -> int:
    first = _first_array(inputs)
    return int(first.shape[0]) if first is not None and first.ndim else 1


def check_labels(loader: Any, outputs: Any, metric: str | None) -> None:
    """Labels that a class-index metric would silently misread are an error.

    Float labels with fractions would be truncated to a class; a label outside the model's
    classes can never match, so the fp32 baseline reads 0 and every candidate "meets" it.
    Labels for other metrics (mse, cosine: target values) and one-hot labels are left alone.
    """
    labels = getattr(loader, "labels", None)
    if labels is None or (metric or "top1") not in CLASS_INDEX_METRICS:
        return
    labels = np.asarray(labels)
    scores = _first_array(outputs) if outputs is not None else None
    if scores is not None and labels.ndim == scores.ndim and labels.shape[1:] == scores.shape[1:]:
        return  # one-hot / reference outputs shaped like the predictions
    source = getattr(loader, "source", None) or "the evaluation data"
    name = metric or "top1"
    if labels.dtype.kind == "f":
        fractional = np.count_nonzero(labels != np.round(labels))
        if fractional:
            example = float(labels[labels != np.round(labels)].flat[0])
            raise DataError(
                f"{source}: {fractional} label(s) are not whole numbers (e.g. {example:g}), "
                f"but {name} reads labels as class indices",
                hint="save class indices as integers (labels.astype(numpy.int64)), or pick a "
                "metric for target values: --metric mse or --metric cosine",
            )
    elif labels.dtype.kind not in "iub":
        raise DataError(
            f"{source}: labels of dtype {labels.dtype} cannot be class indices for {name}",
            hint="save class indices as integers (labels.astype(numpy.int64))",
        )
    if scores is None or scores.ndim < 2 or labels.size == 0:
        return
    classes = int(scores.shape[-1])
    low, high = labels.min(), labels.max()
    if low < 0 or high >= classes:
        outside = int(np.count_nonzero((labels < 0) | (labels >= classes)))
        raise DataError(
            f"{source}: {outside} label(s) lie outside the model's {classes} classes (labels "
            f"run from {low:g} to {high:g}, the model scores classes 0 to {classes - 1})",
            hint="labels must be class indices 0..classes-1 of this model's output; check "
            "that the labels belong to this model (and are not 1-based)",
        )
