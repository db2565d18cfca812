"""Where the installed onnxruntime can serve as the oracle for 8-bit integer products.

onnxruntime's x86 kernels for uint8 x int8 products on a CPU without VNNI (its AVX2
path, built on ``vpmaddubsw``) add each pair of adjacent products in a saturating
16-bit integer: ``255 * 127 + 255 * 127`` comes out as 32767, not 64770, and a
product of full-range codes is then off by whatever saturated. onnxrt's integer
products are exact. Tests that compare with onnxruntime keep their int8 weights
where no pair can saturate on such a machine (codes in [-64, 63], what
``onnxruntime.quantization``'s ``reduce_range`` does for it) and use the full range
where onnxruntime is exact; tests of the extremes check onnxrt against integer
arithmetic in numpy instead.
"""

from __future__ import annotations

import functools

import numpy as np


@functools.lru_cache(maxsize=None)
def u8s8_pairs_saturate() -> bool:
    """Whether onnxruntime's uint8 x int8 MatMulInteger saturates a pair of products here."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    graph = helper.make_graph(
        [node], "probe", [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [helper.make_tensor("b", TensorProto.INT8, [2, 1], [127, 127])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)], ir_version=8)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {"a": np.full((1, 2), 255, np.uint8)})
    return int(y.reshape(-1)[0]) != 255 * 127 * 2


def int8_weight_range() -> tuple[int, int]:
    """``[low, high)`` of the int8 weight codes whose products with any uint8 code
    onnxruntime computes exactly on this machine."""
    return (-64, 64) if u8s8_pairs_saturate() else (-128, 128)
