/* A small persistent worker pool of lazyframes: one call's work split across threads.
 *
 * lf_parallel_for(n, fn, ctx) runs fn(ctx, 0) ... fn(ctx, n - 1), each task once, and
 * returns when all have returned. The calling thread works too: it claims tasks like the
 * workers do, so a call whose workers are slow to wake (a busy machine) still finishes
 * in the time the caller alone takes, and a call with one task is a plain call of fn.
 * Up to lf_parallel_threads() - 1 workers help (the caller is the other thread); they are
 * made on first use and reused: a call allocates nothing. Between calls a worker watches
 * for the next one for a short while (LF_SPIN_NS in parallel.c), then sleeps.
 *
 * One call at a time uses the workers: a call made while another runs (another thread's
 * gather, fn itself calling lf_parallel_for) runs all its tasks in its own thread, as
 * with one thread. So any number of threads may call it, and its tasks never wait for a
 * worker another call holds.
 *
 * Fork: a child process has none of its parent's threads. A pthread_atfork handler
 * forgets the workers in the child (their memory is the parent's; it is not freed), and
 * the child's first call makes its own. No exit handler: workers asleep at exit end with
 * the process; lf_parallel_shutdown (tests) joins them.
 *
 * fn must not fail in a way that needs the other tasks stopped: each task reports its
 * own result through ctx. Tasks run without the GIL; fn reads only memory the caller
 * keeps alive and unchanged until lf_parallel_for returns.
 */
#ifndef LAZYFRAMES_PARALLEL_H
#define LAZYFRAMES_PARALLEL_H

#ifdef __cplusplus
extern "C" {
#endif

/* The most threads a call uses (the caller included). */
#define LF_PARALLEL_MAX 64

typedef void (*lf_task_fn)(void *ctx, int task);

/* Run fn(ctx, t) for t in [0, n_tasks), in the caller and up to lf_parallel_threads() - 1
 * workers. 0, or -1 if no worker could be made (then every task ran in the caller). */
int lf_parallel_for(int n_tasks, lf_task_fn fn, void *ctx);

/* The threads a call may use, the caller included: 1 .. LF_PARALLEL_MAX (default 1).
 * Setting it never blocks: workers beyond it stay asleep; more are made on next use.
 * Values outside the range are clamped. */
void lf_parallel_set_threads(int n);
int lf_parallel_threads(void);

/* Tasks run since the process started (a counter for tests: each task adds 1). */
unsigned long long lf_parallel_tasks_run(void);

/* Tasks run by worker threads (not the caller) since the process started. */
unsigned long long lf_parallel_tasks_by_workers(void);

/* Stop and join the workers (tests; not needed at exit). A later call makes new ones. */
void lf_parallel_shutdown(void);

#ifdef __cplusplus
}
#endif
#endif
