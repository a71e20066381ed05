"""Defaults the CLI shows in its help and the passes use: kept here, free of heavy imports, so that
`npuc --help` does not load numpy, onnx or the passes."""

DEFAULT_BINS = 2048  # histogram bins per tensor (tpu-mlir's)
DEFAULT_MAX_FLOAT_LAYERS = 8  # bound of the mixed-precision search (tpu-mlir's search_qtable default is 5)
DEFAULT_BUDGET = 30.0  # seconds (estimated) of --method auto's per-tensor search
DEFAULT_TARGET_COS = 0.99  # --method auto's --target-cos: worst output cosine on the held-out samples
