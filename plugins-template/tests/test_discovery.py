"""onnxrt finds the installed provider through its entry point."""

import onnxrt as ort

PROVIDER = "{{Name}}ExecutionProvider"


def test_provider_is_discovered_and_available():
    assert PROVIDER in ort.get_available_providers()
    info = {p["name"]: p for p in ort.get_provider_info()}
    assert info[PROVIDER]["available"] is True
    assert info[PROVIDER]["distribution"] == "onnxrt-{{name}}"


def test_alias_selects_the_provider(onnxrt_models):
    model = onnxrt_models.single_op("Relu")
    sess = ort.InferenceSession(model, providers=["{{name}}", "cpu"])
    assert sess.get_providers() == [PROVIDER, "CPUExecutionProvider"]


def test_unknown_option_is_an_error(onnxrt_models):
    model = onnxrt_models.single_op("Relu")
    try:
        ort.InferenceSession(model, providers=[(PROVIDER, {"no_such_option": 1})])
    except ort.InvalidArgument as e:
        assert "no_such_option" in str(e) and "fuse_elementwise" in str(e)
    else:
        raise AssertionError("an unknown provider option was accepted")
