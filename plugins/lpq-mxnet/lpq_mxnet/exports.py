"""Exported MXNet models on disk: ``PREFIX-symbol.json`` + ``PREFIX-NNNN.params``.

This is what ``HybridBlock.export(PREFIX, epoch)`` writes and what lpq-mxnet saves (plus
``PREFIX-lpq.json`` with the tune_cfg). Users may name the symbol file, the params file or
the bare prefix. Everything here is framework-free: detection must not import MXNet.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

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
