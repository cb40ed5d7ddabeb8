"""The core's API; bad input: its exception, a message naming the problem, nothing written."""

import copy
import gc
import itertools
import pickle
import re
import threading

import numpy as np
import pytest
from conftest import f, make_pool, refused, snapshot
from oracle import core as ref
from test_properties import random_frames

from lazyframes import _core as core

FRAME = (84, 84, 1)
FB = 84 * 84  # bytes of one FRAME uint8 frame
LAYOUT_SHAPES = {"last": (84, 84, 1), "first": (1, 84, 84), "stack": (84, 84)}


def rand_frames(n, shape=FRAME, dtype=np.uint8, seed=0):
    return random_frames(np.random.default_rng(seed), n, shape, dtype)


def pool_with(frames, chunk_bytes=1 << 20):
    """A pool holding ``frames``; returns it and the FrameRefs that own them."""
    pool = make_pool(frames.shape[1:], frames.dtype, chunk_bytes=chunk_bytes)
    return pool, [pool.push(fr) for fr in frames]


def ids(refs):
    """The slot ids of a list of FrameRefs."""
    return [r.slot for r in refs]


def values(pool, slots):
    """The first element of each frame, by slot id: a compact view of a row's contents."""
    return [int(pool.get(int(s)).flat[0]) for s in np.ravel(slots)]


def test_push_copies_once_and_source_changes_never_reach_the_pool():
    src, pool = f(7), make_pool()
    r = pool.push(src)
    frames = [f(v) for v in range(4)]
    lz = core.LazyFrames(frames)  # LazyFrames of arrays: the same one copy in
    assert type(r) is core.FrameRef and r.pool is pool and isinstance(r.slot, int)
    src[...] = 99  # the env reuses its buffer
    for a in frames:
        a[...] = 200
    np.testing.assert_array_equal(pool.get(r), f(7))
    np.testing.assert_array_equal(np.asarray(lz), ref.observation([f(v) for v in range(4)], "last"))
    got = pool.get(r.slot)
    got[...] = 1  # get returns a copy: writing it does not touch the pool
    np.testing.assert_array_equal(pool.get(r), f(7))
    assert pool.refcount(r) == 1 and pool.live_frames == 1
    s = r.slot
    del r  # the one owner goes: the slot is free
    assert pool.refcount(s) == 0 and pool.live_frames == 0


MAKERS = {
    "contiguous": np.copy,
    "view": lambda a: np.asarray(a).copy().view(),
    "read-only": lambda a: np.frombuffer(a.tobytes(), a.dtype).reshape(a.shape),
    "non-contiguous": lambda a: np.repeat(a, 2, axis=1)[:, ::2],
    "fortran": np.asfortranarray,
}


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_push_accepts_views_readonly_noncontiguous(make):
    want = rand_frames(1)[0]
    frame = make(want.copy())
    pool = make_pool()
    r = pool.push(frame)
    np.testing.assert_array_equal(pool.get(r), want)
    np.testing.assert_array_equal(np.asarray(frame), want)  # input unmodified


def test_push_accepts_other_byte_order():
    want = rand_frames(2, (5, 4), np.int16)
    pool = make_pool((5, 4), np.int16)
    swapped = want[0].astype(">i2" if np.little_endian else "<i2")
    keep = swapped.copy()
    r = pool.push(swapped)
    assert pool.dtype == np.dtype(np.int16)
    np.testing.assert_array_equal(pool.get(r), want[0])
    assert pool.get(r).dtype == np.dtype("=i2")
    np.testing.assert_array_equal(swapped, keep)
    batch = pool.push_batch(want.astype(swapped.dtype))
    np.testing.assert_array_equal(np.asarray(batch)[:, 0], want)


def test_frameref_repr_and_no_int_protocol():
    pool = make_pool()
    r = pool.push(f(3))
    text = repr(r)
    assert text.startswith("FrameRef(") and str(r.slot) in text
    with pytest.raises(TypeError):
        [0, 1, 2][r]  # a FrameRef is not an int: it cannot be used as one
    refused(TypeError, "", core.FrameRef)
    with pytest.raises(AttributeError):
        r.slot = 5
    assert pool.refcount(r) == 1


def test_push_batch_layout():
    pool = make_pool()
    got = pool.push_batch(np.stack([f(1), f(2)]), k=2, layout="last")
    assert got.layout == "last" and got.shape == (2, 84, 84, 2)
    np.testing.assert_array_equal(np.asarray(got)[1], ref.observation([f(2), f(2)], "last"))


def test_refcounts_follow_owners():
    pool, (r0, r1) = pool_with(rand_frames(2))
    s0, s1 = r0.slot, r1.slot
    assert pool.refcount(s0) == pool.refcount(r0) == 1
    lz = pool.lazy([r0, r1, s0], layout="last")  # FrameRefs and ints mix
    assert (pool.refcount(s0), pool.refcount(s1)) == (3, 2)
    lz2, lz3 = copy.copy(lz), copy.deepcopy(lz)
    lz4 = lz.copy()
    assert (pool.refcount(s0), pool.refcount(s1)) == (9, 5)
    batch = pool.lazy_batch([[r0, r1], [s1, s1]])
    assert (pool.refcount(s0), pool.refcount(s1)) == (10, 8)
    del lz, lz2, lz3, lz4
    assert (pool.refcount(s0), pool.refcount(s1)) == (2, 4)
    del r0, r1
    assert (pool.refcount(s0), pool.refcount(s1)) == (1, 3) and pool.live_frames == 2
    del batch
    assert (pool.refcount(s0), pool.refcount(s1)) == (0, 0) and pool.live_frames == 0


def test_slot_reuse_most_recently_freed_first():
    # freed slots of the lowest chunk with one go before new ones, the last freed first
    pool, refs = pool_with(rand_frames(5))
    assert ids(refs) == [0, 1, 2, 3, 4]
    refs[1] = None  # slot 1 freed,
    refs[3] = None  # then slot 3
    keep = [pool.push(f(3)), pool.push(f(1)), pool.push(f(5))]
    assert ids(keep) == [3, 1, 5]
    refs[0] = None
    assert pool.push(f(0)).slot == 0
    np.testing.assert_array_equal(pool.get(3), f(3))  # the new frame of a reused slot is read
    assert pool.refcount(3) == 1 and pool.live_frames == 5  # (get of a freed slot: bad slots)


def test_chunks_fill_release_and_keep_one_spare():
    # 4 slots per chunk; 3 chunks
    pool, refs = pool_with(rand_frames(12), chunk_bytes=4 * FB)
    assert pool.slots_per_chunk == 4 and pool.frame_bytes == FB
    assert pool.capacity == 12 and pool.bytes_held == 12 * FB == pool.peak_bytes
    for i in range(8, 12):  # chunk 2 empties (slot 11 freed last): kept as the one spare
        refs[i] = None
    assert pool.bytes_held == 12 * FB and pool.live_frames == 8
    for i in range(4, 8):  # chunk 1 empties: a spare exists, so it is released
        refs[i] = None
    assert pool.bytes_held == 8 * FB and pool.capacity == 8
    assert pool.peak_bytes == 12 * FB and pool.live_frames == 4 and pool.live_bytes == 4 * FB
    # the lowest chunk with memory and a free slot is used first, then released ids
    more = [pool.push(f(i)) for i in range(5)]
    assert ids(more) == [11, 10, 9, 8, 4] and pool.bytes_held == 12 * FB
    del refs, more
    assert pool.live_frames == 0 and pool.bytes_held == 4 * FB  # one empty chunk kept
    assert pool.refcount(5) == 0 and pool.refcount(11) == 0
    pool = make_pool(chunk_bytes=1)  # smaller than a frame: one slot per chunk
    refs = [pool.push(f(i)) for i in range(3)]
    assert pool.slots_per_chunk == 1 and pool.live_frames == 3
    del refs
    assert pool.live_frames == 0 and pool.bytes_held == FB  # one empty chunk kept


def test_stats_and_repr():
    pool, refs = pool_with(rand_frames(3))
    st = pool.stats()
    assert set(st) == {"live_frames", "live_bytes", "capacity", "frame_bytes", "bytes_held",
                       "peak_bytes", "hot_frames", "cold_frames", "cold_bytes", "slot_state_bytes",
                       "pending_frames"}  # fmt: skip
    assert (st["live_frames"], st["live_bytes"], st["frame_bytes"]) == (3, 3 * FB, FB)
    assert st["hot_frames"] == 3 and st["cold_frames"] == st["cold_bytes"] == 0
    assert st["slot_state_bytes"] == 0  # a plain pool
    assert (st["capacity"], st["bytes_held"], st["peak_bytes"]) == (
        pool.capacity, pool.bytes_held, pool.peak_bytes)  # fmt: skip
    assert pool.slots_per_chunk == 128  # the largest power of two <= (1 << 20) // FB
    assert st["capacity"] == 128 and st["bytes_held"] == st["peak_bytes"] == 128 * FB
    assert pool.frame_shape == FRAME and pool.dtype == np.dtype(np.uint8)
    r = repr(pool)
    assert r.startswith("FramePool(") and "(84, 84, 1)" in r and "uint8, live_frames=3" in r
    lz = pool.lazy(refs, layout="last")
    assert repr(lz) == "LazyFrames(shape=(84, 84, 3), dtype=uint8, layout='last', stack_size=3)"
    refused(TypeError, "cannot be pickled", pickle.dumps, pool)  # observations pickle, not pools


def test_stack_accepts_observations_from_different_pools():
    fa, fb = rand_frames(4, seed=1), rand_frames(4, seed=2)
    (pa, sa), (pb, sb) = pool_with(fa), pool_with(fb)
    out = core.stack([pa.lazy(sa, layout="last"), pb.lazy(sb, layout="last")])
    want = [ref.observation(list(fa), "last"), ref.observation(list(fb), "last")]
    np.testing.assert_array_equal(out, np.stack(want))


def test_frameref_pickles_as_its_frame_into_the_default_pool():
    pool = make_pool((3, 2), np.int16)
    r = pool.push(np.arange(6, dtype=np.int16).reshape(3, 2))
    data = pickle.dumps(r)
    back = pickle.loads(data)
    assert type(back) is core.FrameRef
    assert back.pool is core.default_pool((3, 2), np.int16) is core.default_pool([3, 2], "int16")
    others = (pool, core.default_pool((3, 2), np.uint8), core.default_pool((2, 3), np.int16))
    assert all(back.pool is not p for p in others)
    np.testing.assert_array_equal(back.pool.get(back), pool.get(r))
    assert pool.refcount(r) == 1 and back.pool.refcount(back) == 1
    two = pickle.loads(pickle.dumps([r, r]))  # one frame written, one FrameRef back
    assert two[0] is two[1]


# -- bad input: right exception, clear message, nothing written -------------------------------
class Scene:
    """A pool, batches [[1, 2], [3, 4]] and 3 x 2, 2 x 1; a 3 x 4 table of rows 0-1 (b, b)."""

    def __init__(self):
        self.pool = pool = make_pool()
        self.b, self.b3, self.b1 = (_batch_of(pool, [[1, 2], [3, 4]]),
                                    _batch_of(pool, [[5, 6], [7, 8], [9, 10]]),
                                    _batch_of(pool, [[1], [2]]))  # fmt: skip
        rows = [*self.b.slots, self.b.slots[0, :1]]  # obs[2]: k = 1; obs[3]: layout "stack"
        self.obs = [
            *(pool.lazy(r, layout="last") for r in rows),
            pool.lazy(rows[0], layout="stack"),
        ]
        self.last = pool.lazy_batch(self.b.slots, layout="last")
        self.t = _table(pool, rows=3, width=4)
        self.t.set([0, 1], (self.b, self.b))
        self.good = np.stack([f(5), f(6)])
        self.out, self.two = np.zeros((1, 84, 84, 3), np.float32), np.zeros((2, 84, 84, 3), "f4")
        buf = np.zeros(3 * self.out.size // 2, np.float32)  # two outs sharing a half
        self.halves = (buf[: self.out.size].reshape(self.out.shape),
                       buf[self.out.size // 2 :].reshape(self.out.shape))  # fmt: skip

    def state(self):
        slots = np.concatenate([x.slots.ravel() for x in (self.b, self.b3, self.b1)])
        return self.t.ids().tolist(), snapshot(self.pool, slots), self.out.tobytes()


PAIRS = ([0], (0, 3), [0], (1, 4))  # gather_pairs' rows and ranges of Scene.t
Z, LAYOUT = np.zeros, "layout must be one of"
#: name: (exception, message, a call on a Scene); bad rows, ids, pads, sizes: test_misuse
REFUSED = {
    **{f"FramePool {dt}": (TypeError, "numeric dtype", lambda s, dt=dt: core.FramePool(FRAME, dt))
       for dt in (object, "U3", "u1,u1")},
    "FramePool 0 size": (ValueError, "not positive", lambda s: core.FramePool((84, 0), np.uint8)),
    "FramePool float": (TypeError, "tuple of ints", lambda s: core.FramePool((84.5, 3), np.uint8)),
    "FramePool chunk": (ValueError, "chunk_bytes", lambda s: make_pool(chunk_bytes=0)),
    "push_batch rank": (ValueError, "shape", lambda s: s.pool.push_batch(s.good[..., 0])),
    "push_batch one": (ValueError, "shape", lambda s: s.pool.push_batch(f(5))),
    "push_batch none": (ValueError, "", lambda s: s.pool.push_batch(s.good[:0])),
    "push_batch k 0": (ValueError, "k", lambda s: s.pool.push_batch(s.good, k=0)),
    "push_batch k -1": (ValueError, "k", lambda s: s.pool.push_batch(s.good, k=-1)),
    "layout push_batch": (ValueError, LAYOUT, lambda s: s.pool.push_batch(s.good, layout="")),
    "layout lazy": (ValueError, LAYOUT, lambda s: s.pool.lazy([1], layout="middle")),
    "layout gather": (ValueError, LAYOUT, lambda s: s.pool.gather([[1]], layout="middle")),
    "layout lazy_batch": (ValueError, LAYOUT, lambda s: s.pool.lazy_batch([[1]], layout="")),
    "layout LazyFrames": (ValueError, LAYOUT, lambda s: core.LazyFrames([f(0)], layout="x")),
    "shift rows": (ValueError, "frames have shape", lambda s: s.b.shift(s.good[:1])),
    "shift restart": (ValueError, "restart has shape", lambda s: s.b.shift(s.good, [True])),
    "replace repeats": (ValueError, "", lambda s: s.b3.replace([0, 0], s.b)),
    "replace rows": (ValueError, "", lambda s: s.b3.replace([0], s.b)),
    "replace k": (ValueError, "", lambda s: s.b3.replace([0, 1], s.b1)),
    "replace layout": (ValueError, "", lambda s: s.b3.replace([0, 1], s.last)),
    "replace ints": (TypeError, "", lambda s: s.b3.replace([0, 1], s.b.slots)),
    "set repeats": (ValueError, "", lambda s: s.t.set([1, 1], (s.b, s.b))),
    "set width": (ValueError, "", lambda s: s.t.set([0, 1], (s.b,))),
    "set rows": (ValueError, "", lambda s: s.t.set([0, 1, 2], (s.b, s.b))),
    "set ints": (TypeError, "", lambda s: s.t.set([0, 1], (s.b, s.b.slots))),
    "set float row": (TypeError, "", lambda s: s.t.set([0.5, 1], (s.b, s.b))),
    "batch empty": (ValueError, "row 2 is empty", lambda s: s.t.batch([0, 2], 0, 2)),
    "gather empty": (ValueError, "row 2 is empty", lambda s: s.t.gather([2], 0, 2)),
    **{f"batch {a}:{b}": (ValueError, "columns", lambda s, a=a, b=b: s.t.batch([0], a, b))
       for a, b in ((0, 5), (-1, 2), (2, 2), (3, 1))},
    "SlotTable rows": (ValueError, "a SlotTable needs", lambda s: core.SlotTable(s.pool, -1, 2)),
    "SlotTable width": (ValueError, "a SlotTable needs", lambda s: core.SlotTable(s.pool, 2, 0)),
    "SlotTable huge": (ValueError, "too large", lambda s: core.SlotTable(s.pool, 0, 2**62)),
    "SlotTable pool": (TypeError, "", lambda s: core.SlotTable(object(), 2, 2)),
    "SlotTable pickle": (TypeError, "", lambda s: pickle.dumps(s.t)),
    "pairs widths": (ValueError, "", lambda s: s.t.gather_pairs([0], (0, 3), [0], (1, 3))),
    "pairs dtypes": (TypeError, "different dtypes",
                     lambda s: s.t.gather_pairs(*PAIRS, (s.out, s.out.astype(np.float64)))),
    "pairs one out": (ValueError, "overlap", lambda s: s.t.gather_pairs(*PAIRS, (s.out, s.out))),
    "pairs halves": (ValueError, "the two arrays of out overlap",
                     lambda s: s.t.gather_pairs(*PAIRS, s.halves)),
    "pairs shape": (ValueError, "shape", lambda s: s.t.gather_pairs(*PAIRS, (s.out, s.two))),
    "pairs empty": (ValueError, "row 2 is", lambda s: s.t.gather_pairs([0], (0, 3), [2], (1, 4))),
    "take width": (ValueError, "", lambda s: s.t.take([2], s.b, np.array([[0, 1, 2]]))),
    "take repeats": (ValueError, "", lambda s: s.t.take([2, 2], s.b, Z((2, 4), np.int64))),
    "take ints": (TypeError, "", lambda s: s.t.take([2], s.b.slots, Z((1, 4), np.int64))),
    "dedup rank": (ValueError, "expected", lambda s: s.pool._push_dedup(s.good[0])),
    "dedup dtype": (TypeError, "dtype", lambda s: s.pool._push_dedup(s.good[None].astype("i2"))),
    "dedup n": (ValueError, "candidates", lambda s: s.pool._push_dedup(s.good[:, None], s.b1[:1])),
    "dedup ints": (TypeError, "", lambda s: s.pool._push_dedup(s.good[:, None], s.b1.slots)),
    "dedup next": (ValueError, "next_frames",
                   lambda s: s.pool._push_dedup(s.good[:, None], None, s.good[:1, None])),
    "stack none": (ValueError, "at least one", lambda s: core.stack([])),
    "stack ndarray": (TypeError, "LazyFrames", lambda s: core.stack([s.obs[0], s.good[0]])),
    "stack dtypes": (TypeError, "dtypes",
                     lambda s: core.stack([s.obs[0], core.LazyFrames([f(0, dtype=np.int16)] * 2)])),
    "stack k": (ValueError, "differ", lambda s: core.stack([s.obs[0], s.obs[2]])),
    "stack layout": (ValueError, "differ", lambda s: core.stack([s.obs[0], s.obs[3]])),
    **{f"{m} {j}": (IndexError, "out of range", lambda s, m=m, j=j: getattr(s.obs[0], m)(j))
       for m in ("frame", "get_frame") for j in (2, -3)},
    "frame float": (TypeError, "", lambda s: s.obs[0].frame(1.5)),
    "index 84": (IndexError, "", lambda s: s.obs[0][84]),
}  # fmt: skip


@pytest.mark.parametrize("name", list(REFUSED))
def test_refused_call_writes_nothing(name):
    exc, pattern, call = REFUSED[name]
    scene = Scene()
    before = scene.state()
    refused(exc, pattern, call, scene)
    assert scene.state() == before


@pytest.mark.parametrize("bad,exc,pattern", [
    (np.zeros((84, 84), np.uint8), ValueError, "shape"),
    (np.zeros((84, 84, 2), np.uint8), ValueError, "shape"),
    (np.zeros((84, 84, 1), np.int16), TypeError, "dtype"),
    (np.zeros((84, 84, 1), np.float32), TypeError, "dtype"),
    (np.empty((84, 84, 1), object), TypeError, "object"),
])  # fmt: skip
def test_push_bad_frame_writes_nothing(bad, exc, pattern):
    pool, slots = pool_with(rand_frames(2))
    lz, batch = pool.lazy(slots), pool.lazy_batch([slots, slots])
    before = snapshot(pool, slots)
    keep, many = bad.copy(), np.stack([bad, bad])
    for call, arg in [(pool.push, bad), (lz.shift, bad), (pool.push_batch, many),
                      (batch.shift, many)]:  # fmt: skip
        refused(exc, pattern, call, arg)
        assert snapshot(pool, slots) == before
    assert bad.dtype == keep.dtype and (bad == keep).all()
    r = pool.push(f(1))
    assert pool.live_frames == 3
    assert r.slot == 2  # the failed calls used no slot


@pytest.mark.parametrize("frames,exc,pattern", [
    ([], ValueError, "at least one"),
    ([f(0), np.zeros((84, 84, 2), np.uint8)], ValueError, "shape"),
    ([f(0), f(1, dtype=np.int16)], TypeError, "dtype"),
    ([f(0), np.empty((84, 84, 1), object)], TypeError, "object"),
    ([f(0, shape=(1, 84, 84))], ValueError, "channels-first"),
    ([f(0, shape=(84, 84))], ValueError, "channel axis"),
])  # fmt: skip
def test_lazyframes_bad_frames_write_nothing(frames, exc, pattern):
    pool = core.default_pool(FRAME, np.uint8)
    keep = core.LazyFrames([f(9)])  # something live in the default pool
    before = snapshot(pool, keep.slots)
    copies = [np.array(a, copy=True) for a in frames]
    refused(exc, pattern, core.LazyFrames, frames)
    assert snapshot(pool, keep.slots) == before
    for a, b in zip(frames, copies, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def _out_case(layout="last"):
    frames = rand_frames(4, LAYOUT_SHAPES[layout])
    pool, slots = pool_with(frames)
    obs = [pool.lazy(slots, layout=layout), pool.lazy(slots[::-1], layout=layout)]
    idx = np.array([ids(slots), ids(slots)[::-1]])
    full = (2,) + obs[0].shape
    return pool, slots, obs, idx, full


def _bad_outs(full):
    a = np.full(full, 7, np.uint8)
    ro = np.full(full, 7, np.uint8)
    ro.flags.writeable = False
    nc = np.full(full[:-1] + (full[-1] * 2,), 7, np.uint8)[..., ::2]
    return [(np.full(full[:-1] + (full[-1] + 1,), 7, np.uint8), ValueError, "shape"),
            (np.full((1,) + full[1:], 7, np.uint8), ValueError, "shape"),
            (np.full(full, 7, np.bool_), TypeError, "cannot convert"),
            (np.full(full, 7, np.float16), TypeError, "no fused conversion"),
            (nc, ValueError, "contiguous"),
            (np.asfortranarray(a), ValueError, "contiguous"),
            (ro, ValueError, "read-only"), (a.tolist(), TypeError, "ndarray")]  # fmt: skip


@pytest.mark.parametrize("layout", ["last", "first", "stack"])
def test_bad_out_writes_nothing(layout):
    pool, slots, obs, idx, full = _out_case(layout)
    before = snapshot(pool, slots)
    for out, exc, pattern in _bad_outs(full):
        keep = np.array(out, copy=True)
        refused(exc, pattern, core.stack, obs, out)
        refused(exc, pattern, pool.gather, idx, out, layout=layout)
        assert snapshot(pool, slots) == before and np.array_equal(np.asarray(out), keep)
        assert not isinstance(out, np.ndarray) or out.dtype == keep.dtype  # (a list: no dtype)
    # out given with a dtype argument that does not match it
    for dt, out_dt in ((np.float32, np.uint8), (np.float32, np.float64), (None, np.int8)):
        out = np.full(full, 7, out_dt)
        refused(TypeError, "dtype", core.stack, obs, out, dtype=dt or np.uint8)
        refused(TypeError, "dtype", pool.gather, idx, out, layout=layout, dtype=dt or np.uint8)
        assert (out == 7).all()
    assert snapshot(pool, slots) == before


def test_out_dtype_is_the_conversion_target():
    pool, _, obs, idx, full = _out_case()
    want = np.stack([np.asarray(o) for o in obs])
    for dt in (np.int16, np.uint16, np.int64, np.float32, np.float64):
        for call in (lambda o: core.stack(obs, o), lambda o: pool.gather(idx, o, layout="last")):
            out = np.zeros(full, dt)
            assert call(out) is out
            np.testing.assert_array_equal(out, want.astype(dt))


def test_bad_slots_write_nothing():
    frames = rand_frames(4)
    pool, refs = pool_with(frames)
    s0, s1, s2, s3 = ids(refs)
    del refs[2]  # slot s2 is now free
    live = [s0, s1, s3]
    before = snapshot(pool, [s0, s1, s2, s3])
    out = np.full((1, 84, 84, 3), 7, np.uint8)
    n = pool.capacity
    far = [([s0, s1, v], IndexError, f"slot {v} is out of range")
           for v in (n, -1, 2**40, -(2**40), 2**63 - 1, -(2**63))]  # fmt: skip
    for bad, exc, pattern in [([s0, s1, s2], ValueError, f"slot {s2} is free"), *far]:
        idx = np.array([bad])
        keep = idx.copy()
        refused(exc, pattern, pool.gather, idx, out, layout="last")
        refused(exc, pattern, pool.lazy, bad, layout="last")
        refused(exc, pattern, pool.lazy_batch, [bad], layout="last")
        refused(exc, pattern, pool.get, bad[-1])
        assert snapshot(pool, [s0, s1, s2, s3]) == before and (out == 7).all()
        np.testing.assert_array_equal(idx, keep)
    refused(IndexError, "out of range", pool.refcount, -1)
    refused(IndexError, "out of range", pool.refcount, 2**40)
    assert pool.refcount(s2) == 0
    refused(TypeError, "integers", pool.gather, np.array([[0.0, 1.0]]))
    refused(TypeError, "integers", pool.lazy_batch, np.array([[0.5]]))
    refused(ValueError, r"\(B, k\)", pool.gather, np.array(live))
    refused(ValueError, r"\(B, k\)", pool.gather, np.zeros((1, 0), np.int64))
    refused(ValueError, "non-empty", pool.lazy, [], layout="last")
    refused(ValueError, "non-empty", pool.lazy, [[s0, s1]], layout="last")
    assert snapshot(pool, [s0, s1, s2, s3]) == before


@pytest.mark.parametrize(
    "dtype,scale,exc,pattern",
    [
        (np.uint8, 0.5, TypeError, "scale"), (np.int32, 0.5, TypeError, "scale"),
        (None, 1 / 255, TypeError, "scale"),
        (np.float32, "0.5", TypeError, "scale must be a real number"),
        (np.float32, True, TypeError, "scale must be a real number"),
        (np.bool_, None, TypeError, "cannot convert"),
        (np.float16, None, TypeError, "no fused conversion"),
        (np.complex64, None, TypeError, "no fused conversion"),
    ],
)  # fmt: skip
def test_unsupported_conversion_writes_nothing(dtype, scale, exc, pattern):
    pool, slots, obs, idx, full = _out_case()
    before = snapshot(pool, slots)
    out_dt = np.uint8 if dtype is None else dtype
    out = np.full(full, 7, out_dt)
    keep = out.copy()
    refused(exc, pattern, core.stack, obs, out, dtype=dtype, scale=scale)
    refused(exc, pattern, core.stack, obs, dtype=dtype, scale=scale)
    refused(exc, pattern, pool.gather, idx, out, layout="last", dtype=dtype, scale=scale)
    refused(exc, pattern, obs[0].astype, out_dt, scale=scale)
    if scale is None:  # the NumPy protocol casts as NumPy would, unfused
        np.testing.assert_array_equal(
            np.asarray(obs[0], dtype=dtype), np.asarray(obs[0]).astype(dtype)
        )
        assert np.asarray(obs[0], dtype=dtype).dtype == np.dtype(dtype or np.uint8)
    assert snapshot(pool, slots) == before
    np.testing.assert_array_equal(out, keep)


def test_no_float_to_int_nor_signed_to_unsigned():
    lz = core.LazyFrames([np.ones(3, np.float32)] * 2)
    refused(TypeError, "cannot convert", lz.astype, np.uint8)
    refused(TypeError, "cannot convert", core.stack, [lz], dtype=np.int64)
    lz16 = core.LazyFrames([np.full(3, -2, np.int16)] * 2)
    refused(TypeError, "cannot convert", lz16.astype, np.uint16)
    # np.asarray(obs, dtype) is NumPy's protocol: it casts as NumPy casts an ndarray
    assert np.asarray(lz16, dtype=np.uint8).tolist() == [254] * 6  # -2 wrapped, as NumPy casts
    np.testing.assert_array_equal(lz16.astype(np.float64, scale=0.5), np.full(6, -1.0))


def test_slot_ids_as_lists_tuples_numpy_ints():
    """Slot ids: ints, numpy ints, (nested) lists/tuples, int arrays of any width, FrameRefs."""
    frames = rand_frames(3)
    pool, refs = pool_with(frames)
    a, _, c = ids(refs)
    want = np.stack([ref.observation([frames[0], frames[2]], "last")])
    batches = ([[a, c]], ((a, c),), [np.array([a, c])], np.array([[a, c]], np.int32),
               [[np.int64(a), np.int64(c)]], np.array([[a, c]], np.uint16))  # fmt: skip
    for idx in batches:
        np.testing.assert_array_equal(pool.gather(idx, layout="last"), want)
        np.testing.assert_array_equal(np.asarray(pool.lazy_batch(idx, layout="last")), want)
    rows = ([a, c], (a, c), [np.int64(a), np.int32(c)], np.array([a, c], np.uint8),
            [refs[0], refs[2]], (refs[0], c))  # fmt: skip
    for row in rows:
        lz = pool.lazy(row, layout="last")
        np.testing.assert_array_equal(np.asarray(lz), want[0])
        del lz
    assert pool.refcount(np.int32(a)) == pool.refcount(refs[0]) == 1
    assert [pool.refcount(r) for r in refs] == [1, 1, 1] and pool.live_frames == 3
    refused(TypeError, "integers", pool.gather, [[0, 1.5]])
    refused(TypeError, "integers", pool.lazy, ["0"])
    assert [pool.refcount(r) for r in refs] == [1, 1, 1]


def test_shift_shares_k_minus_1_frames_and_copies_one():
    pool = make_pool()
    r = pool.push(f(0))
    s = r.slot
    lz = pool.lazy([r] * 4)
    del r
    src = f(1)
    nxt = lz.shift(src)
    src[...] = 99  # the env reuses its buffer: the stored frame must not change
    assert [int(nxt.get_frame(j)[0, 0, 0]) for j in range(4)] == [0, 0, 0, 1]
    assert nxt.slots[:3] == lz.slots[1:] and pool.live_frames == 2 and pool.refcount(s) == 4 + 3
    np.testing.assert_array_equal(np.asarray(lz), ref.observation([f(0)] * 4, "last"))  # unchanged
    del lz, nxt
    assert pool.live_frames == 0


def _batch_of(pool, rows, layout="stack"):
    """A LazyBatch whose row i holds frames f(v) for the values in rows[i]."""
    refs = [[pool.push(f(v)) for v in row] for row in rows]
    return pool.lazy_batch(refs, layout=layout)


# -- SlotTable: the replay buffer's reference-owning store --------------------------------
def _table(pool, rows=4, width=4):
    t = core.SlotTable(pool, rows, width)
    assert t.pool is pool and t.shape == (rows, width) and len(t) == rows
    return t


def test_slot_table_grow_keeps_rows_and_refs():
    pool = make_pool()
    table = _table(pool, rows=2, width=2)
    table.set([0, 1], (_batch_of(pool, [[1, 2], [2, 3]]),))
    before = table.ids().tolist()
    counts = [pool.refcount(s) for s in range(4)]
    refused(ValueError, "grows only", table.grow, 1)
    refused(ValueError, "too large", table.grow, 2**62)
    table.grow(2)  # no change
    table.grow(5)
    assert table.shape == (5, 2) and table.memory() == 5 * 2 * 4
    assert table.ids().tolist() == before + [[-1, -1]] * 3
    assert [pool.refcount(s) for s in range(4)] == counts
    table.set([4], (_batch_of(pool, [[7, 8]]),))
    assert values(pool, table.ids([0, 4])) == [1, 2, 7, 8]
    assert table.gather([4, 1], 0, 2, layout="stack")[:, :, 0, 0, 0].tolist() == [[7, 8], [2, 3]]
    del table
    gc.collect()
    assert pool.live_frames == 0


def test_slot_table_grow_from_a_callback_of_set():
    """Rows checked before a callback grows the table stay valid: grow only adds rows."""
    pool = make_pool()
    table = _table(pool, rows=2, width=2)
    part = _batch_of(pool, [[1, 2], [2, 3]])

    class Grows:
        def __index__(self, grow=table.grow):
            grow(64)
            return 1

    try:
        table.set([0, Grows()], (part,))
    except TypeError:  # a core may refuse int-likes as rows: then nothing changed
        assert table.shape == (2, 2) and (table.ids() == -1).all()
    else:
        assert table.shape == (64, 2) and values(pool, table.ids([0, 1])) == [1, 2, 2, 3]
    del table, part
    gc.collect()
    assert pool.live_frames == 0


def test_slot_table_set_keeps_an_id_present_in_old_and_new_rows():
    pool = make_pool()
    table = _table(pool, rows=2, width=2)
    table.set([0], (pool.push_batch(np.stack([f(5)]), k=2),))
    s = int(table.ids()[0, 0])
    assert pool.live_frames == 1 and pool.refcount(s) == 2
    # the table is the only owner; re-set the row from a batch made of its own ids
    table.set([0], (table.batch([0], 0, 2),))
    assert pool.refcount(s) == 2 and values(pool, table.ids([0])) == [5, 5]
    table.clear()
    assert pool.live_frames == 0


def test_dedup_keeps_a_stream_a_chain_of_frames():
    """``_push_dedup`` pushes a stream's frames as the chain a table row is read along.

    The next observation matches the observation shifted by one frame; in a compressing
    pool a frame equal to an earlier one (a static screen, or flicker) is a frame of its
    own (an empty patch), past the reset padding, which is one slot. Stacks so pushed are
    stored in one id a row. A plain pool reuses the repeated frame's slot (a frame's bytes
    outweigh a row's record).
    """
    pool = core.FramePool((2, 2), np.uint8, compress=True)
    a, b, c, d = (np.full((2, 2), v, np.uint8) for v in (1, 2, 3, 4))
    pair = pool._push_dedup(np.stack([a, b, c, c])[None], None, np.stack([b, c, c, d])[None])
    s = pair.slots[0].tolist()
    assert len(set(s[:4])) == 4 and s[4:7] == s[1:4] and s[7] not in s[:7]
    plain = core.FramePool((2, 2), np.uint8)
    p = plain._push_dedup(np.stack([a, b, c, c])[None], None, np.stack([b, c, c, d])[None])
    assert p.slots[0, 2] == p.slots[0, 3] and p.slots[0, 4:7].tolist() == p.slots[0, 1:4].tolist()
    reset = pool._push_dedup(np.stack([a] * 4)[None], None, np.stack([a, a, a, b])[None])
    r = reset.slots[0].tolist()
    assert r[:7] == [r[0]] * 7 and r[7] != r[0]
    flicker = pool._push_dedup(np.stack([a, b, a, b])[None], None, np.stack([b, a, b, a])[None])
    f = flicker.slots[0].tolist()
    assert len(set(f[:4])) == 4 and f[4:7] == f[1:4] and f[7] not in f[:7]
    p = plain._push_dedup(np.stack([a, b, a, b])[None]).slots[0].tolist()
    assert p[2:] == p[:2] != p[::-1][:2]
    table = core.SlotTable(pool, 3, 8)
    table.set([0, 1, 2], (pool.lazy_batch([s[:4], r[:4], f[:4]]),
                          pool.lazy_batch([s[4:], r[4:], f[4:]])))  # fmt: skip
    assert table.ids().tolist() == [s, r, f] and table.memory() == 3 * 4


@pytest.mark.parametrize("width", [1, 2, 3, 4, 6, 8, 9])
@pytest.mark.parametrize("compress", [False, True])
def test_slot_table_rows_stacked_or_not_hold_what_was_written(width, compress):
    """Frame stacks or not, a table holds what a plain (R, W) array of ids would.

    A table of an even width stores a frame stack's row (the walk back from its newest
    frame along the previous frames the pool records, padded at a frame without one) in
    one id, any other row with an overflow record: whatever mix of stacks along a stream,
    random rows (which record links of their own) and empty entries set, take and clear
    write, its entries, the references it holds and its memory() are what the array gives.
    """
    rng = np.random.default_rng(width)
    frames = rand_frames(12, shape=(3, 3), seed=width)
    pool, refs = pool_with(frames)
    if compress:
        pool.enable_compression()
    slots = np.array(ids(refs))
    stream = rng.permutation(slots)  # the order stacks are taken in
    R, h = 20, (width // 2 if width % 2 == 0 and width >= 4 else 0)  # as documented
    table, model = core.SlotTable(pool, R, width), np.full((R, width), -1)

    def a_row():
        if h and rng.random() < 0.7:  # a frame stack's obs then next obs, maybe padded
            end = int(rng.integers(0, len(stream)))
            walk = stream[np.maximum(np.arange(end - h, end + 1), 0)]
            return np.concatenate([walk[:h], walk[1:]])
        return rng.choice(slots, width)

    def records_needed(m):  # at least: a row stored in one id is full and shifted
        shifted = (m[:, h : 2 * h - 1] == m[:, 1:h]).all(axis=1) & (m >= 0).all(axis=1)
        return int((~shifted & (m >= 0).any(axis=1)).sum())

    def lazy(m, cols):
        return pool.lazy_batch([[refs[int(np.searchsorted(slots, v))] for v in r[cols]]
                                for r in m], layout="stack")  # fmt: skip

    if h:  # the stacks along the stream, the first padded, before other links: one id each
        ends = np.arange(len(stream))
        model[ends] = [np.concatenate([w[:h], w[1:]]) for w in
                       (stream[np.maximum(np.arange(e - h, e + 1), 0)] for e in ends)]  # fmt: skip
        table.set(ends, (lazy(model[ends], slice(0, h)), lazy(model[ends], slice(h, width))))
        assert (table.ids() == model).all() and table.memory() == R * 4
    overflowed = 0
    for step in range(300):
        rows = rng.choice(R, rng.integers(1, 5), replace=False)
        new = np.stack([a_row() for _ in rows])
        op = rng.integers(3)
        if op == 0:  # parts of columns [0, cut) and [cut, W): any split of the row
            cut = int(rng.integers(1, width)) if width > 1 else width
            cut = h if h and rng.random() < 0.5 else cut  # obs and next obs
            parts = tuple(lazy(new, cols) for cols in (slice(0, cut), slice(cut, width))
                          if new[:, cols].size)  # fmt: skip
            table.set(rows, parts)
            del parts
        elif op == 1:
            source = pool.lazy_batch([refs], layout="stack")
            index = np.searchsorted(slots, new)  # slots are increasing
            index[rng.random(index.shape) < 0.05] = -1
            new = np.where(index >= 0, new, -1)
            table.take(rows, source, index)
            del source
        else:
            new[:] = -1
            table.clear(rows)
        model[rows] = new
        assert (table.ids() == model).all(), step
        held = [int((model == sl).sum()) + 1 for sl in slots]  # + the test's own ref
        assert [pool.refcount(int(sl)) for sl in slots] == held, step
        if h:
            overflowed = max(overflowed, records_needed(model))
            records = table.memory() - R * 4
            assert records % (width * 4) == 0 and overflowed * width * 4 <= records
            assert records <= max(16, 2 * overflowed) * width * 4, step
        else:
            assert table.memory() == R * width * 4
    if h:  # every row rewritten in one call, random: the records they held serve
        rows = np.arange(R)
        for _ in range(3):
            table.take(rows, pool.lazy_batch([refs], layout="stack"),
                       rng.integers(0, len(refs), (R, width)))  # fmt: skip
        model = table.ids()
        overflowed = max(overflowed, records_needed(model))
        assert table.memory() - R * 4 <= max(16, 2 * overflowed) * width * 4
    del table
    refs.clear()
    gc.collect()
    assert pool.live_frames == 0


# -- two copies in one: SlotTable.gather_pairs, batch_pairs + numpy_pairs (a pinned draw)
@pytest.mark.parametrize("layout", ["last", "first", "stack"])
def test_pairs_equal_two_copies(layout):
    pool = make_pool(LAYOUT_SHAPES[layout])
    refs = [pool.push(fr) for fr in rand_frames(12, LAYOUT_SHAPES[layout])]
    rng = np.random.default_rng(1)
    table = _table(pool, rows=3, width=8)
    table.set([0, 1, 2], (pool.lazy_batch(np.array(ids(refs))[rng.integers(0, 12, (3, 8))]),))
    r1, r2 = rng.integers(0, 3, 5), rng.integers(0, 3, 5)
    a, b = table.batch(r1, 0, 4, layout=layout), table.batch(r2, 1, 5, layout=layout)
    p = table.batch_pairs(r1, (0, 4), r2, (1, 5), layout=layout)
    assert p.stack_size == 8 and p.layout == layout
    np.testing.assert_array_equal(p.slots, np.concatenate([a.slots, b.slots], axis=1))
    for kw in ({}, {"dtype": np.float32, "scale": 0.5}, {"dtype": np.int16}):
        want = (a.numpy(**kw), b.numpy(**kw))
        gathers = (table.gather(r1, 0, 4, layout=layout, **kw),
                   table.gather(r2, 1, 5, layout=layout, **kw))  # fmt: skip
        for pair in (gathers, table.gather_pairs(r1, (0, 4), r2, (1, 5), layout=layout, **kw),
                     p.numpy_pairs(**kw)):  # fmt: skip
            for g, w in zip(pair, want, strict=True):
                np.testing.assert_array_equal(g, w, strict=True)
    for pairs in (lambda o: table.gather_pairs(r1, (0, 4), r2, (1, 5), o, layout=layout, scale=2),
                  lambda o: p.numpy_pairs(o, scale=2.0)):  # fmt: skip
        outs = (np.empty(a.shape, np.float64), np.empty(b.shape, np.float64))
        res = pairs(outs)
        assert res[0] is outs[0] and res[1] is outs[1]
        np.testing.assert_array_equal(outs[0], a.numpy(dtype=np.float64, scale=2.0))
        np.testing.assert_array_equal(outs[1], b.numpy(dtype=np.float64, scale=2.0))


def test_batch_pairs_bad_input_takes_nothing():
    pool = make_pool()
    refs = [pool.push(fr) for fr in rand_frames(5)]
    table = _table(pool, rows=3, width=5)
    table.set([0, 1], (pool.lazy_batch([ids(refs)] * 2),))
    before = snapshot(pool, ids(refs))
    refused(ValueError, "different lengths", table.batch_pairs, [0, 1], (0, 4), [0], (1, 5))
    refused(ValueError, "different widths", table.batch_pairs, [0], (0, 4), [0], (1, 4))
    refused(ValueError, "columns", table.batch_pairs, [0], (0, 6), [0], (1, 7))
    refused(IndexError, "", table.batch_pairs, [0], (0, 4), [3], (1, 5))
    refused(ValueError, "row 2 is", table.batch_pairs, [0], (0, 4), [2], (1, 5))
    refused(ValueError, "layout", table.batch_pairs, [0], (0, 4), [0], (1, 5), layout="sideways")
    assert snapshot(pool, ids(refs)) == before


def test_numpy_pairs_bad_input_writes_nothing():
    pool = make_pool()
    refs = [pool.push(fr) for fr in rand_frames(6)]
    a = pool.lazy_batch([ids(refs[:4]) + ids(refs[1:5])] * 2, layout="last")
    half = pool.lazy_batch([ids(refs[:4])] * 2, layout="last")
    good = np.zeros(half.shape, np.float32)
    keep = good.copy()
    before = snapshot(pool, ids(refs))
    refused(ValueError, "even number of frames", pool.lazy_batch([ids(refs[:3])]).numpy_pairs)
    refused(TypeError, "pair", a.numpy_pairs, good)
    f64 = np.zeros(half.shape, np.float64)
    refused(TypeError, "different dtypes", a.numpy_pairs, (good, f64))
    refused(ValueError, "overlap", a.numpy_pairs, (good, good))
    refused(ValueError, "shape", a.numpy_pairs, (good, np.zeros((3,) + half.shape[1:], np.float32)))
    refused(ValueError, "shape", a.numpy_pairs, (good, np.zeros(a.shape, np.float32)))
    assert snapshot(pool, ids(refs)) == before
    np.testing.assert_array_equal(good, keep)


def test_numpy_pairs_of_a_table_batch_outlives_the_rows():
    """A batch the table's rows gave keeps its frames: rows overwritten, then copied."""
    pool = make_pool()
    frames = rand_frames(8)
    refs = [pool.push(fr) for fr in frames]
    table = _table(pool, rows=2, width=5)
    table.set([0, 1], (pool.lazy_batch([ids(refs[:5]), ids(refs[3:])]),))
    p = table.batch_pairs([1, 0], (0, 4), [1, 0], (1, 5), layout="stack")
    table.set([0, 1], (pool.lazy_batch([ids(refs[:1]) * 5] * 2),))
    del refs
    table.clear()
    assert pool.live_frames == 8  # only the batch holds them
    obs, nxt = p.numpy_pairs()
    np.testing.assert_array_equal(obs[0, :, :, :, 0], frames[3:7, :, :, 0])
    np.testing.assert_array_equal(nxt[1, :, :, :, 0], frames[1:5, :, :, 0])
    del p
    assert pool.live_frames == 0


# -- _push_dedup: stacked ndarray observations cost one new frame per step ------------------
def test_push_dedup_reuses_candidates_and_earlier_frames():
    pool = make_pool()
    prev = pool.lazy_batch([[pool.push(f(v)) for v in (1, 2, 3, 4)]])
    # the next stacked observation: 2 3 4 5 -> only frame 5 is new
    got = pool._push_dedup(np.stack([f(2), f(3), f(4), f(5)])[None], prev)
    assert type(got) is core.LazyBatch and got.layout == "stack"
    assert got.slots[0, :3].tolist() == prev.slots[0, 1:].tolist() and pool.live_frames == 5
    # reset padding 9 9 9 9, no candidates: one frame stored, shared four times
    pad = pool._push_dedup(np.stack([f(9)] * 4)[None])
    assert len(set(pad.slots[0].tolist())) == 1 and pool.live_frames == 6
    assert values(pool, got.slots[0]) == [2, 3, 4, 5]
    # next frames 3 4 5 6 in the same call: one owner (1, 8), 5 and 6 new; a wide candidate
    nxt = np.stack([f(v) for v in (3, 4, 5, 6)])
    owner = pool._push_dedup(np.stack([f(2), f(3), f(4), f(5)]), prev, nxt)
    b = owner.slots[0].tolist()
    assert b[:3] == prev.slots[0, 1:].tolist() and b[4:7] == b[1:4] and pool.live_frames == 8
    assert pool._push_dedup(nxt[None], owner).slots[0].tolist() == b[4:] and pool.live_frames == 8
    del got, pad, prev, owner
    assert pool.live_frames == 0


# -- found by a fresh user: each of these crashed the compiled core or misbehaved -------
def test_stack_rejects_same_shape_from_other_geometry():
    a = core.LazyFrames([f(i) for i in range(4)])  # (84, 84, 4): 4 frames of (84, 84, 1)
    b = core.LazyFrames([f(9, (84, 84, 4))])  # (84, 84, 4): 1 frame of (84, 84, 4)
    assert a.shape == b.shape
    geometry = r"4 frames of \(84, 84, 1\).*1 frames of|1 frames of .*4 frames"
    for batch in ([a, b], [b, a]):
        refused(ValueError, geometry, core.stack, batch)
    want = ref.observation([f(i) for i in range(4)], "last")
    np.testing.assert_array_equal(np.array([b, a])[1], want)  # the NumPy protocol stacks both


def _copy_out_racing_drop(pool, want):
    """One round: copy out of three kinds of owners while another thread drops them all."""
    refs = [pool.push(f(v)) for v in range(4)]
    lst = [pool.lazy(refs) for _ in range(300)]
    idx = np.array([ids(refs)] * 300, np.int64)
    table = core.SlotTable(pool, 300, 4)
    table.set(np.arange(300), (pool.lazy_batch(idx, layout="last"),))
    calls = (lambda: core.stack(lst, dtype=np.float64),
             lambda: pool.gather(idx, dtype=np.float64),
             lambda: table.gather(np.arange(300), 0, 4, dtype=np.float64))  # fmt: skip
    t = threading.Thread(target=lambda: (lst.clear(), refs.clear(), table.clear()))
    t.start()
    got, refused = [], []
    for call in calls:
        try:
            got.append(call())
        except ValueError as e:  # the owners were gone before the call checked its ids
            refused.append(str(e))
    t.join()
    for g in got:
        assert (g == want).all()
    for msg in refused:
        assert re.search("is free|is empty|at least one", msg), msg


def test_copies_out_hold_refs_while_copying():
    """Owners dropped by another thread while a copy runs without the GIL: right or refused."""
    pool = make_pool()
    want = ref.observation([f(v) for v in range(4)], "last").astype(np.float64)
    for _ in range(20):
        _copy_out_racing_drop(pool, want)
    gc.collect()
    assert pool.live_frames == 0


def test_scalar_frames_stack_on_a_new_axis():
    lz = core.LazyFrames([np.uint8(1), np.uint8(2), np.uint8(3)], layout="stack")
    assert lz.shape == (3,) and len(lz) == 3
    np.testing.assert_array_equal(np.asarray(lz), [1, 2, 3])


@pytest.mark.parametrize("bits", [np.random.PCG64, np.random.Philox, np.random.MT19937])
def test_draw_integers_is_generator_integers(bits):
    for seed, high, n in itertools.product(range(3), (1, 7, 2**32 - 1, 2**63), (0, 1, 33)):
        a, b = np.random.Generator(bits(seed)), np.random.Generator(bits(seed))
        assert np.array_equal(core.draw_integers(a, high, n), b.integers(0, high, size=n))
        assert a.random() == b.random()  # the same generator state after
    refused(TypeError, "Generator", core.draw_integers, np.random.RandomState(0), 5, 1)
    refused(ValueError, "1 <= high", core.draw_integers, a, 0, 1)
    refused(TypeError, "bool", core.draw_integers, a, 5, True)


@pytest.mark.parametrize("streams, dtype", [(256, np.uint8), (257, np.uint16), (65537, np.int32)])
def test_ring_streams_in_the_narrowest_dtype(streams, dtype):
    ring, ids = core.RowRing(2 * streams, streams, [("a", (), np.uint8)]), np.arange(streams)
    for _ in range(3):  # the third round evicts the first, unlinking it
        ring.append(None, (np.zeros(streams, np.uint8),))
    assert ring.env.dtype == dtype and (ring.env == np.tile(ids, 2)).all()
    assert (ring.last == ids).all() and (ring.next[:streams] == -1).all()
    assert (ring.next[streams:] == ids).all()


def test_ring_walk_follows_each_stream():
    ring = core.RowRing(6, 2, [("a", (), np.uint8)])
    ring.grow(6)
    for streams in ([0], [1], [0], [0], [1]):  # rows 0..4: stream 0 at 0, 2, 3; 1 at 1, 4
        ring.append(np.array(streams), (np.zeros(1, np.uint8),))
    assert ring.walk(np.array([0, 1, 3]), 3).tolist() == [[0, 2, 3], [1, 4, -1], [3, -1, -1]]
    refused(TypeError, "int64", ring.walk, np.array([0], np.int32), 2)
    refused(TypeError, "native byte order", ring.walk, np.array([0], ">i8"), 2)
    refused(IndexError, "out of range", ring.walk, np.array([5]), 2)
    refused(ValueError, "at least 1", ring.walk, np.array([0]), 0)


def _ring_links(cap, streams, appends):
    """A model of RowRing's links: ``(env, next, last)`` of the rows held, by position.

    ``appends``: each None (every stream), a list of streams, or "clear".
    """
    env, nxt, last, pos, size = [0] * cap, [-1] * cap, [-1] * streams, 0, 0
    for a in appends:
        if a == "clear":
            last, pos, size = [-1] * streams, 0, 0
            continue
        for st in range(streams) if a is None else a:
            if size == cap and last[env[pos]] == pos:  # the row evicted is its stream's only
                last[env[pos]] = -1
            if last[st] >= 0:
                nxt[last[st]] = pos
            env[pos], nxt[pos], last[st] = st, -1, pos
            pos, size = (pos + 1) % cap, min(cap, size + 1)
    return env[:size], nxt[:size], last


@pytest.mark.parametrize("cap, streams", [(6, 2), (6, 1), (7, 2), (8, 4)])
def test_ring_links_in_lockstep_and_stored_agree(cap, streams):
    """Appends of every stream in order store no links, and read as stored ones do.

    (When the capacity is a multiple of the streams.) Through other appends, clear() and
    load().
    """
    rng = np.random.default_rng(cap * 10 + streams)
    for trial in range(40):
        ring = core.RowRing(cap, streams, [("a", (), np.uint8)])
        appends = []
        for _ in range(rng.integers(1, 12)):
            r = rng.random()
            if r < 0.05:
                a = "clear"
            elif r < 0.8 or trial % 2:
                a = None  # every stream, in order
            else:  # some streams, in any order
                a = rng.permutation(streams)[: rng.integers(1, streams + 1)].tolist()
            appends.append(a)
            if a == "clear":
                ring.clear()
                continue
            e = streams if a is None else len(a)
            ring.append(None if a is None else np.array(a, np.int64), (np.zeros(e, np.uint8),))
            env, nxt, last = _ring_links(cap, streams, appends)
            n = len(env)
            assert ring.env[:n].tolist() == env and ring.next[:n].tolist() == nxt
            assert ring.last.tolist() == last and ring.next_of(np.arange(n)).tolist() == nxt
            held = np.arange(n)
            walk = [[p, nxt[p], nxt[nxt[p]] if nxt[p] >= 0 else -1] for p in held]
            assert ring.walk(held, 3).tolist() == walk
            lockstep = cap % streams == 0 and all(
                x is None or x == list(range(streams))
                for x in appends[
                    max([i + 1 for i, x in enumerate(appends) if x == "clear"], default=0) :
                ]
            )
            link_bytes = ring.rows * (ring.env.itemsize + ring.next.itemsize)
            assert ring.memory() == ring.last.nbytes + ring.columns[0].nbytes + (
                0 if lockstep else link_bytes
            )
        # a load of what is held reads back the same, in lockstep where the streams allow
        copy = core.RowRing(cap, streams, [("a", (), np.uint8)])
        n = ring.size
        copy.load(ring.pos, ring.full, ring.env[:n], (ring.columns[0][:n].copy(),))
        assert copy.env[:n].tolist() == ring.env[:n].tolist()
        assert copy.next[:n].tolist() == ring.next[:n].tolist()
        assert copy.last.tolist() == ring.last.tolist()
        regular = ring.pos % streams == 0 and (ring.env[:n] == np.arange(n) % streams).all()
        link_bytes = copy.rows * (copy.env.itemsize + copy.next.itemsize)
        assert copy.memory() == copy.last.nbytes + copy.columns[0].nbytes + (
            0 if cap % streams == 0 and regular else link_bytes
        )
    refused(TypeError, "integers", ring.next_of, np.array([0.5]))
    refused(IndexError, "out of range", ring.next_of, np.array([ring.rows]))


@pytest.mark.parametrize("distinct", [3, 255, 256, 300])
def test_ring_float32_column_is_a_palette_until_it_holds_257_values(distinct):
    """A scalar float32 column reads back bit for bit (-0.0 too) whatever it stores.

    A byte per row while 256 values or fewer were seen (0.0 among them), float32 after.
    """
    values = np.concatenate([[-0.0, -1.0], np.arange(1, distinct - 1) * 0.25]).astype(np.float32)
    rng = np.random.default_rng(distinct)
    cap = 64
    ring = core.RowRing(cap, 2, [("r", (), np.float32), ("v", (2,), np.float32)])
    model = np.zeros(cap, np.float32)
    seen = {0}
    k = 0  # the values in turn: every one within 300 rows
    for t in range(400):
        r = values[(k + np.arange(1 if t % 3 == 0 else 2)) % values.size]
        k += r.size
        if t % 3 == 0:  # a Python float for one stream's row: the scalar path
            pos = ring.append(np.array([t % 2]), (float(r[0]), np.zeros((1, 2), np.float32)))
            model[pos] = r[0]
        else:
            pos = ring.append(None, (r, np.zeros((2, 2), np.float32)))
            model[(pos + np.arange(2)) % cap] = r
        seen |= {int(x) for x in r.view(np.uint32)}
        if t % 50 == 7:  # rewrite a few rows
            rows = rng.integers(ring.size, size=3)
            new = values[rng.integers(values.size, size=3)]
            ring.put(0, rows, new)
            model[rows] = new
            seen |= {int(x) for x in new.view(np.uint32)}
        n = ring.size
        assert ring.column(0)[:n].view(np.uint32).tolist() == model[:n].view(np.uint32).tolist()
        idx = rng.integers(n, size=5)
        assert ring.values(0, idx).view(np.uint32).tolist() == model[idx].view(np.uint32).tolist()
        assert ring.take(idx)[0].view(np.uint32).tolist() == model[idx].view(np.uint32).tolist()
        code = len(seen) <= 256  # r's bytes per row (and its palette), v's 8, links 1 + 4
        per_row = (1 if code else 4) + 8 + 5  # (stored: one stream appends alone)
        assert ring.memory() == ring.last.nbytes + ring.rows * per_row + (1024 if code else 0)
    assert (len(seen) > 256) == (distinct >= 256)  # (with 0.0)
    assert ring.columns[0].dtype == np.float32 and not ring.columns[0].flags.writeable
    copy = core.RowRing(cap, 2, [("r", (), np.float32), ("v", (2,), np.float32)])
    copy.load(ring.pos, ring.full, ring.env, tuple(c.copy() for c in ring.columns))
    assert copy.column(0).view(np.uint32).tolist() == model.view(np.uint32).tolist()
    refused(IndexError, "column 2", ring.column, 2)
    refused(IndexError, "out of range", ring.values, 0, np.array([cap]))


def _ring_state(ring):
    n = ring.size
    return [ring.env[:n], ring.next[:n], ring.last, *(c[:n] for c in ring.columns), ring.memory()]


def test_ring_load_over_held_rows_replaces_them_or_changes_nothing(monkeypatch):
    """load() over a ring that holds rows replaces them, or changes nothing.

    The rows past the loaded ones read as never written (the palette is new); a
    MemoryError on the way leaves the ring as it was.
    """
    cols = [("a", (), np.int64), ("r", (), np.float32)]
    ring = core.RowRing(1000, 2, cols)
    for i in range(25):  # lockstep, then stored links; rewards 1..50, then 51
        ring.append(None, (np.array([i, i]), np.arange(2 * i + 1, 2 * i + 3, dtype=np.float32)))
    ring.append(np.array([1]), (np.array([9]), np.array([51.0], np.float32)))
    before = _ring_state(ring)

    class NoMemory:  # NumPy whose np.full runs out of memory (the last array load makes)
        def __getattr__(self, name):
            return getattr(np, name)

        def full(self, *args, **kwargs):
            raise MemoryError("simulated")

    monkeypatch.setattr(core, "np", NoMemory())
    n = 600
    refused(MemoryError, "simulated", ring.load, n, False, np.arange(n) % 2,
            (np.zeros(n, np.int64), np.full(n, 7.5, np.float32)))  # fmt: skip
    monkeypatch.undo()
    assert all(np.array_equal(a, b) for a, b in zip(_ring_state(ring), before, strict=True))
    ring.load(4, False, np.arange(4) % 2, (np.zeros(4, np.int64), np.full(4, 7.5, np.float32)))
    assert ring.column(1).tolist() == [7.5] * 4 + [0.0] * (ring.rows - 4)
    assert ring.values(1, np.array([3, 30])).tolist() == [7.5, 0.0]


@pytest.mark.parametrize("compress", [False, True])
def test_a_frame_shared_past_a_16_bit_count_is_counted_and_freed(compress):
    """A slot's word counts to 32,766; references beyond it go to a list and come back.

    So the frame is freed with its last reference.
    """
    pool = core.FramePool((2, 2), np.uint8, compress=compress)
    ref = pool.push(np.ones((2, 2), np.uint8))
    many = [pool.lazy([ref.slot] * 20_000, layout="stack") for _ in range(3)]  # 60,000 refs
    assert pool.refcount(ref.slot) == 60_001
    del many[1:]
    assert pool.refcount(ref.slot) == 20_001 and np.asarray(many[0])[-1].tolist() == [[1, 1]] * 2
    del many, ref
    assert pool.live_frames == 0


def test_ring_put_rewrites_a_column_checked_first():
    ring = core.RowRing(4, 1, [("a", (), np.uint8), ("v", (2,), np.float32)], counted=(0, 1))
    ring.grow(4)
    for t in range(3):
        ring.append(None, (np.zeros(1, np.uint8), np.full((1, 2), t, np.float32)))
    ring.put(1, np.array([2, 0]), np.array([[5, 6], [7, 8]], np.float32))
    assert ring.columns[1].tolist() == [[7, 8], [1, 1], [5, 6], [0, 0]]
    before = ring.columns[1].copy()
    refused(
        ValueError,
        "finite",
        ring.put,
        1,
        np.array([0, 1]),
        np.array([[0, 0], [np.nan, 0]], np.float32),
    )
    refused(TypeError, "float32", ring.put, 1, np.array([0]), np.zeros((1, 2), np.float64))
    refused(IndexError, "out of range", ring.put, 1, np.array([3]), np.zeros((1, 2), np.float32))
    swapped = np.array([0], ">i8")  # read raw, it would be position 2**56
    refused(TypeError, "native byte order", ring.put, 1, swapped, np.zeros((1, 2), np.float32))
    refused(TypeError, "native byte order", ring.take, swapped)
    refused(TypeError, "native byte order", ring.append, swapped, (np.zeros(1, np.uint8),) * 2)
    refused(IndexError, "column 2", ring.put, 2, np.array([0]), np.zeros(1, np.uint8))
    refused(ValueError, "counted", ring.put, 0, np.array([0]), np.zeros(1, np.uint8))
    assert np.array_equal(ring.columns[1], before)  # nothing written


def test_unscale_u8_recovers_the_bytes_of_exact_quotients_only():
    x = np.arange(256, dtype=np.uint8)
    f = x.astype(np.float32) / 255.0
    assert core.unscale_u8(f, 255.0, np.empty(256, np.uint8)).tolist() == x.tolist()
    refused(ValueError, "not a byte divided by 255", core.unscale_u8,
            f * np.float32(1.0001), 255.0, np.empty(256, np.uint8))  # fmt: skip
    refused(
        TypeError, "float32", core.unscale_u8, f.astype(np.float64), 255.0, np.empty(256, np.uint8)
    )
    refused(TypeError, "uint8", core.unscale_u8, f, 255.0, np.empty(256, np.int8))
    refused(ValueError, "elements", core.unscale_u8, f, 255.0, np.empty(255, np.uint8))
    refused(ValueError, "positive", core.unscale_u8, f, 0.0, np.empty(256, np.uint8))
