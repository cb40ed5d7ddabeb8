"""A replay of transitions in a memory-mapped file: one ingest process writes, learners sample.

:class:`SharedReplay` keeps frames once, in a ring of frame slots, and transitions as
frame numbers, in a ring of rows, both in one file mapped by every process that uses it
(put it on ``/dev/shm`` to keep it in memory, the default, or on a disk). One process,
the *writer*, creates the file and adds transitions: from :mod:`lazyframes.transport`
messages (:meth:`SharedReplay.ingest`), or frames and rows directly. Any number of
*reader* processes attach it read-only and :meth:`~SharedReplay.sample` batches from it,
copying each frame once, from the mapping into the batch.

Ownership and locking rules (docs/SHARED.md):

- The writer owns the file: it creates it (published complete, by an atomic rename) and
  removes it (:meth:`SharedReplay.close` with ``unlink=True``). There is one writer.
- Readers map the file read-only (the OS refuses their writes) and take no lock: a
  reader that dies, even mid-copy, leaves nothing behind and the writer never waits.
- Every frame slot and every row carries a sequence word: the number of the frame (row)
  it holds, or -1 while the writer rewrites it. A reader reads the word, copies, reads
  it again, and keeps the copy only if both equal the number it wanted (a *seqlock*);
  otherwise it draws again. A torn or evicted read is never returned. This relies on
  stores becoming visible in program order (x86-64); see docs/SHARED.md.

Transitions are one-step (``n_step`` 1): ``next_observations`` is each transition's own
next observation (the final one of an episode that ended); autoreset placeholders are
not stored.

Example:
    >>> import numpy as np, os, tempfile
    >>> from lazyframes.shared import SharedReplay
    >>> path = os.path.join(tempfile.mkdtemp(), "replay.lfr")
    >>> writer = SharedReplay.create(path, capacity=100, frame_shape=(84, 84), stack_size=4)
    >>> nums = writer.add_frames(np.stack([np.full((84, 84), v, np.uint8) for v in range(5)]))
    >>> writer.add(nums[None, :4], [1], [0.5], nums[None, 1:], [False], [False])
    1
    >>> reader = SharedReplay.attach(path)  # in a learner process
    >>> batch = reader.sample(2, rng=np.random.default_rng(0))
    >>> batch.observations.shape, batch.next_observations[:, -1, 0, 0].tolist()
    ((2, 4, 84, 84), [4, 4])
    >>> reader.close()
    >>> writer.close(unlink=True)
"""

from __future__ import annotations

import math
import mmap
import operator
import os
from typing import Any, NamedTuple

import numpy as np

from . import _common as C
from . import transport

__all__ = ["SharedReplay", "SharedSamples"]

MAGIC = 0x314250524653464C  # b"LFSFRPB1" little-endian
VERSION = 1
MAX_NDIM = 8
#: Header words (int64): the geometry, then the two counters the writer publishes.
_MAGIC, _VERSION, _K, _ROWS, _SLOTS, _FRAME_BYTES, _NDIM = range(7)
_SHAPE = 7  # MAX_NDIM words
_DTYPE = _SHAPE + MAX_NDIM  # 2 words: the dtype string, 16 bytes
_FRAMES_WRITTEN = _DTYPE + 2
_ROWS_WRITTEN = _FRAMES_WRITTEN + 1
HEADER_WORDS = 32
#: Frame dtypes a file may declare (its dtype string is checked against these).
_DTYPES = frozenset(
    np.dtype(t).str for t in ("u1", "i1", "<u2", "<i2", "<u4", "<i4", "<f2", "<f4", "<f8")
)
#: Attempts of a sample to draw rows it reads consistently before it gives up.
MAX_ATTEMPTS = 100


class SharedSamples(NamedTuple):
    """One batch from :meth:`SharedReplay.sample` (fields as ``ReplaySamples``).

    Attributes:
        observations, next_observations: ``(B, k, *frame_shape)`` of the frames' dtype.
        actions: int64 ``(B,)``. rewards: float32 ``(B,)``.
        dones: float32 ``(B,)``, 1.0 where the episode terminated (not when truncated).
        truncations: float32 ``(B,)``. indices: int64 ``(B,)``, the rows' numbers.
    """

    observations: np.ndarray
    actions: np.ndarray
    next_observations: np.ndarray
    dones: np.ndarray
    rewards: np.ndarray
    truncations: np.ndarray
    indices: np.ndarray


def _layout(k: int, rows: int, slots: int, frame_bytes: int) -> dict:
    """Byte offsets of the file's arrays, and its size: every array 8-byte aligned."""
    off, out = HEADER_WORDS * 8, {}
    for name, nbytes in (
        ("frame_seq", 8 * slots),
        ("row_seq", 8 * rows),
        ("refs", 8 * rows * 2 * k),
        ("actions", 8 * rows),
        ("rewards", 4 * rows),
        ("flags", rows),
        ("frames", slots * frame_bytes),
    ):
        out[name] = off
        off += -(-nbytes // 8) * 8
    out["size"] = off
    return out


class SharedReplay:
    """Transitions in a memory-mapped file, written by one process and sampled by many.

    Made by :meth:`create` (the writer) or :meth:`attach` (a reader), never directly.
    Frame ``f`` (numbered from 0 in the order written) lives in slot ``f % frame_capacity``
    until frame ``f + frame_capacity`` replaces it; row ``t`` in row ``t % capacity``. A
    row whose frames were replaced is skipped by :meth:`sample`, so ``frame_capacity``
    should hold the frames of ``capacity`` transitions (about one new frame per
    transition, plus the ``k`` frames of each env's current observation): the default is
    twice ``capacity``.
    """

    # set by _open (and create): the file, its mapping and the views of its arrays (None
    # once closed); the writer's transport streams
    _path: str
    _mm: Any
    _writable: bool
    _head: Any
    _frame_seq: Any
    _row_seq: Any
    _refs: Any
    _actions: Any
    _rewards: Any
    _flags: Any
    _frames: Any
    _streams: list
    _next_env: int
    _max_frames: int

    def __init__(self, *_: Any, **__: Any):
        raise TypeError("use SharedReplay.create(path, ...) or SharedReplay.attach(path)")

    # -- construction -------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        path,
        *,
        capacity,
        frame_shape,
        dtype=np.uint8,
        stack_size=4,
        frame_capacity=None,
        max_frames=1 << 16,
    ) -> SharedReplay:
        """Create the file at ``path`` (an existing one is replaced) and return its writer.

        Args:
            path: the file; on ``/dev/shm`` it lives in memory.
            capacity: rows (transitions) kept, oldest replaced first.
            frame_shape: shape of one frame.
            dtype: the frames' dtype (numeric).
            stack_size: ``k``, frames per observation.
            frame_capacity: frame slots (default ``2 * capacity``).
            max_frames: as ``transport.Receiver``'s, for :meth:`ingest`.

        Raises:
            ValueError, TypeError: a bad size, shape or dtype.
        """
        rows = operator.index(capacity)
        slots = 2 * rows if frame_capacity is None else operator.index(frame_capacity)
        k = C.stack_size(stack_size)
        fs = C.frame_shape(frame_shape)
        dt = C.frame_dtype(dtype)
        if rows < 1 or slots < 1:
            raise ValueError(f"capacity and frame_capacity must be positive, got {rows}, {slots}")
        if len(fs) > MAX_NDIM or dt.str not in _DTYPES:
            raise ValueError(f"frames of shape {fs} and dtype {dt} cannot be shared")
        fb = math.prod(fs) * dt.itemsize
        size = _layout(k, rows, slots, fb)["size"]
        tmp = f"{os.fspath(path)}.tmp-{os.getpid()}"
        with open(tmp, "wb") as fh:
            fh.truncate(size)
            head = np.zeros(HEADER_WORDS, "<i8")
            head[[_MAGIC, _VERSION, _K, _ROWS, _SLOTS, _FRAME_BYTES, _NDIM]] = (
                MAGIC,
                VERSION,
                k,
                rows,
                slots,
                fb,
                len(fs),
            )
            head[_SHAPE : _SHAPE + len(fs)] = fs
            head[_DTYPE : _DTYPE + 2] = np.frombuffer(dt.str.encode().ljust(16, b"\0"), "<i8")
            fh.write(head.tobytes())
        self = object.__new__(cls)
        self._open(tmp, writable=True)
        self._frame_seq[:] = -1
        self._row_seq[:] = -1
        os.replace(tmp, path)  # published complete: a reader never sees a partial header
        self._path = os.fspath(path)
        self._streams = []
        self._next_env = 0
        self._max_frames = operator.index(max_frames)
        return self

    @classmethod
    def attach(cls, path) -> SharedReplay:
        """Map the file at ``path`` read-only, to sample from it.

        The file is checked (magic, version, geometry, size) before any array is made.

        Raises:
            FileNotFoundError: no such file (e.g. the writer removed it).
            ValueError: not a SharedReplay file, or one whose header and size disagree.
        """
        self = object.__new__(cls)
        self._open(os.fspath(path), writable=False)
        self._path = os.fspath(path)
        return self

    def _open(self, path: str, writable: bool) -> None:
        """Map ``path`` and make the array views, after checking its header and size."""
        flags = os.O_RDWR if writable else os.O_RDONLY
        fd = os.open(path, flags)
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_WORDS * 8:
                raise ValueError(f"{path} is not a SharedReplay file (too short)")
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
            mm = mmap.mmap(fd, size, access=access)
        finally:
            os.close(fd)
        head = np.frombuffer(mm, "<i8", HEADER_WORDS).copy()
        geometry = _check_header(head, size, path)
        self._mm = mm
        self._writable = writable
        self._k, self._rows, self._slots, fs, dt = geometry
        self._frame_shape, self._dtype = fs, dt
        fb = math.prod(fs) * dt.itemsize
        lay = _layout(self._k, self._rows, self._slots, fb)
        buf = memoryview(mm)
        self._head = np.frombuffer(buf, "<i8", HEADER_WORDS)
        self._frame_seq = np.frombuffer(buf, "<i8", self._slots, lay["frame_seq"])
        self._row_seq = np.frombuffer(buf, "<i8", self._rows, lay["row_seq"])
        refs = np.frombuffer(buf, "<i8", self._rows * 2 * self._k, lay["refs"])
        self._refs = refs.reshape(self._rows, 2 * self._k)
        self._actions = np.frombuffer(buf, "<i8", self._rows, lay["actions"])
        self._rewards = np.frombuffer(buf, "<f4", self._rows, lay["rewards"])
        self._flags = np.frombuffer(buf, "u1", self._rows, lay["flags"])
        frames = np.frombuffer(buf, "u1", self._slots * fb, lay["frames"])
        self._frames = frames.reshape(self._slots, fb)

    # -- properties -----------------------------------------------------------------------
    @property
    def path(self) -> str:
        """The file."""
        return self._path

    @property
    def capacity(self) -> int:
        """Rows (transitions) kept."""
        return self._rows

    @property
    def frame_capacity(self) -> int:
        """Frame slots."""
        return self._slots

    @property
    def stack_size(self) -> int:
        """``k``, frames per observation."""
        return self._k

    @property
    def frame_shape(self) -> tuple:
        """Shape of one frame."""
        return self._frame_shape

    @property
    def dtype(self) -> np.dtype:
        """The frames' dtype."""
        return self._dtype

    @property
    def frames_written(self) -> int:
        """Frames written since the file was made (the next frame's number)."""
        self._live()
        return int(self._head[_FRAMES_WRITTEN])

    @property
    def rows_written(self) -> int:
        """Rows written since the file was made (the next row's number)."""
        self._live()
        return int(self._head[_ROWS_WRITTEN])

    def __len__(self) -> int:
        """Rows held: ``min(rows_written, capacity)``."""
        return min(self.rows_written, self._rows)

    def close(self, *, unlink=False) -> None:
        """Unmap the file; the writer may remove it (``unlink=True``).

        Readers that still map it keep reading what it holds (the OS keeps a removed
        file's memory until its last mapping goes).
        """
        if unlink and not self._writable:
            raise ValueError("only the writer removes the file")
        for name in ("_head", "_frame_seq", "_row_seq", "_refs", "_actions", "_rewards"):
            setattr(self, name, None)
        self._flags = self._frames = None
        mm, self._mm = getattr(self, "_mm", None), None
        if mm is not None:
            mm.close()
        if unlink:
            os.unlink(self._path)

    def __reduce__(self):
        raise TypeError("a SharedReplay cannot be pickled; pass its path and attach it")

    # -- the writer -------------------------------------------------------------------------
    def _live(self) -> None:
        """Raises ValueError once :meth:`close` was called."""
        if self._mm is None:
            raise ValueError(f"{self._path} is closed")

    def _writer(self) -> None:
        """Raises ValueError unless this is the (open) writer."""
        self._live()
        if not self._writable:
            raise ValueError("a reader cannot write: only the process that created the file")

    def add_frames(self, frames) -> np.ndarray:
        """Write ``frames`` ``(m, *frame_shape)``; returns their numbers (int64 ``(m,)``).

        Raises:
            ValueError: a reader, a wrong shape, more frames than ``frame_capacity``.
            TypeError: another dtype.
        """
        self._writer()
        a = np.asarray(frames)
        if a.dtype != self._dtype:
            raise TypeError(f"frames have dtype {a.dtype}, the file stores {self._dtype}")
        if a.shape[1:] != self._frame_shape or a.ndim != 1 + len(self._frame_shape):
            raise ValueError(f"frames have shape {a.shape}, expected (m, *{self._frame_shape})")
        m = a.shape[0]
        if m > self._slots:
            raise ValueError(f"{m} frames do not fit {self._slots} frame slots")
        n0 = self.frames_written
        nums = np.arange(n0, n0 + m, dtype=np.int64)
        slots = nums % self._slots
        self._frame_seq[slots] = -1  # readers of these slots see a rewrite from now on
        self._frames[slots] = np.ascontiguousarray(a).reshape(m, -1).view(np.uint8)
        self._frame_seq[slots] = nums
        self._head[_FRAMES_WRITTEN] = n0 + m
        return nums

    def add(self, obs, action, reward, next_obs, terminated, truncated) -> int:
        """Write ``T`` transitions whose observations are frame numbers ``(T, k)``; returns T.

        Raises:
            ValueError: a reader, wrong shapes, frame numbers not yet written, more rows
                than ``capacity``, an action or reward the buffer refuses.
            TypeError: non-integer frame numbers or actions, non-boolean flags.
        """
        self._writer()
        o, n = np.asarray(obs), np.asarray(next_obs)
        for name, x in (("obs", o), ("next_obs", n)):
            if x.dtype.kind not in "iu":
                raise TypeError(f"{name} must be frame numbers (integers), got dtype {x.dtype}")
            if x.ndim != 2 or x.shape[1] != self._k:
                raise ValueError(f"{name} has shape {x.shape}, expected (T, {self._k})")
            if x.size and (x.min() < 0 or x.max() >= self.frames_written):
                raise ValueError(f"{name} refers to frames not written yet")
            if x.size and x.min() < self.frames_written - self._slots:
                raise ValueError(f"{name} refers to frames already replaced (frame_capacity)")
        T = o.shape[0]
        if n.shape[0] != T or self._rows < T:
            raise ValueError(f"{T} and {n.shape[0]} rows: expected as many, at most capacity")
        from .replay import _ingest

        a, r, flags, _ = _ingest.transition_args(
            action, reward, terminated, truncated, None, (T,), (), np.dtype(np.int64)
        )
        self._write_rows(np.concatenate([o, n], axis=1).astype(np.int64), a, r, flags)
        return T

    def _write_rows(self, refs, actions, rewards, flags) -> None:
        """The rows, after every check: sequence words first and last (the seqlock)."""
        T = refs.shape[0]
        t0 = self.rows_written
        nums = np.arange(t0, t0 + T, dtype=np.int64)
        rows = nums % self._rows
        self._row_seq[rows] = -1
        self._refs[rows] = refs
        self._actions[rows] = actions
        self._rewards[rows] = rewards
        self._flags[rows] = flags
        self._row_seq[rows] = nums
        self._head[_ROWS_WRITTEN] = t0 + T

    def open(self, num_envs=1) -> int:
        """Open a stream for one :class:`~lazyframes.transport.Sender`; returns its id."""
        self._writer()
        num_envs = operator.index(num_envs)
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        self._streams.append(transport._Stream(self._next_env, num_envs))
        self._next_env += num_envs
        return len(self._streams) - 1

    def ingest(self, msg) -> int:
        """Check a :mod:`lazyframes.transport` message and write it; returns its transitions.

        Its new frames are written once, its transitions as rows of frame numbers;
        autoreset placeholders are dropped. Checked as ``transport.Receiver.ingest``
        checks, before anything is written.

        Raises:
            ValueError, TypeError: as :meth:`transport.Receiver.ingest
                <lazyframes.transport.Receiver.ingest>`; frames of another geometry than
                the file's; more rows than ``capacity`` or frames than ``frame_capacity``.
        """
        self._writer()
        p = transport.parse(msg, self._streams, max_frames=self._max_frames)
        if (p.frame_shape, p.dtype, p.k) != (self._frame_shape, self._dtype, self._k):
            raise ValueError(
                f"the message has {p.k} frames of shape {p.frame_shape} and dtype {p.dtype}; "
                f"the file stores {self._k} of shape {self._frame_shape} and dtype {self._dtype}"
            )
        actions, rewards = p.checked_values((), np.dtype(np.int64))
        from . import _impl

        frames = p.frames(_impl)
        term, trunc, skip = p.flag_masks()
        keep = ~skip
        if int(keep.sum()) > self._rows or len(frames) > self._slots:
            raise ValueError("the message holds more rows or frames than the file")
        st = p.stream
        carry = np.empty(0, np.int64) if st.carry is None else st.carry
        if carry.size and carry.min() < self.frames_written + len(frames) - self._slots:
            raise ValueError(
                f"the message refers to kept frames its own new frames would replace: "
                f"frame_capacity ({self._slots}) is too small for this traffic"
            )
        new = self.add_frames(frames) if len(frames) else np.empty(0, np.int64)
        table = np.concatenate([carry, new])
        refs = np.concatenate([table[p.obs], table[p.next_obs]], axis=1)[keep]
        flags = (term.view(np.uint8) | trunc.view(np.uint8) * transport.TRUNC)[keep]
        self._write_rows(refs, actions[keep], rewards[keep], flags)
        st.carry = table[p.retain] if p.retain.size else None
        p.advance()
        return p.transitions

    # -- readers ----------------------------------------------------------------------------
    def sample(self, batch_size, *, rng=None) -> SharedSamples:
        """``batch_size`` transitions drawn uniformly (with replacement) from the rows held.

        Each frame is copied once, from the mapping into the batch. A row that the writer
        is rewriting, or whose frames it replaced, is drawn again.

        Args:
            batch_size: ``B >= 1``.
            rng: a ``numpy.random.Generator`` (default: a fresh one).

        Raises:
            ValueError: no row written yet, ``batch_size < 1``.
            RuntimeError: no consistent batch after many draws (the writer overwrites
                rows faster than they are read: give the file more capacity).
        """
        self._live()
        B = operator.index(batch_size)
        if B < 1:
            raise ValueError(f"batch_size must be at least 1, got {B}")
        rng = np.random.default_rng() if rng is None else rng
        k, fs = self._k, self._frame_shape
        obs = np.empty((B, k, *fs), self._dtype)
        nxt = np.empty((B, k, *fs), self._dtype)
        actions = np.empty(B, np.int64)
        rewards = np.empty(B, np.float32)
        flags = np.empty(B, np.uint8)
        numbers = np.empty(B, np.int64)
        todo = np.arange(B)
        for _ in range(MAX_ATTEMPTS):
            got = self._read(todo.size, rng, obs, nxt, actions, rewards, flags, numbers, todo)
            todo = todo[~got]
            if not todo.size:
                break
        else:
            raise RuntimeError(
                f"no consistent batch after {MAX_ATTEMPTS} draws: the writer replaces rows "
                f"or frames faster than they are read"
            )
        return SharedSamples(
            obs,
            actions,
            nxt,
            (flags & transport.TERM).astype(np.float32),
            rewards,
            ((flags & transport.TRUNC) != 0).astype(np.float32),
            numbers,
        )

    def _read(self, n, rng, obs, nxt, actions, rewards, flags, numbers, todo) -> np.ndarray:
        """Draw ``n`` rows and copy them into the outputs at ``todo``; which ones are valid."""
        written = self.rows_written
        if written == 0:
            raise ValueError("the replay holds no transition yet")
        t = rng.integers(max(0, written - self._rows), written, n)
        rows = t % self._rows
        before = self._row_seq[rows]  # fancy indexing: copies
        refs = self._refs[rows]
        a, r, f = self._actions[rows], self._rewards[rows], self._flags[rows]
        ok = (before == t) & (self._row_seq[rows] == t)
        slots = refs % self._slots  # in range whatever the row holds
        seen = self._frame_seq[slots]
        fb = self._frames.shape[1]
        direct = todo.size == obs.shape[0]  # the first pass copies straight into the batch
        o = obs if direct else np.empty((n, self._k, *self._frame_shape), self._dtype)
        x = nxt if direct else np.empty_like(o)
        o8 = o.reshape(n, self._k, -1).view(np.uint8).reshape(n, self._k, fb)
        x8 = x.reshape(n, self._k, -1).view(np.uint8).reshape(n, self._k, fb)
        # mode="wrap": the slots are in range, and "raise" would copy through a buffer
        np.take(self._frames, slots[:, : self._k], axis=0, out=o8, mode="wrap")
        np.take(self._frames, slots[:, self._k :], axis=0, out=x8, mode="wrap")
        ok &= ((seen == refs) & (self._frame_seq[slots] == refs)).all(axis=1)
        if not direct:
            obs[todo[ok]], nxt[todo[ok]] = o[ok], x[ok]
        actions[todo[ok]], rewards[todo[ok]] = a[ok], r[ok]
        flags[todo[ok]], numbers[todo[ok]] = f[ok], t[ok]
        return ok


def _check_header(head: np.ndarray, size: int, path: str) -> tuple:
    """``(k, rows, slots, frame_shape, dtype)`` of a file's header, checked against its size.

    Raises:
        ValueError: not a SharedReplay file, or a header that disagrees with the size.
    """
    if head[_MAGIC] != MAGIC or head[_VERSION] != VERSION:
        raise ValueError(f"{path} is not a SharedReplay file of version {VERSION}")
    k, rows, slots, fb, ndim = (int(head[i]) for i in (_K, _ROWS, _SLOTS, _FRAME_BYTES, _NDIM))
    raw = head[_DTYPE : _DTYPE + 2].tobytes().rstrip(b"\0")
    dts = raw.decode("ascii", "replace")
    if not (0 <= ndim <= MAX_NDIM) or dts not in _DTYPES or min(k, rows, slots) < 1:
        raise ValueError(f"{path}: a corrupt header")
    shape = tuple(int(d) for d in head[_SHAPE : _SHAPE + ndim])
    dt = np.dtype(dts)
    if any(d < 1 for d in shape) or math.prod(shape) * dt.itemsize != fb:
        raise ValueError(f"{path}: a corrupt header (frame shape {shape}, {fb} bytes)")
    if _layout(k, rows, slots, fb)["size"] != size:
        raise ValueError(f"{path}: its size ({size} bytes) does not match its header")
    return k, rows, slots, shape, dt
