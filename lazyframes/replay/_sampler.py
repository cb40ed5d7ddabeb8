"""A sampler: batches drawn and copied out ahead by background threads, in the caller's order.

The buffer's thread draws each batch when asked (the buffer's calls wait for the draws
owed: :class:`DrawGate`), the sampler's copies its frames out, the GIL released, while
the caller learns. The design: docs/DESIGN.md, "Threads and limits".
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable

_live: weakref.WeakSet = weakref.WeakSet()  # the samplers not closed: closed at exit
_gates: weakref.WeakSet = weakref.WeakSet()  # every gate: for a fork, and a forked child
_fork = threading.local()  # .held: the locks a fork in this thread holds


class DrawGate:
    """A buffer's drawing thread and the draws its samplers owe; the buffer waits for them.

    One thread per buffer (started when first asked, ended with the buffer) makes the
    draws its samplers ask for (:meth:`ask`) in the order asked; the buffer calls
    :meth:`wait` first in every call that changes or reads what a draw reads (add tests
    :attr:`owed` first). Its locks are C locks held for a few statements that allocate
    nothing: no signal or garbage collection can leave one held or re-enter it.
    """

    __slots__ = ("__weakref__", "_busy", "_fwd", "_jobs", "_lock", "_thread", "drawing", "owed")
    _jobs: queue.SimpleQueue
    _thread: threading.Thread | None

    def __init__(self):
        self._forked()
        _gates.add(self)

    def ask(self, job: tuple, owed: bool) -> None:
        """Queue ``job`` (:func:`_draws`; ``owed``: a draw to wait for), in one step.

        Starts the thread if it does not run (first use, or after exit).
        """
        if self._thread is None or not self._thread.is_alive():
            self._start()
        with self._lock:
            self.owed += owed
            self._jobs.put(job)

    def pay(self) -> None:
        with self._lock:
            self.owed -= 1

    def forward(self, fills: queue.SimpleQueue, item: tuple, stop: list) -> None:
        """Put a drawn batch in its sampler's queue unless it is closed (drawing thread)."""
        with self._fwd:
            if not stop[0]:
                fills.put(item)

    def fence(self) -> None:  # once no forward() runs: later ones see the sampler closed
        with self._fwd:
            pass

    def wait(self) -> None:
        """Return once no draw is owed: at once (one attribute read) when none is."""
        spins = 0
        while self.owed:  # a draw takes microseconds: yield the GIL to the thread
            time.sleep(0 if spins < 100 else 1e-4)
            spins += 1
            if spins % 1000 == 0:  # stopped at exit with draws asked after: make them
                self._start()

    def stop(self) -> None:
        """End the drawing thread once it has made the draws asked for (at exit)."""
        t = self._thread
        if t is not None and t is not threading.current_thread():
            self._jobs.put(None)
            t.join()

    def _start(self) -> None:
        with self._busy:  # free while no thread runs; not _lock: making one may collect
            if self._thread is None or not self._thread.is_alive():
                args = (self._jobs, weakref.ref(self), self._busy)
                t = threading.Thread(target=_draws, args=args, name="lazyframes-drawer")
                t.daemon = True
                t.start()
                self._thread = t

    def _forked(self) -> None:
        """New state (and, after a fork, no thread: the parent's owes the child nothing)."""
        _drain(getattr(self, "_jobs", None))  # the parent's batches: their frames let go
        self._lock, self._fwd = threading.Lock(), threading.Lock()
        self.drawing = threading.Lock()  # held for each draw (ReplayBuffer._drawn)
        self._busy = threading.Lock()  # held by the thread for each job: a fork waits for it
        self._jobs, self._thread, self.owed = queue.SimpleQueue(), None, 0
        # the thread ends with the buffer (at exit: _close_all, after the samplers)
        weakref.finalize(self, self._jobs.put, None).atexit = False


def _drain(*queues) -> None:
    """Drop what ``queues`` hold (None: none); another thread may take from them too."""
    for q in queues:
        with contextlib.suppress(queue.Empty, AttributeError):
            while True:
                q.get_nowait()


def _draws(jobs: queue.SimpleQueue, gate, busy: threading.Lock) -> None:
    """A buffer's drawing thread: each job of :meth:`DrawGate.ask` passed on to its copier.

    A job is ``(drawn, draw, fills, stop, copy)``: a batch, or None to draw it now
    (owed); ``gate`` a weak reference (the thread keeps no buffer alive). A draw that
    raises is passed on as its exception; a closed sampler's batch is dropped before the
    draw is paid, so the buffer's next call sees its frames released.
    """
    while (job := jobs.get()) is not None:
        with busy:  # a forked child then finds no batch in this thread's hands
            drawn, draw, fills, stop, copy = job
            del job
            owner, owed = gate(), drawn is None
            if owed:  # drawn even after a close: the RNG moves on as asked
                try:
                    drawn = draw()
                except BaseException as e:  # e.g. nothing sampleable: as sample() would raise
                    drawn = e
            if owner is not None:
                owner.forward(fills, (drawn, copy), stop)
                drawn = None  # dropped before the draw is paid
                if owed:
                    owner.pay()
            del owner, drawn, draw, fills, stop, copy


def _copies(fills: queue.SimpleQueue, done: queue.SimpleQueue, stop: list, copying) -> None:
    """A sampler's copying thread: fill the batches drawn, in order, until stopped.

    No thread holds a reference to the sampler, so dropping the sampler closes it. Each
    result is ``(True, samples)``, ``("draw", exception)`` (nothing changed) or ``(False,
    exception)`` (a copy that raised). ``copying`` is held for each batch (a fork waits).
    """
    while (job := fills.get()) is not None:
        with copying:
            drawn, (fill, outs) = job
            del job
            result: tuple[object, object] | None = None
            if isinstance(drawn, BaseException):  # its traceback holds the sampler: not kept
                result = ("draw", drawn)
            elif not stop[0]:
                try:
                    result = (True, fill(drawn, outs))
                except BaseException as e:  # re-raised by the caller's next(), which closes
                    result = (False, e)
            del drawn  # the pins go now, not when the caller takes the batch
            if result is not None:
                done.put(result)
            del result


class Sampler:
    """An iterator of sampled batches, each drawn and gathered ahead in background threads.

    Made by :meth:`ReplayBuffer.sampler` and :meth:`ReplayBuffer.sequence_sampler` (see
    there); not constructed directly. ``next(sampler)`` returns what ``sample`` (or
    ``sample_sequences``) returns, and asks its threads for the batch that comes
    ``prefetch`` calls later. Use it from the thread that adds. :meth:`close` (or a
    ``with`` block, or dropping the sampler, or :meth:`ReplayBuffer.clear`) stops its
    threads; ``next()`` then raises StopIteration.

    Args:
        draw: the buffer's draw of one batch (fields read, frames pinned).
        gate: the buffer's :class:`DrawGate`.
        fill: ``fill(drawn, outs)``: the batch, its frames copied into an output set.
        prefetch: batches asked for ahead of the one ``next()`` returns.
        sets: ``2 * prefetch + 1`` output sets (fresh arrays), used in turn: a batch's set
            is refilled ``prefetch + 1`` calls after it.
    """

    def __init__(self, draw: Callable, gate: DrawGate, fill: Callable, prefetch: int, sets):
        self._closed = True  # until the threads run: close() and __del__ have nothing to do
        self._draw, self._gate, self._fill = draw, gate, fill
        self._prefetch, self._sets = prefetch, list(sets)
        self._count = 0  # batches asked for: the next one goes to set _count % len(sets)
        self._fills: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = [False]  # set by close(); a plain flag: no lock a signal could leave held
        first = [draw() for _ in range(prefetch)]  # one that raises starts nothing
        self._copying = threading.Lock()
        args = (self._fills, self._done, self._stop, self._copying)
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
        """True once :meth:`close` ran (or the buffer was cleared): its thread has stopped."""
        return self._stop[0]

    def _submit(self, drawn) -> None:
        """Ask the threads for the next batch: ``drawn``, or None to draw it there (owed)."""
        outs = self._sets[self._count % len(self._sets)]
        self._count += 1
        job = (drawn, self._draw, self._fills, self._stop, (self._fill, outs))
        self._gate.ask(job, drawn is None)

    def __iter__(self) -> Sampler:
        return self

    def __next__(self):
        """The next batch; asks the threads for the one ``prefetch`` calls later first.

        Raises:
            StopIteration: the sampler is closed.
            ValueError: the draw of this batch raised, as ``sample`` would (e.g. nothing
                sampleable yet): it changed nothing, and the sampler goes on.
            Any exception the copying thread raised (e.g. MemoryError), with its
            traceback; the sampler is closed then.
        """
        if self._stop[0]:
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
        """Stop the copying thread and drop the batches drawn ahead (their frames with them).

        Waits for a copy in progress to end; draws already asked for are still made and
        dropped (the buffer's next call waits for them); idempotent. The batches returned
        so far stay valid.
        """
        if self._closed:  # done (an interrupted close is done again)
            return
        self._stop[0] = True  # no batch passed on from now on (DrawGate.forward)
        _live.discard(self)
        self._gate.fence()
        self._fills.put(None)  # the copier ends after the batches passed on before
        if self._copier is not threading.current_thread():  # not a collection in it
            self._copier.join()
        _drain(self._fills, self._done)  # batches passed on, or copied, not taken
        self._done.put((None, None))  # wakes a next() waiting in another thread
        self._closed = True

    def _forked(self) -> None:
        """Closed after ``fork`` (no thread of it in the child): ``next()`` stops, not waits."""
        self._stop[0] = True
        _drain(self._fills, self._done)  # the parent's batches: their frames let go
        self._closed = True

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self.close()

    def __repr__(self):
        state = "closed" if self.closed else f"prefetch={self.prefetch}"
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
    _fork.held = []


def _hold_draws() -> None:
    """Before a fork: no draw or copy in progress, whose RNG lock or batch would stay held.

    A thread the child has not would hold them for ever. The locks are taken in one
    order: the drawing threads' before the draws' (as the threads take them).
    """
    gates, samplers = list(_gates), list(_live)
    _fork.held = [lock for group in ([g._busy for g in gates], [g.drawing for g in gates],
                                     [s._copying for s in samplers])
                  for lock in sorted(group, key=id)]  # fmt: skip
    for lock in _fork.held:
        lock.acquire()


def _let_draws() -> None:  # after a fork, in the parent
    for lock in getattr(_fork, "held", ()):
        lock.release()
    _fork.held = []


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(before=_hold_draws, after_in_parent=_let_draws, after_in_child=_forget_all)
