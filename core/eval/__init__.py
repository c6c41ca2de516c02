"""Measuring a model: data handling, metrics, evaluation loops and latency."""
