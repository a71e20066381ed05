"""npuc: a multi-target NPU model compiler (ONNX in, vendor NPU artifact out).

The Python API (api/) is available from the package: `npuc.build`, `npuc.inspect`, `npuc.run`,
`npuc.check` (which ops a target cannot run), `npuc.calibrate` / `npuc.merge_calibration`; bad input
raises `npuc.UserError`. It is imported on first use, so `import npuc` stays cheap.
"""

from npuc.compiler.version import VERSION as __version__

__all__ = ["UserError", "__version__", "build", "calibrate", "check", "inspect", "merge_calibration", "run"]


def __getattr__(name: str):
    if name in ("build", "calibrate", "check", "inspect", "merge_calibration", "run"):
        from npuc import api

        return getattr(api, name)
    if name == "UserError":
        from npuc.compiler.errors import UserError

        return UserError
    raise AttributeError(f"module 'npuc' has no attribute {name!r}")
