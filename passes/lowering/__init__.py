"""Target-neutral lowering the backends share: layer groups computed tile by tile in on-chip memory."""
