"""One `lpq tune` per workspace (issue 29, item 2), with real processes: a second run exits 2
naming the holder, a lock left by a killed process is taken over, and of several runs
started at once exactly one gets the lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lpq.tuning.lock import LOCK_NAME

HOLD = """
import sys, time
from lpq.tuning.lock import acquire
acquire(sys.argv[1])
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


@pytest.fixture(scope="module")
def digits() -> dict[str, Path]:
    from lpq_onnxrt.examples import digits_example

    return {k: Path(v) for k, v in digits_example().items() if k != "metric"}


def _holder(workspace: Path, seconds: float = 120) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(workspace), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _tune(run_lpq, digits, workspace: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return run_lpq(
        "tune", str(digits["model"]), "--calib", str(digits["calib"]),
        "--eval", str(digits["eval"]), "--workspace", str(workspace), "--max-trials", "1",
        "--out", str(out),
    )  # fmt: skip


def test_a_second_run_on_a_held_workspace_exits_2_naming_the_holder(run_lpq, digits, tmp_path):
    workspace = tmp_path / "ws"
    holder = _holder(workspace)
    try:
        done = _tune(run_lpq, digits, workspace, tmp_path / "q.onnx")
        assert done.returncode == 2, done.stderr
        assert f"is in use by another lpq tune (pid {holder.pid} on " in done.stderr
        assert "wait for that run to finish" in done.stderr and "Traceback" not in done.stderr
        assert not list(workspace.glob("*/history.json"))  # no work was done
        assert not (tmp_path / "q.onnx").exists()
        held = json.loads((workspace / LOCK_NAME).read_text())
        assert held["pid"] == holder.pid  # the holder's lock is left alone
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_left_by_a_killed_run_is_taken_over_with_a_note(run_lpq, digits, tmp_path):
    workspace = tmp_path / "ws"
    holder = _holder(workspace)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert (workspace / LOCK_NAME).exists()
    done = _tune(run_lpq, digits, workspace, tmp_path / "q.onnx")
    assert done.returncode == 0, done.stderr
    assert f"took over the lock of {workspace}" in done.stderr
    assert f"pid {holder.pid}" in done.stderr and "is no longer running" in done.stderr
    assert not (workspace / LOCK_NAME).exists()  # released at the end
    assert list(workspace.glob("*/history.json"))


def test_of_runs_started_together_exactly_one_gets_the_lock(tmp_path):
    workspace = tmp_path / "ws"
    start = time.time() + 2.0
    script = f"""
import sys, time
from lpq.errors import LpqError
from lpq.tuning.lock import acquire
while time.time() < {start}:
    pass
try:
    acquire(sys.argv[1])
except LpqError:
    print("refused", flush=True)
else:
    print("held", flush=True)
    time.sleep(10)
"""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(workspace)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    results = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert sorted(results) == ["held", "refused", "refused", "refused"]
