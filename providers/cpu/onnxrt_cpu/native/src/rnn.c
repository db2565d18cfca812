/* The time loop of the float recurrent layers RNN, GRU and LSTM
 * (``onnxrt_cpu.kernels.rnn``) with their default activations: everything a step
 * does after the input projection (one GEMM over all steps, made in Python).
 *
 * A step is what the numpy loop's calls do, element by element, in the same order
 * and each operation rounded once: the recurrent product, ``+`` the input gates,
 * the sigmoid gates as ``0.5 * tanh + 0.5`` on inputs prescaled by 0.5 (the packed
 * weights are), the candidate's ``tanh``, the new cell and state, the outputs; with
 * ragged ``sequence_lens`` the rows past their length keep their state and output
 * zero (``h * 0``, as numpy's multiply by the mask), and the reverse direction runs
 * each row's valid steps backwards. ``tanh`` is numpy's own float32 algorithm where
 * the CPU runs the x86-64-v3 or v4 clones (AVX2 and FMA, as numpy's dispatch there),
 * else the C library's ``tanhf`` (numpy's there too); float64 takes the C library's
 * ``tanh``, within an ulp or two of numpy's SIMD one. The recurrent product is the
 * one operation summed in another order than numpy's BLAS call (a matrix-vector
 * product for one row, ``sgemm`` for more): here every column's sum runs over the
 * state's values in order, with fused multiply-adds, whatever the batch and the
 * threads, so results differ from the numpy loop's by the rounding of those sums
 * carried through the steps.
 *
 * Threads: each direction is a recurrence of its own; within one, a step's hidden
 * units split into parts (every part its columns of every gate), which need the
 * whole state of the step before: a step is then one job of the pool (two for GRU
 * without ``linear_before_reset``, whose candidate's product reads ``r * h`` of every
 * unit), and the state is double-buffered; where those jobs stall (the other core
 * taken by another process), the steps go on on the calling thread alone (see
 * rnn_split_steps). With one part per direction, each direction runs all its steps
 * as one task. */
#include "native.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

enum { RNN_KIND = 0, GRU_KIND = 1, LSTM_KIND = 2 };

/* Parts of a direction's units: at most RNN_MAX_PARTS, each at least RNN_MIN_UNITS
 * units (the parts start at multiples of 16, a float vector of the widest clone) and
 * RNN_MIN_WORK multiply-adds of the product a job of the pool (a step, or half of
 * one for GRU without linear_before_reset). A job costs about 0.3-0.4 us here;
 * batch-1 steps, one thread against two parts on two: LSTM of hidden size 96 (37K
 * multiply-adds) 1.82-2.15 -> 1.64-1.81 us, 256 12.1-13.6 -> 6.3-8.1; below, GRU of
 * 64 (12K) 0.90 -> 1.21, LSTM of 64 (16K) 0.96-1.17 -> 0.88-1.03, RNN of 128 (16K)
 * 0.75-0.88 -> 0.76: not worth it. */
#define RNN_MAX_PARTS 8
#define RNN_MIN_UNITS 32
#define RNN_MIN_WORK 16384.0

/* ---- the recurrent product ----------------------------------------------------- */

/* ``out[r, c] = sum_j x[r, j] w[j, c]`` for r < rows, c < cols, j < k: every sum a
 * chain of fused multiply-adds over j in order (defined before the pragma below,
 * which keeps every other multiplication and addition apart), whatever block the
 * column falls in, so a column's value does not depend on how the columns are
 * split among threads. ``x`` rows ``ldx`` apart, ``w`` rows ``ldw``, ``out`` rows
 * ``ldo``. Blocks of RB rows by VB vectors of columns: eight accumulators (4 x 2,
 * 2 x 4, 1 x 8) where the columns allow, as many products in flight as two
 * fused-multiply-add pipes of four cycles' latency take, and with AVX-512's 32
 * registers sixteen (8 x 2), which read the weights half as often (a batch of 8,
 * hidden size 256, LSTM: 70 -> 52 us a step; OpenBLAS's sgemm there 51-62, but for
 * one row, per gate block of 128 columns, 22 against 12); then fewer vectors, then
 * the last columns one by one. In vectors of the clone's width (see qlstm.c: GCC
 * splits a vector wider than the registers poorly). */
#define RNN_BLOCK(RB, VB)                                                                                            \
    do {                                                                                                             \
        vec acc_[RB][VB];                                                                                            \
        for (int i_ = 0; i_ < RB; i_++)                                                                              \
            for (int v_ = 0; v_ < VB; v_++)                                                                          \
                acc_[i_][v_] = (vec){0};                                                                             \
        for (Py_ssize_t j = 0; j < k; j++) {                                                                         \
            const elem *wj = w + j * ldw + c;                                                                        \
            for (int v_ = 0; v_ < VB; v_++) {                                                                        \
                const vec u = *(const vec *)(wj + v_ * L);                                                           \
                for (int i_ = 0; i_ < RB; i_++)                                                                      \
                    acc_[i_][v_] += x[(r + i_) * ldx + j] * u;                                                       \
            }                                                                                                        \
        }                                                                                                            \
        for (int i_ = 0; i_ < RB; i_++)                                                                              \
            for (int v_ = 0; v_ < VB; v_++)                                                                          \
                *(vec *)(out + (r + i_) * ldo + c + v_ * L) = acc_[i_][v_];                                          \
        c += VB * L;                                                                                                 \
    } while (0)

#define RNN_TAIL(RB)                                                                                                 \
    for (; c < cols; c++)                                                                                            \
        for (int i_ = 0; i_ < RB; i_++) {                                                                            \
            elem s_ = 0;                                                                                             \
            for (Py_ssize_t j = 0; j < k; j++)                                                                       \
                s_ += x[(r + i_) * ldx + j] * w[j * ldw + c];                                                        \
            out[(r + i_) * ldo + c] = s_;                                                                            \
        }

#define RNN_PRODUCT(NAME, T, BYTES)                                                                                  \
    typedef T NAME##_vec __attribute__((vector_size(BYTES), aligned(sizeof(T))));                                    \
    NATIVE_CLONES static void NAME(const T *restrict x, Py_ssize_t ldx, Py_ssize_t rows, Py_ssize_t k,               \
                                   const T *restrict w, Py_ssize_t ldw, Py_ssize_t cols, T *restrict out,            \
                                   Py_ssize_t ldo)                                                                   \
    {                                                                                                                \
        typedef NAME##_vec vec;                                                                                      \
        typedef T elem;                                                                                              \
        const Py_ssize_t L = BYTES / sizeof(T);                                                                      \
        Py_ssize_t r = 0, c;                                                                                         \
        if (BYTES == 64)                                                                                             \
            for (; r + 8 <= rows; r += 8) {                                                                          \
                for (c = 0; c + 2 * L <= cols;)                                                                      \
                    RNN_BLOCK(8, 2);                                                                                 \
                if (c + L <= cols)                                                                                   \
                    RNN_BLOCK(8, 1);                                                                                 \
                RNN_TAIL(8)                                                                                          \
            }                                                                                                        \
        for (; r + 4 <= rows; r += 4) {                                                                              \
            for (c = 0; c + 2 * L <= cols;)                                                                          \
                RNN_BLOCK(4, 2);                                                                                     \
            if (c + L <= cols)                                                                                       \
                RNN_BLOCK(4, 1);                                                                                     \
            RNN_TAIL(4)                                                                                              \
        }                                                                                                            \
        for (; r + 2 <= rows; r += 2) {                                                                              \
            for (c = 0; c + 4 * L <= cols;)                                                                          \
                RNN_BLOCK(2, 4);                                                                                     \
            if (c + 2 * L <= cols)                                                                                   \
                RNN_BLOCK(2, 2);                                                                                     \
            if (c + L <= cols)                                                                                       \
                RNN_BLOCK(2, 1);                                                                                     \
            RNN_TAIL(2)                                                                                              \
        }                                                                                                            \
        for (; r < rows; r++) {                                                                                      \
            for (c = 0; c + 8 * L <= cols;)                                                                          \
                RNN_BLOCK(1, 8);                                                                                     \
            if (c + 4 * L <= cols)                                                                                   \
                RNN_BLOCK(1, 4);                                                                                     \
            if (c + 2 * L <= cols)                                                                                   \
                RNN_BLOCK(1, 2);                                                                                     \
            if (c + L <= cols)                                                                                       \
                RNN_BLOCK(1, 1);                                                                                     \
            RNN_TAIL(1)                                                                                              \
        }                                                                                                            \
    }

RNN_PRODUCT(rnn_product_f32_64, float, 64)
RNN_PRODUCT(rnn_product_f32_32, float, 32)
RNN_PRODUCT(rnn_product_f32_16, float, 16)
RNN_PRODUCT(rnn_product_f64_64, double, 64)
RNN_PRODUCT(rnn_product_f64_32, double, 32)
RNN_PRODUCT(rnn_product_f64_16, double, 16)

typedef void (*rnn_product_f32_fn)(const float *, Py_ssize_t, Py_ssize_t, Py_ssize_t, const float *, Py_ssize_t,
                                   Py_ssize_t, float *, Py_ssize_t);
typedef void (*rnn_product_f64_fn)(const double *, Py_ssize_t, Py_ssize_t, Py_ssize_t, const double *, Py_ssize_t,
                                   Py_ssize_t, double *, Py_ssize_t);

/* From here on a product and a sum are two operations, each rounded, as numpy's
 * calls compute them (no contraction into fused multiply-adds; the fused ones of
 * numpy's tanh are written as fmaf), and no floating-point exception is looked at,
 * which lets GCC turn tanh's selects into vector blends; see qlstm.c. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off", "no-trapping-math")
#endif

#include "npymath.h"

#define RN_INLINE NPY_INLINE

RN_INLINE void rn_tanh_f64(int numpy_math, const double *x, double *y, Py_ssize_t n, double *restrict coef)
{
    (void)numpy_math;
    (void)coef;
    for (Py_ssize_t i = 0; i < n; i++)
        y[i] = tanh(x[i]);
}

/* ---- the time loop --------------------------------------------------------------- */

typedef struct {
    int kind, lbr;
    const void *xw;      /* [seq, batch, dirs, G H]: the input gates (projection and biases) */
    const void *r[2];    /* per direction [H, G H]: the recurrent weights, transposed */
    const void *rbh;     /* GRU with linear_before_reset: [dirs, H], else NULL */
    const void *peep;    /* LSTM: [dirs, 3 H] (i, o, f; prescaled) or NULL */
    const int64_t *lens; /* [batch] or NULL */
    void *y;             /* [seq, dirs, batch, H] */
    void *hbuf;          /* [2, dirs, batch, H]: the state step t reads at t % 2 */
    void *c;             /* LSTM: [dirs, batch, H] the cell, in place */
    void *z, *rh;        /* GRU without linear_before_reset: [dirs, batch, H] z and r * h of a step */
    Py_ssize_t seq, batch, dirs, hid, gates, parts;
    Py_ssize_t bounds[RNN_MAX_PARTS + 1]; /* the parts' first units, and H */
    Py_ssize_t t;                         /* the step of a job of parts */
    int phase;                            /* GRU without linear_before_reset: 0 z and r, 1 the rest */
    int reversed, numpy_math, failed;
    rnn_product_f32_fn product_f32;
    rnn_product_f64_fn product_f64;
} rnn_job;

#define T float
#define SFX(name) name##_f32
#define RN_TANH npy_tanh_of
#define RN_PRODUCT product_f32
#include "rnn_body.h"
#undef T
#undef SFX
#undef RN_TANH
#undef RN_PRODUCT

#define T double
#define SFX(name) name##_f64
#define RN_TANH rn_tanh_f64
#define RN_PRODUCT product_f64
#include "rnn_body.h"
#undef T
#undef SFX
#undef RN_TANH
#undef RN_PRODUCT

/* Every step of direction ``d``, all its units one part. */
static void rnn_direction_task(void *arg, Py_ssize_t d)
{
    rnn_job *j = arg;
    const int two = j->kind == GRU_KIND && !j->lbr;
    for (Py_ssize_t t = 0; t < j->seq; t++)
        for (int phase = 0; phase <= two; phase++) {
            if (j->product_f32)
                rnn_part_f32(j, d, 0, t, phase);
            else
                rnn_part_f64(j, d, 0, t, phase);
        }
}

/* Part ``i % parts`` of direction ``i / parts`` at the job's step and phase. */
static void rnn_part_task(void *arg, Py_ssize_t i)
{
    rnn_job *j = arg;
    if (j->product_f32)
        rnn_part_f32(j, i / j->parts, i % j->parts, j->t, j->phase);
    else
        rnn_part_f64(j, i / j->parts, i % j->parts, j->t, j->phase);
}

/* How many parts each direction's units split into on ``threads`` threads: the
 * directions first (each runs all its steps as one task), then the units where each
 * part keeps enough work. */
static Py_ssize_t rnn_parts(const rnn_job *j, int threads)
{
    Py_ssize_t parts = threads / j->dirs;
    parts = parts < 1 ? 1 : parts > RNN_MAX_PARTS ? RNN_MAX_PARTS : parts;
    /* GRU without linear_before_reset makes two jobs a step */
    const double jobs = j->kind == GRU_KIND && !j->lbr ? 2.0 : 1.0;
    const double work = (double)j->batch * (double)j->gates * (double)j->hid * (double)j->hid / jobs;
    while (parts > 1 && (j->hid / parts < RNN_MIN_UNITS || work / (double)parts < RNN_MIN_WORK))
        parts--;
    return parts;
}

/* ---- the steps of a split direction, and the cores taken away ------------------ */

/* Calls whose parts run on the calling thread alone before the split is tried
 * again, and the length of the last such pause (0: the last try went through). */
static _Atomic int rnn_pause_left, rnn_pause;

#define RNN_STALL_US 40.0 /* a job late by this much more than 4x the step's best */
#define RNN_STALLS 2      /* stalls in a call that end its split */
#define RNN_PAUSE_MIN 8
#define RNN_PAUSE_MAX 512

static double rnn_now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

/* Every step as jobs of the pool, the parts shared among ``threads`` threads. A job
 * waits for its slowest part, so a worker the OS takes off its core delays every
 * step: with another process busy on the other core of this 2-core machine (and
 * onnxruntime's runs alternating), a batch-1 GRU of hidden size 256 took 3.9-5.1 ms
 * a run against 1.8-1.9 on one thread, its steps 80-250 us now and then (a dozen
 * or more a call) where 5 is usual. Steps are alike, so a job that takes
 * RNN_STALL_US more than four times the fastest of the call (or than a step's
 * estimate on one thread, before one is fast; the first job, which wakes the worker,
 * aside) is a stall; after RNN_STALLS the call's remaining steps run on the calling
 * thread alone (the same values: a part's do not depend on which thread computes
 * it), and so do the next calls' (RNN_PAUSE_MIN of them, twice as many after each
 * try that stalls again, up to RNN_PAUSE_MAX). So loaded, the GRU then took 2.0-2.1
 * ms (one thread 1.9-2.3) and the LSTM 2.2-2.7 (one thread 3.1-3.5); on a quiet
 * machine about one step in 500 past the first takes more than 45 us, and two in a
 * call are rare. */
static void rnn_split_steps(rnn_job *j, int threads)
{
    const int two = j->kind == GRU_KIND && !j->lbr;
    const Py_ssize_t jobs = j->dirs * j->parts;
    if (atomic_load_explicit(&rnn_pause_left, memory_order_relaxed) > 0) {
        atomic_fetch_sub_explicit(&rnn_pause_left, 1, memory_order_relaxed);
        threads = 1;
    }
    /* a step's time on one thread at 10 multiply-adds a nanosecond (20-40 measured),
     * until the call's own steps tell */
    double best = (double)j->batch * (double)j->gates * (double)j->hid * (double)j->hid / (two ? 2.0 : 1.0) / 1e4;
    int stalls = 0;
    for (Py_ssize_t t = 0; t < j->seq; t++)
        for (int phase = 0; phase <= two; phase++) {
            j->t = t;
            j->phase = phase;
            if (threads == 1) {
                pool_run(rnn_part_task, j, jobs, 1);
                continue;
            }
            const double t0 = rnn_now_us();
            pool_run(rnn_part_task, j, jobs, threads);
            const double dt = rnn_now_us() - t0;
            if (t == 0)
                continue;
            if (dt > 4.0 * best + RNN_STALL_US && ++stalls == RNN_STALLS) {
                int pause = atomic_load_explicit(&rnn_pause, memory_order_relaxed) * 2;
                pause = pause < RNN_PAUSE_MIN ? RNN_PAUSE_MIN : pause > RNN_PAUSE_MAX ? RNN_PAUSE_MAX : pause;
                atomic_store_explicit(&rnn_pause, pause, memory_order_relaxed);
                atomic_store_explicit(&rnn_pause_left, pause, memory_order_relaxed);
                threads = 1;
            }
            best = dt < best ? dt : best;
        }
    if (threads > 1 && j->seq > 8)
        atomic_store_explicit(&rnn_pause, 0, memory_order_relaxed);
}

PyDoc_STRVAR(rnn_steps_doc,
"rnn_steps(kind, lbr, xw, r, rbh, peep, h, c, lens, reversed, y, (seq, batch, dirs, hid),\n"
"          threads)\n\n"
"The time loop of RNN (kind 0), GRU (1) and LSTM (2) with the default activations\n"
"(tanh; sigmoid and tanh; sigmoid, tanh and tanh), every direction at once, float32 or\n"
"float64 (all alike), C-contiguous. xw [seq, batch, dirs, G H]: the input projection\n"
"with the biases folded in (G gates; the sigmoid gates' columns, like the weights,\n"
"prescaled by 0.5); r a sequence of dirs arrays [H, G H], the recurrent weights\n"
"transposed (prescaled alike); rbh [dirs, H]: GRU's recurrent candidate bias where lbr\n"
"(linear_before_reset), else None; peep [dirs, 3 H] (i, o, f; prescaled) or None: LSTM's\n"
"peepholes; h [dirs, batch, H] the initial state, c the initial cell (LSTM, else None),\n"
"both updated to each row's last valid step; lens [batch] int64 (ragged lengths) or None;\n"
"the directions whose bit is set in reversed run backwards over each row's valid steps;\n"
"y [seq, dirs, batch, H] (written; zero past a row's length). Each direction's hidden\n"
"units split over up to threads threads, without the GIL.");

static PyObject *rnn_steps(PyObject *self, PyObject *args)
{
    PyObject *xwo, *ro, *rbho, *peepo, *ho, *co, *lenso, *yo;
    rnn_job j;
    int threads;
    memset(&j, 0, sizeof j);
    if (!PyArg_ParseTuple(args, "ipOOOOOOOiO(nnnn)i:rnn_steps", &j.kind, &j.lbr, &xwo, &ro, &rbho, &peepo, &ho, &co,
                          &lenso, &j.reversed, &yo, &j.seq, &j.batch, &j.dirs, &j.hid, &threads))
        return NULL;
    if (j.kind < RNN_KIND || j.kind > LSTM_KIND) {
        PyErr_Format(PyExc_ValueError, "rnn_steps: unknown kind %d (0 RNN, 1 GRU, 2 LSTM)", j.kind);
        return NULL;
    }
    j.gates = j.kind == LSTM_KIND ? 4 : j.kind == GRU_KIND ? 3 : 1;
    if (j.seq < 0 || j.batch < 1 || j.dirs < 1 || j.dirs > 2 || j.hid < 1 || j.hid > PY_SSIZE_T_MAX / 64 / j.hid ||
        j.seq + 2 > PY_SSIZE_T_MAX / 64 / j.dirs / j.batch / j.hid) {
        PyErr_SetString(PyExc_ValueError, "rnn_steps: invalid sizes (seq >= 0, batch >= 1, dirs 1 or 2, hid >= 1)");
        return NULL;
    }
    if (j.reversed < 0 || j.reversed >= (1 << j.dirs)) {
        PyErr_Format(PyExc_ValueError, "rnn_steps: reversed %d names a direction past %zd", j.reversed, j.dirs);
        return NULL;
    }
    if (j.lbr && j.kind != GRU_KIND) {
        PyErr_SetString(PyExc_ValueError, "rnn_steps: lbr (linear_before_reset) is GRU's");
        return NULL;
    }
    if ((rbho != Py_None) != (j.kind == GRU_KIND && j.lbr)) {
        PyErr_SetString(PyExc_ValueError, "rnn_steps: rbh is given for GRU with lbr, and only then");
        return NULL;
    }
    if (peepo != Py_None && j.kind != LSTM_KIND) {
        PyErr_SetString(PyExc_ValueError, "rnn_steps: peep is LSTM's");
        return NULL;
    }
    if ((co != Py_None) != (j.kind == LSTM_KIND)) {
        PyErr_SetString(PyExc_ValueError, "rnn_steps: c is given for LSTM, and only then");
        return NULL;
    }
    PyObject *rs = PySequence_Fast(ro, "rnn_steps: r must be a sequence of arrays, one per direction");
    if (!rs)
        return NULL;
    if (PySequence_Fast_GET_SIZE(rs) != j.dirs) {
        PyErr_Format(PyExc_ValueError, "rnn_steps: r holds %zd arrays for %zd directions",
                     PySequence_Fast_GET_SIZE(rs), j.dirs);
        Py_DECREF(rs);
        return NULL;
    }
    const Py_ssize_t itemsize = nb_float_size(xwo, "rnn_steps: xw");
    if (itemsize < 0) {
        Py_DECREF(rs);
        return NULL;
    }
    const Py_ssize_t H = j.hid, GH = j.gates * H, state = j.dirs * j.batch * H;
    nbuf xw, r[2], rbh, peep, h, c, lens, y;
    xw.held = r[0].held = r[1].held = rbh.held = peep.held = h.held = c.held = lens.held = y.held = 0;
    void *work = NULL;
    if (nb_get(xwo, &xw, 'f', itemsize, j.seq * j.batch * j.dirs * GH, 0, 0, "rnn_steps: xw") < 0)
        goto done;
    for (Py_ssize_t d = 0; d < j.dirs; d++)
        if (nb_get(PySequence_Fast_GET_ITEM(rs, d), &r[d], 'f', itemsize, H * GH, 0, 0, "rnn_steps: r") < 0)
            goto done;
    if (nb_get(rbho, &rbh, 'f', itemsize, j.dirs * H, 0, 1, "rnn_steps: rbh") < 0 ||
        nb_get(peepo, &peep, 'f', itemsize, j.dirs * 3 * H, 0, 1, "rnn_steps: peep") < 0 ||
        nb_get(ho, &h, 'f', itemsize, state, 1, 0, "rnn_steps: h") < 0 ||
        nb_get(co, &c, 'f', itemsize, state, 1, 1, "rnn_steps: c") < 0 ||
        nb_get(lenso, &lens, 'i', 8, j.batch, 0, 1, "rnn_steps: lens") < 0 ||
        nb_get(yo, &y, 'f', itemsize, j.seq * state, 1, 0, "rnn_steps: y") < 0)
        goto done;
    j.lens = lens.held ? lens.view.buf : NULL;
    for (Py_ssize_t i = 0; j.lens && i < j.batch; i++)
        if (j.lens[i] < 0 || j.lens[i] > j.seq) {
            PyErr_Format(PyExc_ValueError, "rnn_steps: lens[%zd] = %lld lies outside [0, %zd]", i,
                         (long long)j.lens[i], j.seq);
            goto done;
        }
    /* the double-buffered state, and GRU's z and r * h where its step has two phases */
    const int two = j.kind == GRU_KIND && !j.lbr;
    work = malloc((size_t)((2 + 2 * two) * state) * (size_t)itemsize);
    if (!work) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(work, h.view.buf, (size_t)(state * itemsize));
    j.hbuf = work;
    j.z = two ? (char *)work + 2 * state * itemsize : NULL;
    j.rh = two ? (char *)work + 3 * state * itemsize : NULL;
    j.xw = xw.view.buf;
    for (Py_ssize_t d = 0; d < j.dirs; d++)
        j.r[d] = r[d].view.buf;
    j.rbh = rbh.held ? rbh.view.buf : NULL;
    j.peep = peep.held ? peep.view.buf : NULL;
    j.c = c.held ? c.view.buf : NULL;
    j.y = y.view.buf;
    {
        const int level = npy_clone_level();
        j.numpy_math = level >= 3;
        if (itemsize == 4)
            j.product_f32 = level == 4 ? rnn_product_f32_64 : level == 3 ? rnn_product_f32_32 : rnn_product_f32_16;
        else
            j.product_f64 = level == 4 ? rnn_product_f64_64 : level == 3 ? rnn_product_f64_32 : rnn_product_f64_16;
    }
    j.parts = rnn_parts(&j, threads);
    for (Py_ssize_t p = 0; p < j.parts; p++)
        j.bounds[p] = (H * p / j.parts) / 16 * 16;
    j.bounds[j.parts] = H;
    Py_BEGIN_ALLOW_THREADS
    if (j.parts == 1)
        pool_run(rnn_direction_task, &j, j.dirs, threads);
    else
        rnn_split_steps(&j, threads);
    Py_END_ALLOW_THREADS
    if (j.failed)
        PyErr_NoMemory();
    else
        memcpy(h.view.buf, (char *)work + (j.seq & 1) * state * itemsize, (size_t)(state * itemsize));
done:
    free(work);
    Py_DECREF(rs);
    nb_release(&xw);
    nb_release(&r[0]);
    nb_release(&r[1]);
    nb_release(&rbh);
    nb_release(&peep);
    nb_release(&h);
    nb_release(&c);
    nb_release(&lens);
    nb_release(&y);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

PyMethodDef rnn_methods[] = {
    {"rnn_steps", rnn_steps, METH_VARARGS, rnn_steps_doc},
    {NULL, NULL, 0, NULL},
};
