"""The passes :func:`lpq_onnxrt.quantize.quantize` runs, one module per approach.

:mod:`.static_plan` calibrates and settles the static plan (latency-aware decisions,
``auto`` ranges, recipes) and runs :mod:`.static`; :mod:`.dynamic` and
:mod:`.weight_only` need no calibration; :mod:`.quantizer` holds what the passes that
call ORT's quantizers share, :mod:`.channelwise` their per-channel weights in whole
arrays.
"""
