"""One `lpq tune` at a time per workspace: a lock file that names its holder.

Two runs of the same command on the same workspace would both run every trial and the
last writer of history.json would win, so the second run must stop before any work. The
lock is a file created atomically (``O_CREAT | O_EXCL``) holding the owner's pid, host and
start time, so the refusal can say who holds it. A lock left by a process that died
(SIGKILL, power loss) on this host is taken over with a warning; one from another host
cannot be checked, and the message says how to remove it by hand.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from ..errors import ConfigError, LpqWarning

#: The lock's file name inside the workspace.
LOCK_NAME = ".lpq-tune.lock"


class WorkspaceLockedError(ConfigError):
    """Another live `lpq tune` holds the workspace."""


def _holder_text(holder: dict[str, Any]) -> str:
    started = holder.get("started")
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
        if isinstance(started, int | float)
        else "an unknown time"
    )
    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started {when}"


def _read(path: Path) -> dict[str, Any] | None:
    """The lock's content; ``None`` when it vanished; ``{}`` when it is unreadable (a
    holder caught between creating and writing it, or a foreign file)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _stale(holder: dict[str, Any]) -> bool:
    """Whether the holder is a dead process on this host (only then can lpq tell)."""
    pid = holder.get("pid")
    return (
        holder.get("host") == socket.gethostname()
        and isinstance(pid, int)
        and pid != os.getpid()
        and not _alive(pid)
    )


def _create(path: Path, content: dict[str, Any]) -> bool:
    """Create the lock atomically; False if it exists already."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as handle:
        json.dump(content, handle)
        handle.flush()
        os.fsync(handle.fileno())
    return True


def _take_over(path: Path, holder: dict[str, Any]) -> bool:
    """Move a stale lock aside, but only if it is still the one judged stale: another run
    may have taken it over and created its own in between."""
    aside = path.with_name(f"{path.name}.{os.getpid()}.stale")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return True  # someone removed it: just try to create ours
    moved = _read(aside)
    if moved != holder:  # a live lock was moved: put it back (never over a newer one)
        with suppress(OSError):
            os.link(aside, path)
        aside.unlink(missing_ok=True)
        return False
    aside.unlink(missing_ok=True)
    return True


def acquire(workspace: str | os.PathLike[str], command: str = "lpq tune") -> dict[str, Any]:
    """Take the workspace's lock or raise :class:`WorkspaceLockedError` naming its holder.

    Returns the lock's content (pass it to :func:`release`).
    """
    folder = Path(workspace)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    mine = {
        "created_folder": created,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.time(),
        "command": command,
        "token": uuid.uuid4().hex,
    }
    for _ in range(5):
        if _create(path, mine):
            return mine
        holder = _read(path)
        if holder is None:
            continue  # released between our attempt and the read
        if holder and _stale(holder):
            if _take_over(path, holder):
                warnings.warn(
                    f"took over the lock of {folder}: its holder ({_holder_text(holder)}) "
                    "is no longer running",
                    LpqWarning,
                    stacklevel=2,
                )
            continue
        if not holder:
            time.sleep(0.2)  # being written; read it again
            holder = _read(path)
            if holder is None:
                continue
        raise WorkspaceLockedError(
            f"the workspace {folder} is in use by another {holder.get('command', 'lpq tune')} "
            f"({_holder_text(holder or {})})",
            hint="wait for that run to finish (re-running the same command afterwards "
            "resumes from its history), or pass another --workspace; if that process is "
            f"gone (e.g. on another machine), delete {path}",
        )
    raise WorkspaceLockedError(
        f"could not take the lock {path}: other runs keep taking it",
        hint="pass another --workspace",
    )


def release(workspace: str | os.PathLike[str], mine: dict[str, Any]) -> None:
    """Remove the lock if it is still ours (never another run's), and the workspace too
    if this run created it and left nothing in it (a run stopped before its first trial
    leaves no trace)."""
    folder = Path(workspace)
    path = folder / LOCK_NAME
    holder = _read(path)
    if holder and holder.get("token") == mine.get("token"):
        try:
            path.unlink()
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
        if mine.get("created_folder"):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if empty


@contextmanager
def workspace_lock(workspace: str | os.PathLike[str], command: str = "lpq tune") -> Iterator[None]:
    """Hold the workspace's lock while the block runs."""
    mine = acquire(workspace, command)
    try:
        yield
    finally:
        release(workspace, mine)
