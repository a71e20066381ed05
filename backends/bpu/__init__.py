"""Horizon BPU (hbDNN) target."""
