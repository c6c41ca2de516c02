"""Importing MXNet, with an lpq error that says what to install when it cannot be imported.

MXNet 1.9 (its last release) imports only with numpy < 1.24: it uses ``np.bool``, which
numpy 1.24 removed. Importing it under a newer numpy fails half-way with an
``AttributeError`` and leaves a broken ``mxnet`` package in ``sys.modules``, so the numpy
version is checked *before* the import is attempted.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lpq

from .info import INSTALL_HINT

_mx: Any = None


def numpy_too_new(version: str) -> bool:
    """True when numpy ``version`` is one MXNet 1.x cannot be imported with (>= 1.24)."""
    parts = version.split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return False
    return (major, minor) >= (1, 24)


def mxnet() -> Any:
    """The ``mxnet`` module, imported on first use.

    :raises lpq.PluginError: MXNet is not installed, or numpy is too new for it.
    """
    global _mx
    if _mx is not None:
        return _mx
    import numpy

    installed = lpq.installed_version("mxnet")
    if installed is not None and installed.startswith("1.") and numpy_too_new(numpy.__version__):
        raise lpq.PluginError(
            f"MXNet {installed} cannot be imported with numpy {numpy.__version__} "
            "(it needs numpy<1.24)",
            hint=INSTALL_HINT,
        )
    # Quiet MXNet's per-graph "Subgraph backend MKLDNN is activated" log lines.
    os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")
    try:
        import mxnet as mx
    except ImportError as exc:
        raise lpq.PluginError(
            f"the MXNet adaptor needs MXNet, which cannot be imported here ({exc})",
            hint=INSTALL_HINT,
        ) from exc
    except AttributeError as exc:  # e.g. np.bool under a numpy this check did not foresee
        raise lpq.PluginError(
            f"MXNet fails to import with numpy {numpy.__version__}: {exc}", hint=INSTALL_HINT
        ) from exc
    _mx = mx
    return mx


@contextmanager
def quiet() -> Iterator[None]:
    """Hide MXNet's harmless warning about graph inputs of unknown type, which every
    SymbolBlock built from a symbol emits."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Cannot decide type", category=UserWarning)
        yield
