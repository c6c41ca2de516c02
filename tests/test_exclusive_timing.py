"""``lpq.exclusive_timing``: latency an adaptor measures while quantizing (latency-aware
quantization) is timed with the machine to itself, even with parallel workers."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

import lpq
from lpq.testing.fake_adaptor import FakeAdaptorPlugin, FakeModel


class TimingWhileQuantizing(FakeAdaptorPlugin):
    """Times something inside every quantize, and logs when each process does what."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.log = Path(folder) / "events.log"

    def note(self, what: str) -> None:
        with open(self.log, "a") as log:
            log.write(f"{os.getpid()} {time.monotonic():.6f} {what}\n")

    @lpq.hookimpl
    def lpq_quantize(self, framework, model, tune_cfg, calib_dataloader, train_func):
        if framework != "fake":
            return None
        self.note("work")
        with lpq.exclusive_timing():
            self.note("timing-start")
            time.sleep(0.15)
            self.note("timing-end")
        time.sleep(0.05)
        self.note("work")
        return super().lpq_quantize(framework, model, tune_cfg, calib_dataloader, train_func)

    @lpq.hookimpl
    def lpq_evaluate(self, framework, model, dataloader, postprocess, metrics, measurer, iteration):
        if framework == "fake" and measurer is None:
            self.note("work")
            time.sleep(0.05)
            self.note("work")
        return super().lpq_evaluate(
            framework, model, dataloader, postprocess, metrics, measurer, iteration
        )

    def events(self) -> list[tuple[int, float, str]]:
        rows = [line.split() for line in self.log.read_text().splitlines()]
        return [(int(pid), float(at), what) for pid, at, what in rows]


def test_timing_inside_quantize_excludes_every_other_trial(lpq_plugin, tmp_path):
    plugin = TimingWhileQuantizing(tmp_path)
    lpq_plugin(plugin, name="fake")
    ops = [(f"op{i}", "Conv") for i in range(6)]
    conf = lpq.PostTrainingQuantConfig(
        tuning_criterion=lpq.TuningCriterion(
            strategy="basic", max_trials=6, exit_policy="best", workers=2, executor="process"
        )
    )
    result = lpq.fit(
        FakeModel(ops=ops, sensitivity={f"op{i}": 0.004 for i in range(6)}),
        conf,
        [np.zeros((4, 1), np.float32)],
        eval_dataloader=[(np.zeros((100, 1), np.float32), np.arange(100) % 10)],
        workspace=tmp_path / "ws",
    )
    assert len({t.worker for t in result.trials if t.worker}) == 2, "two workers ran trials"
    events = plugin.events()
    windows = []
    for pid, at, what in events:
        if what == "timing-start":
            end = min(a for p, a, w in events if p == pid and w == "timing-end" and a >= at)
            windows.append((pid, at, end))
    assert len(windows) >= 4
    for pid, start, end in windows:
        others = [(p, a, w) for p, a, w in events if p != pid and start < a < end]
        assert not others, f"process {pid} timed while another trial worked: {others}"


def test_outside_a_parallel_run_it_does_not_wait():
    started = time.monotonic()
    with lpq.exclusive_timing():
        pass
    assert time.monotonic() - started < 1.0
