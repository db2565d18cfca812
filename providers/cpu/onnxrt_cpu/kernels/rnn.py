"""Recurrent layers: RNN, GRU and LSTM.

All three share one structure. The input projection ``X·Wᵀ + bias`` of every time
step and both directions is one GEMM before the time loop; only the recurrent
``H·Rᵀ`` product and the gate arithmetic run per step, on preallocated buffers with
``out=`` so that a step costs a handful of numpy calls.

When the gate activation ``f`` is Sigmoid, the weights and biases of the sigmoid
gates are prescaled by 0.5 (exact in floating point) so that
``sigmoid(x) = 0.5 * tanh(x / 2) + 0.5`` needs one ``tanh`` over the whole gate
buffer; LSTM with the default activations then applies a single ``tanh`` per step
to all four gates.

``sequence_lens`` is honoured per batch entry: outputs past a sequence's length are
zero and ``Y_h``/``Y_c`` hold the state of its last valid step. The reverse direction
of a ragged batch reverses each entry's valid prefix, runs forward, and maps back.

Where the CPU provider's compiled kernels are loaded, the layers with the default
activations (RNN tanh; GRU sigmoid and tanh, either ``linear_before_reset``; LSTM
sigmoid, tanh and tanh, peepholes or not) and no clip or ``input_forget`` run the
time loop in C instead (``rnn_steps`` of ``onnxrt_cpu/native/src/rnn.c``): the same
operations on every element in the same order, each direction's hidden units split
over the run's threads. Its recurrent product sums in its own order (not BLAS's), so
results agree with the numpy loop to the rounding of those sums (about 5e-7 in
float32 over tests/cpu/test_recurrent_native.py's configurations).
"""

from __future__ import annotations

import numpy as np

from onnxrt.plugin.kernel import Kernel
from onnxrt.run.threads import current_thread_count

from .. import native
from ..parallel import PARALLEL_MIN_FLOPS, blas_aligned, matmul_nd
from ..registry import op

__all__ = ["RNN", "GRU", "LSTM"]


# -- activation functions ---------------------------------------------------------
# Each builder takes (alpha, beta) and returns fn(x, out) -> out, in place when
# ``x is out``.


def _relu(a, b):
    def fn(x, out):
        return np.maximum(x, 0, out=out)

    return fn


def _tanh(a, b):
    def fn(x, out):
        return np.tanh(x, out=out)

    return fn


def _sigmoid(a, b):
    def fn(x, out):
        np.multiply(x, 0.5, out=out)
        np.tanh(out, out=out)
        out *= 0.5
        out += 0.5
        return out

    return fn


def _half_sigmoid(x, out):
    """Sigmoid of ``2x``: used on gates whose weights were prescaled by 0.5."""
    np.tanh(x, out=out)
    out *= 0.5
    out += 0.5
    return out


def _affine(a, b):
    def fn(x, out):
        np.multiply(x, a, out=out)
        out += b
        return out

    return fn


def _leaky_relu(a, b):
    def fn(x, out):
        neg = np.minimum(x, 0) * (a - 1)
        np.add(x, neg, out=out)
        return out

    return fn


def _thresholded_relu(a, b):
    def fn(x, out):
        np.multiply(x, x >= a, out=out)
        return out

    return fn


def _scaled_tanh(a, b):
    def fn(x, out):
        np.multiply(x, b, out=out)
        np.tanh(out, out=out)
        out *= a
        return out

    return fn


def _hard_sigmoid(a, b):
    def fn(x, out):
        np.multiply(x, a, out=out)
        out += b
        np.clip(out, 0, 1, out=out)
        return out

    return fn


def _elu(a, b):
    def fn(x, out):
        neg = np.expm1(np.minimum(x, 0)) * a
        np.maximum(x, 0, out=out)
        out += neg
        return out

    return fn


def _softsign(a, b):
    def fn(x, out):
        d = np.abs(x) + 1
        np.divide(x, d, out=out)
        return out

    return fn


def _softplus(a, b):
    def fn(x, out):
        # log(1 + e^x) = max(x, 0) + log1p(e^-|x|), stable for large |x|
        t = np.log1p(np.exp(-np.abs(x)))
        np.maximum(x, 0, out=out)
        out += t
        return out

    return fn


# name -> (uses alpha, uses beta, default alpha, default beta, builder)
_ACTIVATIONS = {
    "relu": (False, False, 0.0, 0.0, _relu),
    "tanh": (False, False, 0.0, 0.0, _tanh),
    "sigmoid": (False, False, 0.0, 0.0, _sigmoid),
    "affine": (True, True, 1.0, 0.0, _affine),
    "leakyrelu": (True, False, 0.01, 0.0, _leaky_relu),
    "thresholdedrelu": (True, False, 1.0, 0.0, _thresholded_relu),
    "scaledtanh": (True, True, 1.0, 1.0, _scaled_tanh),
    "hardsigmoid": (True, True, 0.2, 0.5, _hard_sigmoid),
    "elu": (True, False, 1.0, 0.0, _elu),
    "softsign": (False, False, 0.0, 0.0, _softsign),
    "softplus": (False, False, 0.0, 0.0, _softplus),
}


def _parse_activations(node, per_dir: int, num_dir: int, defaults: tuple[str, ...]):
    """Return ``(names, fns)``: per direction, the lower-case names and callables."""
    attrs = node.attrs
    names = list(attrs.get("activations") or [])
    if not names:
        names = list(defaults) * num_dir
    elif len(names) == per_dir and num_dir == 2:
        names = names * 2
    if len(names) != per_dir * num_dir:
        raise ValueError(
            f"{node.describe()}: 'activations' has {len(names)} entries; expected "
            f"{per_dir * num_dir} ({per_dir} per direction)"
        )
    alphas = [float(v) for v in attrs.get("activation_alpha") or []]
    betas = [float(v) for v in attrs.get("activation_beta") or []]
    # the values are consumed in order by the activations that take the parameter
    ai = bi = 0
    lower, fns = [], []
    for name in names:
        key = str(name).lower()
        if key not in _ACTIVATIONS:
            raise ValueError(f"{node.describe()}: unknown activation function {name!r}")
        use_a, use_b, da, db, build = _ACTIVATIONS[key]
        a, b = da, db
        if use_a and ai < len(alphas):
            a, ai = alphas[ai], ai + 1
        if use_b and bi < len(betas):
            b, bi = betas[bi], bi + 1
        lower.append(key)
        fns.append(build(a, b))
    return (
        [lower[d * per_dir : (d + 1) * per_dir] for d in range(num_dir)],
        [fns[d * per_dir : (d + 1) * per_dir] for d in range(num_dir)],
    )


def _compute_dtype(dt: np.dtype) -> np.dtype:
    return dt if dt in (np.float32, np.float64) else np.dtype(np.float32)


#: unsigned integers by item size: arrays compared bit for bit through views of them
_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _same_bits(kept: np.ndarray | None, given) -> bool:
    """Whether ``given`` holds ``kept``'s values bit for bit: the same dtype, shape
    and bytes (both None counts as the same)."""
    if kept is None or given is None:
        return kept is None and given is None
    given = np.asarray(given)
    if given.dtype != kept.dtype or given.shape != kept.shape:
        return False
    bits = _BITS.get(kept.dtype.itemsize)
    if bits is None or kept.dtype.hasobject:
        return False
    return bool(np.array_equal(kept.view(bits), given.view(bits)))


def ragged_lengths(sequence_lens, batch: int, seq: int, desc: str) -> np.ndarray | None:
    """``sequence_lens`` checked (``batch`` entries within ``[0, seq]``) as int64, or
    None where it is absent or every entry is whole."""
    if sequence_lens is None:
        return None
    lens = np.asarray(sequence_lens).astype(np.int64).reshape(-1)
    if lens.shape[0] != batch:
        raise ValueError(f"{desc}: sequence_lens has {lens.shape[0]} entries, batch is {batch}")
    if (lens < 0).any() or (lens > seq).any():
        raise ValueError(f"{desc}: sequence_lens values must lie in [0, {seq}], got {lens}")
    return None if (lens == seq).all() else lens


def ragged_steps(lens: np.ndarray, seq: int) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """For ragged ``lens``: ``(valid, rev)``, ``valid`` ``[seq, batch]`` the steps
    within each entry's length, and ``rev`` the index pair that reverses each entry's
    valid prefix along the steps of a ``[seq, batch, ...]`` array (and leaves the
    rest in place; the map is its own inverse), as the reverse direction runs it."""
    t = np.arange(seq)[:, None]
    valid = t < lens[None, :]
    return valid, (np.where(valid, lens[None, :] - 1 - t, t), np.arange(lens.shape[0])[None, :])


#: Both directions of a bidirectional layer step together while their recurrent
#: weights take at most this many bytes. Stepping together halves the numpy calls, but
#: a step then reads both directions' weights, and past about the L2 cache each step
#: reads them from beyond it, where one direction at a time keeps its own there: an
#: LSTM of hidden size 256 (2 MB of weights), batch 1, 32 steps, ran 8.3 ms together
#: against 6.6 one direction at a time; hidden size 128 (0.5 MB), 3.2 against 3.5
#: (batch 1) and 6.2 against 7.8 (batch 8).
_BOTH_MAX_WEIGHT_BYTES = 1 << 20


def directions_together(weight_bytes: int) -> bool:
    """Whether a bidirectional layer whose recurrent weights (both directions') take
    ``weight_bytes`` steps both directions together (:data:`_BOTH_MAX_WEIGHT_BYTES`)."""
    return weight_bytes <= _BOTH_MAX_WEIGHT_BYTES


class _Recurrent(Kernel):
    """Shared attribute parsing, weight packing and driver of the recurrent layers.

    Subclasses set the gate count, activation defaults, which gate blocks take the
    activation ``f`` (and so may be prescaled), and implement :meth:`_loop`.
    """

    N_GATES = 1
    N_ACTS = 1
    DEFAULT_ACTS: tuple[str, ...] = ("tanh",)
    N_STATES = 1  # hidden (and cell) states carried through time

    def setup(self):
        a = self.attrs
        node = self.node
        direction = a.get("direction", "forward")
        if direction == "foward":  # the default spelled in GRU-1's schema
            direction = "forward"
        if direction not in ("forward", "reverse", "bidirectional"):
            raise ValueError(f"{node.describe()}: unknown direction {direction!r}")
        self.direction = direction
        self.num_dir = 2 if direction == "bidirectional" else 1
        self.hidden_size = a.get("hidden_size")
        self.layout = int(a.get("layout", 0))
        if self.layout not in (0, 1):
            raise ValueError(f"{node.describe()}: layout must be 0 or 1, got {self.layout}")
        clip = a.get("clip")
        self.clip = None if clip is None else float(clip)
        self.act_names, self.act_fns = _parse_activations(node, self.N_ACTS, self.num_dir, self.DEFAULT_ACTS)
        # f is the gate activation: prescale sigmoid gates so one tanh computes them
        self.scaled = [names[0] == "sigmoid" for names in self.act_names]
        self.extra_setup()
        # what a run of the compiled loop takes that does not change from run to run:
        # whether it computes this layer, and the directions that run backwards
        self._compiled = self.NATIVE_KIND is not None and self._compiled_applies(None)
        self._reversed_bits = sum(1 << d for d in range(self.num_dir) if direction == "reverse" or d == 1)
        self._lbr = self.NATIVE_KIND == 1 and bool(getattr(self, "lbr", 0))
        c = node.constants
        self._packed = None
        # computed weights: the last ones packed, beside copies of them (see _weights)
        self._fed_pack = None
        if 1 in c and 2 in c and (len(node.inputs) <= 3 or not node.inputs[3] or 3 in c):
            dt = _compute_dtype(np.dtype(c[1].dtype))
            self._packed = self._pack(c[1], c[2], c.get(3), dt)

    def extra_setup(self):
        pass

    # -- packing ---------------------------------------------------------------------
    def _sig_cols(self, H: int) -> slice:
        """Columns of the gate block that use activation ``f``."""
        return slice(0, (self.N_GATES - 1) * H) if self.N_GATES > 1 else slice(0, H)

    def _pack(self, W, R, B, dt):
        """Transpose, scale and fold biases: returns a dict used by :meth:`run`."""
        D, G = self.num_dir, self.N_GATES
        W = np.asarray(W)
        R = np.asarray(R)
        if W.ndim != 3 or W.shape[0] != D:
            raise ValueError(f"{self.node.describe()}: W must be [{D}, {G}*hidden, input], got {W.shape}")
        H = R.shape[-1]
        if self.hidden_size is not None and H != self.hidden_size:
            raise ValueError(f"{self.node.describe()}: R has hidden size {H}, hidden_size is {self.hidden_size}")
        if W.shape[1] != G * H or R.shape != (D, G * H, H):
            raise ValueError(
                f"{self.node.describe()}: W {W.shape} / R {R.shape} do not match {G} gates of hidden size {H}"
            )
        W = W.astype(dt)
        R = R.astype(dt)
        if B is None:
            Bw = np.zeros((D, G * H), dt)
            Br = np.zeros((D, G * H), dt)
        else:
            B = np.asarray(B).astype(dt)
            if B.shape != (D, 2 * G * H):
                raise ValueError(f"{self.node.describe()}: B must be [{D}, {2 * G * H}], got {B.shape}")
            Bw, Br = B[:, : G * H], B[:, G * H :]
        scale = np.ones((D, G * H), dt)
        for d in range(D):
            if self.scaled[d]:
                scale[d, self._sig_cols(H)] = 0.5
        w_t = np.ascontiguousarray((W * scale[:, :, None]).transpose(2, 0, 1).reshape(W.shape[2], D * G * H))
        # aligned: a step reads its recurrent weight in place (see blas_aligned)
        r_t = [blas_aligned((R[d] * scale[d][:, None]).T) for d in range(D)]
        p = {"H": H, "w_t": w_t, "r_t": r_t, "r_tuple": tuple(r_t), "scale": scale, "dt": dt}
        self.fold_bias(p, Bw, Br, scale)
        return p

    def fold_bias(self, p, Bw, Br, scale):
        """Default: both biases are added to the input projection."""
        p["xw_bias"] = ((Bw + Br) * scale).reshape(-1)

    def _weights(self, W, R, B, dt):
        """The packed weights of this run: the constants' (packed at setup), else those of
        the last run whose W, R and B were these values, else a new packing.

        Weights that are not constants of the node are mostly constants all the same,
        computed each run from constants of an enclosing graph (Silero VAD slices and
        concatenates its LSTM's weights inside If branches): packing them again each
        run (transposes and scalings of the whole weights) cost 460-640 us a call at
        hidden size 128, against 20-30 us for comparing them with copies of the last
        ones packed, bit for bit (a NaN or a -0.0 is then its own value). The cache is
        one tuple, replaced whole, so concurrent runs of a session each see one
        consistent entry."""
        p = self._packed
        if p is not None and p["dt"] == dt:
            return p
        given = (W, R, B)
        last = self._fed_pack
        if last is not None and last[1]["dt"] == dt and all(map(_same_bits, last[0], given)):
            return last[1]
        p = self._pack(W, R, B, dt)
        self._fed_pack = (tuple(None if a is None else np.array(a, copy=True) for a in given), p)
        return p

    # -- driver ----------------------------------------------------------------------
    def run(self, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None):
        in_dt = np.dtype(X.dtype)
        dt = _compute_dtype(in_dt)
        p = self._weights(W, R, B, dt)
        H, D, G = p["H"], self.num_dir, self.N_GATES
        if X.ndim != 3:
            raise ValueError(f"{self.node.describe()}: X must be 3-D, got shape {X.shape}")
        if self.layout == 1:
            X = X.transpose(1, 0, 2)
        S, Bn, I = X.shape
        if I != p["w_t"].shape[0]:
            raise ValueError(f"{self.node.describe()}: X has input size {I}, W expects {p['w_t'].shape[0]}")

        # input projection of all steps and directions in one GEMM (a product too
        # small to split goes straight to numpy, as matmul_nd would send it)
        x2, w_t = X.reshape(S * Bn, I).astype(dt, copy=False), p["w_t"]
        xw = np.matmul(x2, w_t) if S * Bn * I * w_t.shape[1] < PARALLEL_MIN_FLOPS else matmul_nd(x2, w_t)
        np.add(xw, p["xw_bias"], out=xw)
        xw = xw.reshape(S, Bn, D * G * H)

        states0 = []
        for k, init in enumerate((initial_h, initial_c)[: self.N_STATES]):
            if init is None:
                states0.append(np.zeros((D, Bn, H), dt))
            else:
                init = np.asarray(init)
                if self.layout == 1:
                    init = init.transpose(1, 0, 2)
                if init.shape != (D, Bn, H):
                    name = ("initial_h", "initial_c")[k]
                    raise ValueError(f"{self.node.describe()}: {name} must be {(D, Bn, H)}, got {init.shape}")
                # a C-ordered copy: the loops update states in place
                states0.append(init.astype(dt, order="C"))

        lens = ragged_lengths(sequence_lens, Bn, S, self.node.describe())
        extra = self.extra_inputs(P, p, D, H, dt)

        Y = np.empty((S, D, Bn, H), dt)
        finals = self._compiled_steps(xw, p, states0, lens, extra, Y)
        if finals is None:
            finals = self._numpy_steps(xw, p, states0, lens, extra, Y)
        if lens is not None and (lens == 0).any():
            # an empty sequence has no last step: its final state is zero
            for f in finals:
                f[:, lens == 0] = 0

        if self.layout == 1:
            Y = Y.transpose(2, 0, 1, 3)
            finals = [f.transpose(1, 0, 2) for f in finals]
        outs = [Y] + finals
        if dt != in_dt:
            outs = [o.astype(in_dt) for o in outs]
        return tuple(outs)

    def _numpy_steps(self, xw, p, states0, lens, extra, Y):
        """The time loop in numpy calls: writes ``Y`` ``[S, D, B, H]`` and returns the
        final states (``[D, B, H]`` each), each row's last valid one."""
        H, D, G = p["H"], self.num_dir, self.N_GATES
        S, Bn, _ = xw.shape
        dt = Y.dtype
        finals = [np.empty((D, Bn, H), dt) for _ in range(self.N_STATES)]
        masks = rev = None
        if lens is not None:
            valid, rev = ragged_steps(lens, S)
            masks = valid[:, :, None]  # [S, B, 1]
        both = D == 2 and self._both_directions(p, extra) and directions_together(sum(r.nbytes for r in p["r_t"]))
        if both:
            # both directions' steps at once, where a step of :meth:`_loop` is a
            # handful of numpy calls on small arrays (a bidirectional tagger at batch
            # 8: half the calls); the reverse direction reads its inputs in reverse
            # time order. Each element gets :meth:`_loop`'s operations in its order,
            # so the results are the same bit for bit
            gh = G * H
            xs = np.empty((S, 2, Bn, gh), dt)
            xs[:, 0] = xw[:, :, :gh]
            xs[:, 1] = xw[::-1, :, gh:] if rev is None else xw[:, :, gh:][rev]
            ys = np.empty((S, 2, Bn, H), dt)
            for f, s in zip(finals, self._loop_both(xs, p, states0, ys, masks)):
                f[...] = s
            Y[:, 0] = ys[:, 0]
            Y[:, 1] = ys[::-1, 1] if rev is None else ys[:, 1][rev]
        for d in range(0 if both else D):
            reverse = self.direction == "reverse" or d == 1
            xw_d = xw[:, :, d * G * H : (d + 1) * G * H]
            Y_d = Y[:, d]
            states = [s[d] for s in states0]
            if lens is None:
                order = range(S - 1, -1, -1) if reverse else range(S)
                out_states = self._loop(xw_d, p, d, states, Y_d, order, None, extra)
            elif reverse:
                Y_tmp = np.empty((S, Bn, H), dt)
                out_states = self._loop(xw_d[rev], p, d, states, Y_tmp, range(S), masks, extra)
                Y_d[...] = Y_tmp[rev]
            else:
                out_states = self._loop(xw_d, p, d, states, Y_d, range(S), masks, extra)
            for f, s in zip(finals, out_states):
                f[d] = s
        return finals

    #: The op's kind for the compiled loop (``rnn_steps``: 0 RNN, 1 GRU, 2 LSTM), or
    #: None where it has none.
    NATIVE_KIND: int | None = None

    def _compiled_applies(self, extra) -> bool:
        """Whether the compiled time loop computes this layer: the default
        activations in every direction and no clip (subclasses add their own
        conditions)."""
        default = tuple(self.DEFAULT_ACTS)
        return self.clip is None and all(tuple(n) == default for n in self.act_names)

    def _compiled_steps(self, xw, p, states0, lens, extra, Y):
        """The time loop by the compiled kernel (``rnn_steps`` of
        ``onnxrt_cpu/native/src/rnn.c``): writes ``Y`` and returns the final states,
        as :meth:`_numpy_steps` does; None where it does not apply (not built, or a
        layer it does not compute)."""
        k = native.K
        if k is None or not self._compiled:
            return None
        S, Bn = xw.shape[0], xw.shape[1]
        # the states are the run's own copies (C-ordered), updated in place into the
        # final ones
        states = states0
        lbr = self._lbr
        rbh = None
        if lbr:
            rbh = p.get("rbh_all")
            if rbh is None:
                rbh = p["rbh_all"] = np.ascontiguousarray(np.stack(p["rbh"]))
        peep = None if extra is None else np.ascontiguousarray(extra)
        cell = states[1] if len(states) > 1 else None
        k.rnn_steps(self.NATIVE_KIND, lbr, xw, p["r_tuple"], rbh, peep, states[0], cell,
                    lens, self._reversed_bits, Y, (S, Bn, self.num_dir, p["H"]), current_thread_count())
        return states

    def extra_inputs(self, P, p, D, H, dt):
        return None

    def _both_directions(self, p, extra) -> bool:
        """Whether :meth:`_loop_both` runs a bidirectional layer (else a loop per
        direction)."""
        return False

    def _loop_both(self, xs, p, states, ys, masks):
        """The steps of both directions at once: ``xs`` ``[S, 2, B, G * H]`` the
        input projections (the reverse direction's in reverse time order, each
        entry's valid prefix where ``sequence_lens`` is ragged), ``states`` the
        initial ``[2, B, H]`` states (updated in place), ``masks`` ``[S, B, 1]`` the
        valid steps or None; writes ``ys[t]`` ``[2, B, H]`` (zero past an entry's
        length) and returns the final states (each entry's last valid one)."""
        raise NotImplementedError

    def _clip_bounds(self, p, d, cols: slice | None = None):
        """Clip bound per gate column (sigmoid gates are prescaled), or None."""
        if self.clip is None:
            return None
        b = p["scale"][d] * p["dt"].type(self.clip)
        return b if cols is None else b[cols]



@op("RNN", since=1)
class RNN(_Recurrent):
    """Elman RNN: ``H_t = f(X_t·Wᵀ + H_{t-1}·Rᵀ + Wb + Rb)``; all versions, layout 0/1."""

    N_GATES = 1
    N_ACTS = 1
    DEFAULT_ACTS = ("tanh",)
    NATIVE_KIND = 0

    def setup(self):
        super().setup()
        # a lone sigmoid gate is prescaled like the others
        self.act = [
            _half_sigmoid if self.scaled[d] else self.act_fns[d][0] for d in range(self.num_dir)
        ]

    def _loop(self, xw, p, d, states, Y, order, masks, extra):
        (h,) = states
        r_t = p["r_t"][d]
        act = self.act[d]
        bound = self._clip_bounds(p, d)
        g = np.empty_like(h)
        matmul, clip = np.matmul, np.clip
        for t in order:
            matmul(h, r_t, out=g)
            g += xw[t]
            if bound is not None:
                clip(g, -bound, bound, out=g)
            if masks is None:
                h = act(g, Y[t])
            else:
                m = masks[t]
                act(g, g)
                np.copyto(h, g, where=m)
                np.multiply(g, m, out=Y[t])
        return (h,)


def _steps_of(forward: bool, *arrays):
    """The per-step views of ``arrays`` (``[S, ...]`` each) in the loop's order, as one
    ``zip``: a step then indexes nothing."""
    step = 1 if forward else -1
    return zip(*(a[::step] for a in arrays))


def _gru_update(h, hh, z, tmp, hn, m, out):
    """A GRU step's new state ``H_t = (1 - z) ⊙ h~ + z ⊙ H_{t-1} = h~ + z ⊙ (H_{t-1} -
    h~)`` from ``h`` (``H_{t-1}``) and ``hh`` (``h~``), written to ``out``; returns the
    state the next step reads. With a mask ``m`` (ragged batches) the entries past
    their length keep their state (``h``, updated in place) and output zero."""
    np.subtract(h, hh, out=tmp)
    tmp *= z
    if m is None:
        return np.add(hh, tmp, out=out)
    np.add(hh, tmp, out=hn)
    np.copyto(h, hn, where=m)
    np.multiply(hn, m, out=out)
    return h


@op("GRU", since=1)
class GRU(_Recurrent):
    """Gated recurrent unit (gates z, r, h); ``linear_before_reset``; all versions."""

    N_GATES = 3
    N_ACTS = 2
    DEFAULT_ACTS = ("sigmoid", "tanh")
    NATIVE_KIND = 1

    def extra_setup(self):
        self.lbr = int(self.attrs.get("linear_before_reset", 0))
        self.f = [_half_sigmoid if self.scaled[d] else self.act_fns[d][0] for d in range(self.num_dir)]
        self.g = [self.act_fns[d][1] for d in range(self.num_dir)]

    def fold_bias(self, p, Bw, Br, scale):
        H = p["H"]
        D = Bw.shape[0]
        xb = (Bw + Br) * scale
        if self.lbr:
            # Rbh sits inside r ⊙ (H·Rhᵀ + Rbh): keep it out of the projection
            xb[:, 2 * H :] = Bw[:, 2 * H :]
            p["rbh"] = [np.ascontiguousarray(Br[d, 2 * H :]) for d in range(D)]
        p["xw_bias"] = xb.reshape(-1)
        if not self.lbr:
            # split recurrent weights: [z r] and h blocks (the h block multiplies
            # r ⊙ H); linear_before_reset multiplies all three blocks by H at once
            p["r_zr"] = [blas_aligned(r[:, : 2 * H]) for r in p["r_t"]]
            p["r_h"] = [blas_aligned(r[:, 2 * H :]) for r in p["r_t"]]

    def _both_directions(self, p, extra) -> bool:
        default = tuple(self.DEFAULT_ACTS)
        return (self._clip_bounds(p, 0) is None and all(self.scaled)
                and all(tuple(n) == default for n in self.act_names))

    def _loop_both(self, xs, p, states, ys, masks):
        S, _, Bn, _ = xs.shape
        H = p["H"]
        dt = ys.dtype
        (h,) = states
        matmul, multiply, tanh = np.matmul, np.multiply, np.tanh
        tmp = np.empty((2, Bn, H), dt)
        hn = np.empty((2, Bn, H), dt)
        if self.lbr:
            r_all = p.get("r_both")
            if r_all is None:
                r_all = p["r_both"] = blas_aligned(np.stack(p["r_t"]))
            rbh = np.stack(p["rbh"])[:, None, :]
            g3 = np.empty((2, Bn, 3 * H), dt)
            zr, z, r, hh = g3[..., : 2 * H], g3[..., :H], g3[..., H : 2 * H], g3[..., 2 * H :]
        else:
            r_zr, r_h = p.get("r_both_zr"), p.get("r_both_h")
            if r_zr is None:
                r_zr = p["r_both_zr"] = blas_aligned(np.stack(p["r_zr"]))
                r_h = p["r_both_h"] = blas_aligned(np.stack(p["r_h"]))
            zr = np.empty((2, Bn, 2 * H), dt)
            z, r = zr[..., :H], zr[..., H:]
            hh = np.empty((2, Bn, H), dt)
        for t in range(S):
            x = xs[t]
            if self.lbr:
                matmul(h, r_all, out=g3)
                zr += x[..., : 2 * H]
                _half_sigmoid(zr, zr)
                hh += rbh
                hh *= r
                hh += x[..., 2 * H :]
            else:
                matmul(h, r_zr, out=zr)
                zr += x[..., : 2 * H]
                _half_sigmoid(zr, zr)
                multiply(r, h, out=tmp)
                matmul(tmp, r_h, out=hh)
                hh += x[..., 2 * H :]
            tanh(hh, out=hh)
            h = _gru_update(h, hh, z, tmp, hn, None if masks is None else masks[t], ys[t])
        return (h,)

    def _loop(self, xw, p, d, states, Y, order, masks, extra):
        (h,) = states
        H = p["H"]
        f, g_act = self.f[d], self.g[d]
        bound = self._clip_bounds(p, d)
        if masks is None and bound is None and self.scaled[d] and tuple(self.act_names[d]) == self.DEFAULT_ACTS:
            return self._loop_default(xw, p, d, h, Y, order.step > 0)
        b_zr = None if bound is None else bound[: 2 * H]
        b_h = None if bound is None else bound[2 * H :]
        Bn = h.shape[0]
        dt = h.dtype
        matmul, clip, multiply = np.matmul, np.clip, np.multiply
        tmp = np.empty((Bn, H), dt)
        hn = np.empty((Bn, H), dt)
        if self.lbr:
            r_all = p["r_t"][d]
            rbh = p["rbh"][d]
            g3 = np.empty((Bn, 3 * H), dt)
            zr, z, r, hh = g3[:, : 2 * H], g3[:, :H], g3[:, H : 2 * H], g3[:, 2 * H :]
        else:
            r_zr, r_h = p["r_zr"][d], p["r_h"][d]
            zr = np.empty((Bn, 2 * H), dt)
            z, r = zr[:, :H], zr[:, H:]
            hh = np.empty((Bn, H), dt)
        for t in order:
            x = xw[t]
            if self.lbr:
                matmul(h, r_all, out=g3)
                zr += x[:, : 2 * H]
                if b_zr is not None:
                    clip(zr, -b_zr, b_zr, out=zr)
                f(zr, zr)
                hh += rbh
                hh *= r
                hh += x[:, 2 * H :]
            else:
                matmul(h, r_zr, out=zr)
                zr += x[:, : 2 * H]
                if b_zr is not None:
                    clip(zr, -b_zr, b_zr, out=zr)
                f(zr, zr)
                multiply(r, h, out=tmp)
                matmul(tmp, r_h, out=hh)
                hh += x[:, 2 * H :]
            if b_h is not None:
                clip(hh, -b_h, b_h, out=hh)
            g_act(hh, hh)
            h = _gru_update(h, hh, z, tmp, hn, None if masks is None else masks[t], Y[t])
        return (h,)

    def _loop_default(self, xw, p, d, h, Y, forward):
        """:meth:`GRU._loop` for the default activations without clip or ragged batches:
        the same operations, without the activation and update calls of the general
        loop, with operands of the step's own shape (no row broadcast) and each step's
        views taken from one ``zip``: a batch-1 step is a dozen numpy calls on a few
        hundred values, whose own cost is most of the step besides the product."""
        H = p["H"]
        Bn = h.shape[0]
        dt = h.dtype
        matmul, add, sub, mul, tanh = np.matmul, np.add, np.subtract, np.multiply, np.tanh
        half = np.full((Bn, 2 * H), 0.5, dt)  # the sigmoid gates' 0.5 * tanh + 0.5
        tmp = np.empty((Bn, H), dt)
        lbr = self.lbr
        if lbr:
            # one product for all three gates; Rbh inside r * (H @ Rh + Rbh)
            first, r_first = np.empty((Bn, 3 * H), dt), p["r_t"][d]
            zr, hh = first[:, : 2 * H], first[:, 2 * H :]
            rbh = np.broadcast_to(p["rbh"][d], (Bn, H)).copy()
        else:
            # z and r first; the candidate's product reads r * H
            first, r_first = np.empty((Bn, 2 * H), dt), p["r_zr"][d]
            zr, hh = first, np.empty((Bn, H), dt)
            r_h = p["r_h"][d]
        z, r = zr[:, :H], zr[:, H:]
        for x_zr, x_h, y in _steps_of(forward, xw[:, :, : 2 * H], xw[:, :, 2 * H :], Y):
            matmul(h, r_first, first)
            add(zr, x_zr, zr)
            tanh(zr, zr)
            mul(zr, half, zr)
            add(zr, half, zr)
            if lbr:
                add(hh, rbh, hh)
                mul(hh, r, hh)
            else:
                mul(r, h, tmp)
                matmul(tmp, r_h, hh)
            add(hh, x_h, hh)
            tanh(hh, hh)
            # H_t = h~ + z * (H_{t-1} - h~)
            sub(h, hh, tmp)
            mul(tmp, z, tmp)
            h = add(hh, tmp, y)
        return (h,)


def _lstm_update(h, c, c_new, go, act, hn, m, out):
    """An LSTM step's output ``o ⊙ h(C_t)`` (``go`` times ``act``) written to ``out``;
    returns ``(h, c, spare)``: the state and cell the next step reads and a buffer
    for its new cell. With a mask ``m`` (ragged batches) the entries past their
    length keep their state and cell (``h`` and ``c``, updated in place) and output
    zero."""
    if m is None:
        return np.multiply(go, act, out=out), c_new, c
    np.multiply(go, act, out=hn)
    np.copyto(h, hn, where=m)
    np.copyto(c, c_new, where=m)
    np.multiply(hn, m, out=out)
    return h, c, c_new


@op("LSTM", since=1)
class LSTM(_Recurrent):
    """Long short-term memory (gates i, o, f, c); peepholes, ``input_forget``; all versions."""

    N_GATES = 4
    N_ACTS = 3
    DEFAULT_ACTS = ("sigmoid", "tanh", "tanh")
    N_STATES = 2
    NATIVE_KIND = 2

    def extra_setup(self):
        self.input_forget = int(self.attrs.get("input_forget", 0))
        D = self.num_dir
        self.f = [_half_sigmoid if self.scaled[d] else self.act_fns[d][0] for d in range(D)]
        self.g = [self.act_fns[d][1] for d in range(D)]
        self.h = [self.act_fns[d][2] for d in range(D)]
        # one tanh over all four gates when f is Sigmoid and g is Tanh
        self.fused = [self.scaled[d] and self.act_names[d][1] == "tanh" for d in range(D)]

    def _sig_cols(self, H):
        return slice(0, 3 * H)

    def extra_inputs(self, P, p, D, H, dt):
        if P is None:
            return None
        P = np.asarray(P).astype(dt)
        if P.shape != (D, 3 * H):
            raise ValueError(f"{self.node.describe()}: P must be [{D}, {3 * H}], got {P.shape}")
        # peepholes feed sigmoid gates: scale them like the weights
        return P * p["scale"][:, : 3 * H]

    def _compiled_applies(self, extra) -> bool:
        return super()._compiled_applies(extra) and not self.input_forget

    def _both_directions(self, p, extra) -> bool:
        return (extra is None and self._clip_bounds(p, 0) is None and all(self.fused) and not self.input_forget
                and all(n[2] == "tanh" for n in self.act_names))

    def _loop_both(self, xs, p, states, ys, masks):
        S, _, Bn, _ = xs.shape
        H = p["H"]
        dt = ys.dtype
        r = p.get("r_both")
        if r is None:
            r = p["r_both"] = blas_aligned(np.stack(p["r_t"]))
        gates = np.empty((2, Bn, 4 * H), dt)
        # the sigmoid gates 0.5 * tanh + 0.5 (their inputs were prescaled), the last
        # block as it is: operands of the step's full shape, which small arrays take
        # twice as fast as a row broadcast along the rows
        mul = np.ones_like(gates)
        mul[..., : 3 * H] = 0.5
        add = 1 - mul
        gi, go, gf, gc = (gates[..., k * H : (k + 1) * H] for k in range(4))
        h, c = states
        c_new = np.empty_like(c)
        tmp = np.empty_like(c)
        hn = np.empty_like(c)
        matmul, multiply, add_, tanh = np.matmul, np.multiply, np.add, np.tanh
        for t in range(S):
            matmul(h, r, out=gates)
            add_(gates, xs[t], out=gates)
            tanh(gates, out=gates)
            multiply(gates, mul, out=gates)
            add_(gates, add, out=gates)
            multiply(gf, c, out=c_new)
            multiply(gc, gi, out=gc)
            add_(c_new, gc, out=c_new)
            tanh(c_new, out=tmp)
            h, c, c_new = _lstm_update(h, c, c_new, go, tmp, hn, None if masks is None else masks[t], ys[t])
        return h, c

    def _loop(self, xw, p, d, states, Y, order, masks, extra):
        h, c = states
        H = p["H"]
        r_t = p["r_t"][d]
        f, g_act, h_act = self.f[d], self.g[d], self.h[d]
        fused = self.fused[d]
        bound = self._clip_bounds(p, d)
        if (fused and extra is None and bound is None and masks is None and not self.input_forget
                and self.act_names[d][2] == "tanh"):
            return self._loop_default(xw, r_t, h, c, Y, order.step > 0)
        Bn = h.shape[0]
        dt = h.dtype
        gates = np.empty((Bn, 4 * H), dt)
        gi, go, gf, gc = (gates[:, k * H : (k + 1) * H] for k in range(4))
        sig = gates[:, : 3 * H]
        tmp = np.empty((Bn, H), dt)
        c_new = np.empty((Bn, H), dt)
        hn = np.empty((Bn, H), dt)
        peep = extra is not None
        if peep:
            p_i, p_o, p_f = extra[d, :H], extra[d, H : 2 * H], extra[d, 2 * H :]
            gfc = gates[:, 2 * H :]
            if bound is not None:
                b_i, b_o, b_fc = bound[:H], bound[H : 2 * H], bound[2 * H :]
        input_forget = self.input_forget
        matmul, multiply, clip, tanh = np.matmul, np.multiply, np.clip, np.tanh
        for t in order:
            matmul(h, r_t, out=gates)
            gates += xw[t]
            if peep:
                multiply(p_i, c, out=tmp)
                gi += tmp
                multiply(p_f, c, out=tmp)
                gf += tmp
            if bound is not None:
                if peep:  # o is clipped once its peephole term is in
                    clip(gi, -b_i, b_i, out=gi)
                    clip(gfc, -b_fc, b_fc, out=gfc)
                else:
                    clip(gates, -bound, bound, out=gates)
            if fused and not peep:
                tanh(gates, out=gates)
                sig *= 0.5
                sig += 0.5
            else:
                f(gi, gi)
                f(gf, gf)
                g_act(gc, gc)
            if input_forget:
                np.subtract(1, gi, out=gf)
            # C_t = f ⊙ C_{t-1} + i ⊙ c
            multiply(gf, c, out=c_new)
            gc *= gi
            c_new += gc
            if peep:
                multiply(p_o, c_new, out=tmp)
                go += tmp
                if bound is not None:
                    clip(go, -b_o, b_o, out=go)
                f(go, go)
            elif not fused:
                f(go, go)
            h_act(c_new, tmp)
            h, c, c_new = _lstm_update(h, c, c_new, go, tmp, hn, None if masks is None else masks[t], Y[t])
        return (h, c)

    def _loop_default(self, xw, r_t, h, c, Y, forward):
        """:meth:`_loop` for the default activations without peepholes, clip,
        ``input_forget`` or ragged batches: the same operations, without the
        activation and update calls of the general loop, with operands of the step's
        own shape and each step's views taken from one ``zip``."""
        Bn, H = h.shape
        dt = h.dtype
        gates = np.empty((Bn, 4 * H), dt)
        gi, go, gf, gc = (gates[:, k * H : (k + 1) * H] for k in range(4))
        sig = gates[:, : 3 * H]
        half = np.full((Bn, 3 * H), 0.5, dt)  # the sigmoid gates' 0.5 * tanh + 0.5
        tmp = np.empty((Bn, H), dt)
        c_new = np.empty((Bn, H), dt)
        matmul, add, mul, tanh = np.matmul, np.add, np.multiply, np.tanh
        for x, y in _steps_of(forward, xw, Y):
            matmul(h, r_t, gates)
            add(gates, x, gates)
            tanh(gates, gates)
            mul(sig, half, sig)
            add(sig, half, sig)
            # C_t = f * C_{t-1} + i * c
            mul(gf, c, c_new)
            mul(gc, gi, gc)
            add(c_new, gc, c_new)
            tanh(c_new, tmp)
            h = mul(go, tmp, y)
            c, c_new = c_new, c
        return h, c
