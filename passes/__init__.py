"""Compiler passes by stage: graph rewrites (rewrite/), calibration (calibration/), quantization (quantization/),
exports (export/), and the target-neutral lowering backends share (lowering/)."""
