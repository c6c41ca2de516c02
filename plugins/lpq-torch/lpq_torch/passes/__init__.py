"""The quantization passes of lpq-torch, one module per approach.

* :mod:`.static` - the PT2E pass (torch.export -> prepare_pt2e -> calibrate ->
  convert_pt2e), x86 int8 per op, and QAT (``prepare_qat_pt2e``, trained between
  calibration and conversion);
* :mod:`.dynamic` - torchao's dynamic int8 for ``nn.Linear`` modules;
* :mod:`.weight_only` - int4/int8 Linear weights (GPTQ, AWQ, scale search, RTN from
  :mod:`lpq.weight_only`) on torch's CPU weight-only kernels, calibrated layer by layer.

Backend schemes (bit-exact simulation of other hardware) are :mod:`lpq_torch.backends`.
:mod:`lpq_torch.quantize` picks the pass for a tune_cfg.
"""
