# Handoff, SharedWord: the handoff ring's counters and the claim words in shared memory
# (handoff.c), for lazyframes.serve. Included by _core.pyx.
#
# Each object checks once, at construction, that its words lie inside the buffer and are
# aligned, and keeps the buffer (a typed memoryview: the mapping stays while it lives);
# the calls then pass the ring's counters to the C kernels as they are (unsigned 64-bit).


cdef extern from "handoff.h" nogil:
    enum:
        LF_HANDOFF_BYTES, LF_HANDOFF_HEAD, LF_HANDOFF_TAIL
    int64_t lf_handoff_room(const void *block, uint64_t head, uint64_t n)
    void lf_handoff_publish(void *block, uint64_t head)
    int64_t lf_handoff_ready(const void *block, uint64_t tail, uint64_t n)
    void lf_handoff_release(void *block, uint64_t tail)
    int lf_handoff_cas(void *word, uint64_t expected, uint64_t desired, uint64_t *seen)
    uint64_t lf_handoff_load(const void *word)
    void lf_handoff_store(void *word, uint64_t value)


cdef unsigned char *_shared_at(unsigned char[::1] view, Py_ssize_t offset, Py_ssize_t size,
                               Py_ssize_t align) except NULL:
    """The address of ``size`` bytes at ``offset`` of ``view``, ``align``-aligned, or raise."""
    if offset < 0 or size > view.shape[0] or offset > view.shape[0] - size:
        raise ValueError(f"{size} bytes at offset {offset} are outside the {view.shape[0]} given")
    cdef unsigned char *p = &view[0] + offset
    if <size_t>p % <size_t>align:
        raise ValueError(f"offset {offset} is not {align}-byte aligned in memory")
    return p


cdef class Handoff:
    """One side of a single-producer single-consumer ring of ``n`` slots (``handoff.h``).

    ``buffer`` (writable, e.g. an ``mmap``) holds the ring's control block, 128 bytes at
    ``offset`` (64-aligned): the producer's count of slots published (``head``) and the
    consumer's of slots released (``tail``). Each side passes its own count, kept
    privately; the peer's is read from shared memory and untrusted: -1 when no honest peer
    can have written it. docs/SHARED.md, "Protocol".
    """

    cdef unsigned char[::1] _view
    cdef unsigned char *_block
    cdef uint64_t _n

    def __init__(self, buffer, Py_ssize_t offset, uint64_t n):
        if n < 1:
            raise ValueError("a handoff ring has at least one slot")
        self._view = buffer
        self._block = _shared_at(self._view, offset, LF_HANDOFF_BYTES, 64)
        self._n = n

    @property
    def n(self):
        """The ring's slots."""
        return self._n

    def room(self, uint64_t head):
        """Producer: the slots it may fill from slot ``head % n`` on (0: full), or -1."""
        return lf_handoff_room(self._block, head, self._n)

    def publish(self, uint64_t head):
        """Producer: publish the slots before ``head`` (a release store)."""
        lf_handoff_publish(self._block, head)

    def ready(self, uint64_t tail):
        """Consumer: the slots ready from slot ``tail % n`` on (0: none), or -1."""
        return lf_handoff_ready(self._block, tail, self._n)

    def release(self, uint64_t tail):
        """Consumer: hand back the slots before ``tail`` (a release store)."""
        lf_handoff_release(self._block, tail)


cdef class SharedWord:
    """A 64-bit word at ``offset`` (8-aligned) of ``buffer``, read and written atomically."""

    cdef unsigned char[::1] _view
    cdef unsigned char *_word

    def __init__(self, buffer, Py_ssize_t offset):
        self._view = buffer
        self._word = _shared_at(self._view, offset, 8, 8)

    def load(self):
        """The word (an acquire load)."""
        return lf_handoff_load(self._word)

    def store(self, uint64_t value):
        """Set the word (a release store)."""
        lf_handoff_store(self._word, value)

    def cas(self, uint64_t expected, uint64_t desired):
        """``(True, expected)`` if the word was ``expected`` and is now ``desired``, else
        ``(False, value)`` with the word's value, unchanged."""
        cdef uint64_t seen
        cdef int ok = lf_handoff_cas(self._word, expected, desired, &seen)
        return bool(ok), seen
