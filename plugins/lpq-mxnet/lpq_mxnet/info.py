"""What lpq knows about the MXNet adaptor before MXNet is imported.

A leaf module: the framework name, the distribution that provides MXNet, the capability
file, the layout of exported models on disk and the sniffing that recognises an MXNet
model. It imports nothing of ``lpq_mxnet`` and never imports MXNet, so registration and
detection (``lpq plugins list``, ``lpq_detect_framework``) stay cheap; every other module
may import it.

Exported models are what ``HybridBlock.export(PREFIX, epoch)`` writes and what lpq-mxnet
saves: ``PREFIX-symbol.json`` + ``PREFIX-NNNN.params`` (plus ``PREFIX-lpq.json`` with the
tune_cfg). Users may name the symbol file, the params file or the bare prefix.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

FRAMEWORK = "mxnet"
#: The distribution that provides the ``mxnet`` package.
DISTRIBUTION = "mxnet"
#: What to run in a fresh environment to get a working MXNet for this adaptor.
INSTALL_HINT = (
    "install MXNet in its own virtual environment: pip install 'lpq-mxnet[mxnet]' "
    "(mxnet 1.9.1 with numpy<1.24; it cannot share an environment with numpy 2)"
)
#: Attribute holding the ``ModelInfo`` of the blocks lpq-mxnet returns (see
#: :mod:`lpq_mxnet.model_io`).
INFO_ATTR = "lpq_mxnet"

SYMBOL_SUFFIX = "-symbol.json"
PARAMS_SUFFIX = ".params"
META_SUFFIX = "-lpq.json"
#: MXNet's NDArray-list file magic (``kMXAPINDArrayListMagic``), a little-endian uint64.
_PARAMS_MAGIC = (0x112).to_bytes(8, "little")
_EPOCH_PARAMS = re.compile(r"^(?P<stem>.+)-(?P<epoch>\d{4,})\.params$")


@dataclass(frozen=True)
class Export:
    """The files of one exported model; ``params`` is ``None`` when none was found."""

    prefix: Path
    symbol: Path
    params: Path | None

    @property
    def meta(self) -> Path:
        """Where lpq-mxnet keeps the tune_cfg and input names of a model it saved."""
        return meta_path(self.prefix)


def meta_path(prefix: Path) -> Path:
    return prefix.with_name(prefix.name + META_SUFFIX)


def symbol_path(prefix: Path) -> Path:
    return prefix.with_name(prefix.name + SYMBOL_SUFFIX)


def params_path(prefix: Path, epoch: int = 0) -> Path:
    return prefix.with_name(f"{prefix.name}-{epoch:04d}{PARAMS_SUFFIX}")


def prefix_of(path: Path) -> Path:
    """The export prefix a path names: strip ``-symbol.json``, ``-NNNN.params`` or
    lpq-mxnet's metadata suffix; any other path is taken as the prefix itself."""
    name = path.name
    for suffix in (SYMBOL_SUFFIX, META_SUFFIX):
        if name.endswith(suffix) and len(name) > len(suffix):
            return path.with_name(name[: -len(suffix)])
    match = _EPOCH_PARAMS.match(name)
    if match:
        return path.with_name(match["stem"])
    return path


def find_export(path: str | Path) -> Export | None:
    """The export ``path`` names (symbol file, params file or prefix), or ``None`` when
    there is no MXNet symbol file there. Never raises for odd paths."""
    try:
        given = Path(path)
        prefix = prefix_of(given)
        symbol = symbol_path(prefix)
        if not _is_symbol_file(symbol):
            return None
        if given.name.endswith(PARAMS_SUFFIX):
            params: Path | None = given if is_params_file(given) else None
        else:
            params = _latest_params(prefix)
        return Export(prefix, symbol, params)
    except (OSError, ValueError):
        return None


def is_params_file(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(8) == _PARAMS_MAGIC
    except OSError:
        return False


def _is_symbol_file(path: Path) -> bool:
    """A JSON file that starts like an MXNet symbol (``{"nodes": [...``)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(4096)
    except OSError:
        return False
    return head.lstrip().startswith(b"{") and b'"nodes"' in head


def _latest_params(prefix: Path) -> Path | None:
    """``PREFIX-NNNN.params`` with the highest epoch (what ``export`` wrote last)."""
    best: tuple[int, Path] | None = None
    if not prefix.parent.is_dir():
        return None
    for candidate in prefix.parent.iterdir():
        match = _EPOCH_PARAMS.match(candidate.name)
        if match and match["stem"] == prefix.name and is_params_file(candidate):
            epoch = int(match["epoch"])
            if best is None or epoch > best[0]:
                best = (epoch, candidate)
    return best[1] if best else None


def capability_files() -> list[Path]:
    """The capability YAML shipped in this package."""
    return [Path(str(resources.files("lpq_mxnet").joinpath("capabilities", "mxnet.yaml")))]


def detect(model: Any) -> bool:
    """True for an MXNet symbol file / export prefix and for a Gluon block.

    Cheap and never raises: a path is sniffed by its first bytes; a Gluon block can only
    exist if ``mxnet`` is imported already, so ``sys.modules`` is asked instead of
    importing it.
    """
    try:
        if isinstance(model, str | Path):
            return find_export(model) is not None
        mx = sys.modules.get("mxnet")
        gluon = getattr(mx, "gluon", None) if mx is not None else None
        return gluon is not None and isinstance(model, gluon.Block)
    except Exception:  # detection must never raise for a foreign model
        return False
