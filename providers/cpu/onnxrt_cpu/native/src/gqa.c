/* The attention of com.microsoft GroupQueryAttention over its key/value cache, for
 * float32 (the common case of decoder-only language models: no bias, sink, soft cap
 * or Q/K norm; positions from the cache's length).
 *
 * One task per batch entry and key/value head: the cached rows copied into the
 * present cache, this step's keys rotated and appended, its values appended, the
 * rest zeroed; then each query row of each head of the group rotated, scored against
 * the keys it sees (causal, a local window, the entry's length), softmaxed and
 * applied to the values. The numpy path (onnxrt_cpu.kernels.contrib_gqa) does the
 * same in some forty array calls a node, which on a generation step's small arrays
 * cost more than the work. The Python side validates the inputs first. */
#include "native.h"
#include "vmath.h"

#include <math.h>

typedef struct {
    Py_ssize_t b, s, n, nkv, h, rot, cache, past_len, positions;
    /* element offsets of head 0 and row strides of the query, key and value rows */
    Py_ssize_t q_off, k_off, v_off, q_rs, k_rs, v_rs;
    int interleaved, window, causal;
    float scale;
    const float *q, *k, *v, *past_k, *past_v, *rot_c, *rot_s;
    const int64_t *starts, *lengths;
    float *present_k, *present_v, *out;
    int failed;
} gqa_job;

/* dst = src rotated at table row ``pos`` over the first ``rot`` values (x * C + swapped(x) * S,
 * swapped exchanging the halves, or each interleaved pair), the rest copied. */
static void gqa_rotate(const gqa_job *j, const float *src, float *dst, Py_ssize_t pos)
{
    const Py_ssize_t h = j->h, rot = j->rot, half = rot / 2;
    if (!j->rot_c) {
        memcpy(dst, src, (size_t)h * sizeof(float));
        return;
    }
    const float *c = j->rot_c + pos * rot, *sn = j->rot_s + pos * rot;
    for (Py_ssize_t i = 0; i < rot; i++) {
        float swapped = j->interleaved ? src[i ^ 1] : src[i < half ? i + half : i - half];
        float a = src[i] * c[i], b = swapped * sn[i];
        dst[i] = a + b;
    }
    for (Py_ssize_t i = rot; i < h; i++)
        dst[i] = src[i];
}

NATIVE_CLONES static void gqa_row(const gqa_job *j, const float *restrict q, const float *restrict keys,
                                  const float *restrict vals, Py_ssize_t lo, Py_ssize_t hi, float *restrict scores,
                                  float *restrict out)
{
    const Py_ssize_t h = j->h;
    for (Py_ssize_t i = 0; i < h; i++)
        out[i] = 0.0f;
    if (hi <= lo)
        return; /* a row that sees no key (a first prompt's padding): zeros */
    float top = -INFINITY;
    for (Py_ssize_t t = lo; t < hi; t++) {
        const float *kr = keys + t * h;
        float acc = 0.0f;
        for (Py_ssize_t i = 0; i < h; i++)
            acc += q[i] * kr[i];
        acc *= j->scale;
        scores[t - lo] = acc;
        top = acc > top ? acc : top;
    }
    float sum = 0.0f;
    for (Py_ssize_t t = 0; t < hi - lo; t++) {
        float e = exp_f32(scores[t] - top);
        scores[t] = e;
        sum += e;
    }
    const float inv = 1.0f / sum;
    for (Py_ssize_t t = lo; t < hi; t++) {
        const float p = scores[t - lo] * inv;
        const float *vr = vals + t * h;
        for (Py_ssize_t i = 0; i < h; i++)
            out[i] += p * vr[i];
    }
}

static void gqa_task(void *arg, Py_ssize_t task)
{
    gqa_job *j = arg;
    const Py_ssize_t e = task / j->nkv, kv = task % j->nkv, h = j->h, s = j->s;
    const Py_ssize_t groups = j->n / j->nkv, p0 = (Py_ssize_t)j->starts[e], len = (Py_ssize_t)j->lengths[e];
    float *pk = j->present_k + (e * j->nkv + kv) * j->cache * h;
    float *pv = j->present_v + (e * j->nkv + kv) * j->cache * h;
    Py_ssize_t kept = p0 < j->past_len ? p0 : j->past_len;
    if (kept) {
        memcpy(pk, j->past_k + (e * j->nkv + kv) * j->past_len * h, (size_t)(kept * h) * sizeof(float));
        memcpy(pv, j->past_v + (e * j->nkv + kv) * j->past_len * h, (size_t)(kept * h) * sizeof(float));
    }
    Py_ssize_t rows = j->cache - p0 < s ? j->cache - p0 : s;
    for (Py_ssize_t r = 0; r < rows; r++) {
        const Py_ssize_t at = (e * s + r);
        gqa_rotate(j, j->k + at * j->k_rs + j->k_off + kv * h, pk + (p0 + r) * h, p0 + r);
        memcpy(pv + (p0 + r) * h, j->v + at * j->v_rs + j->v_off + kv * h, (size_t)h * sizeof(float));
    }
    if (p0 + rows < j->cache) {
        memset(pk + (p0 + rows) * h, 0, (size_t)((j->cache - p0 - rows) * h) * sizeof(float));
        memset(pv + (p0 + rows) * h, 0, (size_t)((j->cache - p0 - rows) * h) * sizeof(float));
    }
    float *work = scratch(0, (size_t)(len + h) * sizeof(float));
    if (!work) {
        j->failed = 1;
        return;
    }
    float *qr = work + len;
    for (Py_ssize_t g = 0; g < groups; g++) {
        const Py_ssize_t head = kv * groups + g;
        for (Py_ssize_t r = 0; r < s; r++) {
            const Py_ssize_t at = (e * s + r);
            gqa_rotate(j, j->q + at * j->q_rs + j->q_off + head * h, qr, p0 + r);
            /* keys 0 .. len - 1; causal: up to the row's own position; a window: its last W */
            Py_ssize_t hi = len, lo = 0;
            if (j->causal) {
                Py_ssize_t own = p0 + r + 1;
                hi = own < hi ? own : hi;
                if (j->window > 0 && own - j->window > lo)
                    lo = own - j->window;
            }
            gqa_row(j, qr, pk, pv, lo, hi, work, j->out + (at * j->n + head) * h);
        }
    }
}

PyDoc_STRVAR(gqa_doc,
"gqa(q, k, v, offsets, past_k, past_v, present_k, present_v, out, rot_c, rot_s, starts, lengths,\n"
"    dims, threads)\n\n"
"GroupQueryAttention's cache update and attention for float32. offsets is (q_off, k_off,\n"
"v_off, q_rs, k_rs, v_rs): where head 0 of each starts in the rows of q, k and v (packed\n"
"QKV passes one array three times) and the row strides. past_k/past_v [B, nkv, past, H]\n"
"or None; present_k/present_v [B, nkv, cache, H] and out [B, S, N, H] are written.\n"
"rot_c/rot_s [positions, rot] are the rotation tables (x * C + swapped(x) * S) or None.\n"
"starts/lengths int64 [B]: an entry's first new position and its keys after the step.\n"
"dims is (b, s, n, nkv, h, rot, cache, past_len, positions, interleaved, window, causal,\n"
"scale). The caller has validated every shape and position. Runs on up to threads\n"
"threads, without the GIL.");

static PyObject *gqa(PyObject *self, PyObject *args)
{
    PyObject *qo, *ko, *vo, *pko, *pvo, *oko, *ovo, *outo, *co, *so, *sto, *leo;
    gqa_job j;
    memset(&j, 0, sizeof(j));
    int threads;
    double scale;
    if (!PyArg_ParseTuple(args, "OOO(nnnnnn)OOOOOOOOO(nnnnnnnnniiid)i:gqa", &qo, &ko, &vo, &j.q_off, &j.k_off,
                          &j.v_off, &j.q_rs, &j.k_rs, &j.v_rs, &pko, &pvo, &oko, &ovo, &outo, &co, &so, &sto, &leo,
                          &j.b, &j.s, &j.n, &j.nkv, &j.h, &j.rot, &j.cache, &j.past_len, &j.positions,
                          &j.interleaved, &j.window, &j.causal, &scale, &threads))
        return NULL;
    j.scale = (float)scale;
    if (j.b < 0 || j.s < 1 || j.n < 1 || j.nkv < 1 || j.n % j.nkv || j.h < 1 || j.rot < 0 || j.rot > j.h ||
        j.rot % 2 || j.cache < 0 || j.past_len < 0 || j.positions < 0 || j.q_off < 0 || j.k_off < 0 ||
        j.v_off < 0 || j.q_rs < 0 || j.k_rs < 0 || j.v_rs < 0) {
        PyErr_SetString(PyExc_ValueError, "gqa: invalid dimensions");
        return NULL;
    }
    const Py_ssize_t rows = j.b * j.s;
    nbuf q, k, v, pk, pv, ok, ov, out, c, sn, st, le;
    q.held = k.held = v.held = pk.held = pv.held = ok.held = ov.held = out.held = c.held = sn.held = st.held =
        le.held = 0;
    int rotary = co != Py_None;
    if (nb_get(qo, &q, 'f', 4, rows ? (rows - 1) * j.q_rs + j.q_off + j.n * j.h : 0, 0, 0, "gqa: q") < 0 ||
        nb_get(ko, &k, 'f', 4, rows ? (rows - 1) * j.k_rs + j.k_off + j.nkv * j.h : 0, 0, 0, "gqa: k") < 0 ||
        nb_get(vo, &v, 'f', 4, rows ? (rows - 1) * j.v_rs + j.v_off + j.nkv * j.h : 0, 0, 0, "gqa: v") < 0 ||
        nb_get(pko, &pk, 'f', 4, j.b * j.nkv * j.past_len * j.h, 0, 1, "gqa: past_k") < 0 ||
        nb_get(pvo, &pv, 'f', 4, j.b * j.nkv * j.past_len * j.h, 0, 1, "gqa: past_v") < 0 ||
        nb_get(oko, &ok, 'f', 4, j.b * j.nkv * j.cache * j.h, 1, 0, "gqa: present_k") < 0 ||
        nb_get(ovo, &ov, 'f', 4, j.b * j.nkv * j.cache * j.h, 1, 0, "gqa: present_v") < 0 ||
        nb_get(outo, &out, 'f', 4, rows * j.n * j.h, 1, 0, "gqa: out") < 0 ||
        (rotary && (nb_get(co, &c, 'f', 4, j.positions * j.rot, 0, 0, "gqa: rot_c") < 0 ||
                    nb_get(so, &sn, 'f', 4, j.positions * j.rot, 0, 0, "gqa: rot_s") < 0)) ||
        nb_get(sto, &st, 'i', 8, j.b, 0, 0, "gqa: starts") < 0 || nb_get(leo, &le, 'i', 8, j.b, 0, 0, "gqa: lengths") < 0)
        goto done;
    if ((j.past_len && (!pk.held || !pv.held))) {
        PyErr_SetString(PyExc_ValueError, "gqa: a past length without past_k and past_v");
        goto done;
    }
    j.starts = st.view.buf;
    j.lengths = le.view.buf;
    /* every read stays inside its buffer, whatever the caller checked */
    for (Py_ssize_t e = 0; e < j.b; e++) {
        int64_t p0 = j.starts[e], len = j.lengths[e];
        if (p0 < 0 || p0 > j.cache || len < 0 || len > j.cache || (rotary && p0 + j.s > j.positions)) {
            PyErr_Format(PyExc_ValueError, "gqa: entry %zd starts at %lld with %lld keys: outside the cache of %zd "
                         "or the rotation tables' %zd positions", e, (long long)p0, (long long)len, j.cache,
                         j.positions);
            goto done;
        }
    }
    j.q = q.view.buf;
    j.k = k.view.buf;
    j.v = v.view.buf;
    j.past_k = pk.held ? pk.view.buf : NULL;
    j.past_v = pv.held ? pv.view.buf : NULL;
    j.present_k = ok.view.buf;
    j.present_v = ov.view.buf;
    j.out = out.view.buf;
    j.rot_c = rotary ? c.view.buf : NULL;
    j.rot_s = rotary ? sn.view.buf : NULL;
    if (!rotary)
        j.rot = 0;
    Py_BEGIN_ALLOW_THREADS
    pool_run(gqa_task, &j, j.b * j.nkv, threads);
    Py_END_ALLOW_THREADS
    if (j.failed)
        PyErr_NoMemory();
done:
    nb_release(&q);
    nb_release(&k);
    nb_release(&v);
    nb_release(&pk);
    nb_release(&pv);
    nb_release(&ok);
    nb_release(&ov);
    nb_release(&out);
    nb_release(&c);
    nb_release(&sn);
    nb_release(&st);
    nb_release(&le);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

PyMethodDef gqa_methods[] = {
    {"gqa", gqa, METH_VARARGS, gqa_doc},
    {NULL, NULL, 0, NULL},
};
