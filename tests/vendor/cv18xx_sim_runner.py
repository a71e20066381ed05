"""Child process: run one .cvimodel on the vendor CV18xx simulator through ctypes (specs/cv18xx-simulator.md).

Usage: python cv18xx_sim_runner.py LIB_DIR MODEL FEEDS_NPZ OUT_NPZ

Kept free of npuc imports and started once per model: the simulator holds one chip per process and a bad cmdbuf
kills the process, which the parent reports as a failure. Exit code 3 means a usage or feed error (on stderr).
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np

# CVI_FMT values (the cvimodel DType enum) -> numpy dtype of the tensor's bytes; bf16 stays raw uint16.
FMT_DTYPES = {
    0: np.float32,
    1: np.int32,
    2: np.uint32,
    3: np.uint16,
    4: np.int16,
    5: np.uint16,
    6: np.int8,
    7: np.uint8,
}
USAGE_ERROR = 3


class CviShape(ctypes.Structure):
    _fields_ = [("dim", ctypes.c_int32 * 6), ("dim_size", ctypes.c_size_t)]


class CviTensor(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("shape", CviShape),
        ("fmt", ctypes.c_int32),
        ("count", ctypes.c_size_t),
        ("mem_size", ctypes.c_size_t),
        ("sys_mem", ctypes.POINTER(ctypes.c_uint8)),
        ("paddr", ctypes.c_uint64),
        ("mem_type", ctypes.c_int32),
        ("qscale", ctypes.c_float),
        ("zero_point", ctypes.c_int32),
        ("pixel_format", ctypes.c_int32),
        ("aligned", ctypes.c_bool),
        ("mean", ctypes.c_float * 3),
        ("scale", ctypes.c_float * 3),
        ("owner", ctypes.c_void_p),
        ("reserved", ctypes.c_char * 32),
    ]


def _fail(message: str) -> None:
    print(message, file=sys.stderr)
    sys.exit(USAGE_ERROR)


def _bind(lib: ctypes.CDLL) -> None:
    tensor_p = ctypes.POINTER(CviTensor)
    lib.CVI_NN_RegisterModel.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.CVI_NN_GetInputOutputTensors.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(tensor_p),
        ctypes.POINTER(ctypes.c_int32),
        ctypes.POINTER(tensor_p),
        ctypes.POINTER(ctypes.c_int32),
    ]
    lib.CVI_NN_TensorPtr.argtypes = [tensor_p]
    lib.CVI_NN_TensorPtr.restype = ctypes.c_void_p
    lib.CVI_NN_Forward.argtypes = [ctypes.c_void_p, tensor_p, ctypes.c_int32, tensor_p, ctypes.c_int32]
    lib.CVI_NN_CleanupModel.argtypes = [ctypes.c_void_p]


def _tensor_array(lib: ctypes.CDLL, t: CviTensor) -> np.ndarray:
    """A numpy view of the tensor's host buffer, shaped by its dims."""
    dtype = FMT_DTYPES.get(t.fmt)
    if dtype is None:
        _fail(f"tensor {t.name.decode()!r} has unknown CVI_FMT {t.fmt}")
    ptr = lib.CVI_NN_TensorPtr(ctypes.byref(t))
    nbytes = t.count * np.dtype(dtype).itemsize
    if not ptr or nbytes > t.mem_size:
        _fail(f"tensor {t.name.decode()!r}: no host buffer for {t.count} elements of fmt {t.fmt}")
    raw = (ctypes.c_uint8 * nbytes).from_address(ptr)
    shape = tuple(t.shape.dim[i] for i in range(t.shape.dim_size))
    return np.frombuffer(raw, dtype).reshape(shape)


def run(lib_dir: Path, model: Path, feeds_path: Path, out_path: Path) -> None:
    lib = ctypes.CDLL(str(lib_dir / "libcviruntime.so"))
    _bind(lib)
    handle = ctypes.c_void_p()
    if rc := lib.CVI_NN_RegisterModel(str(model).encode(), ctypes.byref(handle)):
        _fail(f"CVI_NN_RegisterModel({model}) returned {rc}")
    ins, outs = ctypes.POINTER(CviTensor)(), ctypes.POINTER(CviTensor)()
    n_in, n_out = ctypes.c_int32(), ctypes.c_int32()
    rc = lib.CVI_NN_GetInputOutputTensors(
        handle, ctypes.byref(ins), ctypes.byref(n_in), ctypes.byref(outs), ctypes.byref(n_out)
    )
    if rc:
        _fail(f"CVI_NN_GetInputOutputTensors returned {rc}")
    with np.load(feeds_path) as feeds:
        names = [ins[i].name.decode() for i in range(n_in.value)]
        if sorted(names) != sorted(feeds.files):
            _fail(f"feeds {sorted(feeds.files)} do not match the model inputs {names}")
        for i, name in enumerate(names):
            src = feeds[name]
            if src.dtype == np.uint8 and src.size == ins[i].mem_size != ins[i].count:  # an aligned frame's bytes
                ctypes.memmove(
                    lib.CVI_NN_TensorPtr(ctypes.byref(ins[i])), np.ascontiguousarray(src).ctypes.data, src.size
                )
                continue
            dst = _tensor_array(lib, ins[i])
            if src.size != dst.size:
                _fail(f"input {name!r} needs {dst.size} elements, the feed has {src.size}")
            dst.reshape(-1)[:] = src.astype(dst.dtype).reshape(-1)
    if rc := lib.CVI_NN_Forward(handle, ins, n_in, outs, n_out):
        _fail(f"CVI_NN_Forward returned {rc}")
    results = {outs[i].name.decode(): _tensor_array(lib, outs[i]).copy() for i in range(n_out.value)}
    np.savez(out_path, **results)
    lib.CVI_NN_CleanupModel(handle)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        _fail("usage: cv18xx_sim_runner.py LIB_DIR MODEL FEEDS_NPZ OUT_NPZ")
    run(*(Path(a) for a in sys.argv[1:]))
