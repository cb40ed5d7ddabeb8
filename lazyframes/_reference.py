"""The pure-NumPy twin of the compiled core: readable specification, fallback and test oracle.

Same public API, same allocation policy (so the same slot ids), same errors as
``lazyframes._core``. It restates baselines' semantics with ``np.concatenate`` and
Gymnasium's with ``np.stack``; it is selected with ``LAZYFRAMES_NO_EXTENSIONS=1`` or
when the extension is not built.
"""

from __future__ import annotations

import heapq
import operator
import weakref

import numpy as np

from . import _common as C

__all__ = ["FramePool", "LazyFrames", "LazyBatch", "stack", "default_pool"]


class FramePool:
    """A refcounted store of frames of one shape and dtype, in a chunked arena.

    Each frame is copied in once (:meth:`push`) and lives in a slot until its refcount
    drops to zero; the slot is then reused. Chunks hold the largest power of two of
    slots that fits ``chunk_bytes`` (at least one) and never move; a chunk whose slots are all free is returned
    to the OS (one empty chunk is kept to avoid churn).

    Args:
        frame_shape: shape ``S`` of one frame, e.g. ``(84, 84, 1)``.
        dtype: numeric dtype of the frames, e.g. ``np.uint8``.
        chunk_bytes: size of one arena chunk in bytes (default 1 MiB).

    Raises:
        TypeError: non-numeric dtype or a shape that is not a tuple of ints.
        ValueError: a non-positive dimension or ``chunk_bytes``.

    Example:
        >>> pool = FramePool((84, 84, 1), np.uint8)
        >>> s = pool.push(np.zeros((84, 84, 1), np.uint8))
        >>> pool.live_frames, pool.refcount(s)
        (1, 1)
        >>> pool.release(s); pool.live_frames
        0
    """

    def __init__(self, frame_shape, dtype, *, chunk_bytes: int = C.DEFAULT_CHUNK_BYTES):
        self._shape = C.frame_shape(frame_shape)
        self._dtype = C.frame_dtype(dtype)
        chunk_bytes = int(chunk_bytes)
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        self._frame_bytes = int(np.prod(self._shape, dtype=np.int64)) * self._dtype.itemsize
        # the largest power of two that fits (a shift and a mask find a slot in C)
        self._spc = 1 << (min(max(1, chunk_bytes // self._frame_bytes), 1 << 31).bit_length() - 1)
        self._data = []  # per chunk: ndarray (spc, *S) or None when released
        self._ref = []  # per chunk: int64 refcounts or None
        self._free = []  # per chunk: LIFO of free offsets (pops the lowest first)
        self._live = []  # per chunk: live slots
        self._in_heap = []
        self._heap = []  # chunks with memory and a free slot (lazy deletion)
        self._released = []  # ids of released chunks (a heap)
        self._n_empty = 0  # chunks with memory and no live slot
        self._n_alloc = 0
        self._live_frames = 0
        self._peak = 0
        self._refs = weakref.WeakValueDictionary()  # slot -> FrameRef, for pickling
        self._by_id = {}  # id(ndarray) -> (weakref, slot): LazyFrames(list) dedupe

    # -- properties ---------------------------------------------------------------
    @property
    def frame_shape(self) -> tuple:
        """Shape ``S`` of one frame."""
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        """dtype of the stored frames (native byte order)."""
        return self._dtype

    @property
    def frame_bytes(self) -> int:
        """Bytes of one frame."""
        return self._frame_bytes

    @property
    def slots_per_chunk(self) -> int:
        """Slots in one arena chunk."""
        return self._spc

    @property
    def live_frames(self) -> int:
        """Frames with a refcount above zero."""
        return self._live_frames

    @property
    def live_bytes(self) -> int:
        """Bytes of the live frames: ``live_frames * frame_bytes``."""
        return self._live_frames * self._frame_bytes

    @property
    def capacity(self) -> int:
        """Slots in chunks that currently hold memory."""
        return self._n_alloc * self._spc

    @property
    def bytes_held(self) -> int:
        """Bytes of frame memory currently held (whole chunks)."""
        return self._n_alloc * self._spc * self._frame_bytes

    @property
    def peak_bytes(self) -> int:
        """Largest :attr:`bytes_held` so far."""
        return self._peak

    def stats(self) -> dict:
        """Live frames, capacity, frame bytes, bytes held and peak bytes, as a dict."""
        return {
            "live_frames": self.live_frames,
            "live_bytes": self.live_bytes,
            "capacity": self.capacity,
            "frame_bytes": self._frame_bytes,
            "bytes_held": self.bytes_held,
            "peak_bytes": self._peak,
        }

    def __repr__(self):
        return (
            f"FramePool(frame_shape={self._shape}, dtype={self._dtype}, "
            f"live_frames={self._live_frames}, bytes_held={self.bytes_held})"
        )

    def __reduce__(self):
        raise TypeError(
            "a FramePool cannot be pickled; pickle the observations (LazyFrames) or use "
            "ReplayBuffer.save"
        )

    # -- slots --------------------------------------------------------------------
    def _alloc(self) -> int:
        heap = self._heap
        while heap:
            c = heap[0]
            if self._data[c] is not None and self._live[c] < self._spc:
                break
            heapq.heappop(heap)
            self._in_heap[c] = False
        else:
            if self._released:
                c = heapq.heappop(self._released)
            else:
                c = len(self._data)
                self._data.append(None)
                self._ref.append(None)
                self._free.append(None)
                self._live.append(0)
                self._in_heap.append(False)
            self._data[c] = np.empty((self._spc,) + self._shape, self._dtype)
            self._ref[c] = np.zeros(self._spc, np.int64)
            self._free[c] = list(range(self._spc - 1, -1, -1))
            self._n_alloc += 1
            self._n_empty += 1
            self._peak = max(self._peak, self.bytes_held)
            heapq.heappush(heap, c)
            self._in_heap[c] = True
        off = self._free[c].pop()
        if self._live[c] == 0:
            self._n_empty -= 1
        self._live[c] += 1
        if self._live[c] == self._spc:
            heapq.heappop(heap)
            self._in_heap[c] = False
        self._ref[c][off] = 1
        self._live_frames += 1
        return c * self._spc + off

    def _free_slot(self, c: int, off: int) -> None:
        self._free[c].append(off)
        self._live[c] -= 1
        self._live_frames -= 1
        if not self._in_heap[c]:
            heapq.heappush(self._heap, c)
            self._in_heap[c] = True
        if self._live[c] == 0:
            if self._n_empty >= 1:
                self._data[c] = self._ref[c] = self._free[c] = None
                self._n_alloc -= 1
                heapq.heappush(self._released, c)
            else:
                self._n_empty += 1

    def _locate(self, slot) -> tuple:
        """(chunk, offset) of a live slot; IndexError/ValueError otherwise."""
        s = operator.index(slot)
        if not 0 <= s < len(self._data) * self._spc:
            raise IndexError(f"slot {s} is out of range for this pool")
        c, off = divmod(s, self._spc)
        if self._data[c] is None or self._ref[c][off] == 0:
            raise ValueError(f"slot {s} is free (its frame was released)")
        return c, off

    def _check_live(self, slots: np.ndarray) -> None:
        for s in slots.ravel():
            self._locate(s)

    def push(self, frame) -> int:
        """Copy one frame into a free slot and return its slot id.

        The caller owns the one reference of the new slot and must :meth:`release` it
        (or hand it to :meth:`lazy` and release its own). Views, read-only and
        non-contiguous arrays are accepted; the frame is copied exactly once, so later
        changes to the caller's array never reach the pool.

        Raises:
            TypeError: object arrays or a dtype other than :attr:`dtype`.
            ValueError: a shape other than :attr:`frame_shape`.
        """
        arr = C.as_frame(frame, self._shape, self._dtype)
        s = self._alloc()
        c, off = divmod(s, self._spc)
        self._data[c][off] = arr
        return s

    def _push_known(self, obj, arr) -> int:
        """:meth:`push`, but reuse the slot of the same ndarray ``obj`` if its bytes are unchanged.

        This is how ``LazyFrames(list_of_frames)`` stores a frame once when baselines'
        FrameStack hands the same frame objects to k consecutive observations. The
        cache holds no reference: a hit needs a live slot whose bytes equal the array's
        now, so an env that rewrites its buffer in place (case C11) gets a fresh copy.
        """
        key = id(obj)
        hit = self._by_id.get(key)
        if hit is not None and hit[0]() is obj:
            s = hit[1]
            c, off = divmod(s, self._spc)
            if (self._data[c] is not None and self._ref[c][off] > 0
                    and self._data[c][off].tobytes() == arr.tobytes()):
                self._ref[c][off] += 1
                return s
        s = self.push(arr)
        if isinstance(obj, np.ndarray):
            pool = weakref.ref(self)

            def forget(wr, key=key):
                p = pool()
                if p is not None and p._by_id.get(key, (None,))[0] is wr:
                    del p._by_id[key]

            self._by_id[key] = (weakref.ref(obj, forget), s)
        return s

    def push_many(self, frames) -> np.ndarray:
        """Copy ``n`` frames (an array of shape ``(n, *S)``) in; returns int64 slot ids ``(n,)``.

        Raises:
            TypeError, ValueError: as :meth:`push`, before any frame is stored.
        """
        arr = np.asarray(frames)
        if arr.ndim != len(self._shape) + 1:
            raise ValueError(
                f"frames have shape {arr.shape}, expected (n, *{self._shape})"
            )
        arr = C.as_frame(arr, (arr.shape[0],) + self._shape, self._dtype)
        return np.array([self.push(f) for f in arr], dtype=np.int64)

    def retain(self, slots) -> None:
        """Add one reference to each slot id in ``slots`` (an int or an int array).

        Raises:
            IndexError: a slot id out of range; ValueError: a free slot. Checked for
            every id before any refcount changes.
        """
        arr = C.as_slots(slots)
        self._check_live(arr)
        for s in arr.ravel():
            c, off = divmod(int(s), self._spc)
            self._ref[c][off] += 1

    def release(self, slots) -> None:
        """Drop one reference from each slot id in ``slots``; a slot at zero is free again.

        Raises:
            IndexError, ValueError: as :meth:`retain`, and a ValueError if ``slots``
            names a slot more often than it has references; nothing is released then.
        """
        arr = C.as_slots(slots)
        self._check_live(arr)
        ids, counts = np.unique(arr.ravel(), return_counts=True)
        for s, n in zip(ids, counts):
            c, off = divmod(int(s), self._spc)
            if self._ref[c][off] < n:
                raise ValueError(
                    f"slot {int(s)} released {int(n)} times but has "
                    f"{int(self._ref[c][off])} references"
                )
        for s in arr.ravel():
            c, off = divmod(int(s), self._spc)
            self._ref[c][off] -= 1
            if self._ref[c][off] == 0:
                self._free_slot(c, off)

    def refcount(self, slot) -> int:
        """References held on ``slot`` (0 for a free slot in range).

        Raises:
            IndexError: out of range.
        """
        s = operator.index(slot)
        if not 0 <= s < len(self._data) * self._spc:
            raise IndexError(f"slot {s} is out of range for this pool")
        c, off = divmod(s, self._spc)
        return 0 if self._data[c] is None else int(self._ref[c][off])

    def get(self, slot) -> np.ndarray:
        """A copy of the frame in ``slot``, shape :attr:`frame_shape`.

        Raises:
            IndexError, ValueError: as :meth:`retain`.
        """
        c, off = self._locate(slot)
        return self._data[c][off].copy()

    def shift_rings(self, rings, frames, restart=None, *, pad=None) -> np.ndarray:
        """One step of ``n`` frame rings (a vector-env stacker) in one call.

        ``rings`` is an int64 ``(n, k)`` array of slot ids, oldest first, each entry
        owning one reference. The n ``frames`` (``(n, *S)``) are pushed; row i of the
        result is row i of ``rings`` shifted left with frame i last, or, where
        ``restart[i]`` (a new episode), k-1 copies of ``pad`` (a slot id; default: the
        new frame itself, i.e. reset padding) then frame i. The references of ``rings``
        pass to the result (the dropped ones are released): drop ``rings`` afterwards,
        without releasing it. ``rings`` itself is never written.

        Returns:
            A new int64 ``(n, k)`` array whose entries each own one reference.

        Raises:
            ValueError, IndexError, TypeError: bad rings, frames, restart mask or pad;
            checked before anything changes.
        """
        r = C.as_slots(rings)
        if r.ndim != 2 or r.shape[1] == 0:
            raise ValueError(f"rings must have shape (n, k) with k >= 1, got {r.shape}")
        n, k = r.shape
        self._check_live(r)
        arr = np.asarray(frames)
        if arr.shape[:1] != (n,):
            raise ValueError(f"frames have shape {arr.shape}, expected ({n}, *{self._shape})")
        mask = None
        if restart is not None:
            mask = np.ascontiguousarray(restart, dtype=np.bool_)
            if mask.shape != (n,):
                raise ValueError(f"restart has shape {mask.shape}, expected ({n},)")
        if pad is not None:
            self._locate(pad)
        new = self.push_many(arr)
        out = np.empty((n, k), np.int64)
        out[:, -1] = new
        for i in range(n):
            if mask is not None and mask[i]:
                fill = int(new[i]) if pad is None else int(pad)
                out[i, :-1] = fill
                if k > 1:
                    self.retain([fill] * (k - 1))
                self.release(r[i])
            else:
                out[i, :-1] = r[i, 1:]
                self.release(r[i, 0])
        return out

    def write_slots(self, table, row, parts, *, release=True) -> None:
        """Write observations' slot ids into rows of a table that owns references.

        The replay buffer's store: ``table`` is a C-contiguous int32 or int64 array
        ``(R, W)`` of slot ids, each entry owning one reference. ``parts`` (a tuple of
        :class:`LazyBatch` ``(E, k_i)``, :class:`LazyFrames` (E = 1) or int arrays
        ``(E, k_i)``, with ``sum(k_i) == W``) are written side by side into rows
        ``row .. row + E - 1``: a reference is taken on each new id and, with
        ``release``, the ids those rows held are released. One call, no frame copied.

        Raises:
            TypeError: a table of another dtype or an unknown part.
            ValueError: shapes that do not fit, a read-only or non-contiguous table,
                ids beyond int32 in an int32 table; IndexError/ValueError: dead slots.
            Everything is checked before anything changes.
        """
        if type(table) is not np.ndarray:
            raise TypeError(f"table must be a numpy.ndarray, got {type(table).__name__}")
        if table.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise TypeError(f"table must be int32 or int64, got {table.dtype}")
        if table.ndim != 2 or not table.flags.c_contiguous or not table.flags.writeable:
            raise ValueError("table must be a writeable C-contiguous 2-D array")
        R, W = table.shape
        blocks = []
        for part in parts:
            if isinstance(part, (LazyBatch, LazyFrames)):
                if part.pool is not self:
                    raise ValueError(f"a {type(part).__name__} of another pool")
                blk = C.as_slots(part.slots).reshape(-1, len(part.slots) if isinstance(part, LazyFrames) else part.stack_size)
            else:
                blk = C.as_slots(part)
                if blk.ndim != 2:
                    raise ValueError(f"slot ids must be 2-D (E, k), got shape {blk.shape}")
            if blocks and blk.shape[0] != blocks[0].shape[0]:
                raise ValueError(f"parts have {blocks[0].shape[0]} and {blk.shape[0]} rows")
            blocks.append(blk)
        new = np.concatenate(blocks, axis=1)
        if new.shape[1] != W:
            raise ValueError(f"parts have {new.shape[1]} slot ids per row, the table {W}")
        r0, E = int(row), new.shape[0]
        if r0 < 0 or r0 + E > R:
            raise IndexError(f"rows {r0}..{r0 + E - 1} are out of range for a table of {R}")
        self._check_live(new)
        if table.dtype == np.int32 and new.size and new.max() > np.iinfo(np.int32).max:
            raise ValueError(f"slot {int(new.max())} does not fit an int32 table")
        old = table[r0:r0 + E].astype(np.int64)
        if release:
            for i, s in enumerate(old.ravel()):
                c, off = divmod(int(s), self._spc)
                if not (0 <= s < len(self._data) * self._spc) or self._data[c] is None \
                        or self._ref[c][off] == 0:
                    raise ValueError(f"table row {r0 + i // W} holds a free slot")
        self.retain(new)
        if release:
            self.release(old)
        table[r0:r0 + E] = new

    def push_dedup(self, frames, candidates=None) -> np.ndarray:
        """Push ``(E, k, *S)`` frames, reusing a slot where a frame's bytes are already stored.

        Frame j of row e reuses, in this order, a slot of ``candidates[e]`` (int ``(E, m)``
        slot ids, e.g. that env's previous observation; -1 for none) with equal bytes, or
        an earlier frame of the same row with equal bytes (reset padding); otherwise it is
        copied into a new slot. This is how observations that arrive as plain stacked
        arrays (EnvPool, SB3's VecFrameStack) cost one new frame per step.

        Returns:
            int64 ``(E, k)`` slot ids, each owning one new reference (release them once
            stored elsewhere).

        Raises:
            TypeError, ValueError: frames of the wrong dtype or shape, candidates of the
            wrong shape; IndexError/ValueError: dead candidate slots. Checked first.
        """
        arr = np.asarray(frames)
        if arr.ndim != len(self._shape) + 2:
            raise ValueError(f"frames have shape {arr.shape}, expected (E, k, *{self._shape})")
        arr = C.as_frame(arr, arr.shape[:2] + self._shape, self._dtype)
        E, k = arr.shape[:2]
        cand = None
        if candidates is not None:
            cand = C.as_slots(candidates)
            if cand.ndim != 2 or cand.shape[0] != E:
                raise ValueError(f"candidates have shape {cand.shape}, expected ({E}, m)")
            self._check_live(cand[cand != -1])
        out = np.empty((E, k), np.int64)
        for e in range(E):
            for j in range(k):
                f = arr[e, j].tobytes()
                found = None
                for c in ([] if cand is None else cand[e]):
                    if c != -1 and self.get(c).tobytes() == f:
                        found = int(c)
                        break
                if found is None:
                    for jj in range(j):
                        if arr[e, jj].tobytes() == f:
                            found = int(out[e, jj])
                            break
                if found is None:
                    out[e, j] = self.push(arr[e, j])
                else:
                    self.retain(found)
                    out[e, j] = found
        return out

    def lazy_batch(self, slots, *, layout: str = "stack") -> "LazyBatch":
        """A :class:`LazyBatch` over int ``(n, k)`` slot ids (one observation per row).

        Takes its own reference on each slot; copies no frame bytes.

        Raises:
            IndexError, ValueError: as :meth:`retain`; ValueError for a bad shape or layout.
        """
        return LazyBatch._make(self, slots, layout)

    def lazy(self, slots, *, layout: str = "last") -> "LazyFrames":
        """A :class:`LazyFrames` over ``k`` slot ids, oldest first; copies no frame bytes.

        The observation takes its own reference on each slot.

        Raises:
            IndexError, ValueError: as :meth:`retain`; ValueError for a bad layout.
        """
        return LazyFrames._from_slots(self, slots, layout)

    def gather(self, slots, out=None, *, layout: str = "last", dtype=None, scale=None):
        """Copy ``B`` observations of ``k`` slots each (``slots``: ints ``(B, k)``) into one array.

        Returns ``out`` (or a new array) of shape ``(B, *observation_shape)``; dtype
        conversion and ``scale`` are fused into the copy. Everything is checked before
        anything is written.

        Raises:
            IndexError, ValueError: bad slot ids; TypeError/ValueError: a bad ``out``
            (see :func:`stack`).
        """
        arr = C.as_slots(slots)
        if arr.ndim != 2 or arr.shape[1] == 0:
            raise ValueError(f"slots must have shape (B, k) with k >= 1, got {arr.shape}")
        k = arr.shape[1]
        C.check_layout(layout, self._shape)
        _check_copy_out(self._shape, self._dtype, arr.shape[0], k, layout, out, dtype, scale)
        self._check_live(arr)  # after the output checks, as the compiled core
        frames = [[self._data[c][off] for c, off in (divmod(int(s), self._spc) for s in row)]
                  for row in arr]
        return _copy_out(frames, self._shape, self._dtype, k, layout, out, dtype, scale)

    def gather_pairs(self, first, second, out=None, *, layout="last", dtype=None, scale=None):
        """:meth:`gather` of two slot arrays ``(B, k)`` at once, row by row.

        Row i of ``first`` then row i of ``second`` are copied one after the other, so
        frames they share (a transition's obs and next_obs share k-1) are read from
        memory once and from cache the second time. The replay buffer's sample.

        Args:
            first, second: int ``(B, k)`` slot ids.
            out: optional pair of arrays ``(B, *observation_shape)`` (see :meth:`gather`).

        Returns:
            A pair of arrays ``(B, *observation_shape)``.

        Raises:
            As :meth:`gather`, for either array; nothing is written then.
        """
        a1, a2 = C.as_slots(first), C.as_slots(second)
        if a1.ndim != 2 or a1.shape[1] == 0 or a1.shape != a2.shape:
            raise ValueError(f"slots must be two arrays of one shape (B, k) with k >= 1, got "
                             f"{a1.shape} and {a2.shape}")
        if out is not None and (not isinstance(out, (tuple, list)) or len(out) != 2):
            raise TypeError("out must be a pair of ndarrays")
        C.check_layout(layout, self._shape)
        o1, o2 = (None, None) if out is None else out
        d1, d2 = (_check_copy_out(self._shape, self._dtype, a1.shape[0], a1.shape[1], layout, o,
                                  dtype, scale) for o in (o1, o2))  # both before writing either
        if d1 != d2:
            raise TypeError(f"the two arrays of out have different dtypes: {d1} and {d2}")
        if o1 is not None and o2 is not None and np.may_share_memory(o1, o2):
            raise ValueError("the two arrays of out overlap")
        self._check_live(a1)
        self._check_live(a2)
        return (self.gather(a1, o1, layout=layout, dtype=dtype, scale=scale),
                self.gather(a2, o2, layout=layout, dtype=dtype, scale=scale))


def _write_transitions(pool, table, row, obs, next_obs, release, actions, action, rewards,
                       reward, flags, terminated, truncated, autoreset):
    """The replay buffer's batched add in one call (internal).

    Writes E transitions at rows ``row .. row + E - 1``: slot ids as
    :meth:`FramePool.write_slots`, ``actions[rows] = action`` (same dtype),
    ``rewards[rows] = reward`` (float32 from float32/float64), and
    ``flags[rows] = terminated + 2 * truncated + 4 * autoreset`` (contiguous bool
    arrays). Returns the number of autoreset rows, or None, having written nothing, when
    an argument is not of these exact kinds (the buffer then takes its checked path).
    """
    E = len(obs)
    masks = (terminated, truncated) + (() if autoreset is None else (autoreset,))
    if not (0 <= row <= min(len(actions), len(rewards), len(flags)) - E
            and type(action) is np.ndarray and action.dtype == actions.dtype
            and action.shape == (E,) + actions.shape[1:]
            and type(reward) is np.ndarray and reward.dtype in (np.float32, np.float64)
            and reward.shape == (E,)
            and all(type(m) is np.ndarray and m.dtype == np.bool_ and m.shape == (E,) for m in masks)):
        return None
    pool.write_slots(table, row, (obs, next_obs), release=release)
    sl = slice(row, row + E)
    actions[sl] = action
    rewards[sl] = reward
    skip = np.zeros(E, bool) if autoreset is None else autoreset
    flags[sl] = terminated.astype(np.uint8) | truncated.astype(np.uint8) << 1 | skip.astype(np.uint8) << 2
    return int(np.count_nonzero(skip))


def _materialise(frames, layout):
    """One observation from its frames: baselines' np.concatenate / Gymnasium's np.stack."""
    if layout == "last":
        return np.concatenate(frames, axis=-1)
    if layout == "first":
        return np.concatenate(frames, axis=0)
    return np.stack(frames, axis=0)


def _check_copy_out(shape, src, b, k, layout, out, dtype, scale):
    """Check the output of a copy of ``b`` observations; returns the output dtype."""
    dst = C.output_dtype(src, C.requested_dtype(dtype, out), scale)
    if out is not None:
        C.check_out(out, (b,) + C.observation_shape(shape, k, layout), dst)
    return dst


def _copy_out(frames, shape, src, k, layout, out, dtype, scale):
    """Copy lists of frames (one list per observation) into ``out``."""
    dst = _check_copy_out(shape, src, len(frames), k, layout, out, dtype, scale)
    if out is None:
        out = np.empty((len(frames),) + C.observation_shape(shape, k, layout), dst)
    for b, fr in enumerate(frames):
        out[b] = _materialise(fr, layout).astype(dst)
    if scale is not None:
        np.multiply(out, dst.type(scale), out=out)
    return out


_default_pools = {}  # kept for the process: an idle pool holds at most one empty chunk


def default_pool(frame_shape, dtype) -> FramePool:
    """The shared pool for frames of ``frame_shape`` and ``dtype``.

    Used by ``LazyFrames(list_of_frames)`` and by unpickling. It lives for the
    process, so its dedupe cache survives between observations; once idle it holds at
    most one empty chunk (``chunk_bytes``, 1 MiB by default).
    """
    key = (C.frame_shape(frame_shape), C.frame_dtype(dtype))
    pool = _default_pools.get(key)
    if pool is None:
        pool = FramePool(*key)
        _default_pools[key] = pool
    return pool


def _restore_frame(frame):
    return C.restore_frame(default_pool, frame)


def _restore_lazyframes(refs, layout):
    return refs[0].pool.lazy([r.slot for r in refs], layout=layout)


def _restore_lazybatch(rows, layout):
    return C.restore_lazybatch(rows, layout)


class LazyFrames:
    """k frames shown as one observation, stored once in a :class:`FramePool`.

    A drop-in for baselines' ``atari_wrappers.LazyFrames``: ``LazyFrames(frames)``
    concatenates on the last axis, and ``len``, ``[i]``, ``count()`` and ``frame(i)``
    behave as baselines' on the materialised array. Unlike baselines it never caches the
    materialised stack (``np.asarray`` copies the frames out each time into a fresh
    array), so holding observations costs only the unique frames.

    Args:
        frames: a non-empty sequence of k array-likes of one shape ``S`` and dtype,
            oldest first, copied into the shared :func:`default_pool`. An ndarray that
            is already stored there with the same bytes (as when baselines' FrameStack
            passes the same frame to k consecutive observations) is not copied again.
        layout: ``"last"`` (baselines, default), ``"first"`` (SB3 channels-first) or
            ``"stack"`` (Gymnasium, ``(k, *S)``); see ``lazyframes.LAYOUTS``.

    Raises:
        ValueError: an empty sequence, frames of different shapes, or a layout that
            does not fit the frame shape (e.g. ``"last"`` for ``(1, 84, 84)`` frames).
        TypeError: frames of different dtypes, or object arrays.

    Equality: ``a == b`` is a single bool, True when both materialise to arrays of the
    same shape and dtype kind with equal values (as ``np.array_equal``); comparing with
    an ndarray works the same way. Observations are unhashable, like ndarrays.

    Example:
        >>> frames = [np.full((84, 84, 1), v, np.uint8) for v in range(4)]
        >>> lz = LazyFrames(frames)
        >>> lz.shape, np.asarray(lz).shape, lz.count(), len(lz)
        ((84, 84, 4), (84, 84, 4), 4, 84)
    """

    __array_priority__ = 10.0  # so ndarray == LazyFrames defers to __eq__ below

    def __init__(self, frames, *, layout: str = "last"):
        if isinstance(frames, np.ndarray) and frames.ndim >= 1:
            frames = list(frames)
        frames = list(frames)
        if not frames:
            raise ValueError("LazyFrames needs at least one frame")
        arrays = []
        for f in frames:
            a = np.asarray(f)
            if a.dtype.kind == "O":
                raise TypeError("frame is an object array; frames must be numeric ndarrays")
            arrays.append(a)
        shape, dt = arrays[0].shape, C.frame_dtype(arrays[0].dtype)
        for a in arrays:
            if a.shape != shape:
                raise ValueError(f"frames have different shapes: {shape} and {a.shape}")
            if a.dtype.newbyteorder("=") != dt:
                raise TypeError(f"frames have different dtypes: {dt} and {a.dtype}")
        C.check_layout(layout, shape)
        pool = default_pool(shape, dt)
        slots = []
        try:
            for f, a in zip(frames, arrays):
                slots.append(pool._push_known(f, a))
            self._init(pool, C.as_slots(slots), layout)
        finally:
            if slots:
                pool.release(slots)

    @classmethod
    def from_slots(cls, pool, slots, *, layout: str = "last"):
        """An observation over ``k`` live slot ids of ``pool``; copies no frame bytes."""
        return cls._from_slots(pool, slots, layout)

    @classmethod
    def _from_slots(cls, pool, slots, layout):
        if not isinstance(pool, FramePool):
            raise TypeError(f"pool must be a FramePool, got {type(pool).__name__}")
        arr = C.as_slots(slots)
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError(f"slots must be a non-empty 1-D sequence, got shape {arr.shape}")
        C.check_layout(layout, pool.frame_shape)
        self = cls.__new__(cls)
        self._init(pool, arr, layout)
        return self

    def _init(self, pool, slots, layout):
        pool.retain(slots)  # checks every slot before taking any reference
        self._pool = pool
        self._slots = tuple(int(s) for s in slots)
        self._layout = layout

    def __del__(self):
        try:
            self._pool.release(self._slots)
        except Exception:  # half-built object, or interpreter shutdown
            pass

    # -- array-likeness without materialising --------------------------------------
    @property
    def pool(self) -> FramePool:
        """The pool holding the frames."""
        return self._pool

    @property
    def slots(self) -> tuple:
        """Slot ids of the k frames, oldest first."""
        return self._slots

    @property
    def layout(self) -> str:
        """``"last"``, ``"first"`` or ``"stack"``."""
        return self._layout

    @property
    def stack_size(self) -> int:
        """k, the number of frames."""
        return len(self._slots)

    @property
    def frame_shape(self) -> tuple:
        """Shape ``S`` of one frame."""
        return self._pool.frame_shape

    @property
    def shape(self) -> tuple:
        """Shape of ``np.asarray(self)``."""
        return C.observation_shape(self._pool.frame_shape, len(self._slots), self._layout)

    @property
    def dtype(self) -> np.dtype:
        """dtype of ``np.asarray(self)``."""
        return self._pool.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def nbytes(self) -> int:
        """Bytes of the materialised array (not of the memory held; see the pool)."""
        return self.size * self.dtype.itemsize

    # -- copying out ---------------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        """Materialise into a fresh array (NumPy 2 protocol).

        ``copy=False`` raises ValueError: the frames are not one array, so a copy cannot
        be avoided. ``dtype`` is fused into the copy (same-kind casts).
        """
        return C.array_protocol(
            self, dtype, copy,
            lambda dt: self._pool.gather([self._slots], layout=self._layout, dtype=dt)[0])

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """DLPack export of a fresh materialised array, so ``torch.as_tensor(obs)`` is fast."""
        return C.dlpack(self, stream, max_version, dl_device, copy)

    def __dlpack_device__(self):
        return C.DLPACK_DEVICE

    def astype(self, dtype, *, scale=None) -> np.ndarray:
        """A new array of ``dtype``, optionally times ``scale`` (fused into the copy).

        ``obs.astype(np.float32, scale=1/255)`` is baselines' ScaledFloatFrame.
        """
        return self._pool.gather([self._slots], layout=self._layout, dtype=dtype, scale=scale)[0]

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, key):
        return np.asarray(self)[key]

    def count(self) -> int:
        """Size of the last axis of the materialised array, as baselines' ``count()``."""
        return self.shape[-1]

    def frame(self, i) -> np.ndarray:
        """``np.asarray(self)[..., i]`` as baselines' ``frame(i)``: a channel when C > 1.

        Copies only what it returns in the ``"last"`` layout.

        Raises:
            IndexError: out of range.
        """
        n = self.count()
        i = C.index_frame(i, n)
        if self._layout == "last":
            c = self._pool.frame_shape[-1]
            j, ch = divmod(i, c)
            return self._pool.get(self._slots[j])[..., ch]
        return np.asarray(self)[..., i]

    def shift(self, frame) -> "LazyFrames":
        """The next observation: this one's last k-1 frames, then ``frame``.

        ``frame`` is copied once into this observation's pool; the shared frames are
        not copied. This is one step of a frame stacker (baselines' ``deque(maxlen=k)``)
        in one call; ``self`` is unchanged.

        Raises:
            TypeError, ValueError: ``frame`` of the wrong dtype or shape.
        """
        s = self._pool.push(frame)
        try:
            return LazyFrames._from_slots(self._pool, self._slots[1:] + (s,), self._layout)
        finally:
            self._pool.release(s)

    def get_frame(self, j) -> np.ndarray:
        """A copy of whole frame ``j`` (0 is the oldest), shape :attr:`frame_shape`.

        Raises:
            IndexError: out of range.
        """
        j = C.index_frame(j, len(self._slots))
        return self._pool.get(self._slots[j])

    def __copy__(self):
        # frames are immutable, so a copy shares them (no frame bytes copied)
        return LazyFrames._from_slots(self._pool, self._slots, self._layout)

    copy = __copy__

    def __deepcopy__(self, memo):
        return self.__copy__()

    def __reduce__(self):
        return C.reduce_lazyframes(self)

    def __eq__(self, other):
        return C.lazyframes_eq(self, other)

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None

    def __repr__(self):
        return (
            f"LazyFrames(shape={self.shape}, dtype={self.dtype}, layout={self._layout!r}, "
            f"stack_size={len(self._slots)})"
        )


class LazyBatch:
    """A batch of observations, one per sub-environment, stored as slot ids of one pool.

    Holds one reference on each of its ``num_envs * k`` slots (released when it is
    dropped), so it stays valid however far the environments move on. No frame bytes are
    copied until it is materialised.

    Attributes:
        shape: ``(num_envs, *observation_shape)``, the shape of ``np.asarray(batch)``.
        dtype: the frames' dtype.
        pool: the :class:`~lazyframes.FramePool` holding the frames.
        layout: ``"stack"``, ``"last"`` or ``"first"``.

    ``len(batch)`` is ``num_envs``; ``batch[i]`` is env i's observation as a
    :class:`~lazyframes.LazyFrames` (no frame copied); ``batch[a:b]`` is a LazyBatch.
    ``np.asarray(batch)``, :meth:`numpy` (with ``out``, ``dtype``, ``scale``) and the DLPack
    protocol (``torch.as_tensor(batch)``, ``np.from_dlpack(batch)``) each copy the batch
    out once, in one ``gather`` call. (``torch.tensor(batch)`` walks the sequence protocol
    instead and is ~100x slower: use ``torch.as_tensor``.)

    Example:
        >>> obs, info = envs.reset(seed=0)  # doctest: +SKIP
        >>> x = obs.numpy(dtype=np.float32, scale=1 / 255)  # (num_envs, 4, 84, 84) in [0, 1]
    """

    __slots__ = ("_pool", "_slots", "_layout", "_shape", "__weakref__")

    def __init__(self, *args, **kwargs):
        raise TypeError("use FramePool.lazy_batch(slots, layout=...) to make a LazyBatch")

    @classmethod
    def _make(cls, pool, slots, layout):
        arr = C.as_slots(slots)
        if arr.ndim != 2 or arr.shape[1] == 0:
            raise ValueError(f"slots must have shape (num_envs, k) with k >= 1, got {arr.shape}")
        C.check_layout(layout, pool.frame_shape)
        arr = arr.copy()
        pool.retain(arr)  # checks every slot before taking any reference
        self = cls.__new__(cls)
        self._pool = pool
        self._slots = arr
        self._layout = layout
        self._shape = (arr.shape[0],) + C.observation_shape(pool.frame_shape, arr.shape[1], layout)
        return self

    def __del__(self):
        try:
            self._pool.release(self._slots)
        except Exception:  # half-built object, or interpreter shutdown
            pass

    @property
    def pool(self):
        """The pool holding the frames."""
        return self._pool

    @property
    def slots(self) -> np.ndarray:
        """A copy of the slot ids, int64 ``(num_envs, k)``, oldest frame first."""
        return self._slots.copy()

    @property
    def layout(self) -> str:
        return self._layout

    @property
    def stack_size(self) -> int:
        """k, the frames per observation."""
        return self._slots.shape[1]

    @property
    def shape(self) -> tuple:
        """Shape of ``np.asarray(self)``: ``(num_envs, *observation_shape)``."""
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        return self._pool.dtype

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the materialised array (not of the memory held; see the pool)."""
        return int(np.prod(self._shape)) * self._pool.dtype.itemsize

    def numpy(self, out=None, *, dtype=None, scale=None) -> np.ndarray:
        """Materialise the batch into ``out`` (or a new array) in one copy.

        Args:
            out: optional C-contiguous writeable ndarray of shape :attr:`shape`.
            dtype: output dtype (same-kind casts, e.g. uint8 -> float32).
            scale: multiply by this after converting (float output only), e.g. 1/255.

        Returns:
            ``out`` or a new array of shape :attr:`shape`.

        Raises:
            TypeError, ValueError: a bad ``out``, ``dtype`` or ``scale`` (nothing written).
        """
        return self._pool.gather(self._slots, out, layout=self._layout, dtype=dtype, scale=scale)

    def __array__(self, dtype=None, copy=None):
        return C.array_protocol(
            self, dtype, copy,
            lambda dt: self._pool.gather(self._slots, layout=self._layout, dtype=dt))

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """DLPack export of a fresh materialised batch: ``torch.as_tensor(batch)`` copies once
        instead of walking the sequence protocol (case C05)."""
        return C.dlpack(self, stream, max_version, dl_device, copy)

    def __dlpack_device__(self):
        return C.DLPACK_DEVICE

    def __len__(self):
        return self._slots.shape[0]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return LazyBatch._make(self._pool, self._slots[i], self._layout)
        try:
            j = C.index_frame(i, self._slots.shape[0], "environments")
        except TypeError:
            raise TypeError(
                f"LazyBatch indices must be an int (one env's LazyFrames) or a slice, got "
                f"{type(i).__name__}; use np.asarray(batch)[...] for array indexing"
            ) from None
        return self._pool.lazy(self._slots[j], layout=self._layout)

    def __iter__(self):
        for j in range(self._slots.shape[0]):
            yield self._pool.lazy(self._slots[j], layout=self._layout)

    def __copy__(self):
        # frames are immutable, so a copy shares them (no frame bytes copied)
        return LazyBatch._make(self._pool, self._slots, self._layout)

    def __deepcopy__(self, memo):
        return self.__copy__()

    def __reduce__(self):
        return C.reduce_lazybatch(self)

    __hash__ = None

    def __repr__(self):
        return f"LazyBatch(shape={self._shape}, dtype={self.dtype}, layout={self._layout!r})"


def stack(observations, out=None, *, dtype=None, scale=None) -> np.ndarray:
    """Materialise a batch of observations into one array: ``(B, *observation_shape)``.

    The fast equivalent of ``np.array(list_of_lazyframes)``. In the compiled core it is
    one C call with the GIL released; ``dtype`` and ``scale`` are fused into the copy,
    e.g. ``stack(batch, dtype=np.float32, scale=1/255)`` for ``uint8 -> [0, 1]``.

    Args:
        observations: a non-empty sequence of :class:`LazyFrames` with one shape, dtype
            and layout (they may come from different pools).
        out: optional C-contiguous, writeable ndarray of shape ``(B, *obs_shape)`` to
            fill; its dtype is the output dtype when ``dtype`` is None.
        dtype: output dtype (same-kind casts, e.g. uint8 -> float32). Default: the frames'.
        scale: multiply by this after converting (float output dtypes only).

    Returns:
        ``out``, or a new array.

    Raises:
        ValueError: no observations, mismatched shapes or layouts, or a bad ``out``
            (shape, contiguity, read-only).
        TypeError: a non-LazyFrames element, mismatched dtypes, an unsupported
            conversion, or ``out`` of the wrong dtype.
    """
    obs = list(observations)
    if not obs:
        raise ValueError("stack needs at least one observation")
    first = obs[0]
    for o in obs:
        if not isinstance(o, LazyFrames):
            raise TypeError(
                f"stack takes LazyFrames, got {type(o).__name__}; use np.stack for ndarrays"
            )
        C.check_same_geometry(first, o)
    frames = []
    for o in obs:
        p = o.pool
        frames.append([p._data[c][off] for c, off in (divmod(s, p._spc) for s in o.slots)])
    return _copy_out(frames, first.frame_shape, first.dtype, first.stack_size, first.layout,
                     out, dtype, scale)
