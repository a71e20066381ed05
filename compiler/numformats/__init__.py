"""Number formats: vectorized primitives that turn floats into a target's integers or 16-bit floats and back.

Pure functions on numpy arrays and floats, no IR; one module per format family, each on the two shared ones:

- `rounding`: rounding modes and saturation (exact for their input dtype);
- `thresholds`: a calibration threshold as the vendor tools hold it (float32), checked finite and > 0;
- `gemmlowp`: fixed-point multipliers (int32 multiplier and shift) and their rounding multiply and shift;
- `cv18xx_int8`: CV18xx symmetric int8 (activations, per-channel QDM conv/FC, per-tensor multipliers);
- `bf16_fp16`: bf16 and IEEE fp16 bit patterns and rounding;
- `affine`: asymmetric (zero point) int8/uint8;
- `bm1880_int8`: BM1880 per-layer power-of-two shifts;
- `horizon_int8`: Horizon BPU SHIFT and SCALE boundaries.

Sources of the formulas: specs/quant.md §1.5, specs/cv18xx.md §4, specs/bm1880.md §3.2,
specs/dmp-lyngor-horizon.md §3.3. The arithmetic is chosen to match the vendor tools, which compute in C
float/double.
"""
