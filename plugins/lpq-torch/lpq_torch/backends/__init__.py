"""Hardware backends for lpq-torch: schemes simulated bit-exactly, QAT, deploy to ONNX.

Importing this package imports no torch (the profiles are plain data, registered by
``lpq_torch.plugin``); the simulation modules import torch when used:

* :mod:`.profiles` — the shipped backend profiles (TensorRT, SNPE/QNN, Vitis AI,
  OpenVINO, TFLite, x86) as data;
* :mod:`.fake_quant`, :mod:`.observers`, :mod:`.quantizers` — backend-exact fake
  quantization, range observers, the quantizer module (PTQ and LSQ / LSQ+ / PACT QAT);
* :mod:`.simulate` — batch-norm folding and quantizer placement;
* :mod:`.quantize` — ``lpq_quantize`` for a backend scheme and
  :func:`~.quantize.quantize_for_backend`;
* :mod:`.onnx_export`, :mod:`.onnx_ops` — the simulated model as QDQ ONNX
  (``lpq_convert(target="onnx")``, through :mod:`lpq_torch.export`), one translation per
  ATen op;
* :mod:`.params` — the backends' parameter files (TensorRT, SNPE/QNN, Vitis AI);
* :mod:`.verify` — the proof that deploy is faithful (ONNX Runtime vs the simulation).

See docs/backends.md.
"""
