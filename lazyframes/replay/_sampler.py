"""A sampler: batches drawn and copied out ahead by background threads, in the caller's order.

The buffer's thread draws each batch when asked (the buffer's calls wait for the draws
owed: :class:`DrawGate`), the sampler's copies its frames out, the GIL released, while
the caller learns. The design: docs/DESIGN.md, "Threads and limits".
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

from . import _samples

#: Every sampler not closed yet; closed at exit, before the interpreter winds down.
_live: weakref.WeakSet = weakref.WeakSet()
#: Every gate: for a fork, and for a forked child (which has none of the gates' threads).
_gates: weakref.WeakSet = weakref.WeakSet()
_held: list = []  # their drawing locks, held across a fork


class DrawGate:
    """A buffer's drawing thread and the draws its samplers owe; the buffer waits for them.

    One thread per buffer (from its first sampler on) makes the draws its samplers ask for
    (:meth:`ask`) in the order asked; the buffer calls :meth:`wait` first in every call that
    changes or reads what a draw reads (add tests :attr:`owed` first).
    """

    __slots__ = ("__weakref__", "_cond", "_drawing", "_jobs", "_thread", "owed")
    _jobs: Any  # a queue.SimpleQueue once started
    _thread: threading.Thread | None

    def __init__(self):
        self._forked()
        _gates.add(self)

    def start(self) -> None:
        """Start the drawing thread unless it runs (raises if no thread can start)."""
        with self._cond:
            if self._thread is None:
                jobs: queue.SimpleQueue = queue.SimpleQueue()
                args = (jobs, weakref.ref(self), self._drawing)
                t = threading.Thread(target=_draws, args=args, name="lazyframes-drawer")
                t.daemon = True
                t.start()
                self._jobs, self._thread = jobs, t
                # the thread ends with the buffer (at exit: _close_all, after the samplers)
                weakref.finalize(self, jobs.put, None).atexit = False

    def ask(self, drawn, draw, fills: queue.SimpleQueue, copy) -> None:
        """Queue ``drawn`` (None: owe ``draw()``, made there) for ``fills`` (no ``draw``: end).

        Owed and queued in one step: no close or interrupt leaves a draw owed and not made.
        """
        with self._cond:
            self.owed += drawn is None and draw is not None
            self._jobs.put((drawn, draw, fills, copy))

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

    def stop(self) -> None:
        """End the drawing thread once it has made the draws asked for (at exit)."""
        if self._thread is not None and not self.is_drawer():
            self._jobs.put(None)
            self._thread.join()

    def is_drawer(self) -> bool:
        return self._thread is threading.current_thread()

    def _forked(self) -> None:
        """New state (and, after a fork, no thread: the parent's owes the child nothing)."""
        self._cond = threading.Condition()  # reentrant: a collection in the thread may ask
        self._drawing = threading.Lock()  # held for each draw; a fork takes it first
        self._jobs, self._thread, self.owed = None, None, 0


def _draws(jobs: queue.SimpleQueue, gate, drawing) -> None:
    """A buffer's drawing thread: each job of :meth:`DrawGate.ask` passed on to its copier.

    ``gate``: a weak reference (the thread keeps no buffer alive). A draw that raises is
    passed on as its exception; the copies of earlier batches may still run meanwhile.
    """
    while (job := jobs.get()) is not None:
        drawn, draw, fills, copy = job
        del job
        if draw is None:  # a sampler's end
            fills.put(None)
            continue
        if drawn is None:  # drawn even after a close: the RNG moves on as the caller asked
            with drawing:
                try:
                    drawn = draw()
                except BaseException as e:  # e.g. nothing sampleable: as sample() would raise
                    drawn = e
            if (owner := gate()) is not None:
                owner.pay()
            del owner
        fills.put((drawn, copy))
        del drawn, draw, fills


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
        self._fills: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        first = [draw() for _ in range(prefetch)]  # one that raises starts nothing
        gate.start()
        args = (self._fills, self._done, self._stop)
        self._copier = threading.Thread(target=_copies, args=args, daemon=True)
        self._copier.name = "lazyframes-sampler"
        self._copier.start()
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
        self._gate.ask(drawn, self._draw, self._fills, (self._keys, outs, self._scale))

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
        self._gate.ask(None, None, self._fills, None)  # the copier's end, after our draws
        if not (self._copier is threading.current_thread() or self._gate.is_drawer()):
            self._copier.join()  # every batch asked for drawn (and paid), then skipped
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
    """Stop every sampler's and buffer's threads before the interpreter winds down."""
    for sampler in list(_live):
        sampler.close()
    for gate in list(_gates):
        gate.stop()


def _forget_all() -> None:
    """In a child process after ``fork``: every sampler is closed (its threads are not there)."""
    for sampler in list(_live):
        sampler._forked()
    _live.clear()
    for gate in list(_gates):
        gate._forked()
    _held.clear()


def _hold_draws() -> None:
    """Before a fork: no draw in progress (its RNG's lock would stay locked in the child)."""
    _held[:] = [gate._drawing for gate in _gates]
    for lock in _held:
        lock.acquire()


def _let_draws() -> None:  # after a fork, in the parent
    for lock in _held:
        lock.release()
    _held.clear()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(before=_hold_draws, after_in_parent=_let_draws, after_in_child=_forget_all)
