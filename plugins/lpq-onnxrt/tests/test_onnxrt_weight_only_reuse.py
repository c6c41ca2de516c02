"""The trials of one tuning run share quantized weights (``passes.weight_only.reuse``):
a MatMul quantized the same way from the same weight and statistics is searched once
per run, and what comes back from the run cache (memory or its files) is the same."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper
from test_onnxrt_weight_only import FW, _cfg, _tokens, tiny_decoder

import lpq
from lpq.cache import RunCache, using_run_cache
from lpq_onnxrt.passes import weight_only as wo
from lpq_onnxrt.passes.weight_only import matmuls, reuse


@pytest.fixture
def searches(monkeypatch):
    """How many weights the scale search ran on."""
    calls: list[tuple[int, int]] = []
    real = matmuls.search_scales

    def counting(weight, *args, **kwargs):
        calls.append(weight.shape)
        return real(weight, *args, **kwargs)

    monkeypatch.setattr(matmuls, "search_scales", counting)
    return calls


def _weights(proto) -> dict[str, np.ndarray]:
    return {
        init.name: numpy_helper.to_array(init)
        for init in proto.graph.initializer
        if "MatMulNBits" in init.name or init.name.endswith(("_B", "_scales", "_zero_points"))
    }


def _quantize(pm, model, cfg):
    return pm.quantize(FW, model, cfg, lpq.ArrayLoader(_tokens(), batch_size=4)).proto


def test_a_run_searches_each_weight_once(searches, tmp_path):
    pm = lpq.get_plugin_manager()
    model = tiny_decoder()
    cfg = _cfg(pm, model, "int4", algorithm="scale_search", block_size=32)
    with using_run_cache(RunCache(tmp_path)):
        first = _quantize(pm, model, cfg)
        searched = len(searches)
        second = _quantize(pm, model, cfg)
    assert searched >= 14  # 7 MatMuls per layer, 2 layers
    assert len(searches) == searched  # the second trial searched nothing
    a, b = _weights(first), _weights(second)
    assert a and a.keys() == b.keys()
    assert all(np.array_equal(a[name], b[name]) for name in a)
    # a later process of the same run (a fresh cache object) reads them from the files
    with using_run_cache(RunCache(tmp_path)):
        third = _quantize(pm, model, cfg)
    assert len(searches) == searched
    c = _weights(third)
    assert all(np.array_equal(a[name], c[name]) for name in a)


def test_a_different_weight_or_choice_is_searched_again(searches, tmp_path):
    pm = lpq.get_plugin_manager()
    with using_run_cache(RunCache(tmp_path)):
        model = tiny_decoder(seed=0)
        _quantize(pm, model, _cfg(pm, model, "int4", algorithm="scale_search", block_size=32))
        once = len(searches)
        other = tiny_decoder(seed=1)  # same names, other weights
        _quantize(pm, other, _cfg(pm, other, "int4", algorithm="scale_search", block_size=32))
        assert len(searches) == 2 * once
        _quantize(pm, model, _cfg(pm, model, "int8", algorithm="scale_search", block_size=32))
        assert len(searches) == 3 * once


def test_rtn_is_not_kept():
    from lpq_onnxrt.passes.weight_only.plan import LayerChoice

    rtn = LayerChoice("w", "MatMul", 4, 32, True, "rtn")
    search = LayerChoice("w", "MatMul", 4, 32, True, "scale_search")
    weight = np.ones((64, 8), np.float32)
    assert reuse.key(weight, rtn, None, {}) is None
    assert reuse.key(weight, search, None, {}) != reuse.key(2 * weight, search, None, {})


def test_a_later_trial_reads_the_calibration_back(monkeypatch, tmp_path):
    """The second trial of a run runs no calibration stage: statistics, lm_head's input
    rows and the embedding streams' comparison come from the first trial's files, and
    the model and its decisions are the same."""
    from lpq_onnxrt.passes.weight_only import stages

    runs: list[int] = []
    real = stages.StagedRun.run

    def counting(self, index, wanted=()):
        runs.append(index)
        return real(self, index, wanted)

    monkeypatch.setattr(stages.StagedRun, "run", counting)
    from lpq_onnxrt.passes.weight_only import lm_head

    heads: list[int] = []
    measure = lm_head.measure_lm_head

    def measuring(*args, **kwargs):
        heads.append(1)
        return measure(*args, **kwargs)

    monkeypatch.setattr(lm_head, "measure_lm_head", measuring)
    pm = lpq.get_plugin_manager()
    model = tiny_decoder()
    cfg = _cfg(pm, model, "int4", algorithm="scale_search", block_size=32)
    cfg = lpq.TuneConfig(ops=cfg.ops, options={"embedding": "auto", "accuracy_level": 4})
    with using_run_cache(RunCache(tmp_path)):
        first = _quantize(pm, model, cfg)
        ran = len(runs)
        second = _quantize(pm, model, cfg)
    assert ran > 0 and len(runs) == ran
    assert len(heads) == 1  # the int8 head was measured once, by the first trial
    a, b = wo.read_report(first), wo.read_report(second)
    assert a["lm_head"] == b["lm_head"] and "measured" in a["lm_head"]
    assert a["embedding"] == b["embedding"] and a["embedding"]["measured"]
    wa, wb = _weights(first), _weights(second)
    assert wa.keys() == wb.keys() and all(np.array_equal(wa[n], wb[n]) for n in wa)
    # other calibration data: calibrated again
    with using_run_cache(RunCache(tmp_path)):
        pm.quantize(FW, model, cfg, lpq.ArrayLoader(_tokens(seed=7), batch_size=4))
    assert len(runs) == 2 * ran
