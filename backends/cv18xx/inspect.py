"""Human-readable summary of a .cvimodel, in the spirit of tpu-mlir's `model_tool --info`."""

from __future__ import annotations

import hashlib
from typing import Any

from npuc.backends.cv18xx.chips import CHIPS
from npuc.backends.cv18xx.cmdbuf import disassemble, split_cmdbuf
from npuc.backends.cv18xx.container import CviModel, decode_cpu_args, model_schema

REGION_NAMES = {0: "shared", 1: "weight", 2: "private", 3: "io0", 4: "io1", 5: "io2", 6: "io3", 7: "io4"}


def _enum(name: str, value: int) -> str:
    return model_schema().enums[name].name_of(value) or f"?{value}"


def _addr(tagged: int) -> str:
    region = (tagged >> 40) & 0x7
    return f"{REGION_NAMES[region]}+{tagged & ((1 << 40) - 1):#x}"


def _shape(shape: Any) -> str:
    return "x".join(map(str, shape.dim)) if shape is not None else "-"


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _header_lines(model: CviModel) -> list[str]:
    b = model.body
    v = b.version
    return [
        f"Cvimodel {b.name!r} for chip {model.chip}",
        f"  version {v.major_}.{v.minor_}.{v.sub_minor}, built {b.build_time or '-'} by {b.mlir_version or '-'}",
        f"  programs {len(b.programs)}, sections {len(b.sections)}, weights {len(b.weight_map or [])}",
        f"  max shared gmem {max(p.shared_gmem for p in b.programs)} bytes",
    ]


def _section_lines(model: CviModel) -> list[str]:
    rows = [["id", "type", "name", "offset", "size", "flags", "md5"]]
    for i, s in enumerate(model.body.sections):
        flags = ",".join(f for f in ("compress", "encrypt") if getattr(s, f)) or "-"
        md5 = hashlib.md5(model.sections[s.name]).hexdigest()
        rows.append([str(i), _enum("SectionType", s.type), s.name, str(s.offset), str(s.size), flags, md5])
    return ["Sections:", *_table(rows)]


def _weight_lines(model: CviModel) -> list[str]:
    rows = [["id", "offset", "size", "dtype", "shape", "name"]]
    for i, w in enumerate(model.body.weight_map or []):
        rows.append([str(i), _addr(w.offset), str(w.size), _enum("DType", w.type), _shape(w.shape), w.name or ""])
    return ["Weight map:", *_table(rows)] if len(rows) > 1 else ["Weight map: (empty)"]


def _routine_lines(model: CviModel, prog: Any, disasm: bool) -> list[str]:
    lines = ["  Routines:"]
    chip = CHIPS[model.chip]
    for i, r in enumerate(prog.routines):
        io = f"in={','.join(r.in_tensors or [])} out={','.join(r.out_tensors or [])}"
        if r.cpu_routine is not None:
            args = decode_cpu_args(r.cpu_routine.function_args)
            arg_text = ", ".join(f"{k}={v!r}" for k, v in args.items())
            lines.append(f"    #{i} CPU {r.cpu_routine.function_section}({arg_text}) {io}")
            continue
        sec = r.tpu_routine.cmdbuf_section or r.tpu_routine.dmabuf_section
        lines.append(f"    #{i} TPU {sec} {io}")
        if disasm and r.tpu_routine.cmdbuf_section:
            instructions = split_cmdbuf(model.sections[sec], chip, f"section {sec!r}")
            lines += ["      " + line for line in disassemble(instructions, chip)]
    return lines


def _tensor_lines(prog: Any) -> list[str]:
    rows = [["id", "offset", "size", "dtype", "shape", "qscale", "flags", "name"]]
    for i, t in enumerate(prog.tensor_map):
        q = t.quant
        qscale = f"{q.qscale:.9g}" if q is not None else "-"
        flags = ",".join(f for f in ("overwrote", "aligned") if getattr(t, f)) or "-"
        rows.append(
            [
                str(i),
                _addr(t.offset),
                str(t.size),
                _enum("DType", t.dtype),
                _shape(t.shape),
                qscale,
                flags,
                t.name,
            ]
        )
    frames = [  # fused preprocessing: the runtime feeds the raw frame, the TPU applies mean/scale
        f"    {t.name}: pixel_format {t.pixel_format}, aligned {bool(t.aligned)}, scale "
        f"{','.join(f'{v:.7g}' for v in t.scale or [])}, mean {','.join(f'{v:.7g}' for v in t.mean or [])}"
        for t in prog.tensor_map
        if t.pixel_format
    ]
    return ["  Tensors:", *_table(rows, "    "), *(["  Preprocess (input frames):", *frames] if frames else [])]


def describe_cvimodel(model: CviModel, disasm: bool = False) -> str:
    """Header, sections (with MD5), weight map, programs, routines, tensors; with disasm also the cmdbufs."""
    lines = _header_lines(model) + _section_lines(model) + _weight_lines(model)
    for pi, p in enumerate(model.body.programs):
        lines.append(
            f"Program #{pi}: batch {p.batch_num}, neuron {p.neuron_size}, shared gmem {p.shared_gmem},"
            f" private gmem {p.private_gmem}"
        )
        lines.append(f"  inputs {', '.join(p.input_tensors)}; outputs {', '.join(p.output_tensors)}")
        lines += _routine_lines(model, p, disasm) + _tensor_lines(p)
    return "\n".join(lines) + "\n"
