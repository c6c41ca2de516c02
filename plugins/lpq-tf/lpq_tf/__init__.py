"""lpq-tf: the TensorFlow / Keras / LiteRT adaptor of lpq (entry point ``tf``).

Keras models, ``.keras`` files, SavedModel directories and float ``.tflite`` files are
quantized into LiteRT (TFLite) models and run with ``ai-edge-litert``. TensorFlow is
imported only when a job needs it: :mod:`lpq_tf.plugin` registers the adaptor and imports
each job's module (:mod:`~lpq_tf.quantize`, :mod:`~lpq_tf.evaluate`, ...) when it is
called; :mod:`lpq_tf.info` is what is known without any framework.
"""

__version__ = "0.2.0"
