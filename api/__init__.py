"""npuc's Python API: what the CLI commands do, for scripts (`import npuc; npuc.build(...)`).

Every function raises `npuc.UserError` (bad input, one line) instead of exiting, and writes exactly what the
command writes: `npuc build m.onnx --target T ...` and `npuc.build("m.onnx", "T", ...)` give the same bytes.
The CLI (cli/) parses flags into these arguments and prints the results. The functions, by module:
`building.build`; `inspection.inspect`, `inspection.run`, `inspection.check`; `calibration.calibrate`,
`calibration.merge_calibration`; input shape arguments in `shapes.py`; the hb_mapper config flows in
`hbbuild.py` and `hbcalib.py`. The package `npuc` exposes each under its own name.
"""
