"""Accuracy and speed of one language-model variant, ONNX or torch, measured the same way.

Why one protocol for every row: rows from ONNX Runtime, NNCF, the genai builder, torchao
and lpq are only comparable if perplexity, agreement and timing are computed by the
same code on the same tokens.

* Accuracy: teacher-forced full-window forwards (the ONNX decoder gets an *empty* KV
  cache), summed with ``lpq.weight_only.metrics`` (``nll_sum`` over windows, then one
  ``perplexity_from_nll``); next-token top-1 agreement and mean KL(fp32 || variant).
* Speed: batch 1, one intra-op thread, greedy decoding with the KV cache after a
  16-token prompt; prefill (the prompt's forward) is timed separately. The caller
  interleaves variants round by round and takes medians (the machine is shared).
"""

from __future__ import annotations

import os
import resource
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lpq.weight_only import metrics

SLOW_TOKEN_MS = 300.0  # above this, decode timing is capped to a few tokens


class OnnxDecoder:
    """An ONNX Runtime session over a decoder with KV-cache inputs (genai-builder layout)."""

    runtime = "onnxruntime"

    def __init__(self, path: Path, kv_heads: int, head_dim: int, threads: int = 1) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.past = [n for n in self.inputs if n.startswith("past_key_values.")]
        self.presents = [o.name for o in self.session.get_outputs() if o.name.startswith("present")]
        self.kv_heads, self.head_dim = kv_heads, head_dim

    def _feed(self, ids: np.ndarray, cache: dict[str, np.ndarray], total: int) -> dict[str, Any]:
        feed: dict[str, Any] = {"input_ids": ids[None].astype(np.int64)}
        if "attention_mask" in self.inputs:
            feed["attention_mask"] = np.ones((1, total), dtype=np.int64)
        if "position_ids" in self.inputs:
            feed["position_ids"] = np.arange(total - ids.size, total, dtype=np.int64)[None]
        feed.update(cache)
        return feed

    def _empty_cache(self) -> dict[str, np.ndarray]:
        dtype = (
            np.float16 if any("float16" in self.inputs[n].type for n in self.past) else np.float32
        )
        shape = (1, self.kv_heads, 0, self.head_dim)
        return {n: np.zeros(shape, dtype=dtype) for n in self.past}

    def _step(self, ids: np.ndarray, cache: dict[str, np.ndarray], total: int):
        out = self.session.run(None, self._feed(ids, cache, total))
        names = [o.name for o in self.session.get_outputs()]
        got = dict(zip(names, out, strict=True))
        new = {p: got[p.replace("past_key_values", "present")] for p in self.past}
        return got["logits"][0], new

    def logits(self, ids: np.ndarray) -> np.ndarray:
        """(L, V) logits of one window, teacher-forced, from an empty cache."""
        return np.asarray(self._step(ids, self._empty_cache(), ids.size)[0], dtype=np.float32)

    def timed_decode(self, prompt: np.ndarray, new_tokens: int) -> tuple[float, float]:
        """(prefill ms, decode ms/token): greedy, batch 1, KV cache."""
        began = time.perf_counter()
        logits, cache = self._step(prompt, self._empty_cache(), prompt.size)
        prefill = (time.perf_counter() - began) * 1e3
        total = prompt.size
        began = time.perf_counter()
        for _ in range(new_tokens):
            nxt = np.array([int(np.argmax(logits[-1]))])
            total += 1
            logits, cache = self._step(nxt, cache, total)
        return prefill, (time.perf_counter() - began) * 1e3 / max(new_tokens, 1)


class TorchDecoder:
    """A Hugging Face causal LM run the way ``generate`` runs it: KV cache, greedy, batch 1."""

    runtime = "torch"

    def __init__(self, model: Any, threads: int = 1) -> None:
        import torch

        torch.set_num_threads(threads)
        self.model = model.eval()

    def logits(self, ids: np.ndarray) -> np.ndarray:
        import torch

        with torch.inference_mode():
            out = self.model(input_ids=torch.from_numpy(ids[None]), use_cache=False)
        return out.logits[0].float().numpy()

    def timed_decode(self, prompt: np.ndarray, new_tokens: int) -> tuple[float, float]:
        import torch

        with torch.inference_mode():
            began = time.perf_counter()
            out = self.model(input_ids=torch.from_numpy(prompt[None]), use_cache=True)
            prefill = (time.perf_counter() - began) * 1e3
            began = time.perf_counter()
            for _ in range(new_tokens):
                nxt = out.logits[:, -1:].argmax(-1)
                out = self.model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
            return prefill, (time.perf_counter() - began) * 1e3 / max(new_tokens, 1)


@dataclass
class Accuracy:
    perplexity: float
    top1_agreement: float | None = None
    mean_kl: float | None = None
    logits: list[np.ndarray] = field(default_factory=list, repr=False)


def accuracy(model: Any, windows: np.ndarray, reference: list[np.ndarray] | None) -> Accuracy:
    """Perplexity over all windows, plus agreement/KL against ``reference`` logits if given.

    Only the reference run keeps its logits (8 x 256 x 49152 float32 is ~400 MB).
    """
    total, count, agree, kl, kept = 0.0, 0, [], [], []
    for i, window in enumerate(windows):
        z = model.logits(window)
        nll, n = metrics.nll_sum(z, window)
        total, count = total + nll, count + n
        if reference is None:
            kept.append(z)
        else:  # positions predicting a token of the window (the last predicts beyond it)
            agree.append(metrics.top1_agreement(reference[i][:-1], z[:-1]))
            kl.append(metrics.mean_kl(reference[i][:-1], z[:-1]))
    ppl = metrics.perplexity_from_nll(total, count)
    if reference is None:
        return Accuracy(ppl, 1.0, 0.0, kept)
    return Accuracy(ppl, float(np.mean(agree)), float(np.mean(kl)))


def decode_tokens_for(model: Any, prompt: np.ndarray, wanted: int) -> int:
    """How many tokens to time: ``wanted``, or 4 when one token is slower than SLOW_TOKEN_MS.

    Why: HQQ's float zero points leave the fast kernel (~1 s/token); timing it fully
    would dominate the run without changing the conclusion.
    """
    _, per_token = model.timed_decode(prompt, 2)
    return wanted if per_token < SLOW_TOKEN_MS else min(wanted, 4)


def size_mb(path: Path) -> float:
    """Bytes on disk of a model folder's ONNX files (graph + external data), in MB."""
    folder = path.parent
    files = [
        p
        for p in folder.iterdir()
        if p.suffix in {".onnx", ".data"} or p.name.endswith(".onnx.data")
    ]
    return sum(p.stat().st_size for p in files) / 1e6


def run_measured(
    cmd: list[str], log: Path, env: dict[str, str] | None = None
) -> tuple[int, float, float, float]:
    """Run ``cmd`` as a child; return (exit code, wall s, the child's peak RSS in MB, its
    CPU s: user + system).

    ``os.wait4`` gives the rusage of exactly this child and the descendants it waited for
    (RUSAGE_CHILDREN would be the maximum over every child this process ever waited for).
    """
    with log.open("w") as sink:
        began = time.perf_counter()
        child = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - began
    child.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    return child.returncode, wall, usage.ru_maxrss / 1024, cpu  # Linux: KiB


def own_peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
