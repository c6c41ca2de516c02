"""Terminal output shared by the commands: consoles, tables that never cut names, and
progress for long runs (every trial, and the data passes inside the fp32 baseline and
calibration)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: Wider than any table lpq prints; only bounds the measurement.
_UNBOUNDED = 100_000


def make_console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def table(title: str, columns: list[str], right: tuple[str, ...] = ()) -> Any:
    """A table whose cells wrap (fold) instead of being cut with an ellipsis."""
    from rich.table import Table

    result = Table(title=title)
    for column in columns:
        result.add_column(column, overflow="fold", justify="right" if column in right else "left")
    return result


def print_table(console: Any, rendered: Any) -> None:
    """Print a table whole. On a terminal long cells wrap; piped (no terminal width to
    respect) the output is as wide as the table needs, so names stay on one line."""
    from rich.measure import Measurement

    if console.is_terminal:
        console.print(rendered)
        return
    needed = Measurement.get(console, console.options.update(max_width=_UNBOUNDED), rendered)
    saved = console.width
    console.width = max(saved, needed.maximum)
    try:
        console.print(rendered)
    finally:
        console.width = saved


class _ConsoleLog(logging.Handler):
    """Shows lpq's INFO messages (stages of a run) as dim lines on the console."""

    def __init__(self, console: Any) -> None:
        super().__init__(logging.INFO)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        self.console.print(f"[dim]{record.getMessage()}[/]")


@contextmanager
def run_progress(console: Any, total_trials: int) -> Iterator[Callable[[str], None]]:
    """A live display for ``lpq tune``: a bar over trials and, below it, the data pass in
    progress (fp32 outputs, evaluation, calibration, latency) with samples read. Yields
    ``advance(description)``, to call after each trial. The live part shows on a terminal
    only; piped, the stage lines lpq logs say what is happening."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from ..eval.watch import listening

    progress = Progress(
        TextColumn("{task.fields[label]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        console=console,
        transient=True,
    )
    trials = progress.add_task("", total=total_trials, label="trials")
    data = progress.add_task("", total=None, label="data", visible=False)

    def on_data(stage: str, done: int, expected: int | None) -> None:
        progress.update(
            data,
            completed=done,
            total=expected,
            description=f"{stage} samples",
            visible=True,
        )

    def advance(description: str) -> None:
        progress.update(trials, advance=1, description=description)
        progress.update(data, visible=False)

    with stage_lines(console), progress, listening(on_data):
        yield advance


def _plugin_packages() -> list[str]:
    """The top-level packages of the installed plugins (``lpq_onnxrt``, ...), whose
    modules log the stages of their own work (calibration, latency decisions)."""
    from ..plugins.manager import get_plugin_manager

    packages = {
        record.entry_point.partition(":")[0].split(".")[0]
        for record in get_plugin_manager().records()
        if record.entry_point
    }
    return sorted(packages)


@contextmanager
def stage_lines(console: Any) -> Iterator[None]:
    """Print the INFO lines of lpq and of its plugins (the stages of a run) on ``console``
    for the block, also when output is a file or a pipe."""
    handler = _ConsoleLog(console)
    loggers = [logging.getLogger(name) for name in ["lpq", *_plugin_packages()]]
    saved = [(logger.level, logger.propagate) for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        # once on the console: a root handler (a library's basicConfig) would print it again
        logger.propagate = False
    try:
        yield
    finally:
        for logger, (level, propagate) in zip(loggers, saved):
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate
