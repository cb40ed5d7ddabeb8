/* The handoff ring's counters with C11 atomics: handoff.h, docs/SHARED.md.
 *
 * Each store that hands slots to the peer is a release and each load of the peer's
 * counter an acquire, so a slot's bytes written before a publish (or read before a
 * release) happen before the peer's reads (or refills) that follow its acquire-load:
 * no byte is read while written, on any memory model C11 describes. The words are
 * 8-aligned in a shared mapping; lock-free 64-bit atomics are address-free (C11 7.17.5),
 * so two processes mapping the same page see one atomic object.
 */
#include "handoff.h"

#include <stdatomic.h>

typedef _Atomic uint64_t word;
_Static_assert(sizeof(word) == 8 && ATOMIC_LONG_LOCK_FREE == 2 && ATOMIC_LLONG_LOCK_FREE == 2,
               "the handoff counters must be lock-free 64-bit atomics (address-free)");

static inline word *at(const void *block, int offset) {
    return (word *)((char *)block + offset);
}

int64_t lf_handoff_room(const void *block, uint64_t head, uint64_t n) {
    uint64_t tail = atomic_load_explicit(at(block, LF_HANDOFF_TAIL), memory_order_acquire);
    if (tail > head || head - tail > n) /* unsigned: both tested before any subtraction */
        return -1;
    return (int64_t)(n - (head - tail));
}

void lf_handoff_publish(void *block, uint64_t head) {
    atomic_store_explicit(at(block, LF_HANDOFF_HEAD), head, memory_order_release);
}

int64_t lf_handoff_ready(const void *block, uint64_t tail, uint64_t n) {
    uint64_t head = atomic_load_explicit(at(block, LF_HANDOFF_HEAD), memory_order_acquire);
    if (head < tail || head - tail > n)
        return -1;
    return (int64_t)(head - tail);
}

void lf_handoff_release(void *block, uint64_t tail) {
    atomic_store_explicit(at(block, LF_HANDOFF_TAIL), tail, memory_order_release);
}

int lf_handoff_cas(void *w, uint64_t expected, uint64_t desired, uint64_t *seen) {
    uint64_t e = expected;
    int ok = atomic_compare_exchange_strong_explicit(at(w, 0), &e, desired, memory_order_acq_rel,
                                                     memory_order_acquire);
    *seen = e;
    return ok;
}

uint64_t lf_handoff_load(const void *w) {
    return atomic_load_explicit(at(w, 0), memory_order_acquire);
}

void lf_handoff_store(void *w, uint64_t value) {
    atomic_store_explicit(at(w, 0), value, memory_order_release);
}
