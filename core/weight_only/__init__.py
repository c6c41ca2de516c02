"""Weight-only quantization maths for LLM layers, framework-neutral (numpy only).

Written once here so that every adaptor (lpq-onnxrt's MatMulNBits, lpq-torch's Linear
weights) quantizes the same way: an adaptor collects a layer's weight as (K, N) and its
input activations, calls one of these, and writes the result in its runtime's format.

- :mod:`.blocks`: :class:`BlockQuantized`, :func:`quantize_rtn`, :func:`block_params`,
  :func:`quantize_blocks`, :func:`dequantize_blocks` (block-wise along K, 4/8 bits,
  symmetric or asymmetric with integer zero points).
- :mod:`.packing`: :func:`pack_matmulnbits`, :func:`unpack_matmulnbits`,
  :func:`dequantize_matmulnbits` (ONNX Runtime ``com.microsoft.MatMulNBits`` layout).
- :mod:`.gptq`: :class:`HessianAccumulator`, :func:`gptq_quantize`.
- :mod:`.awq`: :func:`awq_search`, :func:`awq_scales`, :func:`apply_awq_scales`.
- :mod:`.scale_search`: :func:`search_scales`, :func:`block_error`.
- :mod:`.metrics`: :func:`perplexity`, :func:`nll_sum`, :func:`perplexity_from_nll`,
  :func:`top1_agreement`, :func:`mean_kl`, :func:`log_softmax`.

See docs/weight-only.md.
"""

from __future__ import annotations

from .awq import AWQResult, apply_awq_scales, awq_scales, awq_search
from .blocks import (
    BlockQuantized,
    block_params,
    dequantize_blocks,
    quantize_blocks,
    quantize_rtn,
)
from .gptq import GPTQResult, HessianAccumulator, gptq_quantize
from .metrics import log_softmax, mean_kl, nll_sum, perplexity, perplexity_from_nll, top1_agreement
from .packing import (
    MatMulNBitsWeights,
    dequantize_matmulnbits,
    pack_matmulnbits,
    unpack_matmulnbits,
)
from .scale_search import block_error, search_scales

__all__ = [
    "AWQResult",
    "BlockQuantized",
    "GPTQResult",
    "HessianAccumulator",
    "MatMulNBitsWeights",
    "apply_awq_scales",
    "awq_scales",
    "awq_search",
    "block_error",
    "block_params",
    "dequantize_blocks",
    "dequantize_matmulnbits",
    "gptq_quantize",
    "log_softmax",
    "mean_kl",
    "nll_sum",
    "pack_matmulnbits",
    "perplexity",
    "perplexity_from_nll",
    "quantize_blocks",
    "quantize_rtn",
    "search_scales",
    "top1_agreement",
    "unpack_matmulnbits",
]
