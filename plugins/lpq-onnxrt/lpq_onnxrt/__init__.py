"""lpq-onnxrt: the ONNX Runtime adaptor for lpq.

Layout (the same in every lpq adaptor): :mod:`.info` (leaf: name, capability file,
detection), :mod:`.plugin` (registration only), one module per job (:mod:`.capability`,
:mod:`.quantize` with :mod:`.passes` and :mod:`.latency`, :mod:`.evaluate`, :mod:`.inspection`,
:mod:`.precision`, :mod:`.persist`, :mod:`.lowp`, :mod:`.export`, :mod:`.edit`), and
:mod:`.model_io` / :mod:`.data` below them. Importing the package imports no framework.
"""

__version__ = "0.2.0"
