"""Per-layer int8 sensitivity: the network's outputs when one layer alone is int8 and every other in float.

The per-layer report of an all-int8 run (passes/calibration/compare.py) shows where the error is, not where it
comes from: a layer whose input is already off can lose the most cosine while quantizing it alone costs almost
nothing, since errors grow along the network. Quantizing one layer at a time measures what each one costs the
outputs (tpu-mlir ranks its sensitive layers the same way). The unit is the int8 layer as the quantizer lowers
it: its inputs quantized at their thresholds, its constants and its own result in int8, its consumers reading it
dequantized.
Measured on PicoDet layout (800x608, `npuc calibrate` defaults, one held-out document): the first conv's output
alone in int8 drops the worst output to cosine 0.66 (one of its 16 channels has mean 9.4 and peak 26.8, four
others vary by 0.02-0.1 around their means: at the tensor's step of 0.15 they vanish, and the depthwise conv
after it amplifies them), the next depthwise conv 0.67; the all-int8 report showed 239 and 226 of its 241
layers worse than these two.
Each trial resumes the run of the previous one where their graphs first differ (rerun.RunCache), so a scan
costs about half a quantized run per layer and sample; and as most of each trial runs in bf16, the scan sums
bf16 convs in float32 instead of in the TIU's order (bf16_conv.float32_sums): PicoDet, one picture, 221 s ->
136 s, the same 64 most sensitive layers (47 of the first 48). The runs made so are dropped after the scan.

`npuc compare --sensitivity --auto-mixed COS` keeps the shortest prefix of this order that reaches COS. Not
`npuc calibrate --target-cos`'s default: judged on the few samples calibration sets apart, neither order wins on
pictures no choice saw.
Measured (`npuc calibrate` defaults; the search's picks by local loss / by the greedy in this order, before the
prefix search): PP-OCRv6 rec, 5 of 24
text lines held out, 24 other lines judged: 8 layers (target 0.99 missed on the held-out lines) 0.9763 mean /
0.9097 worst, 4 layers (reached) 0.9802 / 0.9429, none 0.9771 / 0.9151; PP-OCRv6 det, 2 of 10 text pictures held
out, their 10 mirror images judged: 8 layers (missed) 0.9871 / 0.9697, 6 layers (reached) 0.9850 / 0.9486, none
0.9865 / 0.9744. The prefix search on rec's default table and 5 calibration lines: target 0.99, 7 more layers,
0.9768 / 0.904 on the 24 lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from npuc.compiler.errors import UserError
from npuc.compiler.kernels.quantized.bf16_conv import float32_sums
from npuc.passes.calibration.calibrate import Progress, no_progress
from npuc.passes.calibration.compare import Comparison


@dataclass(frozen=True)
class LayerSensitivity:
    """The outputs with only `layer` in int8: the worst output's pooled and mean per-sample cosine."""

    layer: str
    output_cosine: float
    mean_sample_cosine: float

    def public(self) -> dict[str, object]:
        return {"layer": self.layer, "output_cosine": self.output_cosine,
                "mean_sample_cosine": self.mean_sample_cosine}  # fmt: skip


def layer_sensitivity(comparison: Comparison, layers: Sequence[str] | None = None, float_layers: Sequence[str] = (),
                      progress: Progress | None = None) -> list[LayerSensitivity]:  # fmt: skip
    """Each int8 layer of `comparison` (or those of `layers`) measured alone in int8, the others (and the
    comparison's base_float, and `float_layers`) in the float fallback; most sensitive (lowest worst-output
    cosine) first. `progress(label, total)` gives the callable each measured layer advances by one."""
    int8 = comparison.evaluate(float_layers, per_layer=True).int8_layers
    if layers is None:
        chosen = int8
    else:
        unknown = [n for n in layers if n not in int8]
        if unknown:
            raise UserError(f"sensitivity: {unknown[0]!r} is not an int8 layer of this comparison; pick from "
                            f"`npuc compare`'s layers ({', '.join(int8[:3])}, ...)")  # fmt: skip
        chosen = list(layers)
    order = {op.outputs[0]: i for i, op in enumerate(comparison.graph.ops) if op.outputs}
    found = []
    advance = (progress or no_progress)("int8 sensitivity", len(chosen))
    with float32_sums():  # a ranking: the bf16 sums need not be the TIU's (bf16_conv.py)
        for name in sorted(chosen, key=lambda n: order.get(n, len(order))):  # graph order: each run resumes the last
            report = comparison.evaluate([*float_layers, *(n for n in int8 if n != name)], per_layer=False)
            found.append(LayerSensitivity(name, float(report.output_cosine), float(report.mean_sample_cosine)))
            advance(1)
    comparison.runs.clear()  # no later evaluation resumes a run made with those sums
    return sorted(found, key=lambda s: (s.output_cosine, s.mean_sample_cosine, s.layer))


def sensitivity_lines(found: Sequence[LayerSensitivity], shown: int = 20) -> list[str]:
    """The most sensitive layers as `npuc compare --sensitivity` prints them."""
    lines = [f"int8 sensitivity (only this layer in int8; worst output cosine, mean per sample), "
             f"{min(shown, len(found))} of {len(found)} most sensitive:"]  # fmt: skip
    width = max((len(s.layer) for s in found[:shown]), default=0)
    row = "  {0.layer:<{width}}  cos {0.output_cosine:.6f}  mean {0.mean_sample_cosine:.6f}"
    lines += [row.format(s, width=width) for s in found[:shown]]
    return lines
