"""The ONNX node tests of exactly the ops the provider claims.

``onnxrt_node_test`` is parametrized by onnxrt's pytest plugin with every ONNX node test
whose graph uses only ops in this provider's kernel registry (the provider is named by
``onnxrt_provider`` in ``pyproject.toml``). Each runs with the CPU provider as fallback
and fails if the provider did not run every node itself; a node it refuses (a type or
opset its kernels do not claim) is reported as a skip with the reason.

Known failures go in the ``xfail`` mapping of the marker, each with its reason::

    pytestmark = pytest.mark.onnxrt_provider("{{Name}}ExecutionProvider",
                                             xfail={"test_add_uint8": "wraps differently"})
"""


def test_node(onnxrt_node_test):
    onnxrt_node_test.run()
