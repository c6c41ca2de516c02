"""Diagnosis: where a quantized model loses accuracy, op by op."""
