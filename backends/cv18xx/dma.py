"""TDMA descriptors the code generator emits: tensor loads and stores, matrix-mode moves, constant fills.

Field meanings: specs/cv18xx.md §3.4 "TDMA load/store". The global side selects its region with a base
register and carries the region offset (plus 4 GiB on cv183x); the local side carries the lane offset.
"""

from __future__ import annotations

from npuc.backends.cv18xx.emit import CmdStream
from npuc.backends.cv18xx.lmem import TDMA_FMT, GTensor, LTensor


def _strides(prefix: str, n: int, c: int, h: int) -> dict[str, int]:
    return {
        f"{prefix}_n_stride": n,
        f"{prefix}_c_stride_low": c & 0xFFFF,
        f"{prefix}_c_stride_high": c >> 16,
        f"{prefix}_h_stride": h,
    }


def _global(stream: CmdStream, side: str, g: GTensor) -> dict[str, int]:
    addr = g.offset + stream.chip.gmem_base
    return {
        f"{side}_base_reg_sel": g.region,
        f"{side}_base_addr_low": addr & 0xFFFFFFFF,
        f"{side}_base_addr_high": addr >> 32,
        **_strides(side, *g.strides[:3]),
    }


def _local(side: str, t: LTensor) -> dict[str, int]:
    return {f"{side}_base_addr_low": t.addr, **_strides(side, *t.strides[:3])}


def _shapes(src: tuple[int, ...], dst: tuple[int, ...]) -> dict[str, int]:
    return {
        "src_n": src[0],
        "src_c": src[1],
        "src_h": src[2],
        "src_w": src[3],
        "dst_c": dst[1],
        "dst_h": dst[2],
        "dst_w": dst[3],
    }


def _formats(src: str, dst: str) -> dict[str, int]:
    # int8_sign marks signed bytes; a u8 source (a camera frame) leaves it clear
    return {"src_fmt": TDMA_FMT[src], "dst_fmt": TDMA_FMT[dst], "int8_sign": int("i8" in (src, dst))}


def load(stream: CmdStream, src: GTensor, dst: LTensor) -> None:
    """gmem -> lmem, same element count; an int8 source into a bf16 tile converts on the way. A compressed
    source is decoded on the way (its VLC header carries the coding parameters; cmprs_fmt marks int8)."""
    fields = {
        "trans_dir": 0,
        **_global(stream, "src", src),
        **_local("dst", dst),
        **_shapes(src.shape, dst.shape),
        **_formats(src.fmt, dst.fmt),
    }
    if src.compressed:
        fields.update(compress_en=1, cmprs_fmt=int(src.fmt == "i8"))
    stream.tdma(fields)


def store(stream: CmdStream, src: LTensor, dst: GTensor) -> None:
    stream.tdma(
        {
            "trans_dir": 1,
            **_local("src", src),
            **_global(stream, "dst", dst),
            **_shapes(src.shape, dst.shape),
            **_formats(src.fmt, dst.fmt),
        }
    )


def load_matrix(stream: CmdStream, src: GTensor, rows: int, cols: int, row_pitch: int, dst: LTensor) -> None:
    """A rows x cols global matrix (row pitch in bytes) into the local matrix layout (rows, c, 1, w). A
    compressed source is one VLC buffer of exactly those rows x cols values, decoded on the way."""
    e = dst.esz
    g = GTensor(src.region, src.offset, (rows, 1, 1, cols), src.fmt, (row_pitch, row_pitch, cols * e, e))
    fields = {
        "trans_dir": 0,
        "sys_dtype": 1,
        **_global(stream, "src", g),
        **_local("dst", dst),
        **_shapes((rows, rows, 1, cols), dst.shape),  # matrix mode repeats the row count in src_c
        **_formats(src.fmt, dst.fmt),
    }
    fields.update({"src_n_stride": 1, "src_c_stride_low": row_pitch, "src_c_stride_high": 0, "src_h_stride": 1})
    if src.compressed:
        fields.update(compress_en=1, cmprs_fmt=int(src.fmt == "i8"))
    stream.tdma(fields)


def store_matrix(stream: CmdStream, src: LTensor, dst: GTensor, rows: int, cols: int, row_pitch: int) -> None:
    fields = {
        "trans_dir": 1,
        "sys_dtype": 1,
        **_local("src", src),
        **_global(stream, "dst", dst),
        **_shapes(src.shape, (rows, rows, 1, cols)),
        **_formats(src.fmt, dst.fmt),
    }
    fields.update({"dst_n_stride": 1, "dst_c_stride_low": row_pitch, "dst_c_stride_high": 0, "dst_h_stride": 1})
    stream.tdma(fields)


def copy_global(stream: CmdStream, src: GTensor, dst: GTensor) -> None:
    """gmem -> gmem with arbitrary n/c/h strides on both sides (w is contiguous)."""
    stream.tdma(
        {
            "trans_dir": 2,
            **_global(stream, "src", src),
            **_global(stream, "dst", dst),
            **_shapes(src.shape, dst.shape),
            **_formats(src.fmt, dst.fmt),
        }
    )


def copy_local(stream: CmdStream, src: LTensor, dst: LTensor, round_toward_zero: bool = False,
               exponent_index: bool = False) -> None:  # fmt: skip
    """lmem -> lmem, same element count, converting between int8 and bf16 when the formats differ; bf16 ->
    int8 rounds to nearest even, or toward zero with `round_toward_zero` (`int8_rnd_mode`), and saturates.
    `exponent_index` (bf16 -> bf16, `mv_lut_idx`) writes each value's exponent-table index instead: the sign
    in bit 7, the unbiased exponent + 63 in bits 0..6 (a lookup then reads it as the low byte)."""
    fields = {
        "trans_dir": 3,
        **_local("src", src),
        **_local("dst", dst),
        **_shapes(src.shape, dst.shape),
        **_formats(src.fmt, dst.fmt),
        "int8_rnd_mode": int(round_toward_zero),
    }
    if exponent_index:
        fields["mv_lut_idx"] = 1
    stream.tdma(fields)
