"""What may be quantized and how: capability, its YAML loader, the tuning space, tune_cfg."""
