"""`lpq quantize` and `lpq tune` (filled in with the tuning engine)."""

from __future__ import annotations

import click


@click.command("quantize")
def quantize_command() -> None:
    """Quantize a model with one configuration (no tuning)."""
    raise click.UsageError("not available yet")


@click.command("tune")
def tune_command() -> None:
    """Find the fastest quantized model within an accuracy tolerance."""
    raise click.UsageError("not available yet")
