"""Whole scikit-learn models and pipelines, converted by skl2onnx, on onnxrt vs onnxruntime.

Where ``test_ml_ops.py`` checks the ``ai.onnx.ml`` kernels one estimator at a time,
this file runs what people deploy: pipelines with preprocessing, clustering, neural
networks and mixed-type tabular data, with skl2onnx's default outputs (ZipMap's list of
dicts for classifier probabilities). Labels agree exactly; probabilities, scores and
values to 1e-4. Data are scikit-learn's bundled datasets or seeded synthetic tables.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("skl2onnx")
ort = pytest.importorskip("onnxruntime")

import onnxrt
from sklearn import datasets
from sklearn.cluster import KMeans
from sklearn.compose import ColumnTransformer
from sklearn.decomposition import PCA
from sklearn.ensemble import (
    GradientBoostingClassifier,
    GradientBoostingRegressor,
    RandomForestClassifier,
    RandomForestRegressor,
)
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MinMaxScaler, OneHotEncoder, StandardScaler
from sklearn.svm import SVC

TARGET_OPSET = {"": 17, "ai.onnx.ml": 3}


def _to_onnx(model, X, **kw):
    from skl2onnx import to_onnx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = to_onnx(model, X, target_opset=TARGET_OPSET, **kw)
    onx.ir_version = min(onx.ir_version, 10)
    return onx.SerializeToString()


def _run(onx: bytes, feeds):
    got = onnxrt.InferenceSession(onx, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    exp = ort.InferenceSession(onx, providers=["CPUExecutionProvider"]).run(None, feeds)
    return got, exp


def _same(got, exp):
    assert len(got) == len(exp)
    for i, (g, e) in enumerate(zip(got, exp)):
        if isinstance(e, list):  # ZipMap: a list of {label: probability}
            assert isinstance(g, list) and len(g) == len(e), f"output {i}"
            for gd, ed in zip(g, e):
                assert list(gd) == list(ed), (
                    f"output {i}: keys {list(gd)} != {list(ed)}"
                )
                np.testing.assert_allclose(
                    list(gd.values()), list(ed.values()), rtol=1e-4, atol=1e-4
                )
            continue
        g = np.asarray(g)
        assert g.shape == e.shape and g.dtype == e.dtype, (
            f"output {i}: {g.dtype}{g.shape} != {e.dtype}{e.shape}"
        )
        if e.dtype.kind in "iubOU":
            np.testing.assert_array_equal(g, e, err_msg=f"output {i}")
        else:
            np.testing.assert_allclose(
                g, e, rtol=1e-4, atol=1e-4, err_msg=f"output {i}"
            )


def _check(model, X, **kw):
    X = np.asarray(X, dtype=np.float32)
    got, exp = _run(_to_onnx(model, X[:1], **kw), {"X": X})
    _same(got, exp)
    return got


@pytest.fixture(scope="module")
def iris():
    X, y = datasets.load_iris(return_X_y=True)
    return X.astype(np.float32), y


@pytest.fixture(scope="module")
def cancer():
    X, y = datasets.load_breast_cancer(return_X_y=True)
    return X.astype(np.float32), y


@pytest.fixture(scope="module")
def diabetes():
    X, y = datasets.load_diabetes(return_X_y=True)
    return X.astype(np.float32), y


def test_logistic_regression_pipeline_zipmap(iris):
    X, y = iris
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(X, y)
    labels, probs = _check(model, X)
    assert isinstance(probs, list) and set(probs[0]) == {0, 1, 2}
    np.testing.assert_array_equal(labels, model.predict(X))


def test_ridge_regression(diabetes):
    X, y = diabetes
    model = Ridge(alpha=0.5).fit(X, y)
    (pred,) = _check(model, X)
    np.testing.assert_allclose(pred.ravel(), model.predict(X), rtol=1e-4, atol=1e-3)


def test_random_forest_classifier_and_regressor(cancer, diabetes):
    X, y = cancer
    clf = RandomForestClassifier(n_estimators=15, max_depth=6, random_state=0).fit(X, y)
    labels, _ = _check(clf, X)
    np.testing.assert_array_equal(labels, clf.predict(X))
    X, y = diabetes
    reg = RandomForestRegressor(n_estimators=15, max_depth=6, random_state=0).fit(X, y)
    (pred,) = _check(reg, X)
    np.testing.assert_allclose(pred.ravel(), reg.predict(X), rtol=1e-4, atol=1e-3)


def test_gradient_boosting_classifier_and_regressor(iris, diabetes):
    X, y = iris
    clf = GradientBoostingClassifier(n_estimators=20, max_depth=3, random_state=0).fit(
        X, y
    )
    labels, _ = _check(clf, X)
    np.testing.assert_array_equal(labels, clf.predict(X))
    X, y = diabetes
    reg = GradientBoostingRegressor(n_estimators=30, random_state=0).fit(X, y)
    (pred,) = _check(reg, X)
    np.testing.assert_allclose(pred.ravel(), reg.predict(X), rtol=1e-4, atol=1e-2)


def test_svc_with_probabilities(cancer):
    X, y = cancer
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", FutureWarning
        )  # sklearn 1.9 deprecates probability=True
        svc = SVC(probability=True, random_state=0)
        model = make_pipeline(MinMaxScaler(), svc).fit(X, y)
    labels, probs = _check(model, X)
    assert len(probs) == len(X)
    assert (labels == model.predict(X)).mean() > 0.95


def test_kmeans_labels_and_distances(iris):
    X, _ = iris
    model = KMeans(n_clusters=3, n_init=3, random_state=0).fit(X)
    labels, dist = _check(model, X)
    np.testing.assert_array_equal(labels, model.predict(X))
    np.testing.assert_allclose(dist, model.transform(X), rtol=1e-4, atol=1e-4)


def test_mlp_classifier_and_regressor(iris, diabetes):
    X, y = iris
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = MLPClassifier(
            hidden_layer_sizes=(16, 8), max_iter=300, random_state=0
        ).fit(X, y)
        reg = MLPRegressor(hidden_layer_sizes=(16,), max_iter=300, random_state=0).fit(
            *diabetes
        )
    labels, _ = _check(clf, X)
    np.testing.assert_array_equal(labels, clf.predict(X))
    (pred,) = _check(reg, diabetes[0])
    np.testing.assert_allclose(
        pred.ravel(), reg.predict(diabetes[0]), rtol=1e-3, atol=1e-3
    )


def test_standard_scaler_pca_pipeline(cancer):
    X, _ = cancer
    model = make_pipeline(StandardScaler(), PCA(n_components=5, random_state=0)).fit(X)
    (proj,) = _check(model, X)
    np.testing.assert_allclose(proj, model.transform(X), rtol=1e-3, atol=1e-3)


def test_column_transformer_mixed_numeric_and_string_columns():
    pd = pytest.importorskip("pandas")
    from skl2onnx.common.data_types import FloatTensorType, StringTensorType

    rng = np.random.default_rng(0)
    n = 200
    df = pd.DataFrame(
        {
            "age": rng.integers(18, 80, n).astype(np.float32),
            "income": rng.normal(50, 15, n).astype(np.float32),
            "city": rng.choice(["paris", "lyon", "nice", "lille"], n),
            "plan": rng.choice(["basic", "pro"], n),
        }
    )
    y = ((df["age"] > 40) ^ (df["city"] == "nice")).astype(int).to_numpy()
    pre = ColumnTransformer(
        [
            ("num", StandardScaler(), ["age", "income"]),
            ("cat", OneHotEncoder(handle_unknown="ignore"), ["city", "plan"]),
        ]
    )
    model = make_pipeline(pre, LogisticRegression(max_iter=500)).fit(df, y)
    types = [
        ("age", FloatTensorType([None, 1])),
        ("income", FloatTensorType([None, 1])),
        ("city", StringTensorType([None, 1])),
        ("plan", StringTensorType([None, 1])),
    ]
    from skl2onnx import convert_sklearn

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = convert_sklearn(model, initial_types=types, target_opset=TARGET_OPSET)
    onx.ir_version = min(onx.ir_version, 10)
    test = df.copy()
    test.loc[:4, "city"] = "unknown-city"  # handle_unknown="ignore": all-zero one-hot
    feeds = {c: test[c].to_numpy().reshape(-1, 1) for c in ["age", "income"]}
    feeds.update(
        {c: test[c].to_numpy().astype(object).reshape(-1, 1) for c in ["city", "plan"]}
    )
    got, exp = _run(onx.SerializeToString(), feeds)
    _same(got, exp)
    np.testing.assert_array_equal(got[0][5:], model.predict(test)[5:])


def test_classifier_without_zipmap_gives_a_probability_matrix(iris):
    X, y = iris
    model = RandomForestClassifier(n_estimators=5, random_state=0).fit(X, y)
    _, probs = _check(model, X, options={id(model): {"zipmap": False}})
    assert probs.shape == (len(X), 3) and probs.dtype == np.float32
