"""A sampler: batches drawn and copied out ahead by background threads, in the caller's order.

``ReplayBuffer.sampler`` returns a :class:`Sampler`, an iterator of :class:`Samples`
whose threads draw each batch as soon as it is asked for and copy its frames out (the
GIL released) while the caller learns. The buffer's :class:`DrawGate` makes every buffer
call that changes or reads what a draw reads wait for the draws its samplers owe (never
for a copy), so a sampler draws the batches ``sample`` would at the same points of the
caller's calls, whatever the threads' timing. The design: docs/DESIGN.md, "Threads and
limits".
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
#: Every gate, for a forked child (which has none of the threads that owe its draws).
_gates: weakref.WeakSet = weakref.WeakSet()


class DrawGate:
    """The draws a buffer's samplers owe it; the buffer waits for them before it changes.

    A sampler owes a draw (:meth:`owe`) when it asks for one, its drawing thread pays it
    (:meth:`pay`) once drawn, skipped or failed; the buffer calls :meth:`wait` first in
    every call that changes or reads what a draw reads (add tests :attr:`owed` first).
    """

    __slots__ = ("__weakref__", "_cond", "owed")

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self.owed = 0  #: draws owed now (read without the lock: a hot caller's test)
        _gates.add(self)

    def owe(self) -> None:
        with self._cond:
            self.owed += 1

    def pay(self) -> None:
        with self._cond:
            self.owed -= 1
            if not self.owed:
                self._cond.notify_all()

    def wait(self) -> None:
        """Return once no draw is owed: at once (one attribute read) when none is."""
        if self.owed:
            with self._cond:
                while self.owed:
                    self._cond.wait()

    def _forked(self) -> None:
        """In a forked child: the threads that owed draws are not there."""
        self._cond = threading.Condition(threading.Lock())
        self.owed = 0


def _draws(jobs: queue.SimpleQueue, fills: queue.SimpleQueue) -> None:
    """A sampler's drawing thread: each draw made as soon as asked, passed on to the copier.

    A job is ``(drawn, draw, gate, copy)``: a batch drawn already, or None and the draw to
    make now (then paid to ``gate``), ``copy`` what the copier needs. The copy of an
    earlier batch may still run meanwhile: the buffer's calls wait for this thread's
    draws, never for a copy. A draw that raises is passed on as its exception, in order.
    """
    while (job := jobs.get()) is not None:
        drawn, draw, gate, copy = job
        del job
        if drawn is None:  # drawn even after a stop: the RNG moves on as the caller asked
            try:
                drawn = draw()
            except BaseException as e:  # e.g. nothing sampleable: as sample() would raise
                drawn = e
            finally:
                gate.pay()
        fills.put((drawn, copy))
        del drawn
    fills.put(None)


def _copies(fills: queue.SimpleQueue, done: queue.SimpleQueue, stop: threading.Event) -> None:
    """A sampler's copying thread: fill the batches drawn, in order, until stopped.

    Neither thread holds a reference to the sampler, so dropping the sampler closes it.
    Each result is ``(True, samples)``, ``("draw", exception)`` (nothing changed) or
    ``(False, exception)`` (a copy that raised).
    """
    while (job := fills.get()) is not None:
        drawn, (keys, outs, scale) = job
        del job
        result: tuple[object, object]
        if isinstance(drawn, BaseException):  # its traceback holds the sampler: not kept here
            result = ("draw", drawn)
        elif stop.is_set():
            del drawn
            continue
        else:
            try:
                result = (True, _samples.fill(drawn, keys, outs, scale))
            except BaseException as e:  # re-raised by the caller's next(), which closes
                result = (False, e)
        del drawn  # the pins go now, not when the caller takes the batch
        done.put(result)
        del result


class Sampler:
    """An iterator of sampled batches, each drawn and gathered ahead in background threads.

    Made by :meth:`ReplayBuffer.sampler` (see there); not constructed directly.
    ``next(sampler)`` returns a :class:`Samples`, the same type :meth:`ReplayBuffer.sample`
    returns, and asks its threads for the batch that comes ``prefetch`` calls later. Use
    it from the thread that adds. :meth:`close` (or a ``with`` block, or dropping the
    sampler, or :meth:`ReplayBuffer.clear`) stops its threads; ``next()`` then raises
    StopIteration.

    Args:
        draw: the buffer's draw of one batch (a :class:`~._samples.Drawn`).
        gate: the buffer's :class:`DrawGate`.
        keys: the buffer's Dict keys, or None.
        prefetch: batches asked for ahead of the one ``next()`` returns.
        sets: ``2 * prefetch + 1`` output sets (:func:`._samples.outputs`, fresh arrays),
            used in turn: a batch's set is refilled ``prefetch + 1`` calls after it.
        scale: the scale the copy applies (None: none).
    """

    def __init__(
        self, draw: Callable[[], _samples.Drawn], gate: DrawGate, keys, prefetch: int, sets, scale
    ):
        self._closed = True  # until the threads run: close() and __del__ have nothing to do
        self._draw, self._gate, self._keys, self._scale = draw, gate, keys, scale
        self._prefetch, self._sets = prefetch, list(sets)
        self._count = 0  # batches asked for: the next one goes to set _count % len(sets)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        first = [draw() for _ in range(prefetch)]  # one that raises starts nothing
        fills: queue.SimpleQueue = queue.SimpleQueue()
        draws = threading.Thread(target=_draws, args=(self._jobs, fills), daemon=True)
        copies = threading.Thread(target=_copies, args=(fills, self._done, self._stop), daemon=True)
        draws.name, copies.name = "lazyframes-sampler-draws", "lazyframes-sampler"
        self._threads = (draws, copies)
        draws.start()
        try:
            copies.start()
        except BaseException:  # e.g. "can't start new thread": the drawer stops too
            self._jobs.put(None)
            raise
        self._closed = False
        _live.add(self)
        for drawn in first:
            self._submit(drawn)

    @property
    def prefetch(self) -> int:
        """Batches drawn and gathered ahead of the one ``next()`` returns."""
        return self._prefetch

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (or the buffer was cleared): its threads have stopped."""
        return self._closed

    def _submit(self, drawn) -> None:
        """Ask the threads for the next batch: ``drawn``, or None to draw it there (owed)."""
        outs = self._sets[self._count % len(self._sets)]
        self._count += 1
        if drawn is None:
            self._gate.owe()
        self._jobs.put((drawn, self._draw, self._gate, (self._keys, outs, self._scale)))

    def __iter__(self) -> Sampler:
        return self

    def __next__(self) -> _samples.Samples:
        """The next batch; asks the threads for the one ``prefetch`` calls later first.

        Raises:
            StopIteration: the sampler is closed.
            ValueError: the draw of this batch raised, as ``sample`` would (e.g. nothing
                sampleable yet): it changed nothing, and the sampler goes on.
            Any exception the copying thread raised (e.g. MemoryError), with its
            traceback; the sampler is closed then.
        """
        if self._closed:
            raise StopIteration
        try:
            self._submit(None)  # into the set of the batch returned prefetch + 1 calls ago
            ok, result = self._done.get()
        except BaseException:  # interrupted (KeyboardInterrupt): the order of sets is lost
            self.close()
            raise
        if ok is True:
            return result
        if ok is None:  # closed from another thread meanwhile
            raise StopIteration
        if ok is False:  # a copy that failed: the sampler cannot go on
            self.close()
        try:
            raise result
        finally:  # no cycle frame -> exception -> traceback -> frame: nothing keeps the
            del result  # sampler for the garbage collector, which may run in its threads

    def close(self) -> None:
        """Stop the threads and drop the batches drawn ahead (their frames with them).

        Waits for a draw or copy in progress to end; idempotent. The batches returned so
        far stay valid.
        """
        if self._closed:
            return
        self._closed = True
        _live.discard(self)
        self._stop.set()
        self._jobs.put(None)  # passed on by the drawer to the copier
        if threading.current_thread() not in self._threads:  # not a collection in one of them
            for t in self._threads:
                t.join()  # every job left drawn (and paid), then skipped
        while not self._done.empty():
            self._done.get()
        self._done.put((None, None))  # wakes a next() waiting in another thread

    def _forked(self) -> None:
        """Closed after ``fork`` (no thread of it in the child): ``next()`` stops, not waits."""
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
    """Stop every sampler's threads before the interpreter winds down."""
    for sampler in list(_live):
        sampler.close()


def _forget_all() -> None:
    """In a child process after ``fork``: every sampler is closed (its threads are not there)."""
    for sampler in list(_live):
        sampler._forked()
    _live.clear()
    for gate in list(_gates):
        gate._forked()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_all)
