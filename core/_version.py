"""The lpq-core version, read by plugins' compatibility checks and `lpq --version`."""

__version__ = "0.2.0"
