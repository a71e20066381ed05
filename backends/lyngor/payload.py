"""npuc's own Lyngor payload files: the program (`npuc_prog.bin`) and the fp16 weights (`npuc_weight.bin`).

The vendor's binaries (apu_lib.bin, cmd.bin, core.bin, dat.bin) are not public, so an npuc tree carries these
two documented files instead, in `Net_0/apu_0/apu_x/` next to npuc_apu.json, whose `cmd_size`/`dat_size` give their
sizes. All integers are little-endian; both files are zero-padded to a multiple of 256 bytes.

npuc_prog.bin
    header, 32 bytes (PROG_HEADER):
        0  magic        8s   b"NPUCLYNP"
        8  version      u16  1
       10  header_size  u16  32
       12  section_num  u32  number of resolutions (one program section each)
       16  table_offset u32  32: the section table follows the header
       20  file_size    u32  total bytes, padding included (= npuc_apu.json and apu.json cmd_size)
       24  crc32        u32  zlib.crc32 of bytes [header_size, file_size)
       28  reserved     u32  0
    section table: section_num x (offset u32, size u32) (SECTION_ENTRY), absolute byte ranges
    sections: UTF-8 JSON, one per resolution: the canonical IR op list of that resolution (see program.py)

npuc_weight.bin
    header, 32 bytes (WEIGHT_HEADER):
        0  magic        8s   b"NPUCLYNW"
        8  version      u16  1
       10  header_size  u16  32
       12  entry_num    u32  number of constant tensors
       16  table_offset u32  32
       20  data_offset  u32  start of the data area (64-aligned)
       24  file_size    u32  total bytes, padding included (= npuc_apu.json dat_size)
       28  crc32        u32  zlib.crc32 of bytes [data_offset, file_size)
    entry table: entry_num x 16 bytes (WEIGHT_ENTRY): offset u32 (from data_offset, 64-aligned), nbytes u32,
        dtype u16 (WEIGHT_DTYPES: 1 float16, 2 int32, 3 int64, 4 int8, 5 uint8, 6 bool), ndim u16 (unused, 0),
        count u32 (elements; nbytes = count * itemsize)
    data: the raw little-endian values. Float constants are stored as IEEE fp16 (round to nearest even);
        integer constants (gather indices, shapes) keep their integer type.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from npuc.compiler.errors import CorruptFileError

PROG_MAGIC = b"NPUCLYNP"
WEIGHT_MAGIC = b"NPUCLYNW"
FORMAT_VERSION = 1
FILE_ALIGN = 256
DATA_ALIGN = 64
MAX_FILE_BYTES = 1 << 31  # u32 sizes: a bigger claim is corrupt, and bounds what a reader allocates

StructTable = tuple[tuple[str, str], ...]

PROG_HEADER: StructTable = (
    ("magic", "8s"),
    ("version", "H"),
    ("header_size", "H"),
    ("section_num", "I"),
    ("table_offset", "I"),
    ("file_size", "I"),
    ("crc32", "I"),
    ("reserved", "I"),
)
SECTION_ENTRY: StructTable = (("offset", "I"), ("size", "I"))
WEIGHT_HEADER: StructTable = (
    ("magic", "8s"),
    ("version", "H"),
    ("header_size", "H"),
    ("entry_num", "I"),
    ("table_offset", "I"),
    ("data_offset", "I"),
    ("file_size", "I"),
    ("crc32", "I"),
)
WEIGHT_ENTRY: StructTable = (("offset", "I"), ("nbytes", "I"), ("dtype", "H"), ("ndim", "H"), ("count", "I"))
WEIGHT_DTYPES = MappingProxyType({1: "float16", 2: "int32", 3: "int64", 4: "int8", 5: "uint8", 6: "bool"})
_DTYPE_CODES = MappingProxyType({name: code for code, name in WEIGHT_DTYPES.items()})


def _fmt(table: StructTable) -> struct.Struct:
    return struct.Struct("<" + "".join(f for _, f in table))


def pack(table: StructTable, values: dict[str, object]) -> bytes:
    return _fmt(table).pack(*(values[name] for name, _ in table))


def unpack(table: StructTable, data: bytes, offset: int, where: str) -> dict[str, object]:
    layout = _fmt(table)
    if offset < 0 or offset + layout.size > len(data):
        raise CorruptFileError(
            f"{where}: {layout.size}-byte record at offset {offset} runs past the end ({len(data)} bytes); "
            "the file is truncated, rebuild it"
        )
    return dict(zip((name for name, _ in table), layout.unpack_from(data, offset)))


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def _pad(buf: bytearray, a: int) -> None:
    buf.extend(b"\0" * (_align(len(buf), a) - len(buf)))


# ---- program -----------------------------------------------------------------------------------------------


def write_program(sections: list[bytes]) -> bytes:
    """The program file for one JSON section per resolution."""
    head = _fmt(PROG_HEADER).size
    table_size = _fmt(SECTION_ENTRY).size * len(sections)
    body = bytearray()
    entries = []
    offset = head + table_size
    for section in sections:
        entries.append({"offset": offset + len(body), "size": len(section)})
        body.extend(section)
    out = bytearray(head) + b"".join(pack(SECTION_ENTRY, e) for e in entries) + body
    _pad(out, FILE_ALIGN)
    header = {
        "magic": PROG_MAGIC,
        "version": FORMAT_VERSION,
        "header_size": head,
        "section_num": len(sections),
        "table_offset": head,
        "file_size": len(out),
        "crc32": zlib.crc32(bytes(out[head:])),
        "reserved": 0,
    }
    out[:head] = pack(PROG_HEADER, header)
    return bytes(out)


def _check_container(data: bytes, table: StructTable, magic: bytes, where: str) -> dict[str, object]:
    header = unpack(table, data, 0, where)
    if header["magic"] != magic:
        raise CorruptFileError(f"{where}: magic {header['magic']!r} is not {magic!r}; not an npuc Lyngor payload")
    if header["version"] != FORMAT_VERSION:
        raise CorruptFileError(
            f"{where}: format version {header['version']} is not {FORMAT_VERSION}; rebuild with this npuc"
        )
    if header["header_size"] != _fmt(table).size or header["table_offset"] != _fmt(table).size:
        raise CorruptFileError(f"{where}: header_size/table_offset {header['header_size']} is wrong; rebuild it")
    if header["file_size"] != len(data) or len(data) % FILE_ALIGN:
        raise CorruptFileError(
            f"{where}: header says {header['file_size']} bytes, the file has {len(data)} (must be a multiple of "
            f"{FILE_ALIGN}); the file is truncated or padded, rebuild it"
        )
    return header


def read_program(data: bytes, where: str) -> list[bytes]:
    """The JSON sections of a program file, after checking magic, version, sizes, table and CRC."""
    header = _check_container(data, PROG_HEADER, PROG_MAGIC, where)
    head = int(header["header_size"])
    if zlib.crc32(data[head:]) != header["crc32"]:
        raise CorruptFileError(f"{where}: CRC32 mismatch over bytes {head}..{len(data)}; the file is corrupt")
    count = int(header["section_num"])
    entry_size = _fmt(SECTION_ENTRY).size
    if count < 1 or head + count * entry_size > len(data):
        raise CorruptFileError(f"{where}: section_num {count} does not fit the file; rebuild it")
    sections = []
    for i in range(count):
        entry = unpack(SECTION_ENTRY, data, head + i * entry_size, where)
        start, size = int(entry["offset"]), int(entry["size"])
        if start < head + count * entry_size or start + size > len(data):
            raise CorruptFileError(f"{where}: section {i} [{start}, {start + size}) lies outside the file; rebuild it")
        sections.append(data[start : start + size])
    return sections


# ---- weights -----------------------------------------------------------------------------------------------


def weight_array(value: np.ndarray) -> np.ndarray:
    """How a constant is stored: floats as fp16, integers/bools unchanged (int64 and int32 stay as they are)."""
    value = np.asarray(value)
    if value.dtype.kind == "f":
        with np.errstate(over="ignore"):
            return value.astype(np.float16)
    if str(value.dtype) not in _DTYPE_CODES:
        raise CorruptFileError(f"constant of dtype {value.dtype} has no Lyngor weight encoding")
    return value


def write_weights(arrays: list[np.ndarray]) -> bytes:
    """The weight file for `arrays` (already in their stored dtype, see `weight_array`)."""
    head = _fmt(WEIGHT_HEADER).size
    table_size = _fmt(WEIGHT_ENTRY).size * len(arrays)
    data_offset = _align(head + table_size, DATA_ALIGN)
    data = bytearray()
    entries = []
    for a in arrays:
        _pad(data, DATA_ALIGN)
        raw = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        entries.append(
            {"offset": len(data), "nbytes": len(raw), "dtype": _DTYPE_CODES[str(a.dtype)], "ndim": 0, "count": a.size}
        )
        data.extend(raw)
    out = bytearray(head) + b"".join(pack(WEIGHT_ENTRY, e) for e in entries)
    out.extend(b"\0" * (data_offset - len(out)))
    out.extend(data)
    _pad(out, FILE_ALIGN)
    header = {
        "magic": WEIGHT_MAGIC,
        "version": FORMAT_VERSION,
        "header_size": head,
        "entry_num": len(arrays),
        "table_offset": head,
        "data_offset": data_offset,
        "file_size": len(out),
        "crc32": zlib.crc32(bytes(out[data_offset:])),
    }
    out[:head] = pack(WEIGHT_HEADER, header)
    return bytes(out)


@dataclass(frozen=True)
class WeightEntry:
    dtype: str
    count: int
    data: bytes  # the raw little-endian values

    def array(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.frombuffer(self.data, dtype=np.dtype(self.dtype).newbyteorder("<")).reshape(shape)


def read_weights(data: bytes, where: str) -> list[WeightEntry]:
    header = _check_container(data, WEIGHT_HEADER, WEIGHT_MAGIC, where)
    head, count, data_offset = int(header["header_size"]), int(header["entry_num"]), int(header["data_offset"])
    entry_size = _fmt(WEIGHT_ENTRY).size
    if head + count * entry_size > data_offset or data_offset > len(data):
        raise CorruptFileError(f"{where}: {count} entries and data_offset {data_offset} do not fit; rebuild it")
    if zlib.crc32(data[data_offset:]) != header["crc32"]:
        raise CorruptFileError(f"{where}: CRC32 mismatch over the data area; the file is corrupt")
    out = []
    for i in range(count):
        e = unpack(WEIGHT_ENTRY, data, head + i * entry_size, where)
        dtype = WEIGHT_DTYPES.get(int(e["dtype"]))
        if dtype is None:
            raise CorruptFileError(f"{where}: weight {i} has unknown dtype code {e['dtype']}; rebuild it")
        start, nbytes = data_offset + int(e["offset"]), int(e["nbytes"])
        if nbytes != int(e["count"]) * np.dtype(dtype).itemsize or start + nbytes > len(data):
            raise CorruptFileError(
                f"{where}: weight {i} ({e['count']} x {dtype} at {start}, {nbytes} bytes) is inconsistent or runs "
                "past the end; rebuild it"
            )
        out.append(WeightEntry(dtype, int(e["count"]), data[start : start + nbytes]))
    return out
