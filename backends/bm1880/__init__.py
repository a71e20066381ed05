"""BM1880 (BMNNSDK v1) target: bmodel containers, BMKernel cmdbuf codec and BMNet calibration tables."""
