"""lpq adaptor for MXNet (Gluon HybridBlocks and exported symbol JSON + params).

Importing this package imports no MXNet: the hooks in :mod:`lpq_mxnet.plugin` load the
framework only when a model of theirs is handled.
"""

__version__ = "0.2.0"
