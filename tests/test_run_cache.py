"""The run cache: adaptor state computed once per run, found again by content — in the
same process, after a restart, and in worker processes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

import lpq
from lpq.cache import using_run_cache
from lpq.testing.fake_adaptor import FakeAdaptorPlugin, FakeModel, FakeQuantizedModel


def save_array(value: np.ndarray, handle) -> None:
    np.save(handle, value)


def load_array(handle) -> np.ndarray:
    return np.load(handle)


def test_content_key_depends_on_content_only():
    a = lpq.content_key("calib", np.arange(4.0), {"x": 1, "y": [1, 2]})
    b = lpq.content_key("calib", np.arange(4.0), {"y": [1, 2], "x": 1})
    assert a == b
    assert a != lpq.content_key("calib", np.arange(4.0) + 1e-7, {"x": 1, "y": [1, 2]})
    assert a != lpq.content_key("calib", np.arange(4.0).astype(np.float32), {"x": 1, "y": [1, 2]})


def test_values_survive_in_memory_and_on_disk(tmp_path):
    computed = []

    def compute() -> np.ndarray:
        computed.append(1)
        return np.full(3, 7.0)

    first = lpq.RunCache(tmp_path)
    kwargs = {"save": save_array, "load": load_array}
    assert first.get_or_compute("stats", "k1", compute, **kwargs).tolist() == [7.0] * 3
    first.get_or_compute("stats", "k1", compute, **kwargs)
    assert len(computed) == 1 and first.hits == 1
    restarted = lpq.RunCache(tmp_path)  # a new process, or another machine sharing the folder
    assert restarted.get_or_compute("stats", "k1", compute, **kwargs).tolist() == [7.0] * 3
    assert len(computed) == 1 and restarted.disk_hits == 1
    (tmp_path / "stats" / "k1").write_bytes(b"garbage")
    assert lpq.RunCache(tmp_path).get_or_compute("stats", "k1", compute, **kwargs).size == 3
    assert len(computed) == 2, "a corrupt file is recomputed, not trusted"


def test_a_disk_only_value_is_read_from_its_file_and_never_held_in_memory(tmp_path):
    computed = []

    def compute() -> np.ndarray:
        computed.append(1)
        return np.full(2, 5.0)

    cache = lpq.RunCache(tmp_path)
    kwargs = {"save": save_array, "load": load_array, "memory": False}
    for _ in range(2):
        assert cache.get_or_compute("weights", "w1", compute, **kwargs).tolist() == [5.0, 5.0]
    assert len(computed) == 1 and cache.disk_hits == 1 and cache.hits == 0
    assert cache.items() == []
    # without a folder there is nowhere to keep it: computed every time
    bare = lpq.RunCache()
    bare.get_or_compute("weights", "w1", compute, **kwargs)
    bare.get_or_compute("weights", "w1", compute, **kwargs)
    assert len(computed) == 3 and bare.items() == []


def test_outside_a_run_the_cache_is_memory_only():
    cache = lpq.run_cache()
    assert cache.folder is None
    with using_run_cache(None) as inside:
        assert inside is cache


class CalibratingAdaptor(FakeAdaptorPlugin):
    """Computes 'calibration statistics' through the run cache and logs every compute."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.log = Path(folder) / "computed.log"

    @lpq.hookimpl
    def lpq_quantize(self, framework, model, tune_cfg, calib_dataloader, train_func):
        if framework != "fake":
            return None

        def compute() -> np.ndarray:
            with open(self.log, "a") as log:
                log.write(f"{os.getpid()}\n")
            return np.ones(4)

        key = lpq.content_key(model.ops, [np.asarray(b) for b in calib_dataloader])
        lpq.run_cache().get_or_compute(
            "fake-calibration", key, compute, save=save_array, load=load_array
        )
        return FakeQuantizedModel(model, tune_cfg)


def test_calibration_is_computed_once_per_run_across_worker_processes(lpq_plugin, tmp_path):
    plugin = CalibratingAdaptor(tmp_path)
    lpq_plugin(plugin, name="fake")
    ops = [(f"op{i}", "Conv") for i in range(8)]
    model = FakeModel(ops=ops, sensitivity={f"op{i}": 0.004 for i in range(8)})
    conf = lpq.PostTrainingQuantConfig(
        tuning_criterion=lpq.TuningCriterion(
            strategy="basic", max_trials=10, exit_policy="best", workers=2, executor="process"
        )
    )
    result = lpq.fit(
        model,
        conf,
        [np.zeros((4, 1), np.float32)],
        eval_dataloader=[(np.zeros((100, 1), np.float32), np.arange(100) % 10)],
        workspace=tmp_path / "ws",
    )
    assert any(t.worker for t in result.trials), "trials ran in worker processes"
    assert len(plugin.log.read_text().split()) == 1, "computed once, in the driver"
    cache_files = list((result.history_path.parent / "cache" / "fake-calibration").iterdir())
    assert len(cache_files) == 1
    assert json.loads(result.history_path.read_text())["trials"]


class PreparingAdaptor(FakeAdaptorPlugin):
    """Prepares the model (an export, say) in the capability query, through the run
    cache, and needs the same prepared model in every trial and in the fp32 baseline."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.prepared = 0
        self.caches: list[lpq.RunCache] = []  # kept alive: ids are never reused

    def prepare(self, model) -> list:
        def compute() -> list:
            self.prepared += 1
            return list(model.ops)

        self.caches.append(lpq.run_cache())
        return lpq.run_cache().get_or_compute("fake-prepared", "model", compute)

    @lpq.hookimpl
    def lpq_query_fw_capability(self, framework, model, dataloader, options):
        if framework == "fake":
            self.prepare(model)
        return super().lpq_query_fw_capability(framework, model, dataloader, options)

    @lpq.hookimpl
    def lpq_quantize(self, framework, model, tune_cfg, calib_dataloader, train_func):
        if framework != "fake":
            return None
        self.prepare(model)
        return FakeQuantizedModel(model, tune_cfg)


def test_one_fit_is_one_run_from_capability_query_to_last_trial(lpq_plugin, tmp_path):
    plugin = PreparingAdaptor(tmp_path)
    lpq_plugin(plugin, name="fake")
    ops = [(f"op{i}", "Conv") for i in range(4)]
    model = FakeModel(ops=ops, sensitivity={f"op{i}": 0.004 for i in range(4)})
    conf = lpq.PostTrainingQuantConfig(
        tuning_criterion=lpq.TuningCriterion(strategy="basic", max_trials=4, exit_policy="best")
    )
    calib = [np.zeros((4, 1), np.float32)]
    evaluation = [(np.zeros((100, 1), np.float32), np.arange(100) % 10)]
    result = lpq.fit(model, conf, calib, eval_dataloader=evaluation, workspace=tmp_path / "ws")
    assert len(result.trials) > 1
    assert plugin.prepared == 1, "the capability query's preparation served every trial"
    assert len({id(c) for c in plugin.caches}) == 1, "capability query and trials: one cache"
    assert lpq.run_cache().folder is None, "the run ended with the call"
    lpq.quantize(model, None, calib)
    assert plugin.prepared == 2, "a new call is a new run: nothing stale is reused"
    assert len({id(c) for c in plugin.caches}) == 2
