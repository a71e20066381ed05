"""DV700 packed conv weights: the byte layout of `<net>_weights.bin` (spec §1.8), both ways.

Per run: [512-byte fp16 LUT if 8-bit] then, per block of 8 output channels, 8 fp16 biases, [8 fp16 PReLU
slopes], and 12x6 panels (uint8 LUT indices or fp16) holding the kernels; the run is padded to 16 bytes.
A panel holds a fixed set of input channels per kernel size (64 for 1x1, 8 for 3x3, 2 for 5x5, 1 for 7x7),
placed by a per-size slot map. Dilated convs store one 1x1 pack per kernel tap instead.

Transposed weights (the convertor's default, `transpose_weight=1`): every kernel is stored with kx and ky
exchanged, and a non-square or even kernel is padded at the bottom and left before the exchange (at the top
and right otherwise), so the HW reads the real kernel from the same panel cells either way. The 8-bit LUT is
OpenCV's k-means over the stored (padded, exchanged) values, as the convertor computes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from npuc.compiler import coverage
from npuc.compiler.errors import CorruptFileError, UserError

PANEL_ROWS, PANEL_COLS = 12, 6
PANEL = PANEL_ROWS * PANEL_COLS
LUT_BYTES = 512
LUT_CLUSTERS = 255


@dataclass(frozen=True)
class PanelScheme:
    """How one kernel size fills panels: `per_panel` channels per panel, iterated in groups of `group`."""

    per_panel: int
    group: int


SCHEMES: dict[int, PanelScheme] = {
    1: PanelScheme(64, 64),
    3: PanelScheme(8, 8),
    5: PanelScheme(2, 8),
    7: PanelScheme(1, 8),
}


@dataclass(frozen=True)
class PackedConv:
    """A conv run's weights as the HW reads them (decoded form). `weight` is (M, C, kh, kw) float32."""

    weight: np.ndarray
    bias: np.ndarray
    prelu: np.ndarray | None = None
    lut: np.ndarray | None = None  # 256 fp16 values (as float32) when 8-bit


def round_up(n: int, k: int = 16) -> int:
    return -(-n // k) * k


def effective_kernel(kh: int, kw: int) -> int:
    """The HW kernel: the next odd size >= max(kh, kw)."""
    return max(kh, kw) | 1


def panel_channels(c: int, p: int) -> int:
    """Panels per output channel: Cg of the size formula."""
    return -(-c // SCHEMES[p].per_panel)


def conv_weight_size(m: int, c: int, kh: int, kw: int, *, quantized: bool, prelu: bool = False) -> int:
    """Bytes of a non-dilated conv run (the tool's `_get_weight_size`); c is C/group (1 for depthwise)."""
    p = effective_kernel(kh, kw)
    if p not in SCHEMES:
        raise UserError(f"kernel {kh}x{kw} is larger than the DV700 maximum 7x7; use a smaller kernel")
    blocks = -(-m // 8)
    header = 16 * blocks * (2 if prelu else 1)
    if quantized:
        return round_up(LUT_BYTES + PANEL * m * panel_channels(c, p) + header)
    return 2 * PANEL * m * panel_channels(c, p) + header


def dilated_weight_size(m: int, c: int, kh: int, kw: int, *, quantized: bool) -> int:
    """Bytes of a dilated conv run: [LUT] + one 16-byte-aligned 1x1 pack per kernel tap."""
    tap = round_up(PANEL * (1 if quantized else 2) * m * -(-c // 64) + 16 * -(-m // 8))
    return (LUT_BYTES if quantized else 0) + kh * kw * tap


# ---------------------------------------------------------------------------------------------------------
# 8-bit LUT (255 clusters + a 0.0 entry)
# ---------------------------------------------------------------------------------------------------------


# The convertor's k-means: OpenCV, k-means++ seeding, 3 attempts, at most 10 steps or a 1e-6 move.
KMEANS_ATTEMPTS, KMEANS_STEPS, KMEANS_EPS = 3, 10, 1e-6


def reset_kmeans_seed(seed: int = 0) -> None:
    """Put OpenCV's random state where the convertor's process starts (seed 0: OpenCV's initial state, as
    the convertor without --cv2_seed). Every layer's clustering advances that state, so a network's LUTs
    match the convertor's only when they are made in its order from this start."""
    import cv2

    cv2.setRNGSeed(int(seed))


def cluster_lut(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lut, indices): 256 fp16 entries (entry 0 = 0.0, then min(255, n) k-means centres in OpenCV's
    cluster order, zero-filled) and the uint8 index (cluster + 1) of every value, shaped like `values`."""
    import cv2

    flat = np.ascontiguousarray(np.asarray(values, np.float32).reshape(-1, 1))
    clusters = min(LUT_CLUSTERS, flat.shape[0])
    if coverage.in_trial():  # the LUT's bytes are thrown away: evenly spaced levels instead of minutes of k-means
        levels = np.linspace(flat.min(), flat.max(), clusters, dtype=np.float32)
        nearest = np.clip(np.searchsorted(levels, flat.reshape(np.shape(values))), 0, clusters - 1)
        lut = np.zeros(256, np.float16)
        lut[1 : 1 + clusters] = levels.astype(np.float16)
        return lut, (nearest + 1).astype(np.uint8)
    criteria = (cv2.TERM_CRITERIA_EPS + cv2.TERM_CRITERIA_COUNT, KMEANS_STEPS, KMEANS_EPS)
    _, labels, centres = cv2.kmeans(flat, clusters, None, criteria, KMEANS_ATTEMPTS, cv2.KMEANS_PP_CENTERS)
    lut = np.zeros(256, np.float16)
    lut[1 : 1 + clusters] = centres.reshape(-1).astype(np.float16)
    return lut, (labels.reshape(np.shape(values)) + 1).astype(np.uint8)


# ---------------------------------------------------------------------------------------------------------
# Panel slot maps
# ---------------------------------------------------------------------------------------------------------


@cache
def slot_map(p: int) -> np.ndarray:
    """Flat panel cell (row*6+col) of every (channel slot t, ky, kx) of a p x p kernel: (per_panel, p, p)."""
    t, y, x = np.meshgrid(np.arange(SCHEMES[p].per_panel), np.arange(p), np.arange(p), indexing="ij")
    if p == 1:
        g = (t & 63) >> 3
        row, col = 11 - 3 * ((t & 7) >> 1) - g // 3, 3 * (t & 1) + g % 3
    elif p == 3:
        row, col = 9 - 3 * (t >> 1) + y, 3 * (t & 1) + x
    elif p == 5:
        row, col = 7 - 6 * t + y, x
    else:  # 7: columns 0..5 in rows 5..11, the 7th column scattered to three spare cells
        spare = np.array([2 * 6 + 5, 0 * 6 + 3, 1 * 6 + 3, 2 * 6 + 3, 0, 1 * 6, 2 * 6])
        flat = np.where(x < 6, (5 + y) * 6 + np.minimum(x, 5), spare[y])
        flat.setflags(write=False)
        return flat
    flat = row * PANEL_COLS + col
    flat.setflags(write=False)
    return flat


def stored_kernels(w: np.ndarray, transposed: bool = False) -> np.ndarray:
    """(M, C, kh, kw) -> (M, C, p, p) as stored: zeros at the top and right, or, transposed, zeros at the
    bottom and left and then kx and ky exchanged. These are the values the 8-bit LUT clusters."""
    m, c, kh, kw = w.shape
    p = effective_kernel(kh, kw)
    if not transposed:
        return np.pad(w, ((0, 0), (0, 0), (p - kh, 0), (0, p - kw)))
    return np.pad(w, ((0, 0), (0, 0), (0, p - kh), (p - kw, 0))).transpose(0, 1, 3, 2)


def _stored_taps(w: np.ndarray, transposed: bool) -> np.ndarray:
    """A dilated kernel's taps in storage order: transposed, the exchanged (kw, kh) data read back as
    (kh, kw), as the convertor reshapes it (the same thing for the odd square kernels DV700 dilates)."""
    return np.ascontiguousarray(w.transpose(0, 1, 3, 2)).reshape(w.shape) if transposed else w


def _model_taps(stored: np.ndarray, transposed: bool) -> np.ndarray:
    m, c, kh, kw = stored.shape
    return stored.reshape(m, c, kw, kh).transpose(0, 1, 3, 2) if transposed else stored


def _panel_order(m: int, c: int, p: int) -> tuple[int, int, np.ndarray]:
    """(groups, sub-panels per group, mask (M8, G, S) of panels that exist) for M8 = m rounded up to 8."""
    scheme = SCHEMES[p]
    groups, sub = -(-c // scheme.group), scheme.group // scheme.per_panel
    first_channel = np.arange(groups)[:, None] * scheme.group + np.arange(sub)[None, :] * scheme.per_panel
    m_ok = np.arange(round_up(m, 8)) < m
    return groups, sub, m_ok[:, None, None] & (first_channel < c)[None]


def _block_layout(cells: np.ndarray, m: int, exists: np.ndarray, headers: np.ndarray, elem: int) -> np.ndarray:
    """Bytes of all 8-channel blocks: per block its header bytes then its existing panels in (g, m, s) order.

    cells: (M8, G, S, 72) panel elements; headers: (blocks, header_bytes) uint8; elem: bytes per element."""
    m8, g, s, _ = cells.shape
    blocks = m8 // 8
    raw = cells.reshape(blocks, 8, g, s, PANEL).transpose(0, 2, 1, 3, 4)  # (B, G, 8, S, 72)
    keep = exists.reshape(blocks, 8, g, s).transpose(0, 2, 1, 3)
    raw_bytes = np.ascontiguousarray(raw).view(np.uint8).reshape(blocks, g, 8, s, PANEL * elem)
    out = []
    full = int(m // 8)
    if full:
        body = raw_bytes[:full].reshape(full, -1, PANEL * elem)[:, keep[0].reshape(-1)].reshape(full, -1)
        out.append(np.concatenate([headers[:full], body], axis=1).reshape(-1))
    if full < blocks:
        out.append(headers[full])
        out.append(raw_bytes[full][keep[full]].reshape(-1))
    return np.concatenate(out) if out else np.zeros(0, np.uint8)


def _headers(bias: np.ndarray, prelu: np.ndarray | None, m: int) -> np.ndarray:
    rows = [np.pad(bias.astype(np.float16), (0, round_up(m, 8) - m)).reshape(-1, 8)]
    if prelu is not None:
        rows.append(np.pad(prelu.astype(np.float16), (0, round_up(m, 8) - m)).reshape(-1, 8))
    return np.concatenate(rows, axis=1).view(np.uint8)


def _pack_panels(elements: np.ndarray, bias: np.ndarray, prelu: np.ndarray | None) -> np.ndarray:
    """elements: (M, C, p, p) uint16 (fp16 bits) or uint8 (LUT indices), already square-padded."""
    m, c, p, _ = elements.shape
    groups, sub, exists = _panel_order(m, c, p)
    scheme = SCHEMES[p]
    padded = np.zeros((round_up(m, 8), groups * scheme.group, p, p), elements.dtype)
    padded[:m, :c] = elements
    cells = np.zeros((round_up(m, 8), groups, sub, PANEL), elements.dtype)
    grouped = padded.reshape(round_up(m, 8), groups, sub, scheme.per_panel * p * p)
    cells[..., slot_map(p).reshape(-1)] = grouped
    return _block_layout(cells, m, exists, _headers(bias, prelu, m), elements.itemsize)


def pack_conv(
    weight: np.ndarray,
    bias: np.ndarray,
    *,
    quantized: bool,
    prelu: np.ndarray | None = None,
    dilated: bool = False,
    transposed: bool = False,
) -> bytes:
    """Pack one conv run. weight: (M, C/group, kh, kw) float; bias: (M,). Returns 16-byte-aligned bytes."""
    weight = np.asarray(weight, np.float32)
    m, c, kh, kw = weight.shape
    bias = np.asarray(bias, np.float32).reshape(m)
    if quantized and prelu is not None:
        raise UserError("8-bit weights cannot be combined with PReLU on DV700; use fp16 weights for that layer")
    if dilated:
        stored = _stored_taps(weight, transposed)
    else:
        p = effective_kernel(kh, kw)
        if p not in SCHEMES:
            raise UserError(f"kernel {kh}x{kw} is larger than the DV700 maximum 7x7; use a smaller kernel")
        stored = stored_kernels(weight, transposed)
    lut, elements = cluster_lut(stored) if quantized else (None, stored.astype(np.float16).view(np.uint16))
    parts = [] if lut is None else [lut.view(np.uint8)]
    if dilated:
        zero = np.zeros_like(bias)
        for ty in range(kh):  # loop over kernel taps (at most 49)
            for tx in range(kw):
                last = ty == kh - 1 and tx == kw - 1
                tap = _pack_panels(elements[:, :, ty : ty + 1, tx : tx + 1], bias if last else zero, None)
                parts.append(np.pad(tap, (0, round_up(tap.size) - tap.size)))
        out = np.concatenate(parts)
        return out.tobytes()
    parts.append(_pack_panels(elements, bias, prelu))
    out = np.concatenate(parts)
    return np.pad(out, (0, round_up(out.size) - out.size)).tobytes()


# ---------------------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------------------


def _unpack_panels(
    buf: np.ndarray, m: int, c: int, p: int, elem: int, prelu: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """Inverse of _pack_panels on raw bytes: (elements (M, C, p, p), bias, prelu, bytes consumed)."""
    groups, sub, exists = _panel_order(m, c, p)
    scheme = SCHEMES[p]
    blocks = round_up(m, 8) // 8
    hdr = 16 * (2 if prelu else 1)
    dtype = np.uint16 if elem == 2 else np.uint8
    cells = np.zeros((blocks, groups, 8, sub, PANEL), dtype)
    keep = exists.reshape(blocks, 8, groups, sub).transpose(0, 2, 1, 3)
    headers = np.zeros((blocks, hdr), np.uint8)
    pos = 0
    per_full = int(keep[0].sum()) * PANEL * elem
    full = m // 8
    need = full * (hdr + per_full) + (0 if full == blocks else hdr + int(keep[-1].sum()) * PANEL * elem)
    if buf.size < need:
        raise CorruptFileError(f"packed weights need {need} bytes but only {buf.size} remain; the file is truncated")
    if full:
        chunk = buf[: full * (hdr + per_full)].reshape(full, hdr + per_full)
        headers[:full] = chunk[:, :hdr]
        body = chunk[:, hdr:].reshape(full, -1, PANEL * elem).view(dtype).reshape(full, -1, PANEL)
        flat = cells[:full].reshape(full, -1, PANEL)
        flat[:, keep[0].reshape(-1)] = body
        cells[:full] = flat.reshape(cells[:full].shape)
        pos = full * (hdr + per_full)
    if full < blocks:
        headers[full] = buf[pos : pos + hdr]
        pos += hdr
        n = int(keep[full].sum())
        cells[full][keep[full]] = buf[pos : pos + n * PANEL * elem].view(dtype).reshape(n, PANEL)
        pos += n * PANEL * elem
    cells = cells.transpose(0, 2, 1, 3, 4).reshape(blocks * 8, groups, sub, PANEL)
    grouped = cells[..., slot_map(p).reshape(-1)]
    elements = grouped.reshape(blocks * 8, groups * scheme.group, p, p)[:m, :c]
    halves = headers.view(np.float16).reshape(blocks, -1).astype(np.float32)
    bias = halves[:, :8].reshape(-1)[:m]
    slopes = halves[:, 8:16].reshape(-1)[:m] if prelu else None
    return elements, bias, slopes, pos


def unpack_conv(
    data: bytes | np.ndarray,
    m: int,
    c: int,
    kh: int,
    kw: int,
    *,
    quantized: bool,
    prelu: bool = False,
    dilated: bool = False,
    transposed: bool = False,
) -> PackedConv:
    """Decode one packed conv run back to float weights (the fp16 values, or the LUT values if 8-bit), in
    the model's (M, C, kh, kw) orientation whether or not the run stores them transposed."""
    buf = np.frombuffer(data, np.uint8) if isinstance(data, bytes | bytearray | memoryview) else data
    size = (
        dilated_weight_size(m, c, kh, kw, quantized=quantized)
        if dilated
        else conv_weight_size(m, c, kh, kw, quantized=quantized, prelu=prelu)
    )
    if buf.size < size:
        raise CorruptFileError(f"conv weights need {size} bytes but only {buf.size} remain; the .bin is truncated")
    lut = None
    pos = 0
    if quantized:
        lut = buf[:LUT_BYTES].view(np.float16).astype(np.float32)
        pos = LUT_BYTES
    elem = 1 if quantized else 2

    def values(elements: np.ndarray) -> np.ndarray:
        if lut is None:
            return elements.view(np.float16).astype(np.float32)
        return lut[elements]

    if dilated:
        weight = np.zeros((m, c, kh, kw), np.float32)
        bias = np.zeros(m, np.float32)
        for ty in range(kh):
            for tx in range(kw):
                els, bias, _, used = _unpack_panels(buf[pos:], m, c, 1, elem, False)
                weight[:, :, ty, tx] = values(els)[:, :, 0, 0]
                pos += round_up(used)
        return PackedConv(np.ascontiguousarray(_model_taps(weight, transposed)), bias, None, lut)
    p = effective_kernel(kh, kw)
    els, bias, slopes, _ = _unpack_panels(buf[pos:], m, c, p, elem, prelu)
    stored = values(els)
    weight = stored[:, :, p - kw :, :kh].transpose(0, 1, 3, 2) if transposed else stored[:, :, p - kh :, :kw]
    return PackedConv(np.ascontiguousarray(weight), bias, slopes, lut)
