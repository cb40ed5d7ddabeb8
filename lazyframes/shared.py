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
import stat
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
#: Compressed files (docs/SHARED.md): the byte log's size and chain bound (0 when frames
#: are stored raw), then the log's write head and the oldest row worth drawing.
_LOG_BYTES, _GROUP, _LOG_HEAD, _ROWS_FROM = range(_ROWS_WRITTEN + 1, _ROWS_WRITTEN + 5)
HEADER_WORDS = 32
#: Frame dtypes a file may declare (its dtype string is checked against these).
_DTYPES = frozenset(
    np.dtype(t).str for t in ("u1", "i1", "<u2", "<i2", "<u4", "<i4", "<f2", "<f4", "<f8")
)
#: Attempts of a sample to draw rows it reads consistently before it gives up.
MAX_ATTEMPTS = 100
#: Largest blob a frame of ``fb`` bytes compresses to: Blosc2's header on incompressible data.
BLOB_OVERHEAD = 32
#: The writer keeps the raw bytes of its last frames (at most this many bytes) to code
#: new frames as deltas against them.
RAW_CACHE_BYTES = 32 << 20


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


class _Plan(NamedTuple):
    """Compressed frames ready to write: numbers, blobs and each slot's record."""

    nums: np.ndarray
    blobs: list
    lens: np.ndarray
    kinds: np.ndarray
    back: np.ndarray  # frame - the frame it is a delta against (0: none)
    base: np.ndarray  # frame - its chain's keyframe
    depth: np.ndarray
    pos: np.ndarray  # each blob's position in the log, counted from the first byte written
    head: int  # the log's head after them

    @property
    def first(self) -> int:
        """Where the first blob starts."""
        return int(self.pos[0]) if self.pos.size else self.head


def _layout(k: int, rows: int, slots: int, frame_bytes: int, log_bytes: int = 0) -> dict:
    """Byte offsets of the file's arrays, and its size: every array 8-byte aligned.

    ``log_bytes`` 0: the frames raw, one per slot; else each slot's blob record and the
    byte log of blobs.
    """
    off, out = HEADER_WORDS * 8, {}
    arrays = [
        ("frame_seq", 8 * slots),
        ("row_seq", 8 * rows),
        ("refs", 8 * rows * 2 * k),
        ("actions", 8 * rows),
        ("rewards", 4 * rows),
        ("flags", rows),
    ]
    if log_bytes:
        arrays += [("blobs", BLOB_RECORD.itemsize * slots), ("log", log_bytes)]
    else:
        arrays.append(("frames", slots * frame_bytes))
    for name, nbytes in arrays:
        out[name] = off
        off += -(-nbytes // 8) * 8
    out["size"] = off
    return out


#: A compressed file's record of each frame slot's blob: its position in the log (bytes
#: written before it), length, kind (``KIND_KEY``, ``KIND_DELTA``, ``KIND_RAW``), and
#: how many frames back its reference (``back``, deltas) and its chain's keyframe
#: (``base``) are; ``depth``: deltas between it and that keyframe.
BLOB_RECORD = np.dtype(
    {
        "names": ["pos", "len", "back", "base", "kind", "depth"],
        "formats": ["<i8", "<u4", "<u4", "<u4", "u1", "u1"],
        "offsets": [0, 8, 12, 16, 20, 21],
        "itemsize": 24,
    }
)

#: The attributes that view the mapping (dropped by close).
_VIEWS = (
    "_head",
    "_frame_seq",
    "_row_seq",
    "_refs",
    "_actions",
    "_rewards",
    "_flags",
    "_frames",
    "_blobs",
    "_words",
    "_log",
)


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
    # the writer of a compressed file: the codec's options ({} when frames are raw), its
    # last frames, raw, by frame number (slot ``number % len``)
    _codec: dict
    _raw: Any
    _raw_num: Any

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
        compress=False,
        log_bytes=None,
    ) -> SharedReplay:
        """Create the file at ``path`` (an existing one is replaced) and return its writer.

        Args:
            path: the file; on ``/dev/shm`` it lives in memory, on a disk it is a replay
                larger than memory (the page cache holds what is hot).
            capacity: rows (transitions) kept, oldest replaced first.
            frame_shape: shape of one frame.
            dtype: the frames' dtype (numeric).
            stack_size: ``k``, frames per observation.
            frame_capacity: frame slots (default ``2 * capacity``).
            max_frames: as ``transport.Receiver``'s, for :meth:`ingest`.
            compress: False (frames raw), True or options ``{codec, level, group}`` as
                ``FramePool(compress=...)`` (default here: lz4, group 4): each frame
                compressed on its own, a keyframe or the XOR delta against its previous
                frame, into a circular byte log of ``log_bytes``.
            log_bytes: the log's size (default ``frame_capacity * frame_bytes // 8``).
                Frames leave in the order written, when their slot or their log bytes
                are reused, whichever comes first.

        Raises:
            ValueError, TypeError: a bad size, shape, dtype or compression option.
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
        opts = C.compression({"group": 4} if compress is True else compress)
        lb = 0
        if opts is not None:
            lb = slots * fb // 8 if log_bytes is None else operator.index(log_bytes)
            if lb < 4 * (fb + BLOB_OVERHEAD):
                raise ValueError(f"log_bytes must hold 4 frames' blobs, {4 * (fb + BLOB_OVERHEAD)}")
            if slots >= 1 << 31:
                raise ValueError("a compressed file holds fewer than 2**31 frame slots")
        size = _layout(k, rows, slots, fb, lb)["size"]
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
            if opts is not None:
                head[[_LOG_BYTES, _GROUP]] = lb, opts["group"]
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
        self._codec = opts or {}
        if opts is not None:  # the raw bytes of the last frames written, by frame number
            n = max(16, min(slots, RAW_CACHE_BYTES // fb))
            self._raw = np.empty((n, fb), np.uint8)
            self._raw_num = np.full(n, -1, np.int64)
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
        fd = os.open(path, flags | os.O_NONBLOCK)  # a FIFO would block until a writer came
        try:
            st = os.fstat(fd)
            size = st.st_size
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{path} is not a SharedReplay file (not a regular file)")
            if size < HEADER_WORDS * 8:
                raise ValueError(f"{path} is not a SharedReplay file (too short)")
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
            mm = mmap.mmap(fd, size, access=access)
            if not writable and hasattr(mmap, "MADV_RANDOM"):
                # a reader's faults read one page, not the pages around it: samples are
                # random, and on a disk read-around doubles a cold batch's time
                mm.madvise(mmap.MADV_RANDOM)
        finally:
            os.close(fd)
        head = np.frombuffer(mm, "<i8", HEADER_WORDS).copy()
        try:
            geometry = _check_header(head, size, path)
        except ValueError:
            mm.close()
            raise
        self._mm = mm
        self._writable = writable
        self._k, self._rows, self._slots, fs, dt, self._log_bytes, self._group = geometry
        self._frame_shape, self._dtype = fs, dt
        fb = math.prod(fs) * dt.itemsize
        self._fb = fb
        lay = _layout(self._k, self._rows, self._slots, fb, self._log_bytes)
        buf = memoryview(mm)
        self._head = np.frombuffer(buf, "<i8", HEADER_WORDS)
        self._frame_seq = np.frombuffer(buf, "<i8", self._slots, lay["frame_seq"])
        self._row_seq = np.frombuffer(buf, "<i8", self._rows, lay["row_seq"])
        refs = np.frombuffer(buf, "<i8", self._rows * 2 * self._k, lay["refs"])
        self._refs = refs.reshape(self._rows, 2 * self._k)
        self._actions = np.frombuffer(buf, "<i8", self._rows, lay["actions"])
        self._rewards = np.frombuffer(buf, "<f4", self._rows, lay["rewards"])
        self._flags = np.frombuffer(buf, "u1", self._rows, lay["flags"])
        if self._log_bytes:
            F = self._slots
            self._blobs = np.frombuffer(buf, BLOB_RECORD, F, lay["blobs"])
            # the same records as 3 words: pos; len | back << 32; base | kind << 32 | ...
            self._words = np.frombuffer(buf, "<i8", 3 * F, lay["blobs"]).reshape(F, 3)
            self._log = np.frombuffer(buf, "u1", self._log_bytes, lay["log"])
        else:
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
        """Rows held: the last ``capacity`` written, less the oldest ones whose frames left."""
        lo = int(self._head[_ROWS_FROM]) if self._mm is not None else 0
        written = self.rows_written
        return written - min(max(lo, written - self._rows, 0), written)

    def close(self, *, unlink=False) -> None:
        """Unmap the file; the writer may remove it (``unlink=True``).

        Readers that still map it keep reading what it holds (the OS keeps a removed
        file's memory until its last mapping goes).
        """
        if unlink and not self._writable:
            raise ValueError("only the writer removes the file")
        for name in _VIEWS:
            setattr(self, name, None)
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

    def add_frames(self, frames, *, prev=None) -> np.ndarray:
        """Write ``frames`` ``(m, *frame_shape)``; returns their numbers (int64 ``(m,)``).

        Args:
            frames: the new frames.
            prev: compressed files: the number of the frame each new frame is coded
                against (its env's previous frame; an earlier frame of this call, or a
                frame written before that is still held), negative for none. Default:
                the frame written just before it (right for one env). A frame whose
                ``prev`` is not at hand, or whose chain is ``group`` long, is a keyframe.

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
        a8 = np.ascontiguousarray(a).reshape(m, -1).view(np.uint8)
        if self._log_bytes:
            plan = self._plan(a8, prev)
            if plan.head - plan.first > self._log_bytes:
                raise ValueError(f"{m} frames' blobs do not fit the {self._log_bytes}-byte log")
            return self._write_plan(plan, a8)
        n0 = self.frames_written
        nums = np.arange(n0, n0 + m, dtype=np.int64)
        slots = nums % self._slots
        self._frame_seq[slots] = -1  # readers of these slots see a rewrite from now on
        self._frames[slots] = a8
        self._frame_seq[slots] = nums
        self._head[_FRAMES_WRITTEN] = n0 + m
        self._advance_rows_from()
        return nums

    def _plan(self, a8: np.ndarray, prev) -> _Plan:
        """Compress frames ``a8`` ``(m, frame bytes)`` and place their blobs; writes nothing."""
        m, fb, F, L, G = a8.shape[0], self._fb, self._slots, self._log_bytes, self._group
        n0 = self.frames_written
        nums = np.arange(n0, n0 + m, dtype=np.int64)
        if prev is None:
            prev = nums - 1
        prev = np.asarray(prev)
        if prev.shape != (m,) or prev.dtype.kind not in "iu":
            raise ValueError(f"prev must be {m} frame numbers (integers), got {prev.shape}")
        prev = prev.astype(np.int64)
        head0 = int(self._head[_LOG_HEAD])
        # a reference must outlive this call: its chain's keyframe above the lowest frame
        # and log position still held once the blobs are written (a bound: each blob at
        # most fb + BLOB_OVERHEAD bytes, and the log's tail skipped at most twice)
        frame_lo = n0 + m - F
        log_lo = head0 + (m + 2) * (fb + BLOB_OVERHEAD) - L
        depth = np.zeros(m, np.int64)
        base = nums.copy()
        delta = np.zeros(m, bool)
        C_ = self._raw_num.size
        for i in range(m):
            p = int(prev[i])
            if p < 0 or p >= n0 + i:
                continue
            if p >= n0:
                d, b = int(depth[p - n0]) + 1, int(base[p - n0])
            elif self._raw_num[p % C_] == p and p >= n0 - F and self._frame_seq[p % F] == p:
                rec = self._blobs[p % F]
                d, b = int(rec["depth"]) + 1, p - int(rec["base"])
            else:
                continue
            if d < G and b >= frame_lo and (b >= n0 or self._blobs[b % F]["pos"] >= log_lo):
                delta[i], depth[i], base[i] = True, d, b
        _impl = _core()
        opts = {key: self._codec[key] for key in ("codec", "level")}
        blobs: list = [None] * m
        kinds = np.zeros(m, np.uint8)
        keys = np.flatnonzero(~delta)
        if keys.size:
            pl, off, kd = _impl.encode_frames(a8[keys], group=1, **opts)
            for j, f in enumerate(keys.tolist()):
                blobs[f], kinds[f] = pl[off[j] : off[j + 1]], kd[j]
        dl = np.flatnonzero(delta)
        if dl.size:
            pairs = np.empty((2 * dl.size, fb), np.uint8)
            p = prev[dl]
            new = p >= n0
            pairs[0::2][new] = a8[p[new] - n0]
            pairs[0::2][~new] = self._raw[p[~new] % C_]
            pairs[1::2] = a8[dl]
            pl, off, kd = _impl.encode_frames(pairs, group=2, **opts)
            for j, f in enumerate(dl.tolist()):
                blobs[f], kinds[f] = pl[off[2 * j + 1] : off[2 * j + 2]], kd[2 * j + 1]
        plain = kinds != C.KIND_DELTA  # the twin writes raw blobs, never deltas
        depth[plain], base[plain] = 0, nums[plain]
        back = np.where(plain, 0, nums - prev)
        lens = np.fromiter((len(x) for x in blobs), np.int64, m)
        pos = np.empty(m, np.int64)
        h = head0
        for i in range(m):  # a blob never wraps: the log's tail is skipped instead
            if h % L + lens[i] > L:
                h += L - h % L
            pos[i] = h
            h += lens[i]
        return _Plan(nums, blobs, lens, kinds, back, nums - base, depth, pos, int(h))

    def _write_plan(self, plan: _Plan, a8: np.ndarray) -> np.ndarray:
        """Publish the planned blobs: the log head first, each slot under its seqlock."""
        F, L = self._slots, self._log_bytes
        nums = plan.nums
        if not nums.size:
            return nums
        self._head[_LOG_HEAD] = plan.head  # bytes below head - L are gone from now on
        slots = nums % F
        rec = np.empty(nums.size, BLOB_RECORD)
        rec["pos"], rec["len"], rec["back"] = plan.pos, plan.lens, plan.back
        rec["base"], rec["kind"], rec["depth"] = plan.base, plan.kinds, plan.depth
        self._frame_seq[slots] = -1
        self._blobs[slots] = rec
        for p, n, blob in zip(plan.pos % L, plan.lens, plan.blobs, strict=True):
            self._log[p : p + n] = np.frombuffer(blob, np.uint8)
        self._frame_seq[slots] = nums
        self._head[_FRAMES_WRITTEN] = nums[-1] + 1
        C_ = self._raw_num.size
        keep = slice(max(0, nums.size - C_), None)
        self._raw[nums[keep] % C_] = a8[keep]
        self._raw_num[nums[keep] % C_] = nums[keep]
        self._advance_rows_from()
        return nums

    def _readable(self, refs: np.ndarray, written=None, head=None) -> np.ndarray:
        """Which frames ``refs`` a reader can read (by the writer: it trusts the file).

        ``written`` and ``head``: the frames written and the log head to judge by
        (default: now; the state after a planned write for :meth:`ingest`).
        """
        F = self._slots
        fw = self.frames_written if written is None else written
        ok = (refs >= fw - F) & (refs < fw)
        ok &= self._frame_seq[refs % F] == refs
        if self._log_bytes:
            hd = int(self._head[_LOG_HEAD]) if head is None else head
            base = refs - self._blobs["base"][refs % F]
            ok &= (base >= fw - F) & (self._blobs["pos"][base % F] >= hd - self._log_bytes)
        return ok

    def _advance_rows_from(self) -> None:
        """Publish the oldest row a reader should draw: the rows before it lost frames."""
        written = self.rows_written
        t = max(int(self._head[_ROWS_FROM]), written - self._rows, 0)
        while t < written:
            n = min(256, written - t)
            ok = self._readable(self._refs[np.arange(t, t + n) % self._rows]).all(axis=1)
            if ok.any():
                t += int(ok.argmax())
                break
            t += n
        self._head[_ROWS_FROM] = t

    def add(self, obs, action, reward, next_obs, terminated, truncated) -> int:
        """Write ``T`` transitions whose observations are frame numbers ``(T, k)``; returns T.

        Raises:
            ValueError: a reader, wrong shapes, frame numbers not yet written, or gone
                (their slots or log bytes reused), more rows than ``capacity``, an action
                or reward the buffer refuses.
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
            if x.size and not self._readable(x.astype(np.int64)).all():
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
        self._advance_rows_from()

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
        m, n0 = len(frames), self.frames_written
        a8 = np.ascontiguousarray(frames).reshape(m, -1).view(np.uint8)
        plan, head = None, None
        if self._log_bytes and m:
            plan = self._plan(a8, _previous_frames(p, carry, n0, m))
            if plan.head - plan.first > self._log_bytes:
                raise ValueError(f"the message's blobs do not fit the {self._log_bytes}-byte log")
            head = plan.head
        if carry.size and not self._readable(carry, n0 + m, head).all():
            raise ValueError(
                f"the message refers to kept frames its own new frames would replace: "
                f"frame_capacity ({self._slots}) or log_bytes is too small for this traffic"
            )
        if plan is not None:
            new = self._write_plan(plan, a8)
        else:
            new = self.add_frames(frames) if m else np.empty(0, np.int64)
        table = np.concatenate([carry, new])
        refs = np.concatenate([table[p.obs], table[p.next_obs]], axis=1)[keep]
        flags = (term.view(np.uint8) | trunc.view(np.uint8) * transport.TRUNC)[keep]
        self._write_rows(refs, actions[keep], rewards[keep], flags)
        st.carry = table[p.retain] if p.retain.size else None
        p.advance()
        return p.transitions

    # -- readers ----------------------------------------------------------------------------
    def sample(self, batch_size, *, rng=None, dtype=None, scale=None) -> SharedSamples:
        """``batch_size`` transitions drawn uniformly (with replacement) from the rows held.

        Each frame is copied once, from the mapping into the batch (compressed files:
        each blob copied once, then decoded). A row that the writer is rewriting, or
        whose frames it replaced, is drawn again.

        Args:
            batch_size: ``B >= 1``.
            rng: a ``numpy.random.Generator`` (default: a fresh one).
            dtype: the observations' dtype, as ``ReplayBuffer.sample`` (default: the
                frames').
            scale: a factor (float dtypes), e.g. ``dtype=np.float32, scale=1 / 255``.

        Raises:
            ValueError: no row written yet, ``batch_size < 1``, a compressed file whose
                frame records or blobs are corrupt.
            TypeError: an unsupported dtype or scale.
            RuntimeError: no consistent batch after many draws (the writer overwrites
                rows faster than they are read: give the file more capacity).
        """
        self._live()
        B = operator.index(batch_size)
        if B < 1:
            raise ValueError(f"batch_size must be at least 1, got {B}")
        dst = C.output_dtype(self._dtype, dtype, scale)
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
        if dst != self._dtype or scale is not None:
            f = dst.type(1 if scale is None else scale)
            obs, nxt = np.multiply(obs, f, dtype=dst), np.multiply(nxt, f, dtype=dst)
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
        lo = int(self._head[_ROWS_FROM])  # read before the count: never above it
        written = self.rows_written
        if written == 0:
            raise ValueError("the replay holds no transition yet")
        if written < 0:
            raise ValueError(f"{self._path}: a corrupt header ({written} rows written)")
        lo = min(max(lo, written - self._rows, 0), written - 1)
        t = rng.integers(lo, written, n)
        rows = t % self._rows
        before = self._row_seq[rows]  # fancy indexing: copies
        refs = self._refs[rows]
        a, r, f = self._actions[rows], self._rewards[rows], self._flags[rows]
        ok = (before == t) & (self._row_seq[rows] == t)
        k, fb = self._k, self._fb
        direct = todo.size == obs.shape[0]  # the first pass copies straight into the batch
        o = obs if direct else np.empty((n, k, *self._frame_shape), self._dtype)
        x = nxt if direct else np.empty_like(o)
        o8 = o.reshape(n, k, -1).view(np.uint8).reshape(n, k, fb)
        x8 = x.reshape(n, k, -1).view(np.uint8).reshape(n, k, fb)
        if self._log_bytes:
            frames, where, got = self._decode(refs)
            np.take(frames, where[:, :k], axis=0, out=o8, mode="wrap")
            np.take(frames, where[:, k:], axis=0, out=x8, mode="wrap")
            ok &= got
        else:
            slots = refs % self._slots  # in range whatever the row holds
            seen = self._frame_seq[slots]
            # mode="wrap": the slots are in range, and "raise" would copy through a buffer
            np.take(self._frames, slots[:, :k], axis=0, out=o8, mode="wrap")
            np.take(self._frames, slots[:, k:], axis=0, out=x8, mode="wrap")
            ok &= ((seen == refs) & (self._frame_seq[slots] == refs)).all(axis=1)
        if not direct:
            obs[todo[ok]], nxt[todo[ok]] = o[ok], x[ok]
        actions[todo[ok]], rewards[todo[ok]] = a[ok], r[ok]
        flags[todo[ok]], numbers[todo[ok]] = f[ok], t[ok]
        return ok

    def _decode(self, refs: np.ndarray) -> tuple:
        """The frames ``refs`` ``(n, 2k)`` from the log, under the seqlock.

        Walks the chain of deltas of each row's newest frame back to its keyframe (then
        of any wanted frame outside those chains), reading each slot's sequence word,
        then its record; copies each chain's blobs; reads the log head and the sequence
        words again; decodes the chains read consistently, one container per batch.

        Returns:
            ``(frames, where, ok)``: decoded frames ``(N, frame bytes)``, the index of each
            wanted frame in them ``(n, 2k)`` (0 where not read), the rows read whole.

        Raises:
            ValueError: a record or blob that was read consistently and is corrupt.
        """
        F, L, fb = self._slots, self._log_bytes, self._fb
        top = fb + BLOB_OVERHEAD
        u, inv = np.unique(refs, return_inverse=True)
        walked, start = [], refs.max(axis=1)
        for _ in range(refs.shape[1]):  # each round walks one chain more per row at most
            walked.append(self._walk(np.unique(start)))
            members = np.sort(np.concatenate([w[0][w[1]] for w in walked]))
            missing = ~_among(refs, members)  # a wanted frame before a keyframe
            if not missing.any():
                break
            start = np.where(missing, refs, -1).max(axis=1)
            start = start[start >= 0]
        num, has, seq0, words, deep = (np.concatenate(x) for x in zip(*walked, strict=True))
        depth = has.sum(axis=1) - 1
        runs = depth + 1  # each chain, keyframe first
        which = np.repeat(np.arange(num.shape[0]), runs)
        col = depth[which] - (np.arange(which.size) - np.repeat(np.cumsum(runs) - runs, runs))
        m_num, m_w = num[which, col], words[which, col]
        m_len = np.minimum(np.maximum(m_w[:, 1] & 0xFFFFFFFF, 1), top)
        m_at = np.minimum(m_w[:, 0] % L, L - m_len)  # in the log whatever it holds
        log = self._log.data
        payload = b"".join(
            [log[i : i + n] for i, n in zip(m_at.tolist(), m_len.tolist(), strict=True)]
        )
        head = int(self._head[_LOG_HEAD])
        seq1 = self._frame_seq[num % F]
        pos, ln, back = words[..., 0], words[..., 1] & 0xFFFFFFFF, words[..., 1] >> 32
        kind = (words[..., 2] >> 32) & 0xFF
        good = (num >= 0) & (seq0 == num) & (seq1 == num) & (pos >= head - L)
        delta = kind == C.KIND_DELTA
        bad = (kind > C.KIND_RAW) | (ln < 1) | (ln > top) | ((kind == C.KIND_RAW) & (ln != fb))
        bad |= (pos % L + ln > L) | (pos + ln > head) | (delta != (back > 0))
        whole = (good | ~has).all(axis=1)  # every blob of the chain read consistently
        if (good & has & bad).any() or (deep & whole).any():
            raise ValueError(f"{self._path}: a corrupt frame record (length, kind or chain)")
        m_kind = ((m_w[:, 2] >> 32) & 0xFF).astype(np.uint8)
        if not whole.all():  # only the chains read whole are decoded
            keep = np.repeat(whole, runs)
            data = np.frombuffer(payload, np.uint8)[np.repeat(keep, m_len)]
            payload, m_num, m_kind, m_len = data, m_num[keep], m_kind[keep], m_len[keep]
        offsets = np.zeros(m_len.size + 1, np.int64)
        np.cumsum(m_len, out=offsets[1:])
        try:
            frames = _core().decode_frames(payload, offsets, m_kind, (fb,), np.uint8)
        except ValueError as e:
            raise ValueError(f"{self._path}: a corrupt blob ({e})") from None
        if not m_num.size:
            return (
                np.zeros((1, fb), np.uint8),
                np.zeros(refs.shape, np.int64),
                refs[:, 0] < refs[:, 0],
            )
        order = np.argsort(m_num, kind="stable")
        at = np.minimum(np.searchsorted(m_num[order], u), m_num.size - 1)
        found = m_num[order][at] == u
        inv = inv.reshape(refs.shape)
        return frames, order[at][inv], found[inv].all(axis=1)

    def _walk(self, start: np.ndarray) -> tuple:
        """The chains of frames ``start`` ``(S,)``, each up to the file's ``group`` long.

        Returns:
            ``(num, has, seq0, words, deep)``: per chain and position ``(S, group)``, the
            frame's number, whether the chain reaches it, its slot's sequence word and
            its record's three words ``(S, group, 3)``, read after the word; per chain,
            whether it goes on beyond ``group`` (corrupt, when read consistently).
        """
        F, G, S = self._slots, self._group, start.size
        at, nums, seqs, recs = [], [], [], []
        idx, cur = np.arange(S), start
        for g in range(G):
            sl = cur % F
            seqs.append(self._frame_seq[sl])
            rec = self._words[sl]
            at.append(idx * G + g)
            nums.append(cur)
            recs.append(rec)
            more = ((rec[:, 2] >> 32) & 0xFF) == C.KIND_DELTA
            idx, cur = idx[more], (cur - (rec[:, 1] >> 32))[more]
            if not idx.size:
                break
        flat = np.concatenate(at)
        has = np.zeros(S * G, bool)
        has[flat] = True
        num = np.zeros(S * G, np.int64)
        num[flat] = np.concatenate(nums)
        seq0 = np.zeros(S * G, np.int64)
        seq0[flat] = np.concatenate(seqs)
        words = np.zeros((S * G, 3), np.int64)
        words[flat] = np.concatenate(recs)
        deep = np.zeros(S, bool)
        deep[idx] = True
        return (
            num.reshape(S, G),
            has.reshape(S, G),
            seq0.reshape(S, G),
            words.reshape(S, G, 3),
            deep,
        )


def _among(x: np.ndarray, sorted_: np.ndarray) -> np.ndarray:
    """Which of ``x`` are in the sorted array ``sorted_``."""
    if not sorted_.size:
        return np.zeros(x.shape, bool)
    at = np.minimum(np.searchsorted(sorted_, x), sorted_.size - 1)
    return sorted_[at] == x


def _core():
    """The core in use (``lazyframes._impl``), looked up at each call."""
    import lazyframes

    return lazyframes._impl


def _previous_frames(p: transport.Parsed, carry: np.ndarray, n0: int, m: int) -> np.ndarray:
    """Each new frame of a message's previous frame (in a stack before it), or -1.

    The frames a message's observations and next observations hold in a row, oldest
    first: the frame before a new frame there is its env's previous frame.
    """
    nc = carry.size
    o, x = p.obs.astype(np.int64), p.next_obs.astype(np.int64)
    left = np.concatenate([o[:, :-1].ravel(), x[:, :-1].ravel()])
    right = np.concatenate([o[:, 1:].ravel(), x[:, 1:].ravel()])
    sel = (right >= nc) & (left != right)
    prev = np.full(m, -1, np.int64)
    prev[(right[sel] - nc)[::-1]] = left[sel][::-1]  # the first pair seen wins
    old = (prev >= 0) & (prev < nc)
    out = np.where(prev >= nc, n0 + prev - nc, -1)
    out[old] = carry[prev[old]]
    return out


def _check_header(head: np.ndarray, size: int, path: str) -> tuple:
    """``(k, rows, slots, frame_shape, dtype, log_bytes, group)`` of a header, checked.

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
    lb, group = int(head[_LOG_BYTES]), int(head[_GROUP])
    if lb:
        bad = lb < 4 * (fb + BLOB_OVERHEAD) or lb > size or slots >= 1 << 31
        bad = bad or not 1 <= group <= C.MAX_GROUP
    else:
        bad = group != 0
    if bad:
        raise ValueError(f"{path}: a corrupt header (log of {lb} bytes, group {group})")
    if _layout(k, rows, slots, fb, lb)["size"] != size:
        raise ValueError(f"{path}: its size ({size} bytes) does not match its header")
    return k, rows, slots, shape, dt, lb, group
