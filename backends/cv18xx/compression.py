"""The VLC compression of CV18xx TDMA transfers (descriptor bit compress_en=1): decoder and encoder.

tpu-mlir stores some weights compressed (the bf16 FC weights of the golden smallcnn files, for one) and loads
them with a decompressing TDMA copy. Facts, established from cvikernel's reference codec
(sophgo/cvikernel include/cvikernel/cvk_vlc_compress.h, the same as bm1880v2/bm_vlc_compress.h) and its TDMA
descriptor fill (src/bm1880v2/tdma.c, src/bm1822/tdma.c), and checked on the golden files:

- Buffer = 16-byte header + k-map (one byte per block, padded to 16 bytes) + block stream (padded to 16
  bytes). Bits are packed LSB first within each byte, everywhere.
- Header bits: [23:0] block-stream bytes; [28] signed int8; [29] bf16; [39:32] bias0; [46:40] bias1;
  [47] zero guard. A decompressing load takes these from the header: cvikernel leaves the descriptor's
  compress_bias0/1 and compress_zero_guard at 0 (they only parameterize compressing stores), and
  cmprs_fmt=1 marks int8 data.
- The data is cut into blocks of 16 symbols: 16 int8 bytes, or the 8-bit exponents of 16 bf16 values;
  blocks = ceil(elements / 16).
- k-map byte: Golomb-Rice order k in bits [7:5] (0..5; 7 = the block's 16 symbols stored raw, 128 bits) and
  ulen in bits [4:0]. A coded block is k bit planes of 16 bits (plane j = bit j of symbols 0..15), then - only
  for bf16 with zero guard and k > 0 - a 4-bit count of zero symbols, then a unary field of ulen+16 bits in
  which each symbol's quotient is the number of 0 bits before its terminating 1; symbol = quotient << k |
  remainder (mod 256). A coded block never exceeds 128 bits; the encoder keeps the first smallest order and
  falls back to raw above 128 bits.
- bf16: each block's exponent code is followed by its fraction bytes (sign << 7 | 7-bit mantissa), for all
  16 values, or with zero guard only for values with a non-zero exponent (the others decode to 0x0000).
- Symbols are remapped before coding: signed int8 by a zigzag of a "two-side circular shift" (positives
  shifted down by bias0, negatives by bias1); unsigned int8 not at all; bf16 exponents by a "center shift"
  around bias0 (the mean non-zero exponent), plus one with zero guard so that 0 stays 0.
- Encoder biases: signed int8 bias0 = smallest positive value - 1 and bias1 = -(largest negative value) - 1
  (0 when absent); bf16 bias0 = round(mean non-zero exponent) and zero guard = any zero exponent.

Decoding is vectorized over blocks, except that with zero guard a block's position depends on how many
non-zero exponents the previous block had, so the block positions are then found by a loop over blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from npuc.compiler.errors import CorruptFileError

HEADER_BYTES = 16
BLOCK = 16  # symbols per block
MAX_ORDER = 5
RAW_ORDER = 7  # k-map order meaning "stored raw"
MAX_UNARY_BITS = 47
MAX_CODE_BITS = 128
_PLANES = np.arange(MAX_ORDER)
_BYTE_VALUES = np.arange(256, dtype=np.int64)
_PLANE_WEIGHTS = (1 << _PLANES).astype(np.uint8)[:, None]
_PAD_BYTES = 32  # lets a block's 128-bit window (24 bytes gathered) read past the end without an IndexError


@dataclass(frozen=True)
class VlcHeader:
    """The 16-byte header; each field's (lsb, width) is in HEADER_FIELDS, used to pack and unpack."""

    stream_bytes: int
    signed: int
    bf16: int
    bias0: int
    bias1: int
    zero_guard: int

    def pack(self) -> bytes:
        word = 0
        for f in fields(self):
            lsb, width = HEADER_FIELDS[f.name]
            word |= (getattr(self, f.name) & ((1 << width) - 1)) << lsb
        return word.to_bytes(HEADER_BYTES, "little")

    @classmethod
    def unpack(cls, data: bytes) -> VlcHeader:
        word = int.from_bytes(data[:HEADER_BYTES], "little")
        return cls(**{name: (word >> lsb) & ((1 << w) - 1) for name, (lsb, w) in HEADER_FIELDS.items()})


HEADER_FIELDS: dict[str, tuple[int, int]] = {
    "stream_bytes": (0, 24),
    "signed": (28, 1),
    "bf16": (29, 1),
    "bias0": (32, 8),
    "bias1": (40, 7),
    "zero_guard": (47, 1),
}


def _align16(n: int) -> int:
    return -(-n // 16) * 16


def block_count(elements: int) -> int:
    return -(-elements // BLOCK)


def kmap_bytes(elements: int) -> int:
    return _align16(block_count(elements))


def max_stream_bytes(elements: int, bf16: bool) -> int:
    """The largest block stream a valid buffer can have (every block raw, bf16 fractions included)."""
    return block_count(elements) * BLOCK * (2 if bf16 else 1)


def compressed_size(header: VlcHeader, elements: int) -> int:
    """Bytes of a compressed buffer: header, k-map and block stream."""
    return HEADER_BYTES + kmap_bytes(elements) + header.stream_bytes


# ---- symbol remapping (all on int64 arrays holding byte values) ------------------------------------------


def _zigzag(v: np.ndarray) -> np.ndarray:
    """Signed -> unsigned: 0, -1, 1, -2, 2 ... -> 0, 1, 2, 3, 4 ..."""
    return (2 * np.abs(v) - (v < 0)) & 0xFF


def _unzigzag(u: np.ndarray) -> np.ndarray:
    half = (u + 1) >> 1
    return np.where(u & 1, -half, half)


def _as_int8(u: np.ndarray) -> np.ndarray:
    return ((u + 128) & 0xFF) - 128


def _center_range(bias: int) -> int:
    return bias if bias <= 128 else 255 - bias


def remap_exponents(e: np.ndarray, bias: int, zero_guard: int) -> np.ndarray:
    rng = _center_range(bias)
    shifted = (_zigzag(_as_int8(e - bias)) + zero_guard) & 0xFF
    if bias <= 128:
        out = np.where(e >= 2 * rng, e, shifted)
    else:
        out = np.where(e < bias - rng, (rng + bias - e + zero_guard) & 0xFF, shifted)
    return np.where((e == 0) & bool(zero_guard), 0, out)


def unmap_exponents(u: np.ndarray, bias: int, zero_guard: int) -> np.ndarray:
    rng = _center_range(bias)
    unsigned = (u - zero_guard) & 0xFF
    centred = (_unzigzag(unsigned) + bias) & 0xFF
    if bias <= 128:
        out = np.where(u >= 2 * rng, u, centred)
    else:
        out = np.where(unsigned > 2 * rng, (rng + bias - u + zero_guard) & 0xFF, centred)
    return np.where((u == 0) & bool(zero_guard), 0, out)


def remap_int8(b: np.ndarray, bias0: int, bias1: int) -> np.ndarray:
    v = _as_int8(b)
    neg = v < 0
    a = np.abs(v) - np.where(neg, bias1, bias0)
    a = np.where(a <= 0, a + 127 + neg, a)
    return _zigzag(np.where(v == 0, 0, _as_int8(np.where(neg, -a, a))))


def unmap_int8(u: np.ndarray, bias0: int, bias1: int) -> np.ndarray:
    v = _unzigzag(u)
    neg = v < 0
    a = np.abs(v) + np.where(neg, bias1, bias0)
    over = a - (127 + neg)
    low = np.where(over <= 0, a, over) & 0xFF
    return np.where(v == 0, 0, np.where(neg, -low, low)) & 0xFF


# ---- decoding ---------------------------------------------------------------------------------------------


def _bytes_at(data: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The byte whose LSB is at bit position pos (any shape) of the zero-padded stream `data`."""
    at, shift = pos >> 3, (pos & 7).astype(np.uint16)
    pair = data[at].astype(np.uint16) | (data[at + 1].astype(np.uint16) << 8)
    return ((pair >> shift) & 0xFF).astype(np.int64)


def _windows(data: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 128 bits from each bit position in `starts` of the zero-padded stream, as (low, high) uint64 words."""
    words = sliding_window_view(data, 24)[starts >> 3].view("<u8")  # 3 words from each start's byte
    shift = (starts & 7).astype(np.uint64)[:, None]
    back = np.uint64(63) - shift  # a shift by 64 - shift in two steps, so that shift 0 stays defined
    both = (words[:, :2] >> shift) | ((words[:, 1:] << back) << np.uint64(1))
    return both[:, 0], both[:, 1]


def _shift_right(low: np.ndarray, high: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """The low 64 bits of the 128-bit (low, high) shifted right by `shift` (0 .. 127)."""
    shift = shift.astype(np.uint64)
    small = np.minimum(shift, np.uint64(63))
    below = (low >> small) | ((high << (np.uint64(63) - small)) << np.uint64(1))
    return np.where(shift < 64, below, high >> (np.maximum(shift, np.uint64(64)) - np.uint64(64)))


@dataclass
class _BlockCodes:
    order: np.ndarray  # Golomb-Rice k, -1 for raw blocks
    ulen: np.ndarray  # unary field bits - 16
    zero_count_bits: np.ndarray  # 4 where the block carries a zero count, else 0
    code_bits: np.ndarray  # bits of the symbol code

    @classmethod
    def from_kmap(cls, kmap: np.ndarray, zero_guard: bool, where: str) -> _BlockCodes:
        k = (kmap >> 5).astype(np.int64)
        raw = k == RAW_ORDER
        if np.any(~raw & (k > MAX_ORDER)):
            bad = int(np.flatnonzero(~raw & (k > MAX_ORDER))[0])
            raise CorruptFileError(f"{where}: VLC block {bad} has order {k[bad]} (at most {MAX_ORDER}, or 7 = raw)")
        ulen = (kmap & 0x1F).astype(np.int64)
        znum = np.where(zero_guard & (k > 0) & ~raw, 4, 0)
        code_bits = np.where(raw, MAX_CODE_BITS, BLOCK * k + znum + ulen + BLOCK)
        if np.any(code_bits > MAX_CODE_BITS):
            bad = int(np.flatnonzero(code_bits > MAX_CODE_BITS)[0])
            raise CorruptFileError(f"{where}: VLC block {bad} claims {code_bits[bad]} code bits (at most 128)")
        return cls(np.where(raw, -1, k), ulen, znum, code_bits)

    def symbols(self, data: np.ndarray, starts: np.ndarray, blocks: np.ndarray, where: str) -> np.ndarray:
        """Decoded (remapped) symbols, shape (len(blocks), 16), of the given blocks at the given bit starts of
        the zero-padded stream `data`. Each block is read as the 128-bit window from its start (a code never
        has more bits): raw blocks are its 16 bytes; a coded block's k remainder planes are its first 16-bit
        fields, transposed into per-symbol bits, and its unary field the window shifted past them."""
        k = self.order[blocks]
        out = np.zeros((len(blocks), BLOCK), np.int64)
        low, high = _windows(data, starts)
        raw = k < 0
        out[raw] = np.stack([low[raw], high[raw]], axis=1).view(np.uint8)
        coded = ~raw
        kc, low, high = k[coded], low[coded], high[coded]
        fields = np.stack([low, low >> 16, low >> 32, low >> 48, high], axis=1).astype(np.uint16)
        fields *= _PLANES < kc[:, None]  # planes beyond the block's order are not its own
        plane_bits = np.unpackbits(fields.view(np.uint8).reshape(-1, MAX_ORDER, 2), axis=2, bitorder="little")
        remainder = (plane_bits * _PLANE_WEIGHTS).sum(axis=1, dtype=np.int64)
        ulen = self.ulen[blocks][coded]
        unary = _shift_right(low, high, BLOCK * kc + self.zero_count_bits[blocks][coded])
        unary &= (np.uint64(1) << (ulen + BLOCK).astype(np.uint64)) - np.uint64(1)
        quotient, previous = np.empty((len(kc), BLOCK), np.int64), np.full(len(kc), -1, np.int64)
        for j in range(BLOCK):  # symbol j's quotient: the zeros before the next set bit of the unary field
            lowest = unary & (~unary + np.uint64(1))
            if not lowest.all():
                _not_16_symbols(blocks[coded], lowest == 0, where)
            at = np.frexp(lowest.astype(np.float64))[1] - 1  # a power of two converts exactly
            quotient[:, j], previous = at - previous - 1, at
            unary ^= lowest
        if unary.any():
            _not_16_symbols(blocks[coded], unary != 0, where)
        out[coded] = ((quotient << kc[:, None]) + remainder) & 0xFF
        return out


def _not_16_symbols(blocks: np.ndarray, bad: np.ndarray, where: str) -> None:
    raise CorruptFileError(f"{where}: VLC block {int(blocks[np.flatnonzero(bad)[0]])} does not code 16 symbols")


def _zero_symbols(word: int, order: int, ulen: int) -> int:
    """Zero symbols of the block whose code starts at bit 0 of `word` (remapped 0 <=> exponent 0 with guard)."""
    if order < 0:
        return (word & ((1 << MAX_CODE_BITS) - 1)).to_bytes(BLOCK, "little").count(0)
    if order > 0:  # the block's own zero-count field
        return (word >> (BLOCK * order)) & 0xF
    unary = word & ((1 << (ulen + BLOCK)) - 1)  # a zero symbol's 1 follows the previous symbol's 1 directly
    return bin(unary & ((unary << 1) | 1)).count("1")


def _block_starts(
    codes: _BlockCodes, stream: bytes, header: VlcHeader, elements: int, where: str
) -> tuple[np.ndarray, np.ndarray | None]:
    """Bit position of every block, checked to stay inside the stream; with zero guard also the fraction counts.

    With zero guard a block's fraction bytes follow only its non-zero exponents, so each position depends on
    the previous block: a scan over blocks reads just the zero count (k > 0), the unary field (k = 0) or the
    raw bytes, and decompress() checks the counts against the full decode.
    """
    n = len(codes.code_bits)
    limit = 8 * header.stream_bytes
    if not (header.bf16 and header.zero_guard):  # fixed fraction count: positions are a prefix sum
        valid = np.minimum(elements - BLOCK * np.arange(n), BLOCK)
        sizes = codes.code_bits + (8 * valid if header.bf16 else 0)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        end, fractions = (int(starts[-1] + sizes[-1]) if n else 0), None
    else:
        starts, fractions = np.zeros(n, np.int64), np.zeros(n, np.int64)
        end = 0
        order, ulen, code_bits = codes.order.tolist(), codes.ulen.tolist(), codes.code_bits.tolist()
        for i in range(n):
            starts[i] = end
            if end + code_bits[i] > limit:
                break
            word = int.from_bytes(stream[end >> 3 : (end >> 3) + BLOCK + 1], "little") >> (end & 7)
            fractions[i] = BLOCK - _zero_symbols(word, order[i], ulen[i])  # padding symbols are zeros too
            end += code_bits[i] + 8 * int(fractions[i])
    if end > limit:
        raise CorruptFileError(f"{where}: VLC blocks need {end} bits but the stream holds {limit}")
    return starts, fractions


def decompress(data: bytes | np.ndarray, elements: int, bf16: bool, where: str = "VLC data") -> np.ndarray:
    """Decode `elements` values from a compressed buffer: uint8 bytes for int8 data, uint16 bits for bf16."""
    buf = np.frombuffer(data, np.uint8) if isinstance(data, (bytes, bytearray)) else np.asarray(data, np.uint8)
    if len(buf) < HEADER_BYTES:
        raise CorruptFileError(f"{where}: {len(buf)} bytes cannot hold the 16-byte VLC header")
    header = VlcHeader.unpack(buf[:HEADER_BYTES].tobytes())
    if header.bf16 != int(bf16):
        kinds = ("int8", "bf16")
        raise CorruptFileError(f"{where}: VLC header says {kinds[header.bf16]} data, the transfer is {kinds[bf16]}")
    if header.stream_bytes > max_stream_bytes(elements, bf16) + 16:
        raise CorruptFileError(f"{where}: VLC stream of {header.stream_bytes} bytes for only {elements} values")
    if len(buf) < compressed_size(header, elements):
        raise CorruptFileError(f"{where}: VLC buffer needs {compressed_size(header, elements)} bytes, has {len(buf)}")
    n = block_count(elements)
    kmap = buf[HEADER_BYTES : HEADER_BYTES + n]
    stream_at = HEADER_BYTES + kmap_bytes(elements)
    stream = buf[stream_at : stream_at + header.stream_bytes]
    padded = np.concatenate([stream, np.zeros(_PAD_BYTES, np.uint8)])
    codes = _BlockCodes.from_kmap(kmap, bool(bf16 and header.zero_guard), where)
    starts, fractions = _block_starts(codes, stream.tobytes(), header, elements, where)
    symbols = codes.symbols(padded, starts, np.arange(n), where)
    if not bf16:  # the remapping is a function of the byte: a 256-entry table
        out = unmap_int8(_BYTE_VALUES, header.bias0, header.bias1)[symbols] if header.signed else symbols
        return out.reshape(-1)[:elements].astype(np.uint8)
    exps = unmap_exponents(_BYTE_VALUES, header.bias0, header.zero_guard)[symbols]
    stored = (np.arange(n * BLOCK) < elements).reshape(n, BLOCK)
    if header.zero_guard:
        stored &= exps != 0
        if np.any(stored.sum(axis=1) != fractions):
            bad = int(np.flatnonzero(stored.sum(axis=1) != fractions)[0])
            raise CorruptFileError(f"{where}: VLC block {bad}'s zero count disagrees with its exponents")
    frac_pos = starts[:, None] + codes.code_bits[:, None] + 8 * (np.cumsum(stored, axis=1) - 1)
    frac = np.where(stored, _bytes_at(padded, np.maximum(frac_pos, 0)), 0)
    out = ((frac >> 7) << 15) | (exps << 7) | (frac & 0x7F)
    return out.reshape(-1)[:elements].astype(np.uint16)


# ---- encoding ---------------------------------------------------------------------------------------------


def estimate_header(values: np.ndarray) -> VlcHeader:
    """cvikernel's bias choice for int8 (signed or unsigned) or bf16 (raw uint16) data; stream size left 0."""
    if values.dtype == np.uint16:
        counts = np.bincount((values >> 7).astype(np.uint8), minlength=256)
        nonzero = len(values) - int(counts[0])
        total = int((counts * np.arange(256)).sum())
        bias0 = int(np.float32(total) / np.float32(nonzero) + 0.5) if nonzero else 0
        return VlcHeader(0, 0, 1, bias0, 0, int(nonzero < len(values)))
    if values.dtype == np.uint8:
        return VlcHeader(0, 0, 0, 0, 0, 0)
    present = np.flatnonzero(np.bincount(values.view(np.uint8), minlength=256))  # byte values that occur
    signed = np.where(present < 128, present, present - 256)
    pos, neg = signed[signed > 0], signed[signed < 0]
    bias0 = int(pos.min()) - 1 if len(pos) else 0
    bias1 = -int(neg.max()) - 1 if len(neg) else 0
    return VlcHeader(0, 1, 0, bias0, bias1, 0)


def _words(symbols: np.ndarray) -> np.ndarray:
    """Each block's 16 byte symbols as two little-endian uint64 words, shape (n, 2)."""
    return np.ascontiguousarray(symbols, np.uint8).view("<u8").astype(np.uint64)


def _byte_mask(byte: int) -> np.uint64:
    return np.uint64(int.from_bytes(bytes([byte] * 8), "little"))


_PAIRS = _byte_mask(0xFF) & np.uint64(0x00FF00FF00FF00FF)  # the low byte of every 16-bit lane
_LANE_SUM = np.uint64(0x0001000100010001)  # times this, >> 48: the sum of the four 16-bit lanes
_GATHER = np.uint64(0x0102040810204080)  # times this, >> 56: bit 0 of bytes 0..7 as one byte (no carries)


def _shifted_sums(words: np.ndarray, k: int) -> np.ndarray:
    """Per block, the sum of its 16 symbols >> k, summed within the uint64 words (bytes, then 16-bit lanes)."""
    z = (words >> np.uint64(k)) & _byte_mask(0xFF >> k)
    lanes = (z & _PAIRS) + ((z >> np.uint64(8)) & _PAIRS)
    sums = (lanes * _LANE_SUM) >> np.uint64(48)
    return (sums[:, 0] + sums[:, 1]).astype(np.int32)


def _choose_orders(symbols: np.ndarray, zero_count: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per block the first order with the fewest code bits (-1 = raw) and its unary field length."""
    words = _words(symbols)
    unary = np.stack([_shifted_sums(words, k) + BLOCK for k in range(MAX_ORDER + 1)], axis=1)
    k = np.arange(MAX_ORDER + 1)
    size = np.where(unary <= MAX_UNARY_BITS, BLOCK * k + unary + np.where(zero_count & (k > 0), 4, 0), 255)
    best = size.argmin(axis=1)
    rows = np.arange(len(symbols))
    return np.where(size[rows, best] > MAX_CODE_BITS, -1, best), unary[rows, best]


_U64 = np.uint64


def _block_codes(
    symbols: np.ndarray, k: np.ndarray, raw: np.ndarray, znum: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each block's code as a 128-bit number (low, high uint64 words), bit 0 first in the stream: raw blocks
    their 16 symbol bytes; coded blocks k bit planes of 16 bits, where znum is 4 the block's count of zero
    symbols in 4 bits, then the unary field with a 1 ending each symbol's quotient."""
    n = len(symbols)
    lo, hi = np.zeros(n, _U64), np.zeros(n, _U64)
    if not n:
        return lo, hi
    lanes = symbols.astype(np.uint8)
    words = _words(lanes)
    for j in range(MAX_ORDER):  # plane j: bit j of symbols 0..15, at code bit 16j
        gathered = (((words >> _U64(j)) & _byte_mask(1)) * _GATHER) >> _U64(56)
        plane = np.where(k > j, gathered[:, 0] | (gathered[:, 1] << _U64(8)), _U64(0))
        if j < 4:
            lo |= plane << _U64(16 * j)
        else:
            hi |= plane
    zeros = np.where(znum > 0, (symbols == 0).sum(axis=1) & 0xF, 0).astype(_U64)  # at code bit 16k: 16..80
    lo |= np.where(k < 4, zeros << (BLOCK * k & 63).astype(_U64), _U64(0))
    hi |= np.where(k >= 4, zeros << (BLOCK * k - 64 & 63).astype(_U64), _U64(0))
    quotient = lanes >> k[:, None].astype(np.uint8)
    ends = np.cumsum(quotient + np.uint8(1), axis=1, dtype=np.uint8) - np.uint8(1)  # each symbol's closing 1
    ends[raw] = 0  # (raw blocks wrap around in uint8; their words are set below)
    unary = np.bitwise_or.reduce(np.left_shift(_U64(1), ends.astype(_U64)), axis=1)
    at = (BLOCK * k + znum).astype(np.int64)  # where the unary field starts: 0..84
    low_part = at < 64
    lo |= np.where(low_part, unary << (at & 63).astype(_U64), _U64(0))
    spill = np.where(at > 0, unary >> ((64 - at) & 63).astype(_U64), _U64(0))
    hi |= np.where(low_part, spill, unary << ((at - 64) & 63).astype(_U64))
    lo[raw], hi[raw] = words[raw, 0], words[raw, 1]
    return lo, hi


def _or_at_bits(words: np.ndarray, starts: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
    """OR 128-bit pieces (lo, hi) into the uint64 word array at the given bit positions (pieces don't overlap)."""
    w = starts >> 6
    r = (starts & 63).astype(_U64)
    back = ((64 - starts) & 63).astype(_U64)  # 64 - r, as a shift that is 0 (masked below) when r = 0
    shifted = r != 0
    np.bitwise_or.at(words, w, lo << r)
    np.bitwise_or.at(words, w + 1, (hi << r) | np.where(shifted, lo >> back, _U64(0)))
    np.bitwise_or.at(words, w + 2, np.where(shifted, hi >> back, _U64(0)))


def compress(values: np.ndarray) -> bytes:
    """Compress int8 (signed), uint8 (unsigned) or bf16 (uint16 bits) values the way cvikernel does."""
    values = np.asarray(values).reshape(-1)
    if values.dtype not in (np.int8, np.uint8, np.uint16):
        raise TypeError(f"VLC compresses int8, uint8 or bf16 bits (uint16), not {values.dtype}")
    header = estimate_header(values)
    elements, n = len(values), block_count(len(values))
    padded = np.zeros(n * BLOCK, np.uint16 if values.dtype == np.uint16 else np.uint8)
    padded[:elements] = values.view(np.uint8 if values.dtype == np.int8 else values.dtype)
    padded = padded.reshape(n, BLOCK)
    byte_values = np.arange(256)
    if header.bf16:  # the remaps are byte -> byte tables, applied by lookup
        exps, frac = (padded >> 7).astype(np.uint8), ((padded >> 15) << 7 | (padded & 0x7F)).astype(np.uint8)
        symbols = remap_exponents(byte_values, header.bias0, header.zero_guard).astype(np.uint8)[exps]
    elif header.signed:
        symbols = remap_int8(byte_values, header.bias0, header.bias1).astype(np.uint8)[padded]
    else:
        symbols = padded
    zero_count = bool(header.bf16 and header.zero_guard)
    order, unary_bits = _choose_orders(symbols, zero_count)
    raw = order < 0
    k = np.maximum(order, 0)
    znum = np.where(zero_count & (k > 0) & ~raw, 4, 0)
    code_bits = np.where(raw, MAX_CODE_BITS, BLOCK * k + znum + unary_bits)
    lo, hi = _block_codes(symbols, k, raw, znum)
    length = code_bits.astype(np.int64)
    if header.bf16:  # each block's fraction bytes follow its code: the stored ones, packed in order
        stored = (exps != 0) if header.zero_guard else np.ones_like(exps, bool)
        packed = np.zeros((n, BLOCK), np.uint8)
        r, i = np.nonzero(stored)
        packed[r, (np.cumsum(stored, axis=1) - 1)[r, i]] = frac[r, i]
        length += 8 * stored.sum(axis=1)
    starts = np.cumsum(length) - length
    total = int(length.sum())
    words = np.zeros(total // 64 + 3, np.uint64)  # room for the last piece's spill
    _or_at_bits(words, starts, lo, hi)
    if header.bf16:
        frac_words = packed.view("<u8")
        _or_at_bits(words, starts + code_bits, frac_words[:, 0], frac_words[:, 1])
    stream = words.astype("<u8").view(np.uint8)[: -(-total // 8)].tobytes()
    stream += bytes(_align16(len(stream)) - len(stream))
    kmap = np.where(raw, 0xE0, (k << 5) | ((unary_bits - BLOCK) & 0x1F)).astype(np.uint8).tobytes()
    kmap += bytes(kmap_bytes(elements) - n)
    head = VlcHeader(len(stream), header.signed, header.bf16, header.bias0, header.bias1, header.zero_guard)
    return head.pack() + kmap + stream
