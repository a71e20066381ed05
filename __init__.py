"""npuc: a multi-target NPU model compiler (ONNX in, vendor NPU artifact out).

The Python API (api/) is available from the package: `npuc.build`, `npuc.inspect`, `npuc.run`,
`npuc.check` (which ops a target cannot run), `npuc.calibrate` / `npuc.merge_calibration`; bad input
raises `npuc.UserError`. It is imported on first use, so `import npuc` stays cheap.
"""

from npuc.compiler.version import VERSION as __version__

__all__ = ["UserError", "__version__", "build", "calibrate", "check", "inspect", "merge_calibration", "run"]


def __getattr__(name: str):
    if name == "build":
        from npuc.api import building

        return building.build
    if name in ("calibrate", "merge_calibration"):
        from npuc.api import calibration

        return getattr(calibration, name)
    if name in ("check", "inspect", "run"):
        from npuc.api import inspection

        return getattr(inspection, name)
    if name == "UserError":
        from npuc.compiler.errors import UserError

        return UserError
    raise AttributeError(f"module 'npuc' has no attribute {name!r}")
