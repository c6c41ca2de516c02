"""Atomic file writes: a crash never leaves a truncated file where a good one was."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


@contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO[Any]]:
    """Write to a temporary file beside ``path`` and move it into place on success.

    The temporary file is fsynced before the rename, so after a crash ``path`` holds
    either the old content or the complete new content.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        # mkstemp creates 0600; the finished file gets the permissions open() would give.
        os.fchmod(fd, 0o666 & ~_current_umask())
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def remove_stale_temporaries(path: str | os.PathLike[str]) -> list[Path]:
    """Delete temporaries that an interrupted :func:`atomic_write` of ``path`` left behind
    (a SIGKILL skips the cleanup). Call it where only one writer of ``path`` runs."""
    target = Path(path)
    stale = list(target.parent.glob(f".{target.name}.*.tmp")) if target.parent.is_dir() else []
    for tmp in stale:
        tmp.unlink(missing_ok=True)
    return stale


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Atomically write ``data`` as indented JSON."""
    with atomic_write(path) as handle:
        json.dump(data, handle, indent=2, sort_keys=False, default=str)
        handle.write("\n")
