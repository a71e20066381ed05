"""The .cvimodel container: 48-byte header, `cvi.model.Model` FlatBuffer body, binary blob of sections.

`read_cvimodel` validates everything a loader relies on and raises CorruptFileError with the offending
offset or field; `write_cvimodel` lays the file out exactly as tpu-mlir does (sections back to back in
table order, MD5 of everything after the header), so a tpu-mlir file read and written back is identical.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from npuc.backends.cv18xx import fbcodec
from npuc.backends.cv18xx.chips import CHIPS
from npuc.backends.cv18xx.fbs import Schema, load_schema
from npuc.compiler.errors import CorruptFileError, UserError
from npuc.compiler.fileio import read_limited

MAGIC = b"CviModel"
HEADER = struct.Struct("<8sIBB16s16s2s")  # magic, body_size, major, minor, md5, chip, padding
HEADER_SIZE = HEADER.size  # 48
VERSION = (1, 4, 0)
REGION_WEIGHT = 1
MAX_REGIONS = 8
# cvimodel DType -> numpy dtype of a tensor's bytes in gmem (bf16 kept as raw uint16)
DTYPES = {0: np.float32, 1: np.int32, 2: np.uint32, 3: np.uint16, 4: np.int16, 5: np.uint16, 6: np.int8, 7: np.uint8}
MAX_CVIMODEL_BYTES = 1 << 30  # the largest CV18xx board has 512 MiB of ION memory

# Order in which tpu-mlir's CviModelBuilder serializes the out-of-line children of each table; only byte
# placement depends on it. Tables not listed follow declaration order, like flatc's Create* helpers.
TPU_MLIR_CHILD_ORDER: dict[str, tuple[str, ...]] = {
    "Model": ("name", "build_time", "target", "mlir_version", "weight_map", "sections", "programs"),
    "Program": ("tensor_map", "input_tensors", "output_tensors", "routines"),
    "Tensor": ("shape", "quant", "name"),
}


@cache
def model_schema() -> Schema:
    """The parsed cvi.model schema (cvimodel.fbs next to this module)."""
    return load_schema(Path(__file__).with_name("cvimodel.fbs"))


@cache
def cpu_param_schema() -> Schema:
    """The parsed cvi.cpu_op schema of CPU routine arguments (cpu_param.fbs)."""
    return load_schema(Path(__file__).with_name("cpu_param.fbs"))


@dataclass
class CviHeader:
    magic: bytes
    body_size: int
    major: int
    minor: int
    md5: bytes
    chip: str
    padding: bytes


@dataclass
class CviModel:
    """A whole .cvimodel: the chip, the decoded body and the bytes of every section by name."""

    chip: str
    body: Any  # cvi.model.Model record (see cvimodel.fbs)
    sections: dict[str, bytes] = field(default_factory=dict)
    header_padding: bytes = b"Cv"  # tpu-mlir copies the first 2 magic bytes here; nothing reads it

    @property
    def weight(self) -> bytes:
        """Bytes of the WEIGHT section (the gmem region 1 image), or b"" when there is none."""
        weights = [s for s in self.body.sections if s.type == section_type("WEIGHT")]
        return self.sections[weights[0].name] if weights else b""

    def cmdbufs(self) -> dict[str, bytes]:
        """Cmdbuf bytes of every TPU routine of every program, keyed by section name."""
        return {
            r.tpu_routine.cmdbuf_section: self.sections[r.tpu_routine.cmdbuf_section]
            for p in self.body.programs
            for r in p.routines
            if r.tpu_routine is not None and r.tpu_routine.cmdbuf_section in self.sections
        }

    def section_record(self, name: str) -> Any:
        return next(s for s in self.body.sections if s.name == name)


def section_type(name: str) -> int:
    return model_schema().enums["SectionType"].values[name]


def decode_cpu_args(data: bytes, where: str = "function_args") -> dict[str, Any]:
    """A CPU routine's nested `cvi.cpu_op.Parameter` as {key: value} in stored order."""
    param = fbcodec.decode(cpu_param_schema(), data, where)
    out: dict[str, Any] = {}
    kinds = [f.name for f in cpu_param_schema().objects["Attribute"].fields]
    for attr in param.attributes or []:
        set_kinds = [getattr(attr, k) for k in kinds if getattr(attr, k) is not None]
        if len(set_kinds) != 1:
            raise CorruptFileError(f"{where}: an Attribute must set exactly one value, found {len(set_kinds)}")
        out[set_kinds[0].key] = set_kinds[0].value
    return out


def _fail(where: str, what: str) -> CorruptFileError:
    return CorruptFileError(f"{where}: {what}; the file is not a valid cvimodel (rebuild or re-download it)")


def read_header(data: bytes, where: str) -> CviHeader:
    if len(data) < HEADER_SIZE:
        raise _fail(where, f"file is {len(data)} bytes, shorter than the {HEADER_SIZE}-byte header")
    magic, body_size, major, minor, md5, chip_raw, padding = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise _fail(where, f"bad magic {magic!r} at offset 0 (expected {MAGIC!r})")
    if major != VERSION[0] or not 1 <= minor <= VERSION[1]:
        raise _fail(where, f"header version {major}.{minor} at offset 12 is not supported (npuc reads 1.1-1.4)")
    chip = chip_raw.rstrip(b"\0")
    if b"\0" in chip or chip.decode("latin-1") not in CHIPS:
        raise _fail(where, f"unknown chip {chip_raw!r} at offset 30 (expected one of {', '.join(CHIPS)})")
    if body_size > len(data) - HEADER_SIZE:
        raise _fail(where, f"body size {body_size} at offset 8 exceeds the {len(data) - HEADER_SIZE} bytes left")
    if hashlib.md5(data[HEADER_SIZE:]).digest() != md5:
        raise _fail(where, "MD5 at offset 14 does not match the file contents (truncated or modified)")
    return CviHeader(magic, body_size, major, minor, md5, chip.decode("latin-1"), padding)


def read_cvimodel(source: str | Path | bytes, where: str | None = None) -> CviModel:
    """Read and validate a .cvimodel from a path or its bytes."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, where = bytes(source), where or "<cvimodel bytes>"
    else:
        data, where = read_limited(Path(source), "cvimodel", MAX_CVIMODEL_BYTES), where or str(source)
    header = read_header(data, where)
    body_end = HEADER_SIZE + header.body_size
    body = fbcodec.decode(model_schema(), data[HEADER_SIZE:body_end], f"{where} (body at offset 48)")
    blob = data[body_end:]
    model = CviModel(header.chip, body, _read_sections(body, blob, where, body_end), header.padding)
    _validate_body(model, where)
    return model


def _read_sections(body: Any, blob: bytes, where: str, blob_start: int) -> dict[str, bytes]:
    known = model_schema().enums["SectionType"]
    out: dict[str, bytes] = {}
    for i, sec in enumerate(body.sections):
        label = f"section {i} ({sec.name!r})"
        if not sec.name:
            raise _fail(where, f"section {i} has an empty name")
        if sec.name in out:
            raise _fail(where, f"{label} is a duplicate name")
        if known.name_of(sec.type) is None:
            raise _fail(where, f"{label} has unknown type {sec.type}")
        if sec.offset + sec.size > len(blob):
            raise _fail(
                where,
                f"{label} spans file bytes {blob_start + sec.offset}..{blob_start + sec.offset + sec.size}"
                f" past the end ({blob_start + len(blob)})",
            )
        out[sec.name] = blob[sec.offset : sec.offset + sec.size]
    return out


MAX_REGION_BYTES = 1 << 30  # the boards carry 64 MiB (cv180x) to 1-4 GiB (cv183x) of DRAM for everything


def gmem_sizes(prog: Any) -> dict[int, int]:
    """Bytes of each gmem region a program uses: shared (0) and private (2) as declared, each io region
    (>= 3) as far as its tensors reach."""
    sizes = {0: prog.shared_gmem, 2: prog.private_gmem}
    for t in prog.tensor_map:
        region = t.offset >> 40
        if region >= 3:
            sizes[region] = max(sizes.get(region, 0), (t.offset & ((1 << 40) - 1)) + t.size)
    return sizes


def _check_whole_elements(tag: str, size: int, dtype: int, where: str) -> None:
    itemsize = np.dtype(DTYPES[dtype]).itemsize
    if size % itemsize:
        raise _fail(where, f"{tag} is {size} bytes, not a whole number of its {itemsize}-byte elements")


def _validate_body(model: CviModel, where: str) -> None:
    body = model.body
    if body.version.major_ != VERSION[0] or body.version.minor_ > VERSION[1]:
        v = body.version
        raise _fail(where, f"schema version {v.major_}.{v.minor_}.{v.sub_minor} is newer than 1.4 (unsupported)")
    if body.target is not None and body.target != model.chip:
        raise _fail(where, f"Model.target {body.target!r} differs from header chip {model.chip!r}")
    dtypes = model_schema().enums["DType"]
    weight_bytes = len(model.weight)
    for w in body.weight_map or []:
        if dtypes.name_of(w.type) is None or w.type not in DTYPES:
            raise _fail(where, f"weight {w.name!r} has unknown dtype {w.type}")
        _check_whole_elements(f"weight {w.name!r}", w.size, w.type, where)
        local = w.offset - (REGION_WEIGHT << 40)
        if not 0 <= local <= weight_bytes - w.size:
            raise _fail(where, f"weight {w.name!r} at {w.offset:#x} (+{w.size}) lies outside the weight section")
    if not body.programs:
        raise _fail(where, "the model has no program")
    for pi, prog in enumerate(body.programs):
        names = set()
        for t in prog.tensor_map:
            tag = f"program {pi} tensor {t.name!r}"
            if dtypes.name_of(t.dtype) is None or t.dtype not in DTYPES:
                raise _fail(where, f"{tag} has unknown dtype {t.dtype}")
            _check_whole_elements(tag, t.size, t.dtype, where)
            region = (t.offset >> 40) & 0xFF
            if t.offset < 0 or region >= MAX_REGIONS or region == REGION_WEIGHT:
                raise _fail(where, f"{tag} has offset {t.offset:#x} outside the neuron/io regions")
            if len(t.shape.dim) < 4:
                raise _fail(where, f"{tag} has a {len(t.shape.dim)}-d shape (the runtime reads 4 dims)")
            names.add(t.name)
        for region, size in gmem_sizes(prog).items():
            if not 0 <= size <= MAX_REGION_BYTES:
                field = {0: "shared_gmem", 2: "private_gmem"}.get(region, f"tensor_map (io region {region})")
                raise _fail(where, f"programs[{pi}].{field}: gmem region {region} of {size} bytes is beyond any "
                            f"CV18xx board ({MAX_REGION_BYTES} at most)")  # fmt: skip
        referenced = [*prog.input_tensors, *prog.output_tensors]
        for r in prog.routines:
            referenced += [*(r.in_tensors or []), *(r.out_tensors or [])]
        weights = {w.name for w in body.weight_map or []}
        for name in referenced:
            if name not in names and name not in weights:
                raise _fail(where, f"program {pi} refers to tensor {name!r} missing from its tensor_map")
        for ri, r in enumerate(prog.routines):
            _validate_routine(model, r, f"program {pi} routine {ri}", where)


def _validate_routine(model: CviModel, r: Any, tag: str, where: str) -> None:
    kinds = model_schema().enums["RoutineType"].values
    if r.type == kinds["TPU"]:
        tpu = r.tpu_routine
        sec = tpu and (tpu.cmdbuf_section or tpu.dmabuf_section)
        if not sec or sec not in model.sections:
            raise _fail(where, f"{tag} (TPU) names no existing cmdbuf/dmabuf section")
    elif r.type == kinds["CPU"]:
        if r.cpu_routine is None:
            raise _fail(where, f"{tag} (CPU) has no cpu_routine")
        decode_cpu_args(r.cpu_routine.function_args, f"{where}: {tag} function_args")
    else:
        raise _fail(where, f"{tag} has unknown routine type {r.type}")


def write_cvimodel(model: CviModel) -> bytes:
    """Serialize a CviModel the way tpu-mlir does; section offsets and sizes are recomputed from the data."""
    if model.chip not in CHIPS:
        raise UserError(f"cannot write a cvimodel for unknown chip {model.chip!r}; use one of {', '.join(CHIPS)}")
    offset, placed, blob = 0, [], []
    for sec in model.body.sections:
        data = model.sections[sec.name]
        placed.append(replace(sec, offset=offset, size=len(data)))
        blob.append(data)
        offset += len(data)
    body = replace(model.body, sections=placed)
    body_bytes = fbcodec.encode(model_schema(), body, child_order=TPU_MLIR_CHILD_ORDER)
    payload = body_bytes + b"".join(blob)
    chip = model.chip.encode("ascii").ljust(16, b"\0")
    header = HEADER.pack(
        MAGIC,
        len(body_bytes),
        VERSION[0],
        VERSION[1],
        hashlib.md5(payload).digest(),
        chip,
        model.header_padding,
    )
    return header + payload
