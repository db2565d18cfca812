/* The compiled kernels' thread pool.
 *
 * Python threads handing work to each other pay for the GIL: on a virtual machine
 * every hand-over to a sleeping thread is a wake-up through the hypervisor (about
 * 45-60 us measured), so the provider's Python-level pool only pays for chunks of
 * 250 us and more. These workers are plain threads that never touch Python: a job
 * is published in one atomic word (generation, chunk count, next chunk), the caller
 * and the workers claim chunks from it, and after a job a worker spins for a while
 * (``spin_ns``, 200 us by default) before it sleeps, so the next kernel of a run
 * finds it awake; when the last onnxrt run ends, ``pool_rest`` sends spinning
 * workers to sleep at once. One caller uses the pool at a time; another concurrent
 * caller runs its chunks itself.
 */
#include "native.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define cpu_relax() ((void)0)
#endif

#define MAX_WORKERS 256
#define FIELD_BITS 24
#define FIELD_MASK ((UINT64_C(1) << FIELD_BITS) - 1)

static struct {
    /* [generation:16][count:24][next chunk:24]: claiming a chunk is one CAS */
    _Atomic uint64_t claim;
    pool_task task; /* the current job's, written before claim is published */
    void *ctx;
    _Atomic Py_ssize_t done;
    _Atomic int limit;          /* workers allowed to join the current job */
    _Atomic unsigned published; /* bumped once per job: what idle workers wait on */
    _Atomic int sleeping;
    _Atomic unsigned rest_at; /* pool_rest: workers who saw this job sleep at once */
    _Atomic long spin_ns;
    uint64_t generation;
    int workers;
    /* for pool_info: jobs run, and the callers' time working and waiting for workers */
    long long stat_jobs, stat_work_ns, stat_wait_ns;
    pthread_mutex_t busy; /* held by the one caller using the pool */
    pthread_mutex_t grow;
    pthread_mutex_t sleep_lock;
    pthread_cond_t wake;
} P = {
    .spin_ns = 200000,
    .rest_at = ~0u,
    .busy = PTHREAD_MUTEX_INITIALIZER,
    .grow = PTHREAD_MUTEX_INITIALIZER,
    .sleep_lock = PTHREAD_MUTEX_INITIALIZER,
    .wake = PTHREAD_COND_INITIALIZER,
};

static long elapsed_ns(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1000000000L + (t.tv_nsec - t0->tv_nsec);
}

/* Claim and run chunks of the current job until none is left. A chunk's task and
 * context are read after its claim succeeds: the caller cannot publish another job
 * before every claimed chunk is done, so they are still this job's. */
static void work(void)
{
    for (;;) {
        uint64_t c = atomic_load_explicit(&P.claim, memory_order_acquire);
        uint64_t next = c & FIELD_MASK, count = (c >> FIELD_BITS) & FIELD_MASK;
        if (next >= count)
            return;
        if (!atomic_compare_exchange_weak_explicit(&P.claim, &c, c + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        P.task(P.ctx, (Py_ssize_t)next);
        atomic_fetch_add_explicit(&P.done, 1, memory_order_release);
    }
}

static void *worker(void *arg)
{
    int index = (int)(intptr_t)arg;
    unsigned seen = atomic_load(&P.published);
    for (;;) {
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (unsigned spins = 1;; spins++) {
            if (atomic_load_explicit(&P.published, memory_order_acquire) != seen)
                break;
            cpu_relax();
            if ((spins & 255) != 0)
                continue;
            /* the scheduler may have woken this worker on the caller's own CPU: yield,
             * or its spinning would keep the caller off that CPU (a job's caller was
             * measured waiting out the whole 200 us spin) */
            sched_yield();
            if (elapsed_ns(&t0) > atomic_load_explicit(&P.spin_ns, memory_order_relaxed) ||
                atomic_load_explicit(&P.rest_at, memory_order_relaxed) == seen) {
                /* sleeping is raised before published is read again, and the caller
                 * bumps published before it reads sleeping: one of the two sees the other */
                pthread_mutex_lock(&P.sleep_lock);
                atomic_fetch_add(&P.sleeping, 1);
                while (atomic_load(&P.published) == seen)
                    pthread_cond_wait(&P.wake, &P.sleep_lock);
                atomic_fetch_sub(&P.sleeping, 1);
                pthread_mutex_unlock(&P.sleep_lock);
                break;
            }
        }
        seen = atomic_load(&P.published);
        if (index < atomic_load_explicit(&P.limit, memory_order_relaxed))
            work();
    }
    return NULL;
}

/* Start workers up to ``n`` (fewer if the system refuses threads). */
static void ensure_workers(int n)
{
    if (n > MAX_WORKERS)
        n = MAX_WORKERS;
    if (P.workers >= n)
        return;
    pthread_mutex_lock(&P.grow);
    while (P.workers < n) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &attr, worker, (void *)(intptr_t)P.workers);
        pthread_attr_destroy(&attr);
        if (rc != 0)
            break;
        P.workers++;
    }
    pthread_mutex_unlock(&P.grow);
}

void pool_run(pool_task task, void *ctx, Py_ssize_t count, int threads)
{
    if (count <= 0)
        return;
    if (threads <= 1 || count == 1 || (uint64_t)count > FIELD_MASK || pthread_mutex_trylock(&P.busy) != 0) {
        for (Py_ssize_t i = 0; i < count; i++)
            task(ctx, i);
        return;
    }
    ensure_workers(threads - 1);
    P.task = task;
    P.ctx = ctx;
    atomic_store_explicit(&P.done, 0, memory_order_relaxed);
    atomic_store_explicit(&P.limit, threads - 1, memory_order_relaxed);
    P.generation = (P.generation + 1) & 0xFFFF;
    atomic_store_explicit(&P.claim, (P.generation << (2 * FIELD_BITS)) | ((uint64_t)count << FIELD_BITS),
                          memory_order_release);
    atomic_fetch_add(&P.published, 1);
    if (atomic_load(&P.sleeping) > 0) {
        /* taking and releasing the lock orders this after any worker's check of
         * published; broadcasting after the release spares the woken workers a block on
         * the lock (and the caller a second wake-up of theirs) */
        pthread_mutex_lock(&P.sleep_lock);
        pthread_mutex_unlock(&P.sleep_lock);
        pthread_cond_broadcast(&P.wake);
    }
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    work();
    long mine = elapsed_ns(&t0);
    /* the last chunks are a worker's already under way: wait for them, spinning */
    while (atomic_load_explicit(&P.done, memory_order_acquire) < count)
        cpu_relax();
    long all = elapsed_ns(&t0);
    P.stat_jobs++;
    P.stat_work_ns += mine;
    P.stat_wait_ns += all - mine;
    pthread_mutex_unlock(&P.busy);
}

/* A forked child has none of the parent's workers: start afresh. */
static void after_fork_child(void)
{
    P.workers = 0;
    atomic_store(&P.sleeping, 0);
    pthread_mutex_init(&P.busy, NULL);
    pthread_mutex_init(&P.grow, NULL);
    pthread_mutex_init(&P.sleep_lock, NULL);
    pthread_cond_init(&P.wake, NULL);
}

/* ---- per-thread scratch -------------------------------------------------------- */

typedef struct {
    void *p[3];
    size_t cap[3];
} scratch_t;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *arg)
{
    scratch_t *s = arg;
    free(s->p[0]);
    free(s->p[1]);
    free(s->p[2]);
    free(s);
}

static void scratch_init(void)
{
    pthread_key_create(&scratch_key, scratch_free);
    pthread_atfork(NULL, NULL, after_fork_child);
}

void *scratch(int slot, size_t bytes)
{
    pthread_once(&scratch_once, scratch_init);
    scratch_t *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = calloc(1, sizeof(scratch_t));
        if (!s || pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->cap[slot] < bytes) {
        free(s->p[slot]);
        size_t cap = ((bytes + bytes / 4) + 63) & ~(size_t)63;
        s->p[slot] = aligned_alloc(64, cap);
        s->cap[slot] = s->p[slot] ? cap : 0;
    }
    return s->p[slot];
}

/* ---- Python ------------------------------------------------------------------ */

static PyObject *set_spin(PyObject *self, PyObject *arg)
{
    double us = PyFloat_AsDouble(arg);
    if (us == -1.0 && PyErr_Occurred())
        return NULL;
    if (!(us >= 0 && us <= 1e7)) {
        PyErr_SetString(PyExc_ValueError, "set_spin: microseconds must lie in [0, 1e7]");
        return NULL;
    }
    atomic_store(&P.spin_ns, (long)(us * 1000));
    Py_RETURN_NONE;
}

static PyObject *pool_rest(PyObject *self, PyObject *unused)
{
    /* by job, not by call: a worker still on its way back from the last job (or
     * from a wake-up it had no part in) finds it when it starts to spin */
    atomic_store(&P.rest_at, atomic_load(&P.published));
    Py_RETURN_NONE;
}

static PyObject *pool_info(PyObject *self, PyObject *unused)
{
    return Py_BuildValue("{s:i,s:i,s:d,s:L,s:d,s:d}", "workers", P.workers, "sleeping", atomic_load(&P.sleeping),
                         "spin_us", (double)atomic_load(&P.spin_ns) / 1000.0, "jobs", P.stat_jobs, "work_us",
                         (double)P.stat_work_ns / 1000.0, "wait_us", (double)P.stat_wait_ns / 1000.0);
}

typedef struct {
    _Atomic Py_ssize_t *hits;
    Py_ssize_t spin;
} probe_ctx;

static void probe_task(void *arg, Py_ssize_t i)
{
    probe_ctx *c = arg;
    volatile Py_ssize_t sink = 0;
    for (Py_ssize_t k = 0; k < c->spin; k++)
        sink += k;
    atomic_fetch_add(&c->hits[i], 1);
}

static PyObject *pool_selftest(PyObject *self, PyObject *args)
{
    Py_ssize_t count, spin;
    int threads;
    if (!PyArg_ParseTuple(args, "nin:pool_selftest", &count, &threads, &spin))
        return NULL;
    if (count < 0 || count > 1000000 || threads < 1) {
        PyErr_SetString(PyExc_ValueError, "pool_selftest: count in [0, 1e6], threads >= 1");
        return NULL;
    }
    _Atomic Py_ssize_t *hits = calloc((size_t)(count ? count : 1), sizeof(*hits));
    if (!hits)
        return PyErr_NoMemory();
    probe_ctx c = {hits, spin};
    Py_BEGIN_ALLOW_THREADS
    pool_run(probe_task, &c, count, threads);
    Py_END_ALLOW_THREADS
    PyObject *out = PyList_New(count);
    for (Py_ssize_t i = 0; out && i < count; i++)
        PyList_SET_ITEM(out, i, PyLong_FromSsize_t(atomic_load(&hits[i])));
    free(hits);
    return out;
}

PyMethodDef pool_methods[] = {
    {"set_spin", set_spin, METH_O,
     "set_spin(microseconds)\n\nHow long an idle pool worker spins for the next job before it sleeps."},
    {"pool_rest", pool_rest, METH_NOARGS,
     "pool_rest()\n\nIdle workers stop spinning and sleep now (no run is in progress: their spinning\n"
     "would only take cores from the application)."},
    {"pool_info", pool_info, METH_NOARGS, "pool_info() -> {'workers': started, 'sleeping': asleep now, 'spin_us': spin time}"},
    {"pool_selftest", pool_selftest, METH_VARARGS,
     "pool_selftest(count, threads, spin) -> list\n\nRuns count chunks (each a busy loop of spin steps) on the\n"
     "pool and returns how many times each chunk ran (all ones when the pool is sound)."},
    {NULL, NULL, 0, NULL},
};
