"""A sampler: batches drawn and copied out ahead by a background thread, in the caller's order.

``next()`` asks for a draw and its copy; the sampler's thread makes the draw when it comes
to it, unless a call of the buffer comes first and makes it (:class:`DrawGate`), then
copies the batch's frames out, the GIL released, while the caller learns. The design:
docs/DESIGN.md, "Threads and limits".
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import queue
import threading
import weakref
from collections.abc import Callable

_live: weakref.WeakSet = weakref.WeakSet()  # the samplers not closed: closed at exit
_gates: weakref.WeakSet = weakref.WeakSet()  # every gate: for a fork, and a forked child
_fork = threading.local()  # .held: the locks a fork in this thread holds
_DRAW = "draw"  # a sampler thread's job: make the draws owed (DrawGate.settle)


class DrawGate:
    """The draws a buffer's samplers owe, made in the order asked by the first thread there.

    A sampler's ``next()`` asks for a draw (:meth:`ask`) without making it or waking a
    thread: the sampler's thread makes it when it comes to it, which during a learner's
    step is at once. Every buffer call that changes or reads what a draw reads calls
    :meth:`wait` first (add tests :attr:`owed` first), which makes the draws still owed
    in the caller's thread: the buffer never waits for a copy, and never changes under a
    draw. A draw owed stays in :attr:`owed` until its batch is passed on, so a
    ``KeyboardInterrupt`` in the caller's thread never loses one: CPython raises it only
    after a call returns (or at a function's start, or a loop's jump back), and the job
    leaves the queue and its batch is passed on with no call between the two.
    """

    __slots__ = ("__weakref__", "_fwd", "drawing", "owed", "settling")
    owed: collections.deque  # the jobs (draw, fills, stop, copy) whose draw is owed, in order

    def __init__(self):
        self._forked()
        _gates.add(self)

    def ask(self, job: tuple) -> None:
        """Owe the draw of ``job`` (``(draw, fills, stop, copy)``: :meth:`settle`), in one step."""
        self.owed.append(job)

    def settle(self, stop: list | None = None) -> None:
        """Make the draws owed, in the order asked, each passed on to its sampler's thread.

        A draw that raises an error (e.g. nothing sampleable) is passed on as its
        exception, as ``sample`` would raise it; a closed sampler's batch is dropped (the
        RNG moved on as asked) before the draw is paid, so the buffer's next call sees its
        frames released. An interrupt (KeyboardInterrupt) is raised to the caller, the
        draw still owed: made by the next call (the RNG may have moved, as in ``sample``).

        ``stop``: a sampler thread's flag. That thread gives up waiting for another
        thread's draws once its sampler is closed: the closing may be a collection in the
        thread that draws, waiting for this one to end (the buffer's next call makes them).
        """
        if stop is None:
            with self.settling:  # one thread draws at a time: in order (a fork waits for it)
                self._settle()
            return
        while not self.settling.acquire(timeout=0.005):  # (no signal lands in this thread)
            if stop[0]:
                return
        try:
            self._settle()
        finally:
            self.settling.release()

    def _settle(self) -> None:
        while self.owed:
            job = self.owed[0]
            try:
                drawn = job[0]()
            except Exception as e:  # its traceback holds no sampler
                drawn = e
            item: tuple | None = (drawn, job[3])
            drawn = None
            with self._fwd:  # (close() fences: no batch passed on once it is closed)
                if job[2][0]:  # closed: the batch goes, then the draw is paid
                    item = None
                    del self.owed[0]
                else:  # paid, and passed on, with no call between
                    del self.owed[0]
                    job[1].put(item)
            del job, item

    def fence(self) -> None:  # once no batch is passed on: later ones see the sampler closed
        with self._fwd:
            pass

    def wait(self) -> None:
        """Return once no draw is owed: at once (one attribute read) when none is."""
        if self.owed:
            self.settle()

    def _forked(self) -> None:
        """New state (after a fork, no draw owed: the parent's owes the child nothing)."""
        self._fwd = threading.Lock()
        self.drawing = threading.Lock()  # held for each draw (ReplayBuffer._drawn)
        self.settling = threading.Lock()  # held while draws are made: a fork waits for it
        self.owed = collections.deque()


def _drain(*queues) -> None:
    """Drop what ``queues`` hold (None: none); another thread may take from them too."""
    for q in queues:
        with contextlib.suppress(queue.Empty, AttributeError):
            while True:
                q.get_nowait()


def _copies(fills: queue.SimpleQueue, done: queue.SimpleQueue, stop: list, copying,
            gate) -> None:  # fmt: skip
    """A sampler's thread: make the draws owed, fill the batches drawn, in order, until stopped.

    No thread holds a reference to the sampler or its buffer (``gate`` is a weak
    reference to the buffer's), so dropping either closes the sampler. Each result is
    ``(True, samples)``, ``("draw", exception)`` (nothing changed) or ``(False,
    exception)`` (a copy that raised). ``copying`` is held for each batch (a fork waits).
    """
    while (job := fills.get()) is not None:
        if job is _DRAW:  # next() asked for one: made now unless the buffer's call was first
            owner = gate()
            if owner is not None:
                with contextlib.suppress(BaseException):  # (out of memory: a draw it could
                    owner.settle(stop)  # not pass on stays owed, for the buffer's next call)
            del owner
            continue
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
    """An iterator of sampled batches, each drawn and gathered ahead in a background thread.

    Made by :meth:`ReplayBuffer.sampler` and :meth:`ReplayBuffer.sequence_sampler` (see
    there); not constructed directly. ``next(sampler)`` returns what ``sample`` (or
    ``sample_sequences``) returns, and asks its thread for the batch that comes
    ``prefetch`` calls later. Use it from the thread that adds. :meth:`close` (or a
    ``with`` block, or dropping the sampler, or :meth:`ReplayBuffer.clear`) stops its
    thread; ``next()`` then raises StopIteration.

    Args:
        draw: the buffer's draw of one batch (fields read, frames pinned).
        gate: the buffer's :class:`DrawGate`.
        fill: ``fill(drawn, outs)``: the batch, its frames copied into an output set.
        prefetch: batches asked for ahead of the one ``next()`` returns.
        sets: ``2 * prefetch + 1`` output sets (fresh arrays), used in turn: a batch's set
            is refilled ``prefetch + 1`` calls after it.
    """

    _closed = True  # until its thread is made: close() and __del__ have nothing to do

    def __init__(self, draw: Callable, gate: DrawGate, fill: Callable, prefetch: int, sets):
        self._draw, self._gate, self._fill = draw, gate, fill
        self._prefetch, self._sets = prefetch, list(sets)
        self._count = 0  # batches asked for: the next one goes to set _count % len(sets)
        self._fills: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = [False]  # set by close(); a plain flag: no lock a signal could leave held
        first = [draw() for _ in range(prefetch)]  # one that raises starts nothing
        self._copying = threading.Lock()
        args = (self._fills, self._done, self._stop, self._copying, weakref.ref(gate))
        self._copier = threading.Thread(target=_copies, args=args, daemon=True)
        self._copier.name = "lazyframes-sampler"
        self._closed = False  # from here close() ends the thread, even one start() left
        _live.add(self)
        self._copier.start()
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
        """Ask the thread for the next batch: ``drawn``, or None to owe its draw (see DrawGate)."""
        copy = (self._fill, self._sets[self._count % len(self._sets)])
        self._count += 1
        if drawn is not None:
            self._fills.put((drawn, copy))
            return
        self._gate.ask((self._draw, self._fills, self._stop, copy))
        self._fills.put(_DRAW)  # a thread busy with a copy takes it without a wake

    def __iter__(self) -> Sampler:
        return self

    def __next__(self):
        """The next batch; asks its thread for the one ``prefetch`` calls later first.

        Raises:
            StopIteration: the sampler is closed.
            ValueError: the draw of this batch raised, as ``sample`` would (e.g. nothing
                sampleable yet): it changed nothing, and the sampler goes on.
            Any exception the sampler's thread raised in a copy (e.g. MemoryError), with its
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
            del result  # sampler for the garbage collector, which may run in its thread

    def close(self) -> None:
        """Stop the sampler's thread and drop the batches drawn ahead (their frames with them).

        Waits for a copy in progress to end; draws already asked for are still made and
        dropped (by the buffer's next call, if not before); idempotent. The batches returned
        so far stay valid.
        """
        if self._closed:  # done (an interrupted close is done again)
            return
        self._stop[0] = True  # no batch passed on from now on (DrawGate.settle)
        _live.discard(self)
        self._gate.fence()
        self._fills.put(None)  # the thread ends after the batches passed on before
        # not joined: a collection in the thread itself, or a start() interrupted
        joined = self._copier is not threading.current_thread() and self._copier.is_alive()
        if joined:
            self._copier.join()
        _drain(self._fills, self._done)  # batches passed on, or copied, not taken
        if not joined:  # it ends when it comes to this
            self._fills.put(None)
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
    """Stop every sampler's thread before the interpreter winds down."""
    for sampler in list(_live):
        sampler.close()


def _forget_all() -> None:
    """In a child process after ``fork``: every sampler is closed (its thread is not there)."""
    for sampler in list(_live):
        sampler._forked()
    _live.clear()
    for gate in list(_gates):
        gate._forked()
    _fork.held = []


def _hold_draws() -> None:
    """Before a fork: no draw or copy in progress, whose RNG lock or batch would stay held.

    A thread the child has not would hold them for ever. The locks are taken in one
    order: the gates' settling locks before the draws' (as :meth:`DrawGate.settle` takes them).
    """
    gates, samplers = list(_gates), list(_live)
    _fork.held = [lock for group in ([g.settling for g in gates], [g.drawing for g in gates],
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
