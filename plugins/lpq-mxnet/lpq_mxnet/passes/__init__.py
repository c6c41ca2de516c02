"""The passes that apply a tune_cfg; :mod:`lpq_mxnet.quantize` picks one.

``static``: post-training static int8 through ``quantize_net_v2``. The bf16 pass is
:mod:`lpq_mxnet.lowp` (it also implements lpq_convert_bf16 on its own).
"""
