"""npuc's version, in a module that imports nothing, so every layer can name it (calibration digests, --version)."""

VERSION = "0.1.0"  # keep equal to pyproject.toml's [project] version
