"""A functional CV18xx simulator that runs a .cvimodel from its bytes with numpy.

Routines run in program order: CPU routines through the built-in functions in CPU_FUNCTIONS, TPU routines by
decoding their cmdbuf and executing each descriptor in stream order (the sync ids only order the engines,
and the stream order already respects them); a TDMA load with compress_en decodes its VLC source buffer
(compression.py). Global memory is one byte array per region (0 shared, 1 weight, 2 private, 3.. io), local
memory is lanes x lmem_size bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from npuc.backends.cv18xx import compression, isa
from npuc.backends.cv18xx.chips import CHIPS, ChipSpec
from npuc.backends.cv18xx.cmdbuf import split_cmdbuf, tiu_op_name
from npuc.backends.cv18xx.container import DTYPES, CviModel, decode_cpu_args, gmem_sizes, model_schema
from npuc.backends.cv18xx.sim_cpu import CPU_FUNCTIONS
from npuc.backends.cv18xx.sim_mem import FORMATS, MAX_ACCESS_BYTES, GlobalMemory, LocalMemory
from npuc.backends.cv18xx.sim_tiu import TIU_KERNELS, TiuContext, bf16_to_f32, f32_to_bf16
from npuc.compiler.errors import CorruptFileError, UnsupportedError, UserError

REGION_BITS = 40
_TDMA_FMT = {1: "i8", 2: "bf16"}


def _tdma_addr(f: dict[str, int], side: str, is_global: bool, chip: ChipSpec) -> tuple[int, int]:
    addr = (f[f"{side}_base_addr_high"] << 32) | f[f"{side}_base_addr_low"]
    return (f[f"{side}_base_reg_sel"], addr - chip.gmem_base) if is_global else (-1, addr)


def _exponent_index(bits: np.ndarray) -> np.ndarray:
    """`mv_lut_idx`: a bf16 becomes the index of its power of two in an exponent lookup table — the sign in
    bit 7, the unbiased exponent + 63 in bits 0..6 (tpu-mlir's tables hold 2^(63 - index) there)."""
    bits = bits.astype(np.uint16)
    exponent = ((bits >> 7) & 0xFF).astype(np.int64)
    outside = (exponent < 64) | (exponent > 190)
    if outside.any():  # zeros, subnormals, huge and tiny values: the hardware's index there is not known
        value = bf16_to_f32(bits[outside][:1])[0]
        raise UnsupportedError(
            f"TDMA lookup-index move of {value:g} (bf16 exponent outside 2^-63..2^63) is not simulated"
        )
    return ((bits >> 15) << 7) | (exponent - 64).astype(np.uint16)


def tdma_convert(values: np.ndarray, src: str, dst: str, toward_zero: bool = False) -> np.ndarray:
    """A TDMA format conversion: int8 or uint8 -> bf16 is exact; bf16 -> int8 or uint8 rounds to nearest even
    (`int8_rnd_mode` 0) or toward zero (1) and saturates."""
    if src == dst:
        return values
    if (src, dst) in (("i8", "bf16"), ("u8", "bf16")):
        return f32_to_bf16(values.astype(np.float32))
    if (src, dst) in (("bf16", "i8"), ("bf16", "u8")):
        x = bf16_to_f32(values)
        rounded = np.trunc(x) if toward_zero else np.rint(x)
        low, high, dtype = (-128, 127, np.int8) if dst == "i8" else (0, 255, np.uint8)
        return np.clip(np.nan_to_num(rounded), low, high).astype(dtype)
    raise UnsupportedError(f"TDMA format conversion {src} -> {dst} is not simulated yet")


class Machine:
    """Global and local memory of one chip plus the descriptor executors."""

    def __init__(self, chip: ChipSpec, gmem: GlobalMemory) -> None:
        self.chip = chip
        self.gmem = gmem
        self.lmem = LocalMemory.create(chip.lanes, chip.lmem_size)

    def _access(self, region: int, addr: int, shape: tuple, strides: tuple, fmt: str, values: Any = None) -> Any:
        if region < 0:
            if values is None:
                return self.lmem.read(addr, shape, strides, fmt)
            return self.lmem.write(addr, shape, strides, fmt, values)
        if values is None:
            return self.gmem.read(region, addr, shape, strides, fmt)
        return self.gmem.write(region, addr, shape, strides, fmt, values)

    def tdma(self, f: dict[str, int]) -> None:
        direction = f["trans_dir"]
        src_global, dst_global = {0: (True, False), 1: (False, True), 2: (True, True), 3: (False, False)}[direction]
        src_fmt = _TDMA_FMT.get(f["src_fmt"])
        dst_fmt = _TDMA_FMT.get(f["dst_fmt"])
        if f["compress_en"] and direction != 0:
            raise UnsupportedError("TDMA compressing store (VLC) is not simulated yet")
        if src_fmt is None or dst_fmt is None or f["spec_func"] not in (0, 4):
            raise UnsupportedError(f"TDMA mode spec_func={f['spec_func']} fmt={f['src_fmt']} is not simulated yet")
        if f["mv_lut_base"] or (f["mv_lut_idx"] and (src_fmt, dst_fmt, direction) != ("bf16", "bf16", 3)):
            raise UnsupportedError(
                f"TDMA lookup-index move (mv_lut_idx={f['mv_lut_idx']} mv_lut_base={f['mv_lut_base']}) "
                f"from {src_fmt} to {dst_fmt} is not simulated yet"
            )
        if not f["int8_sign"]:  # unsigned bytes: a uint8 camera frame read, or its colour-converted planes written
            src_fmt, dst_fmt = {("i8", "bf16"): ("u8", "bf16"), ("bf16", "i8"): ("bf16", "u8")}.get(
                (src_fmt, dst_fmt), (src_fmt, dst_fmt)
            )
        s_esz, d_esz = FORMATS[src_fmt][0], FORMATS[dst_fmt][0]
        src_region, src_addr = _tdma_addr(f, "src", src_global, self.chip)
        dst_region, dst_addr = _tdma_addr(f, "dst", dst_global, self.chip)
        src_cs = f["src_c_stride_low"] | (f["src_c_stride_high"] << 16)
        dst_cs = f["dst_c_stride_low"] | (f["dst_c_stride_high"] << 16)
        n = f["src_n"]
        if f["sys_dtype"]:  # matrix mode: the global side is rows x cols with a row pitch in c_stride
            self._tdma_matrix(f, (src_region, src_addr, src_cs), (dst_region, dst_addr, dst_cs), src_fmt, dst_fmt)
            return
        src_shape = (n, f["src_c"], f["src_h"], f["src_w"])
        dst_shape = (n, f["dst_c"], f["dst_h"], f["dst_w"])
        if f["spec_func"] == 4:
            values = np.full(dst_shape, f["const_val"], np.int64)
        elif f["compress_en"]:
            values = tdma_convert(self._read_compressed(src_region, src_addr, src_shape, src_fmt), src_fmt, dst_fmt)
        else:
            src_strides = (f["src_n_stride"], src_cs, f["src_h_stride"], s_esz)
            values = self._access(src_region, src_addr, src_shape, src_strides, src_fmt)
            values = tdma_convert(values, src_fmt, dst_fmt, bool(f["int8_rnd_mode"]))
            if f["mv_lut_idx"]:
                values = _exponent_index(values)
        if values.size != np.prod(dst_shape):
            raise CorruptFileError(f"TDMA moves {src_shape} into {dst_shape}: element counts differ")
        dst_strides = (f["dst_n_stride"], dst_cs, f["dst_h_stride"], d_esz)
        self._access(dst_region, dst_addr, dst_shape, dst_strides, dst_fmt, values.reshape(dst_shape))

    def _read_compressed(self, region: int, addr: int, shape: tuple, fmt: str) -> np.ndarray:
        """A decompressing load's source: one VLC buffer that decodes to the dense source shape."""
        if fmt not in ("i8", "bf16"):
            raise UnsupportedError(f"TDMA decompression of {fmt} data is not simulated")
        if region < 0:
            raise UnsupportedError("TDMA decompression from local memory is not simulated")
        elements = int(np.prod(shape, dtype=np.int64))
        where = f"compressed TDMA source in gmem region {region} at {addr:#x}"
        if elements * FORMATS[fmt][0] > MAX_ACCESS_BYTES:
            raise CorruptFileError(f"{where}: {shape} is larger than any memory")
        header = compression.VlcHeader.unpack(self.gmem.read_bytes(region, addr, compression.HEADER_BYTES).tobytes())
        data = self.gmem.read_bytes(region, addr, compression.compressed_size(header, elements))
        values = compression.decompress(data, elements, fmt == "bf16", where)
        return values.view(FORMATS[fmt][1]).reshape(shape)

    def _tdma_matrix(self, f: dict[str, int], src: tuple, dst: tuple, src_fmt: str, dst_fmt: str) -> None:
        rows = f["src_n"]
        s_esz, d_esz = FORMATS[src_fmt][0], FORMATS[dst_fmt][0]
        if f["trans_dir"] == 0:  # global rows x src_w -> local (rows, dst_c, 1, dst_w)
            cols = f["src_w"]
            if f["compress_en"]:
                mat = self._read_compressed(src[0], src[1], (rows, 1, 1, cols), src_fmt)
            else:
                mat = self.gmem.read(src[0], src[1], (rows, 1, 1, cols), (src[2], 0, 0, s_esz), src_fmt)
            shape = (rows, f["dst_c"], 1, f["dst_w"])
            strides = (f["dst_n_stride"], dst[2], f["dst_h_stride"], d_esz)
            local = self.lmem.read(dst[1], shape, strides, dst_fmt).reshape(rows, -1)
            local[:, :cols] = tdma_convert(mat.reshape(rows, cols), src_fmt, dst_fmt)
            self.lmem.write(dst[1], shape, strides, dst_fmt, local)
        elif f["trans_dir"] == 1:  # local (rows, src_c, 1, src_w) -> global rows x dst_w
            cols = f["dst_w"]
            shape = (rows, f["src_c"], 1, f["src_w"])
            strides = (f["src_n_stride"], src[2], f["src_h_stride"], s_esz)
            local = self.lmem.read(src[1], shape, strides, src_fmt).reshape(rows, -1)[:, :cols]
            self.gmem.write(
                dst[0],
                dst[1],
                (rows, 1, 1, cols),
                (dst[2], 0, 0, d_esz),
                dst_fmt,
                tdma_convert(local, src_fmt, dst_fmt, bool(f["int8_rnd_mode"])),
            )
        else:
            raise UnsupportedError(f"TDMA matrix mode with direction {f['trans_dir']} is not simulated yet")

    def tiu(self, fields: dict[str, int]) -> None:
        op = tiu_op_name(fields)
        kernel = TIU_KERNELS.get(op)
        if kernel is None:
            raise UnsupportedError(f"TIU operation {op} is not simulated yet")
        kernel(TiuContext(fields, self.lmem, self.chip))

    def run_cmdbuf(self, data: bytes, where: str) -> None:
        for ins in split_cmdbuf(data, self.chip, where):
            if ins.engine == isa.ENGINE_CPU:
                raise UnsupportedError(f"{where}: CPU descriptors inside a cmdbuf are not simulated")
            try:
                (self.tiu if ins.engine == isa.ENGINE_TIU else self.tdma)(ins.fields)
            except ValueError as exc:  # numpy's verdict on operand shapes that do not fit together
                raise CorruptFileError(
                    f"{where}: {ins.engine_name} descriptor at byte {ins.offset} has inconsistent shapes ({exc})"
                ) from exc


# ---- whole model ----------------------------------------------------------------------------------------


def load_program(model: CviModel, inputs: dict[str, np.ndarray], program: int = 0) -> Machine:
    """A machine with the program's gmem regions allocated, weights loaded and inputs written (the region
    sizes were bounded when the file was read: `container.gmem_sizes`)."""
    prog = model.body.programs[program]
    sizes = gmem_sizes(prog)
    regions = {r: np.zeros(size, np.uint8) for r, size in sizes.items()}
    regions[1] = np.frombuffer(model.weight, np.uint8).copy()
    machine = Machine(CHIPS[model.chip], GlobalMemory(regions))
    tensors = {t.name: t for t in prog.tensor_map}
    for name in prog.input_tensors:
        if name not in inputs:
            raise UserError(f"missing input {name!r}; the model expects {', '.join(prog.input_tensors)}")
        view = tensor_view(machine.gmem, tensors[name])
        value = np.asarray(inputs[name])
        if value.size != view.size:
            shape = "x".join(str(int(d)) for d in tensors[name].shape.dim)
            raise UserError(f"input {name!r} has {value.size} elements; the model's tensor {shape} holds {view.size}")
        view[:] = value.astype(view.dtype).reshape(-1)
    return machine


def _shaped_view(gmem: GlobalMemory, t: Any) -> np.ndarray:
    """A tensor's gmem bytes as an array of its 4-D shape (the shape must account for its size)."""
    flat = tensor_view(gmem, t)
    shape = tuple(int(d) for d in t.shape.dim[:4])
    if math.prod(shape) != flat.size:
        raise CorruptFileError(f"tensor {t.name!r}: shape {shape} does not match its {flat.size} elements")
    return flat.reshape(shape)


def tensor_view(gmem: GlobalMemory, t: Any) -> np.ndarray:
    """The bytes of a tensor_map entry in simulated gmem, as a flat array of its dtype."""
    region, local = t.offset >> REGION_BITS, t.offset & ((1 << REGION_BITS) - 1)
    mem = gmem.regions[region]
    if local + t.size > len(mem):
        raise UserError(f"tensor {t.name!r} ({t.size} bytes at {local:#x}) exceeds gmem region {region}")
    return mem[local : local + t.size].view(DTYPES[t.dtype])


class _WeightTensor:
    """A weight_map entry seen as a tensor_map entry (name, offset, size, dtype, shape)."""

    def __init__(self, weight: Any) -> None:
        self.name, self.offset, self.size, self.shape = weight.name, weight.offset, weight.size, weight.shape
        self.dtype = weight.type


TpuRunner = Callable[[Machine, bytes, int, str], None]
_blas: Any = None  # threadpoolctl's controller of the loaded BLAS libraries, made on first use


def _one_blas_thread() -> AbstractContextManager:
    """BLAS on one thread while a program runs: the integer convolutions' float64 matrix products are small,
    and more threads cost more CPU time than they save (3x on two busy cores), the vendor's simulator is
    single-threaded too."""
    global _blas
    if _blas is None:
        from threadpoolctl import ThreadpoolController

        _blas = ThreadpoolController()
    return _blas.limit(limits=1, user_api="blas")


def _run_tpu(machine: Machine, cmdbuf: bytes, index: int, where: str) -> None:
    machine.run_cmdbuf(cmdbuf, where)


def run_routines(model: CviModel, machine: Machine, program: int = 0, run_tpu: TpuRunner = _run_tpu) -> None:
    """Run the program's routines in order on a loaded machine: TPU routines through `run_tpu`, CPU routines
    through the built-in functions."""
    prog = model.body.programs[program]
    tensors = {t.name: t for t in prog.tensor_map}
    # a CPU function reads constants (an embedding table) by name from the weight map, as the runtime does
    weights = {w.name: _WeightTensor(w) for w in model.body.weight_map or [] if w.shape is not None}
    routine_types = model_schema().enums["RoutineType"].values
    with _one_blas_thread():
        for i, r in enumerate(prog.routines):
            _run_routine(machine, model, i, r, routine_types, tensors, weights, run_tpu)


def _run_routine(machine: Machine, model: CviModel, i: int, r: Any, routine_types: dict, tensors: dict,
                 weights: dict, run_tpu: TpuRunner) -> None:  # fmt: skip
    if r.type == routine_types["TPU"]:
        sec = r.tpu_routine.cmdbuf_section
        run_tpu(machine, model.sections[sec], i, f"routine {i} ({sec})")
        return
    fn = CPU_FUNCTIONS.get(r.cpu_routine.function_section)
    if fn is None:
        raise UnsupportedError(f"CPU function {r.cpu_routine.function_section!r} is not simulated")
    args = decode_cpu_args(r.cpu_routine.function_args)
    missing = [n for n in [*r.in_tensors, *r.out_tensors] if n not in tensors and n not in weights]
    if not r.in_tensors or not r.out_tensors or missing:
        raise CorruptFileError(
            f"routine {i}: CPU function {r.cpu_routine.function_section!r} has {len(r.in_tensors)} input and "
            f"{len(r.out_tensors)} output tensors"
            + (f", '{missing[0]}' in neither the tensor map nor the weight map" if missing else "")
        )
    ins = [_shaped_view(machine.gmem, tensors[n] if n in tensors else weights[n]) for n in r.in_tensors]
    outs = [_shaped_view(machine.gmem, tensors[n]) for n in r.out_tensors]
    results = fn(args, ins, [(o.dtype, o.shape) for o in outs])
    if len(results) != len(outs) or not outs:
        raise CorruptFileError(
            f"routine {i}: CPU function {r.cpu_routine.function_section!r} has {len(outs)} output tensors, "
            f"it produces {len(results)}"
        )
    for view, value in zip(outs, results):
        view[...] = value


def run_cvimodel(model: CviModel, inputs: dict[str, np.ndarray], program: int = 0) -> dict[str, np.ndarray]:
    """Run one program on the given inputs (float32 for fp32 tensors); returns the outputs by name."""
    prog = model.body.programs[program]
    tensors = {t.name: t for t in prog.tensor_map}
    machine = load_program(model, inputs, program)
    run_routines(model, machine, program)
    return {name: _shaped_view(machine.gmem, tensors[name]).copy() for name in prog.output_tensors}
