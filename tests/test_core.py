"""API behaviour of the core (FramePool, LazyFrames, stack), run against both cores.

Every test takes the ``impl`` fixture (tests/conftest.py), so it runs on the compiled
core and on its pure-NumPy twin. Bad-input tests check three things: the exception
type, a message naming the problem, and that nothing was written (pool stats,
refcounts and the contents of ``out`` are as before the call; inputs are unmodified).
"""

import copy
import pickle
import re

import numpy as np
import pytest

from conftest import f, restate

FRAME = (84, 84, 1)
FB = 84 * 84  # bytes of one FRAME uint8 frame
LAYOUT_SHAPES = {"last": (84, 84, 1), "first": (1, 84, 84), "stack": (84, 84)}




def rand_frames(n, shape=FRAME, dtype=np.uint8, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return (rng.standard_normal((n,) + shape) * 100).astype(dtype)
    if np.dtype(dtype).kind == "b":
        return rng.integers(0, 2, (n,) + shape).astype(bool)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, (n,) + shape, dtype=dtype, endpoint=True)


def snapshot(pool, slots=()):
    """Everything a failed call must leave as it was: stats and the given refcounts."""
    return pool.stats(), [pool.refcount(s) for s in slots]


def pool_with(impl, frames, chunk_bytes=1 << 20):
    pool = impl.FramePool(frames.shape[1:], frames.dtype, chunk_bytes=chunk_bytes)
    slots = [pool.push(fr) for fr in frames]
    return pool, slots


# -- push: the one copy in ----------------------------------------------------------------


def test_push_copies_once_and_source_changes_never_reach_the_pool(impl):
    src = f(7)
    pool = impl.FramePool(FRAME, np.uint8)
    s = pool.push(src)
    src[...] = 99  # the env reuses its buffer
    np.testing.assert_array_equal(pool.get(s), f(7))
    got = pool.get(s)
    got[...] = 1  # get returns a copy: writing it does not touch the pool
    np.testing.assert_array_equal(pool.get(s), f(7))
    assert pool.refcount(s) == 1 and pool.live_frames == 1


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda a: a.copy(), id="contiguous"),
        pytest.param(lambda a: np.asarray(a).copy().view(), id="view"),
        pytest.param(lambda a: _readonly(a), id="read-only"),
        pytest.param(lambda a: np.repeat(a, 2, axis=1)[:, ::2], id="non-contiguous"),
        pytest.param(lambda a: np.asfortranarray(a), id="fortran"),
    ],
)
def test_push_accepts_views_readonly_noncontiguous(impl, make):
    want = rand_frames(1)[0]
    frame = make(want.copy())
    pool = impl.FramePool(FRAME, np.uint8)
    s = pool.push(frame)
    np.testing.assert_array_equal(pool.get(s), want)
    np.testing.assert_array_equal(np.asarray(frame), want)  # input unmodified


def _readonly(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def test_push_accepts_other_byte_order(impl):
    want = rand_frames(2, (5, 4), np.int16)
    pool = impl.FramePool((5, 4), np.int16)
    swapped = want[0].astype(">i2" if np.little_endian else "<i2")
    keep = swapped.copy()
    s = pool.push(swapped)
    assert pool.dtype == np.dtype(np.int16)
    np.testing.assert_array_equal(pool.get(s), want[0])
    assert pool.get(s).dtype == np.dtype("=i2")
    np.testing.assert_array_equal(swapped, keep)
    slots = pool.push_many(want.astype(swapped.dtype))
    np.testing.assert_array_equal(pool.gather(slots[None, :], layout="stack")[0], want)


def test_push_many_copies_once(impl):
    frames = rand_frames(5)
    keep = frames.copy()
    pool = impl.FramePool(FRAME, np.uint8)
    slots = pool.push_many(frames)
    assert isinstance(slots, np.ndarray) and slots.dtype == np.int64 and slots.shape == (5,)
    assert list(slots) == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(frames, keep)
    frames[...] = 0
    for s, want in zip(slots, keep):
        np.testing.assert_array_equal(pool.get(s), want)
        assert pool.refcount(s) == 1


def test_lazyframes_from_list_copies_once(impl):
    frames = [f(v) for v in range(4)]
    lz = impl.LazyFrames(frames)
    for a in frames:
        a[...] = 200
    np.testing.assert_array_equal(np.asarray(lz), restate([f(v) for v in range(4)], "last"))


def test_lazyframes_from_list_stores_the_same_array_once(impl):
    frames = [f(v) for v in range(5)]
    pool = impl.default_pool(FRAME, np.uint8)
    before = pool.live_frames
    a = impl.LazyFrames(frames[0:4])
    b = impl.LazyFrames(frames[1:5])
    assert pool.live_frames - before == 5
    assert a.slots[1:] == b.slots[:3]
    del a, b
    assert pool.live_frames == before


# -- refcounts, slot reuse, chunks, stats ---------------------------------------------------


def test_refcounts_follow_references(impl):
    pool, (s0, s1) = pool_with(impl, rand_frames(2))
    assert pool.refcount(s0) == 1
    pool.retain(s0)
    pool.retain(np.array([s0, s1]))
    assert (pool.refcount(s0), pool.refcount(s1)) == (3, 2)
    lz = pool.lazy([s0, s1, s0], layout="last")
    assert (pool.refcount(s0), pool.refcount(s1)) == (5, 3)
    lz2 = copy.copy(lz)
    lz3 = copy.deepcopy(lz)
    assert (pool.refcount(s0), pool.refcount(s1)) == (9, 5)
    del lz, lz2, lz3
    assert (pool.refcount(s0), pool.refcount(s1)) == (3, 2)
    pool.release([s0, s0, s1])
    assert (pool.refcount(s0), pool.refcount(s1)) == (1, 1)
    pool.release([s0, s1])
    assert (pool.refcount(s0), pool.refcount(s1)) == (0, 0)
    assert pool.live_frames == 0


def test_lazy_observation_keeps_frames_after_owner_releases(impl):
    frames = rand_frames(3)
    pool, slots = pool_with(impl, frames)
    lz = pool.lazy(slots, layout="stack")
    pool.release(slots)
    assert pool.live_frames == 3
    np.testing.assert_array_equal(np.asarray(lz), frames)
    del lz
    assert pool.live_frames == 0


def test_slot_reuse_most_recently_freed_first(impl):
    # the allocation policy of the twin (the spec): freed slots of the lowest chunk
    # with a free slot are reused before new ones, the most recently freed first
    pool, slots = pool_with(impl, rand_frames(5))
    assert slots == [0, 1, 2, 3, 4]
    pool.release([1, 3])
    assert pool.push(f(3)) == 3
    assert pool.push(f(1)) == 1
    assert pool.push(f(5)) == 5
    pool.release(0)
    assert pool.push(f(0)) == 0
    np.testing.assert_array_equal(pool.get(3), f(3))


def test_chunks_fill_release_and_keep_one_spare(impl):
    # 4 slots per chunk; 3 chunks
    pool, slots = pool_with(impl, rand_frames(12), chunk_bytes=4 * FB)
    assert pool.slots_per_chunk == 4 and pool.frame_bytes == FB
    assert pool.capacity == 12 and pool.bytes_held == 12 * FB == pool.peak_bytes
    pool.release([8, 9, 10, 11])  # chunk 2 empties: kept as the one spare
    assert pool.bytes_held == 12 * FB and pool.live_frames == 8
    pool.release([4, 5, 6, 7])  # chunk 1 empties: a spare exists, so it is released
    assert pool.bytes_held == 8 * FB and pool.capacity == 8
    assert pool.peak_bytes == 12 * FB
    assert pool.live_frames == 4 and pool.live_bytes == 4 * FB
    # the lowest chunk with memory and a free slot is used first, then released ids
    assert [pool.push(f(i)) for i in range(5)] == [11, 10, 9, 8, 4]
    assert pool.bytes_held == 12 * FB
    pool.release([0, 1, 2, 3, 4, 8, 9, 10, 11])
    assert pool.live_frames == 0
    assert pool.bytes_held == 4 * FB  # one empty chunk kept
    assert pool.refcount(5) == 0 and pool.refcount(11) == 0


def test_chunk_bytes_smaller_than_a_frame_gives_one_slot_per_chunk(impl):
    pool = impl.FramePool(FRAME, np.uint8, chunk_bytes=1)
    assert pool.slots_per_chunk == 1
    slots = [pool.push(f(i)) for i in range(3)]
    assert slots == [0, 1, 2] and pool.bytes_held == 3 * FB
    pool.release([0, 1, 2])
    assert pool.bytes_held == FB and pool.live_frames == 0


def test_stats_and_repr(impl):
    pool, _ = pool_with(impl, rand_frames(3))
    st = pool.stats()
    assert st == {
        "live_frames": 3,
        "live_bytes": 3 * FB,
        "capacity": pool.slots_per_chunk,
        "frame_bytes": FB,
        "bytes_held": pool.slots_per_chunk * FB,
        "peak_bytes": pool.slots_per_chunk * FB,
    }
    assert pool.slots_per_chunk == 128  # the largest power of two <= (1 << 20) // FB = 148
    assert pool.frame_shape == FRAME and pool.dtype == np.dtype(np.uint8)
    r = repr(pool)
    assert r.startswith("FramePool(") and "(84, 84, 1)" in r and "uint8" in r
    assert "live_frames=3" in r
    lz = pool.lazy([0, 1, 2], layout="last")
    assert repr(lz) == "LazyFrames(shape=(84, 84, 3), dtype=uint8, layout='last', stack_size=3)"


def test_pool_is_not_picklable(impl):
    pool = impl.FramePool(FRAME, np.uint8)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(pool)


def test_default_pool_is_shared(impl):
    a = impl.default_pool((84, 84, 1), np.uint8)
    b = impl.default_pool([84, 84, 1], "uint8")
    assert a is b
    assert impl.default_pool((84, 84), np.uint8) is not a


# -- LazyFrames as an array-like --------------------------------------------------------------


@pytest.mark.parametrize("layout", ["last", "first", "stack"])
def test_properties_match_the_materialised_array(impl, layout):
    shape = LAYOUT_SHAPES[layout]
    frames = rand_frames(4, shape)
    pool, slots = pool_with(impl, frames)
    lz = pool.lazy(slots, layout=layout)
    a = np.asarray(lz)
    want = restate(list(frames), layout)
    np.testing.assert_array_equal(a, want)
    assert (lz.shape, lz.dtype, lz.ndim, lz.size, lz.nbytes) == (
        a.shape, a.dtype, a.ndim, a.size, a.nbytes)
    assert lz.layout == layout and lz.stack_size == 4 and lz.frame_shape == shape
    assert lz.pool is pool and lz.slots == tuple(slots)
    assert len(lz) == len(a) and lz.count() == a.shape[-1]
    for j in range(4):
        np.testing.assert_array_equal(lz.get_frame(j), frames[j])
    np.testing.assert_array_equal(lz.get_frame(-1), frames[3])
    for i in (0, 1, a.shape[-1] - 1, -1):
        np.testing.assert_array_equal(lz.frame(i), a[..., i])
    np.testing.assert_array_equal(lz[1], a[1])
    np.testing.assert_array_equal(lz[1:3, ..., -1], a[1:3, ..., -1])
    b = np.asarray(lz)
    assert b is not a and not np.shares_memory(a, b)  # a fresh array each time
    a[...] = 0  # the caller's array is theirs
    np.testing.assert_array_equal(np.asarray(lz), want)


def test_copy_and_deepcopy_share_frames(impl):
    frames = rand_frames(4)
    pool, slots = pool_with(impl, frames)
    lz = pool.lazy(slots, layout="last")
    held = pool.stats()
    for c in (copy.copy(lz), copy.deepcopy(lz), lz.copy()):
        assert type(c) is type(lz) and c is not lz
        assert c.slots == lz.slots and c.pool is lz.pool and c.layout == lz.layout
        assert pool.stats() == held
        np.testing.assert_array_equal(np.asarray(c), np.asarray(lz))
    deep = copy.deepcopy([lz, lz])
    assert deep[0].slots == lz.slots


def test_eq_is_one_bool_both_directions(impl):
    frames = rand_frames(4)
    pool, slots = pool_with(impl, frames)
    a = pool.lazy(slots, layout="last")
    b = pool.lazy(slots, layout="last")
    arr = np.asarray(a)
    for x, y in ((a, b), (a, arr), (arr, a)):
        r = x == y
        assert type(r) is bool and r is True
        r = x != y
        assert type(r) is bool and r is False
    other = arr.copy()
    other[0, 0, 0] ^= 1
    for x, y in ((a, other), (other, a)):
        assert (x == y) is False and (x != y) is True
    # same values, other shape: not equal
    c = pool.lazy(slots, layout="stack") if False else pool.lazy(slots[:3], layout="last")
    assert (a == c) is False
    assert (a == arr.reshape(84, 4, 84)) is False
    assert (a == 3) is False and (a != "x") is True


def test_unhashable(impl):
    lz = impl.LazyFrames([f(0), f(1)])
    with pytest.raises(TypeError, match="unhashable"):
        hash(lz)
    with pytest.raises(TypeError):
        {lz}


@pytest.mark.parametrize("dtype,scale", [
    (np.float32, 1 / 255), (np.float32, 0.5), (np.float64, 1 / 255), (np.float32, 3),
    (np.float32, None), (np.int16, None), (np.float64, np.float64(0.1)),
])
def test_astype_with_scale_equals_numpy_exactly(impl, dtype, scale):
    lz = impl.LazyFrames(list(rand_frames(4, seed=3)))
    ref = np.asarray(lz).astype(dtype)
    if scale is not None:
        ref = ref * np.dtype(dtype).type(scale)
    got = lz.astype(dtype, scale=scale)
    assert got.dtype == np.dtype(dtype) and got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)
    assert got.tobytes() == ref.tobytes()  # bit for bit
    got2 = np.asarray(lz, dtype=dtype)
    np.testing.assert_array_equal(got2, np.asarray(lz).astype(dtype))


@pytest.mark.parametrize("layout", ["last", "first", "stack"])
def test_gather_and_stack_into_out(impl, layout):
    shape = LAYOUT_SHAPES[layout]
    frames = rand_frames(6, shape, seed=1)
    pool, slots = pool_with(impl, frames)
    idx = np.array([[0, 1, 2, 3], [2, 3, 4, 5], [5, 5, 0, 1]])
    want = np.stack([restate([frames[i] for i in row], layout) for row in idx])
    out = np.empty_like(want)
    idx_keep = idx.copy()
    res = pool.gather(idx, out, layout=layout)
    assert res is out
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(idx, idx_keep)
    np.testing.assert_array_equal(pool.gather(idx, layout=layout), want)
    obs = [pool.lazy(row, layout=layout) for row in idx]
    out2 = np.zeros_like(want)
    assert impl.stack(obs, out2) is out2
    np.testing.assert_array_equal(out2, want)
    np.testing.assert_array_equal(impl.stack(obs), want)
    np.testing.assert_array_equal(np.array(obs), want)
    # fused conversion into out
    outf = np.empty(want.shape, np.float32)
    assert impl.stack(obs, outf, scale=1 / 255) is outf
    np.testing.assert_array_equal(outf, want.astype(np.float32) * np.float32(1 / 255))
    outg = np.empty(want.shape, np.float64)
    assert pool.gather(idx, outg, layout=layout, dtype=np.float64, scale=2) is outg
    np.testing.assert_array_equal(outg, want.astype(np.float64) * 2.0)
    assert pool.stats()["live_frames"] == 6


def test_stack_accepts_observations_from_different_pools(impl):
    fa, fb = rand_frames(4, seed=1), rand_frames(4, seed=2)
    pa, sa = pool_with(impl, fa)
    pb, sb = pool_with(impl, fb)
    out = impl.stack([pa.lazy(sa, layout="last"), pb.lazy(sb, layout="last")])
    np.testing.assert_array_equal(out, np.stack([restate(list(fa), "last"), restate(list(fb), "last")]))


def test_pickle_round_trip_all_layouts(impl):
    for layout, shape in LAYOUT_SHAPES.items():
        frames = rand_frames(4, shape)
        pool, slots = pool_with(impl, frames)
        lz = pool.lazy(slots, layout=layout)
        back = pickle.loads(pickle.dumps(lz))
        assert type(back) is type(lz)
        assert back.layout == layout and back.shape == lz.shape and back.dtype == lz.dtype
        np.testing.assert_array_equal(np.asarray(back), np.asarray(lz))


# -- bad input: right exception, clear message, nothing written -------------------------------


def _expect(exc, pattern, fn, *args, **kw):
    with pytest.raises(exc) as info:
        fn(*args, **kw)
    assert re.search(pattern, str(info.value)), str(info.value)
    return info.value


def test_pool_construction_errors(impl):
    _expect(TypeError, "numeric dtype", impl.FramePool, FRAME, object)
    _expect(TypeError, "numeric dtype", impl.FramePool, FRAME, "U3")
    _expect(TypeError, "numeric dtype", impl.FramePool, FRAME, [("a", "u1")])
    _expect(ValueError, "not positive", impl.FramePool, (84, 0), np.uint8)
    _expect(TypeError, "tuple of ints", impl.FramePool, (84.5, 3), np.uint8)
    _expect(ValueError, "chunk_bytes", impl.FramePool, FRAME, np.uint8, chunk_bytes=0)


@pytest.mark.parametrize("bad,exc,pattern", [
    (np.zeros((84, 84), np.uint8), ValueError, "shape"),
    (np.zeros((84, 84, 2), np.uint8), ValueError, "shape"),
    (np.zeros((84, 84, 1), np.int16), TypeError, "dtype"),
    (np.zeros((84, 84, 1), np.float32), TypeError, "dtype"),
    (np.empty((84, 84, 1), object), TypeError, "object"),
])
def test_push_bad_frame_writes_nothing(impl, bad, exc, pattern):
    pool, slots = pool_with(impl, rand_frames(2))
    before = snapshot(pool, slots)
    keep = bad.copy()
    _expect(exc, pattern, pool.push, bad)
    assert snapshot(pool, slots) == before
    many = np.stack([bad, bad])
    _expect(exc, pattern, pool.push_many, many)
    assert snapshot(pool, slots) == before
    assert bad.dtype == keep.dtype and (bad == keep).all()
    assert pool.push(f(1)) == 2  # the failed calls used no slot


def test_push_many_wrong_rank_writes_nothing(impl):
    pool = impl.FramePool(FRAME, np.uint8)
    before = snapshot(pool)
    _expect(ValueError, "shape", pool.push_many, np.zeros((84, 84, 1), np.uint8))
    _expect(ValueError, "shape", pool.push_many, np.zeros((2, 84, 84, 2), np.uint8))
    assert snapshot(pool) == before


@pytest.mark.parametrize("frames,exc,pattern", [
    ([], ValueError, "at least one"),
    ([f(0), np.zeros((84, 84, 2), np.uint8)], ValueError, "shape"),
    ([f(0), f(1, dtype=np.int16)], TypeError, "dtype"),
    ([f(0), np.empty((84, 84, 1), object)], TypeError, "object"),
    ([f(0, shape=(1, 84, 84))], ValueError, "channels-first"),
    ([f(0, shape=(84, 84))], ValueError, "channel axis"),
])
def test_lazyframes_bad_frames_write_nothing(impl, frames, exc, pattern):
    pool = impl.default_pool(FRAME, np.uint8)
    keep = impl.LazyFrames([f(9)])  # something live in the default pool
    before = snapshot(pool, keep.slots)
    copies = [np.array(a, copy=True) for a in frames]
    _expect(exc, pattern, impl.LazyFrames, frames)
    assert snapshot(pool, keep.slots) == before
    for a, b in zip(frames, copies):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_bad_layout(impl):
    pool, slots = pool_with(impl, rand_frames(2))
    before = snapshot(pool, slots)
    _expect(ValueError, "layout must be one of", pool.lazy, slots, layout="middle")
    _expect(ValueError, "layout must be one of", pool.gather, [slots], layout="middle")
    _expect(ValueError, "layout must be one of", impl.LazyFrames, [f(0)], layout="middle")
    _expect(ValueError, "layout must be one of", impl.LazyFrames.from_slots, pool, slots, layout="")
    assert snapshot(pool, slots) == before


def _out_case(impl, layout="last"):
    frames = rand_frames(4, LAYOUT_SHAPES[layout])
    pool, slots = pool_with(impl, frames)
    obs = [pool.lazy(slots, layout=layout), pool.lazy(slots[::-1], layout=layout)]
    idx = np.array([slots, slots[::-1]])
    full = (2,) + obs[0].shape
    return pool, slots, obs, idx, full


def _bad_outs(full):
    a = np.full(full, 7, np.uint8)
    ro = np.full(full, 7, np.uint8)
    ro.flags.writeable = False
    nc = np.full(full[:-1] + (full[-1] * 2,), 7, np.uint8)[..., ::2]
    return [
        (np.full(full[:-1] + (full[-1] + 1,), 7, np.uint8), ValueError, "shape"),
        (np.full((1,) + full[1:], 7, np.uint8), ValueError, "shape"),
        (np.full(full, 7, np.bool_), TypeError, "cannot convert"),
        (np.full(full, 7, np.float16), TypeError, "no fused conversion"),
        (nc, ValueError, "contiguous"),
        (np.asfortranarray(a), ValueError, "contiguous"),
        (ro, ValueError, "read-only"),
        (a.tolist(), TypeError, "ndarray"),
    ]


@pytest.mark.parametrize("layout", ["last", "first", "stack"])
def test_bad_out_writes_nothing(impl, layout):
    pool, slots, obs, idx, full = _out_case(impl, layout)
    before = snapshot(pool, slots)
    for out, exc, pattern in _bad_outs(full):
        keep = np.array(out, copy=True)
        _expect(exc, pattern, impl.stack, obs, out)
        _expect(exc, pattern, pool.gather, idx, out, layout=layout)
        assert snapshot(pool, slots) == before
        assert np.array_equal(np.asarray(out), keep)
        if isinstance(out, np.ndarray):
            assert out.dtype == keep.dtype
    # out given with a dtype argument that does not match it
    for dt, out_dt in ((np.float32, np.uint8), (np.float32, np.float64), (None, np.int8)):
        out = np.full(full, 7, out_dt)
        _expect(TypeError, "dtype", impl.stack, obs, out, dtype=dt or np.uint8)
        _expect(TypeError, "dtype", pool.gather, idx, out, layout=layout, dtype=dt or np.uint8)
        assert (out == 7).all()
    assert snapshot(pool, slots) == before


def test_out_dtype_is_the_conversion_target(impl):
    pool, slots, obs, idx, full = _out_case(impl)
    want = np.stack([np.asarray(o) for o in obs])
    for dt in (np.int16, np.uint16, np.int64, np.float32, np.float64):
        out = np.zeros(full, dt)
        assert impl.stack(obs, out) is out
        np.testing.assert_array_equal(out, want.astype(dt))
        out2 = np.zeros(full, dt)
        assert pool.gather(idx, out2, layout="last") is out2
        np.testing.assert_array_equal(out2, want.astype(dt))


def test_bad_slots_write_nothing(impl):
    frames = rand_frames(4)
    pool, slots = pool_with(impl, frames)
    pool.release(slots[2])  # slot 2 is now free
    live = [0, 1, 3]
    before = snapshot(pool, range(4))
    out = np.full((1, 84, 84, 3), 7, np.uint8)
    n = len(range(pool.capacity))
    for bad, exc, pattern in [
        ([0, 1, 2], ValueError, "free"),
        ([0, 1, n], IndexError, "out of range"),
        ([0, 1, -1], IndexError, "out of range"),
        ([0, 1, 2**40], IndexError, "out of range"),
        ([0, 1, -(2**40)], IndexError, "out of range"),
    ]:
        idx = np.array([bad])
        keep = idx.copy()
        _expect(exc, pattern, pool.gather, idx, out, layout="last")
        _expect(exc, pattern, pool.lazy, bad, layout="last")
        _expect(exc, pattern, pool.retain, bad)
        _expect(exc, pattern, pool.release, bad)
        _expect(exc, pattern, impl.LazyFrames.from_slots, pool, bad, layout="last")
        _expect(exc, pattern, pool.get, bad[-1])
        assert snapshot(pool, range(4)) == before
        assert (out == 7).all()
        np.testing.assert_array_equal(idx, keep)
    _expect(IndexError, "out of range", pool.refcount, -1)
    _expect(IndexError, "out of range", pool.refcount, 2**40)
    assert pool.refcount(2) == 0
    _expect(TypeError, "integers", pool.gather, np.array([[0.0, 1.0]]))
    _expect(TypeError, "integers", pool.retain, np.array([0.5]))
    _expect(ValueError, r"\(B, k\)", pool.gather, np.array(live))
    _expect(ValueError, r"\(B, k\)", pool.gather, np.zeros((1, 0), np.int64))
    _expect(ValueError, "non-empty", pool.lazy, [], layout="last")
    _expect(ValueError, "non-empty", pool.lazy, [[0, 1]], layout="last")
    _expect(TypeError, "FramePool", impl.LazyFrames.from_slots, object(), live, layout="last")
    assert snapshot(pool, range(4)) == before


def test_release_more_than_held_releases_nothing(impl):
    pool, slots = pool_with(impl, rand_frames(3))
    pool.retain(1)
    before = snapshot(pool, slots)
    _expect(ValueError, "released 2 times", pool.release, [0, 1, 0])
    _expect(ValueError, "released 3 times", pool.release, [1, 1, 1])
    assert snapshot(pool, slots) == before
    pool.release([1, 1])
    assert pool.refcount(1) == 0 and pool.live_frames == 2


@pytest.mark.parametrize("dtype,scale,exc,pattern", [
    (np.uint8, 0.5, TypeError, "scale"),
    (np.int32, 0.5, TypeError, "scale"),
    (None, 1 / 255, TypeError, "scale"),
    (np.float32, "0.5", TypeError, "scale must be a real number"),
    (np.float32, True, TypeError, "scale must be a real number"),
    (np.bool_, None, TypeError, "cannot convert"),
    (np.float16, None, TypeError, "no fused conversion"),
    (np.complex64, None, TypeError, "no fused conversion"),
])
def test_unsupported_conversion_writes_nothing(impl, dtype, scale, exc, pattern):
    pool, slots, obs, idx, full = _out_case(impl)
    before = snapshot(pool, slots)
    out_dt = np.uint8 if dtype is None else dtype
    out = np.full(full, 7, out_dt)
    keep = out.copy()
    _expect(exc, pattern, impl.stack, obs, out, dtype=dtype, scale=scale)
    _expect(exc, pattern, impl.stack, obs, dtype=dtype, scale=scale)
    _expect(exc, pattern, pool.gather, idx, out, layout="last", dtype=dtype, scale=scale)
    _expect(exc, pattern, obs[0].astype, out_dt, scale=scale)
    if scale is None:  # the NumPy protocol casts as NumPy would, unfused
        np.testing.assert_array_equal(np.asarray(obs[0], dtype=dtype),
                                      np.asarray(obs[0]).astype(dtype))
        assert np.asarray(obs[0], dtype=dtype).dtype == np.dtype(dtype or np.uint8)
    assert snapshot(pool, slots) == before
    np.testing.assert_array_equal(out, keep)


def test_no_float_to_int_nor_signed_to_unsigned(impl):
    lz = impl.LazyFrames([np.ones(3, np.float32)] * 2)
    _expect(TypeError, "cannot convert", lz.astype, np.uint8)
    _expect(TypeError, "cannot convert", impl.stack, [lz], dtype=np.int64)
    lz16 = impl.LazyFrames([np.full(3, -2, np.int16)] * 2)
    _expect(TypeError, "cannot convert", lz16.astype, np.uint16)
    # np.asarray(obs, dtype) is NumPy's protocol: it casts as NumPy casts an ndarray
    np.testing.assert_array_equal(np.asarray(lz16, dtype=np.uint8),
                                  np.full(6, -2, np.int16).astype(np.uint8))
    np.testing.assert_array_equal(lz16.astype(np.float64, scale=0.5), np.full(6, -1.0))


def test_stack_bad_observation_lists(impl):
    pool, slots, obs, idx, full = _out_case(impl)
    before = snapshot(pool, slots)
    other_dtype = impl.LazyFrames([f(0, dtype=np.int16)] * 4)
    other_k = pool.lazy(slots[:3], layout="last")
    other_layout = impl.LazyFrames([f(0, shape=(84, 84))] * 4, layout="stack")
    before = snapshot(pool, slots)
    _expect(ValueError, "at least one", impl.stack, [])
    _expect(TypeError, "LazyFrames", impl.stack, [obs[0], np.asarray(obs[1])])
    _expect(TypeError, "dtypes", impl.stack, [obs[0], other_dtype])
    _expect(ValueError, "differ", impl.stack, [obs[0], other_k])
    _expect(ValueError, "differ", impl.stack, [obs[0], other_layout])
    assert snapshot(pool, slots) == before


def test_frame_index_out_of_range(impl):
    lz = impl.LazyFrames([f(v) for v in range(4)])
    _expect(IndexError, "out of range", lz.frame, 4)
    _expect(IndexError, "out of range", lz.frame, -5)
    _expect(IndexError, "out of range", lz.get_frame, 4)
    _expect(IndexError, "out of range", lz.get_frame, -5)
    with pytest.raises(IndexError):
        lz[84]
    with pytest.raises(TypeError):
        lz.frame(1.5)


def test_copy_false_raises_with_advice(impl):
    lz = impl.LazyFrames([f(v) for v in range(4)])
    _expect(ValueError, r"np\.asarray\(obs\)", np.array, lz, copy=False)
    _expect(ValueError, r"lazyframes\.stack", lz.__array__, None, False)
    a = lz.__array__(None, True)
    np.testing.assert_array_equal(a, restate([f(v) for v in range(4)], "last"))


def test_slot_ids_as_lists_tuples_numpy_ints(impl):
    """Slot ids may be ints, numpy ints, (nested) lists/tuples or int arrays of any width."""
    frames = rand_frames(3)
    pool, slots = pool_with(impl, frames)
    want = np.stack([restate([frames[0], frames[2]], "last")])
    for idx in ([[0, 2]], ((0, 2),), [np.array([0, 2])], np.array([[0, 2]], np.int32),
                [[np.int64(0), np.int64(2)]], np.array([[0, 2]], np.uint16)):
        np.testing.assert_array_equal(pool.gather(idx, layout="last"), want)
    for row in ([0, 2], (0, 2), [np.int64(0), np.int32(2)], np.array([0, 2], np.uint8)):
        lz = pool.lazy(row, layout="last")
        np.testing.assert_array_equal(np.asarray(lz), want[0])
        pool.retain(row)
        pool.release(row)
        del lz
    pool.retain(np.int64(1))
    pool.retain([[1]])
    assert pool.refcount(np.int32(1)) == 3
    pool.release([[1], [1]])
    assert pool.refcount(1) == 1
    assert [pool.refcount(s) for s in slots] == [1, 1, 1] and pool.live_frames == 3
    _expect(TypeError, "integers", pool.retain, [0.5])
    _expect(TypeError, "integers", pool.gather, [[0, 1.5]])
    _expect(TypeError, "integers", pool.lazy, ["0"])
    assert [pool.refcount(s) for s in slots] == [1, 1, 1]


# -- stacker steps: LazyFrames.shift and FramePool.shift_rings ---------------------------


def test_shift_shares_k_minus_1_frames_and_copies_one(impl):
    pool = impl.FramePool(FRAME, np.uint8)
    s = pool.push(f(0))
    lz = pool.lazy([s] * 4)
    pool.release(s)
    src = f(1)
    nxt = lz.shift(src)
    src[...] = 99  # the env reuses its buffer: the stored frame must not change
    assert [int(nxt.get_frame(j)[0, 0, 0]) for j in range(4)] == [0, 0, 0, 1]
    assert nxt.slots[:3] == lz.slots[1:]
    assert pool.live_frames == 2 and pool.refcount(s) == 4 + 3
    np.testing.assert_array_equal(np.asarray(lz), restate([f(0)] * 4, "last"))  # unchanged
    del lz, nxt
    assert pool.live_frames == 0


def test_shift_bad_frame_writes_nothing(impl):
    pool = impl.FramePool(FRAME, np.uint8)
    lz = pool.lazy([pool.push(f(0))] * 2)
    before = snapshot(pool, lz.slots)
    with pytest.raises(ValueError, match="shape"):
        lz.shift(np.zeros((84, 84), np.uint8))
    with pytest.raises(TypeError, match="dtype"):
        lz.shift(np.zeros(FRAME, np.float32))
    assert snapshot(pool, lz.slots) == before


def _rings_model(rows, frames, restart, pad):
    """shift_rings restated on lists: the rings' new contents as frame values."""
    out = []
    for i, row in enumerate(rows):
        if restart is not None and restart[i]:
            fill = frames[i] if pad is None else pad
            out.append([fill] * (len(row) - 1) + [frames[i]])
        else:
            out.append(row[1:] + [frames[i]])
    return out


@pytest.mark.parametrize("restart", [None, [False, True, False], [True, True, True]])
@pytest.mark.parametrize("use_pad", [False, True])
def test_shift_rings_equals_the_model_and_balances_references(impl, restart, use_pad):
    pool = impl.FramePool(FRAME, np.uint8)
    values = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    rings = np.array([[pool.push(f(v)) for v in row] for row in values], np.int64)
    pad = pool.push(f(0)) if use_pad else None
    keep = rings.copy()
    got = pool.shift_rings(rings, np.stack([f(20), f(21), f(22)]), restart, pad=pad)
    np.testing.assert_array_equal(rings, keep)  # the old ring array is never written
    want = _rings_model(values, [20, 21, 22], restart, 0 if use_pad else None)
    assert [[int(pool.get(s)[0, 0, 0]) for s in row] for row in got] == want
    # references passed to the new rings: releasing them (and the pad) frees everything
    pool.release(got)
    if pad is not None:
        pool.release(pad)
    assert pool.live_frames == 0


def test_shift_rings_bad_input_writes_nothing(impl):
    pool = impl.FramePool(FRAME, np.uint8)
    rings = np.array([[pool.push(f(v)) for v in range(2)] for _ in range(2)], np.int64)
    before = snapshot(pool, rings.ravel())
    good = np.stack([f(5), f(6)])
    with pytest.raises(ValueError, match="frames have shape"):
        pool.shift_rings(rings, good[:1])
    with pytest.raises(ValueError, match="shape"):
        pool.shift_rings(rings, np.zeros((2, 84, 84), np.uint8))
    with pytest.raises(TypeError, match="dtype"):
        pool.shift_rings(rings, good.astype(np.int16))
    with pytest.raises(ValueError, match="restart has shape"):
        pool.shift_rings(rings, good, [True])
    with pytest.raises(IndexError, match="out of range"):
        pool.shift_rings(rings, good, [True, False], pad=10**6)
    with pytest.raises(IndexError, match="out of range"):
        pool.shift_rings(rings + 10**6, good)
    assert snapshot(pool, rings.ravel()) == before


# -- write_slots: the replay buffer's reference-owning table -------------------------------


@pytest.mark.parametrize("table_dtype", [np.int32, np.int64])
def test_write_slots_takes_new_and_releases_old_references(impl, table_dtype):
    pool = impl.FramePool(FRAME, np.uint8)
    a = [pool.push(f(v)) for v in range(4)]
    obs = pool.lazy_batch(np.array([a[:2], a[1:3]]), layout="stack")
    nxt = np.array([a[1:3], a[2:4]])  # a plain int array part
    table = np.zeros((4, 4), table_dtype)
    pool.write_slots(table, 1, (obs, nxt), release=False)
    np.testing.assert_array_equal(table[1:3], np.hstack([obs.slots, nxt]))
    # push + batch + table
    assert [pool.refcount(s) for s in a] == [1 + 1 + 1, 1 + 2 + 3, 1 + 1 + 3, 1 + 0 + 1]
    one = pool.lazy([a[3], a[3]], layout="stack")
    pool.write_slots(table, 1, (one, one), release=True)  # E = 1: row 1 only
    assert table[1].tolist() == [a[3]] * 4
    # row 1 held a0 a1 a1 a2 (released) and now a3 x4; `one` holds a3 x2
    assert [pool.refcount(s) for s in a] == [3 - 1, 6 - 2, 5 - 1, 2 + 2 + 4]
    del obs, one
    pool.release(table[1:3].astype(np.int64))
    pool.release(a)
    assert pool.live_frames == 0


def test_write_slots_bad_input_writes_nothing(impl):
    pool = impl.FramePool(FRAME, np.uint8)
    a = np.array([[pool.push(f(v)) for v in range(2)]], np.int64)
    table = np.zeros((2, 4), np.int32)
    pool.write_slots(table, 0, (a, a), release=False)
    before = (snapshot(pool, a.ravel()), table.copy())
    with pytest.raises(TypeError, match="int32 or int64"):
        pool.write_slots(table.astype(np.int16), 0, (a, a))
    with pytest.raises(ValueError, match="slot ids per row"):
        pool.write_slots(table, 0, (a,))
    with pytest.raises(IndexError, match="out of range"):
        pool.write_slots(table, 2, (a, a))
    with pytest.raises(IndexError, match="out of range"):
        pool.write_slots(table, 0, (a, a + 10**6))
    stale = table.copy()
    stale[1] = 999  # a row holding ids that are not live
    with pytest.raises(ValueError, match="free slot"):
        pool.write_slots(stale, 1, (a, a), release=True)
    with pytest.raises(ValueError, match="writeable"):
        pool.write_slots(table[:, ::2], 0, (a,))
    other = impl.FramePool(FRAME, np.uint8)
    with pytest.raises(ValueError, match="another pool"):
        pool.write_slots(table, 0, (other.lazy_batch([[other.push(f(1))] * 2]), a))
    assert (snapshot(pool, a.ravel()), table.tolist()) == (before[0], before[1].tolist())


# -- push_dedup: stacked ndarray observations cost one new frame per step ------------------


def test_push_dedup_reuses_candidates_and_earlier_frames(impl):
    pool = impl.FramePool(FRAME, np.uint8)
    prev = np.array([[pool.push(f(v)) for v in (1, 2, 3, 4)]], np.int64)
    # the next stacked observation: 2 3 4 5 -> only frame 5 is new
    got = pool.push_dedup(np.stack([f(2), f(3), f(4), f(5)])[None], prev)
    assert got[0, :3].tolist() == prev[0, 1:].tolist()
    assert pool.live_frames == 5
    # reset padding 9 9 9 9, no candidates: one frame stored, shared four times
    pad = pool.push_dedup(np.stack([f(9)] * 4)[None])
    assert len(set(pad[0].tolist())) == 1 and pool.live_frames == 6
    assert [int(pool.get(s)[0, 0, 0]) for s in got[0]] == [2, 3, 4, 5]
    pool.release(got)
    pool.release(pad)
    pool.release(prev)
    assert pool.live_frames == 0


def test_push_dedup_bad_input_writes_nothing(impl):
    pool = impl.FramePool(FRAME, np.uint8)
    prev = np.array([[pool.push(f(1))]], np.int64)
    before = snapshot(pool, prev.ravel())
    good = np.stack([f(1)])[None]
    with pytest.raises(ValueError, match="expected"):
        pool.push_dedup(good[0])
    with pytest.raises(TypeError, match="dtype"):
        pool.push_dedup(good.astype(np.int16))
    with pytest.raises(ValueError, match="candidates have shape"):
        pool.push_dedup(good, prev.ravel())
    with pytest.raises(IndexError, match="out of range"):
        pool.push_dedup(good, prev + 10**6)
    assert snapshot(pool, prev.ravel()) == before


# -- found by a fresh user: each of these crashed the compiled core or misbehaved -------


def test_stack_rejects_same_shape_from_other_geometry(impl):
    a = impl.LazyFrames([f(i) for i in range(4)])  # (84, 84, 4): 4 frames of (84, 84, 1)
    b = impl.LazyFrames([f(9, (84, 84, 4))])  # (84, 84, 4): 1 frame of (84, 84, 4)
    assert a.shape == b.shape
    for batch in ([a, b], [b, a]):
        with pytest.raises(ValueError, match="4 frames of \\(84, 84, 1\\).*1 frames of|1 frames of .*4 frames of"):
            impl.stack(batch)
    np.testing.assert_array_equal(np.array([b, a])[1], restate([f(i) for i in range(4)], "last"))


def test_stack_and_gather_hold_references_while_copying(impl):
    # The copy runs without the GIL. Another thread dropping the observations (clearing
    # the caller's list) or releasing the slots meanwhile must not free the frames being
    # read: that was a use-after-free (a crash, or torn frames).
    import threading

    pool = impl.FramePool(FRAME, np.uint8)
    want = restate([f(v) for v in range(4)], "last").astype(np.float64)
    for _ in range(30):
        slots = [pool.push(f(v)) for v in range(4)]
        lst = [pool.lazy(slots) for _ in range(300)]
        idx = np.array([slots] * 300, np.int64)
        t = threading.Thread(target=lambda: (lst.clear(), pool.release(slots)))
        t.start()
        got = [impl.stack(lst, dtype=np.float64) if lst else None,
               pool.gather(idx, dtype=np.float64) if pool.live_frames else None]
        t.join()
        for g in got:
            if g is not None:
                assert (g == want).all()
    assert pool.live_frames == 0


def test_uninitialised_objects_do_not_crash(impl):
    # __new__ without __init__: an empty observation in the compiled core (the twin has
    # no state to read), never a NULL dereference
    lz = impl.LazyFrames.__new__(impl.LazyFrames)
    if impl.__name__.endswith("_core"):
        assert np.asarray(lz).size == 0 and len(lz) == 0
        repr(lz)
        impl.stack([lz])
    pool = impl.FramePool.__new__(impl.FramePool)
    with pytest.raises((TypeError, AttributeError)):
        pool.push(f(1))
    with pytest.raises((TypeError, AttributeError, IndexError)):
        pool.lazy([0])


def test_slot_ids_must_be_integers(impl):
    pool = impl.FramePool(FRAME, np.uint8)
    s = pool.push(f(1))
    for call in (pool.get, pool.refcount, pool.retain, pool.release):
        with pytest.raises(TypeError):
            call(float(s) + 0.5)
    assert pool.refcount(s) == 1


def test_lazybatch_pickles_and_copies_sharing_frames(impl):
    import copy as copy_mod

    pool = impl.FramePool(FRAME, np.uint8)
    s = [pool.push(f(v)) for v in range(5)]
    batch = pool.lazy_batch([s[0:4], s[1:5]], layout="last")
    want = np.asarray(batch)
    for other in (copy_mod.copy(batch), copy_mod.deepcopy(batch)):
        np.testing.assert_array_equal(np.asarray(other), want)
        assert other.pool is pool
    data = pickle.dumps(batch)
    assert len(data) < 6 * FB  # 5 distinct frames, not 8
    back = pickle.loads(data)
    np.testing.assert_array_equal(np.asarray(back), want)
    assert back.layout == "last" and len(back) == 2
    with pytest.raises(IndexError, match="2 environments"):
        batch[5]


def test_scalar_frames_stack_on_a_new_axis(impl):
    lz = impl.LazyFrames([np.uint8(1), np.uint8(2), np.uint8(3)], layout="stack")
    assert lz.shape == (3,) and len(lz) == 3
    np.testing.assert_array_equal(np.asarray(lz), [1, 2, 3])


def test_numpy_protocol_casts_what_the_kernels_do_not_fuse(impl):
    lz = impl.LazyFrames([np.full((2, 3), 1.5, np.float16)] * 2, layout="stack")
    got = np.asarray(lz, dtype=np.float32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.full((2, 2, 3), 1.5, np.float32))


# -- gather_pairs: a replay sample's obs and next_obs, row-interleaved ---------------------


@pytest.mark.parametrize("layout", ["last", "stack"])
def test_gather_pairs_equals_two_gathers(impl, layout):
    frames = rand_frames(12, LAYOUT_SHAPES[layout] if layout != "stack" else (84, 84))
    pool, slots = pool_with(impl, frames)
    rng = np.random.default_rng(0)
    starts = rng.integers(0, 8, 5)
    a = np.array([slots[s:s + 4] for s in starts], np.int64)
    b = np.array([slots[s + 1:s + 5] for s in starts], np.int64)
    got = pool.gather_pairs(a, b, layout=layout, dtype=np.float32, scale=0.5)
    for g, sl in zip(got, (a, b)):
        np.testing.assert_array_equal(g, pool.gather(sl, layout=layout, dtype=np.float32, scale=0.5))
    outs = (np.empty_like(got[0]), np.empty_like(got[1]))
    res = pool.gather_pairs(a, b, outs, layout=layout, scale=0.5)
    assert res[0] is outs[0] and res[1] is outs[1]
    np.testing.assert_array_equal(outs[1], got[1])


def test_gather_pairs_bad_input_writes_nothing(impl):
    frames = rand_frames(6)
    pool, slots = pool_with(impl, frames)
    a = np.array([slots[0:4]], np.int64)
    good = np.zeros((1, 84, 84, 4), np.float32)
    keep = good.copy()
    before = snapshot(pool, slots)
    with pytest.raises(ValueError, match="one shape"):
        pool.gather_pairs(a, a[:, :3])
    with pytest.raises(TypeError, match="different dtypes"):
        pool.gather_pairs(a, a, (good, np.zeros((1, 84, 84, 4), np.float64)))
    with pytest.raises(ValueError, match="overlap"):
        pool.gather_pairs(a, a, (good, good))
    with pytest.raises(ValueError, match="shape"):
        pool.gather_pairs(a, a, (good, np.zeros((2, 84, 84, 4), np.float32)))
    with pytest.raises(IndexError, match="out of range"):
        pool.gather_pairs(a, a + 10**6, (good, np.zeros_like(good)))
    assert snapshot(pool, slots) == before
    np.testing.assert_array_equal(good, keep)
