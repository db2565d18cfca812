"""The public names take onnxruntime's (and onnxconverter-common's) parameters, in order,
so that scripts run after changing the import."""

import inspect

import pytest

import onnxrt.quantization as q


def _params(f):
    return list(inspect.signature(f).parameters)


@pytest.mark.parametrize("name", ["quantize_static", "quantize_dynamic"])
def test_quantizers_take_onnxruntimes_parameters_in_order(name):
    oq = pytest.importorskip("onnxruntime.quantization")
    theirs, ours = _params(getattr(oq, name)), _params(getattr(q, name))
    assert ours[:len(theirs)] == theirs
    for p in theirs:  # the same defaults, compared by name for the enums
        a = inspect.signature(getattr(oq, name)).parameters[p].default
        b = inspect.signature(getattr(q, name)).parameters[p].default
        assert getattr(a, "name", a) == getattr(b, "name", b), p


def test_enums_have_onnxruntimes_names_and_values():
    oq = pytest.importorskip("onnxruntime.quantization")
    for enum in ("QuantType", "QuantFormat", "CalibrationMethod"):
        assert [(m.name, m.value) for m in getattr(oq, enum)] == [(m.name, m.value) for m in getattr(q, enum)]
    assert {"get_next", "set_range"} <= set(dir(q.CalibrationDataReader))


def test_float16_functions_take_onnxconverter_commons_parameters():
    f16 = pytest.importorskip("onnxconverter_common.float16")
    amp = pytest.importorskip("onnxconverter_common.auto_mixed_precision")
    assert _params(q.convert_float_to_float16) == _params(f16.convert_float_to_float16)
    assert _params(q.auto_convert_mixed_precision) == _params(amp.auto_convert_mixed_precision)
