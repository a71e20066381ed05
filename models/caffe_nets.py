"""Seeded Caffe networks (deploy .prototxt + .caffemodel) for checks against tools that read only Caffe, such as
the DMP convertor: `write_dmp_testnet(folder)` writes the network whose DV700 weights and io size the tests
compare with the convertor's (tests/test_dmp_convertor.py, bench/dmp_convertor.py).

The DMP test network covers every packed kernel size (1, 3, 5, 7 and an even 2x2 padded to 3x3), more than 64
input channels of a 1x1 conv, partial 8-channel blocks, a depthwise conv, a residual add, a max pool fused into
its conv, a global average pool, an InnerProduct and two outputs (one a conv output the convertor flattens).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

DMP_TESTNET = """name: "dmpnet"
input: "x"
input_shape { dim: 1 dim: 3 dim: 20 dim: 28 }
layer { name: "c3" type: "Convolution" bottom: "x" top: "c3"
  convolution_param { num_output: 12 kernel_size: 3 pad: 1 } }
layer { name: "r3" type: "ReLU" bottom: "c3" top: "c3" }
layer { name: "p3" type: "Pooling" bottom: "c3" top: "p3" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "c1" type: "Convolution" bottom: "p3" top: "c1" convolution_param { num_output: 70 kernel_size: 1 } }
layer { name: "c1b" type: "Convolution" bottom: "c1" top: "c1b"
  convolution_param { num_output: 70 kernel_size: 3 pad: 1 } }
layer { name: "res" type: "Eltwise" bottom: "c1" bottom: "c1b" top: "res" }
layer { name: "c5" type: "Convolution" bottom: "res" top: "c5"
  convolution_param { num_output: 10 kernel_size: 5 pad: 2 } }
layer { name: "dw" type: "Convolution" bottom: "c5" top: "dw"
  convolution_param { num_output: 10 group: 10 kernel_size: 3 pad: 1 } }
layer { name: "c7" type: "Convolution" bottom: "dw" top: "c7"
  convolution_param { num_output: 9 kernel_size: 7 pad: 3 } }
layer { name: "rc7" type: "ReLU" bottom: "c7" top: "c7" }
layer { name: "cd" type: "Convolution" bottom: "c7" top: "cd"
  convolution_param { num_output: 8 kernel_size: 2 stride: 2 } }
layer { name: "side" type: "Convolution" bottom: "cd" top: "side"
  convolution_param { num_output: 12 kernel_size: 3 pad: 1 } }
layer { name: "gp" type: "Pooling" bottom: "cd" top: "gp" pooling_param { pool: AVE global_pooling: true } }
layer { name: "fc" type: "InnerProduct" bottom: "gp" top: "fc" inner_product_param { num_output: 5 } }
"""

# layer -> (weight shape, weight spread); every layer also has a bias
_DMP_TESTNET_WEIGHTS = {
    "c3": ((12, 3, 3, 3), 0.3),
    "c1": ((70, 12, 1, 1), 0.2),
    "c1b": ((70, 70, 3, 3), 0.05),
    "side": ((12, 8, 3, 3), 0.1),
    "c5": ((10, 70, 5, 5), 0.05),
    "dw": ((10, 1, 3, 3), 0.3),
    "c7": ((9, 10, 7, 7), 0.05),
    "cd": ((8, 9, 2, 2), 0.1),
    "fc": ((5, 8), 0.05),
}


def write_dmp_testnet(folder: Path) -> tuple[Path, Path]:
    """Write dmpnet.prototxt and dmpnet.caffemodel (float32 weights, seeded) into `folder`."""
    from npuc.frontends.caffe import caffe_schema

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    net = caffe_schema().NetParameter(name="dmpnet")
    for name, (shape, spread) in _DMP_TESTNET_WEIGHTS.items():
        layer = net.layer.add(name=name)
        for value in (rng.normal(0, spread, shape), rng.normal(0, 0.1, shape[0])):
            blob = layer.blobs.add()
            blob.shape.dim.extend(value.shape)
            blob.data.extend(value.astype(np.float32).ravel().tolist())
    prototxt, caffemodel = folder / "dmpnet.prototxt", folder / "dmpnet.caffemodel"
    prototxt.write_text(DMP_TESTNET)
    caffemodel.write_bytes(net.SerializeToString())
    return prototxt, caffemodel
