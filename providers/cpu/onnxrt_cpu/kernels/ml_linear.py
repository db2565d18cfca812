"""Linear and kernel models of the ai.onnx.ml domain: LinearClassifier, LinearRegressor,
SVMClassifier, SVMRegressor, and the elementwise Normalizer, Binarizer and Scaler.

Scores are computed in float (as onnxruntime does) and labels and the binary-case
score layouts follow onnxruntime.
"""

from __future__ import annotations

import numpy as np

from onnxrt.plugin.kernel import Kernel

from ..registry import op
from .ml_tree import as_matrix, binary_pair, check_post, logistic, post_transform, probit
from ..rows import row_max, row_op, row_sum

_F32 = np.float32


def _labels(attrs, ints_name, what, required=True):
    strings = attrs.get("classlabels_strings") or []
    ints = attrs.get(ints_name) or []
    if strings:
        return np.array(list(strings), dtype=object), True
    if ints:
        return np.asarray(ints, dtype=np.int64), False
    if required:
        raise ValueError(f"{what}: classlabels_strings or {ints_name} is required")
    return np.zeros(0, dtype=np.int64), False


# -- LinearClassifier / LinearRegressor -----------------------------------------------
@op("LinearClassifier", since=1, domain="ai.onnx.ml")
class LinearClassifier(Kernel):
    """Linear classifier: label [N] and float scores [N, C] (two columns for one score
    when there are two labels)."""

    def setup(self):
        a = self.attrs
        what = self.node.describe()
        self.labels, self.strings = _labels(a, "classlabels_ints", what)
        self.post = check_post(a.get("post_transform", "NONE"))
        inter = np.asarray(a.get("intercepts") or [], dtype=_F32)
        coef = np.asarray(a.get("coefficients") or [], dtype=_F32)
        if coef.size == 0:
            raise ValueError(f"{what}: coefficients are required")
        self.n_targets = len(inter) if len(inter) else len(self.labels)
        if coef.size % self.n_targets:
            raise ValueError(f"{what}: {coef.size} coefficients do not split into {self.n_targets} classes")
        self.coef_t = np.ascontiguousarray(coef.reshape(self.n_targets, -1).T)
        self.inter = inter if len(inter) else np.zeros(self.n_targets, dtype=_F32)
        self.add_second = self.n_targets == 1 and len(self.labels) == 2

    def run(self, x):
        X = as_matrix(x, self.node.describe(), _F32)
        if X.shape[1] != self.coef_t.shape[0]:
            raise ValueError(f"{self.node.describe()}: input has {X.shape[1]} features, "
                             f"the model {self.coef_t.shape[0]}")
        s = X @ self.coef_t + self.inter
        if self.n_targets == 1:
            win = s[:, 0] > 0
            if len(self.labels) == 2:
                label = self.labels[win.astype(np.int64)]
            elif self.strings:
                label = np.where(win, "1", "0").astype(object)
            else:
                label = win.astype(np.int64)
            if self.add_second:
                z = binary_pair(s[:, 0].astype(np.float64), self.post, 1)
            elif self.post == "PROBIT":
                z = probit(s)
            else:
                z = s  # onnxruntime applies no other transform to a single score
        else:
            label = self.labels[np.argmax(s, axis=1)]
            z = post_transform(s, self.post)
        return label, np.asarray(z).astype(_F32, copy=False)


@op("LinearRegressor", since=1, domain="ai.onnx.ml")
class LinearRegressor(Kernel):
    """Linear regression: float Y [N, targets]."""

    def setup(self):
        a = self.attrs
        what = self.node.describe()
        self.post = check_post(a.get("post_transform", "NONE"))
        self.targets = int(a.get("targets", 1))
        coef = np.asarray(a.get("coefficients") or [], dtype=_F32)
        if coef.size % self.targets:
            raise ValueError(f"{what}: {coef.size} coefficients do not split into {self.targets} targets")
        self.coef_t = np.ascontiguousarray(coef.reshape(self.targets, -1).T)
        inter = np.asarray(a.get("intercepts") or [], dtype=_F32)
        if len(inter) not in (0, self.targets):
            raise ValueError(f"{what}: intercepts must have one value per target")
        self.inter = inter if len(inter) else np.zeros(self.targets, dtype=_F32)

    def run(self, x):
        X = as_matrix(x, self.node.describe(), _F32)
        if X.shape[1] != self.coef_t.shape[0]:
            raise ValueError(f"{self.node.describe()}: input has {X.shape[1]} features, "
                             f"the model {self.coef_t.shape[0]}")
        s = X @ self.coef_t + self.inter
        if self.targets == 1 and self.post != "PROBIT":
            return (s,)
        return (post_transform(s, self.post).astype(_F32),)


# -- SVM ------------------------------------------------------------------------------
class _SVMBase(Kernel):
    def _kernel_setup(self):
        a = self.attrs
        self.kernel = a.get("kernel_type", "LINEAR")
        if self.kernel not in ("LINEAR", "POLY", "RBF", "SIGMOID"):
            raise ValueError(f"{self.node.describe()}: unknown kernel_type {self.kernel!r}")
        kp = list(a.get("kernel_params") or [])
        self.gamma, self.coef0, self.degree = (kp + [0.0, 0.0, 0.0])[:3] if kp else (0.0, 0.0, 0.0)

    def _kernel(self, X, sv, kernel):
        """Kernel values [N, V] between rows of X and support vectors (float32)."""
        if kernel == "RBF":
            d = (X[:, None, :].astype(np.float64) - sv[None, :, :]) ** 2
            return np.exp(-self.gamma * d.sum(axis=2)).astype(_F32)
        dot = X @ sv.T
        if kernel == "LINEAR":
            return dot
        k = _F32(self.gamma) * dot + _F32(self.coef0)
        if kernel == "POLY":
            return np.power(k, _F32(self.degree))
        return np.tanh(k)


@op("SVMClassifier", since=1, domain="ai.onnx.ml")
class SVMClassifier(_SVMBase):
    """Support vector classification (one-vs-one with votes, optional Platt probabilities)."""

    def setup(self):
        a = self.attrs
        what = self.node.describe()
        self._kernel_setup()
        self.labels, self.strings = _labels(a, "classlabels_ints", what, required=False)
        if len(self.labels) == 0:
            raise ValueError(f"{what}: classlabels_strings or classlabels_ints is required")
        self.n_classes = len(self.labels)
        self.post = check_post(a.get("post_transform", "NONE"))
        self.coef = np.asarray(a.get("coefficients") or [], dtype=_F32)
        if self.coef.size == 0:
            raise ValueError(f"{what}: coefficients are required")
        self.rho = np.asarray(a.get("rho") or [], dtype=_F32)
        self.prob_a = np.asarray(a.get("prob_a") or [], dtype=_F32)
        self.prob_b = np.asarray(a.get("prob_b") or [], dtype=_F32)
        if len(self.prob_a) != len(self.prob_b):
            raise ValueError(f"{what}: prob_a and prob_b differ in length")
        vpc = np.asarray(a.get("vectors_per_class") or [], dtype=np.int64)
        self.vpc = vpc
        self.n_vectors = int(vpc.sum())
        self.all_positive = bool((self.coef >= 0).all())
        c = self.n_classes
        if self.n_vectors > 0:
            self.svc = True
            sv = np.asarray(a.get("support_vectors") or [], dtype=_F32)
            if sv.size % self.n_vectors:
                raise ValueError(f"{what}: support_vectors do not split into {self.n_vectors} vectors")
            self.sv = sv.reshape(self.n_vectors, -1)
            if self.coef.size != (c - 1) * self.n_vectors:
                raise ValueError(f"{what}: expected {(c - 1) * self.n_vectors} coefficients, got {self.coef.size}")
            coef = self.coef.reshape(c - 1, self.n_vectors)
            starts = np.concatenate([[0], np.cumsum(vpc)[:-1]])
            pairs = [(i, j) for i in range(c - 1) for j in range(i + 1, c)]
            if len(self.rho) < len(pairs):
                raise ValueError(f"{what}: rho needs {len(pairs)} values")
            # one dense row per (i, j) classifier over all support vectors
            m = np.zeros((len(pairs), self.n_vectors), dtype=np.float64)
            for p, (i, j) in enumerate(pairs):
                si, sj = slice(starts[i], starts[i] + vpc[i]), slice(starts[j], starts[j] + vpc[j])
                m[p, si] = coef[j - 1, si]
                m[p, sj] = coef[i, sj]
            self.pair_coef_t = np.ascontiguousarray(m.T)
            self.pairs = np.array(pairs, dtype=np.int64).reshape(-1, 2)
        else:
            self.svc = False
            if self.coef.size % c:
                raise ValueError(f"{what}: coefficients do not split into {c} classes")
            self.lin_coef_t = np.ascontiguousarray(self.coef.reshape(c, -1).T)
            if len(self.rho) == 0:
                raise ValueError(f"{what}: rho is required")

    def run(self, x):
        what = self.node.describe()
        X = as_matrix(x, what, _F32)
        n = X.shape[0]
        c = self.n_classes
        have_proba = len(self.prob_a) > 0
        max_weight = np.zeros(n, dtype=_F32)
        if not self.svc:
            if X.shape[1] != self.lin_coef_t.shape[0]:
                raise ValueError(f"{what}: input has {X.shape[1]} features, the model {self.lin_coef_t.shape[0]}")
            scores = X @ self.lin_coef_t + self.rho[0]
            maxclass = np.argmax(scores, axis=1)
            max_weight = scores[np.arange(n), maxclass]
            z = post_transform(scores, self.post) if c > 1 else scores
        else:
            if X.shape[1] != self.sv.shape[1]:
                raise ValueError(f"{what}: input has {X.shape[1]} features, the model {self.sv.shape[1]}")
            k = self._kernel(X, self.sv, self.kernel).astype(np.float64)
            dec = (k @ self.pair_coef_t + self.rho[: len(self.pairs)]).astype(_F32)
            winner = np.where(dec > 0, self.pairs[:, 0], self.pairs[:, 1])
            votes = np.zeros((n, c), dtype=np.int64)
            for p in range(len(self.pairs)):
                votes[np.arange(n), winner[:, p]] += 1
            maxclass = np.argmax(votes, axis=1)
            if have_proba:
                z = _pairwise_probability(dec, self.prob_a, self.prob_b, c)
                if c > 1:
                    z = post_transform(z, self.post)
            elif c > 2:
                z = post_transform(dec, self.post)
            else:
                # onnxruntime: [-s, s] (or its logistic) for NONE and LOGISTIC, else [1 - s, s]
                mode = 2 if self.post in ("NONE", "LOGISTIC") else 0
                z = binary_pair(dec[:, 0].astype(np.float64), self.post, mode)
        if self.n_classes == 2 and not have_proba:
            pick1 = max_weight >= 0.5 if self.all_positive else max_weight > 0
            label = np.where(pick1, self.labels[1], self.labels[maxclass])
        else:
            label = self.labels[maxclass]
        return label, np.asarray(z).astype(_F32, copy=False)


def _pairwise_probability(dec, prob_a, prob_b, k):
    """Platt-scaled pairwise probabilities coupled into class probabilities
    (Wu, Lin and Weng's method as in libsvm), in float like onnxruntime, all rows at once."""
    n = dec.shape[0]
    r = np.zeros((n, k, k), dtype=_F32)
    idx = 0
    for i in range(k - 1):
        for j in range(i + 1, k):
            v = dec[:, idx] * prob_a[idx] + prob_b[idx]
            p = (_F32(1) - logistic(v).astype(_F32)).astype(_F32)
            p = np.clip(p, _F32(1e-7), _F32(1 - 1e-7))
            r[:, i, j] = p
            r[:, j, i] = _F32(1) - p
            idx += 1
    q = np.zeros((n, k, k), dtype=_F32)
    for i in range(k):
        for j in range(i):
            q[:, i, i] += r[:, j, i] * r[:, j, i]
            q[:, i, j] = q[:, j, i]
        for j in range(i + 1, k):
            q[:, i, i] += r[:, j, i] * r[:, j, i]
            q[:, i, j] = -r[:, j, i] * r[:, i, j]
    p = np.full((n, k), _F32(1.0 / k), dtype=_F32)
    eps = _F32(0.005 / k)
    active = np.ones(n, dtype=bool)
    for _ in range(100):
        rows = np.flatnonzero(active)
        if not rows.size:
            break
        P, Q = p[rows], q[rows]
        QP = np.zeros((len(rows), k), dtype=_F32)
        pqp = np.zeros(len(rows), dtype=_F32)
        for i in range(k):
            for j in range(k):
                QP[:, i] += Q[:, i, j] * P[:, j]
            pqp += P[:, i] * QP[:, i]
        err = np.abs(QP - pqp[:, None]).max(axis=1)
        done = err < eps
        go = ~done
        active[rows[done]] = False
        rows, P, Q, QP, pqp = rows[go], P[go], Q[go], QP[go], pqp[go]
        if not rows.size:
            break
        for i in range(k):
            diff = (-QP[:, i] + pqp) / Q[:, i, i]
            P[:, i] += diff
            one = _F32(1) + diff
            pqp = (pqp + diff * (diff * Q[:, i, i] + _F32(2) * QP[:, i])) / one / one
            QP = (QP + diff[:, None] * Q[:, i, :]) / one[:, None]
            P = P / one[:, None]
        p[rows] = P
    return p


@op("SVMRegressor", since=1, domain="ai.onnx.ml")
class SVMRegressor(_SVMBase):
    """Support vector regression (or one-class SVM): float Y [N, 1]."""

    def setup(self):
        a = self.attrs
        what = self.node.describe()
        self._kernel_setup()
        self.coef = np.asarray(a.get("coefficients") or [], dtype=_F32)
        self.rho = np.asarray(a.get("rho") or [0.0], dtype=_F32)
        self.n_supports = int(a.get("n_supports", 0))
        self.one_class = int(a.get("one_class", 0))
        self.post = check_post(a.get("post_transform", "NONE"))
        if self.n_supports > 0:
            sv = np.asarray(a.get("support_vectors") or [], dtype=_F32)
            if sv.size % self.n_supports:
                raise ValueError(f"{what}: support_vectors do not split into {self.n_supports} vectors")
            self.sv = sv.reshape(self.n_supports, -1)
            if self.coef.size != self.n_supports:
                raise ValueError(f"{what}: expected {self.n_supports} coefficients, got {self.coef.size}")

    def run(self, x):
        what = self.node.describe()
        X = as_matrix(x, what, _F32)
        if self.n_supports > 0:
            if X.shape[1] != self.sv.shape[1]:
                raise ValueError(f"{what}: input has {X.shape[1]} features, the model {self.sv.shape[1]}")
            k = self._kernel(X, self.sv, self.kernel)
            y = k @ self.coef[:, None] + self.rho[0]
        else:
            if X.shape[1] != self.coef.size:
                raise ValueError(f"{what}: input has {X.shape[1]} features, the model {self.coef.size}")
            y = X @ self.coef[:, None] + self.rho[0]
        if self.one_class:
            y = np.where(y > 0, _F32(1), _F32(-1))
        return (y.astype(_F32),)


# -- elementwise ----------------------------------------------------------------------
@op("Normalizer", since=1, domain="ai.onnx.ml")
def normalizer(k, x, *, norm="MAX"):
    """Row-wise MAX, L1 or L2 normalisation; float output."""
    if norm not in ("MAX", "L1", "L2"):
        raise ValueError(f"Normalizer: norm must be MAX, L1 or L2, got {norm!r}")
    x = np.asarray(x)
    X = (x[None, :] if x.ndim == 1 else x).astype(_F32, copy=False)  # read only
    if X.ndim != 2:
        raise ValueError(f"Normalizer: input must be 1-D or 2-D, got shape {x.shape}")
    # the row maxima and sums through .rows: numpy reduces a short last axis slowly
    # (1000 rows of 10 probabilities, L1: 30 -> 13 us). A row whose norm (or maximum)
    # is 0 is left as it is, as onnxruntime (and scikit-learn's normalize) leave it
    if norm == "MAX":
        d = row_max(X)
        y = np.empty_like(X)
    elif norm == "L1":
        y = np.abs(X)
        d = row_sum(y)
    else:
        y = X * X
        d = row_sum(y)
        np.sqrt(d, out=d)
    d[d == 0] = 1
    np.divide(X, d, out=y)
    return y.reshape(x.shape) if x.ndim == 1 else y


@op("Binarizer", since=1, domain="ai.onnx.ml")
def binarizer(k, x, *, threshold=0.0):
    """1 where x > threshold, else 0, in x's dtype."""
    return (x > x.dtype.type(threshold)).astype(x.dtype)


@op("Scaler", since=1, domain="ai.onnx.ml")
class Scaler(Kernel):
    """(x - offset) * scale along the last axis; float output."""

    def setup(self):
        self.offset = np.asarray(self.attrs.get("offset") or [0.0], dtype=_F32)
        self.scale = np.asarray(self.attrs.get("scale") or [1.0], dtype=_F32)

    def run(self, x):
        x = np.asarray(x)
        f = x.shape[-1] if x.ndim else 1
        for name, v in (("offset", self.offset), ("scale", self.scale)):
            if len(v) not in (1, f):
                raise ValueError(f"{self.node.describe()}: {name} has {len(v)} values for {f} features")
        y = x.astype(_F32)
        # a vector along the rows through columns_op: numpy's broadcast loop pays a
        # setup per row (1000 rows of 64 features, in the benchmark's pipeline: 116 ->
        # 73 us a node)
        for ufunc, v in ((np.subtract, self.offset), (np.multiply, self.scale)):
            if row_op(ufunc, y, v) is None:
                ufunc(y, v, out=y)
        return (y,)
