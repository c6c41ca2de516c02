"""The two ways lpq-tf writes a quantized ``.tflite``; :mod:`lpq_tf.quantize` picks one.

* :mod:`~lpq_tf.passes.converter`: TensorFlow's own TFLiteConverter, from the SavedModel
  (Keras and SavedModel inputs, one choice for every quantized op);
* :mod:`~lpq_tf.passes.aeq`: Google's ai-edge-quantizer, one recipe entry per op, for
  float ``.tflite`` inputs and the per-op choices the converter cannot express.

Each takes the prepared model, the per-op configs and the calibration samples and
returns the quantized flatbuffer's bytes.
"""
