"""DDR traffic counted from cvimodel bytes (backends/cv18xx/traffic.py).

Two independent references: hand-derived byte counts of tpu-mlir's golden files (each TDMA line of
`npuc inspect --disasm`, elements x element size, summed by hand), and the bytes npuc's simulator actually
touches in global memory while it runs the file (its read/write calls metered per region).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from cv18xx_smallcnn import build_smallcnn
from golden import GOLDEN_ROOT

from npuc.backends.cv18xx import compression, isa
from npuc.backends.cv18xx.chips import CHIPS
from npuc.backends.cv18xx.cmdbuf import split_cmdbuf
from npuc.backends.cv18xx.container import CviModel, read_cvimodel, write_cvimodel
from npuc.backends.cv18xx.sim import Machine, run_cvimodel
from npuc.backends.cv18xx.sim_mem import FORMATS, GlobalMemory
from npuc.backends.cv18xx.traffic import descriptor_transfers, lower_bound, tdma_traffic
from npuc.cli.app import main
from npuc.compiler.errors import CorruptFileError, UserError

GOLDEN = GOLDEN_ROOT / "cv18xx"
KINDS = ("weights", "shared", "private", "io")


def _kind(region: int) -> str:
    return {0: "shared", 1: "weights", 2: "private"}.get(region, "io")


def _zero() -> dict[str, int]:
    return dict.fromkeys(KINDS, 0)


# Hand-summed from the disassembly. int8 (cv183x, cv182x, cv181x: the same byte totals): weight loads
# 576+144+2304+144+2304+144+144+144+512+288 (tensors) + 32x10 + 4x10 (matrix FC weight and bias) = 7064;
# shared loads 32 (matrix row of the pooled vector) + 10 (FC result into bf16); private 3x64x64 (the
# quantized input); shared stores 32 + 10; io store 10 fp32 outputs as 1x10x1x2 bf16 = 40.
INT8 = {
    "load": {"weights": 7064, "shared": 42, "private": 12288, "io": 0},
    "store": {"weights": 0, "shared": 42, "private": 0, "io": 40},
}
# bf16: the fp32 input read as 1x32x48x16 bf16 = 49152 from io; weights 11816 dense (864+64+4608+64+4608+64+
# 288+64+1024+128+40) + the 32x10 FC weight read as its 496-byte VLC buffer (640 dense); shared moves of the
# converted input (24576), the pooled vector (64) and the FC row (20).
BF16 = {
    "load": {"weights": 12312, "shared": 24660, "private": 0, "io": 49152},
    "store": {"weights": 0, "shared": 24660, "private": 0, "io": 40},
}
# cv180x (2 lanes) reads the quantized input as two 3x33x64 halves (one halo row each: 2 x 6336) and
# round-trips the first layers through shared memory.
CV180X = {
    "load": {"weights": 7064, "shared": 54314, "private": 12672, "io": 0},
    "store": {"weights": 0, "shared": 36906, "private": 0, "io": 40},
}
EXPECTED = {
    "smallcnn_cv183x_int8": INT8,
    "smallcnn_cv182x_int8": INT8,
    "smallcnn_cv181x_int8": INT8,
    "smallcnn_cv180x_int8": CV180X,
    "smallcnn_cv183x_bf16": BF16,
    "smallcnn_cv181x_bf16": BF16,
}


def _metered_run(model: CviModel, feeds: dict[str, np.ndarray], monkeypatch: pytest.MonkeyPatch) -> dict:
    """Run the simulator and count the global-memory bytes its TDMA executor reads and writes per region.

    A decompressing load reads its header, then the whole buffer from the same address: per descriptor the
    largest contiguous read is the buffer."""
    load, store = Counter(), Counter()
    contiguous: list[tuple[int, int]] = []
    read, read_bytes, write, tdma = GlobalMemory.read, GlobalMemory.read_bytes, GlobalMemory.write, Machine.tdma

    def metered_read(self, region, addr, shape, strides, fmt):
        load[_kind(region)] += int(np.prod(shape)) * FORMATS[fmt][0]
        return read(self, region, addr, shape, strides, fmt)

    def metered_read_bytes(self, region, addr, size):
        contiguous.append((region, size))
        return read_bytes(self, region, addr, size)

    def metered_write(self, region, addr, shape, strides, fmt, values):
        store[_kind(region)] += int(np.prod(shape)) * FORMATS[fmt][0]
        return write(self, region, addr, shape, strides, fmt, values)

    def metered_tdma(self, fields):
        contiguous.clear()
        tdma(self, fields)
        if contiguous:
            region, size = max(contiguous, key=lambda r: r[1])
            load[_kind(region)] += size

    monkeypatch.setattr(GlobalMemory, "read", metered_read)
    monkeypatch.setattr(GlobalMemory, "read_bytes", metered_read_bytes)
    monkeypatch.setattr(GlobalMemory, "write", metered_write)
    monkeypatch.setattr(Machine, "tdma", metered_tdma)
    run_cvimodel(model, feeds)
    return {"load": {**_zero(), **load}, "store": {**_zero(), **store}}


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_golden_traffic_matches_hand_count_and_simulator(stem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = read_cvimodel(GOLDEN / f"{stem}.cvimodel")
    traffic = tdma_traffic(model)
    expected = EXPECTED[stem]
    assert {k: traffic[k] for k in ("load", "store")} == expected
    assert traffic["region"] == {k: expected["load"][k] + expected["store"][k] for k in KINDS}
    assert traffic["total"] == sum(traffic["region"].values())
    assert traffic["estimated"] == 0
    feeds = {"input": np.load(GOLDEN / "smallcnn_in.npz")["input"]}
    assert _metered_run(model, feeds, monkeypatch) == expected


@pytest.mark.parametrize(
    "stem, bound",
    [
        ("smallcnn_cv183x_int8", {"weights": 7072, "inputs": 12288, "outputs": 40, "total": 19400}),
        ("smallcnn_cv180x_int8", {"weights": 7072, "inputs": 12288, "outputs": 40, "total": 19400}),
        ("smallcnn_cv181x_bf16", {"weights": 12464, "inputs": 49152, "outputs": 40, "total": 61656}),
    ],
)
def test_golden_lower_bound(stem: str, bound: dict[str, int]) -> None:
    # int8: the TPU routine starts from the CPU-quantized 1x3x64x64 int8 input; bf16 reads the fp32 input.
    assert lower_bound(read_cvimodel(GOLDEN / f"{stem}.cvimodel")) == bound


def test_npuc_smallcnn_build_traffic(monkeypatch: pytest.MonkeyPatch) -> None:
    data, summary = build_smallcnn("cv181x")
    model = read_cvimodel(data)
    traffic = tdma_traffic(model)
    feeds = {"input": np.load(GOLDEN / "smallcnn_in.npz")["input"]}
    assert {k: traffic[k] for k in ("load", "store")} == _metered_run(model, feeds, monkeypatch)
    # Every weight byte is loaded at most once, the 10 fp32 outputs once. The CPU quant routine's int8 input
    # lives in the shared region's plan, so no program takes private memory.
    assert traffic["load"]["weights"] <= summary["weight_bytes"]
    assert summary["private_gmem"] == 0 and traffic["load"]["private"] == 0
    assert traffic["load"]["shared"] >= 3 * 64 * 64
    assert traffic["store"]["io"] == 40
    assert lower_bound(model) == {
        "weights": summary["weight_bytes"],
        "inputs": 12288,
        "outputs": 40,
        "total": summary["weight_bytes"] + 12328,
    }
    assert traffic["total"] >= lower_bound(model)["total"] - summary["weight_bytes"] + traffic["load"]["weights"]


# ---- single descriptors -------------------------------------------------------------------------------

CHIP = CHIPS["cv181x"]


def _desc(**fields: int) -> dict[str, int]:
    base = dict.fromkeys((f.name for f in isa.tdma_table().fields), 0)
    base.update(src_n=1, src_c=2, src_h=3, src_w=4, dst_c=2, dst_h=3, dst_w=4, src_fmt=1, dst_fmt=1)
    return {**base, **fields}


def _moves(fields: dict[str, int], weight: bytes = b"") -> list[tuple[str, int, int, bool]]:
    return [(t.kind, t.region, t.nbytes, t.estimated) for t in descriptor_transfers(fields, CHIP, weight, "s", 0)]


def test_descriptor_directions_and_modes() -> None:
    assert _moves(_desc(trans_dir=0, src_base_reg_sel=3)) == [("load", 3, 24, False)]
    assert _moves(_desc(trans_dir=1, dst_base_reg_sel=0, src_fmt=2, dst_fmt=2)) == [("store", 0, 48, False)]
    assert _moves(_desc(trans_dir=2, src_base_reg_sel=1, dst_base_reg_sel=2, dst_c=6, dst_h=1)) == [
        ("load", 1, 24, False),
        ("store", 2, 24, False),
    ]
    assert _moves(_desc(trans_dir=3)) == []
    assert _moves(_desc(trans_dir=0, spec_func=4)) == []  # constant fill into local memory
    assert _moves(_desc(trans_dir=1, spec_func=4, dst_fmt=2)) == [("store", 0, 48, False)]
    # matrix mode: src_n rows of src_w (load) / dst_w (store) columns; src_c repeats the row count
    assert _moves(_desc(trans_dir=0, sys_dtype=1, src_n=32, src_c=32, src_h=1, src_w=10)) == [("load", 0, 320, False)]
    assert _moves(_desc(trans_dir=1, sys_dtype=1, src_n=5, dst_c=5, dst_h=1, dst_w=7, dst_fmt=2)) == [
        ("store", 0, 70, False)
    ]
    general = _desc(trans_dir=2, trans_fmt=1, src_n_stride=1000)  # a byte copy of src_n_stride bytes
    assert _moves(general) == [("load", 0, 1000, False), ("store", 0, 1000, False)]


def test_compressed_loads_count_the_buffer() -> None:
    values = np.arange(-50, 50, dtype=np.int8).repeat(4)  # 400 int8 values
    buf = compression.compress(values)
    weight = bytes(32) + buf
    f = _desc(trans_dir=0, compress_en=1, src_base_reg_sel=1, src_base_addr_low=32, src_c=4, src_h=10, src_w=10)
    header = compression.VlcHeader.unpack(buf)
    assert _moves(f, weight) == [("load", 1, 16 + 32 + header.stream_bytes, False)]
    assert 16 + 32 + header.stream_bytes == len(buf)
    # an activation source is not in the file: header + k-map + every block raw
    assert _moves({**f, "src_base_reg_sel": 0}, weight) == [("load", 0, 16 + 32 + 400, True)]
    with pytest.raises(CorruptFileError, match="outside the 32-byte"):
        _moves(f, bytes(32))
    with pytest.raises(CorruptFileError, match="past the weight section"):
        _moves(f, weight[:-1])


def test_bad_format_is_a_clear_error() -> None:
    with pytest.raises(CorruptFileError, match="byte 0 has src_fmt=3"):
        _moves(_desc(trans_dir=0, src_fmt=3))


def test_mutated_descriptors_never_crash() -> None:
    model = read_cvimodel(GOLDEN / "smallcnn_cv183x_bf16.cvimodel")
    (section, data), = model.cmdbufs().items()  # fmt: skip
    offsets = [i.offset for i in split_cmdbuf(data, CHIPS[model.chip]) if i.engine == isa.ENGINE_TDMA]
    rng = np.random.default_rng(7)
    outcomes = Counter()
    for _ in range(400):
        mutated = bytearray(data)
        at = int(rng.choice(offsets)) + isa.CMD_HDR_BYTES + int(rng.integers(0, isa.TDMA_BYTES))
        mutated[at] ^= 1 << int(rng.integers(0, 8))
        bad = dataclasses.replace(model, sections={**model.sections, section: bytes(mutated)})
        try:
            tdma_traffic(bad)
            outcomes["ok"] += 1
        except UserError:
            outcomes["rejected"] += 1
    assert outcomes["ok"] + outcomes["rejected"] == 400 and outcomes["rejected"] > 0


def test_cli_inspect_prints_traffic(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["inspect", str(GOLDEN / "smallcnn_cv183x_int8.cvimodel")])
    assert exit_info.value.code in (0, None)
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("DDR traffic"))
    assert lines[start : start + 4] == [
        "DDR traffic (TDMA, 18 transfers): 19476 bytes",
        "  loads:  weights 7064, shared 42, private 12288, io 0",
        "  stores: weights 0, shared 42, private 0, io 40",
        "  lower bound 19400 bytes (weights 7072, inputs 12288, outputs 40); traffic / bound = 1.004",
    ]


def test_cli_inspect_survives_an_uncountable_descriptor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = read_cvimodel(GOLDEN / "smallcnn_cv183x_int8.cvimodel")
    (section, data), = model.cmdbufs().items()  # fmt: skip
    first = split_cmdbuf(data, CHIPS[model.chip])[0]  # a TDMA load; set its src_fmt to the undefined 3
    fields = {**first.fields, "src_fmt": 3}
    body = isa.encode(isa.tdma_table(), fields)
    start = first.offset + isa.CMD_HDR_BYTES
    bad = dataclasses.replace(model, sections={**model.sections, section: data[:start] + body + data[start + 64 :]})
    path = tmp_path / "bad.cvimodel"
    path.write_bytes(write_cvimodel(bad))
    with pytest.raises(SystemExit) as exit_info:
        main(["inspect", str(path)])
    assert exit_info.value.code in (0, None)
    assert capsys.readouterr().out.rstrip().splitlines()[-1] == (
        f"DDR traffic: not counted (cmdbuf {section!r}: TDMA descriptor at byte 0 has src_fmt=3; "
        "only 1 (int8) and 2 (bf16) are defined)"
    )
