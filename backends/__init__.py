"""Vendor backends: one package per target (container, instruction codec, code generation, simulator)."""
