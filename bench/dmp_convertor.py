"""npuc's DV700 output next to the DMP convertor's on the same Caffe network (models/caffe_nets.py).

    python bench/dmp_convertor.py --tool PATH [--python PY] [--model PROTOTXT --weights CAFFEMODEL]

PATH is a checkout of DigitalMediaProfessionals/tool (convertor.py); PY a Python with the convertor's
packages (numpy, protobuf, h5py, opencv-python-headless, jinja2; run with the pure-Python protobuf, as its
caffe_pb2 predates protobuf 4). For each weight format and transpose_weight setting it prints the weights
file's sha256 from both tools, whether they are equal, and both io buffer sizes. Without --model it uses the
test network whose convertor digests tests/test_dmp_convertor.py pins.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import npuc
from npuc.backends.dmp.artifact import load_network
from npuc.models.caffe_nets import write_dmp_testnet

# The convertor's Keras parser refuses any h5py but 2.7.1 at import, even for Caffe input.
RUNNER = """import os, runpy, sys, h5py
h5py.__version__ = "2.7.1"
tool, ini = sys.argv[1], sys.argv[2]
sys.path.insert(0, tool)
sys.argv = ["convertor.py", ini]
runpy.run_path(os.path.join(tool, "convertor.py"), run_name="__main__")
"""

INI = """[INPUT]
name = {name}
definition = {prototxt}
data = {caffemodel}
origin = CAFFE

[OUTPUT]
output_folder = {out}
generate_source = 1
quantization = {quantization}
transpose_weight = {transpose}
"""


def convertor(tool: Path, python: str, prototxt: Path, caffemodel: Path, work: Path, quant: bool, transpose: bool):
    name = prototxt.stem
    ini = work / f"{name}_q{int(quant)}t{int(transpose)}.ini"
    out = work / f"vendor_q{int(quant)}t{int(transpose)}"
    ini.write_text(INI.format(name=name, prototxt=prototxt, caffemodel=caffemodel, out=out,
                              quantization=int(quant), transpose=int(transpose)))  # fmt: skip
    env = {**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}
    subprocess.run([python, "-c", RUNNER, str(tool), str(ini)], check=True, env=env, capture_output=True)
    cpp = (out / name / f"{name}_gen.cpp").read_text()
    io = int(re.search(r"ReserveMemory\((\d+), (\d+)\)", cpp).group(2))
    return (out / name / f"{name}_weights.bin").read_bytes(), io


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tool", type=Path, required=True, help="checkout of DigitalMediaProfessionals/tool")
    parser.add_argument("--python", default=sys.executable, help="Python with the convertor's packages")
    parser.add_argument("--model", type=Path, help="a Caffe deploy .prototxt (default: the test network)")
    parser.add_argument("--weights", type=Path, help="its .caffemodel")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        prototxt, caffemodel = (args.model, args.weights) if args.model else write_dmp_testnet(work / "net")
        print(f"{'weights':8} {'transpose':9} {'convertor sha256':18} {'npuc sha256':18} {'equal':5} "
              f"{'io convertor':>12} {'io npuc':>8}")  # fmt: skip
        for quant in ("fp16", "8bit"):
            for transpose in (False, True):
                theirs, their_io = convertor(args.tool, args.python, prototxt.resolve(), caffemodel.resolve(), work,
                                             quant == "8bit", transpose)  # fmt: skip
                out = work / f"npuc_{quant}_{int(transpose)}"
                npuc.build(prototxt, "dmp", out, weights=caffemodel, quant=quant,
                          options={"transpose_weight": transpose})  # fmt: skip
                net, ours = load_network(out)
                print(f"{quant:8} {int(transpose):<9} {hashlib.sha256(theirs).hexdigest()[:16]:18} "
                      f"{hashlib.sha256(ours).hexdigest()[:16]:18} {str(theirs == ours):5} "
                      f"{their_io:>12} {net.io_size:>8}")  # fmt: skip


if __name__ == "__main__":
    main()
