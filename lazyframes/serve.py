"""Batches served through shared memory to learners in other processes, by the buffer's owner.

The owner of a buffer makes a :class:`BatchServer` (a file in shared memory) and calls its
:meth:`~BatchServer.pump` between adds; each learner process reads its batches with a
:class:`BatchClient`. docs/SHARED.md: the file, the protocol, what a learner can break.

Example:
    >>> import numpy as np
    >>> from lazyframes.replay import ReplayBuffer
    >>> from lazyframes.serve import BatchClient, BatchServer
    >>> rb = ReplayBuffer(1000, seed=0)
    >>> frames = np.repeat(np.arange(30, dtype=np.uint8), 84 * 84).reshape(30, 84, 84)
    >>> for t in range(20):  # frame t is filled with t; transition t's action is t
    ...     rb.add(frames[t : t + 4], t, 1.0, frames[t + 1 : t + 5], False, False)
    >>> server = BatchServer(rb, 32, learners=1, prefetch=1)
    >>> learner = BatchClient(server.path, learner=0)  # in another process, usually
    >>> server.pump()  # in the owner's loop, between adds: published prefetch + 1 batches
    2
    >>> batch = learner.next(timeout=10)
    >>> bool((batch.observations[:, 0, 0, 0] == batch.actions).all()), batch.observations.shape
    (True, (32, 4, 84, 84))
    >>> learner.close()
    >>> server.close()
"""

from __future__ import annotations

import fcntl
import itertools
import json
import math
import mmap
import os
import time

import numpy as np

from . import _checks as C
from . import _core
from .replay import PrioritizedReplayBuffer, Sampler, Samples

__all__ = ["BatchClient", "BatchServer"]

MAGIC, VERSION = b"LFSERVE\0", 1
HEAD_BYTES = 64  # magic, version, JSON length, the closed word (at 16); then the JSON
# A learner's region: claim word (its client's pid), status word (1: disconnected), the
# batch ring's and the update ring's control blocks, its slots, its records (SHARED.md).
CLAIM, STATUS, BATCHES, UPDATES, SLOTS = 0, 8, 64, 192, 320
ALIGN, PAGE = 64, mmap.PAGESIZE
MAX_PREFETCH = 1024  # bounds the views a client makes of a header (a hostile one's too)
_FIELDS = Samples._fields
_INTS = ("batch_size", "slots", "prefetch", "records", "learners", "slot_bytes", "record_bytes",
         "learner_bytes", "first", "owner")  # fmt: skip
_BAD = "the header is not a batch server's for this file (garbage, truncated, another version)"


def _up(n: int, align: int = ALIGN) -> int:
    return -(-n // align) * align


def _names(keys) -> list:
    """``(field, key)`` of each leaf of a batch (key None but for Dict observations)."""
    return [(f, k) for f in _FIELDS for k in (keys if keys and "obs" in f else [None])]


def _layout(B: int, P: int, learners: int, prioritized: bool, batch: Samples, keys) -> dict:
    """The description in the header: the leaves of a slot, the sizes of each region."""
    leaves, at = [], 0
    for f, k in _names(keys):
        a = np.asarray(getattr(batch, f) if k is None else getattr(batch, f)[k])
        leaves.append({"field": f, "key": k, "dtype": a.dtype.str, "shape": a.shape, "offset": at})
        at = _up(at + a.nbytes)
    S, slot, record = 2 * P + 1, max(at, ALIGN), _up(8 + 12 * B)  # count, int64[B], float32[B]
    return {"batch_size": B, "slots": S, "prefetch": P, "records": S, "learners": learners,
            "prioritized": prioritized, "keys": keys, "leaves": leaves, "slot_bytes": slot,
            "record_bytes": record, "learner_bytes": _up(SLOTS + S * (slot + record), PAGE),
            "owner": os.getpid()}  # fmt: skip


def _checked(d, size: int) -> dict:
    """``d`` (the header's JSON) if it describes a file of ``size`` bytes, else ValueError."""
    if not isinstance(d, dict) or not all(type(d.get(k)) is int and d[k] >= 0 for k in _INTS) \
            or "keys" not in d or "leaves" not in d:  # fmt: skip
        raise ValueError(_BAD)
    B, S, L, keys, leaves = d["batch_size"], d["slots"], d["learners"], d["keys"], d["leaves"]
    need = SLOTS + S * d["slot_bytes"] + d["records"] * d["record_bytes"]
    if (min(B, L, d["records"]) < 1 or 2 * d["prefetch"] + 1 != S or d["first"] % PAGE
            or d["first"] < HEAD_BYTES or d["record_bytes"] < 8 + 12 * B
            or d["learner_bytes"] < need
            or (d["slot_bytes"] | d["record_bytes"]) % ALIGN or d["learner_bytes"] % PAGE
            or d["slot_bytes"] < ALIGN or d["prefetch"] > MAX_PREFETCH
            or not (keys is None or (isinstance(keys, list) and all(type(k) is str for k in keys)))
            or not isinstance(d.get("prioritized"), bool) or not isinstance(leaves, list)
            or [(x.get("field"), x.get("key")) if isinstance(x, dict) else x for x in leaves]
            != _names(keys)):  # fmt: skip
        raise ValueError(_BAD)
    if d["first"] + L * d["learner_bytes"] != size:
        raise ValueError(f"the file is {size} bytes, its header describes another size")
    for x in leaves:
        shape, at = x.get("shape"), x.get("offset")
        ints = type(shape) is list and all(type(i) is int and i >= 0 for i in shape)
        try:
            n = np.dtype(x.get("dtype")).itemsize * math.prod(shape) if ints else -1
        except (TypeError, ValueError):
            n = -1
        bad = n < 0 or np.dtype(x["dtype"]).hasobject or not shape or shape[0] != B
        if bad or type(at) is not int or at < 0 or at % ALIGN or at + n > d["slot_bytes"]:
            raise ValueError(f"{_BAD}: a leaf {x!r}")
    return d


def _region(buf, base: int, d: dict, writable: bool) -> tuple:
    """A learner's slots (``{(field, key): view}``) and records (count, indices, priorities)."""
    slots = []
    for s in range(d["slots"]):
        at, views = base + SLOTS + s * d["slot_bytes"], {}
        for x in d["leaves"]:
            shape = tuple(x["shape"])
            a = np.frombuffer(buf, x["dtype"], math.prod(shape), at + x["offset"]).reshape(shape)
            a.flags.writeable = writable
            views[(x["field"], x["key"])] = a
        slots.append(views)
    B, at = d["batch_size"], base + SLOTS + d["slots"] * d["slot_bytes"]
    names, offsets = ["count", "indices", "priorities"], [0, 8, 8 + 8 * B]
    formats, size = ["<i8", ("<i8", B), ("<f4", B)], d["record_bytes"]
    record = np.dtype({"names": names, "offsets": offsets, "formats": formats, "itemsize": size})
    return slots, np.frombuffer(buf, record, d["records"], at)


class _Learner:
    """The owner's side of one learner: its sampler, its counters (private), its views."""

    def __init__(self, buf, base: int, d: dict, frame_keys, sampler_of):
        self.slots, self.records = _region(buf, base, d, True)
        self.batches = _core.Handoff(buf, base + BATCHES, d["slots"])
        self.updates = _core.Handoff(buf, base + UPDATES, d["records"])
        self.status = _core.SharedWord(buf, base + STATUS)
        self.head = self.utail = self.updated = 0  # batches published, records taken
        self.error: str | None = None
        pair, fk = ("observations", "next_observations"), frame_keys  # the sampler's out sets:
        sets = [
            [{k: v[(f, k)] for k in fk} if fk else v[(f, None)] for f in pair] for v in self.slots
        ]
        self._sets, self._sampler_of = sets, sampler_of
        self.sampler: Sampler | None = None
        self.resume()  # the frames of each slot gathered into it

    def pause(self) -> None:
        """Drop the sampler after a draw that raised (nothing sampleable for a while).

        It would go on one set ahead of the slots the learner reads; :meth:`resume` makes
        a new one, in step.
        """
        if self.sampler is not None:
            self.sampler.close()  # (waits for its copy: nothing writes into the sets after)
            self.sampler = None

    def resume(self) -> Sampler:
        """A new sampler whose first batch goes to slot ``head % S``.

        Raises ValueError while its first draws find nothing sampleable.
        """
        r = self.head % len(self._sets)
        self.sampler = sampler = self._sampler_of(self._sets[r:] + self._sets[:r])
        return sampler

    def disconnect(self, why: str) -> None:
        """Serve this learner no more (its error recorded); its region is left as it is."""
        if self.error is None:
            self.error = why
            self.pause()
            self.status.store(1)


class BatchServer:
    """Serve batches of ``rb`` to learner processes through a file in shared memory.

    Learner ``i`` has its own ``rb.sampler`` whose ``2 * prefetch + 1`` output sets are
    its slots in the file (the frames gathered straight into them; the other fields are
    copied in). Call :meth:`pump` from the thread that adds, :meth:`close` at the end.

    **Slot reuse.** Batch ``j`` of a learner lives in slot ``j % S`` (``S = 2 * prefetch
    + 1``); the sampler starts refilling that slot with batch ``j + S`` when it is asked
    for batch ``j + prefetch + 1``. So :meth:`pump` takes batch ``j`` from the sampler
    only once the learner has released batch ``j - prefetch - 1``: only while ``head -
    tail <= prefetch`` (``head``: batches published, ``tail``: batches the learner
    released). A learner holds at most ``prefetch + 1`` published batches; the other
    ``prefetch`` slots are being filled.

    Args:
        rb: the buffer, with a sampleable transition (prioritized: takes updates).
        batch_size, dtype, scale: as ``rb.sampler``'s; ``beta`` too (prioritized only).
        learners: how many learners (each a :class:`BatchClient` of its own index).
        prefetch: batches each sampler gathers ahead, at least 1.

    Attributes:
        path: the file learners open (``/proc/<pid>/fd/<fd>``): a memfd, sealed against
            resizing (a learner cannot truncate it under the owner), its memory
            allocated at once and freed with the last process that maps it (nothing is
            left behind when the owner is killed).

    Raises:
        ValueError, TypeError: as ``rb.sampler``. OSError: no memory for the file.
    """

    _learners: list[_Learner]

    def __init__(self, rb, batch_size, *, learners=1, prefetch=2, dtype=None, scale=None,
                 beta=None):  # fmt: skip
        prioritized = isinstance(rb, PrioritizedReplayBuffer)  # (a uniform one refuses beta)
        B, L, P = int(batch_size), int(learners), int(prefetch)
        if L < 1 or not 1 <= P <= MAX_PREFETCH:  # P >= 1: the first draws check rb is sampleable
            raise ValueError(f"learners must be at least 1 and prefetch in [1, {MAX_PREFETCH}], "
                             f"got {L}, {P}")  # fmt: skip
        pools = rb.pool  # one FramePool, or a dict of them by frame key (Dict)
        keys = list(rb.observation_shape) if isinstance(pools, dict) else None
        # the exact leaves of a batch, once: a gather of position 0 (no draw: the RNG stays)
        probe = rb.gather(np.zeros(B, np.int64), dtype=dtype, scale=scale)
        d = _layout(B, P, L, prioritized, probe, keys)
        d["first"] = _up(HEAD_BYTES + len(json.dumps(d)) + 64, PAGE)  # + its own entry
        text = json.dumps(d).encode()
        self._rb, self._d, self._closed, self._learners = rb, d, True, []
        self._pid, size = os.getpid(), d["first"] + L * d["learner_bytes"]
        fd = os.memfd_create("lazyframes-serve", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.posix_fallocate(fd, 0, size)  # every page now: no SIGBUS on a full memory later
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
            self._buf = mmap.mmap(fd, size)
            self._buf[HEAD_BYTES : HEAD_BYTES + len(text)] = text
            self._buf[:16] = MAGIC + np.array([VERSION, len(text)], "<u4").tobytes()
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._closed = fd, False  # its name, once the header is written
        self.path = f"/proc/{self._pid}/fd/{fd}"
        opts = {
            "prefetch": P,
            "dtype": dtype,
            "scale": scale,
            **({"beta": beta} if beta is not None else {}),
        }
        try:
            for i in range(L):
                base, fk = d["first"] + i * d["learner_bytes"], keys and list(pools)
                sampler_of = lambda out: rb.sampler(B, out=out, **opts)  # noqa: E731
                self._learners.append(_Learner(self._buf, base, d, fk, sampler_of))
        except BaseException:
            self.close()
            raise

    @property
    def status(self) -> list:
        """Per learner, ``(batches published, updates applied, why it was disconnected)``."""
        return [(x.head, x.updated, x.error) for x in self._learners]

    def pump(self) -> int:
        """Apply the learners' priority updates, publish the batches they have room for.

        Never waits for a learner (at most ``prefetch + 1`` batches each, gathered ahead).
        A learner whose counter or update is impossible (a broken counter or count, an
        index the buffer refuses, a priority not positive and finite) is disconnected, its
        error in :attr:`status`; nothing is raised for it. A draw that finds nothing
        sampleable (a buffer whose transitions are all open n-step windows for a while)
        publishes nothing more for that learner this time, and its next batches are drawn
        from the pumps after. Returns the batches published.
        """
        if self._closed:
            raise ValueError("the server is closed")
        published = 0
        for x in self._learners:  # the updates first: the draws asked for next see them
            if x.error is None:
                self._apply(x)
            if x.error is None:
                published += self._publish(x)
        return published

    def _publish(self, x: _Learner) -> int:
        P, S, n = self._d["prefetch"], self._d["slots"], 0
        while (room := x.batches.room(x.head)) >= S - P:  # i.e. head - tail <= prefetch
            try:
                batch = next(x.sampler if x.sampler is not None else x.resume())
            except StopIteration as e:  # closed (rb.clear())
                x.disconnect(f"its sampler stopped: {e!r}")
                return n
            except ValueError:  # a draw found nothing sampleable: drawn again at a later pump
                x.pause()
                return n
            for (field, key), dst in x.slots[x.head % S].items():
                src = getattr(batch, field) if key is None else getattr(batch, field)[key]
                if src is not dst:  # (the frames: gathered into the slot already)
                    dst[...] = src
            x.head += 1
            x.batches.publish(x.head)
            n += 1
        if room < 0:  # a tail no learner can have stored
            x.disconnect(f"its released count is impossible (published {x.head})")
        return n

    def _apply(self, x: _Learner) -> None:
        if (ready := x.updates.ready(x.utail)) < 0:  # else at most `records`
            x.disconnect(f"its published count of updates is impossible (taken {x.utail})")
        B, R = self._d["batch_size"], self._d["records"]
        for _ in range(ready):
            rec = x.records[x.utail % R]
            m = int(rec["count"])  # read once: the learner may change it meanwhile
            idx, pri = rec["indices"][: max(m, 0)].copy(), rec["priorities"][: max(m, 0)].copy()
            x.utail += 1
            x.updates.release(x.utail)
            why = (f"an update of {m} priorities (batch_size {B})" if not 0 <= m <= B
                   else "a priority update to a uniform buffer" if not self._d["prioritized"]
                   else "a priority not positive and finite"
                   if not (np.isfinite(pri).all() and (pri > 0).all()) else None)  # fmt: skip
            if why:
                return x.disconnect(why)
            try:
                self._rb.update_priorities(idx, pri, skip_evicted=True)
            except (ValueError, TypeError, OverflowError) as e:
                return x.disconnect(f"an update the buffer refused: {e}")
            x.updated += 1
        return None

    def close(self) -> None:
        """Stop the samplers, tell the learners (``next()`` raises), close the file (once).

        Only in the process that made the server (a forked child's exit closes nothing).
        """
        if getattr(self, "_closed", True) or os.getpid() != self._pid:
            return
        self._closed = True
        for x in self._learners:
            x.pause()
        _core.SharedWord(self._buf, 16).store(1)
        os.close(self._fd)  # the memory goes with the last learner's mapping

    __del__ = close

    def __enter__(self) -> BatchServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class BatchClient:
    """A learner's end of a :class:`BatchServer`: its batches, and its priority updates.

    Claims learner ``learner`` of the file at ``path`` (its claim word: this process's pid;
    a gone process's claim is taken over) once the whole header is checked against the
    file's size. Raises ValueError for a file that is not a server's (truncated, garbage,
    another version) or ``learner`` out of range, RuntimeError if a live process has it.
    """

    def __init__(self, path, *, learner=0):
        with open(path, "r+b") as f:
            buf = mmap.mmap(f.fileno(), 0)  # an empty file: ValueError
        try:
            magic, (version, n) = buf[:8], np.frombuffer(buf[8:16], "<u4").tolist()
            if magic != MAGIC or version != VERSION or n > len(buf) - HEAD_BYTES:
                raise ValueError
            d = json.loads(buf[HEAD_BYTES : HEAD_BYTES + n])
        except (UnicodeDecodeError, ValueError):
            raise ValueError(f"{path}: {_BAD}") from None
        d, i = _checked(d, len(buf)), int(learner)
        if not 0 <= i < d["learners"]:
            raise ValueError(f"learner {i} out of range [0, {d['learners']})")
        base = d["first"] + i * d["learner_bytes"]
        self._d, self.learner, self.path, self._claimed = d, i, path, False
        self.batch_size, self.prioritized = d["batch_size"], d["prioritized"]  # (the server's)
        self._claim = _core.SharedWord(buf, base + CLAIM)
        pid = os.getpid()
        ok, seen = self._claim.cas(0, pid)
        while not ok:  # one client per learner (in this process too); a dead one's is taken
            if seen == pid or _alive(seen):
                raise RuntimeError(f"learner {i} is claimed by process {seen}, alive")
            ok, seen = self._claim.cas(seen, pid)
        self._claimed, self._holding, self._pid = True, False, pid
        self._status, self._shut = _core.SharedWord(buf, base + STATUS), _core.SharedWord(buf, 16)
        self._batches = _core.Handoff(buf, base + BATCHES, d["slots"])
        self._updates = _core.Handoff(buf, base + UPDATES, d["records"])
        # where a previous client of this learner stopped (0 for the first)
        self._tail = _core.SharedWord(buf, base + BATCHES + 64).load()
        self._uhead = _core.SharedWord(buf, base + UPDATES).load()
        slots, self._records = _region(buf, base, d, False)
        keys = d["keys"]  # per slot, its views as Samples
        self._samples = [Samples._make({k: v[(f, k)] for k in keys} if keys and "obs" in f
                         else v[(f, None)] for f in _FIELDS) for v in slots]  # fmt: skip

    def next(self, timeout=None) -> Samples:
        """The next batch: views into a slot, **valid until the next call** (or close).

        Releases the batch the previous call returned, then waits for one (``timeout``
        seconds at most; None: no limit). Raises TimeoutError, or ConnectionError once the
        server closed, died or disconnected this learner (the batches published are lost).
        """
        self._release()  # (in the claiming process only)
        self._until(lambda: self._batches.ready(self._tail), timeout)
        self._holding = True
        return self._samples[self._tail % self._d["slots"]]

    def update_priorities(self, indices, priorities, timeout=None) -> None:
        """Send new priorities of a batch's transitions (``Samples.indices``) to the owner.

        The owner applies them with ``skip_evicted=True`` at its next :meth:`pump`; an
        update it refuses disconnects this learner. Waits while ``2 * prefetch + 1``
        are not taken (``timeout``, TimeoutError, ConnectionError: as :meth:`next`).
        TypeError: a uniform buffer; ValueError: sizes that differ or exceed batch_size.
        """
        if not self.prioritized:
            raise TypeError("the server's buffer is not a PrioritizedReplayBuffer")
        self._own()
        idx, pri = np.asarray(indices).reshape(-1), np.asarray(priorities, np.float32).reshape(-1)
        idx = idx if idx.size else idx.astype(np.int64)  # [] is a float array
        if idx.dtype.kind not in "iu" or idx.size != pri.size or idx.size > self.batch_size:
            raise ValueError(f"{idx.size} integer indices and {pri.size} priorities (at most "
                             f"batch_size {self.batch_size} of each, as many)")  # fmt: skip
        self._until(lambda: self._updates.room(self._uhead), timeout)
        rec = self._records[self._uhead % self._d["records"]]
        rec["indices"][: idx.size], rec["priorities"][: idx.size], rec["count"] = idx, pri, idx.size
        self._uhead += 1
        self._updates.publish(self._uhead)

    def _until(self, count, timeout) -> None:
        """Poll ``count()`` until it is not 0; raise if -1, closed, disconnected or late."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for spins in itertools.count():
            if self._status.load() or self._shut.load():
                raise ConnectionError("the server closed, or disconnected this learner")
            if (n := count()) != 0:
                break
            if spins % 1000 == 999 and not _alive(self._d["owner"]):
                raise ConnectionError("the server's process is gone")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("nothing came in time")
            time.sleep(0 if spins < 100 else 1e-4 if spins < 2000 else 1e-3)
        if n < 0:
            raise ConnectionError("the server's counter is impossible (a broken file)")

    def _own(self) -> None:
        if os.getpid() != self._pid:  # two processes would read one ring: torn batches
            raise RuntimeError(f"learner {self.learner} is process {self._pid}'s: a forked "
                               f"child makes its own BatchClient")  # fmt: skip

    def _release(self) -> None:
        self._own()
        if self._holding:
            self._holding = False
            self._tail += 1
            self._batches.release(self._tail)

    def close(self) -> None:
        """Release the batch held and the claim (another client may take this learner)."""
        if self._claimed and os.getpid() == self._pid:  # (a forked child's: nothing)
            self._release()
            self._claim.cas(os.getpid(), 0)
            self._claimed = False


def _alive(pid: int) -> bool:
    """True if process ``pid`` exists (ours or another user's); False for 0 or a gone one."""
    return 0 < pid < 2**31 and C.process_exists(pid)
