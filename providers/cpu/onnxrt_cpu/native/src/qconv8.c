/* QLinearConv by 8-bit products on AVX-512 VNNI (vpdpbusd: 64 unsigned by signed byte
 * pairs summed in fours into 16 int32 lanes), where qconv2d (conv.c) multiplies the
 * centred values in float32 through BLAS.
 *
 * Each task takes an image, a group and a chunk of output positions. It gathers the
 * chunk's im2col as bytes, four k next to each other for every position
 * ([K/4][positions][4], the layout vpdpbusd reads: one 64-byte load is 16 positions'
 * four k), with the input as it is stored (int8 input shifted to uint8) and the
 * spatial padding as the input's zero point. Then for every block of 8 output
 * channels and 32 positions it broadcasts each channel's four weights (int8; uint8
 * weights shifted by -128 at packing) against the two vectors of positions, 16
 * int32 accumulators in registers, and finishes the tile while it is in registers:
 *
 *   sum (x - zx)(w - zw) = sum x w - zw sum x - zx sum w + K zx zw
 *
 * (the last two terms one constant a channel, ``sum x`` one count a position, taken
 * only where some zw is not 0), converted to float32, plus the bias, times the scale
 * ratio, rounded half to even, plus the output's zero point, saturated to 8 bits:
 * the operations and the order of requantize_row (requant.h), so the output is
 * qconv2d's bit for bit within the same exactness check (every partial sum below
 * 2**24, which the caller makes).
 */
#include "native.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#if VNNI_BUILT
#include <immintrin.h>
#endif

/* Output channels and positions of one register tile. */
#define Q8_MR 8
#define Q8_NR 32

typedef struct {
    Py_ssize_t n, c, h, w, m, groups, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow;
    const uint8_t *x;
    int x_signed, y_signed;
    uint8_t zx;              /* the input's zero point in the uint8 domain */
    const int8_t *wt;        /* [m, kp]: kp = 4 * k4, zero beyond k */
    const int32_t *zw;       /* [m]: each channel's weight zero point in the int8 domain */
    int zw_any;              /* some zw is not 0: the positions' sums are needed */
    const int32_t *colterm;  /* [m]: K zx zw - zx sum w */
    const float *bias;       /* [m] or NULL */
    const float *mult;       /* [1] or [m] */
    Py_ssize_t mult_n;
    float yzp;
    int y_i32;               /* ConvInteger: the int32 sums out, not requantized */
    int y_f32;               /* its float32 product: float(sum) * mult + bias, Relu'd where relu */
    int relu;
    void *y;
    Py_ssize_t k, k4, cg, mg, L, chunk, chunks;
    int failed;
} q8_job;

#if VNNI_BUILT

/* ``n`` bytes of ``v`` at ``d``, and up to 63 bytes after them: a row is written left
 * to right, each run's spill overwritten by the next, into buffers 64 bytes longer
 * than the row (masked byte stores are slow on some CPUs, and a load of the bytes
 * just stored waits for them; the runs are often a map's width, a few bytes). */
VNNI_TARGET static inline void q8_fill(uint8_t *d, Py_ssize_t n, __m512i v)
{
    for (; n > 0; n -= 64, d += 64)
        _mm512_storeu_si512(d, v);
}

/* Where output column ox of tap column kx reads inside the map: ja <= ox < jb, at
 * input column ox * sw + ix0. */
typedef struct {
    Py_ssize_t ix0, ja, jb;
} q8_span;

static q8_span q8_span_of(const q8_job *j, Py_ssize_t kx)
{
    q8_span t;
    const Py_ssize_t sw = j->sw, w = j->w;
    t.ix0 = kx * j->dw - j->pl;
    Py_ssize_t ja = t.ix0 >= 0 ? 0 : (-t.ix0 + sw - 1) / sw;
    Py_ssize_t jb = t.ix0 >= w ? 0 : (w - 1 - t.ix0) / sw + 1;
    ja = ja > j->ow ? j->ow : ja;
    jb = jb > j->ow ? j->ow : jb < ja ? ja : jb;
    t.ja = ja;
    t.jb = jb;
    return t;
}

/* Positions from (oy, ox) on, ``len`` of them, of the input row of channel plane
 * ``plane`` and tap (ky, span) as bytes into ``d``: int8 input shifted to uint8, taps
 * in the padding the zero point. No division here: a layer of a small map runs this
 * for every one of its K rows and every chunk. */
VNNI_TARGET static void q8_gather_row(const q8_job *j, const uint8_t *plane, Py_ssize_t ky, const q8_span *span,
                                    Py_ssize_t oy, Py_ssize_t ox, Py_ssize_t len, uint8_t *restrict d)
{
    const Py_ssize_t sw = j->sw, w = j->w, ix0 = span->ix0, ja = span->ja, jb = span->jb;
    const __m512i flip = _mm512_set1_epi8(j->x_signed ? (char)0x80 : 0), pad = _mm512_set1_epi8((char)j->zx);
    Py_ssize_t left = len;
    Py_ssize_t iy = oy * j->sh - j->pt + ky * j->dh;
    while (left > 0) {
        const Py_ssize_t n = j->ow - ox < left ? j->ow - ox : left, end = ox + n;
        if (iy < 0 || iy >= j->h) {
            q8_fill(d, n, pad);
        } else {
            const Py_ssize_t a = ja > ox ? (ja < end ? ja : end) : ox, b = jb < end ? (jb > a ? jb : a) : end;
            q8_fill(d, a - ox, pad);
            const uint8_t *src = plane + iy * w + a * sw + ix0;
            uint8_t *dst = d + (a - ox);
            Py_ssize_t m = b - a;
            if (sw == 1) {
                for (; m > 0; m -= 64, src += 64, dst += 64) {
                    const __mmask64 mk = m >= 64 ? ~0ULL : _bzhi_u64(~0ULL, (unsigned)m);
                    _mm512_storeu_si512(dst, _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, src), flip));
                }
            } else if (sw == 2) {
                /* the even bytes: the low bytes of 16-bit words, loading 2m - 1 bytes
                 * (the byte after the last one read may lie past the input) */
                for (; m > 0; m -= 32, src += 64, dst += 32) {
                    const __mmask64 bytes = m > 32 ? ~0ULL : _bzhi_u64(~0ULL, (unsigned)(2 * m - 1));
                    const __m512i words = _mm512_maskz_loadu_epi8(bytes, src);
                    _mm256_storeu_si256((__m256i *)dst, _mm256_xor_si256(_mm512_cvtepi16_epi8(words),
                                                                         _mm512_castsi512_si256(flip)));
                }
            } else {
                const uint8_t f = j->x_signed ? 0x80 : 0;
                for (Py_ssize_t q = 0; q < m; q++)
                    dst[q] = src[q * sw] ^ f;
            }
            q8_fill(d + (b - ox), end - b, pad);
        }
        d += n;
        left -= n;
        ox = 0;
        iy += j->sh;
    }
}

/* A task that covers a whole image at stride 1 or 2 along rows gathers from padded copies
 * of its planes instead: every tap's output row is then one run of ow bytes with no
 * bounds to check (a 4 x 4 map's gather was a dozen branches and three stores for
 * every four bytes). The copies: each channel's plane inside a border of the zero
 * point, hp x wp bytes, 64 bytes more at the end for the runs' overshoot. */
static void q8_padded_size(const q8_job *j, Py_ssize_t *hp, Py_ssize_t *wp)
{
    const Py_ssize_t need_h = (j->oh - 1) * j->sh + (j->kh - 1) * j->dh + 1;
    const Py_ssize_t need_w = (j->ow - 1) * j->sw + (j->kw - 1) * j->dw + 1;
    *hp = j->h + j->pt > need_h ? j->h + j->pt : need_h;
    *wp = j->w + j->pl > need_w ? j->w + j->pl : need_w;
}

VNNI_TARGET static void q8_pad_planes(const q8_job *j, const uint8_t *xg, Py_ssize_t hp, Py_ssize_t wp,
                                    uint8_t *restrict planes)
{
    const __m512i pad = _mm512_set1_epi8((char)j->zx), flip = _mm512_set1_epi8(j->x_signed ? (char)0x80 : 0);
    q8_fill(planes, j->cg * hp * wp, pad);
    for (Py_ssize_t ci = 0; ci < j->cg; ci++)
        for (Py_ssize_t y = 0; y < j->h; y++) {
            const uint8_t *src = xg + (ci * j->h + y) * j->w;
            uint8_t *dst = planes + (ci * hp + y + j->pt) * wp + j->pl;
            for (Py_ssize_t m = j->w; m > 0; m -= 64, src += 64, dst += 64) {
                const __mmask64 mk = m >= 64 ? ~0ULL : _bzhi_u64(~0ULL, (unsigned)m);
                _mm512_mask_storeu_epi8(dst, mk, _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, src), flip));
            }
        }
}

/* Every output position of tap (ky, kx) of the padded plane ``plane``, row after row,
 * into ``d`` (runs of ow bytes; each store's spill is overwritten by the next). At
 * stride 2 along rows, the even bytes: the low bytes of 16-bit words. */
VNNI_TARGET static void q8_gather_padded(const q8_job *j, const uint8_t *plane, Py_ssize_t wp, Py_ssize_t ky,
                                       Py_ssize_t kx, uint8_t *restrict d)
{
    const uint8_t *src = plane + ky * j->dh * wp + kx * j->dw;
    if (j->sw == 1) {
        for (Py_ssize_t oy = 0; oy < j->oh; oy++, src += j->sh * wp, d += j->ow)
            for (Py_ssize_t c = 0; c < j->ow; c += 64)
                _mm512_storeu_si512(d + c, _mm512_loadu_si512(src + c));
    } else {
        for (Py_ssize_t oy = 0; oy < j->oh; oy++, src += j->sh * wp, d += j->ow)
            for (Py_ssize_t c = 0; c < j->ow; c += 32)
                _mm256_storeu_si256((__m256i *)(d + c), _mm512_cvtepi16_epi8(_mm512_loadu_si512(src + 2 * c)));
    }
}

/* Four rows of ``np`` bytes (a multiple of 16) interleaved into [np][4]. */
VNNI_TARGET static void q8_interleave(const uint8_t *r0, const uint8_t *r1, const uint8_t *r2, const uint8_t *r3,
                                    Py_ssize_t np, uint8_t *restrict d)
{
    for (Py_ssize_t p = 0; p < np; p += 16) {
        const __m128i a = _mm_loadu_si128((const __m128i *)(r0 + p)), b = _mm_loadu_si128((const __m128i *)(r1 + p));
        const __m128i c = _mm_loadu_si128((const __m128i *)(r2 + p)), e = _mm_loadu_si128((const __m128i *)(r3 + p));
        const __m128i ab0 = _mm_unpacklo_epi8(a, b), ab1 = _mm_unpackhi_epi8(a, b);
        const __m128i ce0 = _mm_unpacklo_epi8(c, e), ce1 = _mm_unpackhi_epi8(c, e);
        _mm_storeu_si128((__m128i *)(d + 4 * p), _mm_unpacklo_epi16(ab0, ce0));
        _mm_storeu_si128((__m128i *)(d + 4 * p + 16), _mm_unpackhi_epi16(ab0, ce0));
        _mm_storeu_si128((__m128i *)(d + 4 * p + 32), _mm_unpacklo_epi16(ab1, ce1));
        _mm_storeu_si128((__m128i *)(d + 4 * p + 48), _mm_unpackhi_epi16(ab1, ce1));
    }
}

/* Requantize 16 accumulators of channel ``m`` (corrected by ``xs``, the positions'
 * sums, where given) into 16 (masked) output bytes at ``dst``. */
VNNI_TARGET static inline void q8_store(const q8_job *j, __m512i acc, Py_ssize_t m, const int32_t *xs,
                                      __mmask16 mask, void *dst)
{
    __m512i v = _mm512_add_epi32(acc, _mm512_set1_epi32(j->colterm[m]));
    if (xs)
        v = _mm512_sub_epi32(v, _mm512_mullo_epi32(_mm512_set1_epi32(j->zw[m]), _mm512_loadu_si512(xs)));
    if (j->y_i32) {
        _mm512_mask_storeu_epi32(dst, mask, v);
        return;
    }
    if (j->y_f32) {
        /* Cast, Mul and Add as the three ops do them: each rounded once */
        __m512 f = _mm512_mul_round_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(j->mult[j->mult_n > 1 ? m : 0]),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        if (j->bias)
            f = _mm512_add_round_ps(f, _mm512_set1_ps(j->bias[m]), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        if (j->relu)
            f = _mm512_max_ps(f, _mm512_setzero_ps()); /* -0.0 to +0.0, as Relu */
        _mm512_mask_storeu_ps(dst, mask, f);
        return;
    }
    __m512 f = _mm512_cvtepi32_ps(v);
    /* (acc + bias) * mult, each rounded once, as requantize_row does */
    f = _mm512_add_round_ps(f, _mm512_set1_ps(j->bias ? j->bias[m] : 0.0f),
                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    f = _mm512_mul_round_ps(f, _mm512_set1_ps(j->mult[j->mult_n > 1 ? m : 0]),
                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    f = _mm512_roundscale_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    f = _mm512_add_ps(f, _mm512_set1_ps(j->yzp));
    if (j->y_signed) {
        f = _mm512_min_ps(_mm512_max_ps(f, _mm512_set1_ps(-128.0f)), _mm512_set1_ps(127.0f));
        _mm_mask_storeu_epi8(dst, mask, _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(f)));
    } else {
        f = _mm512_min_ps(_mm512_max_ps(f, _mm512_setzero_ps()), _mm512_set1_ps(255.0f));
        _mm_mask_storeu_epi8(dst, mask, _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(f)));
    }
}

#define Q8_ROW(r)                                                                                    \
    do {                                                                                              \
        const __m512i wv = _mm512_set1_epi32(*(const int32_t *)(w##r + 4 * q));                      \
        a##r##0 = _mm512_dpbusd_epi32(a##r##0, x0, wv);                                               \
        a##r##1 = _mm512_dpbusd_epi32(a##r##1, x1, wv);                                               \
    } while (0)

#define Q8_OUT(r)                                                                                    \
    do {                                                                                              \
        if (r < mr) {                                                                                 \
            char *row = out + (m0 + r) * j->L * osize;                                                \
            q8_store(j, a##r##0, gm + m0 + r, xs ? xs + p : NULL, mask0, row + p * osize);           \
            if (mask1)                                                                                \
                q8_store(j, a##r##1, gm + m0 + r, xs ? xs + p + 16 : NULL, mask1, row + (p + 16) * osize); \
        }                                                                                             \
    } while (0)

/* Channels m0 <= m < m0 + mr (mr <= 8) of group ``gi`` against positions p <= q < p +
 * np (np <= 32) of the gathered columns ``cols`` ([k4][ncols][4]), into ``out`` (the
 * group's first output channel at position p0 of the chunk). */
VNNI_TARGET static void q8_tile(const q8_job *j, const uint8_t *cols, Py_ssize_t ncols, const int32_t *xs,
                              Py_ssize_t gm, Py_ssize_t m0, int mr, Py_ssize_t p, int np, char *out)
{
    const Py_ssize_t kp = 4 * j->k4, osize = j->y_i32 || j->y_f32 ? 4 : 1;
    /* rows past mr repeat row 0's weights and are not stored */
    const int8_t *w0 = j->wt + (gm + m0) * kp;
    const int8_t *w1 = mr > 1 ? w0 + kp : w0, *w2 = mr > 2 ? w0 + 2 * kp : w0, *w3 = mr > 3 ? w0 + 3 * kp : w0;
    const int8_t *w4 = mr > 4 ? w0 + 4 * kp : w0, *w5 = mr > 5 ? w0 + 5 * kp : w0, *w6 = mr > 6 ? w0 + 6 * kp : w0;
    const int8_t *w7 = mr > 7 ? w0 + 7 * kp : w0;
    __m512i a00 = _mm512_setzero_si512(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00,
            a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00, a60 = a00, a61 = a00, a70 = a00, a71 = a00;
    const uint8_t *c = cols + 4 * p;
    for (Py_ssize_t q = 0; q < j->k4; q++, c += 4 * ncols) {
        const __m512i x0 = _mm512_loadu_si512(c), x1 = _mm512_loadu_si512(c + 64);
        Q8_ROW(0);
        Q8_ROW(1);
        Q8_ROW(2);
        Q8_ROW(3);
        Q8_ROW(4);
        Q8_ROW(5);
        Q8_ROW(6);
        Q8_ROW(7);
    }
    const __mmask16 mask0 = np >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << np) - 1);
    const __mmask16 mask1 = np >= 32 ? (__mmask16)0xFFFF : np > 16 ? (__mmask16)((1u << (np - 16)) - 1) : 0;
    Q8_OUT(0);
    Q8_OUT(1);
    Q8_OUT(2);
    Q8_OUT(3);
    Q8_OUT(4);
    Q8_OUT(5);
    Q8_OUT(6);
    Q8_OUT(7);
}

/* One task: image, group and chunk of positions. */
VNNI_TARGET static void q8_task(void *arg, Py_ssize_t t)
{
    q8_job *j = arg;
    const Py_ssize_t chunk = t % j->chunks, rest = t / j->chunks, gi = rest % j->groups, i = rest / j->groups;
    const Py_ssize_t p0 = chunk * j->chunk, len = p0 + j->chunk < j->L ? j->chunk : j->L - p0;
    const Py_ssize_t ncols = (len + Q8_NR - 1) / Q8_NR * Q8_NR; /* whole tiles: the loads stay inside */
    const int padded = j->chunks == 1 && (j->sw == 1 || j->sw == 2);
    Py_ssize_t hp = 0, wp = 0;
    if (padded)
        q8_padded_size(j, &hp, &wp);
    const size_t col_bytes = (size_t)(j->k4 * ncols * 4), plane_bytes = padded ? (size_t)(j->cg * hp * wp + 64) : 0;
    uint8_t *cols = scratch(0, col_bytes + plane_bytes);
    const Py_ssize_t pitch = ncols + 64; /* each row's spill (q8_fill) */
    uint8_t *rows = scratch(1, (size_t)(4 * pitch));
    int32_t *xs = j->zw_any ? scratch(2, (size_t)ncols * sizeof(int32_t)) : NULL;
    if (!cols || !rows || (j->zw_any && !xs)) {
        j->failed = 1;
        return;
    }
    const uint8_t *xg = j->x + (i * j->c + gi * j->cg) * j->h * j->w;
    uint8_t *planes = padded ? cols + col_bytes : NULL;
    if (padded)
        q8_pad_planes(j, xg, hp, wp, planes);
    const Py_ssize_t oy = p0 / j->ow, ox = p0 % j->ow;
    /* k walks channels, then tap rows, then tap columns: counters, not divisions */
    Py_ssize_t ci = 0, ky = 0, kx = 0;
    q8_span span = q8_span_of(j, 0);
    for (Py_ssize_t q = 0; q < j->k4; q++) {
        for (int l = 0; l < 4; l++) {
            uint8_t *r = rows + l * pitch;
            const Py_ssize_t k = 4 * q + l;
            if (k < j->k) {
                if (padded)
                    q8_gather_padded(j, planes + ci * hp * wp, wp, ky, kx, r);
                else
                    q8_gather_row(j, xg + ci * j->h * j->w, ky, &span, oy, ox, len, r);
                if (++kx == j->kw) {
                    kx = 0;
                    if (++ky == j->kh) {
                        ky = 0;
                        ci++;
                    }
                }
                span = q8_span_of(j, kx);
                q8_fill(r + len, ncols - len, _mm512_set1_epi8((char)j->zx));
            } else {
                q8_fill(r, ncols, _mm512_setzero_si512()); /* k past K: zero weights meet zero inputs */
            }
        }
        q8_interleave(rows, rows + pitch, rows + 2 * pitch, rows + 3 * pitch, ncols, cols + 4 * q * ncols);
    }
    if (xs) {
        /* each position's sum of its K inputs: a product with ones */
        const __m512i ones = _mm512_set1_epi8(1);
        for (Py_ssize_t p = 0; p < ncols; p += 16) {
            __m512i s = _mm512_setzero_si512();
            for (Py_ssize_t q = 0; q < j->k4; q++)
                s = _mm512_dpbusd_epi32(s, _mm512_loadu_si512(cols + 4 * (q * ncols + p)), ones);
            _mm512_storeu_si512(xs + p, s);
        }
    }
    char *out = (char *)j->y + ((i * j->m + gi * j->mg) * j->L + p0) * (j->y_i32 || j->y_f32 ? 4 : 1);
    for (Py_ssize_t m0 = 0; m0 < j->mg; m0 += Q8_MR) {
        const int mr = j->mg - m0 < Q8_MR ? (int)(j->mg - m0) : Q8_MR;
        for (Py_ssize_t p = 0; p < len; p += Q8_NR)
            q8_tile(j, cols, ncols, xs, gi * j->mg, m0, mr, p, len - p < Q8_NR ? (int)(len - p) : Q8_NR, out);
    }
}

#endif

/* Bytes of gathered columns a task aims at (about half a core's L2), and the most a
 * call may gather per task. */
#define Q8_TILE_BYTES (128 * 1024)
#define Q8_SCRATCH_LIMIT (64.0 * 1024 * 1024)

PyDoc_STRVAR(qconv8_doc,
"qconv8(x, w8, zw, b, mult, y, geometry, x_zero_point, y_zero_point, threads, relu=False)\n\n"
"QLinearConv of the 8-bit x [N, C, H, W] (int8 or uint8) with the int8 weight w8\n"
"[M, kp] (each row C / groups * kh * kw values, then zeros to kp, a multiple of 4;\n"
"uint8 weights shifted by -128) whose zero points, in the same domain, are zw\n"
"(int32 [M]), the float32 bias b [M] (the int32 bias, or None) and mult (float32 [M]\n"
"or [1]: x_scale * w_scale / y_scale), into the 8-bit y [N, M, OH, OW] (int8 or\n"
"uint8), as qconv2d: (acc + b) * mult rounded half to even, plus y_zero_point,\n"
"saturated. The caller keeps every partial sum below 2**24. geometry as conv2d's.\n"
"With y int32 (ConvInteger), b and mult None: the exact int32 sums themselves\n"
"(wrapping past int32's range as a 32-bit accumulator does; no bound on the sums).\n"
"With y float32: those sums converted, times mult, plus b (each rounded once), then\n"
"max(v, 0) where relu is true (ConvInteger, Cast, Mul, Add and Relu; y_zero_point 0).\n"
"AVX-512 VNNI only (igemm_ready()); runs on up to threads threads, without the GIL.");

static PyObject *qconv8(PyObject *self, PyObject *args)
{
    PyObject *xo, *wo, *zo, *bo, *mo, *yo, *go;
    conv_geometry g;
    int threads, xzp, yzp, relu = 0;
    if (!PyArg_ParseTuple(args, "OOOOOOOiii|p:qconv8", &xo, &wo, &zo, &bo, &mo, &yo, &go, &xzp, &yzp, &threads,
                          &relu) ||
        conv_geometry_get(go, &g, "qconv8") < 0)
        return NULL;
    if (!vnni_ready()) {
        PyErr_SetString(PyExc_RuntimeError, "qconv8: this CPU has no AVX-512 VNNI");
        return NULL;
    }
    q8_job j;
    memset(&j, 0, sizeof(j));
    j.n = g.n, j.c = g.c, j.h = g.h, j.w = g.w, j.m = g.m, j.groups = g.groups, j.kh = g.kh, j.kw = g.kw;
    j.sh = g.sh, j.sw = g.sw, j.dh = g.dh, j.dw = g.dw, j.pt = g.pt, j.pl = g.pl, j.oh = g.oh, j.ow = g.ow;
    if (j.n < 0 || j.c < 1 || j.h < 1 || j.w < 1 || j.m < 1 || j.groups < 1 || j.c % j.groups || j.m % j.groups ||
        j.kh < 1 || j.kw < 1 || j.sh < 1 || j.sw < 1 || j.dh < 1 || j.dw < 1 || j.pt < 0 || j.pl < 0 || j.oh < 1 ||
        j.ow < 1) {
        /* (the gather checks every tap against the map: any geometry reads inside it) */
        PyErr_SetString(PyExc_ValueError, "qconv8: invalid geometry");
        return NULL;
    }
    j.cg = j.c / j.groups;
    j.mg = j.m / j.groups;
    j.k = j.cg * j.kh * j.kw;
    j.k4 = (j.k + 3) / 4;
    j.L = j.oh * j.ow;
    if (j.k > 33024) {
        /* 255 * 255 * K must stay below 2^31 for the int32 corrections */
        PyErr_Format(PyExc_ValueError, "qconv8: %zd values a product, at most 33024", j.k);
        return NULL;
    }
    if (xzp < -128 || xzp > 255 || yzp < -128 || yzp > 255) {
        PyErr_SetString(PyExc_ValueError, "qconv8: a zero point outside 8 bits");
        return NULL;
    }
    const Py_ssize_t kp = 4 * j.k4, out = j.n * j.m * j.L;
    nbuf x, w, z, b, mult, y;
    x.held = w.held = z.held = b.held = mult.held = y.held = 0;
    int32_t *colterm = NULL;
    {
        /* int32 y: ConvInteger's sums */
        Py_buffer probe;
        if (PyObject_GetBuffer(yo, &probe, PyBUF_FORMAT) == 0) {
            const char *fmt = probe.format ? probe.format : "B";
            const char code = fmt[strlen(fmt) - 1];
            j.y_i32 = probe.itemsize == 4 && (code == 'i' || code == 'l');
            j.y_f32 = probe.itemsize == 4 && code == 'f';
            PyBuffer_Release(&probe);
        } else {
            PyErr_Clear();
        }
    }
    if (j.y_i32 && (bo != Py_None || mo != Py_None || yzp != 0)) {
        PyErr_SetString(PyExc_ValueError, "qconv8: int32 y takes no bias, mult or y_zero_point");
        return NULL;
    }
    if ((j.y_f32 && (mo == Py_None || yzp != 0)) || (relu && !j.y_f32)) {
        PyErr_SetString(PyExc_ValueError, "qconv8: float32 y takes mult, no y_zero_point; relu only with it");
        return NULL;
    }
    j.relu = relu;
    if (nb_int8_kind(xo, &j.x_signed, "qconv8: x") < 0 ||
        (!j.y_i32 && !j.y_f32 && nb_int8_kind(yo, &j.y_signed, "qconv8: y") < 0))
        return NULL;
    if (nb_get(xo, &x, j.x_signed ? 'i' : 'u', 1, j.n * j.c * j.h * j.w, 0, 0, "qconv8: x") < 0 ||
        nb_get(wo, &w, 'i', 1, j.m * kp, 0, 0, "qconv8: w8") < 0 ||
        nb_get(zo, &z, 'i', 4, j.m, 0, 0, "qconv8: zw") < 0 ||
        nb_get(bo, &b, 'f', 4, j.m, 0, 1, "qconv8: b") < 0 ||
        (!j.y_i32 && (j.mult_n = nb_get_ratio(mo, &mult, j.m, "qconv8")) < 0) ||
        nb_get(yo, &y, j.y_f32 ? 'f' : j.y_i32 || j.y_signed ? 'i' : 'u', j.y_i32 || j.y_f32 ? 4 : 1, out, 1, 0,
               "qconv8: y") < 0)
        goto done;
    if (j.x_signed ? (xzp < -128 || xzp > 127) : xzp < 0) {
        PyErr_Format(PyExc_ValueError, "qconv8: x_zero_point %d outside the input's type", xzp);
        goto done;
    }
    j.zx = (uint8_t)(j.x_signed ? xzp + 128 : xzp);
    j.yzp = (float)yzp;
    j.x = x.view.buf;
    j.wt = w.view.buf;
    j.zw = z.view.buf;
    j.bias = b.held ? b.view.buf : NULL;
    j.mult = mult.held ? mult.view.buf : NULL;
    j.y = y.view.buf;
    colterm = PyMem_RawMalloc((size_t)j.m * sizeof(int32_t));
    if (!colterm) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t m = 0; m < j.m; m++) {
        /* in wrapping arithmetic: exact wherever the whole sum fits int32 */
        uint32_t sw = 0;
        for (Py_ssize_t k = 0; k < j.k; k++)
            sw += (uint32_t)(int32_t)j.wt[m * kp + k];
        colterm[m] = (int32_t)((uint32_t)j.k * (uint32_t)j.zx * (uint32_t)j.zw[m] - (uint32_t)j.zx * sw);
        j.zw_any |= j.zw[m] != 0;
    }
    j.colterm = colterm;
    /* chunks of about Q8_TILE_BYTES of columns, whole tiles, and enough tasks for the threads */
    Py_ssize_t chunk = Q8_TILE_BYTES / (kp > 0 ? kp : 1) / Q8_NR * Q8_NR;
    chunk = chunk < Q8_NR ? Q8_NR : chunk;
    const Py_ssize_t images = j.n * j.groups;
    if (threads > 1 && images * ((j.L + chunk - 1) / chunk) < 2 * threads) {
        Py_ssize_t want = (2 * threads + images - 1) / images;
        Py_ssize_t even = ((j.L + want - 1) / want + Q8_NR - 1) / Q8_NR * Q8_NR;
        if (even < chunk)
            chunk = even;
    }
    if (chunk > j.L)
        chunk = j.L;
    j.chunk = chunk;
    j.chunks = (j.L + chunk - 1) / chunk;
    if ((double)kp * (double)((chunk + Q8_NR - 1) / Q8_NR * Q8_NR) > Q8_SCRATCH_LIMIT) {
        PyErr_Format(PyExc_MemoryError, "qconv8: a task's gathered columns exceed %.0f bytes", Q8_SCRATCH_LIMIT);
        goto done;
    }
#if VNNI_BUILT
    if (j.n) {
        Py_BEGIN_ALLOW_THREADS
        pool_run(q8_task, &j, images * j.chunks, threads);
        Py_END_ALLOW_THREADS
        if (j.failed)
            PyErr_NoMemory();
    }
#endif
done:
    PyMem_RawFree(colterm);
    nb_release(&x);
    nb_release(&w);
    nb_release(&z);
    nb_release(&b);
    nb_release(&mult);
    nb_release(&y);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

PyMethodDef qconv8_methods[] = {
    {"qconv8", qconv8, METH_VARARGS, qconv8_doc},
    {NULL, NULL, 0, NULL},
};
