/* One step of the recurrent layers for one element type: included by rnn.c once per
 * type with T, SFX(name), RN_TANH (tanh over a run of values) and RN_PRODUCT (the
 * job's product of that type) defined. Every line computes what the numpy loop of
 * onnxrt_cpu.kernels.rnn computes, in its order (noted where it matters). */

/* Step ``t`` of direction ``d`` for the units of part ``p``: their columns of every
 * gate, the state of step t read whole (the product), their state and outputs
 * written. GRU without linear_before_reset runs in two phases: 0 the gates z and r
 * (z and r * h kept in the job), 1 the candidate, whose product reads r * h of every
 * unit. */
NATIVE_CLONES static void SFX(rnn_part)(rnn_job *j, Py_ssize_t d, Py_ssize_t p, Py_ssize_t t, int phase)
{
    const Py_ssize_t H = j->hid, B = j->batch, D = j->dirs, S = j->seq, GH = j->gates * H;
    const Py_ssize_t u0 = j->bounds[p], U = j->bounds[p + 1] - u0;
    const int kind = j->kind, rev = (j->reversed >> d) & 1, math = j->numpy_math;
    const int two = kind == GRU_KIND && !j->lbr;
    const T *w = (const T *)j->r[d];
    const T *hc = (const T *)j->hbuf + ((t & 1) * D + d) * B * H; /* the state step t reads */
    T *hx = (T *)j->hbuf + ((~t & 1) * D + d) * B * H;            /* the one it writes */
    /* the part's gates [B, blocks U]; a row's new cell, tanh of it and new state;
     * tanh's coefficients */
    const Py_ssize_t blocks = two ? (phase ? 1 : 2) : j->gates;
    T *acc = scratch(0, (size_t)(B * blocks * U) * sizeof(T));
    T *row = scratch(1, (size_t)(3 * U) * sizeof(T));
    T *coef = scratch(2, (size_t)(8 * 4 * U) * sizeof(T));
    if (!acc || !row || !coef) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    T *cn = row, *th = row + U, *hn = row + 2 * U;
    const T half = (T)0.5;

    /* the recurrent product: h @ R's columns of the part's units in each gate block
     * (phase 1: r * h @ the candidate's) */
    if (two && phase)
        j->RN_PRODUCT((const T *)j->rh + d * B * H, H, B, H, w + 2 * H + u0, GH, U, acc, U);
    else
        for (Py_ssize_t g = 0; g < blocks; g++)
            j->RN_PRODUCT(hc, H, B, H, w + g * H + u0, GH, U, acc + g * U, blocks * U);

    for (Py_ssize_t b = 0; b < B; b++) {
        const Py_ssize_t len = j->lens ? (Py_ssize_t)j->lens[b] : S;
        const int active = t < len;
        const Py_ssize_t ts = rev && active ? len - 1 - t : t; /* the row's time step */
        const T *x = (const T *)j->xw + ((ts * B + b) * D + d) * GH + u0; /* gate g's at x + g H */
        const T *h = hc + b * H + u0;
        T *a = acc + b * blocks * U;
        T *out = (T *)j->y + ((ts * D + d) * B + b) * H + u0;
        T *hnext = hx + b * H + u0;

        if (kind == LSTM_KIND) {
            T *gi = a, *go = a + U, *gf = a + 2 * U, *gc = a + 3 * U;
            T *cell = (T *)j->c + (d * B + b) * H + u0;
            for (Py_ssize_t g = 0; g < 4; g++)
                for (Py_ssize_t k = 0; k < U; k++)
                    a[g * U + k] = a[g * U + k] + x[g * H + k];
            const T *pe = j->peep ? (const T *)j->peep + d * 3 * H + u0 : NULL;
            if (!pe) {
                /* one tanh over the four gates; the sigmoid ones 0.5 * tanh + 0.5 */
                RN_TANH(math, a, a, 4 * U, coef);
                for (Py_ssize_t k = 0; k < 3 * U; k++) {
                    const T v = a[k] * half;
                    a[k] = v + half;
                }
            } else {
                /* i and f take their peepholes on the cell before, o on the new one */
                for (Py_ssize_t k = 0; k < U; k++) {
                    const T v = pe[k] * cell[k];
                    gi[k] = gi[k] + v;
                }
                for (Py_ssize_t k = 0; k < U; k++) {
                    const T v = pe[2 * H + k] * cell[k];
                    gf[k] = gf[k] + v;
                }
                RN_TANH(math, gi, gi, U, coef);
                RN_TANH(math, gf, gf, 2 * U, coef); /* f and c */
                for (Py_ssize_t k = 0; k < U; k++) {
                    T v = gi[k] * half;
                    gi[k] = v + half;
                    v = gf[k] * half;
                    gf[k] = v + half;
                }
            }
            /* C_t = f * C_{t-1} + i * c */
            for (Py_ssize_t k = 0; k < U; k++) {
                const T fc = gf[k] * cell[k];
                const T ic = gc[k] * gi[k];
                cn[k] = fc + ic;
            }
            if (pe) {
                for (Py_ssize_t k = 0; k < U; k++) {
                    const T v = pe[H + k] * cn[k];
                    go[k] = go[k] + v;
                }
                RN_TANH(math, go, go, U, coef);
                for (Py_ssize_t k = 0; k < U; k++) {
                    const T v = go[k] * half;
                    go[k] = v + half;
                }
            }
            RN_TANH(math, cn, th, U, coef);
            for (Py_ssize_t k = 0; k < U; k++)
                hn[k] = go[k] * th[k];
            if (active)
                for (Py_ssize_t k = 0; k < U; k++)
                    cell[k] = cn[k];
        } else if (kind == GRU_KIND) {
            T *z = two ? (T *)j->z + (d * B + b) * H + u0 : a;
            if (!two || phase == 0) {
                /* z and r: 0.5 * tanh + 0.5 */
                for (Py_ssize_t k = 0; k < U; k++)
                    a[k] = a[k] + x[k];
                for (Py_ssize_t k = 0; k < U; k++)
                    a[U + k] = a[U + k] + x[H + k];
                RN_TANH(math, a, a, 2 * U, coef);
                for (Py_ssize_t k = 0; k < 2 * U; k++) {
                    const T v = a[k] * half;
                    a[k] = v + half;
                }
            }
            if (two && phase == 0) {
                /* z kept, and r * h for the candidate's product */
                T *rh = (T *)j->rh + (d * B + b) * H + u0;
                for (Py_ssize_t k = 0; k < U; k++) {
                    z[k] = a[k];
                    rh[k] = a[U + k] * h[k];
                }
                continue;
            }
            T *hh = two ? a : a + 2 * U;
            const T *xh = x + 2 * H;
            if (two) {
                for (Py_ssize_t k = 0; k < U; k++)
                    hh[k] = hh[k] + xh[k];
            } else {
                /* r * (h @ Rh + Rbh) + the input's */
                const T *rbh = (const T *)j->rbh + d * H + u0, *r = a + U;
                for (Py_ssize_t k = 0; k < U; k++) {
                    T v = hh[k] + rbh[k];
                    v = v * r[k];
                    hh[k] = v + xh[k];
                }
            }
            RN_TANH(math, hh, hh, U, coef);
            /* H_t = h~ + z * (H_{t-1} - h~) */
            for (Py_ssize_t k = 0; k < U; k++) {
                T v = h[k] - hh[k];
                v = v * z[k];
                hn[k] = hh[k] + v;
            }
        } else {
            for (Py_ssize_t k = 0; k < U; k++)
                a[k] = a[k] + x[k];
            RN_TANH(math, a, hn, U, coef);
        }

        /* a row past its length keeps its state and outputs h * 0 */
        if (active) {
            for (Py_ssize_t k = 0; k < U; k++) {
                hnext[k] = hn[k];
                out[k] = hn[k];
            }
        } else {
            for (Py_ssize_t k = 0; k < U; k++) {
                hnext[k] = h[k];
                out[k] = hn[k] * (T)0;
            }
        }
    }
}
