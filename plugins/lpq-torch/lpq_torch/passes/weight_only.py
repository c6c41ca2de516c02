"""Weight-only int4/int8 for ``nn.Linear`` layers: lpq's maths, torch's CPU kernels.

Language models at batch 1 are limited by reading their weights, so their Linear
weights become 4- or 8-bit integers while activations stay float. The weights are
computed by :mod:`lpq.weight_only` (the same numpy maths lpq-onnxrt uses: RTN, GPTQ,
AWQ, scale search) and then written **exactly** into torchao tensors that run on torch's
CPU weight-only kernels:

* int4: torchao's ``Int4OpaqueTensor`` (``torchao.prototype.quantization.int4``), whose
  linear is ``aten._weight_int4pack_mm_for_cpu`` (tinygemm layout). Its dequantization is
  ``(q - 8) * scale + zero`` with a float ``zero``; lpq's integer zero point ``z`` maps to
  ``zero = (8 - z) * scale`` exactly, so GPTQ/AWQ codes are used as computed, never
  re-rounded by torchao. K must be a multiple of the block size (32, 64 or 128).
* int8: torchao's ``Int8Tensor`` (int8 ``qdata`` and one scale per output channel),
  computed with ``aten._weight_int8pack_mm``; symmetric only (the kernel has no zero
  point).

Measured here (x86 AVX-512, one thread): both kernels are fast only with bf16
activations (a 2048x8192 weight: fp32 matmul 8.6 ms, int4 1.2 ms, int8 1.7 ms with bf16
inputs; with fp32 inputs int4 took 58 ms and int8 27 ms, and torchao's own
``Int8WeightOnlyConfig`` path 48 ms). So :class:`WeightOnlyLinear` casts its input to the
compute dtype (option ``weight_only_compute``: ``bf16`` by default, ``fp32`` for exact
arithmetic) and its output back. AWQ's per-input scales ``1/s`` are the tensors'
``act_pre_scale`` (multiplied into the input), so nothing has to be folded into the
previous RMSNorm.

Calibration is layer by layer and streaming: for each decoder block (the Linears under
one ``...layers.<i>`` path, in execution order) forward hooks on that block's Linears feed
:class:`lpq.weight_only.HessianAccumulator` (GPTQ), a running mean of ``x**2`` (scale
search) or a capped sample of rows (AWQ) while the calibration batches run through the
model, whose earlier blocks are already quantized (GPTQ's sequential scheme); the forward
stops after the block's last Linear. So at most one block's statistics exist at a time
(:data:`MAX_AWQ_ROWS` rows per AWQ layer), never the activations of all layers.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from lpq import ConfigError, DataError, OpConfig, OpKey, TuneConfig, split_batch
from lpq import weight_only as wo

from ..data import CallArgs, call_args, run
from ..errors import stage
from ..info import WEIGHT_ONLY_ATTR

logger = logging.getLogger("lpq.torch")

#: Algorithms of the capability YAML and whether they need calibration activations.
ALGORITHMS = {"rtn": False, "gptq": True, "awq": True, "scale_search": True}
#: Rows (tokens) of each layer's input kept for AWQ's alpha search.
MAX_AWQ_ROWS = 1024
#: Op types this pass quantizes (``lm_head``: a causal LM's output projection).
OP_TYPES = ("linear", "lm_head")
_COMPUTE = {"bf16": torch.bfloat16, "fp32": torch.float32}
_INT4_BLOCKS = (32, 64, 128)


def wanted(tune_cfg: TuneConfig) -> dict[OpKey, OpConfig]:
    """The ops ``tune_cfg`` quantizes weight-only."""
    return {
        key: cfg for key, cfg in tune_cfg.ops.items() if cfg.quantized and cfg.mode == "weight_only"
    }


@dataclass(frozen=True)
class Plan:
    """How one Linear is quantized: bits, block size, scheme and algorithm."""

    bits: int
    block_size: int
    symmetric: bool
    algorithm: str

    @classmethod
    def of(cls, name: str, cfg: OpConfig, k: int) -> Plan:
        weight = cfg.weight
        if weight is None or weight.dtype not in ("int4", "int8"):
            raise ConfigError(
                f"op {name}: weight-only quantization needs an int4 or int8 weight config",
                hint="use the weight_only options `lpq capability show torch` lists for linear",
            )
        bits = int(weight.options.get("bits", 4 if weight.dtype == "int4" else 8))
        if bits != (4 if weight.dtype == "int4" else 8):
            raise ConfigError(f"op {name}: bits={bits} does not match dtype {weight.dtype}")
        algorithm = weight.algorithm
        if algorithm not in ALGORITHMS:
            raise ConfigError(
                f"op {name}: unknown weight-only algorithm {algorithm!r}",
                hint=f"use one of {', '.join(ALGORITHMS)}",
            )
        symmetric = weight.scheme == "sym"
        if bits == 8:
            if not symmetric:
                raise ConfigError(
                    f"op {name}: int8 weight-only is symmetric only (torch's int8 kernel "
                    "has no zero point)",
                    hint="use scheme 'sym' for int8, or int4 with scheme 'asym'",
                )
            # one block spanning K: one scale per output channel
            block = 1 << max(4, (k - 1).bit_length())
        else:
            block = int(weight.options.get("block_size", 32))
            if block not in _INT4_BLOCKS:
                raise ConfigError(
                    f"op {name}: int4 block_size {block} is not one torch's int4 CPU kernel runs",
                    hint=f"use one of {', '.join(map(str, _INT4_BLOCKS))}",
                )
        return cls(bits, block, symmetric, algorithm)


class WeightOnlyLinear(torch.nn.Linear):
    """A Linear whose weight is a torchao int4/int8 tensor, run by torch's CPU kernels.

    A subclass of ``nn.Linear`` so model code reading ``in_features`` or ``weight`` keeps
    working. The input is cast to ``compute_dtype`` (the kernels' fast path is bf16) and
    the output back to the input's dtype; the bias is added in float32.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        bits: int,
        compute_dtype: torch.dtype,
        pre_scale: torch.Tensor | None = None,
    ) -> None:
        torch.nn.Module.__init__(self)
        self.in_features = int(weight.shape[1])
        self.out_features = int(weight.shape[0])
        self.bits = bits
        self.compute_dtype = compute_dtype
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        # nn.Linear types bias as always set; register_parameter takes None too
        self.register_parameter(
            "bias", None if bias is None else torch.nn.Parameter(bias, requires_grad=False)
        )
        # int8: the AWQ pre-scale is applied here (Int4OpaqueTensor applies its own)
        self.pre_scale = pre_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, self.in_features).to(self.compute_dtype)
        if self.bits == 4:
            y = torch.nn.functional.linear(flat, self.weight)
        else:
            if self.pre_scale is not None:
                flat = flat * self.pre_scale
            tensor: Any = self.weight.data  # torchao's Int8Tensor
            y = torch.ops.aten._weight_int8pack_mm(flat, tensor.qdata, tensor.scale.reshape(-1))
        out = y.to(x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"weight=int{self.bits} {type(self.weight.data).__name__}, "
            f"compute={str(self.compute_dtype).replace('torch.', '')}"
        )


def int4_tensor(
    q: wo.BlockQuantized, dtype: torch.dtype, pre_scale: torch.Tensor | None
) -> torch.Tensor:
    """lpq's (K, N) int4 blocks as torchao's ``Int4OpaqueTensor`` (tinygemm CPU layout)."""
    from torchao.prototype.quantization.int4.int4_opaque_tensor import Int4OpaqueTensor
    from torchao.quantization.utils import pack_tinygemm_scales_and_zeros

    k, n = q.shape
    codes = torch.from_numpy(np.ascontiguousarray(q.codes.T).astype(np.int32))
    scale = torch.from_numpy(np.ascontiguousarray(q.scales.T).astype(np.float32))
    zero = (
        8.0 - torch.from_numpy(np.ascontiguousarray(q.zero_points.T).astype(np.float32))
    ) * scale
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    scale_and_zero = pack_tinygemm_scales_and_zeros(scale.to(dtype), zero.to(dtype), dtype)
    return Int4OpaqueTensor(
        qdata=packed,
        scale_and_zero=scale_and_zero,
        block_size=[1, q.block_size],
        shape=torch.Size([n, k]),
        act_pre_scale=None if pre_scale is None else pre_scale.to(dtype),
    )


def int8_tensor(q: wo.BlockQuantized, dtype: torch.dtype) -> torch.Tensor:
    """lpq's symmetric per-channel 8-bit weight as torchao's ``Int8Tensor`` (N, K)."""
    from torchao.quantization.quantize_.workflows.int8.int8_tensor import Int8Tensor

    k, n = q.shape
    qdata = torch.from_numpy((q.codes.T.astype(np.int16) - 128).astype(np.int8).copy())
    scale = torch.from_numpy(q.scales[0].astype(np.float32).copy()).to(dtype).reshape(n, 1)
    return Int8Tensor(qdata, scale, [1, k], dtype)


class LayerStats:
    """Streaming statistics of one Linear's input for its algorithm (never all rows)."""

    def __init__(self, k: int, algorithm: str) -> None:
        self.k = k
        self.algorithm = algorithm
        self.hessian = wo.HessianAccumulator(k) if algorithm == "gptq" else None
        self.sq_sum = np.zeros(k, dtype=np.float64)
        self.count = 0
        self.rows: list[npt.NDArray[np.float32]] = []
        self.n_rows = 0

    def add(self, x: torch.Tensor) -> None:
        a = x.detach().reshape(-1, self.k).float().numpy()
        if self.hessian is not None:
            self.hessian.add(a)
        elif self.algorithm == "scale_search":
            self.sq_sum += np.square(a, dtype=np.float64).sum(axis=0)
            self.count += a.shape[0]
        elif self.n_rows < MAX_AWQ_ROWS:
            take = a[: MAX_AWQ_ROWS - self.n_rows].copy()
            self.rows.append(take)
            self.n_rows += take.shape[0]

    def nbytes(self) -> int:
        hessian = self.k * self.k * 8 if self.hessian is not None else 0
        return hessian + self.sq_sum.nbytes + sum(r.nbytes for r in self.rows)


@dataclass
class WeightOnlyReport:
    """What the pass did, layer by layer (kept on the result as :data:`WEIGHT_ONLY_ATTR`)."""

    ops: list[str] = field(default_factory=list)
    #: op name -> "int4 gptq block 32 sym" or the reason it stayed float
    layers: dict[str, str] = field(default_factory=dict)
    #: the calibration groups (decoder blocks) in the order they were calibrated
    groups: list[list[str]] = field(default_factory=list)
    #: the most groups whose statistics were alive at once (1: layer by layer)
    max_groups_held: int = 0
    #: the largest statistics of one group, in bytes
    max_stats_bytes: int = 0
    seconds: float = 0.0


class _StopForward(Exception):
    """Raised by a hook after the group's last Linear: the rest of the forward is not needed."""


def quantize(
    module: torch.nn.Module,
    tune_cfg: TuneConfig,
    calib_dataloader: Iterable[Any] | None,
) -> torch.nn.Module:
    """A copy of ``module`` whose chosen Linears hold int4/int8 weights (see module doc)."""
    ops = wanted(tune_cfg)
    check(module, tune_cfg)
    compute = _compute_dtype(tune_cfg)
    began = time.perf_counter()
    result = copy.deepcopy(module).eval()
    modules = dict(result.named_modules())
    plans = {
        name: Plan.of(name, cfg, _in_features(modules[name])) for (name, _), cfg in ops.items()
    }
    report = WeightOnlyReport(ops=[name for name, _ in tune_cfg.ops])
    calibrated = [name for name, plan in plans.items() if ALGORITHMS[plan.algorithm]]
    if calibrated:
        batches = _batches(calib_dataloader, tune_cfg.calib_sampling_size, calibrated[0])
        groups = _groups(result, batches[0], calibrated)
        for group in groups:
            algorithms = {name: plans[name].algorithm for name in group}
            stats = _collect(result, algorithms, batches, modules, report)
            for name in group:
                _replace(result, modules, name, plans[name], stats.pop(name), compute, report)
            logger.info(
                "lpq-torch weight-only: group %d/%d quantized (%s)",
                len(report.groups),
                len(groups),
                ", ".join(group),
            )
    for name, plan in plans.items():
        if name not in report.layers:
            _replace(result, modules, name, plan, None, compute, report)
    report.seconds = time.perf_counter() - began
    setattr(result, WEIGHT_ONLY_ATTR, report)
    return result


def check(module: torch.nn.Module, tune_cfg: TuneConfig) -> None:
    """Refuse configs this pass cannot apply, with what to do instead."""
    others = [
        key for key, cfg in tune_cfg.ops.items() if cfg.quantized and cfg.mode != "weight_only"
    ]
    if others:
        name = others[0][0]
        raise ConfigError(
            "one tune_cfg cannot mix weight-only ops with static or dynamic ones "
            f"({name} is {tune_cfg.ops[others[0]].mode})",
            hint="quantize with approach='weight_only' only (other ops stay float)",
        )
    names = dict(module.named_modules())
    for name, op_type in wanted(tune_cfg):
        if op_type not in OP_TYPES or not isinstance(names.get(name), torch.nn.Linear):
            raise ConfigError(
                f"weight-only quantization applies to nn.Linear modules; {name} ({op_type}) "
                "is not one",
                hint="keep it float, or pass the model as an nn.Module (not a loaded .pt2 "
                "graph) so its Linear modules are visible",
            )


def _compute_dtype(tune_cfg: TuneConfig) -> torch.dtype:
    value = str(tune_cfg.options.get("weight_only_compute", "bf16"))
    if value not in _COMPUTE:
        raise ConfigError(
            f"weight_only_compute must be 'bf16' or 'fp32', got {value!r}",
            hint="bf16 runs torch's fast CPU kernels; fp32 computes exactly (and slowly)",
        )
    return _COMPUTE[value]


def _batches(dataloader: Iterable[Any] | None, limit: int, first: str) -> list[CallArgs]:
    """Up to ``limit`` calibration batches as call arguments (token ids are small)."""
    if dataloader is None:
        raise DataError(
            f"weight-only {first} needs calibration data (the layers' input activations)",
            hint="pass calibration data (e.g. token windows: {'input_ids': (N, L) int64}), "
            "or use algorithm 'rtn', which needs none",
        )
    batches: list[CallArgs] = []
    for item in dataloader:
        batches.append(call_args(split_batch(item)[0]))
        if len(batches) >= max(1, limit):
            break
    if not batches:
        raise DataError("the calibration dataloader yielded no batches", hint="pass data")
    return batches


def _groups(model: torch.nn.Module, args: CallArgs, names: list[str]) -> list[list[str]]:
    """``names`` in execution order, cut into groups by decoder block (``...layers.<i>``)."""
    order: list[str] = []
    wanted_names = set(names)
    handles = []
    for name, sub in model.named_modules():
        if name in wanted_names:
            handles.append(
                sub.register_forward_hook(
                    lambda _m, _i, _o, n=name: order.append(n) if n not in order else None
                )
            )
    try:
        with torch.no_grad(), stage("calibrate", "weight-only: execution order"):
            run(model, args)
    finally:
        for handle in handles:
            handle.remove()
    order += [n for n in names if n not in order]  # never called: quantized as RTN later
    groups: list[list[str]] = []
    keys: list[str] = []
    for name in order:
        key = _block_of(name)
        if keys and keys[-1] == key:
            groups[-1].append(name)
        else:
            keys.append(key)
            groups.append([name])
    return groups


def _block_of(name: str) -> str:
    """The decoder-block prefix of a module path (up to its last numeric part)."""
    parts = name.split(".")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i].isdigit():
            return ".".join(parts[: i + 1])
    return name


_LIVE_GROUPS: list[int] = [0]


def _collect(
    model: torch.nn.Module,
    algorithms: dict[str, str],
    batches: list[CallArgs],
    modules: dict[str, torch.nn.Module],
    report: WeightOnlyReport,
) -> dict[str, LayerStats]:
    """Run the calibration batches with hooks on one group's Linears only."""
    group = list(algorithms)
    stats = {name: LayerStats(_in_features(modules[name]), algorithms[name]) for name in group}
    handles = []
    last = group[-1]
    seen: set[str] = set()

    def hook(name: str) -> Any:
        def capture(_m: torch.nn.Module, inputs: tuple[Any, ...]) -> None:
            stats[name].add(inputs[0])
            seen.add(name)
            if name == last and seen >= set(group):
                raise _StopForward

        return capture

    for name in group:
        handles.append(modules[name].register_forward_pre_hook(hook(name)))
    _LIVE_GROUPS[0] += 1
    report.max_groups_held = max(report.max_groups_held, _LIVE_GROUPS[0])
    try:
        with torch.no_grad(), stage("calibrate", f"weight-only: {group[0]} ..."):
            for args in batches:
                seen.clear()
                with contextlib.suppress(_StopForward):
                    run(model, args)
    finally:
        _LIVE_GROUPS[0] -= 1
        for handle in handles:
            handle.remove()
    report.groups.append(list(group))
    report.max_stats_bytes = max(report.max_stats_bytes, sum(s.nbytes() for s in stats.values()))
    return stats


def _in_features(module: torch.nn.Module) -> int:
    assert isinstance(module, torch.nn.Linear)
    return module.in_features


def _replace(
    model: torch.nn.Module,
    modules: dict[str, torch.nn.Module],
    name: str,
    plan: Plan,
    stats: LayerStats | None,
    compute: torch.dtype,
    report: WeightOnlyReport,
) -> None:
    """Quantize ``name``'s weight by ``plan`` and swap in a :class:`WeightOnlyLinear`."""
    linear = modules[name]
    assert isinstance(linear, torch.nn.Linear)
    k = linear.in_features
    if plan.bits == 4 and k % plan.block_size:
        report.layers[name] = (
            f"fp32 (K={k} is not a multiple of block_size {plan.block_size}, which torch's "
            "int4 CPU kernel needs)"
        )
        logger.warning("lpq-torch weight-only: %s stays float: %s", name, report.layers[name])
        return
    w = linear.weight.detach().float().T.numpy()  # (K, N), lpq.weight_only's layout
    pre_scale: torch.Tensor | None = None
    algorithm = plan.algorithm if stats is not None else "rtn"
    if algorithm == "gptq" and stats is not None and stats.hessian is not None:
        q = wo.gptq_quantize(
            w, stats.hessian.hessian, plan.bits, plan.block_size, plan.symmetric
        ).quantized
    elif algorithm == "awq" and stats is not None and stats.rows:
        found = wo.awq_search(
            w, np.concatenate(stats.rows), plan.bits, plan.block_size, plan.symmetric
        )
        q = found.quantized
        pre_scale = torch.from_numpy((1.0 / found.scales).astype(np.float32))
    elif algorithm == "scale_search" and stats is not None and stats.count:
        importance = stats.sq_sum / stats.count
        q = wo.search_scales(w, plan.bits, plan.block_size, plan.symmetric, importance=importance)
    else:
        algorithm = "rtn"
        q = wo.quantize_rtn(w, plan.bits, plan.block_size, plan.symmetric)
    with stage("quantize", f"weight-only int{plan.bits} for {name}"):
        if plan.bits == 4:
            tensor = int4_tensor(q, compute, pre_scale)
            scale = None
        else:
            tensor = int8_tensor(q, compute)
            scale = None if pre_scale is None else pre_scale.to(compute)
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        new = WeightOnlyLinear(tensor, bias, plan.bits, compute, scale)
    _set_module(model, name, new)
    modules[name] = new
    block = f" block {plan.block_size}" if plan.bits == 4 else " per channel"
    report.layers[name] = f"int{plan.bits} {algorithm}{block} {'sym' if plan.symmetric else 'asym'}"


def _set_module(model: torch.nn.Module, name: str, new: torch.nn.Module) -> None:
    owner_path, _, leaf = name.rpartition(".")
    owner = model.get_submodule(owner_path) if owner_path else model
    setattr(owner, leaf, new)
