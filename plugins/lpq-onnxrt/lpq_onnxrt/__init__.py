"""lpq-onnxrt: the ONNX Runtime adaptor for lpq.

Layout (the same in every lpq adaptor): :mod:`.info` (leaf: name, capability file,
detection), :mod:`.plugin` (registration only), one module per job (:mod:`.capability`,
:mod:`.quantize` with :mod:`.passes` and :mod:`.latency`, :mod:`.evaluate`, :mod:`.inspection`,
:mod:`.precision`, :mod:`.persist`, :mod:`.lowp`, :mod:`.export`, :mod:`.edit`), and
:mod:`.model_io` / :mod:`.data` below them. Importing the package imports no framework.
"""

from typing import Any

__version__ = "0.2.0"


def inference_session(model: Any, options: dict[str, Any] | None = None) -> Any:
    """An ``onnxruntime.InferenceSession`` for what an ``eval_func`` receives.

    ``lpq.fit(..., eval_func=f)`` calls ``f`` with the fp32 model as you gave it (a path or
    an ``onnx.ModelProto``) and with each trial's quantized model (an
    :class:`lpq_onnxrt.qmodel.QuantizedModel`, held in memory: trials are never written to
    disk). This runs any of them: a quantized model with the session settings it was
    quantized and timed for (threads, execution provider; ``options`` overrides them),
    models over 2 GB through a temporary external-data file. Importing ``lpq_onnxrt``
    still imports no framework: ONNX Runtime loads on the first call.
    """
    from .evaluate import runnable

    return runnable(model, options)[0]
