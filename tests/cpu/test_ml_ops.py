"""ai.onnx.ml kernels against onnxruntime on scikit-learn models converted by skl2onnx.

Each converted graph runs through an onnxrt session (:func:`run_graph`) and compared with onnxruntime: labels exactly, scores to 1e-4.
"""

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("sklearn")
pytest.importorskip("skl2onnx")

from onnx import helper, numpy_helper, TensorProto  # noqa: E402

import onnxrt  # noqa: E402

TARGET_OPSET = {"": 18, "ai.onnx.ml": 3}


def run_graph(model, feeds):
    """Run ``model`` through an onnxrt session on the CPU provider; returns the outputs."""
    sess = onnxrt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _convert(model, X, **kw):
    from skl2onnx import to_onnx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = to_onnx(model, X[:1], target_opset=TARGET_OPSET, **kw)
    onx.ir_version = min(onx.ir_version, 10)
    return onx


def _ort(onx, feeds):
    sess = ort.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _compare(exp, got, where):
    if isinstance(exp, list):  # ZipMap output
        assert isinstance(got, list) and len(got) == len(exp), where
        for e, g in zip(exp, got):
            assert list(e.keys()) == list(g.keys()), where
            np.testing.assert_allclose(list(g.values()), list(e.values()), rtol=1e-4, atol=1e-4, err_msg=where)
        return
    got = np.asarray(got)
    assert got.shape == exp.shape, f"{where}: shape {got.shape} != {exp.shape}"
    assert got.dtype == exp.dtype, f"{where}: dtype {got.dtype} != {exp.dtype}"
    if exp.dtype == object or exp.dtype.kind in "iub":
        assert (got == exp).all(), f"{where}: {got[:10]} != {exp[:10]}"
    else:
        np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-4, err_msg=where)


def _check(model, X, name, **kw):
    onx = _convert(model, X, **kw)
    ml = {n.op_type for n in onx.graph.node if n.domain == "ai.onnx.ml"}
    assert ml, f"{name}: no ai.onnx.ml node in the converted graph"
    feeds = {onx.graph.input[0].name: X}
    exp = _ort(onx, feeds)
    got = run_graph(onx, feeds)
    for o, e, g in zip(onx.graph.output, exp, got):
        _compare(e, g, f"{name}:{o.name}")
    return ml


# -- datasets ---------------------------------------------------------------------------
def _iris():
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    return X.astype(np.float32), y


def _digits():
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return X.astype(np.float32), y


def _diabetes():
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True)
    return X.astype(np.float32), y


# -- trees ------------------------------------------------------------------------------
def test_random_forest_classifier():
    from sklearn.ensemble import RandomForestClassifier

    X, y = _iris()
    m = RandomForestClassifier(n_estimators=10, max_depth=5, random_state=0).fit(X, y)
    assert "TreeEnsembleClassifier" in _check(m, X, "rf")


def test_random_forest_binary_no_zipmap():
    from sklearn.ensemble import RandomForestClassifier

    X, y = _iris()
    yb = (y == 1).astype(np.int64)
    m = RandomForestClassifier(n_estimators=7, max_depth=4, random_state=1).fit(X, yb)
    _check(m, X, "rf-binary", options={"zipmap": False})


def test_gradient_boosting_regressor():
    from sklearn.ensemble import GradientBoostingRegressor

    X, y = _diabetes()
    m = GradientBoostingRegressor(n_estimators=30, max_depth=3, random_state=0).fit(X, y)
    assert "TreeEnsembleRegressor" in _check(m, X, "gbr")


def test_gradient_boosting_classifier_multiclass():
    from sklearn.ensemble import GradientBoostingClassifier

    X, y = _iris()
    m = GradientBoostingClassifier(n_estimators=10, max_depth=2, random_state=0).fit(X, y)
    _check(m, X, "gbc", options={"zipmap": False})


def test_gradient_boosting_classifier_binary():
    from sklearn.ensemble import GradientBoostingClassifier

    X, y = _iris()
    m = GradientBoostingClassifier(n_estimators=10, max_depth=2, random_state=0).fit(X, (y == 2).astype(int))
    _check(m, X, "gbc-binary", options={"zipmap": False})


def test_decision_tree_classifier_string_labels():
    from sklearn.tree import DecisionTreeClassifier

    X, y = _iris()
    names = np.array(["setosa", "versicolor", "virginica"], dtype=object)
    m = DecisionTreeClassifier(max_depth=4, random_state=0).fit(X, names[y])
    _check(m, X, "dt-str")


def test_decision_tree_regressor():
    from sklearn.tree import DecisionTreeRegressor

    X, y = _diabetes()
    m = DecisionTreeRegressor(max_depth=6, random_state=0).fit(X, y)
    _check(m, X, "dt-reg")


def test_extra_trees_regressor_multi_target():
    from sklearn.ensemble import ExtraTreesRegressor

    X, y = _diabetes()
    Y = np.stack([y, -y, y * 0.5], axis=1)
    m = ExtraTreesRegressor(n_estimators=5, max_depth=5, random_state=0).fit(X, Y)
    _check(m, X, "et-multi")


# -- linear -----------------------------------------------------------------------------
def test_logistic_regression_multiclass():
    from sklearn.linear_model import LogisticRegression

    X, y = _iris()
    m = LogisticRegression(max_iter=500).fit(X, y)
    assert "LinearClassifier" in _check(m, X, "logreg")


def test_logistic_regression_binary():
    from sklearn.linear_model import LogisticRegression

    X, y = _iris()
    m = LogisticRegression(max_iter=500).fit(X, (y == 1).astype(int))
    _check(m, X, "logreg-binary", options={"zipmap": False})


def test_linear_regression():
    from sklearn.linear_model import LinearRegression

    X, y = _diabetes()
    m = LinearRegression().fit(X, y)
    assert "LinearRegressor" in _check(m, X, "linreg")


def test_svc_probability():
    from sklearn.svm import SVC

    X, y = _iris()
    m = SVC(probability=True, random_state=0).fit(X, y)
    assert "SVMClassifier" in _check(m, X, "svc-proba", options={"zipmap": False})


@pytest.mark.parametrize("kernel", ["linear", "poly", "rbf", "sigmoid"])
def test_svc_kernels(kernel):
    from sklearn.svm import SVC

    X, y = _iris()
    m = SVC(kernel=kernel, random_state=0, gamma=0.1).fit(X, y)
    _check(m, X, f"svc-{kernel}", options={"zipmap": False})


def test_svc_binary_probability_digits():
    from sklearn.svm import SVC

    X, y = _digits()
    X, y = X[:300] / 16.0, (y[:300] % 2).astype(int)
    m = SVC(probability=True, random_state=0).fit(X, y)
    _check(m, X.astype(np.float32), "svc-binary", options={"zipmap": False})


@pytest.mark.parametrize("kernel", ["linear", "rbf"])
def test_svr(kernel):
    from sklearn.svm import SVR

    X, y = _diabetes()
    m = SVR(kernel=kernel, C=10.0).fit(X, y)
    assert "SVMRegressor" in _check(m, X, f"svr-{kernel}")


def test_one_class_svm():
    from sklearn.svm import OneClassSVM

    X, _ = _iris()
    m = OneClassSVM(gamma=0.1, nu=0.1).fit(X)
    _check(m, X, "ocsvm")


# -- preprocessing ----------------------------------------------------------------------
def test_standard_scaler():
    from sklearn.preprocessing import StandardScaler

    X, _ = _diabetes()
    assert "Scaler" in _check(StandardScaler().fit(X), X, "scaler")


@pytest.mark.parametrize("norm", ["l1", "l2", "max"])
def test_normalizer(norm):
    from sklearn.preprocessing import Normalizer

    X, _ = _iris()
    assert "Normalizer" in _check(Normalizer(norm=norm).fit(X), X, f"normalizer-{norm}")


def test_binarizer():
    from sklearn.preprocessing import Binarizer

    X, _ = _iris()
    assert "Binarizer" in _check(Binarizer(threshold=3.0).fit(X), X, "binarizer")


def test_one_hot_encoder_int():
    from sklearn.preprocessing import OneHotEncoder

    X, _ = _iris()
    Xi = np.round(X[:, :2]).astype(np.int64)
    m = OneHotEncoder(handle_unknown="ignore").fit(Xi)
    _check(m, Xi, "ohe-int")


def test_one_hot_encoder_string():
    from sklearn.preprocessing import OneHotEncoder

    Xs = np.array([["a", "x"], ["b", "y"], ["a", "z"], ["c", "x"]], dtype=object)
    m = OneHotEncoder(handle_unknown="ignore").fit(Xs)
    _check(m, Xs, "ohe-str")


def test_label_encoder():
    from sklearn.preprocessing import LabelEncoder

    y = np.array(["b", "a", "c", "a", "b"], dtype=object)
    m = LabelEncoder().fit(y)
    _check(m, y, "label-encoder")


# -- node-level checks against onnxruntime ---------------------------------------------
def _node_model(op, attrs, inputs, outputs, ml_opset=3):
    node = helper.make_node(op, [i.name for i in inputs], [o.name for o in outputs], domain="ai.onnx.ml", **attrs)
    g = helper.make_graph([node], "g", inputs, outputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("ai.onnx.ml", ml_opset)])
    m.ir_version = 10
    return m


def _tree_attrs(rng, n_trees, n_feat, n_cls, modes, one_class=None):
    a = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_values", "nodes_modes",
                         "nodes_truenodeids", "nodes_falsenodeids", "nodes_missing_value_tracks_true")}
    w = {k: [] for k in ("treeids", "nodeids", "ids", "weights")}
    for t in range(n_trees):
        nodes = []

        def build(depth):
            nid = len(nodes)
            nodes.append(None)
            if depth >= 3 or (depth and rng.random() < 0.3):
                nodes[nid] = None
                return nid
            f, thr, mode = int(rng.integers(n_feat)), float(np.round(rng.normal(), 1)), str(rng.choice(modes))
            tn, fn = build(depth + 1), build(depth + 1)
            nodes[nid] = (mode, f, thr, tn, fn, int(rng.random() < 0.5))
            return nid

        build(0)
        for i, nd in enumerate(nodes):
            a["nodes_treeids"].append(t)
            a["nodes_nodeids"].append(i)
            if nd is None:
                for k, v in zip(a, (None, None, 0, 0.0, "LEAF", 0, 0, 0)):
                    if v is not None:
                        a[k].append(v)
                classes = list(range(n_cls)) if one_class is None else [one_class]
                for c in classes:
                    w["treeids"].append(t)
                    w["nodeids"].append(i)
                    w["ids"].append(c)
                    w["weights"].append(float(np.round(rng.random(), 2)))
            else:
                mode, f, thr, tn, fn, mt = nd
                for k, v in zip(list(a)[2:], (f, thr, mode, tn, fn, mt)):
                    a[k].append(v)
    return a, w


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
@pytest.mark.parametrize("n_cls,one_class", [(3, None), (2, 1), (2, 0), (2, None)])
def test_tree_classifier_modes_vs_ort(post, n_cls, one_class):
    """one_class: every leaf weighs that class alone (two labels, one score a row)."""
    rng = np.random.default_rng(n_cls * 10 + len(post))
    modes = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]
    a, w = _tree_attrs(rng, 4, 3, n_cls, modes, one_class)
    attrs = dict(a, class_treeids=w["treeids"], class_nodeids=w["nodeids"], class_ids=w["ids"],
                 class_weights=w["weights"], post_transform=post, classlabels_int64s=list(range(n_cls)))
    if n_cls == 2 and one_class is None:
        attrs["base_values"] = [0.1, -0.2]
    X = np.round(rng.normal(size=(40, 3)), 1).astype(np.float32)
    X[rng.random(X.shape) < 0.1] = np.nan
    m = _node_model("TreeEnsembleClassifier", attrs,
                    [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])],
                    [helper.make_tensor_value_info("Y", TensorProto.INT64, [None]),
                     helper.make_tensor_value_info("Z", TensorProto.FLOAT, [None, n_cls])])
    exp = _ort(m, {"X": X})
    got = run_graph(m, {"X": X})
    for e, g, n in zip(exp, got, "YZ"):
        _compare(e, g, n)


@pytest.mark.parametrize("agg", ["SUM", "AVERAGE", "MIN", "MAX"])
def test_tree_regressor_aggregates_vs_ort(agg):
    rng = np.random.default_rng(7)
    a, w = _tree_attrs(rng, 5, 3, 2, ["BRANCH_LEQ", "BRANCH_GT"])
    attrs = dict(a, target_treeids=w["treeids"], target_nodeids=w["nodeids"], target_ids=w["ids"],
                 target_weights=w["weights"], aggregate_function=agg, n_targets=2, base_values=[0.5, -0.5])
    X = np.round(rng.normal(size=(30, 3)), 1).astype(np.float32)
    m = _node_model("TreeEnsembleRegressor", attrs,
                    [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])],
                    [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 2])])
    _compare(_ort(m, {"X": X})[0], run_graph(m, {"X": X})[0], agg)


def test_tree_ensemble_v5_member_vs_ort():
    # tree 0: x0 in {1, 3} ? (x1 <= 0.5 ? leaf0 : leaf1) : leaf2 ; tree 1: a single leaf
    attrs = dict(
        nodes_featureids=[0, 1, 0], nodes_splits=numpy_helper.from_array(np.array([0.0, 0.5, 0.0], np.float32)),
        nodes_modes=numpy_helper.from_array(np.array([6, 0, 0], np.uint8)),
        nodes_truenodeids=[1, 0, 3], nodes_trueleafs=[0, 1, 1],
        nodes_falsenodeids=[2, 1, 3], nodes_falseleafs=[1, 1, 1],
        nodes_missing_value_tracks_true=[1, 0, 0],
        membership_values=numpy_helper.from_array(np.array([1.0, 3.0, np.nan], np.float32)),
        leaf_targetids=[0, 1, 0, 1], leaf_weights=numpy_helper.from_array(np.array([1, 2, 3, 4], np.float32)),
        tree_roots=[0, 2], n_targets=2, aggregate_function=1, post_transform=0,
    )
    X = np.array([[1, 0], [3, 1], [2, 0], [np.nan, 1], [0, 0]], np.float32)
    m = _node_model("TreeEnsemble", attrs, [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2])],
                    [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 2])], ml_opset=5)
    _compare(_ort(m, {"X": X})[0], run_graph(m, {"X": X})[0], "tree-v5")


def test_array_feature_extractor_out_of_range():
    m = _node_model("ArrayFeatureExtractor", {},
                    [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3]),
                     helper.make_tensor_value_info("I", TensorProto.INT64, [None])],
                    [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    X = np.arange(6, dtype=np.float32).reshape(2, 3)
    _compare(_ort(m, {"X": X, "I": np.array([2, 0])})[0], run_graph(m, {"X": X, "I": np.array([2, 0])})[0], "afe")
    with pytest.raises(onnxrt.InvalidArgument, match="ArrayFeatureExtractor"):
        run_graph(m, {"X": X, "I": np.array([3])})


def test_zipmap_and_label_encoder_v4():
    m = _node_model("LabelEncoder", dict(keys_tensor=numpy_helper.from_array(np.array([1, 2, 3], np.int64)),
                                         values_tensor=numpy_helper.from_array(np.array([0.5, 1.5, 2.5], np.float32)),
                                         default_tensor=numpy_helper.from_array(np.array([-1.0], np.float32))),
                    [helper.make_tensor_value_info("X", TensorProto.INT64, [None])],
                    [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None])], ml_opset=4)
    x = np.array([3, 1, 7, 2], np.int64)
    _compare(_ort(m, {"X": x})[0], run_graph(m, {"X": x})[0], "le4")
    zm = _node_model("ZipMap", dict(classlabels_strings=["a", "b"]),
                     [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2])],
                     [helper.make_value_info("Y", helper.make_sequence_type_proto(
                         helper.make_map_type_proto(TensorProto.STRING, helper.make_tensor_type_proto(TensorProto.FLOAT, []))))])
    z = np.array([[0.25, 0.75], [1, 0]], np.float32)
    _compare(_ort(zm, {"X": z})[0], run_graph(zm, {"X": z})[0], "zipmap")


# -- preprocessing ops not covered above --------------------------------------------------
def test_imputer_from_simple_imputer():
    from sklearn.impute import SimpleImputer

    X = np.random.default_rng(3).normal(size=(40, 5)).astype(np.float32)
    X[::3, 1] = np.nan
    X[::7, 4] = np.nan
    ml = _check(SimpleImputer(strategy="median").fit(X), X, "imputer")
    assert "Imputer" in ml


def test_dict_vectorizer_and_feature_vectorizer():
    from skl2onnx.common.data_types import (
        DictionaryType,
        FloatTensorType,
        StringTensorType,
    )
    from sklearn.feature_extraction import DictVectorizer

    rows = [{"a": 1.0, "b": 2.0}, {"b": 3.0, "c": -1.5}, {"a": 0.5, "c": 4.0, "d": 7.0}]
    dv = DictVectorizer(sparse=False).fit(rows)
    from skl2onnx import convert_sklearn

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = convert_sklearn(dv, initial_types=[("X", DictionaryType(StringTensorType([]), FloatTensorType([])))],
                              target_opset=TARGET_OPSET)
    onx.ir_version = 10
    assert any(n.op_type == "DictVectorizer" for n in onx.graph.node)
    for row in rows:
        _compare(_ort(onx, {"X": row})[0], run_graph(onx, {"X": row})[0], "dict-vectorizer")
    m = _node_model("FeatureVectorizer", {"inputdimensions": [2, 1, 3]},
                    [helper.make_tensor_value_info("A", TensorProto.FLOAT, [None, 2]),
                     helper.make_tensor_value_info("B", TensorProto.FLOAT, [None, 1]),
                     helper.make_tensor_value_info("C", TensorProto.FLOAT, [None, 3])],
                    [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    feeds = {"A": np.ones((4, 2), np.float32), "B": np.arange(4, dtype=np.float32).reshape(4, 1),
             "C": np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)}
    _compare(_ort(m, feeds)[0], run_graph(m, feeds)[0], "feature-vectorizer")


@pytest.mark.parametrize("shapes,dims", [
    ([(3,)], [4]),  # one row, padded to 4 columns
    ([(2,)], [1]),  # one row, cut to 1 column
    ([(3,), (1, 2)], [4, 2]),  # a 1-D input beside a [1, C] one
    ([(2, 3), (2, 2, 2)], [3, 4]),  # a 3-D input is [N, rest]
], ids=["pad", "cut", "mixed", "3-d"])
def test_feature_vectorizer_reads_a_1d_input_as_one_row(shapes, dims):
    """The spec: "1-D tensors are treated as [1,C]"; a 1-D input of 3 values with
    inputdimensions [4] was read as 3 rows of one value."""
    names = [f"X{i}" for i in range(len(shapes))]
    m = _node_model("FeatureVectorizer", {"inputdimensions": dims},
                    [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names],
                    [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    rng = np.random.default_rng(0)
    feeds = {n: rng.normal(size=s).astype(np.float32) for n, s in zip(names, shapes)}
    exp, got = _ort(m, feeds)[0], run_graph(m, feeds)[0]
    assert got.shape == exp.shape
    _compare(exp, got, "feature-vectorizer")


@pytest.mark.parametrize("direction", ["str_to_int", "int_to_str"])
def test_category_mapper(direction):
    attrs = {"cats_strings": ["cat", "dog", "eel"], "cats_int64s": [10, 20, 30],
             "default_int64": -1, "default_string": "none"}
    if direction == "str_to_int":
        inp = helper.make_tensor_value_info("X", TensorProto.STRING, [None])
        out = helper.make_tensor_value_info("Y", TensorProto.INT64, None)
        X = np.array(["dog", "eel", "yak", "cat"], dtype=object)
    else:
        inp = helper.make_tensor_value_info("X", TensorProto.INT64, [None])
        out = helper.make_tensor_value_info("Y", TensorProto.STRING, None)
        X = np.array([30, 10, 99], dtype=np.int64)
    m = _node_model("CategoryMapper", attrs, [inp], [out])
    _compare(_ort(m, {"X": X})[0], run_graph(m, {"X": X})[0], "category-mapper")


# -- batched float32 paths of the linear kernels -------------------------------------
# 1024 rows of 16 features: enough values for the row helpers' faster routes (a vector
# repeated along wide rows, maxima over the transposed rows, softmax without the shift)
_ROWS = np.random.default_rng(7).normal(size=(1024, 16)).astype(np.float32)


def _rows_feed(scale=1.0):
    return {"X": (_ROWS * np.float32(scale)).astype(np.float32)}


def test_scaler_per_feature_vectors_on_many_rows():
    rng = np.random.default_rng(1)
    attrs = {"offset": rng.normal(size=16).tolist(), "scale": rng.uniform(0.5, 2, size=16).tolist()}
    m = _node_model("Scaler", attrs, [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 16])],
                    [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    feeds = _rows_feed()
    _compare(_ort(m, feeds)[0], run_graph(m, feeds)[0], "scaler-rows")
    # the input is not written to
    assert np.array_equal(feeds["X"], _rows_feed()["X"])


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
def test_normalizer_on_many_rows(norm):
    m = _node_model("Normalizer", {"norm": norm}, [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 16])],
                    [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    feeds = _rows_feed()
    _compare(_ort(m, feeds)[0], run_graph(m, feeds)[0], f"normalizer-rows-{norm}")
    assert np.array_equal(feeds["X"], _rows_feed()["X"])  # the input is not written to


@pytest.mark.parametrize("scale", [1.0, 1000.0])
def test_linear_classifier_softmax_float32(scale):
    """float32 scores take float32 softmax; logits in the thousands (scale 1000)
    overflow exp unshifted and must take the shifted route, with the same answer."""
    rng = np.random.default_rng(3)
    attrs = {"coefficients": rng.normal(size=3 * 16).tolist(), "intercepts": [0.1, -0.2, 0.3],
             "classlabels_ints": [4, 5, 6], "multi_class": 1, "post_transform": "SOFTMAX"}
    m = _node_model("LinearClassifier", attrs, [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 16])],
                    [helper.make_tensor_value_info("Y", TensorProto.INT64, None),
                     helper.make_tensor_value_info("Z", TensorProto.FLOAT, None)])
    sess = onnxrt.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for s in (scale, 1.0):  # a second call after the route may have changed
        feeds = _rows_feed(s)
        exp = _ort(m, feeds)
        got = sess.run(None, feeds)
        _compare(exp[0], got[0], f"linear-softmax-{s}:label")
        _compare(exp[1], got[1], f"linear-softmax-{s}:probabilities")
        assert got[1].dtype == np.float32
        np.testing.assert_allclose(got[1].sum(axis=1), 1, rtol=1e-5)


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
def test_normalizer_leaves_a_row_without_norm_as_it_is(norm):
    """A row of zeros (or, for MAX, one whose maximum is 0) has nothing to divide by:
    onnxruntime leaves it as it is, as scikit-learn's normalize does, not NaN."""
    m = _node_model("Normalizer", {"norm": norm}, [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])],
                    [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    feeds = {"X": np.array([[-1, 0, -2], [0, 0, 0], [1, -2, 3], [-1, -2, -3]], np.float32)}
    got = run_graph(m, feeds)[0]
    _compare(_ort(m, feeds)[0], got, f"normalizer-zero-rows-{norm}")
    np.testing.assert_array_equal(got[1], 0)
    assert np.isfinite(got).all()


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX"])
def test_linear_classifier_with_one_score_row_gives_two_columns(post):
    """One coefficient row and two labels: onnxruntime writes [1 - p, p], with p the
    score made a probability by LOGISTIC (other transforms leave the score)."""
    rng = np.random.default_rng(7)
    attrs = {"coefficients": rng.normal(size=4).tolist(), "intercepts": [0.2], "classlabels_ints": [3, 8],
             "post_transform": post}
    m = _node_model("LinearClassifier", attrs, [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 4])],
                    [helper.make_tensor_value_info("Y", TensorProto.INT64, None),
                     helper.make_tensor_value_info("Z", TensorProto.FLOAT, None)])
    feeds = {"X": rng.normal(size=(50, 4)).astype(np.float32) * 2}
    got = run_graph(m, feeds)
    exp = _ort(m, feeds)
    _compare(exp[0], got[0], f"linear-binary-{post}:label")
    _compare(exp[1], got[1], f"linear-binary-{post}:scores")
    np.testing.assert_array_equal(got[1][:, 0], np.float32(1) - got[1][:, 1])
    if post == "LOGISTIC":
        assert ((got[1] > 0) & (got[1] < 1)).all()
