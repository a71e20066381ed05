"""Quantization: the pass that applies a scheme (per-op-kind rules a backend registers), its context, and a
batched float simulation of the int8 scheme."""
