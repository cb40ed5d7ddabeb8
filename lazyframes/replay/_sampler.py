"""A sampler: batches drawn in the thread that adds, their frames copied out in another.

``ReplayBuffer.sampler`` returns a :class:`Sampler`, an iterator of :class:`Samples`.
Batch ``j + prefetch`` is drawn, in the caller's thread, when ``next()`` returns batch
``j`` (the first ``prefetch`` when the sampler is made): its fields are read and its
frames pinned (:func:`._samples.draw`) as the buffer holds them at that moment, which
fixes the batch. One background thread per sampler then copies the pinned frames into
one of ``prefetch + 1`` preallocated output sets (:func:`._samples.fill`, the GIL
released during the copy and the decoding), while the caller learns and adds. Only
owners of frames cross threads: the ring, the stores, the RNG and the priorities are read
in the caller's thread only, so a sampler draws the batches ``sample`` would at the same
points of the caller's sequence of calls, and an add's evictions, growth and compression
never touch a frame a copy reads (docs/DESIGN.md, "Threads and limits").
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import weakref
from collections.abc import Callable

from . import _samples

#: Every sampler not closed yet; closed at exit, before the interpreter winds down.
_live: weakref.WeakSet = weakref.WeakSet()


def _work(jobs: queue.SimpleQueue, done: queue.SimpleQueue, stop: threading.Event) -> None:
    """A sampler's thread: fill the drawn batches it is given, in order, until told to stop.

    It holds no reference to the sampler, so dropping the sampler closes it. Each result is
    ``(True, samples)`` or ``(False, exception)``; a drawn batch's owners are dropped once
    it is copied (or skipped after a stop).
    """
    while True:
        job = jobs.get()
        if job is None:
            return
        drawn, keys, outs, scale = job
        del job
        if stop.is_set():
            del drawn
            continue
        result: tuple[bool, object]
        try:
            result = (True, _samples.fill(drawn, keys, outs, scale))
        except BaseException as e:  # re-raised by the caller's next()
            result = (False, e)
        del drawn  # the pins go now, not when the caller takes the batch
        done.put(result)
        del result


class Sampler:
    """An iterator of sampled batches, each gathered ahead in a background thread.

    Made by :meth:`ReplayBuffer.sampler` (see there); not constructed directly.
    ``next(sampler)`` returns a :class:`Samples`, the same type :meth:`ReplayBuffer.sample`
    returns, after drawing the batch that comes ``prefetch`` calls later. Use it from the
    thread that adds. :meth:`close` (or a ``with`` block, or dropping the sampler, or
    :meth:`ReplayBuffer.clear`) stops its thread; ``next()`` then raises StopIteration.

    Args:
        draw: the buffer's draw of one batch (a :class:`~._samples.Drawn`, caller's thread).
        keys: the buffer's Dict keys, or None.
        sets: ``prefetch + 1`` output sets (:func:`._samples.outputs`, fresh arrays).
        scale: the scale the copy applies (None: none).
    """

    def __init__(self, draw: Callable[[], _samples.Drawn], keys, sets: list, scale):
        self._closed = True  # until the thread runs: close() and __del__ have nothing to do
        self._draw, self._keys, self._sets, self._scale = draw, keys, list(sets), scale
        self._count = 0  # batches drawn: the next one goes to set _count % len(sets)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        first = [draw() for _ in range(len(sets) - 1)]  # a draw that raises starts nothing
        self._thread = threading.Thread(
            target=_work, args=(self._jobs, self._done, self._stop),
            name="lazyframes-sampler", daemon=True,
        )  # fmt: skip
        self._thread.start()
        self._closed = False
        _live.add(self)
        for drawn in first:
            self._submit(drawn)

    @property
    def prefetch(self) -> int:
        """Batches drawn and gathered ahead of the one ``next()`` returns."""
        return len(self._sets) - 1

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (or the buffer was cleared): the thread has stopped."""
        return self._closed

    def _submit(self, drawn) -> None:
        outs = self._sets[self._count % len(self._sets)]
        self._count += 1
        self._jobs.put((drawn, self._keys, outs, self._scale))

    def __iter__(self) -> Sampler:
        return self

    def __next__(self) -> _samples.Samples:
        """The next batch; draws the one ``prefetch`` calls later first.

        Raises:
            StopIteration: the sampler is closed.
            ValueError: as ``sample`` (e.g. nothing sampleable): nothing changes then.
            Any exception the copy raised in the thread (e.g. MemoryError), with its
            traceback; the sampler is closed then.
        """
        if self._closed:
            raise StopIteration
        drawn = self._draw()  # raises before anything changed, or not at all
        try:
            self._submit(drawn)  # into the set of the batch the previous call returned
            del drawn
            ok, result = self._done.get()
        except BaseException:  # interrupted (KeyboardInterrupt): the order of sets is lost
            self.close()
            raise
        if ok is None:  # closed from another thread meanwhile
            raise StopIteration
        if not ok:
            self.close()
            raise result
        return result

    def close(self) -> None:
        """Stop the thread and drop the batches drawn ahead (their frames with them).

        Waits for a copy in progress to end; idempotent. The batches returned so far stay
        valid.
        """
        if self._closed:
            return
        self._closed = True
        _live.discard(self)
        self._stop.set()
        self._jobs.put(None)
        if self._thread is not threading.current_thread():  # a collection in the thread
            self._thread.join()
        while not self._done.empty():
            self._done.get()
        self._done.put((None, None))  # wakes a next() waiting in another thread

    def _forked(self) -> None:
        """Closed in a child process after ``fork``, which has no thread of this sampler.

        ``next()`` then raises StopIteration instead of waiting for a thread forever.
        """
        self._closed = True

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self.close()

    def __repr__(self):
        state = "closed" if self._closed else f"prefetch={self.prefetch}"
        return f"<lazyframes Sampler ({state})>"


@atexit.register
def _close_all() -> None:
    """Stop every sampler's thread before the interpreter winds down."""
    for sampler in list(_live):
        sampler.close()


def _forget_all() -> None:
    """In a child process after ``fork``: every sampler is closed (its thread is not there)."""
    for sampler in list(_live):
        sampler._forked()
    _live.clear()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_all)
