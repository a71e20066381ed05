"""Exports of npuc's quantization as ONNX models onnxruntime runs (QDQ, exact and plain forms)."""
