"""Calibration: per-tensor statistics, threshold methods, the table formats, the choices made on held-out
samples, refinement of weights to the quantized activations, and the float/quantized comparison."""
