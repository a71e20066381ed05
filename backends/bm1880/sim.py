"""A functional BM1880 simulator: runs one command of a bmodel from its bytes with numpy.

The command is chosen by input shape (what `bmnet_set_input_shape` does). Its neuron area (neuron_size
bytes, input at Input.offset, outputs at Output.offset) and its weight blob are the two gmem areas; every
GDMA names its area with the cmd_hdr flag (NEURON/WEIGHT) and addresses it as GMEM_BASE + offset, exactly
as the runtime relocates it (specs/bm1880.md §2.4). Local memory is 32 NPU lanes x 64 KiB. Descriptors run
in cmdbuf order (the sync ids only order the two engines, and the stream order already respects them);
BD kernels are in sim_bd.py. Inputs are quantized with the input threshold (q = sat8(floor(x·128/T + 0.5)))
unless given as int8; outputs are dequantized with their thresholds (q·T/128).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npuc.backends.cv18xx.sim_mem import GlobalMemory, LocalMemory
from npuc.compiler.errors import CorruptFileError, UnsupportedError, UserError

from . import isa
from .cmdbuf import Instruction, decode_cmdbuf, gdma_direction, gmem_refs
from .container import BModel, Command, TensorInfo
from .sim_bd import MAX_ELEMENTS, default_strides, run_bd

MAX_NEURON_SIZE = 1 << 28  # 256 MiB: far above any BM1880 net (the board has 1 GiB DDR for everything)
AREAS = {"neuron": isa.FLAG_NEURON, "weight": isa.FLAG_WEIGHT}
LMEM = -1  # pseudo-region of an lmem operand
# (src_fmt, dst_fmt) of the int8 tensor moves in every production cmdbuf (specs/bm1880.md §6 item 5)
GDMA_INT8_FORMATS = {(4, 1)}
GDMA_UNSUPPORTED_FLAGS = ("broadcast", "add_result", "hold_value", "special_func")


def input_name(index: int) -> str:
    """bmodel inputs have no names; npuc calls them input, input1, ..."""
    return "input" if index == 0 else f"input{index}"


@dataclass
class Machine:
    """Neuron and weight areas (gmem regions keyed by their header flag) and the 32-lane local memory."""

    gmem: GlobalMemory
    lmem: LocalMemory

    @classmethod
    def for_command(cls, model: BModel, command: Command) -> Machine:
        if command.neuron_size > MAX_NEURON_SIZE:
            raise CorruptFileError(
                f"neuron_size {command.neuron_size} is larger than any BM1880 device memory; the file is corrupt"
            )
        regions = {
            isa.FLAG_NEURON: np.zeros(command.neuron_size, np.uint8),
            isa.FLAG_WEIGHT: np.frombuffer(model.weight_for(command), np.uint8).copy(),
        }
        return cls(GlobalMemory(regions), LocalMemory.create(isa.NPU_NUM, isa.LMEM_SIZE))

    def _side(self, ins: Instruction, side: str, refs: dict[str, int]) -> tuple[int, int]:
        """(region, address) of the src or dst operand of a GDMA."""
        operand = f"{side}_addr"
        if operand in refs:
            return ins.flags, refs[operand]
        address = ins.fields[operand]
        if not isa.LMEM_BASE <= address < isa.GMEM_BASE:
            raise CorruptFileError(f"GDMA {operand} 0x{address:X} is neither an lmem nor a relocatable gmem address")
        return LMEM, address - isa.LMEM_BASE

    def _access(self, region: int, addr: int, shape: tuple, strides: tuple, values=None):
        if int(np.prod(shape, dtype=np.int64)) > MAX_ELEMENTS:
            raise CorruptFileError(f"GDMA transfer of shape {shape} is larger than local memory")
        if region == LMEM:
            if values is None:
                return self.lmem.read(addr, shape, strides, "u8")
            return self.lmem.write(addr, shape, strides, "u8", values)
        if values is None:
            return self.gmem.read(region, addr, shape, strides, "u8")
        return self.gmem.write(region, addr, shape, strides, "u8", values)

    def gdma(self, ins: Instruction) -> None:
        """A byte-tensor move between gmem and lmem (or within one), with the descriptor's strides."""
        f = ins.fields
        unsupported = [k for k in GDMA_UNSUPPORTED_FLAGS if f[k]]
        if unsupported or (f["src_fmt"], f["dst_fmt"]) not in GDMA_INT8_FORMATS:
            what = ", ".join(unsupported) or f"src_fmt={f['src_fmt']} dst_fmt={f['dst_fmt']}"
            raise UnsupportedError(f"GDMA mode ({what}) is not simulated; only int8 tensor and matrix moves are")
        refs = {ref.operand: ref.offset for ref in gmem_refs(ins)}
        src = self._side(ins, "src", refs)
        dst = self._side(ins, "dst", refs)
        n = f["src_n"]
        if f["is_matrix"]:
            self._gdma_matrix(f, src, dst)
            return
        src_shape = (n, f["src_c"], f["src_h"], f["src_w"])
        dst_shape = (n, f["dst_c"], f["dst_h"], f["dst_w"])
        if np.prod(src_shape, dtype=np.int64) != np.prod(dst_shape, dtype=np.int64):
            raise CorruptFileError(f"GDMA moves {src_shape} into {dst_shape}: element counts differ")
        if f["stride_en"]:
            src_strides = (f["src_n_stride"], f["src_c_stride"], f["src_h_stride"], 1)
            dst_strides = (f["dst_n_stride"], f["dst_c_stride"], f["dst_h_stride"], 1)
        else:  # implied strides: packed in gmem, BMKernel's EU-aligned default layout in lmem
            src_strides = _implied_strides(src[0], src_shape)
            dst_strides = _implied_strides(dst[0], dst_shape)
        values = self._access(*src, src_shape, src_strides)
        self._access(*dst, dst_shape, dst_strides, values.reshape(dst_shape))

    def _gdma_matrix(self, f: dict[str, int], src: tuple[int, int], dst: tuple[int, int]) -> None:
        """Matrix mode (FC operands): a gmem matrix of `rows` x `cols` bytes with a row pitch in h_stride, and
        the lmem matrix layout (rows, column groups c, 1, group width w) whose first `cols` columns it fills."""
        if f["direction"] == 0:  # S2L: gmem rows x src_w -> lmem (rows, dst_c, 1, dst_w)
            rows, cols, pitch = f["src_n"], f["src_w"], f["src_h_stride"]
            local, glob = dst, src
            groups, width = f["dst_c"], f["dst_w"]
            lstrides = (f["dst_n_stride"], f["dst_c_stride"], f["dst_h_stride"], 1)
            if f["src_h"] != rows or f["dst_h"] != 1:
                raise CorruptFileError(f"GDMA matrix load: {rows} rows but src_h {f['src_h']}, dst_h {f['dst_h']}")
        elif f["direction"] == 1:  # L2S: lmem (rows, src_c, 1, src_w) -> gmem dst_h x dst_w
            rows, cols, pitch = f["src_n"], f["dst_w"], f["dst_h_stride"]
            local, glob = src, dst
            groups, width = f["src_c"], f["src_w"]
            lstrides = (f["src_n_stride"], f["src_c_stride"], f["src_h_stride"], 1)
            if f["dst_h"] != rows or f["src_h"] != 1:
                raise CorruptFileError(f"GDMA matrix store: {rows} rows but dst_h {f['dst_h']}, src_h {f['src_h']}")
        else:
            raise UnsupportedError(f"GDMA matrix mode with direction {f['direction']} is not simulated")
        if local[0] != LMEM or glob[0] == LMEM:
            raise CorruptFileError("GDMA matrix mode moves between gmem and lmem")
        if cols > groups * width:
            raise CorruptFileError(f"GDMA matrix of {cols} columns does not fit {groups} groups of {width}")
        lshape = (rows, groups, 1, width)
        matrix = self._access(local[0], local[1], lshape, lstrides).reshape(rows, groups * width)
        if f["direction"] == 0:
            matrix[:, :cols] = self._access(glob[0], glob[1], (rows, 1, 1, cols), (pitch, 0, 0, 1)).reshape(rows, cols)
            self._access(local[0], local[1], lshape, lstrides, matrix.reshape(lshape))
        else:
            self._access(
                glob[0], glob[1], (rows, 1, 1, cols), (pitch, 0, 0, 1), matrix[:, :cols].reshape(rows, 1, 1, cols)
            )

    def run(self, cmdbuf: bytes, source: str) -> None:
        for ins in decode_cmdbuf(cmdbuf, source):
            try:
                if ins.engine == isa.ENGINE_GDMA:
                    self.gdma(ins)
                elif ins.engine == isa.ENGINE_BD:
                    run_bd(self.lmem, ins.fields)
                else:
                    raise UnsupportedError(f"{ins.mnemonic} commands (CPU layers) are not simulated")
            except UserError as exc:
                where = f"{source}: {ins.mnemonic} descriptor at offset {ins.offset}"
                if ins.engine == isa.ENGINE_GDMA:
                    where += f" ({gdma_direction(ins)})"
                raise type(exc)(f"{where}: {exc}") from None
            except ValueError as exc:  # numpy's verdict on operand shapes that do not fit together
                raise CorruptFileError(
                    f"{source}: {ins.mnemonic} descriptor at offset {ins.offset} has inconsistent shapes ({exc})"
                ) from None

    def tensor(self, tensor: TensorInfo) -> np.ndarray:
        """The int8 bytes of a command input/output in the neuron area (NCHW, packed)."""
        area = self.gmem.regions[isa.FLAG_NEURON]
        if tensor.offset + tensor.size > len(area):
            raise CorruptFileError(f"tensor at neuron offset {tensor.offset} (+{tensor.size}) exceeds neuron_size")
        return area[tensor.offset : tensor.offset + tensor.size].view(np.int8).reshape(tensor.shape)


def _implied_strides(region: int, shape: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    if region == LMEM:
        return default_strides(shape, aligned=True)
    _, c, h, w = shape
    return (c * h * w, h * w, w, 1)


def quantize(x: np.ndarray, threshold: float) -> np.ndarray:
    """BMNet activation quantization: q = sat8(floor(x·128/T + 0.5))."""
    q = np.floor(np.asarray(x, np.float64) * (128.0 / threshold) + 0.5)
    return np.clip(q, -128, 127).astype(np.int8)


def dequantize(q: np.ndarray, threshold: float) -> np.ndarray:
    return (q.astype(np.float32) * np.float32(threshold / 128.0)).astype(np.float32)


def select_command(model: BModel, shape: tuple[int, ...] | None, feeds: dict[str, np.ndarray] | None = None) -> Command:
    """The command for `shape`, else for the first feed's shape, else the first command."""
    if shape is None and feeds:
        candidate = tuple(np.shape(feeds.get(input_name(0), next(iter(feeds.values())))))
        if any(c.inputs and c.inputs[0].shape == candidate for c in model.commands):
            shape = candidate
    return model.command_for_shape(tuple(shape)) if shape is not None else model.commands[0]


def _input_bytes(tensor: TensorInfo, name: str, value: np.ndarray) -> np.ndarray:
    value = np.asarray(value)
    if value.shape != tensor.shape:
        shape = "x".join(map(str, tensor.shape))
        raise UserError(f"input {name!r} has shape {value.shape}; the selected command expects {shape}")
    if value.dtype == np.int8:
        return value
    if value.dtype.kind != "f":
        raise UserError(f"input {name!r} is {value.dtype}; pass float32 (quantized here) or int8 (already quantized)")
    if tensor.threshold <= 0:
        raise UserError(f"input {name!r} has no threshold in the bmodel; pass it already quantized as int8")
    return quantize(value, tensor.threshold)


def run_command(model: BModel, command: Command, feeds: dict[str, np.ndarray], source: str = "bmodel") -> dict:
    """Simulate one command; returns the outputs by name, dequantized (int8 if an output has no threshold)."""
    machine = Machine.for_command(model, command)
    for index, tensor in enumerate(command.inputs):
        name = input_name(index)
        if name not in feeds:
            raise UserError(f"missing input {name!r}; the bmodel has {len(command.inputs)} input(s)")
        machine.tensor(tensor)[...] = _input_bytes(tensor, name, feeds[name])
    shape = "x".join(map(str, command.inputs[0].shape)) if command.inputs else "?"
    machine.run(command.cmdbuf, f"{source} command {shape} cmdbuf")
    outputs = {}
    for tensor in command.outputs:
        q = machine.tensor(tensor).copy()
        outputs[tensor.name] = dequantize(q, tensor.threshold) if tensor.threshold > 0 else q
    return outputs


def run_bmodel(
    model: BModel, feeds: dict[str, np.ndarray], shape: tuple[int, ...] | None = None, source: str = "bmodel"
) -> dict[str, np.ndarray]:
    """Pick the command for `shape` (or the feeds' shape) and simulate it."""
    return run_command(model, select_command(model, shape, feeds), feeds, source)
