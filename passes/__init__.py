"""Compiler passes: canonicalization, calibration, quantization, lowering, layer grouping, memory."""
