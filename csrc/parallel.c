/* A small persistent worker pool of lazyframes (see parallel.h).
 *
 * One mutex guards everything: the job (fn, ctx, n_tasks), the next task to claim, the
 * tasks running, the workers. Tasks are few and coarse (a part of a batch's rows: a
 * fraction of a millisecond or more), so claiming one under the mutex costs nothing
 * that matters, and there is no lock-free protocol to get wrong. A worker claims tasks
 * only while the job it was woken for is the current one and has tasks left; the caller
 * clears the job only when every claimed task has returned, so no worker ever calls a
 * job's fn after its lf_parallel_for returned.
 *
 * Spin, then sleep. Waking a sleeping thread takes a futex call and, on a virtual
 * machine whose other vCPU is idle, an interrupt to it: 20-40 us on the hosts measured,
 * a fifth of a sample(32)'s work. So a worker that finishes watches the job counter
 * (gen, read without the mutex) for LF_SPIN_NS before it sleeps, and the caller watches
 * the count of running tasks for as long before it sleeps on `done`: back-to-back calls
 * (a sampler filling its ring, a loop of gathers) hand work over in a cache line's
 * round trip. Only gen and running are read without the mutex; they are written with
 * it held, through atomics (so the reads see whole values, and ThreadSanitizer agrees).
 */
#define _POSIX_C_SOURCE 200809L
#include "parallel.h"

#include <stdint.h>

#if defined(_WIN32)
/* No pthreads: every task runs in the caller (one thread). */
static int n_threads = 1;
static unsigned long long n_tasks_run = 0;

int lf_parallel_for(int n_tasks, lf_task_fn fn, void *ctx) {
    for (int t = 0; t < n_tasks; t++) fn(ctx, t);
    n_tasks_run += n_tasks > 0 ? (unsigned long long)n_tasks : 0;
    return 0;
}
void lf_parallel_set_threads(int n) {
    n_threads = n < 1 ? 1 : n > LF_PARALLEL_MAX ? LF_PARALLEL_MAX : n;
}
int lf_parallel_threads(void) { return n_threads; }
unsigned long long lf_parallel_tasks_run(void) { return n_tasks_run; }
unsigned long long lf_parallel_tasks_by_workers(void) { return 0; }
void lf_parallel_shutdown(void) {}

#else
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <time.h>

static struct {
    pthread_mutex_t mu;
    pthread_cond_t wake;            /* workers: a new job (gen changed) or stop */
    pthread_cond_t done;            /* the caller: the last claimed task returned */
    pthread_t th[LF_PARALLEL_MAX];
    unsigned long born[LF_PARALLEL_MAX]; /* the gen a worker starts from */
    int n_workers;
    int stop;
    int busy;                       /* a call holds the workers */
    unsigned long gen;              /* +1 per job (__atomic: watched without the mutex) */
    lf_task_fn fn;                  /* the current job, while busy */
    void *ctx;
    unsigned long running;          /* tasks claimed, not returned (__atomic: watched) */
    int n_tasks, next, helpers;
} P = {.mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER, .done = PTHREAD_COND_INITIALIZER};

/* How long a worker (for a new job) and the caller (for its job's last task) watch
 * before they sleep; a worker's watch costs its CPU that long after each job. */
#define LF_SPIN_NS 50000

static int n_threads = 1;                   /* __atomic: read without the mutex */
static unsigned long long n_tasks_run = 0;  /* __atomic */
static unsigned long long n_by_workers = 0; /* __atomic */
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void fork_prepare(void) { pthread_mutex_lock(&P.mu); }
static void fork_parent(void) { pthread_mutex_unlock(&P.mu); }
/* The child has one thread, this one, which holds P.mu (fork_prepare): the workers and
 * any call that was running are the parent's. Forget them; their condition variables
 * may count waiters that do not exist here, so they are made anew. */
static void fork_child(void) {
    P.n_workers = 0;
    P.stop = 0;
    P.busy = 0;
    P.fn = NULL;
    P.ctx = NULL;
    P.n_tasks = P.next = P.helpers = 0;
    P.running = 0;
    pthread_cond_init(&P.wake, NULL);
    pthread_cond_init(&P.done, NULL);
    pthread_mutex_unlock(&P.mu);
}
static void register_fork(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Watch *w (without the mutex) for up to LF_SPIN_NS until it equals v (is_v 1) or
 * differs from v (is_v 0): 1 if it did. */
static int watch(const unsigned long *w, unsigned long v, int is_v) {
    uint64_t end = 0;
    for (unsigned i = 0;; i++) {
        if ((__atomic_load_n(w, __ATOMIC_ACQUIRE) == v) == is_v) return 1;
        cpu_relax();
        if ((i & 63) == 0) { /* the clock every 64 looks */
            uint64_t t = now_ns();
            if (!end) end = t + LF_SPIN_NS;
            else if (t >= end) return 0;
        }
    }
}

static void count(int by_worker) {
    __atomic_fetch_add(&n_tasks_run, 1, __ATOMIC_RELAXED);
    if (by_worker) __atomic_fetch_add(&n_by_workers, 1, __ATOMIC_RELAXED);
}

/* Claim and run the current job's tasks until none is left; P.mu held on entry and exit. */
static void run_tasks(int by_worker) {
    while (P.next < P.n_tasks) {
        int t = P.next++;
        lf_task_fn fn = P.fn;
        void *ctx = P.ctx;
        __atomic_store_n(&P.running, P.running + 1, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&P.mu);
        fn(ctx, t);
        count(by_worker);
        pthread_mutex_lock(&P.mu);
        __atomic_store_n(&P.running, P.running - 1, __ATOMIC_RELEASE);
        if (P.running == 0 && P.next == P.n_tasks) pthread_cond_signal(&P.done);
    }
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    pthread_mutex_lock(&P.mu);
    unsigned long seen = P.born[id];
    for (;;) {
        if (!P.stop && P.gen == seen) { /* watch for the next job, then sleep */
            pthread_mutex_unlock(&P.mu);
            watch(&P.gen, seen, 0);
            pthread_mutex_lock(&P.mu);
            while (!P.stop && P.gen == seen) pthread_cond_wait(&P.wake, &P.mu);
        }
        if (P.stop) break;
        seen = P.gen;
        if (P.busy && id < P.helpers) run_tasks(1);
    }
    pthread_mutex_unlock(&P.mu);
    return NULL;
}

/* Make workers until there are `want`; P.mu held. Signals are blocked in them (they
 * inherit the mask): a signal is the main thread's business. 0, or -1 if one failed. */
static int grow(int want) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = 0;
    while (P.n_workers < want) {
        int id = P.n_workers;
        P.born[id] = P.gen;
        if (pthread_create(&P.th[id], NULL, worker, (void *)(intptr_t)id) != 0) {
            rc = -1;
            break;
        }
        P.n_workers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

int lf_parallel_for(int n_tasks, lf_task_fn fn, void *ctx) {
    if (n_tasks <= 0) return 0;
    int threads = __atomic_load_n(&n_threads, __ATOMIC_RELAXED);
    int helpers = (n_tasks < threads ? n_tasks : threads) - 1, rc = 0;
    if (helpers > 0) {
        pthread_once(&fork_once, register_fork);
        pthread_mutex_lock(&P.mu);
        if (!P.busy) {
            rc = grow(helpers);
            if (helpers > P.n_workers) helpers = P.n_workers;
        }
        if (!P.busy && helpers > 0) {
            P.busy = 1;
            P.fn = fn;
            P.ctx = ctx;
            P.n_tasks = n_tasks;
            P.next = 0;
            P.running = 0;
            P.helpers = helpers;
            __atomic_store_n(&P.gen, P.gen + 1, __ATOMIC_RELEASE);
            pthread_cond_broadcast(&P.wake); /* no futex call when no worker sleeps */
            run_tasks(0);
            if (P.running > 0) { /* a worker's last task: watch it end, then sleep */
                pthread_mutex_unlock(&P.mu);
                watch(&P.running, 0, 1);
                pthread_mutex_lock(&P.mu);
            }
            while (P.running > 0) pthread_cond_wait(&P.done, &P.mu);
            P.busy = 0;
            P.fn = NULL;
            P.ctx = NULL;
            P.n_tasks = P.next = P.helpers = 0;
            pthread_mutex_unlock(&P.mu);
            return rc;
        }
        pthread_mutex_unlock(&P.mu); /* another call holds the workers: this one runs alone */
    }
    for (int t = 0; t < n_tasks; t++) {
        fn(ctx, t);
        count(0);
    }
    return rc;
}

void lf_parallel_set_threads(int n) {
    n = n < 1 ? 1 : n > LF_PARALLEL_MAX ? LF_PARALLEL_MAX : n;
    __atomic_store_n(&n_threads, n, __ATOMIC_RELAXED);
}

int lf_parallel_threads(void) { return __atomic_load_n(&n_threads, __ATOMIC_RELAXED); }

unsigned long long lf_parallel_tasks_run(void) {
    return __atomic_load_n(&n_tasks_run, __ATOMIC_RELAXED);
}

unsigned long long lf_parallel_tasks_by_workers(void) {
    return __atomic_load_n(&n_by_workers, __ATOMIC_RELAXED);
}

void lf_parallel_shutdown(void) {
    pthread_mutex_lock(&P.mu);
    while (P.busy) { /* a call is running: let it end (its caller waits for its tasks) */
        pthread_mutex_unlock(&P.mu);
        sched_yield();
        pthread_mutex_lock(&P.mu);
    }
    int n = P.n_workers;
    P.stop = 1;
    P.busy = 1; /* no call takes the workers while they stop */
    pthread_cond_broadcast(&P.wake);
    pthread_mutex_unlock(&P.mu);
    for (int i = 0; i < n; i++) pthread_join(P.th[i], NULL);
    pthread_mutex_lock(&P.mu);
    P.n_workers = 0;
    P.stop = 0;
    P.busy = 0;
    pthread_mutex_unlock(&P.mu);
}
#endif
