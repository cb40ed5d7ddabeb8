"""Transitions across processes and machines with each frame sent once.

An actor feeds a :class:`Sender` what it would feed :meth:`ReplayBuffer.add
<lazyframes.ReplayBuffer.add>`; :meth:`Sender.flush` returns a *message*: the frames the
receiver has not seen yet, each once (compressed with the core's ``encode_frames`` when
compression is on, as the receiving pool stores them), and the transitions as references
into them. A :class:`Receiver` checks a message, untrusted input, before it writes
anything, then adds it to a :class:`~lazyframes.ReplayBuffer` as the same ``add`` calls
made locally would. A message
is a ``dict`` of plain values, so any transport that pickles carries it (Ray,
multiprocessing queues); a stream's messages must arrive in order. The format, the checks
and the costs: docs/TRANSPORT.md. This module imports no distributed framework;
examples/apex_ray.py runs it on Ray.

Example:
    >>> import numpy as np, lazyframes
    >>> from lazyframes.transport import Receiver, Sender
    >>> pool = lazyframes.FramePool((84, 84), np.uint8)
    >>> frames = [pool.push(np.full((84, 84), v, np.uint8)) for v in range(7)]
    >>> sender = Sender(compress=True)
    >>> for t in range(3):  # three steps of one env, 4 stacked frames
    ...     obs = pool.lazy(frames[t : t + 4], layout="stack")
    ...     nxt = pool.lazy(frames[t + 1 : t + 5], layout="stack")
    ...     sender.add(obs, 1, 0.5, nxt, False, False)
    >>> msg = sender.flush()  # 7 frames, each once, and 3 transitions of references
    >>> msg["transitions"], len(msg["sizes"])
    (3, 7)
    >>> rb = lazyframes.ReplayBuffer(100, compress=True)
    >>> receiver = Receiver(rb, frame_shape=(84, 84), dtype=np.uint8)  # never the messages'
    >>> receiver.open(num_envs=1)
    0
    >>> receiver.ingest(msg)
    3
    >>> len(rb), rb.memory()["unique_frames"]
    (3, 7)
"""

from __future__ import annotations

import itertools
import operator
import pickle
import secrets
import zlib
from typing import Any

import numpy as np

from . import _checks as C
from . import _core
from .replay import _ring
from .replay._archive import decode_piece
from .replay._args import Parser, options
from .replay._store import FrameStore, check_pool_geometry, own_pool

__all__ = ["FORMAT", "Receiver", "Sender", "wire_bytes"]

#: The ``format`` field of every message, and the version this module reads and writes.
FORMAT = "lazyframes.transport"
VERSION = 4
#: Keys of a message (docs/TRANSPORT.md).
KEYS = frozenset((
    "format", "version", "stream", "nonce", "seq", "frame_shape", "dtype", "stack_size",
    "layout", "carry", "payload", "sizes", "kinds", "crcs", "transitions", "obs", "next_obs",
    "env", "action", "reward", "flags", "retain",
))  # fmt: skip
#: Flag bits of a transition on the wire: those of the replay buffer.
TERM, TRUNC, SKIP = _ring.TERM, _ring.TRUNC, _ring.SKIP
PIECE = 256  # frames decoded at once by a receiver that does not adopt them (1.8 MB of 84x84)


def wire_bytes(obj) -> int:
    """Bytes ``obj`` costs on the wire, pickled as Ray and ``multiprocessing`` pickle it.

    The length of ``pickle.dumps(obj, protocol=5)`` with NumPy's buffers taken
    out-of-band (as Ray sends them), plus those buffers' sizes.

    Example:
        >>> wire_bytes(np.zeros((4, 84, 84), np.uint8)) > 4 * 84 * 84
        True
    """
    buffers: list = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return len(head) + sum(memoryview(b).nbytes for b in buffers)


def _id_dtype(n: int) -> np.dtype:
    """The smallest unsigned dtype for ids in ``[0, n)``."""
    return np.dtype(np.uint16 if n <= 1 << 16 else np.uint32)


class Sender:
    """The actor side: turns transitions into messages that carry each new frame once.

    :meth:`add` takes what :meth:`ReplayBuffer.add <lazyframes.ReplayBuffer.add>`
    takes and keeps references to the frames until :meth:`flush` turns everything added
    since the last flush into one message. Frames are identified by slot (ndarray
    observations are de-duplicated against the same env's previous one, as the replay
    buffer does), so each is sent once; the frames of each env's latest observation are
    kept, by both sides, for the next message to refer to (docs/TRANSPORT.md). Each
    sender draws a random 64-bit :attr:`nonce`, carried by its messages: the receiver
    binds a stream to the first sender it hears from and refuses the messages of another.

    Args:
        num_envs: env streams of this sender (the receiver's ``open(num_envs)``).
        stream: the id :meth:`Receiver.open` returned for this sender.
        compress: compress the new frames with the core's ``encode_frames``, as a
            compressing receiver stores them: True (the default codec,
            docs/COMPRESSION.md), a mapping of ``codec``/``level``/``group``, or False
            to send them raw.
        action_shape: shape of one action, ``()`` for a discrete action.
        action_dtype: dtype the actions are sent in (the receiver casts them exactly to
            its buffer's, refusing values that do not fit).
        layout: layout of ndarray observations, as ``ReplayBuffer(layout=)``.
        stack_size: ``k``, needed for ndarray observations in the ``"first"``/``"last"``
            layouts.

    Raises:
        ValueError, TypeError: bad options (the replay buffer's messages).
    """

    def __init__(self, *, num_envs=1, stream=0, compress=True, action_shape=(),
                 action_dtype=np.int64, layout=None, stack_size=None):  # fmt: skip
        num_envs, action_shape, action_dtype, layout, k = options(
            num_envs, action_shape, action_dtype, layout, stack_size
        )
        self._num_envs, self._stream = num_envs, operator.index(stream)
        self._nonce = secrets.randbits(64)
        self._compress = C.compression(compress)
        self._parser = Parser(num_envs, action_shape, action_dtype)
        self._parser.decided = True  # single observations
        self._frames = FrameStore(1 << 12, layout=layout, stack_size=k)  # small chunks
        self._seq = 0
        self._reset_window()
        self._carry: list = []  # slots the receiver keeps from the last message, in order
        self._carry_owner: Any = None  # holds them
        self._index: dict = {}  # slot -> index in this message's frame table
        # each env's latest next observation (held by the window or the carry owner)
        self._last = np.full((num_envs, 1), -1, np.int64)

    def _reset_window(self) -> None:
        """Forget the transitions added since the last flush (not the carried frames)."""
        self._new: list = []  # new slots, in the order first seen
        self._new_env: list = []  # the env each was first seen in
        self._held: list = []  # owners of the window's slots
        self._rows: list = []  # per add: (obs ids, next ids, envs, actions, rewards, flags)

    @property
    def stream(self) -> int:
        """The receiver's id of this sender's stream."""
        return self._stream

    @property
    def nonce(self) -> int:
        """This sender's random id, in every message: a stream takes one sender's messages."""
        return self._nonce

    @property
    def pending(self) -> int:
        """Transitions added since the last :meth:`flush`."""
        return sum(len(r[2]) for r in self._rows)

    def add(self, obs, action, reward, next_obs, terminated, truncated, *, autoreset=None,
            env_ids=None, final_obs=None, final_mask=None) -> None:  # fmt: skip
        """Queue one transition per env (or per id of ``env_ids``), as ``ReplayBuffer.add``.

        Raises:
            ValueError, TypeError: as :meth:`ReplayBuffer.add
                <lazyframes.ReplayBuffer.add>`; nothing is queued.
        """
        envs, E, batched, values, obs, next_obs, final, _ = self._parser.parse(
            obs, action, reward, next_obs, terminated, truncated, autoreset, env_ids,
            final_obs, final_mask,
        )  # fmt: skip
        envs = np.arange(E) if envs is None else envs
        actions, rewards, flags = self._parser.arrays(values, E)
        frames = self._frames
        parts, plain = frames.prepare(
            obs[0], next_obs[0], final and (final[0], final[1][0]), E, batched, self, envs, values
        )
        # nothing below can fail
        if frames.geometry is None:
            frames.adopt()
            self._last = np.full((self._num_envs, frames.geometry.k), -1, np.int64)
        k = frames.geometry.k
        ids = np.concatenate([np.reshape(p.slots, (E, -1)) for p in parts], axis=1)
        obs_ids, stored = ids[:, :k], ids[:, k:]
        next_ids = np.reshape(plain.slots, (E, -1))[:, -k:]
        # each env's latest (de-duplication candidates): its obs and plain next obs
        latest = frames.pool.lazy_batch(np.concatenate([obs_ids, next_ids], axis=1))
        frames.put(envs.tolist(), (latest,))
        self._held.extend((*parts, plain))
        self._register(envs, obs_ids, stored, next_ids)
        self._rows.append((obs_ids, stored, envs, actions, rewards, flags))
        self._last[envs] = next_ids

    # the frame store's view of its "ring": the sender checks values and keeps each
    # env's latest observation itself
    def check(self, envs, values) -> None:
        """Nothing to check: :meth:`add` checked the values already (``Parser.arrays``)."""

    def newest(self, envs: np.ndarray) -> list:
        """The row of the frame store's table with env ``e``'s latest transition: ``e`` (or -1)."""
        return [e if self._last[e, 0] >= 0 else -1 for e in envs.tolist()]

    def flush(self) -> dict | None:
        """The message of everything added since the last flush, or None if nothing was.

        The message references the frames kept from the previous one (``carry``) and
        carries the frames not sent before, ordered by env then time (so compressed
        deltas run along each env's frames). Send messages in the order they are
        made.
        """
        if not self._rows:
            return None
        g = self._frames.geometry
        layout, k, fs, dt = g.layout, g.k, g.frame_shape, g.dtype
        c, m = len(self._carry), len(self._new)
        # new frames ordered by env, then as first seen (time): the deltas follow an env
        order = np.argsort(np.asarray(self._new_env, np.int64), kind="stable")
        remap = np.empty(c + m, np.int64)
        remap[:c] = np.arange(c)
        remap[c + order] = c + np.arange(m)
        new_slots, ids = np.asarray(self._new, np.int64)[order], _id_dtype(c + m)
        new_env = np.asarray(self._new_env, np.int64)[order]
        index = self._index

        def refs(slots: np.ndarray) -> np.ndarray:
            flat = [index[s] for s in slots.ravel().tolist()]
            return remap[np.asarray(flat, np.int64)].reshape(slots.shape).astype(ids)

        obs = np.concatenate([refs(r[0]) for r in self._rows])
        nxt = np.concatenate([refs(r[1]) for r in self._rows])
        env = np.concatenate([r[2] for r in self._rows]).astype(_id_dtype(self._num_envs))
        if m:
            frames = self._frames.pool.gather(new_slots[:, None], layout="stack").reshape((m, *fs))
        else:
            frames = np.empty((0, *fs), dt)
        payload, sizes, kinds = self._encode(frames, np.flatnonzero(np.diff(new_env, prepend=-1)))
        crcs = _crcs(memoryview(payload).cast("B"), sizes)
        # the frames the receiver keeps: each env's latest observation
        have = self._last[:, 0] >= 0
        keep = list(dict.fromkeys(self._last[have].ravel().tolist()))
        msg = {
            "format": FORMAT,
            "version": VERSION,
            "stream": self._stream,
            "nonce": self._nonce,
            "seq": self._seq,
            "frame_shape": tuple(fs),
            "dtype": dt.str,
            "stack_size": k,
            "layout": layout,
            "carry": c,
            "payload": payload,
            "sizes": sizes,
            "kinds": kinds,
            "crcs": crcs,
            "transitions": int(obs.shape[0]),
            "obs": obs,
            "next_obs": nxt,
            "env": env,
            "action": np.concatenate([r[3] for r in self._rows]),
            "reward": np.concatenate([np.reshape(r[4], -1) for r in self._rows]),
            "flags": np.concatenate([np.reshape(r[5], -1) for r in self._rows]),
            "retain": refs(np.asarray(keep, np.int64)),
        }
        # the kept frames: held before the window's owners are dropped
        self._carry_owner = self._frames.pool.lazy_batch(np.asarray(keep, np.int64)[:, None])
        self._carry, self._index = keep, {s: i for i, s in enumerate(keep)}
        self._seq += 1
        self._reset_window()
        return msg

    def _encode(self, frames: np.ndarray, keys: np.ndarray) -> tuple:
        """``(payload, sizes, kinds)``: the new frames' container, keyframes at ``keys``."""
        m = frames.shape[0]
        raw = np.full(m, _core.KIND_RAW, np.uint8)  # the kinds of m raw blobs
        if m == 0:
            return b"", np.zeros(0, np.uint32), raw
        if self._compress is None:  # the frames' array itself: out-of-band when pickled
            return frames, np.full(m, frames[0].nbytes, np.uint32), raw
        payload, offsets, kinds = _core.encode_frames(frames, keys=keys, **self._compress)
        return payload, np.diff(offsets).astype(np.uint32), kinds

    def resync(self) -> None:
        """Make the next message self-contained (``carry`` 0): it resends every frame it needs.

        After the receiver refused a message (or one was lost), a self-contained message
        is accepted whatever its sequence number, as long as it is not below the next one
        the receiver expects; where messages are missing the receiver breaks each env's
        links, so no n-step window spans the lost steps. Queued transitions are kept.
        """
        if self._carry_owner is not None:  # the queued rows may refer to its frames
            self._held.append(self._carry_owner)
        self._carry, self._carry_owner = [], None
        self._index, self._new, self._new_env = {}, [], []
        for r in self._rows:
            self._register(r[2], r[0], r[1])
        have = np.flatnonzero(self._last[:, 0] >= 0)
        self._register(have, self._last[have])  # the frames the receiver will keep

    def _register(self, envs: np.ndarray, *id_arrays: np.ndarray) -> None:
        """Give each slot of the ids (E, k) not yet in the message the next new index."""
        index, new, new_env, c = self._index, self._new, self._new_env, len(self._carry)
        for ids in id_arrays:
            for e, row in zip(envs.tolist(), ids.tolist(), strict=True):
                for s in row:
                    if s not in index:
                        index[s] = c + len(new)
                        new.append(s)
                        new_env.append(e)


class _Stream:
    """A receiver's state of one sender: its envs, sender, next sequence number, kept frames."""

    __slots__ = ("broken", "carry", "geometry", "nonce", "num_envs", "offset", "seen", "seq")

    def __init__(self, offset: int, num_envs: int, stored: bool):
        self.offset, self.num_envs = offset, num_envs
        self.seen = np.full(num_envs, stored)  # envs that may have a transition in the buffer
        self.broken = np.zeros(num_envs, np.bool_)  # envs whose next transition starts fresh
        self.reopen()

    def reopen(self) -> None:
        """Forget the sender (its nonce, kept frames, sequence); each env starts fresh."""
        self.seq = 0
        self.nonce: int | None = None  # the sender's, bound by its first accepted message
        self.carry: Any = None  # a LazyBatch (c, 1) of the buffer's pool, or None
        self.geometry: Any = None  # (k, layout) of its first message
        self.broken |= self.seen

    @property
    def carried(self) -> int:
        return 0 if self.carry is None else len(self.carry)


class Receiver:
    """The replay side: checks messages of senders and adds them to a ReplayBuffer.

    Each sender is a *stream*, opened with :meth:`open`, which gives it its own
    ``num_envs`` env streams of the buffer (``env_ids`` ``offset .. offset + num_envs``):
    the buffer's ``num_envs`` must cover every sender's envs. :meth:`ingest` pushes a
    message's new frames once into the buffer's pool and adds its transitions as a local
    ``add`` would, to any buffer of the ``ReplayBuffer`` API (a prioritized one too).

    Args:
        replay: the :class:`~lazyframes.ReplayBuffer` to fill (of frame observations).
        frame_shape, dtype: the frames' shape and dtype (default uint8): needed when the
            buffer has no pool yet (one of them is made, with the buffer's compression),
            else they must be its pool's. Messages of other frames are refused: no
            message decides what the receiver allocates.
        max_frames: the most new frames one message may carry: with the frame bytes, a
            bound on the memory one message makes the receiver allocate.

    Raises:
        ValueError: no pool and no ``frame_shape``, or a ``frame_shape``/``dtype`` other
            than the pool's. TypeError: a buffer of Dict observations.

    Example:
        See the module's example.
    """

    def __init__(self, replay, *, frame_shape=None, dtype=None, max_frames=1 << 16):
        pool = replay.pool
        if isinstance(pool, dict):
            raise TypeError("the transport fills buffers of frame observations, not Dict ones")
        if pool is None and frame_shape is None:
            raise ValueError(
                "the buffer has no pool yet: give the frames' geometry, "
                "Receiver(replay, frame_shape=..., dtype=...) (a message never sets it)"
            )
        fs = C.frame_shape(pool.frame_shape if frame_shape is None else frame_shape)
        dt = C.frame_dtype((np.uint8 if pool is None else pool.dtype) if dtype is None else dtype)
        if pool is not None:
            check_pool_geometry(pool, fs, dt)
        self._rb, self._geometry, self._max_frames = replay, (fs, dt), operator.index(max_frames)
        self._streams: list[_Stream] = []

    @property
    def replay(self):
        """The buffer the messages are added to."""
        return self._rb

    def open(self, num_envs=1) -> int:
        """Open a stream of ``num_envs`` envs for one sender; returns its id (``Sender(stream=)``).

        Raises:
            ValueError: the buffer's ``num_envs`` has no room for ``num_envs`` more envs.
        """
        num_envs = operator.index(num_envs)
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        used = sum(st.num_envs for st in self._streams)  # the streams' envs, in order
        if used + num_envs > self._rb.num_envs:
            raise ValueError(
                f"the buffer has num_envs={self._rb.num_envs}, {used} of them "
                f"already opened: no room for {num_envs} more"
            )
        # a buffer holding transitions (restored, or filled locally): its envs' next
        # transitions start fresh, never linked to those before the stream
        self._streams.append(_Stream(used, num_envs, len(self._rb) > 0))
        return len(self._streams) - 1

    def reopen(self, stream) -> None:
        """Give ``stream`` to a new sender (a restarted actor): the old one's messages end.

        The stream forgets its sender (the next accepted message binds its nonce), the
        frames it kept and its sequence number; each of its envs' next transition starts
        fresh, linked to none before it (no n-step window spans the restart).

        Raises:
            ValueError: ``stream`` is not an open stream.
        """
        sid = operator.index(stream)
        if not 0 <= sid < len(self._streams):
            raise ValueError(f"unknown stream {sid}: open it with Receiver.open first")
        self._streams[sid].reopen()

    def ingest(self, msg) -> int:
        """Check ``msg`` and add its transitions to the buffer; returns how many.

        Raises:
            ValueError, TypeError: a message that fails a check of docs/TRANSPORT.md,
                naming it: its format or version, stream, sender (:meth:`reopen`) or
                sequence, frames other than the receiver's, a frame's checksum or blob,
                counts, ids, shapes or types of its fields, values the buffer refuses.
                Nothing is written (buffer and stream unchanged) when an error is raised.
        """
        rb = self._rb
        p = parse(msg, self._streams, self._geometry, max_frames=self._max_frames)
        pool = rb.pool
        if pool is not None:
            check_pool_geometry(pool, p.frame_shape, p.dtype)
        if p.transitions > rb.capacity:  # bounds the work and the memory of its adds
            T, cap = p.transitions, rb.capacity
            raise ValueError(f"the message has {T} transitions, more than the buffer holds ({cap})")
        if rb.stack_size is not None and p.k != rb.stack_size:
            raise ValueError(
                f"the message has {p.k} frames per observation, the buffer {rb.stack_size}"
            )
        actions, rewards = p.checked_values(rb.action_shape, rb.action_dtype)
        if pool is None:
            pool = own_pool(p.frame_shape, p.dtype, rb.capacity, rb.memory()["compression"])
        new, _held = p.push(pool)  # (_held: holds the new frames)
        # every check passed: add the transitions, keep the retained
        st = p.stream
        table = np.concatenate([st.carry.slots.ravel(), new]) if p.carry else new
        # messages were lost: each env's next transition starts fresh
        broken = st.broken | st.seen if p.seq != st.seq else st.broken.copy()
        env_ids = p.env.astype(np.int64) + st.offset
        term, trunc, skip = p.flag_masks()
        for a, b in _rounds(p.env):
            first = broken[p.env[a:b]]
            if first.any():  # an autoreset placeholder before them ends their windows
                obs = pool.lazy_batch(table[p.obs[a:b][first]], layout=p.layout)
                _placeholders(rb, obs, env_ids[a:b][first])
                broken[p.env[a:b]] = False
            rb.add(
                pool.lazy_batch(table[p.obs[a:b]], layout=p.layout),
                actions[a:b],
                rewards[a:b],
                pool.lazy_batch(table[p.next_obs[a:b]], layout=p.layout),
                term[a:b],
                trunc[a:b],
                autoreset=skip[a:b],
                env_ids=env_ids[a:b],
            )
        st.carry = pool.lazy_batch(table[p.retain][:, None]) if p.retain.size else None
        st.broken = broken
        st.seen[p.env] = True
        p.advance()
        return p.transitions


def _placeholders(rb, obs, env_ids: np.ndarray) -> None:
    """Add an autoreset placeholder (never sampled, ends every n-step window) per env."""
    n, no = len(env_ids), np.zeros(len(env_ids), np.bool_)
    zeros = np.zeros((n, *rb.action_shape), rb.action_dtype), np.zeros(n, np.float32)
    rb.add(obs, *zeros, obs, no, no, autoreset=~no, env_ids=env_ids)


def _crcs(data: memoryview, sizes: np.ndarray) -> np.ndarray:
    """The CRC-32 (``zlib.crc32``) of each blob of ``data``, blob ``j`` of ``sizes[j]`` bytes."""
    o = itertools.pairwise([0, *np.cumsum(sizes, dtype=np.int64).tolist()])
    return np.fromiter((zlib.crc32(data[a:b]) for a, b in o), np.uint32, len(sizes))


class Parsed:
    """A message whose every field was checked by :func:`parse`; nothing decoded yet.

    ``stream`` (the stream's state), ``carry`` (its kept frames the message uses), ``seq``,
    ``frame_shape``, ``dtype``, ``k``, ``layout``, ``transitions`` (``T``), ``obs``/
    ``next_obs`` ``(T, k)`` and ``retain`` references into the frame table (the ``carry``
    kept frames, then the new ones), ``env`` ``(T,)``, ``flags`` ``(T,)``.
    """

    def __init__(self, msg: dict, header: tuple, T: int, arrays: dict):
        self._msg = msg
        self.stream, self.carry, self.seq, self.nonce, *geometry = header
        self.frame_shape, self.dtype, self.k, self.layout = geometry  # all checked once
        self.obs, self.next_obs, self.env = arrays["obs"], arrays["next_obs"], arrays["env"]
        self.retain, self.flags, self.transitions = arrays["retain"], arrays["flags"], T
        self._sizes, self._kinds, self._crcs = arrays["sizes"], arrays["kinds"], arrays["crcs"]

    def checked_values(self, action_shape: tuple, action_dtype: np.dtype) -> tuple:
        """``(actions, rewards)`` cast exactly to ``action_dtype`` and float32.

        Raises:
            ValueError, TypeError: as :meth:`ReplayBuffer.add
                <lazyframes.ReplayBuffer.add>` for actions and rewards.
        """
        T = self.transitions
        action, reward = self._msg["action"], self._msg["reward"]
        if np.shape(reward) != (T,):
            raise ValueError(f"reward has shape {np.shape(reward)}, expected {(T,)}")
        if np.shape(action) != (T, *action_shape):
            raise ValueError(f"action has shape {np.shape(action)}, expected {(T, *action_shape)}")
        return Parser(max(T, 1), action_shape, action_dtype).values(action, reward, T)

    def push(self, pool) -> tuple:
        """``(slots, owners)``: the new frames, each blob's checksum checked, then stored.

        A compressing pool adopts compressed blobs as they are (``FramePool.adopt``), else
        they are decoded and pushed ``PIECE`` at a time (no more exist decoded beside the
        pool's); a blob that does not decode raises, the pieces pushed before it dropped.

        Raises:
            ValueError: a blob whose CRC-32 is not its ``crcs`` entry (naming the frame), a
                container that is not valid (each blob is checked by ``adopt`` or
                ``decode_frames``).
            TypeError: a payload that is not bytes-like.
        """
        try:
            data = memoryview(self._msg["payload"])
            data = data.cast("B") if data.nbytes else memoryview(b"")
        except (TypeError, ValueError):
            what = type(self._msg["payload"]).__name__
            raise TypeError(f"payload must be bytes-like, got {what}") from None
        offsets = np.concatenate([[0], np.cumsum(self._sizes, dtype=np.int64)])
        if offsets[-1] != data.nbytes:
            raise ValueError(
                f"the blobs' offsets end at {offsets[-1]}, the payload has {data.nbytes} bytes"
            )
        kinds, m = self._kinds, len(self._sizes)
        bad = np.flatnonzero(_crcs(data, self._sizes) != self._crcs)
        if bad.size:
            raise ValueError(
                f"frame {bad[0]} of the message (of {m} new frames): its blob's CRC-32 is "
                f"not the sender's, the message was corrupted"
            )
        if pool.compression is not None and not (kinds == _core.KIND_RAW).any():
            batch = pool.adopt(data, offsets, kinds)
            return batch.slots[:, 0], [batch]
        slots, owners, group = np.empty(m, np.int64), [], None
        for a in range(0, m, PIECE):
            b, lo, hi = min(m, a + PIECE), int(offsets[a]), int(offsets[min(m, a + PIECE)])
            frames, group = decode_piece(data[lo:hi], offsets[a : b + 1] - lo, kinds[a:b], group,
                                         self.frame_shape, self.dtype)  # fmt: skip
            owners.append(pool.push_batch(frames, k=1))
            slots[a:b] = owners[-1].slots[:, 0]
        return slots, owners

    def flag_masks(self) -> tuple:
        """``(terminated, truncated, autoreset)`` bool ``(T,)`` from the flag bits."""
        return tuple((self.flags & bit).astype(np.bool_) for bit in (TERM, TRUNC, SKIP))

    def advance(self) -> None:
        """The message is stored: the stream binds its sender, expects the next one."""
        st = self.stream
        st.geometry, st.nonce, st.seq = (self.k, self.layout), self.nonce, self.seq + 1


def parse(msg, streams: list, geometry: tuple, *, max_frames: int) -> Parsed:
    """Check every field of ``msg`` against its stream (of ``streams``); decode nothing.

    ``geometry``: the receiver's ``(frame_shape, dtype)``, which the message must have.

    Raises:
        ValueError, TypeError: as :meth:`Receiver.ingest`, except the checks against the
            buffer (actions, rewards) and of the frame container's blobs.
    """
    header = st, c, *_, k, _ = _header(msg, streams, geometry)
    T = _count(msg["transitions"], "transitions")
    sizes = _uints(msg["sizes"], "sizes", None)
    if sizes.dtype.itemsize > 4:
        raise TypeError(f"sizes must be uint32 (or narrower), got dtype {sizes.dtype}")
    m = sizes.shape[0]
    if m > max_frames:
        raise ValueError(f"the message carries {m} new frames, more than max_frames")
    if m > 2 * k * T + k * st.num_envs:
        raise ValueError(
            f"the message carries {m} new frames for {T} transitions of {k} frames "
            f"(at most {2 * k * T + k * st.num_envs})"
        )
    arrays = {
        "sizes": sizes,
        "kinds": _uints(msg["kinds"], "kinds", (m,), _core.KIND_PACKED + 1),
        "crcs": _uints(msg["crcs"], "crcs", (m,)),
        "obs": _uints(msg["obs"], "obs", (T, k), c + m),
        "next_obs": _uints(msg["next_obs"], "next_obs", (T, k), c + m),
        "env": _uints(msg["env"], "env", (T,), st.num_envs),
        "retain": _uints(msg["retain"], "retain", None, c + m),
        "flags": _uints(msg["flags"], "flags", (T,), (TERM | TRUNC | SKIP) + 1),
    }
    if (arrays["kinds"] == _core.KIND_DELTA).any():  # read only in old checkpoints
        raise ValueError("kinds holds KIND_DELTA, which messages do not use")
    if arrays["retain"].shape[0] > k * st.num_envs:
        raise ValueError(f"retain keeps {arrays['retain'].shape[0]} frames, more than k x num_envs")
    return Parsed(msg, header, T, arrays)


def _header(msg, streams: list, geometry: tuple) -> tuple:
    """``(stream, carry, seq, nonce, frame_shape, dtype, k, layout)`` of ``msg``, checked."""
    if type(msg) is not dict or any(type(key) is not str for key in msg):
        raise TypeError("a message is a dict with str keys")
    fmt, version = msg.get("format"), msg.get("version")  # compared as plain str and int
    if type(fmt) is not str or fmt != FORMAT:
        raise ValueError(f"not a {FORMAT} message: format {fmt!r}")
    if type(version) is not int or version != VERSION:
        raise ValueError(
            f"a {FORMAT} message of version {version!r}; this receiver reads "
            f"version {VERSION} (sender nonces, frame checksums, LZ4 packed patches): run the "
            f"same lazyframes release on the senders as on the receiver"
        )
    if set(msg) != KEYS:
        raise ValueError(f"the message's keys differ from the format's: {sorted(set(msg) ^ KEYS)}")
    sid = _count(msg["stream"], "stream")
    if sid >= len(streams):
        raise ValueError(f"unknown stream {sid}: open it with Receiver.open first")
    st, nonce = streams[sid], _count(msg["nonce"], "nonce")
    if nonce >> 64:
        raise ValueError(f"nonce must be below 2**64, got {nonce}")
    if st.nonce is not None and nonce != st.nonce:
        raise ValueError(
            f"stream {sid} belongs to another sender (nonce {st.nonce}, this message's "
            f"{nonce}): one Sender per stream; a restarted actor's stream is given to its new "
            f"Sender by Receiver.reopen({sid})"
        )
    seq, carry = _count(msg["seq"], "seq"), _count(msg["carry"], "carry")
    if seq < st.seq:
        raise ValueError(
            f"stream {sid}: message {seq} comes after message {st.seq - 1}: a duplicate or "
            f"out of order"
        )
    if carry and (carry != st.carried or seq != st.seq):
        raise ValueError(
            f"stream {sid}: message {seq} refers to {carry} kept frames, the receiver "
            f"keeps {st.carried} after message {st.seq - 1}: messages lost or out of "
            f"order (Sender.resync makes the next message self-contained)"
        )
    fs = msg["frame_shape"]
    if type(fs) is not tuple or len(fs) > C.MAX_NDIM:
        raise TypeError(f"frame_shape must be a tuple of at most {C.MAX_NDIM} ints")
    fs, dt = C.frame_shape(fs), msg["dtype"]  # dtype: the exact string, byte order included
    if type(dt) is not str or (fs, dt) != (geometry[0], geometry[1].str):
        raise ValueError(
            f"stream {sid}: the message's frames are of shape {fs} and dtype {dt!r}, the "
            f"receiver's of shape {geometry[0]} and dtype {geometry[1].str!r}"
        )
    dt = geometry[1]
    k, layout = C.stack_size(msg["stack_size"]), msg["layout"]
    if type(layout) is not str or layout not in C.LAYOUTS:
        raise ValueError(f"layout must be one of {C.LAYOUTS}, got {layout!r}")
    C.check_layout(layout, fs)
    if st.geometry is not None and st.geometry != (k, layout):
        raise ValueError(f"stream {sid} changed its observations to k={k}, layout {layout!r}")
    return st, carry, seq, nonce, fs, dt, k, layout


def _count(x, name: str) -> int:
    """A non-negative int field (TypeError: not an exact integer; ValueError: negative)."""
    if type(x) is not int and not isinstance(x, np.integer):  # no subclass's code runs
        raise TypeError(f"{name} must be an integer, got {type(x).__name__}")
    x = int(x)
    if x < 0:
        raise ValueError(f"{name} must be non-negative, got {x}")
    return x


def _uints(x, name: str, shape: tuple | None, bound: int | None = None) -> np.ndarray:
    """An array field of unsigned integers, of ``shape`` (None: 1-D), each below ``bound``.

    Raises:
        TypeError: not an ndarray of unsigned integers. ValueError: another shape, a
            value out of range.
    """
    if type(x) is not np.ndarray or x.dtype.kind != "u":
        what = f"dtype {x.dtype}" if isinstance(x, np.ndarray) else type(x).__name__
        raise TypeError(f"{name} must be an ndarray of unsigned integers, got {what}")
    if (x.ndim != 1) if shape is None else (x.shape != shape):
        raise ValueError(f"{name} has shape {x.shape}, expected {shape or '1-D'}")
    if bound is not None and x.size and int(x.max()) >= bound:
        raise ValueError(f"{name} holds {int(x.max())}, out of range [0, {bound})")
    return x


def _rounds(env: np.ndarray) -> list:
    """``[(a, b), ...]``: consecutive runs of transitions with distinct envs, one add each."""
    out: list[tuple] = []
    seen, a = set[int](), 0
    for i, e in enumerate(env.tolist()):
        if e in seen:
            out.append((a, i))
            seen, a = set(), i
        seen.add(e)
    if a < len(env):
        out.append((a, len(env)))
    return out
