"""The cv18xx gmem plan: one liveness plan over the whole program, CPU routines included."""

from __future__ import annotations

from cv18xx_smallcnn import build_smallcnn

from npuc.backends.cv18xx.container import read_cvimodel

REGION_SHARED = 0


def test_the_quant_routines_output_shares_bytes_with_later_activations() -> None:
    data, summary = build_smallcnn("cv181x")
    prog = read_cvimodel(data).body.programs[0]
    cpu = next(r for r in prog.routines if r.cpu_routine is not None)
    quantized = {t.name: t for t in prog.tensor_map}[cpu.out_tensors[0]]
    assert quantized.offset >> 40 == REGION_SHARED
    assert prog.private_gmem == 0 == summary["private_gmem"]
    start, size = quantized.offset & ((1 << 40) - 1), 3 * 64 * 64
    later = [t for t in prog.tensor_map if t.offset >> 40 == REGION_SHARED and t.name != quantized.name]
    reusers = [
        t for t in later if (t.offset & (1 << 40) - 1) < start + size and start < (t.offset & (1 << 40) - 1) + t.size
    ]
    assert reusers, "no activation reuses the quantized input's bytes after the first conv"
    # with the input in private memory of its own the plan took 8,224 shared + 12,288 private = 20,512 B
    assert prog.shared_gmem == 20_480
