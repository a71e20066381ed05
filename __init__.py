"""npuc: a multi-target NPU model compiler (ONNX in, vendor NPU artifact out)."""

__version__ = "0.1.0"
