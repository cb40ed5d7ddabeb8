/* A single-producer single-consumer ring of n slots between two processes (shared memory).
 *
 * Two 64-bit counters, each written by one side only: `head` (slots published, by the
 * producer) and `tail` (slots released, by the consumer). The producer fills slot
 * head % n while head - tail < n, then release-stores head + 1; the consumer reads slot
 * tail % n while tail < head, then release-stores tail + 1. Each side keeps its own
 * counter privately and passes it in: the copy in shared memory is only ever written by
 * it, never read back, so a peer that scribbles over it cannot move it. The peer's counter
 * is untrusted: a value no honest peer could have written is reported as broken (-1),
 * never turned into a count, a slot or an address. docs/SHARED.md, "Protocol".
 */
#ifndef LF_HANDOFF_H
#define LF_HANDOFF_H

#include <stdint.h>

/* The control block: the two counters, each alone on its 64-byte line (128 bytes). */
#define LF_HANDOFF_BYTES 128
#define LF_HANDOFF_HEAD 0  /* byte offsets of the counters in the block */
#define LF_HANDOFF_TAIL 64

/* Producer (`head`: its own count of slots published): the slots it may fill now, from
 * slot head % n on (0: full), after an acquire-load of the peer's tail; -1: the tail is
 * not one an honest consumer can have stored (above head, or more than n below it). */
int64_t lf_handoff_room(const void *block, uint64_t head, uint64_t n);
/* Producer: release-store `head` (the slots before it filled; head - 1's bytes published). */
void lf_handoff_publish(void *block, uint64_t head);
/* Consumer (`tail`: its own count of slots released): the slots ready from slot tail % n
 * on (0: none), after an acquire-load of the peer's head; -1: a head no honest producer
 * can have stored (below tail, or more than n above it). */
int64_t lf_handoff_ready(const void *block, uint64_t tail, uint64_t n);
/* Consumer: release-store `tail` (the slots before it read: the producer may refill them). */
void lf_handoff_release(void *block, uint64_t tail);
/* One 64-bit word claimed by compare-and-swap (acquire-release): 1 if *word was
 * `expected` and is now `desired`, else 0 and *seen holds what it was. */
int lf_handoff_cas(void *word, uint64_t expected, uint64_t desired, uint64_t *seen);
/* An acquire-load / release-store of one 64-bit word (a status or claim word). */
uint64_t lf_handoff_load(const void *word);
void lf_handoff_store(void *word, uint64_t value);

#endif
