"""What a tuning workspace says about its chosen model: the fp32 model, the framework, the
chosen trial's tune_cfg and the quantized model `lpq tune` wrote."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..plan.tune_config import TuneConfig


@dataclass(frozen=True)
class TunedRun:
    folder: Path
    framework: str
    model: str
    tune_cfg: TuneConfig
    trial: int
    #: The quantized model `lpq tune` saved (``summary.json``), if it still exists.
    quantized: Path | None


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path} ({exc})", hint="pass another workspace") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a tuning history", hint="pass another workspace")
    return data


def tuned_run(workspace: str | Path, run: str | None = None) -> TunedRun:
    """The run of ``workspace`` to diagnose: ``run`` (a run key), else the latest one."""
    folder = Path(workspace)
    histories = sorted(folder.glob("*/history.json"), key=lambda p: p.stat().st_mtime)
    if run is not None:
        histories = [h for h in histories if h.parent.name == run]
    if not histories:
        raise ConfigError(
            f"no tuning run{f' {run!r}' if run else ''} in {folder}",
            hint="pass the --workspace of an `lpq tune` run (it holds <run>/history.json)",
        )
    history_path = histories[-1]
    history = _read(history_path)
    trials = {t["index"]: t for t in history.get("trials", []) if isinstance(t, dict)}
    chosen = history.get("best_trial")
    if not isinstance(chosen, int) or chosen not in trials:
        raise ConfigError(
            f"the run in {history_path.parent} has no chosen trial (it did not finish)",
            hint="finish it (run the same `lpq tune` command again), or pass --quantized",
        )
    summary_path = history_path.parent / "summary.json"
    saved = _read(summary_path).get("model") if summary_path.exists() else None
    return TunedRun(
        folder=history_path.parent,
        framework=str(history.get("framework")),
        model=str(history.get("model")),
        tune_cfg=TuneConfig.from_json(trials[chosen]["tune_cfg"]),
        trial=chosen,
        quantized=Path(saved) if saved and Path(saved).exists() else None,
    )
