"""Tuning history: every finished trial written atomically as JSON, never lost.

``<workspace>/<run key>/history.json`` holds the fp32 baseline and every trial. On a
re-run with the same key, the trials already finished are loaded *first* and kept: the
strategy's walk replays them by fingerprint instead of running them again, and new
trials are appended after them. So an interrupted re-run (Ctrl-C, SIGKILL, a dead
worker) can only add trials, never drop one. Only the driver writes this file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import ConfigError
from ..fileio import remove_stale_temporaries, write_json
from .records import TrialRecord


class TuningHistory:
    """The history file of one run, and the trials it already holds."""

    def __init__(self, workspace: str | os.PathLike[str], run_key: str, meta: dict[str, Any]):
        self.folder = Path(workspace) / run_key
        self.path = self.folder / "history.json"
        self.run_key = run_key
        self.meta = meta
        self.baseline: TrialRecord | None = None
        #: Every trial of the run by id, earlier sessions' included.
        self.trials: dict[int, TrialRecord] = {}
        #: The first trial of each fingerprint: a re-run looks every proposal up here.
        self._by_fingerprint: dict[str, TrialRecord] = {}
        self.extra: dict[str, Any] = {}
        remove_stale_temporaries(self.path)
        if self.path.exists():
            self._load_previous()

    def _load_previous(self) -> None:
        """Load an earlier session's trials; a file that is not a history this version
        wrote (hand-edited, another tool's JSON) is refused without touching it."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            raise self._unreadable(str(exc)) from exc
        if not isinstance(data, dict):
            raise self._unreadable(f"it holds a JSON {type(data).__name__}, not an object")
        if data.get("run_key") != self.run_key:
            return
        trials = data.get("trials", [])
        if not isinstance(trials, list) or not all(isinstance(t, dict) for t in trials):
            raise self._unreadable("its 'trials' is not a list of trial objects")
        try:
            records = [TrialRecord.from_json(t) for t in trials]
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise self._unreadable(f"a trial is malformed: {type(exc).__name__}: {exc}") from exc
        for record in records:
            if not isinstance(record.index, int) or not isinstance(record.fingerprint, str):
                raise self._unreadable(
                    f"trial {record.index!r} has no whole-number index or no text fingerprint"
                )
        for record in records:
            record.resumed = True
            self.trials[record.index] = record
            self._by_fingerprint.setdefault(record.fingerprint, record)

    def _unreadable(self, why: str) -> ConfigError:
        return ConfigError(
            f"the tuning history {self.path} is unreadable ({why}); lpq left it as it is",
            hint="move it away (or delete it) to start this run over, or pass another --workspace",
        )

    @property
    def resumed_trials(self) -> int:
        return sum(1 for t in self.trials.values() if t.resumed)

    def finished(self, fingerprint: str) -> TrialRecord | None:
        """A finished trial of this fingerprint (ok, or failed in the candidate itself)."""
        record = self._by_fingerprint.get(fingerprint)
        return record if record is not None and record.status in ("ok", "error") else None

    def next_index(self) -> int:
        return max(self.trials, default=-1) + 1

    def add(self, record: TrialRecord) -> None:
        """Add or replace (same id) a trial and write the file."""
        self.trials[record.index] = record
        known = self._by_fingerprint.get(record.fingerprint)
        if known is None or known.index == record.index:
            self._by_fingerprint[record.fingerprint] = record
        self.write()

    def ordered(self) -> list[TrialRecord]:
        return [self.trials[i] for i in sorted(self.trials)]

    def write(self, **extra: Any) -> None:
        self.extra.update(extra)
        write_json(
            self.path,
            {
                "lpq_version": __version__,
                "run_key": self.run_key,
                **self.meta,
                "baseline": self.baseline.to_json() if self.baseline else None,
                "trials": [t.to_json() for t in self.ordered()],
                **self.extra,
            },
        )
