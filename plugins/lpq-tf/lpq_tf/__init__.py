"""lpq-tf: the TensorFlow / Keras / LiteRT adaptor of lpq (entry point ``tf``).

Keras models, ``.keras`` files, SavedModel directories and float ``.tflite`` files are
quantized into LiteRT (TFLite) models and run with ``ai-edge-litert``. TensorFlow is
imported only when a hook needs it; see :mod:`lpq_tf.plugin`.
"""
