"""String operators: StringNormalizer, StringConcat, StringSplit, RegexFullMatch and
TfIdfVectorizer.

Strings are numpy ``object`` arrays of ``str``; per-string work (splitting,
matching, case changes) is inherently per element, everything around it is array
code. TfIdfVectorizer maps tokens to small integer ids once and then counts all
n-grams of one length and skip with a single sorted lookup.
"""

from __future__ import annotations

import re

import numpy as np

from onnxrt.plugin.kernel import Kernel

from ..registry import op

__all__ = ["StringNormalizer", "string_concat", "StringSplit", "RegexFullMatch", "TfIdfVectorizer"]

_OBJ = np.dtype(object)


def _as_str_array(x, name: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != _OBJ:
        if x.dtype.kind in "US":
            return x.astype(str).astype(_OBJ)
        raise ValueError(f"{name}: expected a string tensor, got {x.dtype}")
    return x


@op("StringNormalizer", since=10)
class StringNormalizer(Kernel):
    """StringNormalizer: drop stop words, then optionally lower- or upper-case."""

    def setup(self):
        a = self.attrs
        self.action = a.get("case_change_action", "NONE").upper()
        if self.action not in ("NONE", "LOWER", "UPPER"):
            raise ValueError(f"{self.node.describe()}: unknown case_change_action {self.action!r}")
        self.case_sensitive = bool(a.get("is_case_sensitive", 0))
        words = a.get("stopwords") or []
        self.stopwords = frozenset(words if self.case_sensitive else (w.lower() for w in words))

    def run(self, x):
        x = _as_str_array(x, "StringNormalizer")
        if x.ndim == 1:
            row = x
        elif x.ndim == 2 and x.shape[0] == 1:
            row = x[0]
        else:
            raise ValueError(f"StringNormalizer: input must have shape [C] or [1, C], got {x.shape}")
        words = row.tolist()
        if self.stopwords:
            if self.case_sensitive:
                words = [w for w in words if w not in self.stopwords]
            else:
                words = [w for w in words if w.lower() not in self.stopwords]
        if self.action == "LOWER":
            words = [w.lower() for w in words]
        elif self.action == "UPPER":
            words = [w.upper() for w in words]
        if not words:
            words = [""]
        y = np.empty(len(words), dtype=_OBJ)
        y[:] = words
        return (y if x.ndim == 1 else y.reshape(1, -1),)


@op("StringConcat", since=20)
def string_concat(k, x, y):
    """Elementwise concatenation with broadcasting."""
    x = _as_str_array(x, "StringConcat")
    y = _as_str_array(y, "StringConcat")
    try:
        z = np.add(x, y, dtype=_OBJ)
    except ValueError as e:
        raise ValueError(f"StringConcat: shapes {x.shape} and {y.shape} do not broadcast") from e
    return np.asarray(z, dtype=_OBJ)


@op("StringSplit", since=20)
class StringSplit(Kernel):
    """StringSplit: split each string on a delimiter (or runs of whitespace)."""

    def setup(self):
        d = self.attrs.get("delimiter", "")
        self.delimiter = d if d else None
        m = self.attrs.get("maxsplit")
        self.maxsplit = -1 if m is None else int(m)
        if self.maxsplit < -1:
            raise ValueError(f"{self.node.describe()}: maxsplit must be non-negative, got {m}")

    def run(self, x):
        x = _as_str_array(x, "StringSplit")
        # an empty string holds no substring, as onnxruntime counts it (Python's
        # split on an explicit delimiter would give one empty substring)
        d, m = self.delimiter, self.maxsplit
        parts = [s.split(d, m) if s else [] for s in x.ravel().tolist()]
        counts = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
        width = int(counts.max()) if counts.size else 0
        y = np.full((len(parts), width), "", dtype=_OBJ)
        if parts and width:
            flat = [s for p in parts for s in p]
            rows = np.repeat(np.arange(len(parts)), counts)
            cols = np.arange(len(flat)) - np.repeat(np.cumsum(counts) - counts, counts)
            vals = np.empty(len(flat), dtype=_OBJ)
            vals[:] = flat
            y[rows, cols] = vals
        return y.reshape(x.shape + (width,)), counts.reshape(x.shape)


#: RE2's POSIX classes (ASCII, as RE2 defines them), as Python character-set ranges
_POSIX_CLASSES = {
    "alnum": "0-9A-Za-z", "alpha": "A-Za-z", "ascii": "\\x00-\\x7f", "blank": "\\t ",
    "cntrl": "\\x00-\\x1f\\x7f", "digit": "0-9", "graph": "!-~", "lower": "a-z", "print": " -~",
    "punct": "!-/:-@\\[-`{-~", "space": "\\t\\n\\v\\f\\r ", "upper": "A-Z", "word": "0-9A-Za-z_",
    "xdigit": "0-9A-Fa-f",
}


def re2_to_python(pattern: str) -> str:
    """An RE2 pattern (RegexFullMatch's syntax) as a Python ``re`` pattern, to be
    compiled with ``re.ASCII`` (RE2's ``\\w``, ``\\d``, ``\\s`` and ``\\b`` are ASCII).

    Translates what the two read differently: POSIX classes inside a character set
    (``[[:alpha:]]``, ``[[:^digit:]]``) and ``\\z`` (end of text; Python's ``\\Z``).
    Unicode classes (``\\pL``, ``\\p{Greek}``) have no ``re`` equivalent: ValueError.
    """
    out, i, n, in_set = [], 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            e = pattern[i + 1]
            if e in "pP":
                raise ValueError(f"Unicode class \\{e} at position {i} is not supported")
            out.append("\\Z" if e == "z" and not in_set else c + e)
            i += 2
            continue
        if in_set:
            if c == "[" and pattern.startswith("[:", i):
                end = pattern.find(":]", i + 2)
                name = pattern[i + 2 : end] if end > 0 else ""
                negated = name.startswith("^")
                ranges = _POSIX_CLASSES.get(name.lstrip("^"))
                if ranges is None:
                    raise ValueError(f"unknown POSIX class [:{name}:] at position {i}")
                if negated:
                    # a negated class inside a set: only the whole set can be negated
                    # in re, so [[:^digit:]] alone becomes [^0-9]
                    if out[-1] != "[" or not pattern.startswith("]", end + 2):
                        raise ValueError(f"a negated POSIX class must be a set of its own, at position {i}")
                    out.append("^")
                out.append(ranges)
                i = end + 2
                continue
            if c == "]":
                in_set = False
            elif c in "[&~|":
                # literals in an RE2 set; unescaped, re reads them as (future) set
                # operations and warns
                out.append("\\" + c)
                i += 1
                continue
        elif c == "[":
            in_set = True
            out.append(c)
            i += 1
            if pattern.startswith("^", i):
                out.append("^")
                i += 1
            if pattern.startswith("]", i):  # a leading ] is a literal
                out.append("\\]")
                i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


@op("RegexFullMatch", since=20)
class RegexFullMatch(Kernel):
    """RegexFullMatch: whether each string matches ``pattern`` in full."""

    def setup(self):
        pattern = self.attrs.get("pattern")
        if pattern is None:
            raise ValueError(f"{self.node.describe()}: attribute 'pattern' is required")
        try:
            self.regex = re.compile(re2_to_python(pattern), re.ASCII)
        except (re.error, ValueError) as e:
            raise ValueError(f"{self.node.describe()}: invalid pattern {pattern!r}: {e}") from None

    def run(self, x):
        x = _as_str_array(x, "RegexFullMatch")
        m = self.regex.fullmatch
        flat = x.ravel().tolist()
        y = np.fromiter((m(s) is not None for s in flat), dtype=bool, count=len(flat))
        return (y.reshape(x.shape),)


@op("TfIdfVectorizer", since=9)
class TfIdfVectorizer(Kernel):
    """TfIdfVectorizer: counts (TF), presence (IDF) or weighted counts (TFIDF) of
    pool n-grams, with up to ``max_skip_count`` items skipped between n-gram items."""

    def setup(self):
        a = self.attrs
        where = self.node.describe()
        self.mode = a.get("mode", "TF")
        if self.mode not in ("TF", "IDF", "TFIDF"):
            raise ValueError(f"{where}: unknown mode {self.mode!r}")
        self.min_n = int(a.get("min_gram_length", 1))
        self.max_n = int(a.get("max_gram_length", 1))
        self.max_skip = int(a.get("max_skip_count", 0))
        if self.min_n < 1 or self.max_n < self.min_n or self.max_skip < 0:
            raise ValueError(
                f"{where}: invalid n-gram range [{self.min_n}, {self.max_n}] or max_skip_count {self.max_skip}"
            )
        ints, strs = a.get("pool_int64s"), a.get("pool_strings")
        if (ints is None) == (strs is None):
            raise ValueError(f"{where}: exactly one of pool_int64s and pool_strings must be set")
        self.strings = strs is not None
        pool = list(strs) if self.strings else [int(v) for v in ints]
        counts = list(a.get("ngram_counts", []))
        indexes = np.asarray(a.get("ngram_indexes", []), dtype=np.int64)
        if indexes.size == 0 or indexes.min() < 0:
            raise ValueError(f"{where}: ngram_indexes must be non-empty and non-negative")
        self.out_size = int(indexes.max()) + 1

        # token -> dense id; ids are the digits of an n-gram's mixed-radix code
        self.vocab = {}
        for t in pool:
            self.vocab.setdefault(t, len(self.vocab))
        if not self.strings:
            keys = np.array(list(self.vocab), dtype=np.int64)
            order = np.argsort(keys)
            self.sorted_tokens = keys[order]
            self.sorted_ids = np.array(list(self.vocab.values()), dtype=np.int64)[order]
        self.radix = max(len(self.vocab), 1)

        w = a.get("weights")
        # weights[i] belongs to the i-th pool n-gram: TFIDF sums each n-gram's count times
        # its own weight into its output coordinate (two n-grams may share one, as
        # onnxruntime counts them)
        gram_w = np.asarray(w, dtype=np.float64) if w is not None and len(w) else None
        self.tables = {}  # n -> (sorted codes, output coordinate per code, weight per code) or dict
        gid = 0
        for i, start in enumerate(counts):
            n = i + 1
            end = counts[i + 1] if i + 1 < len(counts) else len(pool)
            num = max(end - start, 0) // n
            if self.min_n <= n <= self.max_n and num:
                grams = pool[start : start + num * n]
                if gid + num > indexes.size:
                    raise ValueError(f"{where}: ngram_indexes has fewer entries than the pool has n-grams")
                mapping = {}
                for j in range(num):
                    key = tuple(self.vocab[t] for t in grams[j * n : (j + 1) * n])
                    g = gid + j
                    weight = float(gram_w[g]) if gram_w is not None and g < gram_w.size else 1.0
                    mapping[self._code(key)] = (int(indexes[g]), weight)  # a repeated n-gram: last wins
                codes = np.array(list(mapping), dtype=object if self._big(n) else np.int64)
                outs = np.array([o for o, _ in mapping.values()], dtype=np.int64)
                weights = np.array([wt for _, wt in mapping.values()], dtype=np.float64)
                if codes.dtype != _OBJ:
                    order = np.argsort(codes)
                    self.tables[n] = (codes[order], outs[order], weights[order])
                else:
                    self.tables[n] = mapping
            gid += num

        # whether two n-grams of the pool share an output coordinate
        self.shared = gram_w is not None and np.unique(indexes[: min(gid, indexes.size)]).size < min(gid, indexes.size)
        self.weights = None
        if gram_w is not None:
            # weights[i] belongs to the i-th pool n-gram, i.e. to output ngram_indexes[i]
            full = np.ones(self.out_size, dtype=np.float32)
            m = min(len(w), indexes.size)
            full[indexes[:m]] = np.asarray(w, dtype=np.float32)[:m]
            self.weights = full

    def _big(self, n: int) -> bool:
        # mixed-radix codes must fit in int64
        return self.radix**n >= 1 << 62

    def _code(self, ids) -> int:
        c = 0
        for t in reversed(ids):
            c = c * self.radix + t
        return c

    def _token_ids(self, x: np.ndarray) -> np.ndarray:
        if self.strings:
            if x.dtype != _OBJ:
                raise ValueError(f"TfIdfVectorizer: pool_strings needs a string input, got {x.dtype}")
            get = self.vocab.get
            flat = x.ravel().tolist()
            return np.fromiter((get(s, -1) for s in flat), dtype=np.int64, count=len(flat)).reshape(x.shape)
        if x.dtype.kind not in "iu":
            raise ValueError(f"TfIdfVectorizer: pool_int64s needs an integer input, got {x.dtype}")
        xi = x.astype(np.int64, copy=False)
        if self.sorted_tokens.size == 0:
            return np.full(x.shape, -1, dtype=np.int64)
        pos = np.searchsorted(self.sorted_tokens, xi)
        pos = np.minimum(pos, self.sorted_tokens.size - 1)
        hit = self.sorted_tokens[pos] == xi
        return np.where(hit, self.sorted_ids[pos], -1)

    def run(self, x):
        x = np.asarray(x)
        if x.ndim == 0:
            x = x.reshape(1)
        if x.ndim not in (1, 2):
            raise ValueError(f"TfIdfVectorizer: input must be [C] or [N, C], got shape {x.shape}")
        tok = self._token_ids(x.reshape(1, -1) if x.ndim == 1 else x)
        rows, cols = tok.shape
        freq = np.zeros(rows * self.out_size, dtype=np.float64)
        tfidf = self.mode == "TFIDF" and self.weights is not None  # weighted as counted
        # IDF with weights where n-grams share an output: the weight of the one found
        # last, scanning by skip, then position, then length, as onnxruntime does
        idf_found = [] if self.mode == "IDF" and self.shared else None
        row_base = (np.arange(rows, dtype=np.int64) * self.out_size)[:, None]
        for n, table in self.tables.items():
            skips = range(1) if n == 1 else range(self.max_skip + 1)
            for s in skips:
                d = s + 1
                span = cols - (n - 1) * d
                if span <= 0:
                    break
                parts = [tok[:, k * d : k * d + span] for k in range(n)]
                valid = np.logical_and.reduce([p >= 0 for p in parts])
                if not valid.any():
                    continue
                r_idx, c_idx = np.nonzero(valid)
                if isinstance(table, dict):
                    keys = [self._code(ids) for ids in zip(*(p[r_idx, c_idx].tolist() for p in parts))]
                    found = [table.get(c, (-1, 0.0)) for c in keys]
                    outs = np.array([o for o, _ in found], dtype=np.int64)
                    gram_weights = np.array([wt for _, wt in found], dtype=np.float64)
                else:
                    code = np.zeros(r_idx.size, dtype=np.int64)
                    for p in reversed(parts):
                        code *= self.radix
                        code += p[r_idx, c_idx]
                    codes, out_idx, weight_of = table
                    pos = np.minimum(np.searchsorted(codes, code), codes.size - 1)
                    outs = np.where(codes[pos] == code, out_idx[pos], -1)
                    gram_weights = weight_of[pos]
                keep = outs >= 0
                if keep.any():
                    flat = row_base[r_idx[keep], 0] + outs[keep]
                    if idf_found is not None:
                        idf_found.append((r_idx[keep], c_idx[keep], np.full(flat.size, s), np.full(flat.size, n),
                                          flat, gram_weights[keep]))
                    if tfidf:
                        freq += np.bincount(flat, weights=gram_weights[keep], minlength=freq.size)
                    else:
                        freq += np.bincount(flat, minlength=freq.size)
        freq = freq.reshape(rows, self.out_size)
        if idf_found:
            rows_, starts, skips, sizes, flat, weights = (np.concatenate(a) for a in zip(*idf_found))
            order = np.lexsort((sizes, starts, skips, rows_))
            y = np.zeros(rows * self.out_size, np.float32)
            y[flat[order]] = weights[order]  # repeated outputs: numpy keeps the last value
            y = y.reshape(rows, self.out_size)
        elif self.mode == "IDF":
            y = (freq > 0).astype(np.float32)
            if self.weights is not None:
                y *= self.weights
        else:
            y = freq.astype(np.float32)
        return (y[0] if x.ndim == 1 else y,)
