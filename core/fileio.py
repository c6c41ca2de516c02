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


def _os_reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def check_writable(path: str | os.PathLike[str], what: str = "output") -> None:
    """Raise :class:`~lpq.ConfigError` now if ``path`` (a file to be written, possibly in
    folders still to be created) cannot be written, rather than after minutes of work.

    Catches a parent that is a file, a folder lpq may not write in (``/proc``, read-only
    mounts), and names longer than the file system takes. Writes nothing: the check creates
    and removes one temporary file in the deepest folder that exists already.
    """
    from .errors import ConfigError

    target = Path(os.path.abspath(os.fspath(path)))
    existing = target.parent
    while not _exists(existing):
        existing = existing.parent
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
        path_max = os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    rest = target.relative_to(existing).parts
    if (
        any(len(os.fsencode(p)) > name_max for p in rest)
        or len(os.fsencode(str(target))) >= path_max
    ):
        raise ConfigError(
            f"cannot write the {what} {str(target)[:60]}...: a name in it is longer than the "
            f"file system allows ({name_max} bytes per name, {path_max} per path)",
            hint="choose a shorter path",
        )
    if target.is_dir():
        raise ConfigError(
            f"the {what} {target} is a folder, lpq writes a file there",
            hint="name a file, e.g. " + str(target / "model-quantized.onnx"),
        )
    if not existing.is_dir():
        raise ConfigError(
            f"cannot write the {what} {target}: {existing} is a file, not a folder",
            hint="choose a path whose folders are folders (or remove that file)",
        )
    try:
        fd, probe = tempfile.mkstemp(prefix=".lpq-write-check.", dir=existing)
    except OSError as exc:
        raise ConfigError(
            f"cannot write the {what} {target}: lpq may not create files in {existing} "
            f"({_os_reason(exc)})",
            hint="choose a folder you can write to",
        ) from exc
    os.close(fd)
    os.unlink(probe)


def _exists(path: Path) -> bool:
    """``path.exists()``, also for names the OS refuses (too long: not there)."""
    try:
        os.stat(path)
    except (OSError, ValueError):
        return False
    return True


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name the same file: the same real path (symlinks resolved), or,
    when both exist, the same inode (hard links)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
