"""Models that used to be accepted and then produce wrong or missing outputs: each is
refused with a typed error naming what does not fit (InvalidGraph when loading, an
onnxrt run error naming the node when only the run shows it)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt as ort

from ..conftest import make_model

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _vi(name, t=F, shape=None):
    return helper.make_tensor_value_info(name, t, shape)


def _session(model):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


# -- initializers given twice ---------------------------------------------------------


@pytest.mark.parametrize("sizes", [(4, 4), (4096, 4), (4, 4096), (4096, 4096)])
def test_two_initializers_with_one_name_are_refused(sizes):
    # a large one is split off from the small ones as the session loads: one was kept silently
    inits = [numpy_helper.from_array(np.full(n, k, np.float32), "w") for k, n in enumerate(sizes)]
    model = make_model([helper.make_node("Identity", ["w"], ["y"])], [], [_vi("y")], inits)
    with pytest.raises(ort.InvalidGraph, match="initializer 'w' is defined twice"):
        _session(model)


def test_two_initializers_with_one_name_in_a_model_file_over_32_mib(tmp_path):
    big = numpy_helper.from_array(np.zeros(9 << 20, np.float32), "w")  # 36 MiB: read straight from the file
    small = numpy_helper.from_array(np.ones(4, np.float32), "w")
    model = make_model([helper.make_node("Identity", ["w"], ["y"])], [], [_vi("y")], [small, big])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    with pytest.raises(ort.InvalidGraph, match="initializer 'w' is defined twice"):
        ort.InferenceSession(str(path))


def test_an_initializer_and_a_sparse_initializer_with_one_name_are_refused():
    dense = numpy_helper.from_array(np.ones(4, np.float32), "w")
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.array([5.0], np.float32), "w"),
                                       numpy_helper.from_array(np.array([1], np.int64), "w_idx"), [4])
    model = make_model([helper.make_node("Identity", ["w"], ["y"])], [], [_vi("y")], [dense])
    model.graph.sparse_initializer.append(sparse)
    with pytest.raises(ort.InvalidGraph, match="initializer 'w' is defined twice"):
        _session(model)


def test_two_initializers_with_one_name_inside_a_subgraph_are_refused():
    inits = [numpy_helper.from_array(np.full(2, k, np.float32), "w") for k in range(2)]
    then = helper.make_graph([helper.make_node("Identity", ["w"], ["o"])], "then", [], [_vi("o")], initializer=inits)
    other = helper.make_graph([helper.make_node("Constant", [], ["o2"], value_floats=[0.0, 0.0])], "else", [],
                              [_vi("o2")])
    model = make_model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                       [_vi("c", B, [])], [_vi("y")])
    with pytest.raises(ort.InvalidGraph, match="initializer 'w' is defined twice"):
        _session(model)


# -- If -------------------------------------------------------------------------------


def _if_model(then_outs, else_outs, node_outs=("y",), declared=F):
    def branch(name, outs):
        nodes = [helper.make_node("Constant", [], [o], value=numpy_helper.from_array(np.array([v], dt)))
                 for o, (v, dt, _) in outs.items()]
        return helper.make_graph(nodes, name, [], [_vi(o, t, [1]) for o, (_, _, t) in outs.items()])

    node = helper.make_node("If", ["c"], list(node_outs), then_branch=branch("then", then_outs),
                            else_branch=branch("else", else_outs))
    return make_model([node], [_vi("c", B, [])], [_vi(o, declared) for o in node_outs])


def test_if_branches_returning_different_types_are_refused():
    model = _if_model({"a": (1.0, np.float32, F)}, {"b": (1, np.int64, I64)})
    with pytest.raises(ort.InvalidGraph, match=r"If node .*output 0 is tensor\(float\) from then_branch but "
                                               r"tensor\(int64\) from else_branch"):
        _session(model)


def test_if_branches_returning_different_numbers_of_values_are_refused():
    model = _if_model({"a": (1.0, np.float32, F)}, {"b": (1.0, np.float32, F), "b2": (2.0, np.float32, F)})
    with pytest.raises(ort.InvalidGraph, match="If node .*else_branch returns 2 values, but the node has 1 outputs"):
        _session(model)


def test_if_with_more_outputs_than_its_branches_return_is_refused():
    model = _if_model({"a": (1.0, np.float32, F)}, {"b": (1.0, np.float32, F)}, node_outs=("y", "z"))
    with pytest.raises(ort.InvalidGraph, match="then_branch returns 1 values, but the node has 2 outputs"):
        _session(model)


def _untyped(name):
    """A value whose type nothing declares, so that not even shape inference knows it."""
    return helper.make_value_info(name, onnx.TypeProto())


def test_if_branch_returning_a_type_only_the_run_shows_fails_naming_the_node():
    # the else branch returns the untyped input z: the then branch declares float, so
    # a run fed an int64 z refuses rather than hand on the wrong type
    then = helper.make_graph([helper.make_node("Constant", [], ["a"], value_floats=[1.0])], "then", [],
                             [_vi("a", F, [1])])
    other = helper.make_graph([helper.make_node("Identity", ["z"], ["b"])], "else", [], [_untyped("b")])
    model = make_model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                       [_vi("c", B, []), _untyped("z")], [_vi("y", F)])
    sess = _session(model)
    z = np.ones(1, np.int64)
    assert sess.run(None, {"c": np.array(True), "z": z})[0].tolist() == [1.0]
    with pytest.raises(ort.OnnxRtError, match="If 'If_0'.*else branch returned int64 for output 0"):
        sess.run(None, {"c": np.array(False), "z": z})
    assert sess.run(None, {"c": np.array(False), "z": np.full(1, 3.0, np.float32)})[0].tolist() == [3.0]


def test_if_branches_that_agree_still_run():
    model = _if_model({"a": (1.0, np.float32, F)}, {"b": (2.0, np.float32, F)})
    sess = _session(model)
    assert sess.run(None, {"c": np.array(False)})[0].tolist() == [2.0]


# -- Loop -----------------------------------------------------------------------------


def _loop(body_nodes, body_outs, carried_out_type=F, n_node_outs=1, carried_in_type=F):
    body = helper.make_graph(
        body_nodes, "body",
        [_vi("i", I64, []), _vi("c_in", B, []), _vi("x_in", carried_in_type, [1])],
        [_vi("c_out", B, [])] + [_vi(o, carried_out_type, [1]) for o in body_outs])
    node = helper.make_node("Loop", ["M", "", "x"], [f"y{k}" for k in range(n_node_outs)], body=body)
    return make_model([node], [_vi("M", I64, []), _vi("x", F, [1])], [_vi(f"y{k}") for k in range(n_node_outs)])


COND = helper.make_node("Identity", ["c_in"], ["c_out"])


def test_loop_body_without_its_carried_output_is_refused():
    model = _loop([COND], [])
    with pytest.raises(ort.InvalidGraph, match="Loop node .*body returns 1 values, fewer than the condition and "
                                               "the 1 carried values"):
        _session(model)


def test_loop_body_taking_the_wrong_number_of_inputs_is_refused():
    body = helper.make_graph([COND, helper.make_node("Identity", ["x_in"], ["x_out"])], "body",
                             [_vi("i", I64, []), _vi("c_in", B, []), _vi("x_in", F, [1]), _vi("extra", F, [1])],
                             [_vi("c_out", B, []), _vi("x_out", F, [1])])
    model = make_model([helper.make_node("Loop", ["M", "", "x"], ["y"], body=body)],
                       [_vi("M", I64, []), _vi("x", F, [1])], [_vi("y")])
    with pytest.raises(ort.InvalidGraph, match="body takes 4 inputs, but the node carries 1 values"):
        _session(model)


def test_loop_with_more_outputs_than_its_body_returns_is_refused():
    model = _loop([COND, helper.make_node("Identity", ["x_in"], ["x_out"])], ["x_out"], n_node_outs=2)
    with pytest.raises(ort.InvalidGraph, match="has 2 outputs, but its body returns 1 carried values and 0 scan"):
        _session(model)


def test_loop_whose_carried_value_changes_declared_type_is_refused():
    model = _loop([COND, helper.make_node("Cast", ["x_in"], ["x_out"], to=I64)], ["x_out"], carried_out_type=I64)
    with pytest.raises(ort.InvalidGraph, match=r"carried value 0 enters its body as tensor\(float\) but leaves it "
                                               r"as tensor\(int64\)"):
        _session(model)


def test_loop_whose_carried_value_changes_type_at_run_time_fails_naming_the_node():
    # the body hands on the untyped outer input z as the carried value: only the run
    # shows that it is not the float32 that entered
    body = helper.make_graph(
        [COND, helper.make_node("Identity", ["z"], ["x_out"])], "body",
        [_vi("i", I64, []), _vi("c_in", B, []), _untyped("x_in")],
        [_vi("c_out", B, []), _untyped("x_out")])
    model = make_model([helper.make_node("Loop", ["M", "", "x"], ["y"], body=body)],
                       [_vi("M", I64, []), _vi("x", F, [1]), _untyped("z")], [_vi("y")])
    sess = _session(model)
    x = np.ones(1, np.float32)
    with pytest.raises(ort.OnnxRtError, match="Loop 'Loop_0'.*carried value 0 entered iteration 0 as a tensor of "
                                              "float32 and left it as a tensor of int64"):
        sess.run(None, {"M": np.int64(3), "x": x, "z": np.ones(1, np.int64)})
    (y,) = sess.run(None, {"M": np.int64(3), "x": x, "z": np.full(1, 5.0, np.float32)})
    assert y.tolist() == [5.0]


def test_a_well_formed_loop_still_runs():
    model = _loop([COND, helper.make_node("Add", ["x_in", "x_in"], ["x_out"])], ["x_out"])
    (y,) = _session(model).run(None, {"M": np.int64(4), "x": np.ones(1, np.float32)})
    assert y.tolist() == [16.0]


# -- Scan -----------------------------------------------------------------------------


def _scan(body_outs, node_outs=("s", "scan")):
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Identity", ["s_out"], ["y_t"])],
        "body", [_vi("s_in", F, [1]), _vi("x_t", F, [1])], [_vi(o, F, [1]) for o in body_outs])
    node = helper.make_node("Scan", ["s0", "xs"], list(node_outs), body=body, num_scan_inputs=1)
    return make_model([node], [_vi("s0", F, [1]), _vi("xs", F, [None, 1])], [_vi(o) for o in node_outs])


def test_scan_body_without_its_scan_output_is_refused():
    with pytest.raises(ort.InvalidGraph, match=r"Scan node .*has 2 outputs \(1 states and 1 scan outputs\), but "
                                               r"its body returns 1 values"):
        _session(_scan(["s_out"]))


def test_scan_body_returning_more_than_its_node_has_outputs_is_refused():
    with pytest.raises(ort.InvalidGraph, match="has 1 outputs .*body returns 2 values"):
        _session(_scan(["s_out", "y_t"], node_outs=("s",)))


def test_scan_with_the_wrong_axes_count_is_refused():
    model = _scan(["s_out", "y_t"])
    model.graph.node[0].attribute.append(helper.make_attribute("scan_output_axes", [0, 0]))
    with pytest.raises(ort.InvalidGraph, match="scan_output_axes has 2 entries for 1 values"):
        _session(model)


def test_a_well_formed_scan_still_runs():
    s, scan = _session(_scan(["s_out", "y_t"])).run(
        None, {"s0": np.zeros(1, np.float32), "xs": np.arange(1, 4, dtype=np.float32).reshape(3, 1)})
    assert s.tolist() == [6.0] and scan.reshape(-1).tolist() == [1.0, 3.0, 6.0]


# -- sequences of sequences -----------------------------------------------------------


def test_a_sequence_of_sequences_is_refused():
    model = make_model(
        [helper.make_node("SequenceConstruct", ["a"], ["s"]),
         helper.make_node("SequenceConstruct", ["s"], ["ss"]),
         helper.make_node("SequenceLength", ["ss"], ["n"])],
        [_vi("a", F, [2])], [_vi("n", I64, [])])
    with pytest.raises(ort.OnnxRtError, match="SequenceConstruct input 0 is list; a sequence holds tensors only"):
        _session(model).run(None, {"a": np.ones(2, np.float32)})


def test_inserting_a_sequence_into_a_sequence_is_refused():
    model = make_model(
        [helper.make_node("SequenceConstruct", ["a"], ["s"]),
         helper.make_node("SequenceInsert", ["s", "s"], ["ss"]),
         helper.make_node("SequenceLength", ["ss"], ["n"])],
        [_vi("a", F, [2])], [_vi("n", I64, [])])
    with pytest.raises(ort.OnnxRtError, match="SequenceInsert's tensor is list"):
        _session(model).run(None, {"a": np.ones(2, np.float32)})
