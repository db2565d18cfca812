"""Tree ensembles of the ai.onnx.ml domain: TreeEnsembleClassifier, TreeEnsembleRegressor
and TreeEnsemble.

Each node's trees are compiled once into flat arrays (feature, threshold, comparison
mode, true/false child, leaf weights). Evaluation moves every (sample, tree) pair one
level down per step with numpy fancy indexing, dropping pairs that reached a leaf, and
then scatters the reached leaves' weights into per-sample scores with ``bincount``.

Scores are finalised the way onnxruntime does it, including its special handling of
binary classifiers whose leaves only carry the weight of one class, and of single-target
regressors (only PROBIT is applied there).

The score post-transforms live here and are shared with the linear and SVM models.
"""

from __future__ import annotations

import numpy as np

from onnxrt.plugin.kernel import Kernel

from ..registry import op
from ..rows import softmax_rows
from ..select import where

# comparison modes; LEAF marks leaves
LEQ, LT, GTE, GT, EQ, NEQ, MEMBER, LEAF = range(8)
_MODE_NAMES = {
    "BRANCH_LEQ": LEQ,
    "BRANCH_LT": LT,
    "BRANCH_GTE": GTE,
    "BRANCH_GT": GT,
    "BRANCH_EQ": EQ,
    "BRANCH_NEQ": NEQ,
    "BRANCH_MEMBER": MEMBER,
    "LEAF": LEAF,
}
_POST_V5 = {0: "NONE", 1: "SOFTMAX", 2: "LOGISTIC", 3: "SOFTMAX_ZERO", 4: "PROBIT"}
_AGG_V5 = {0: "AVERAGE", 1: "SUM", 2: "MIN", 3: "MAX"}
_POSTS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")

# _TRUTH[mode, code] with code = (x < t) + 2 (x == t) + 4 (x > t); a NaN gives code 0
_TRUTH = np.zeros((8, 8), dtype=bool)
for _code in range(8):
    _lt, _eq, _gt = bool(_code & 1), bool(_code & 2), bool(_code & 4)
    _TRUTH[LEQ, _code] = _lt or _eq
    _TRUTH[LT, _code] = _lt
    _TRUTH[GTE, _code] = _gt or _eq
    _TRUTH[GT, _code] = _gt
    _TRUTH[EQ, _code] = _eq
    _TRUTH[NEQ, _code] = not _eq

# (sample, tree, target) entries gathered at once; bounds the temporaries
_PAIRS_PER_CHUNK = 1 << 22


# -- score transforms (shared with ml_linear) -----------------------------------------
def logistic(v):
    """1 / (1 + exp(-v)), computed without overflow."""
    v = np.asarray(v, dtype=np.float64)
    e = np.exp(-np.abs(v))
    p = 1.0 / (1.0 + e)
    return np.where(v < 0, 1.0 - p, p)


def erfinv_approx(x):
    """The closed-form inverse error function approximation onnxruntime uses for PROBIT."""
    x = np.asarray(x, dtype=np.float64)
    sgn = np.where(x < 0, -1.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (1.0 - x) * (1.0 + x)
        lg = np.log(t)
        v = 2.0 / (np.pi * 0.147) + 0.5 * lg
        v2 = 1.0 / 0.147 * lg
        v3 = -v + np.sqrt(v * v - v2)
        return sgn * np.sqrt(v3)


def probit(v):
    return np.sqrt(2.0) * erfinv_approx(2.0 * np.asarray(v, dtype=np.float64) - 1.0)


def softmax(s):
    """Row-wise softmax: in float32 for float32 scores (as onnxruntime computes it),
    else in float64; through :func:`.rows.softmax_rows`, since numpy reduces a short
    last axis slowly (1000 rows of 10 scores: 71 us for the maxima alone, against
    about 6 us)."""
    s = np.asarray(s)
    return softmax_rows(s if s.dtype == np.float32 else s.astype(np.float64, copy=False))


def softmax_zero(s):
    """Softmax that leaves (near) zero scores out, as onnxruntime's SOFTMAX_ZERO."""
    s = np.asarray(s, dtype=np.float64)
    vmax = s.max(axis=-1, keepdims=True)
    nz = np.abs(s) > 1e-7
    e = np.where(nz, np.exp(s - vmax), s * np.exp(-vmax))
    total = np.where(nz, e, 0.0).sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return e / total


def post_transform(scores, name):
    """Apply a post_transform to [N, C] scores (row-wise for the softmaxes)."""
    if name == "NONE":
        return np.asarray(scores, dtype=np.float64)
    if name == "LOGISTIC":
        return logistic(scores)
    if name == "SOFTMAX":
        return softmax(scores)
    if name == "SOFTMAX_ZERO":
        return softmax_zero(scores)
    if name == "PROBIT":
        return probit(scores)
    raise ValueError(f"unknown post_transform {name!r}")


def check_post(name):
    if name not in _POSTS:
        raise ValueError(f"post_transform must be one of {_POSTS}, got {name!r}")
    return name


def as_matrix(x, what, dtype=np.float64):
    """An input of shape [N, F] or [F] as a 2-D array of ``dtype`` (float64 unless
    given; not a copy where ``x`` already is one)."""
    x = np.asarray(x)
    if x.ndim == 1:
        x = x[None, :]
    elif x.ndim != 2:
        raise ValueError(f"{what}: input must be 1-D or 2-D, got shape {x.shape}")
    if x.dtype == object or x.dtype.kind not in "fiub":
        raise ValueError(f"{what}: unsupported input dtype {x.dtype}")
    return x.astype(dtype, copy=False)


# -- compiled forest -------------------------------------------------------------------
class Forest:
    """Trees as flat arrays, evaluated for all samples and trees together.

    Node arrays are indexed by a global node index; leaves point to themselves.
    ``wstart``/``wcount`` give each leaf's slice of (``wtarget``, ``wvalue``).
    """

    def __init__(self, feature, threshold, mode, tchild, fchild, roots, missing_true,
                 member_values, wstart, wcount, wtarget, wvalue, n_targets, what):
        self.what = what
        n = len(mode)
        self.feature = np.asarray(feature, dtype=np.int64)
        self.threshold = np.asarray(threshold, dtype=np.float64)
        self.mode = np.asarray(mode, dtype=np.int8)
        self.is_leaf = self.mode == LEAF
        idx = np.arange(n, dtype=np.int64)
        self.tchild = np.where(self.is_leaf, idx, np.asarray(tchild, dtype=np.int64))
        self.fchild = np.where(self.is_leaf, idx, np.asarray(fchild, dtype=np.int64))
        if n and (self.tchild.min() < 0 or self.tchild.max() >= n or self.fchild.min() < 0 or self.fchild.max() >= n):
            raise ValueError(f"{what}: a node's child index is out of range")
        self.roots = np.asarray(roots, dtype=np.int64)
        self.missing_true = np.asarray(missing_true, dtype=bool)
        self.has_missing = bool(self.missing_true.any())
        branch_modes = np.unique(self.mode[~self.is_leaf])
        self.single_mode = int(branch_modes[0]) if len(branch_modes) == 1 else None
        self.has_member = bool((self.mode == MEMBER).any())
        if self.has_member:
            self._compile_members(member_values)
        self.n_features = int(self.feature[~self.is_leaf].max()) + 1 if (~self.is_leaf).any() else 0
        self.wstart = np.asarray(wstart, dtype=np.int64)
        self.wcount = np.asarray(wcount, dtype=np.int64)
        self.wtarget = np.asarray(wtarget, dtype=np.int64)
        self.wvalue = np.asarray(wvalue, dtype=np.float64)
        self.n_targets = int(n_targets)
        if len(self.wtarget) and (self.wtarget.min() < 0 or self.wtarget.max() >= self.n_targets):
            raise ValueError(f"{what}: a leaf weight targets id {int(self.wtarget.max())} "
                             f"but there are {self.n_targets} targets/classes")
        self._dense = {}
        self._check_depth()

    def _compile_members(self, member_values):
        """Set membership as sorted keys node * n_unique + rank(value)."""
        nodes, vals = member_values
        self.m_unique = np.unique(np.asarray(vals, dtype=np.float64))
        ranks = np.searchsorted(self.m_unique, vals)
        self.m_keys = np.unique(np.asarray(nodes, dtype=np.int64) * len(self.m_unique) + ranks)

    def _check_depth(self):
        frontier = self.roots[~self.is_leaf[self.roots]]
        depth = 0
        n = len(self.mode)
        while frontier.size:
            depth += 1
            if depth > n:
                raise ValueError(f"{self.what}: the trees contain a cycle")
            nxt = np.concatenate([self.tchild[frontier], self.fchild[frontier]])
            frontier = np.unique(nxt[~self.is_leaf[nxt]])
        self.max_depth = depth

    def _branch(self, x, nodes):
        thr = self.threshold[nodes]
        if self.single_mode is not None and not self.has_member:
            m = self.single_mode
            if m == LEQ:
                cond = x <= thr
            elif m == LT:
                cond = x < thr
            elif m == GTE:
                cond = x >= thr
            elif m == GT:
                cond = x > thr
            elif m == EQ:
                cond = x == thr
            else:
                cond = x != thr
        else:
            code = (x < thr).view(np.int8) + 2 * (x == thr).view(np.int8) + 4 * (x > thr).view(np.int8)
            modes = self.mode[nodes]
            cond = _TRUTH[modes, code]
            if self.has_member:
                sel = np.flatnonzero(modes == MEMBER)
                if sel.size:
                    cond[sel] = self._member(x[sel], nodes[sel])
        if self.has_missing:
            cond |= self.missing_true[nodes] & np.isnan(x)
        return cond

    def _member(self, x, nodes):
        u = self.m_unique
        r = np.searchsorted(u, x)
        rc = np.minimum(r, len(u) - 1)
        ok = u[rc] == x
        keys = nodes * len(u) + rc
        pos = np.minimum(np.searchsorted(self.m_keys, keys), len(self.m_keys) - 1)
        return ok & (self.m_keys[pos] == keys)

    def leaves(self, X):
        """Global node index of the leaf each (sample, tree) reaches: [N * T]."""
        n, f = X.shape
        if self.n_features > f:
            raise ValueError(f"{self.what}: the trees use feature {self.n_features - 1} "
                             f"but the input has {f} features")
        t = len(self.roots)
        cur = np.tile(self.roots, n)
        base = np.repeat(np.arange(n, dtype=np.int64) * f, t)
        flat = X.reshape(-1)
        act = np.flatnonzero(~self.is_leaf[cur])
        for _ in range(self.max_depth):
            if not act.size:
                break
            nodes = cur[act]
            x = flat[base[act] + self.feature[nodes]]
            nxt = where(self._branch(x, nodes), self.tchild[nodes], self.fchild[nodes])
            cur[act] = nxt
            act = act[~self.is_leaf[nxt]]
        return cur

    def dense(self, agg, dtype):
        """Leaf weights as a dense [n_nodes, C] matrix for ``agg`` (cached per dtype).

        Duplicate (leaf, target) entries are combined the way the aggregate combines
        them; entries a leaf does not have are the aggregate's neutral element.
        """
        key = (agg, np.dtype(dtype))
        cache = self._dense
        if key not in cache:
            n, c = len(self.mode), self.n_targets
            owner = np.repeat(np.arange(n, dtype=np.int64), self.wcount)
            flat = owner * c + self.wtarget
            vals = self.wvalue.astype(dtype)
            if agg == "MIN":
                w = np.full(n * c, np.inf, dtype=dtype)
                np.minimum.at(w, flat, vals)
            elif agg == "MAX":
                w = np.full(n * c, -np.inf, dtype=dtype)
                np.maximum.at(w, flat, vals)
            else:
                w = np.zeros(n * c, dtype=dtype)
                np.add.at(w, flat, vals)
            cache[key] = w.reshape(n, c)
            if "has" not in cache:
                h = np.zeros(n * c, dtype=bool)
                h[flat] = True
                cache["has"] = h.reshape(n, c)
        return cache[key], cache["has"]

    def scores(self, X, agg, dtype=np.float64):
        """Aggregated scores [N, C] in ``dtype`` and which entries received a weight.

        Trees are accumulated in order at ``dtype`` precision, as onnxruntime does.
        """
        if agg not in ("SUM", "AVERAGE", "MIN", "MAX"):
            raise ValueError(f"{self.what}: unknown aggregate_function {agg!r}")
        n = X.shape[0]
        c = self.n_targets
        t = len(self.roots)
        w, h = self.dense(agg, dtype)
        out = np.zeros((n, c), dtype=dtype)
        has = np.zeros((n, c), dtype=bool)
        step = max(1, _PAIRS_PER_CHUNK // max(t * c, 1))
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            leaf = self.leaves(X[lo:hi]).reshape(hi - lo, t)
            vals = w[leaf]
            has[lo:hi] = h[leaf].any(axis=1)
            if agg in ("SUM", "AVERAGE"):
                out[lo:hi] = np.add.reduce(vals, axis=1)
            elif agg == "MIN":
                out[lo:hi] = vals.min(axis=1)
            else:
                out[lo:hi] = vals.max(axis=1)
        if agg == "AVERAGE":
            out /= dtype(max(t, 1))
        elif agg in ("MIN", "MAX"):
            out[~has] = 0
        return out, has


def _attr_values(attrs, name, what, required=True, dtype=np.float64):
    """``name`` or ``name_as_tensor`` as a 1-D array (None when both are absent)."""
    a = attrs.get(name)
    b = attrs.get(name + "_as_tensor")
    if a is not None and len(a) and b is not None and np.asarray(b).size:
        raise ValueError(f"{what}: only one of {name} and {name}_as_tensor may be set")
    if b is not None and np.asarray(b).size:
        return np.asarray(b).reshape(-1).astype(dtype)
    if a is not None:
        return np.asarray(a, dtype=dtype).reshape(-1)
    if required:
        raise ValueError(f"{what}: attribute {name} is required")
    return None


def compile_v3(attrs, n_targets, prefix, what):
    """Build a :class:`Forest` from the nodes_* / (class|target)_* attributes."""
    treeids = np.asarray(attrs.get("nodes_treeids", []), dtype=np.int64)
    nodeids = np.asarray(attrs.get("nodes_nodeids", []), dtype=np.int64)
    n = len(treeids)
    if n == 0:
        raise ValueError(f"{what}: the ensemble has no nodes")
    feature = np.asarray(attrs.get("nodes_featureids", []), dtype=np.int64)
    tids = np.asarray(attrs.get("nodes_truenodeids", []), dtype=np.int64)
    fids = np.asarray(attrs.get("nodes_falsenodeids", []), dtype=np.int64)
    modes_s = list(attrs.get("nodes_modes", []))
    values = _attr_values(attrs, "nodes_values", what, required=False)
    if values is None:
        values = np.zeros(n)
    for name, arr in (("nodes_nodeids", nodeids), ("nodes_featureids", feature), ("nodes_truenodeids", tids),
                      ("nodes_falsenodeids", fids), ("nodes_modes", modes_s), ("nodes_values", values)):
        if len(arr) != n:
            raise ValueError(f"{what}: {name} has {len(arr)} entries, nodes_treeids has {n}")
    try:
        mode = np.array([_MODE_NAMES[m] for m in modes_s], dtype=np.int8)
    except KeyError as e:
        raise ValueError(f"{what}: unknown node mode {e.args[0]!r}") from None
    if (mode == MEMBER).any():
        raise ValueError(f"{what}: BRANCH_MEMBER is only valid in TreeEnsemble")
    missing = np.zeros(n, dtype=bool)
    mv = attrs.get("nodes_missing_value_tracks_true")
    if mv:
        mv = np.asarray(mv, dtype=np.int64)[:n]
        missing[: len(mv)] = mv == 1

    # (tree, node) -> position
    span = int(nodeids.max()) + 1
    key = treeids * span + nodeids
    order = np.argsort(key, kind="stable")
    skey = key[order]
    if (np.diff(skey) == 0).any():
        raise ValueError(f"{what}: a (tree, node) id appears twice")

    def lookup(tree, node, role):
        k = tree * span + node
        pos = np.minimum(np.searchsorted(skey, k), n - 1)
        bad = (skey[pos] != k) | (node < 0) | (node >= span)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{what}: {role} node {int(node[i])} of tree {int(tree[i])} does not exist")
        return order[pos]

    branch = mode != LEAF
    tchild = np.zeros(n, dtype=np.int64)
    fchild = np.zeros(n, dtype=np.int64)
    tchild[branch] = lookup(treeids[branch], tids[branch], "true")
    fchild[branch] = lookup(treeids[branch], fids[branch], "false")
    # a tree's root is its first node in attribute order
    _, first = np.unique(treeids, return_index=True)
    roots = np.sort(first)

    w_tree = np.asarray(attrs.get(prefix + "_treeids", []), dtype=np.int64)
    w_node = np.asarray(attrs.get(prefix + "_nodeids", []), dtype=np.int64)
    w_id = np.asarray(attrs.get(prefix + "_ids", []), dtype=np.int64)
    w_val = _attr_values(attrs, prefix + "_weights", what, required=False)
    if w_val is None:
        w_val = np.zeros(len(w_id))
    if not (len(w_tree) == len(w_node) == len(w_id) == len(w_val)):
        raise ValueError(f"{what}: {prefix}_treeids/_nodeids/_ids/_weights differ in length")
    w_pos = lookup(w_tree, w_node, "weight") if len(w_tree) else np.zeros(0, dtype=np.int64)
    # weights on branch nodes are ignored (old converters emitted some)
    keep = mode[w_pos] == LEAF
    w_pos, w_id, w_val = w_pos[keep], w_id[keep], w_val[keep]
    return _build_forest(feature, values, mode, tchild, fchild, roots, missing, None,
                         w_pos, w_id, w_val, n, n_targets, what)


def _build_forest(feature, values, mode, tchild, fchild, roots, missing, members,
                  w_pos, w_id, w_val, n, n_targets, what):
    order = np.argsort(w_pos, kind="stable")
    w_pos, w_id, w_val = w_pos[order], w_id[order], w_val[order]
    wcount = np.bincount(w_pos, minlength=n).astype(np.int64)
    wstart = np.concatenate([[0], np.cumsum(wcount)[:-1]]).astype(np.int64)
    return Forest(feature, values, mode, tchild, fchild, roots, missing, members,
                  wstart, wcount, w_id, w_val, n_targets, what)


# -- TreeEnsembleRegressor --------------------------------------------------------------
@op("TreeEnsembleRegressor", since=1, domain="ai.onnx.ml")
class TreeEnsembleRegressor(Kernel):
    """Regression by a tree ensemble: Y float [N, n_targets]."""

    def setup(self):
        a = self.attrs
        what = self.node.describe()
        self.n_targets = int(a.get("n_targets", 1) or 1)
        self.agg = a.get("aggregate_function", "SUM")
        if self.agg not in ("SUM", "AVERAGE", "MIN", "MAX"):
            raise ValueError(f"{what}: unknown aggregate_function {self.agg!r}")
        self.post = check_post(a.get("post_transform", "NONE"))
        base = _attr_values(a, "base_values", what, required=False)
        self.base = np.zeros(0) if base is None else base
        self.forest = compile_v3(a, self.n_targets, "target", what)
        _prepare(self.forest, self.agg)

    def run(self, x):
        X = as_matrix(x, self.node.describe())
        s, has = self.forest.scores(X, self.agg, _acc_dtype(x))
        return (finalize_regression(s, has, self.base, self.agg, self.post).astype(np.float32),)


def _acc_dtype(x):
    """onnxruntime accumulates in float unless the input is double; ties and
    thresholds are decided at that precision."""
    return np.float64 if np.asarray(x).dtype == np.float64 else np.float32


def _prepare(forest, agg):
    # build the dense leaf matrices now so that runs only read them
    for dt in (np.float32, np.float64):
        forest.dense(agg, dt)


def finalize_regression(s, has, base, agg, post):
    """onnxruntime's regression finalisation of aggregated scores."""
    c = s.shape[1]
    base = base.astype(s.dtype)
    if c == 1:
        if len(base) == 1:
            s = s + base[0]
        return probit(s) if post == "PROBIT" else s
    if len(base) == c:
        s = s + base
    # onnxruntime reads a target that no leaf reached as 0, base value or not
    return post_transform(np.where(has, s, 0.0), post)


# -- TreeEnsembleClassifier -------------------------------------------------------------
def binary_pair(s, post, mode):
    """onnxruntime's expansion of one score per row into two columns.

    ``mode`` 0/1: [1 - s, s], with s first made a probability for LOGISTIC (as
    onnxruntime 1.32 gives; its earlier releases skipped the logistic); 2/3: [-s, s]
    (or logistic of both for LOGISTIC). PROBIT only transforms the score (the second
    column stays 0).
    """
    z = np.zeros((len(s), 2), dtype=np.float64)
    if post == "PROBIT":
        z[:, 0] = probit(s)
    elif mode in (0, 1) and post == "LOGISTIC":
        p = np.asarray(logistic(s)).astype(np.float32)
        z[:, 0] = np.float32(1) - p  # in float32: the pair sums to exactly 1
        z[:, 1] = p
    elif mode in (0, 1):
        z[:, 0] = 1.0 - s
        z[:, 1] = s
    elif post == "LOGISTIC":
        z[:, 0] = logistic(-s)
        z[:, 1] = logistic(s)
    else:
        z[:, 0] = -s
        z[:, 1] = s
    return z


@op("TreeEnsembleClassifier", since=1, domain="ai.onnx.ml")
class TreeEnsembleClassifier(Kernel):
    """Classification by a tree ensemble: label [N] (int64 or string), scores float [N, C]."""

    def setup(self):
        a = self.attrs
        what = self.node.describe()
        strings = a.get("classlabels_strings") or []
        ints = a.get("classlabels_int64s") or []
        if strings:
            self.labels = np.array(list(strings), dtype=object)
        elif ints:
            self.labels = np.asarray(ints, dtype=np.int64)
        else:
            raise ValueError(f"{what}: classlabels_strings or classlabels_int64s is required")
        self.strings = bool(strings)
        self.n_classes = len(self.labels)
        self.post = check_post(a.get("post_transform", "NONE"))
        base = _attr_values(a, "base_values", what, required=False)
        self.base = np.zeros(0) if base is None else base
        self.forest = compile_v3(a, self.n_classes, "class", what)
        _prepare(self.forest, "SUM")
        w = _attr_values(a, "class_weights", what, required=False)
        ids = np.asarray(a.get("class_ids", []), dtype=np.int64)
        self.all_positive = w is None or bool((w >= 0).all())
        self.binary_case = self.n_classes == 2 and len(np.unique(ids)) == 1

    def run(self, x):
        X = as_matrix(x, self.node.describe())
        s, has = self.forest.scores(X, "SUM", _acc_dtype(x))
        if self.n_classes == 2:
            labels, z = self._binary(s, has)
            return labels, z.astype(np.float32)
        nb = min(len(self.base), self.n_classes)
        if nb:
            s[:, :nb] += self.base[:nb].astype(s.dtype)
            has[:, :nb] = True
        idx = np.argmax(np.where(has, s, -np.inf), axis=1)
        z = post_transform(np.where(has, s, 0.0), self.post)
        return self.labels[idx], z.astype(np.float32)

    def _binary(self, s, has):
        """onnxruntime's two-class finalisation, row by row but vectorised."""
        s0, s1 = s[:, 0].copy(), s[:, 1].copy()
        h0, h1 = has[:, 0], has[:, 1].copy()
        nb = len(self.base)
        was = np.full(len(s0), -1)
        two = np.ones(len(s0), dtype=bool)  # whether both scores are kept
        if nb == 2:
            b0, b1 = self.base.astype(s.dtype)
            n1 = s0 + b1  # onnxruntime adds base_values[1] to the first score here
            s1 = np.where(h1, n1, s1 + b1)
            s0 = np.where(h1, -n1, s0 + b0)
        elif nb == 1:
            s0 = s0 + self.base.astype(s.dtype)[0]
            two = h1.copy()
        elif nb == 0:
            was[:] = 3
            two = h1.copy()
        use1 = two & h1
        pos = np.where(use1, s1, np.where(h0, s0, s.dtype.type(0)))
        if self.binary_case:
            if self.all_positive:
                win = pos > 0.5
                was = np.where(win, 0, 1)
            else:
                win = pos > 0
                was = np.where(win, 2, 3)
            labels = self.labels[win.astype(np.int64)]
        elif self.strings:
            # onnxruntime answers 1 / 0 here: a label index for string labels...
            labels = self.labels[(pos > 0).astype(np.int64)]
        else:
            # ...and the integer itself for integer labels
            labels = (pos > 0).astype(np.int64)
        # a class that no leaf reached is read as 0 from here on
        s0 = np.where(h0, s0, 0.0).astype(np.float64)
        s1 = np.where(h1, s1, 0.0).astype(np.float64)
        z = np.zeros((len(s0), 2), dtype=np.float64)
        if two.any():
            z[two] = post_transform(np.stack([s0[two], s1[two]], axis=1), self.post)
        one = ~two
        if one.any():
            v = s0[one]
            w = was[one]
            zz = np.zeros((len(v), 2))
            if self.post == "PROBIT":
                zz[:, 0] = probit(v)
            else:
                m01 = (w == 0) | (w == 1)
                m23 = (w == 2) | (w == 3)
                zz[m01] = binary_pair(v[m01], self.post, 0)
                zz[m23] = binary_pair(v[m23], self.post, 2)
                other = ~(m01 | m23)
                zz[other, 0] = v[other]
            z[one] = zz
        return labels, z


# -- TreeEnsemble (opset 5) -------------------------------------------------------------
@op("TreeEnsemble", since=5, domain="ai.onnx.ml")
class TreeEnsemble(Kernel):
    """The unified tree ensemble of ai.onnx.ml opset 5: Y [N, n_targets] of X's dtype."""

    def setup(self):
        a = self.attrs
        what = self.node.describe()
        self.what = what
        agg = int(a.get("aggregate_function", 1))
        post = int(a.get("post_transform", 0))
        if agg not in _AGG_V5:
            raise ValueError(f"{what}: unknown aggregate_function {agg}")
        if post not in _POST_V5:
            raise ValueError(f"{what}: unknown post_transform {post}")
        self.agg, self.post = _AGG_V5[agg], _POST_V5[post]
        n_targets = a.get("n_targets")
        if n_targets is None:
            raise ValueError(f"{what}: attribute n_targets is required")
        splits = np.asarray(a["nodes_splits"]).reshape(-1).astype(np.float64)
        n = len(splits)
        feature = np.asarray(a.get("nodes_featureids", []), dtype=np.int64)
        tids = np.asarray(a.get("nodes_truenodeids", []), dtype=np.int64)
        fids = np.asarray(a.get("nodes_falsenodeids", []), dtype=np.int64)
        tleaf = np.asarray(a.get("nodes_trueleafs", []), dtype=np.int64) != 0
        fleaf = np.asarray(a.get("nodes_falseleafs", []), dtype=np.int64) != 0
        modes = np.asarray(a["nodes_modes"]).reshape(-1).astype(np.int64)
        for name, arr in (("nodes_featureids", feature), ("nodes_truenodeids", tids), ("nodes_falsenodeids", fids),
                          ("nodes_trueleafs", tleaf), ("nodes_falseleafs", fleaf), ("nodes_modes", modes)):
            if len(arr) != n:
                raise ValueError(f"{what}: {name} has {len(arr)} entries, nodes_splits has {n}")
        if len(modes) and (modes.min() < 0 or modes.max() > MEMBER):
            raise ValueError(f"{what}: node modes must be in [0, 6]")
        lw = np.asarray(a["leaf_weights"]).reshape(-1).astype(np.float64)
        lt = np.asarray(a.get("leaf_targetids", []), dtype=np.int64)
        if len(lt) != len(lw):
            raise ValueError(f"{what}: leaf_targetids and leaf_weights differ in length")
        n_leaves = len(lw)
        roots = np.asarray(a.get("tree_roots", []), dtype=np.int64)
        if len(roots) == 0:
            raise ValueError(f"{what}: tree_roots is empty")
        missing = np.zeros(n, dtype=bool)
        mv = a.get("nodes_missing_value_tracks_true")
        if mv:
            missing[: min(n, len(mv))] = np.asarray(mv, dtype=np.int64)[:n] == 1

        # flat numbering: branch nodes 0..n-1, then leaves n..n+n_leaves-1
        if ((tids < 0) | (fids < 0)).any():
            raise ValueError(f"{what}: negative child index")
        bad = (tleaf & (tids >= n_leaves)) | (~tleaf & (tids >= n)) | (fleaf & (fids >= n_leaves)) | (~fleaf & (fids >= n))
        if bad.any():
            raise ValueError(f"{what}: node {int(np.flatnonzero(bad)[0])} has a child index out of range")
        if (roots < 0).any() or (roots >= max(n, 1)).any():
            raise ValueError(f"{what}: a tree root is out of range")
        tchild = np.where(tleaf, tids + n, tids)
        fchild = np.where(fleaf, fids + n, fids)
        # a tree made of one leaf: a root whose two branches are the same leaf
        root_leaf = tleaf[roots] & fleaf[roots] & (tids[roots] == fids[roots])
        roots = np.where(root_leaf, tids[roots] + n, roots)

        members = None
        if (modes == MEMBER).any():
            mvals = a.get("membership_values")
            if mvals is None:
                raise ValueError(f"{what}: BRANCH_MEMBER nodes need membership_values")
            mvals = np.asarray(mvals).reshape(-1).astype(np.float64)
            sep = np.isnan(mvals)
            member_nodes = np.flatnonzero(modes == MEMBER)
            if sep.sum() < len(member_nodes):
                raise ValueError(f"{what}: membership_values does not hold a set for every BRANCH_MEMBER node")
            group = np.cumsum(sep) - sep  # which set each value belongs to
            keep = ~sep & (group < len(member_nodes))
            members = (member_nodes[group[keep]], mvals[keep])

        total = n + n_leaves
        all_mode = np.concatenate([modes.astype(np.int8), np.full(n_leaves, LEAF, dtype=np.int8)])
        all_feature = np.concatenate([feature, np.zeros(n_leaves, dtype=np.int64)])
        all_values = np.concatenate([splits, np.zeros(n_leaves)])
        all_t = np.concatenate([tchild, np.arange(n, total)])
        all_f = np.concatenate([fchild, np.arange(n, total)])
        all_missing = np.concatenate([missing, np.zeros(n_leaves, dtype=bool)])
        self.forest = _build_forest(all_feature, all_values, all_mode, all_t, all_f, roots, all_missing, members,
                                    np.arange(n, total), lt, lw, total, int(n_targets), what)
        _prepare(self.forest, self.agg)

    def run(self, x):
        X = as_matrix(x, self.what)
        s, has = self.forest.scores(X, self.agg, _acc_dtype(x))
        y = finalize_regression(s, has, np.zeros(0), self.agg, self.post)
        dt = x.dtype if x.dtype.kind == "f" else np.dtype(np.float32)
        return (y.astype(dt),)
