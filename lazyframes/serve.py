"""Batches served through shared memory to learners in other processes, by the buffer's owner.

The process that owns a :class:`~lazyframes.replay.ReplayBuffer` (the one that adds)
makes a :class:`BatchServer`: a file in ``/dev/shm`` holding, per learner, a ring of
batch slots and a ring of priority-update records. Each learner process opens it with a
:class:`BatchClient`. The owner's loop calls :meth:`BatchServer.pump` between adds: it
hands each learner with a free slot the next batch of that learner's own
:meth:`~lazyframes.replay.ReplayBuffer.sampler` (the sampler gathers the frames straight
into the shared slot: no extra copy) and applies the priority updates the learners sent.
A slot passes from one side to the other through two counters with release/acquire
atomics (``csrc/handoff.c``); a learner that stops reading, dies or scribbles over its
region only loses its own batches. docs/SHARED.md describes the file and the protocol.

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

import contextlib
import json
import math
import mmap
import os
import secrets
import time

import numpy as np

from . import _core
from .replay import PrioritizedReplayBuffer, Samples

__all__ = ["BatchClient", "BatchServer"]

MAGIC, VERSION = b"LFSERVE\0", 1
HEAD_BYTES = 64  # magic, version, JSON length, the closed word (at 16); then the JSON
# A learner's region: its claim word (its client's pid), its status word (owner: 0 served,
# 1 disconnected), the control blocks of its batch ring (owner -> learner) and update ring
# (learner -> owner), then its slots and its update records.
CLAIM, STATUS, BATCHES, UPDATES, SLOTS = 0, 8, 64, 192, 320
ALIGN, PAGE = 64, mmap.PAGESIZE
_FIELDS = Samples._fields
_INTS = ("batch_size", "slots", "prefetch", "records", "learners", "slot_bytes", "record_bytes",
         "learner_bytes", "first", "owner")  # fmt: skip


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
    if not isinstance(d, dict) or not all(type(d.get(k)) is int and d[k] >= 0 for k in _INTS):
        raise ValueError("the header is not a batch server's description")
    B, S, L, keys = d["batch_size"], d["slots"], d["learners"], d.get("keys")
    if min(B, L) < 1 or 2 * d["prefetch"] + 1 != S or d["records"] < 1 or d["first"] % PAGE:
        raise ValueError("the header's sizes are not a batch server's")
    if d["record_bytes"] < 8 + 12 * B or d["slot_bytes"] % ALIGN or d["record_bytes"] % ALIGN:
        raise ValueError("the header's record or slot size is too small or unaligned")
    need = SLOTS + S * d["slot_bytes"] + d["records"] * d["record_bytes"]
    if d["learner_bytes"] < need or d["learner_bytes"] % PAGE or d["first"] < HEAD_BYTES:
        raise ValueError("the header's learner region is too small for its slots")
    if d["first"] + L * d["learner_bytes"] != size:
        raise ValueError(f"the file is {size} bytes, its header describes another size")
    if not (keys is None or (isinstance(keys, list) and all(type(k) is str for k in keys))):
        raise ValueError("the header's keys are not strings")
    leaves = d.get("leaves")
    if not isinstance(d.get("prioritized"), bool) or not isinstance(leaves, list):
        raise ValueError("the header has no list of leaves")
    names = [(x.get("field"), x.get("key")) if isinstance(x, dict) else x for x in leaves]
    if names != _names(keys):
        raise ValueError("the header's leaves are not a batch's")
    for x in leaves:
        shape, at = x.get("shape"), x.get("offset")
        try:
            dtype = np.dtype(x.get("dtype"))
        except (TypeError, ValueError):
            raise ValueError(f"a bad dtype in the header: {x!r}") from None
        if not isinstance(shape, list) or not shape or shape[0] != B or dtype.hasobject:
            raise ValueError(f"a bad leaf in the header: {x!r}")
        if not all(type(n) is int and n >= 0 for n in [*shape, at]) or at % ALIGN:
            raise ValueError(f"a bad shape or offset in the header: {x!r}")
        if at + math.prod(shape) * dtype.itemsize > d["slot_bytes"]:
            raise ValueError(f"a leaf outside its slot in the header: {x!r}")
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
    records = []
    for r in range(d["records"]):
        o = at + r * d["record_bytes"]
        records.append((np.frombuffer(buf, np.int64, 1, o), np.frombuffer(buf, np.int64, B, o + 8),
                        np.frombuffer(buf, np.float32, B, o + 8 + 8 * B)))  # fmt: skip
    return slots, records


class _Learner:
    """The owner's side of one learner: its sampler, its counters (private), its views."""

    def __init__(self, buf, base: int, d: dict, frame_keys, sampler_of):
        self.slots, self.records = _region(buf, base, d, True)
        self.batches = _core.Handoff(buf, base + BATCHES, d["slots"])
        self.updates = _core.Handoff(buf, base + UPDATES, d["records"])
        self.status = _core.SharedWord(buf, base + STATUS)
        self.head = self.utail = self.updated = 0  # batches published, records taken
        self.error: str | None = None
        pair = ("observations", "next_observations")  # the frames: the sampler's output sets
        if frame_keys is None:
            self.sampler = sampler_of([tuple(v[(f, None)] for f in pair) for v in self.slots])
        else:
            self.sampler = sampler_of(
                [tuple({k: v[(f, k)] for k in frame_keys} for f in pair) for v in self.slots]
            )

    def disconnect(self, why: str) -> None:
        """Serve this learner no more (its error recorded); its region is left as it is."""
        if self.error is None:
            self.error = why
            self.sampler.close()
            self.status.store(1)


class BatchServer:
    """Serve batches of ``rb`` to learner processes through a file in shared memory.

    Each learner ``i`` gets its own :meth:`~lazyframes.replay.ReplayBuffer.sampler` of
    ``rb`` (``PrioritizedReplayBuffer``: with ``beta``), whose ``2 * prefetch + 1`` output
    sets are the learner's slots in the file: the frames are gathered straight into shared
    memory; the other fields are copied in. Call :meth:`pump` from the thread that adds
    (it is the owner's only work), :meth:`close` at the end.

    **Slot reuse.** Batch ``j`` of a learner lives in slot ``j % S`` (``S = 2 * prefetch
    + 1``); the sampler starts refilling that slot with batch ``j + S`` when it is asked
    for batch ``j + prefetch + 1``. So :meth:`pump` takes batch ``j`` from the sampler
    only once the learner has released batch ``j - prefetch - 1``: only while ``head -
    tail <= prefetch`` (``head``: batches published, ``tail``: batches the learner
    released). A learner holds at most ``prefetch + 1`` published batches; the other
    ``prefetch`` slots are being filled.

    Args:
        rb: the buffer (a :class:`~lazyframes.replay.PrioritizedReplayBuffer` takes
            priority updates); it must hold a sampleable transition.
        batch_size: transitions per batch.
        learners: how many learners (each a :class:`BatchClient` of its own index).
        prefetch: batches each sampler gathers ahead, at least 1 (``slots = 2 * prefetch +
            1``).
        dtype, scale: the observations' output dtype and scale, as ``rb.sample``'s.
        beta: the importance-sampling exponent (prioritized buffers only; default theirs).
        path: the file to create (default: a new name in ``/dev/shm``); it must not exist.

    Raises:
        ValueError, TypeError: as ``rb.sampler``; ``beta`` for a uniform buffer.
        FileExistsError: ``path`` exists.
    """

    _learners: list[_Learner]

    def __init__(self, rb, batch_size, *, learners=1, prefetch=2, dtype=None, scale=None,
                 beta=None, path=None):  # fmt: skip
        prioritized = isinstance(rb, PrioritizedReplayBuffer)
        if beta is not None and not prioritized:
            raise TypeError("beta is for a PrioritizedReplayBuffer")
        B, L, P = int(batch_size), int(learners), int(prefetch)
        if L < 1 or P < 1:  # prefetch >= 1: the sampler's first draws check rb is sampleable
            raise ValueError(f"learners and prefetch must be at least 1, got {L}, {P}")
        pools = rb.pool  # one FramePool, or a dict of them by frame key (Dict)
        keys = list(rb.observation_shape) if isinstance(pools, dict) else None
        # the exact leaves of a batch, once: a gather of position 0 (no draw: the RNG stays)
        probe = rb.gather(np.zeros(B, np.int64), dtype=dtype, scale=scale)
        d = _layout(B, P, L, prioritized, probe, keys)
        d["first"] = _up(HEAD_BYTES + len(json.dumps(d)) + 64, PAGE)  # + its own entry
        text = json.dumps(d).encode()
        self._rb, self._d, self._closed, self._learners = rb, d, True, []
        self.path = path or f"/dev/shm/lazyframes-serve-{os.getpid()}-{secrets.token_hex(4)}"
        tmp = f"{self.path}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, d["first"] + L * d["learner_bytes"])
            self._buf = mmap.mmap(fd, d["first"] + L * d["learner_bytes"])
            self._buf[HEAD_BYTES : HEAD_BYTES + len(text)] = text
            self._buf[:16] = MAGIC + np.array([VERSION, len(text)], "<u4").tobytes()
            os.link(tmp, self.path)  # a client never opens a half-written file
            self._closed = False  # the file is ours: close() removes it
        finally:
            os.close(fd)
            os.unlink(tmp)
        opts = {"prefetch": P, "dtype": dtype, "scale": scale}
        opts.update({"beta": beta} if beta is not None else {})
        try:
            for i in range(L):
                base, fk = d["first"] + i * d["learner_bytes"], keys and list(pools)
                sampler_of = lambda out: rb.sampler(B, out=out, **opts)  # noqa: E731
                self._learners.append(_Learner(self._buf, base, d, fk, sampler_of))
        except BaseException:
            self.close()
            raise

    @property
    def errors(self) -> tuple:
        """Per learner, why it was disconnected (None: still served)."""
        return tuple(x.error for x in self._learners)

    @property
    def published(self) -> tuple:
        """Per learner, the batches published to it so far."""
        return tuple(x.head for x in self._learners)

    @property
    def updates(self) -> tuple:
        """Per learner, the priority-update records applied so far."""
        return tuple(x.updated for x in self._learners)

    def pump(self) -> int:
        """Apply the learners' priority updates; publish the batches they have room for.

        Never waits for a learner: a learner with no free slot is skipped. Each learner
        gets at most ``prefetch + 1`` batches per call (the wait is the copy of batches
        its sampler gathered ahead). A learner whose counter or update is impossible (a
        broken counter, a count above ``batch_size``, an index the buffer refuses, a
        priority that is not positive and finite) is disconnected, its error in
        :attr:`errors`; nothing is raised for it.

        Returns:
            The number of batches published.

        Raises:
            ValueError: the server is closed.
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
                batch = next(x.sampler)
            except (StopIteration, ValueError) as e:  # closed (rb.clear()), or a failed draw:
                x.disconnect(f"its sampler stopped: {e!r}")  # its sets are out of step
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
            count, idx, pri = x.records[x.utail % R]
            m = int(count[0])  # read once: the learner may change it meanwhile
            idx, pri = idx[: max(m, 0)].copy(), pri[: max(m, 0)].copy()
            x.utail += 1
            x.updates.release(x.utail)
            if not 0 <= m <= B:
                return x.disconnect(f"an update of {m} priorities (batch_size {B})")
            if not self._d["prioritized"]:
                return x.disconnect("a priority update to a uniform buffer")
            if not (np.isfinite(pri).all() and (pri > 0).all()):
                return x.disconnect("an update with a priority not positive and finite")
            try:
                self._rb.update_priorities(idx, pri, skip_evicted=True)
            except (ValueError, TypeError, OverflowError) as e:
                return x.disconnect(f"an update the buffer refused: {e}")
            x.updated += 1
        return None

    def close(self) -> None:
        """Stop the samplers, tell the learners (their ``next()`` raises), remove the file.

        The learners' mappings stay valid (the batches they hold included); idempotent.
        """
        if getattr(self, "_closed", True):  # closed, or no file made
            return
        self._closed = True
        for x in self._learners:
            x.sampler.close()
        if hasattr(self, "_buf"):
            _core.SharedWord(self._buf, 16).store(1)
        with contextlib.suppress(FileNotFoundError):  # removed by someone else
            os.unlink(self.path)

    def __del__(self):
        self.close()

    def __enter__(self) -> BatchServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self):
        return f"<lazyframes BatchServer {self.path} learners={len(self._learners)}>"


class BatchClient:
    """A learner's end of a :class:`BatchServer`: its batches, and its priority updates.

    Claims learner ``learner`` of the file at ``path`` (its claim word holds this
    process's pid; a claim whose process is gone is taken over). The whole header is
    checked against the file's size before any view is made.

    Raises:
        ValueError: not a batch server's file (truncated, garbage, another version), or
            ``learner`` out of range.
        RuntimeError: learner ``learner`` is claimed by a live process.
    """

    def __init__(self, path, *, learner=0):
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size < HEAD_BYTES:
                raise ValueError(f"{path}: {size} bytes, too short for a batch server's file")
            buf = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        magic, (version, n) = buf[:8], np.frombuffer(buf[8:16], "<u4").tolist()
        if magic != MAGIC or version != VERSION:
            raise ValueError(f"{path}: not a batch server's file of version {VERSION}")
        if n > size - HEAD_BYTES:
            raise ValueError(f"{path}: its header is longer than the file")
        try:
            d = json.loads(bytes(buf[HEAD_BYTES : HEAD_BYTES + n]))
        except (UnicodeDecodeError, ValueError):
            raise ValueError(f"{path}: its header is not JSON") from None
        d = _checked(d, size)
        i = int(learner)
        if not 0 <= i < d["learners"]:
            raise ValueError(f"learner {i} out of range [0, {d['learners']})")
        base = d["first"] + i * d["learner_bytes"]
        self._d, self.learner, self.path, self._claimed = d, i, path, False
        self._claim = _core.SharedWord(buf, base + CLAIM)
        pid = os.getpid()
        ok, seen = self._claim.cas(0, pid)
        while not ok:  # one client per learner (in this process too); a dead one's is taken
            if seen == pid or _alive(seen):
                raise RuntimeError(f"learner {i} is claimed by process {seen}, alive")
            ok, seen = self._claim.cas(seen, pid)
        self._claimed, self._holding = True, False
        self._status, self._shut = _core.SharedWord(buf, base + STATUS), _core.SharedWord(buf, 16)
        self._batches = _core.Handoff(buf, base + BATCHES, d["slots"])
        self._updates = _core.Handoff(buf, base + UPDATES, d["records"])
        # where a previous client of this learner stopped (0 for the first)
        self._tail = _core.SharedWord(buf, base + BATCHES + 64).load()
        self._uhead = _core.SharedWord(buf, base + UPDATES).load()
        slots, self._records = _region(buf, base, d, False)
        obs = ("observations", "next_observations")
        self._samples = [
            Samples._make(
                {k: v[(f, k)] for k in d["keys"]} if d["keys"] and f in obs else v[(f, None)]
                for f in _FIELDS
            )
            for v in slots
        ]

    @property
    def batch_size(self) -> int:
        """Transitions per batch."""
        return self._d["batch_size"]

    @property
    def prioritized(self) -> bool:
        """True when the server takes priority updates."""
        return self._d["prioritized"]

    def next(self, timeout=None) -> Samples:
        """The next batch: views into a slot, **valid until the next call** (or close).

        Releases the batch the previous call returned, then waits for one (``timeout``
        seconds at most; None: until one comes). Once the server closed or disconnected
        this learner, raises (the batches published before are not returned).

        Raises:
            TimeoutError: none came in time. ConnectionError: the server closed, died
            or disconnected this learner (its counter or an update was impossible).
        """
        self._release()
        self._until(lambda: self._batches.ready(self._tail), timeout)
        self._holding = True
        return self._samples[self._tail % self._d["slots"]]

    def update_priorities(self, indices, priorities, timeout=None) -> None:
        """Send new priorities of a batch's transitions (``Samples.indices``) to the owner.

        The owner applies them with ``skip_evicted=True`` at its next :meth:`pump`; an
        update it refuses disconnects this learner. Waits while ``2 * prefetch + 1``
        updates are not yet taken (``timeout`` as :meth:`next`).

        Raises:
            TypeError: the server's buffer is not prioritized.
            ValueError: sizes that differ or exceed ``batch_size``.
            TimeoutError, ConnectionError: as :meth:`next`.
        """
        if not self.prioritized:
            raise TypeError("the server's buffer is not a PrioritizedReplayBuffer")
        idx = np.asarray(indices).reshape(-1)
        pri = np.asarray(priorities, np.float32).reshape(-1)
        if idx.dtype.kind not in "iu" or idx.size != pri.size or idx.size > self.batch_size:
            raise ValueError(f"{idx.size} integer indices and {pri.size} priorities (at most "
                             f"batch_size {self.batch_size} of each, as many)")  # fmt: skip
        self._until(lambda: self._updates.room(self._uhead), timeout)
        count, di, dp = self._records[self._uhead % self._d["records"]]
        di[: idx.size], dp[: idx.size], count[0] = idx, pri, idx.size
        self._uhead += 1
        self._updates.publish(self._uhead)

    def _until(self, count, timeout) -> None:
        """Poll ``count()`` until it is not 0; raise if -1, closed, disconnected or late."""
        deadline = None if timeout is None else time.monotonic() + timeout
        spins = 0
        while True:
            if self._status.load() or self._shut.load():
                raise ConnectionError("the server closed, or disconnected this learner")
            if (n := count()) != 0:
                break
            if spins % 1000 == 999 and not _alive(self._d["owner"]):
                raise ConnectionError("the server's process is gone")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("nothing came in time")
            time.sleep(0 if spins < 100 else 1e-4 if spins < 2000 else 1e-3)
            spins += 1
        if n < 0:
            raise ConnectionError("the server's counter is impossible (a broken file)")

    def _release(self) -> None:
        if self._holding:
            self._holding = False
            self._tail += 1
            self._batches.release(self._tail)

    def close(self) -> None:
        """Release the batch held and the claim (another client may take this learner)."""
        if self._claimed:
            self._release()
            self._claim.cas(os.getpid(), 0)
            self._claimed = False

    def __enter__(self) -> BatchClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self):
        return f"<lazyframes BatchClient {self.path} learner={self.learner}>"


def _alive(pid: int) -> bool:
    """True if process ``pid`` exists (ours or not); False for 0 or a gone one."""
    try:
        os.kill(pid, 0) if 0 < pid < 2**31 else None
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return 0 < pid < 2**31
