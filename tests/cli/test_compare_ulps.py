"""``onnxrt compare`` tells a rounding flip from a kernel bug: how far apart the first
differing node's inputs are (bitwise, in ulps), and whether that node, run alone on
the reference's exact inputs, then matches.

The planted provider's Mul returns the next float above the exact product: one ulp,
far inside any tolerance. Fed values that sit exactly on QuantizeLinear's .5 rounding
boundary, that ulp flips codes, so QuantizeLinear is the first node whose outputs
differ although its kernel is right; its ``wrong_quantize`` mode adds a real bug there.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxrt
from onnxrt import hookimpl
from onnxrt.cli import main
from onnxrt.cli.compare import compare_models, input_distance, ulp_distance
from onnxrt.plugin.kernel import Kernel, KernelRegistry
from onnxrt.plugin.provider import ExecutionProvider


class LastBitProvider(ExecutionProvider):
    """Mul one ulp high (when ``last_bit``); QuantizeLinear one code high (when ``wrong_quantize``)."""

    name = "LastBitExecutionProvider"
    aliases = ("lastbit",)
    priority = 60
    last_bit = True
    wrong_quantize = False

    @classmethod
    def build_registry(cls):
        reg = KernelRegistry()

        @reg.op("Mul", since=14)
        class Mul(Kernel):
            def run(self, a, b):
                y = a * b
                return (np.nextafter(y, np.inf).astype(y.dtype) if LastBitProvider.last_bit else y,)

        @reg.op("QuantizeLinear", since=13)
        class QuantizeLinear(Kernel):
            def run(self, x, scale, zero_point=None):
                zp = 0 if zero_point is None else zero_point.astype(np.int32)
                q = np.rint(x / scale).astype(np.int32) + zp + (1 if LastBitProvider.wrong_quantize else 0)
                return (np.clip(q, -128, 127).astype(np.int8),)

        return reg


class _Plugin:
    @hookimpl
    def onnxrt_register_providers(self, registry):
        registry.add_provider(LastBitProvider)


@pytest.fixture
def lastbit():
    plugin = _Plugin()
    onnxrt.plugin.discovery.register_plugin(plugin, name="lastbit")
    LastBitProvider.last_bit, LastBitProvider.wrong_quantize = True, False
    try:
        yield LastBitProvider
    finally:
        LastBitProvider.last_bit, LastBitProvider.wrong_quantize = True, False
        onnxrt.plugin.discovery.unregister_plugin(plugin)


def _qdq_model() -> bytes:
    """x -> Mul by 0.5 -> QuantizeLinear (scale 1) -> DequantizeLinear -> y."""
    g = helper.make_graph(
        [helper.make_node("Mul", ["x", "half"], ["m"], name="scale_by_half"),
         helper.make_node("QuantizeLinear", ["m", "s", "zp"], ["q"], name="quantize"),
         helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], name="dequantize")],
        "flip", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])],
        [helper.make_tensor("half", TensorProto.FLOAT, [], [0.5]),
         helper.make_tensor("s", TensorProto.FLOAT, [], [1.0]),
         helper.make_tensor("zp", TensorProto.INT8, [], [0])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m.SerializeToString()


#: odd integers: x / 2 lands exactly on k + 0.5, where rounding half to even decides
ON_THE_BOUNDARY = np.arange(1, 33, 2, dtype=np.float32)


def test_ulp_distance_counts_representable_values():
    one = np.float32(1.0)
    a = np.array([1.0, 0.0, -2.0, 1e-45, 3.0, np.nan], np.float32)
    b = np.array([np.nextafter(one, np.float32(2)), -0.0, -2.0, -1e-45, 3.0, np.nan], np.float32)
    np.testing.assert_array_equal(ulp_distance(a, b), [1, 0, 0, 2, 0, 0])
    # five steps up from 1.0, in each width
    for dt in (np.float16, np.float32, np.float64):
        x = np.array([1.0], dt)
        y = x.copy()
        for _ in range(5):
            y = np.nextafter(y, dt(2))
        assert ulp_distance(x, y)[0] == ulp_distance(y, x)[0] == 5
    assert ulp_distance(np.array([np.nan], np.float32), np.array([1.0], np.float32))[0] == -1
    with pytest.raises(onnxrt.InvalidArgument, match="float16/32/64"):
        ulp_distance(np.zeros(2, np.float32), np.zeros(2, np.float64))


def test_input_distance_of_floats_and_codes():
    a = np.array([1.0, 2.0, 3.0], np.float32)
    b = a.copy()
    b[1] = np.nextafter(b[1], np.float32(0))
    d = input_distance("m", a, b)
    assert (d.differing, d.max_ulps, d.size, d.bitwise) == (1, 1, 3, False)
    assert d.max_abs == pytest.approx(2.0 ** -23)  # the spacing just below 2.0
    assert d.ulps_at_scale == 0.5  # half the spacing at 3.0, the largest value
    assert d.describe() == ("m: 1 of 3 elements differ, at most 1 ulps of float32 "
                            "(0.5 ulps of its largest magnitude), max abs 1.19e-07")
    # near zero floats are dense: 1e-7 against -1e-7 is a billion ulps, 1 ulp of 1.0
    near = input_distance("z", np.array([1.0, 1e-7], np.float32), np.array([1.0, -1e-7], np.float32))
    assert near.max_ulps > 10**9 and near.ulps_at_scale == pytest.approx(2e-7 / 2.0 ** -23, rel=1e-6)
    codes = input_distance("q", np.array([3, -4, 7], np.int8), np.array([3, -5, 5], np.int8))
    assert (codes.differing, codes.max_ulps) == (2, 2)
    assert "at most 2 integer steps" in codes.describe()
    assert input_distance("same", a, a.copy()).describe() == "same: bitwise equal"


@pytest.mark.parametrize("against", [["cpu"], "onnxruntime"])
def test_a_rounding_flip_is_not_called_a_kernel_bug(lastbit, against):
    report = compare_models(_qdq_model(), {"x": ON_THE_BOUNDARY}, providers=["lastbit", "cpu"], against=against)
    assert not report.ok  # the flipped codes reach the output: 1.0 apart
    fd = report.first_divergence
    assert (fd.node, fd.op_type) == ("quantize", "QuantizeLinear")
    (m,) = fd.input_distances  # the scale and zero point are initializers, equal on both sides
    assert m.name == "m" and m.dtype == "float32"
    assert m.differing == 16 and m.max_ulps == 1 and not fd.inputs_bitwise
    # half of the boundary values round to even the other way: codes 1 apart
    assert fd.outputs[0].max_abs == 1.0
    assert fd.matches_on_reference_inputs is True


def test_a_kernel_bug_behind_a_rounding_flip_is_still_a_kernel_bug(lastbit):
    lastbit.wrong_quantize = True
    fd = compare_models(_qdq_model(), {"x": ON_THE_BOUNDARY}, providers=["lastbit", "cpu"],
                        against=["cpu"]).first_divergence
    assert fd.op_type == "QuantizeLinear" and fd.input_distances[0].max_ulps == 1
    assert fd.matches_on_reference_inputs is False


def test_bitwise_equal_inputs_put_the_difference_in_the_node(lastbit):
    lastbit.last_bit, lastbit.wrong_quantize = False, True
    fd = compare_models(_qdq_model(), {"x": ON_THE_BOUNDARY}, providers=["lastbit", "cpu"],
                        against=["cpu"]).first_divergence
    assert fd.op_type == "QuantizeLinear" and fd.inputs_bitwise
    assert fd.input_distances[0].describe() == "m: bitwise equal"
    assert fd.matches_on_reference_inputs is None  # nothing to rerun: the inputs were the same


def _cli(tmp_path, *extra):
    path = tmp_path / "flip.onnx"
    path.write_bytes(_qdq_model())
    np.save(tmp_path / "x.npy", ON_THE_BOUNDARY)
    return main(["compare", str(path), "--providers", "lastbit,cpu", "--input", f"x={tmp_path / 'x.npy'}", *extra])


def test_cli_reports_the_ulps_and_the_verdict(lastbit, tmp_path, capsys):
    assert _cli(tmp_path, "--against", "onnxruntime") == 1
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "first differing node: quantize (QuantizeLinear)" in out
    assert "input m: 16 of 16 elements differ, at most 1 ulps of float32" in out
    assert ("run alone on the reference's inputs it matches the reference: the difference comes from its "
            "inputs' last bits (a rounding flip upstream), not from its kernel") in out


def test_cli_says_when_the_kernel_disagrees(lastbit, tmp_path, capsys):
    lastbit.wrong_quantize = True
    assert _cli(tmp_path, "--against", "cpu") == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "run alone on the reference's inputs it still differs: its kernel disagrees" in out
    lastbit.last_bit = False
    assert _cli(tmp_path, "--against", "cpu") == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "input m: bitwise equal" in out
    assert "its inputs are bitwise equal: the difference starts in this node" in out
