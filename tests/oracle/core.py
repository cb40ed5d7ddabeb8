"""A NumPy reference of the values of the compiled core ``lazyframes._core``.

Each function restates one documented behaviour in plain NumPy, sharing nothing with the
core: layouts (``csrc/layout.h``), fused conversions (``csrc/kernels.c``), a pool's frames
and refcounts, a ``SlotTable``'s references, a ``SumTree``'s draws (``csrc/sumtree.h``).
"""

import math

import numpy as np

LAYOUTS = ("last", "first", "stack")


def assert_same(got, want):
    """``got`` is ``want`` bit for bit: shape, dtype and bytes."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.dtype)
    assert got.tobytes() == want.tobytes(), f"values differ:\n{got}\nexpected\n{want}"


def observation_shape(frame_shape, k, layout):
    """Shape of one observation of ``k`` frames of ``frame_shape`` in ``layout``."""
    shape = tuple(frame_shape)
    if layout == "last":
        return shape[:-1] + (k * shape[-1],)
    if layout == "first":
        return (k * shape[0],) + shape[1:]
    return (k, *shape)


def observation(frames, layout):
    """``frames`` (oldest first) as one observation: concatenated last or first, or stacked."""
    if layout == "last":
        return np.concatenate(frames, axis=-1)
    if layout == "first":
        return np.concatenate(frames, axis=0)
    if layout == "stack":
        return np.stack(frames, axis=0)
    raise ValueError(f"unknown layout {layout!r}")


def convert(a, dtype=None, scale=None):
    """``a`` converted to ``dtype``, then times ``scale`` in that dtype's precision.

    The kernels multiply ``(T)value * (T)scale`` with ``T`` the output type and ``scale``
    passed as a C double (``float(scale)``): ``np.float32(float(1 / 255))`` for float32.
    """
    out = np.asarray(a) if dtype is None else np.asarray(a).astype(dtype)
    if scale is not None:
        out = out * out.dtype.type(float(scale))
    return out


def gather(frames, slots, layout, dtype=None, scale=None):
    """The observations of ``slots`` (``(k,)``: one; ``(n, k)``: n) of ``frames[slot]``."""
    ids = np.asarray(slots, np.int64)
    rows = ids.reshape(-1, ids.shape[-1])
    obs = [observation([np.asarray(frames[int(s)]) for s in row], layout) for row in rows]
    if not obs:  # the shape and dtype would come from frames there are none of
        raise ValueError("no observations: use Store.gather")
    out = convert(np.stack(obs), dtype, scale)
    return out.reshape(ids.shape[:-1] + out.shape[1:])


class Store:
    """What a ``FramePool`` holds: the frame and refcount of each live slot (the pool's ids)."""

    def __init__(self, frame_shape, dtype):
        self.frame_shape, self.dtype = tuple(frame_shape), np.dtype(dtype)
        self.frames = {}
        self.refs = {}

    def push(self, slot, frame):
        """A new frame at ``slot``, with one reference (its owner's)."""
        slot = int(slot)
        if slot in self.refs:
            raise AssertionError(f"slot {slot} is given out again while it is live")
        self.frames[slot] = np.array(frame)  # a copy: the caller's array may change
        self.refs[slot] = 1

    def incref(self, slots):
        """One more reference to each of ``slots`` (each must be live)."""
        for s in np.ravel(np.asarray(slots, np.int64)):
            if int(s) not in self.refs:
                raise AssertionError(f"slot {int(s)} is not live")
            self.refs[int(s)] += 1

    def decref(self, slots):
        """One reference fewer to each of ``slots``; a frame without any is freed."""
        for s in np.ravel(np.asarray(slots, np.int64)):
            s = int(s)
            self.refs[s] -= 1
            if self.refs[s] == 0:
                del self.refs[s], self.frames[s]

    def hold(self, slots, new=()):
        """An owner's reference to each of ``slots``; ``new``: {slot: frame} it brought in."""
        fresh = dict(new)
        for s, frame in fresh.items():
            self.push(s, frame)
        for s in np.ravel(np.asarray(slots, np.int64)).tolist():
            if fresh.pop(s, None) is None:
                self.incref([s])
        if fresh:
            raise AssertionError(f"new frames at {sorted(fresh)} that the owner does not hold")

    @property
    def live_frames(self):
        """Frames with at least one reference."""
        return len(self.refs)

    def gather(self, slots, layout, dtype=None, scale=None):
        """:func:`gather` of this store's frames (no observations: an empty array)."""
        ids = np.asarray(slots, np.int64)
        if ids.size:
            return gather(self.frames, ids, layout, dtype, scale)
        obs = observation_shape(self.frame_shape, ids.shape[-1], layout)
        return np.empty(ids.shape[:-1] + obs, self.dtype if dtype is None else dtype)


class Table:
    """A ``SlotTable``: ``(rows, width)`` ids of a :class:`Store` (a reference each), -1 empty."""

    def __init__(self, store, rows, width):
        self.store = store
        self.ids = np.full((rows, width), -1, np.int64)

    def put(self, rows, ids):
        """Rows ``rows`` now hold ``ids`` (-1: empty): what ``set``, ``take`` and ``clear`` do."""
        ids = np.broadcast_to(np.asarray(ids, np.int64), (len(rows), self.ids.shape[1]))
        self.store.incref(ids[ids >= 0])
        old = self.ids[rows]
        self.ids[rows] = ids
        self.store.decref(old[old >= 0])


def draws(leaves, u):
    """The leaves a ``SumTree`` over ``leaves`` draws for ``u``, and which draws are ties.

    Draw ``j`` of ``m = len(u)`` takes the leaf whose span of the running sum of the
    leaves holds ``x = (j + u[j]) * total / m``: the first leaf whose running sum exceeds
    ``x``. An empty leaf (0) spans nothing, so it is never drawn.

    Returns:
        ``(indices, near)``: the int64 leaf of each draw, and where ``x`` lies within
        ``1e-9 * total`` of the end of a span (there a tree's pairwise sums, rounded
        otherwise than this running sum, may take the neighbouring leaf).
    """
    leaves = np.asarray(leaves, np.float64)
    u = np.asarray(u, np.float64)
    total = math.fsum(leaves)
    if not total > 0:
        raise ValueError("every leaf is empty")
    ends = np.cumsum(leaves)
    x = (np.arange(len(u)) + u) * total / len(u)
    last = int(np.flatnonzero(leaves > 0)[-1])
    indices = np.minimum(np.searchsorted(ends, x, side="right"), last)
    gap = np.abs(ends[None, :] - x[:, None]).min(axis=1) if len(u) else np.zeros(0)
    return indices.astype(np.int64), gap <= 1e-9 * total


def weights(leaves, indices, beta):
    """Importance weights ``(leaf / min) ** -beta`` of the drawn ``indices``, as float32.

    ``min`` is the smallest non-empty leaf; each power is C's ``pow`` in float64 (Python's
    ``**`` of two floats), then rounded to float32.
    """
    leaves = np.asarray(leaves, np.float64)
    lo = float(leaves[leaves > 0].min())
    return np.array([(float(leaves[i]) / lo) ** -float(beta) for i in indices], np.float32)
