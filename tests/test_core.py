"""API behaviour of the core (FramePool, FrameRef, LazyFrames, LazyBatch, SlotTable, stack).

Every test takes the ``impl`` fixture (tests/conftest.py), so it runs on the compiled
core and on its pure-NumPy twin. Bad-input tests check three things: the exception
type, a message naming the problem, and that nothing was written (pool stats,
refcounts and the contents of ``out`` are as before the call; inputs are unmodified).
References are owned by objects: a test drops them by deleting the owners, and checks
that the pool holds zero live frames once every owner is gone.
"""

import copy
import gc
import pickle
import re
import threading

import numpy as np
import pytest
from conftest import IMPLS, core, f, impl_name, make_pool, push_all, restate, snapshot

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


def pool_with(impl, frames, chunk_bytes=1 << 20):
    """A pool holding ``frames``; returns it and the FrameRefs that own them."""
    pool = make_pool(impl, frames.shape[1:], frames.dtype, chunk_bytes=chunk_bytes)
    return pool, push_all(pool, frames)


def ids(refs):
    """The slot ids of a list of FrameRefs."""
    return [r.slot for r in refs]


def values(pool, slots):
    """The first element of each frame, by slot id: a compact view of a row's contents."""
    return [int(pool.get(int(s)).flat[0]) for s in np.ravel(slots)]


@pytest.fixture(params=[name for name in IMPLS if name == "compiled"])
def arena(request):
    """The compiled core only: slot ids, chunks and held bytes are its arena's properties."""
    return core(request.param)


def _expect(exc, pattern, fn, *args, **kw):
    with pytest.raises(exc) as info:
        fn(*args, **kw)
    assert re.search(pattern, str(info.value)), str(info.value)
    return info.value


# -- push: the one copy in ----------------------------------------------------------------


def test_push_copies_once_and_source_changes_never_reach_the_pool(impl):
    src = f(7)
    pool = make_pool(impl)
    r = pool.push(src)
    assert type(r) is impl.FrameRef and r.pool is pool and isinstance(r.slot, int)
    src[...] = 99  # the env reuses its buffer
    np.testing.assert_array_equal(pool.get(r), f(7))
    got = pool.get(r.slot)
    got[...] = 1  # get returns a copy: writing it does not touch the pool
    np.testing.assert_array_equal(pool.get(r), f(7))
    assert pool.refcount(r) == 1 and pool.live_frames == 1
    s = r.slot
    del r  # the one owner goes: the slot is free
    assert pool.refcount(s) == 0 and pool.live_frames == 0


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
    pool = make_pool(impl)
    r = pool.push(frame)
    np.testing.assert_array_equal(pool.get(r), want)
    np.testing.assert_array_equal(np.asarray(frame), want)  # input unmodified


def _readonly(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def test_push_accepts_other_byte_order(impl):
    want = rand_frames(2, (5, 4), np.int16)
    pool = make_pool(impl, (5, 4), np.int16)
    swapped = want[0].astype(">i2" if np.little_endian else "<i2")
    keep = swapped.copy()
    r = pool.push(swapped)
    assert pool.dtype == np.dtype(np.int16)
    np.testing.assert_array_equal(pool.get(r), want[0])
    assert pool.get(r).dtype == np.dtype("=i2")
    np.testing.assert_array_equal(swapped, keep)
    batch = pool.push_batch(want.astype(swapped.dtype))
    np.testing.assert_array_equal(np.asarray(batch)[:, 0], want)


def test_frameref_repr_and_no_int_protocol(impl):
    pool = make_pool(impl)
    r = pool.push(f(3))
    text = repr(r)
    assert text.startswith("FrameRef(") and str(r.slot) in text
    with pytest.raises(TypeError):
        [0, 1, 2][r]  # a FrameRef is not an int: it cannot be used as one
    with pytest.raises(TypeError):
        impl.FrameRef()
    with pytest.raises(AttributeError):
        r.slot = 5
    assert pool.refcount(r) == 1


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


# -- push_batch: n frames in, one LazyBatch out -----------------------------------------


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("use_pad", [False, True])
def test_push_batch_rows_are_padding_then_the_new_frame(impl, k, use_pad):
    frames = np.stack([f(v) for v in (5, 6)])
    keep = frames.copy()
    pool = make_pool(impl)
    pad = pool.push(f(0)) if use_pad else None
    batch = pool.push_batch(frames, k=k, pad=pad)
    frames[...] = 99  # copied once: the caller's array is theirs again
    assert type(batch) is impl.LazyBatch and batch.pool is pool
    assert batch.layout == "stack" and batch.stack_size == k and len(batch) == 2
    assert batch.slots.shape == (2, k) and batch.slots.dtype == np.int64
    for i, v in enumerate((5, 6)):
        fill = 0 if use_pad else v
        assert values(pool, batch.slots[i]) == [fill] * (k - 1) + [v]
    np.testing.assert_array_equal(np.asarray(batch)[:, -1], keep)
    assert pool.live_frames == 2 + use_pad
    if use_pad:
        assert pool.refcount(pad) == 1 + 2 * (k - 1)
    del batch, pad
    assert pool.live_frames == 0


def test_push_batch_layout_and_bad_input_writes_nothing(impl):
    pool = make_pool(impl)
    got = pool.push_batch(np.stack([f(1), f(2)]), k=2, layout="last")
    assert got.layout == "last" and got.shape == (2, 84, 84, 2)
    np.testing.assert_array_equal(np.asarray(got)[1], restate([f(2), f(2)], "last"))
    other = make_pool(impl)
    foreign = other.push(f(0))
    before = snapshot(pool, got.slots.ravel())
    good = np.stack([f(5), f(6)])
    _expect(ValueError, "shape", pool.push_batch, np.zeros((2, 84, 84), np.uint8))
    _expect(ValueError, "shape", pool.push_batch, f(5))
    _expect(TypeError, "dtype", pool.push_batch, good.astype(np.int16))
    _expect(ValueError, "layout must be one of", pool.push_batch, good, layout="middle")
    _expect(ValueError, "another pool", pool.push_batch, good, k=2, pad=foreign)
    _expect(ValueError, "", pool.push_batch, good[:0])
    for k in (0, -1):
        _expect(ValueError, "k", pool.push_batch, good, k=k)
    _expect(TypeError, "", pool.push_batch, good, k=2, pad=3)  # pad is an owner, not an int
    assert snapshot(pool, got.slots.ravel()) == before
    assert other.refcount(foreign) == 1


# -- refcounts follow owners ------------------------------------------------------------


def test_refcounts_follow_owners(impl):
    pool, (r0, r1) = pool_with(impl, rand_frames(2))
    s0, s1 = r0.slot, r1.slot
    assert pool.refcount(s0) == pool.refcount(r0) == 1
    lz = pool.lazy([r0, r1, s0], layout="last")  # FrameRefs and ints mix
    assert (pool.refcount(s0), pool.refcount(s1)) == (3, 2)
    lz2 = copy.copy(lz)
    lz3 = copy.deepcopy(lz)
    lz4 = lz.copy()
    assert (pool.refcount(s0), pool.refcount(s1)) == (9, 5)
    batch = pool.lazy_batch([[r0, r1], [s1, s1]])
    assert (pool.refcount(s0), pool.refcount(s1)) == (10, 8)
    del lz, lz2, lz3, lz4
    assert (pool.refcount(s0), pool.refcount(s1)) == (2, 4)
    del r0, r1
    assert (pool.refcount(s0), pool.refcount(s1)) == (1, 3)
    assert pool.live_frames == 2
    del batch
    assert (pool.refcount(s0), pool.refcount(s1)) == (0, 0)
    assert pool.live_frames == 0


def test_lazy_observation_keeps_frames_after_refs_are_dropped(impl):
    frames = rand_frames(3)
    pool, refs = pool_with(impl, frames)
    lz = pool.lazy(refs, layout="stack")
    del refs
    assert pool.live_frames == 3
    np.testing.assert_array_equal(np.asarray(lz), frames)
    del lz
    assert pool.live_frames == 0


def test_a_freed_slot_is_reused_and_its_new_frame_is_read(impl):
    pool, refs = pool_with(impl, rand_frames(3))
    s = refs[1].slot
    del refs[1]
    _expect(ValueError, f"slot {s} is free", pool.get, s)
    again = [pool.push(f(v)) for v in range(4)]  # one of them takes slot s again
    assert s in ids(again)
    held = again[ids(again).index(s)]
    np.testing.assert_array_equal(pool.get(s), pool.get(held))
    assert pool.refcount(s) == 1 and pool.live_frames == 6


def test_slot_reuse_most_recently_freed_first(arena):
    # the compiled arena's policy: freed slots of the lowest chunk with a free slot are
    # reused before new ones, the most recently freed first
    pool, refs = pool_with(arena, rand_frames(5))
    assert ids(refs) == [0, 1, 2, 3, 4]
    refs[1] = None  # slot 1 freed,
    refs[3] = None  # then slot 3
    keep = [pool.push(f(3)), pool.push(f(1)), pool.push(f(5))]
    assert ids(keep) == [3, 1, 5]
    refs[0] = None
    assert pool.push(f(0)).slot == 0
    np.testing.assert_array_equal(pool.get(3), f(3))


def test_chunks_fill_release_and_keep_one_spare(arena):
    # 4 slots per chunk; 3 chunks
    pool, refs = pool_with(arena, rand_frames(12), chunk_bytes=4 * FB)
    assert pool.slots_per_chunk == 4 and pool.frame_bytes == FB
    assert pool.capacity == 12 and pool.bytes_held == 12 * FB == pool.peak_bytes
    for i in range(8, 12):  # chunk 2 empties (slot 11 freed last): kept as the one spare
        refs[i] = None
    assert pool.bytes_held == 12 * FB and pool.live_frames == 8
    for i in range(4, 8):  # chunk 1 empties: a spare exists, so it is released
        refs[i] = None
    assert pool.bytes_held == 8 * FB and pool.capacity == 8
    assert pool.peak_bytes == 12 * FB
    assert pool.live_frames == 4 and pool.live_bytes == 4 * FB
    # the lowest chunk with memory and a free slot is used first, then released ids
    more = [pool.push(f(i)) for i in range(5)]
    assert ids(more) == [11, 10, 9, 8, 4]
    assert pool.bytes_held == 12 * FB
    del refs, more
    assert pool.live_frames == 0
    assert pool.bytes_held == 4 * FB  # one empty chunk kept
    assert pool.refcount(5) == 0 and pool.refcount(11) == 0


def test_chunk_bytes_smaller_than_a_frame_gives_one_slot_per_chunk(impl):
    pool = make_pool(impl, chunk_bytes=1)
    assert pool.slots_per_chunk == 1
    refs = [pool.push(f(i)) for i in range(3)]
    assert pool.live_frames == 3
    del refs
    assert pool.live_frames == 0
    if impl_name(impl) == "compiled":
        assert pool.bytes_held == FB  # one empty chunk kept


def test_stats_and_repr(impl):
    pool, refs = pool_with(impl, rand_frames(3))
    st = pool.stats()
    assert set(st) == {
        "live_frames",
        "live_bytes",
        "capacity",
        "frame_bytes",
        "bytes_held",
        "peak_bytes",
        "hot_frames",
        "cold_frames",
        "cold_bytes",
    }
    assert (st["live_frames"], st["live_bytes"], st["frame_bytes"]) == (3, 3 * FB, FB)
    assert (st["hot_frames"], st["cold_frames"], st["cold_bytes"]) == (3, 0, 0)
    assert st["capacity"] == pool.capacity >= 3
    assert st["bytes_held"] == pool.bytes_held >= 3 * FB
    assert st["peak_bytes"] == pool.peak_bytes >= st["bytes_held"]
    if impl_name(impl) == "compiled":
        assert pool.slots_per_chunk == 128  # the largest power of two <= (1 << 20) // FB
        assert st["capacity"] == 128 and st["bytes_held"] == st["peak_bytes"] == 128 * FB
    assert pool.frame_shape == FRAME and pool.dtype == np.dtype(np.uint8)
    r = repr(pool)
    assert r.startswith("FramePool(") and "(84, 84, 1)" in r and "uint8" in r
    assert "live_frames=3" in r
    lz = pool.lazy(refs, layout="last")
    assert repr(lz) == "LazyFrames(shape=(84, 84, 3), dtype=uint8, layout='last', stack_size=3)"


def test_pool_is_not_picklable(impl):
    pool = make_pool(impl)
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
    pool, refs = pool_with(impl, frames)
    lz = pool.lazy(refs, layout=layout)
    a = np.asarray(lz)
    want = restate(list(frames), layout)
    np.testing.assert_array_equal(a, want)
    assert (lz.shape, lz.dtype, lz.ndim, lz.size, lz.nbytes) == (
        a.shape,
        a.dtype,
        a.ndim,
        a.size,
        a.nbytes,
    )
    assert lz.layout == layout and lz.stack_size == 4 and lz.frame_shape == shape
    assert lz.pool is pool and lz.slots == tuple(ids(refs))
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
    pool, refs = pool_with(impl, frames)
    lz = pool.lazy(refs, layout="last")
    held = pool.live_frames
    for c in (copy.copy(lz), copy.deepcopy(lz), lz.copy()):
        assert type(c) is type(lz) and c is not lz
        assert c.slots == lz.slots and c.pool is lz.pool and c.layout == lz.layout
        assert pool.live_frames == held
        np.testing.assert_array_equal(np.asarray(c), np.asarray(lz))
    deep = copy.deepcopy([lz, lz])
    assert deep[0].slots == lz.slots


def test_eq_is_one_bool_both_directions(impl):
    frames = rand_frames(4)
    pool, refs = pool_with(impl, frames)
    a = pool.lazy(refs, layout="last")
    b = pool.lazy(ids(refs), layout="last")
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
    c = pool.lazy(refs[:3], layout="last")
    assert (a == c) is False
    assert (a == arr.reshape(84, 4, 84)) is False
    assert (a == 3) is False and (a != "x") is True


def test_unhashable(impl):
    lz = impl.LazyFrames([f(0), f(1)])
    with pytest.raises(TypeError, match="unhashable"):
        hash(lz)
    with pytest.raises(TypeError):
        _ = {lz}


@pytest.mark.parametrize(
    "dtype,scale",
    [
        (np.float32, 1 / 255),
        (np.float32, 0.5),
        (np.float64, 1 / 255),
        (np.float32, 3),
        (np.float32, None),
        (np.int16, None),
        (np.float64, np.float64(0.1)),
    ],
)
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
    pool, refs = pool_with(impl, frames)
    pos = np.array([[0, 1, 2, 3], [2, 3, 4, 5], [5, 5, 0, 1]])
    idx = np.array(ids(refs))[pos]
    want = np.stack([restate([frames[i] for i in row], layout) for row in pos])
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
    batch = pool.lazy_batch(idx, layout=layout)
    np.testing.assert_array_equal(np.asarray(batch), want)
    out3 = np.zeros_like(want)
    assert batch.numpy(out3) is out3
    np.testing.assert_array_equal(out3, want)
    # fused conversion into out
    outf = np.empty(want.shape, np.float32)
    assert impl.stack(obs, outf, scale=1 / 255) is outf
    np.testing.assert_array_equal(outf, want.astype(np.float32) * np.float32(1 / 255))
    outg = np.empty(want.shape, np.float64)
    assert pool.gather(idx, outg, layout=layout, dtype=np.float64, scale=2) is outg
    np.testing.assert_array_equal(outg, want.astype(np.float64) * 2.0)
    np.testing.assert_array_equal(batch.numpy(dtype=np.float64, scale=2), outg)
    assert pool.live_frames == 6


def test_stack_accepts_observations_from_different_pools(impl):
    fa, fb = rand_frames(4, seed=1), rand_frames(4, seed=2)
    pa, sa = pool_with(impl, fa)
    pb, sb = pool_with(impl, fb)
    out = impl.stack([pa.lazy(sa, layout="last"), pb.lazy(sb, layout="last")])
    np.testing.assert_array_equal(
        out, np.stack([restate(list(fa), "last"), restate(list(fb), "last")])
    )


def test_pickle_round_trip_all_layouts(impl):
    for layout, shape in LAYOUT_SHAPES.items():
        frames = rand_frames(4, shape)
        pool, refs = pool_with(impl, frames)
        lz = pool.lazy(refs, layout=layout)
        back = pickle.loads(pickle.dumps(lz))
        assert type(back) is type(lz)
        assert back.layout == layout and back.shape == lz.shape and back.dtype == lz.dtype
        np.testing.assert_array_equal(np.asarray(back), np.asarray(lz))


def test_frameref_pickles_as_its_frame_into_the_default_pool(impl):
    pool = make_pool(impl, (3, 2), np.int16)
    r = pool.push(np.arange(6, dtype=np.int16).reshape(3, 2))
    data = pickle.dumps(r)
    back = pickle.loads(data)
    assert type(back) is impl.FrameRef
    assert back.pool is impl.default_pool((3, 2), np.int16) and back.pool is not pool
    np.testing.assert_array_equal(back.pool.get(back), pool.get(r))
    assert pool.refcount(r) == 1 and back.pool.refcount(back) == 1
    two = pickle.loads(pickle.dumps([r, r]))  # one frame written, one FrameRef back
    assert two[0] is two[1]


# -- bad input: right exception, clear message, nothing written -------------------------------


def test_pool_construction_errors(impl):
    _expect(TypeError, "numeric dtype", impl.FramePool, FRAME, object)
    _expect(TypeError, "numeric dtype", impl.FramePool, FRAME, "U3")
    _expect(TypeError, "numeric dtype", impl.FramePool, FRAME, [("a", "u1")])
    _expect(ValueError, "not positive", impl.FramePool, (84, 0), np.uint8)
    _expect(TypeError, "tuple of ints", impl.FramePool, (84.5, 3), np.uint8)
    _expect(ValueError, "chunk_bytes", impl.FramePool, FRAME, np.uint8, chunk_bytes=0)


@pytest.mark.parametrize(
    "bad,exc,pattern",
    [
        (np.zeros((84, 84), np.uint8), ValueError, "shape"),
        (np.zeros((84, 84, 2), np.uint8), ValueError, "shape"),
        (np.zeros((84, 84, 1), np.int16), TypeError, "dtype"),
        (np.zeros((84, 84, 1), np.float32), TypeError, "dtype"),
        (np.empty((84, 84, 1), object), TypeError, "object"),
    ],
)
def test_push_bad_frame_writes_nothing(impl, bad, exc, pattern):
    pool, slots = pool_with(impl, rand_frames(2))
    before = snapshot(pool, slots)
    keep = bad.copy()
    _expect(exc, pattern, pool.push, bad)
    assert snapshot(pool, slots) == before
    many = np.stack([bad, bad])
    _expect(exc, pattern, pool.push_batch, many)
    assert snapshot(pool, slots) == before
    assert bad.dtype == keep.dtype and (bad == keep).all()
    r = pool.push(f(1))
    assert pool.live_frames == 3
    if impl_name(impl) == "compiled":
        assert r.slot == 2  # the failed calls used no slot


def test_push_batch_wrong_rank_writes_nothing(impl):
    pool = make_pool(impl)
    before = snapshot(pool)
    _expect(ValueError, "shape", pool.push_batch, np.zeros((84, 84, 1), np.uint8))
    _expect(ValueError, "shape", pool.push_batch, np.zeros((2, 84, 84, 2), np.uint8))
    assert snapshot(pool) == before


@pytest.mark.parametrize(
    "frames,exc,pattern",
    [
        ([], ValueError, "at least one"),
        ([f(0), np.zeros((84, 84, 2), np.uint8)], ValueError, "shape"),
        ([f(0), f(1, dtype=np.int16)], TypeError, "dtype"),
        ([f(0), np.empty((84, 84, 1), object)], TypeError, "object"),
        ([f(0, shape=(1, 84, 84))], ValueError, "channels-first"),
        ([f(0, shape=(84, 84))], ValueError, "channel axis"),
    ],
)
def test_lazyframes_bad_frames_write_nothing(impl, frames, exc, pattern):
    pool = impl.default_pool(FRAME, np.uint8)
    keep = impl.LazyFrames([f(9)])  # something live in the default pool
    before = snapshot(pool, keep.slots)
    copies = [np.array(a, copy=True) for a in frames]
    _expect(exc, pattern, impl.LazyFrames, frames)
    assert snapshot(pool, keep.slots) == before
    for a, b in zip(frames, copies, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_bad_layout(impl):
    pool, slots = pool_with(impl, rand_frames(2))
    before = snapshot(pool, slots)
    _expect(ValueError, "layout must be one of", pool.lazy, slots, layout="middle")
    _expect(ValueError, "layout must be one of", pool.gather, [ids(slots)], layout="middle")
    _expect(ValueError, "layout must be one of", impl.LazyFrames, [f(0)], layout="middle")
    _expect(ValueError, "layout must be one of", pool.lazy_batch, [slots], layout="")
    _expect(ValueError, "layout must be one of", pool.push_batch, np.stack([f(0)]), layout="")
    assert snapshot(pool, slots) == before


def _out_case(impl, layout="last"):
    frames = rand_frames(4, LAYOUT_SHAPES[layout])
    pool, slots = pool_with(impl, frames)
    obs = [pool.lazy(slots, layout=layout), pool.lazy(slots[::-1], layout=layout)]
    idx = np.array([ids(slots), ids(slots)[::-1]])
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
    pool, _, obs, idx, full = _out_case(impl)
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
    pool, refs = pool_with(impl, frames)
    s0, s1, s2, s3 = ids(refs)
    del refs[2]  # slot s2 is now free
    live = [s0, s1, s3]
    before = snapshot(pool, [s0, s1, s2, s3])
    out = np.full((1, 84, 84, 3), 7, np.uint8)
    n = pool.capacity
    for bad, exc, pattern in [
        ([s0, s1, s2], ValueError, f"slot {s2} is free"),
        ([s0, s1, n], IndexError, f"slot {n} is out of range"),
        ([s0, s1, -1], IndexError, "slot -1 is out of range"),
        ([s0, s1, 2**40], IndexError, "out of range"),
        ([s0, s1, -(2**40)], IndexError, "out of range"),
        ([s0, s1, 2**63 - 1], IndexError, "out of range"),
        ([s0, s1, -(2**63)], IndexError, "out of range"),
    ]:
        idx = np.array([bad])
        keep = idx.copy()
        _expect(exc, pattern, pool.gather, idx, out, layout="last")
        _expect(exc, pattern, pool.lazy, bad, layout="last")
        _expect(exc, pattern, pool.lazy_batch, [bad], layout="last")
        _expect(exc, pattern, pool.get, bad[-1])
        assert snapshot(pool, [s0, s1, s2, s3]) == before
        assert (out == 7).all()
        np.testing.assert_array_equal(idx, keep)
    _expect(IndexError, "out of range", pool.refcount, -1)
    _expect(IndexError, "out of range", pool.refcount, 2**40)
    assert pool.refcount(s2) == 0
    _expect(TypeError, "integers", pool.gather, np.array([[0.0, 1.0]]))
    _expect(TypeError, "integers", pool.lazy_batch, np.array([[0.5]]))
    _expect(ValueError, r"\(B, k\)", pool.gather, np.array(live))
    _expect(ValueError, r"\(B, k\)", pool.gather, np.zeros((1, 0), np.int64))
    _expect(ValueError, "non-empty", pool.lazy, [], layout="last")
    _expect(ValueError, "non-empty", pool.lazy, [[s0, s1]], layout="last")
    assert snapshot(pool, [s0, s1, s2, s3]) == before


@pytest.mark.parametrize(
    "dtype,scale,exc,pattern",
    [
        (np.uint8, 0.5, TypeError, "scale"),
        (np.int32, 0.5, TypeError, "scale"),
        (None, 1 / 255, TypeError, "scale"),
        (np.float32, "0.5", TypeError, "scale must be a real number"),
        (np.float32, True, TypeError, "scale must be a real number"),
        (np.bool_, None, TypeError, "cannot convert"),
        (np.float16, None, TypeError, "no fused conversion"),
        (np.complex64, None, TypeError, "no fused conversion"),
    ],
)
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
        np.testing.assert_array_equal(
            np.asarray(obs[0], dtype=dtype), np.asarray(obs[0]).astype(dtype)
        )
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
    np.testing.assert_array_equal(
        np.asarray(lz16, dtype=np.uint8), np.full(6, -2, np.int16).astype(np.uint8)
    )
    np.testing.assert_array_equal(lz16.astype(np.float64, scale=0.5), np.full(6, -1.0))


def test_stack_bad_observation_lists(impl):
    pool, slots, obs, _, _ = _out_case(impl)
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
    """Slot ids: ints, numpy ints, (nested) lists/tuples, int arrays of any width, FrameRefs."""
    frames = rand_frames(3)
    pool, refs = pool_with(impl, frames)
    a, _, c = ids(refs)
    want = np.stack([restate([frames[0], frames[2]], "last")])
    for idx in (
        [[a, c]],
        ((a, c),),
        [np.array([a, c])],
        np.array([[a, c]], np.int32),
        [[np.int64(a), np.int64(c)]],
        np.array([[a, c]], np.uint16),
    ):
        np.testing.assert_array_equal(pool.gather(idx, layout="last"), want)
        np.testing.assert_array_equal(np.asarray(pool.lazy_batch(idx, layout="last")), want)
    for row in (
        [a, c],
        (a, c),
        [np.int64(a), np.int32(c)],
        np.array([a, c], np.uint8),
        [refs[0], refs[2]],
        (refs[0], c),
    ):
        lz = pool.lazy(row, layout="last")
        np.testing.assert_array_equal(np.asarray(lz), want[0])
        del lz
    assert pool.refcount(np.int32(a)) == pool.refcount(refs[0]) == 1
    assert [pool.refcount(r) for r in refs] == [1, 1, 1] and pool.live_frames == 3
    _expect(TypeError, "integers", pool.gather, [[0, 1.5]])
    _expect(TypeError, "integers", pool.lazy, ["0"])
    assert [pool.refcount(r) for r in refs] == [1, 1, 1]


def test_slot_ids_must_be_integers(impl):
    pool = make_pool(impl)
    r = pool.push(f(1))
    for call in (pool.get, pool.refcount):
        with pytest.raises(TypeError):
            call(float(r.slot) + 0.5)
    with pytest.raises(TypeError):
        pool.lazy([float(r.slot) + 0.5])
    assert pool.refcount(r) == 1


# -- stacker steps: LazyFrames.shift and LazyBatch.shift ----------------------------------


def test_shift_shares_k_minus_1_frames_and_copies_one(impl):
    pool = make_pool(impl)
    r = pool.push(f(0))
    s = r.slot
    lz = pool.lazy([r] * 4)
    del r
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
    pool = make_pool(impl)
    lz = pool.lazy([pool.push(f(0))] * 2)
    before = snapshot(pool, lz.slots)
    with pytest.raises(ValueError, match="shape"):
        lz.shift(np.zeros((84, 84), np.uint8))
    with pytest.raises(TypeError, match="dtype"):
        lz.shift(np.zeros(FRAME, np.float32))
    assert snapshot(pool, lz.slots) == before


def _rings_model(rows, frames, restart, pad):
    """LazyBatch.shift restated on lists: the rows' new contents as frame values."""
    out = []
    for i, row in enumerate(rows):
        if restart is not None and restart[i]:
            fill = frames[i] if pad is None else pad
            out.append([fill] * (len(row) - 1) + [frames[i]])
        else:
            out.append(row[1:] + [frames[i]])
    return out


def _batch_of(pool, rows, layout="stack"):
    """A LazyBatch whose row i holds frames f(v) for the values in rows[i]."""
    refs = [[pool.push(f(v)) for v in row] for row in rows]
    return pool.lazy_batch(refs, layout=layout)


@pytest.mark.parametrize(
    "restart", [None, [False, True, False], [True, True, True], np.array([0, 1, 0], bool)]
)
@pytest.mark.parametrize("use_pad", [False, True])
def test_lazybatch_shift_equals_the_model_and_balances_references(impl, restart, use_pad):
    pool = make_pool(impl)
    rows = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    batch = _batch_of(pool, rows)
    pad = pool.push(f(0)) if use_pad else None
    keep = batch.slots.copy()
    frames = np.stack([f(20), f(21), f(22)])
    got = batch.shift(frames, restart, pad=pad)
    frames[...] = 0  # copied in once
    assert type(got) is impl.LazyBatch and got.layout == batch.layout and got is not batch
    np.testing.assert_array_equal(batch.slots, keep)  # the old batch is never written
    assert [values(pool, row) for row in batch.slots] == rows
    want = _rings_model(rows, [20, 21, 22], restart, 0 if use_pad else None)
    assert [values(pool, row) for row in got.slots] == want
    np.testing.assert_array_equal(np.asarray(got)[:, -1], np.stack([f(20), f(21), f(22)]))
    assert pool.live_frames == 12 + 3 + use_pad
    del batch  # frames only the old rows held are freed; got keeps the rest
    assert [values(pool, row) for row in got.slots] == want
    del got, pad
    assert pool.live_frames == 0


def test_lazybatch_shift_bad_input_writes_nothing(impl):
    pool = make_pool(impl)
    batch = _batch_of(pool, [[0, 1], [2, 3]])
    other = make_pool(impl)
    foreign = other.push(f(0))
    before = snapshot(pool, batch.slots.ravel())
    good = np.stack([f(5), f(6)])
    with pytest.raises(ValueError, match="frames have shape"):
        batch.shift(good[:1])
    with pytest.raises(ValueError, match="shape"):
        batch.shift(np.zeros((2, 84, 84), np.uint8))
    with pytest.raises(TypeError, match="dtype"):
        batch.shift(good.astype(np.int16))
    with pytest.raises(ValueError, match="restart has shape"):
        batch.shift(good, [True])
    with pytest.raises(ValueError, match="another pool"):
        batch.shift(good, [True, False], pad=foreign)
    with pytest.raises(TypeError):
        batch.shift(good, [True, False], pad=0)  # pad is an owner, not an int
    assert snapshot(pool, batch.slots.ravel()) == before
    assert other.refcount(foreign) == 1


def test_lazybatch_replace_takes_rows_from_another_batch(impl):
    pool = make_pool(impl)
    batch = _batch_of(pool, [[1, 2], [3, 4], [5, 6]])
    fresh = pool.push_batch(np.stack([f(8), f(9)]), k=2)
    keep = batch.slots.copy()
    got = batch.replace(np.array([2, 0]), fresh)
    assert [values(pool, row) for row in got.slots] == [[9, 9], [3, 4], [8, 8]]
    np.testing.assert_array_equal(batch.slots, keep)
    assert got.layout == batch.layout and got.stack_size == 2
    del batch, fresh
    assert pool.live_frames == 4  # 3, 4 and the two new frames (a reset row shares one)
    assert sorted(values(pool, got.slots)) == [3, 4, 8, 8, 9, 9]
    del got
    assert pool.live_frames == 0


def test_lazybatch_replace_bad_input_writes_nothing(impl):
    pool = make_pool(impl)
    batch = _batch_of(pool, [[1, 2], [3, 4], [5, 6]])
    two = _batch_of(pool, [[7, 8], [9, 10]])
    before = snapshot(pool, np.concatenate([batch.slots.ravel(), two.slots.ravel()]))
    other = make_pool(impl)
    foreign = _batch_of(other, [[1, 2], [3, 4]])
    _expect(ValueError, "", batch.replace, [0, 0], two)  # rows must be distinct
    _expect(IndexError, "", batch.replace, [0, 3], two)
    _expect(IndexError, "", batch.replace, [0, -1], two)
    _expect(IndexError, "", batch.replace, [0, 2**63 - 1], two)
    _expect(ValueError, "", batch.replace, [0], two)  # one row index for two rows
    _expect(ValueError, "another pool", batch.replace, [0, 1], foreign)
    _expect(ValueError, "", batch.replace, [0, 1], _batch_of(pool, [[1], [2]]))  # k
    _expect(ValueError, "", batch.replace, [0, 1], pool.lazy_batch(two.slots, layout="last"))
    _expect(TypeError, "", batch.replace, [0, 1], two.slots)  # ints are not an owner
    after = snapshot(pool, np.concatenate([batch.slots.ravel(), two.slots.ravel()]))
    assert after[1] == before[1] and after[0]["live_frames"] == before[0]["live_frames"]


def test_lazybatch_indexing_iteration_and_properties(impl):
    pool = make_pool(impl)
    batch = _batch_of(pool, [[1, 2, 3], [4, 5, 6]], layout="last")
    a = np.asarray(batch)
    assert a.shape == (2, 84, 84, 3) == batch.shape and batch.dtype == np.uint8
    assert (batch.ndim, batch.nbytes, len(batch)) == (4, a.nbytes, 2)
    assert type(batch[1]) is impl.LazyFrames and batch[1].slots == tuple(batch.slots[1])
    np.testing.assert_array_equal(np.asarray(batch[-1]), a[1])
    sub = batch[1:]
    assert type(sub) is impl.LazyBatch and len(sub) == 1
    np.testing.assert_array_equal(np.asarray(sub), a[1:])
    assert [o.slots for o in batch] == [tuple(r) for r in batch.slots]
    s = batch.slots
    s[...] = 0  # a copy: the batch's own ids cannot be written through it
    np.testing.assert_array_equal(np.asarray(batch), a)
    assert repr(batch).startswith("LazyBatch(")


# -- SlotTable: the replay buffer's reference-owning store --------------------------------


def _table(impl, pool, rows=4, width=4):
    t = impl.SlotTable(pool, rows, width)
    assert t.pool is pool and t.shape == (rows, width) and len(t) == rows
    return t


def test_slot_table_step_fields_are_the_one_step_targets(impl):
    table = _table(impl, make_pool(impl), rows=6)
    flags = np.array([0, 1, 2, 3, 4, 5], np.uint8)  # bit 0 terminated, bit 1 truncated
    rewards = np.linspace(-1, 1, 6, dtype=np.float32)
    rows = np.array([5, 0, 3, 3, 1, 2])
    r, d, t, g = table.step_fields(rows, flags, rewards, 0.99)
    np.testing.assert_array_equal(r, rewards[rows])
    np.testing.assert_array_equal(d, [1, 0, 1, 1, 1, 0])
    np.testing.assert_array_equal(t, [0, 0, 1, 1, 0, 1])
    np.testing.assert_array_equal(g, np.full(6, 0.99, np.float32))
    assert all(a.dtype == np.float32 and a.shape == (6,) for a in (r, d, t, g))
    assert table.step_fields([], flags, rewards, 0.5)[0].shape == (0,)
    for bad in ([6], [-1]):
        with pytest.raises(IndexError):
            table.step_fields(bad, flags, rewards, 0.99)
    for fl, rw in [
        (flags[:5], rewards),  # fewer entries than rows
        (flags.astype(np.int8), rewards),
        (flags, rewards.astype(np.float64)),
        (flags, np.linspace(0, 1, 12, dtype=np.float32)[::2]),  # not contiguous
        (list(flags), rewards),
    ]:
        with pytest.raises(TypeError, match="flags and rewards"):
            table.step_fields(rows, fl, rw, 0.99)


def test_slot_table_starts_empty_and_set_takes_then_drops_references(impl):
    pool = make_pool(impl)
    a = [pool.push(f(v)) for v in range(4)]
    sa = ids(a)
    table = _table(impl, pool)
    np.testing.assert_array_equal(table.ids(), np.full((4, 4), -1))
    assert table.ids().dtype == np.int64 and table.memory() == 4 * 4 * 4
    obs = pool.lazy_batch([a[:2], a[1:3]], layout="stack")
    nxt = pool.lazy_batch([a[1:3], a[2:4]], layout="last")  # parts may differ in layout
    table.set([1, 2], (obs, nxt))
    np.testing.assert_array_equal(table.ids([1, 2]), np.hstack([obs.slots, nxt.slots]))
    assert (table.ids()[[0, 3]] == -1).all()
    # FrameRef + two batches + table
    assert [pool.refcount(s) for s in sa] == [
        1 + 1 + 0 + 1,
        1 + 2 + 1 + 3,
        1 + 1 + 2 + 3,
        1 + 0 + 1 + 1,
    ]
    one = pool.lazy([a[3], a[3]], layout="stack")
    table.set(np.array([1]), (one, one))  # a LazyFrames part: E = 1, row 1 only
    assert table.ids([1]).tolist() == [[sa[3]] * 4]
    # row 1 held a0 a1 a1 a2 (dropped) and now a3 x4; `one` holds a3 x2
    assert [pool.refcount(s) for s in sa] == [3 - 1, 7 - 2, 7 - 1, 3 + 2 + 4]
    del obs, nxt, one, a
    assert pool.live_frames == 3  # row 2 still holds a1 a2 a2 a3, row 1 a3
    table.clear([2])
    assert (table.ids([2]) == -1).all() and pool.live_frames == 1
    assert pool.refcount(sa[3]) == 4
    table.clear()
    assert (table.ids() == -1).all() and pool.live_frames == 0


def test_slot_table_grow_keeps_rows_and_references(impl):
    pool = make_pool(impl)
    table = _table(impl, pool, rows=2, width=2)
    a = [pool.push(f(v)) for v in (1, 2, 3)]
    table.set([0, 1], (pool.lazy_batch([a[:2], a[1:]]),))
    del a
    before = table.ids().tolist()
    counts = [pool.refcount(s) for s in range(3)]
    with pytest.raises(ValueError, match="grows only"):
        table.grow(1)
    with pytest.raises(ValueError, match="too large"):
        table.grow(2**62)
    table.grow(2)  # no change
    table.grow(5)
    assert table.shape == (5, 2) and table.memory() == 5 * 2 * 4
    assert table.ids().tolist() == before + [[-1, -1]] * 3
    assert [pool.refcount(s) for s in range(3)] == counts
    b = [pool.push(f(v)) for v in (7, 8)]
    table.set([4], (pool.lazy_batch([b]),))
    del b
    assert values(pool, table.ids([0, 4])) == [1, 2, 7, 8]
    assert table.gather([4, 1], 0, 2, layout="stack")[:, :, 0, 0, 0].tolist() == [[7, 8], [2, 3]]
    del table
    gc.collect()
    assert pool.live_frames == 0


def test_slot_table_grow_from_a_callback_of_set(impl):
    """Rows checked before a callback grows the table stay valid: grow only adds rows."""
    pool = make_pool(impl)
    table = _table(impl, pool, rows=2, width=2)
    a = [pool.push(f(v)) for v in (1, 2, 3)]
    part = pool.lazy_batch([a[:2], a[1:]])
    del a

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


def test_slot_table_set_keeps_an_id_present_in_old_and_new_rows(impl):
    pool = make_pool(impl)
    table = _table(impl, pool, rows=2, width=2)
    table.set([0], (pool.push_batch(np.stack([f(5)]), k=2),))
    s = int(table.ids()[0, 0])
    assert pool.live_frames == 1 and pool.refcount(s) == 2
    # the table is the only owner; re-set the row from a batch made of its own ids
    table.set([0], (table.batch([0], 0, 2),))
    assert pool.refcount(s) == 2 and values(pool, table.ids([0])) == [5, 5]
    table.clear()
    assert pool.live_frames == 0


def test_slot_table_batch_and_gather(impl):
    pool = make_pool(impl)
    table = _table(impl, pool, rows=3, width=5)
    src = _batch_of(pool, [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    table.set([2, 0], (src,))
    del src
    b = table.batch([0, 2], 1, 4)
    assert b.layout == "stack" and b.slots.shape == (2, 3)
    assert [values(pool, row) for row in b.slots] == [[7, 8, 9], [2, 3, 4]]
    b2 = table.batch(np.array([2]), 3, 5, layout="last")
    assert b2.layout == "last" and values(pool, b2.slots) == [4, 5]
    want = restate([f(7), f(8), f(9)], "last")
    got = table.gather([0, 0], 1, 4)
    np.testing.assert_array_equal(got, np.stack([want, want]))
    out = np.zeros((1, 3, 84, 84, 1), np.float32)
    assert table.gather([2], 0, 3, out, layout="stack", scale=0.5) is out
    np.testing.assert_array_equal(out[0], np.stack([f(1), f(2), f(3)]).astype(np.float32) * 0.5)
    table.clear()
    assert pool.live_frames == 7  # b and b2 keep their frames: 7 8 9, 2 3 4, 4 5
    del b, b2
    assert pool.live_frames == 0


def test_slot_table_bad_input_writes_nothing(impl):
    pool = make_pool(impl)
    table = _table(impl, pool, rows=3, width=4)
    part = _batch_of(pool, [[1, 2], [3, 4]])
    table.set([0, 1], (part, part))
    state = lambda: (table.ids().tolist(), snapshot(pool, part.slots.ravel()))  # noqa: E731
    before = state()
    other = make_pool(impl)
    foreign = _batch_of(other, [[1, 2], [3, 4]])
    _expect(ValueError, "", table.set, [1, 1], (part, part))  # duplicate rows
    _expect(IndexError, "", table.set, [0, 3], (part, part))
    _expect(IndexError, "", table.set, [0, -1], (part, part))
    _expect(IndexError, "", table.set, [0, 2**63 - 1], (part, part))
    _expect(IndexError, "", table.set, [0, -(2**63)], (part, part))
    _expect(ValueError, "", table.set, [0, 1], (part,))  # 2 ids per row, width 4
    _expect(ValueError, "", table.set, [0, 1, 2], (part, part))  # 3 rows, parts of 2
    _expect(ValueError, "another pool", table.set, [0, 1], (part, foreign))
    _expect(TypeError, "", table.set, [0, 1], (part, part.slots))  # ints are not an owner
    _expect(TypeError, "", table.set, [0.5, 1], (part, part))
    _expect(ValueError, "row 2 is empty", table.batch, [0, 2], 0, 2)
    _expect(ValueError, "row 2 is empty", table.gather, [2], 0, 2)
    _expect(IndexError, "", table.batch, [3], 0, 2)
    for start, stop in ((0, 5), (-1, 2), (2, 2), (3, 1)):
        with pytest.raises((ValueError, IndexError)):
            table.batch([0], start, stop)
    _expect(IndexError, "", table.clear, [3])
    _expect(IndexError, "", table.ids, [2**63 - 1])
    _expect(ValueError, "another pool", impl.SlotTable(other, 2, 4).set, [0, 1], (part, part))
    assert state() == before
    for rows, width in ((-1, 2), (2, 0)):
        with pytest.raises(ValueError, match="a SlotTable needs"):
            impl.SlotTable(pool, rows, width)
    with pytest.raises(TypeError):
        impl.SlotTable(object(), 2, 2)
    with pytest.raises(TypeError):
        pickle.dumps(table)


# -- SlotTable.gather_pairs: a replay sample's obs and next_obs, row-interleaved -----------


@pytest.mark.parametrize("layout", ["last", "stack"])
def test_gather_pairs_equals_two_gathers(impl, layout):
    pool = make_pool(impl, (84, 84, 1) if layout == "last" else (84, 84))
    rows = [[pool.push(fr) for fr in rand_frames(8, pool.frame_shape, seed=r)] for r in range(3)]
    table = _table(impl, pool, rows=3, width=8)
    table.set([0, 1, 2], (pool.lazy_batch(rows),))
    rng = np.random.default_rng(0)
    r1, r2 = rng.integers(0, 3, 5), rng.integers(0, 3, 5)
    got = table.gather_pairs(r1, (0, 4), r2, (1, 5), layout=layout, dtype=np.float32, scale=0.5)
    want = (
        table.gather(r1, 0, 4, layout=layout, dtype=np.float32, scale=0.5),
        table.gather(r2, 1, 5, layout=layout, dtype=np.float32, scale=0.5),
    )
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    outs = (np.empty_like(got[0]), np.empty_like(got[1]))
    res = table.gather_pairs(r1, (0, 4), r2, (1, 5), outs, layout=layout, scale=0.5)
    assert res[0] is outs[0] and res[1] is outs[1]
    np.testing.assert_array_equal(outs[0], want[0])
    np.testing.assert_array_equal(outs[1], want[1])


def test_gather_pairs_bad_input_writes_nothing(impl):
    pool = make_pool(impl)
    table = _table(impl, pool, rows=2, width=5)
    table.set([0], (pool.lazy([pool.push(fr) for fr in rand_frames(5)], layout="stack"),))
    good = np.zeros((1, 84, 84, 4), np.float32)
    keep = good.copy()
    before = (table.ids().tolist(), snapshot(pool, table.ids([0])[0]))
    args = ([0], (0, 4), [0], (1, 5))
    _expect(ValueError, "", table.gather_pairs, [0], (0, 4), [0], (1, 4))  # widths differ
    _expect(
        TypeError,
        "different dtypes",
        table.gather_pairs,
        *args,
        (good, np.zeros((1, 84, 84, 4), np.float64)),
    )
    _expect(ValueError, "overlap", table.gather_pairs, *args, (good, good))
    buf = np.zeros(3 * good.size // 2, np.float32)  # two well-formed outs sharing a half
    halves = (buf[: good.size].reshape(good.shape), buf[good.size // 2 :].reshape(good.shape))
    _expect(ValueError, "the two arrays of out overlap", table.gather_pairs, *args, halves)
    _expect(
        ValueError, "shape", table.gather_pairs, *args, (good, np.zeros((2, 84, 84, 4), np.float32))
    )
    _expect(ValueError, "row 1 is empty", table.gather_pairs, [0], (0, 4), [1], (1, 5))
    _expect(IndexError, "", table.gather_pairs, [0], (0, 4), [2**63 - 1], (1, 5))
    assert (table.ids().tolist(), snapshot(pool, table.ids([0])[0])) == before
    np.testing.assert_array_equal(good, keep)


# -- SlotTable.take: a checkpoint's rows from one flat batch of frames -----------------------


def test_slot_table_take_maps_flat_positions(impl):
    pool = make_pool(impl)
    source = pool.push_batch(np.stack([f(v) for v in (10, 11, 12)]))  # (3, 1): flat ids 0..2
    table = _table(impl, pool, rows=3, width=3)
    table.set([2], (pool.push_batch(np.stack([f(99)]), k=3),))
    table.take([0, 2], source, np.array([[0, 1, 2], [2, 2, -1]]))
    got = table.ids()
    assert values(pool, got[0]) == [10, 11, 12]
    assert values(pool, got[2, :2]) == [12, 12] and got[2, 2] == -1
    assert (got[1] == -1).all()
    del source
    assert pool.live_frames == 3  # 99 was dropped with the old row 2
    table.clear()
    assert pool.live_frames == 0


def test_slot_table_take_bad_input_writes_nothing(impl):
    pool = make_pool(impl)
    source = pool.push_batch(np.stack([f(v) for v in (10, 11)]), k=2)  # (2, 2): flat 0..3
    table = _table(impl, pool, rows=2, width=2)
    before = (table.ids().tolist(), snapshot(pool, source.slots.ravel()))
    other = make_pool(impl)
    foreign = other.push_batch(np.stack([f(1)]))
    for index, exc in (
        ([[0, 4]], IndexError),
        ([[0, -2]], IndexError),
        ([[0, 2**63 - 1]], IndexError),
        ([[0, 1, 2]], ValueError),
    ):
        with pytest.raises(exc):
            table.take([0], source, np.array(index))
    _expect(ValueError, "", table.take, [0, 0], source, np.zeros((2, 2), np.int64))
    _expect(IndexError, "", table.take, [2], source, np.zeros((1, 2), np.int64))
    _expect(ValueError, "another pool", table.take, [0], foreign, np.zeros((1, 2), np.int64))
    _expect(TypeError, "", table.take, [0], source.slots, np.zeros((1, 2), np.int64))
    assert (table.ids().tolist(), snapshot(pool, source.slots.ravel())) == before


# -- _push_dedup: stacked ndarray observations cost one new frame per step ------------------


def test_push_dedup_reuses_candidates_and_earlier_frames(impl):
    pool = make_pool(impl)
    prev = pool.lazy_batch([[pool.push(f(v)) for v in (1, 2, 3, 4)]])
    # the next stacked observation: 2 3 4 5 -> only frame 5 is new
    got = pool._push_dedup(np.stack([f(2), f(3), f(4), f(5)])[None], prev)
    assert type(got) is impl.LazyBatch and got.layout == "stack"
    assert got.slots[0, :3].tolist() == prev.slots[0, 1:].tolist()
    assert pool.live_frames == 5
    # reset padding 9 9 9 9, no candidates: one frame stored, shared four times
    pad = pool._push_dedup(np.stack([f(9)] * 4)[None])
    assert len(set(pad.slots[0].tolist())) == 1 and pool.live_frames == 6
    assert values(pool, got.slots[0]) == [2, 3, 4, 5]
    del got, pad, prev
    assert pool.live_frames == 0


def test_push_dedup_bad_input_writes_nothing(impl):
    pool = make_pool(impl)
    prev = pool.lazy_batch([[pool.push(f(1))]])
    before = snapshot(pool, prev.slots.ravel())
    good = np.stack([f(1)])[None]
    other = make_pool(impl)
    with pytest.raises(ValueError, match="expected"):
        pool._push_dedup(good[0])
    with pytest.raises(TypeError, match="dtype"):
        pool._push_dedup(good.astype(np.int16))
    with pytest.raises(ValueError, match="candidates"):
        pool._push_dedup(np.concatenate([good, good]), prev)  # 2 rows, 1 candidate row
    with pytest.raises(TypeError):
        pool._push_dedup(good, prev.slots)  # candidates are an owner, not ints
    with pytest.raises(ValueError, match="another pool"):
        pool._push_dedup(good, other.lazy_batch([[other.push(f(1))]]))
    assert snapshot(pool, prev.slots.ravel()) == before


# -- found by a fresh user: each of these crashed the compiled core or misbehaved -------


def test_stack_rejects_same_shape_from_other_geometry(impl):
    a = impl.LazyFrames([f(i) for i in range(4)])  # (84, 84, 4): 4 frames of (84, 84, 1)
    b = impl.LazyFrames([f(9, (84, 84, 4))])  # (84, 84, 4): 1 frame of (84, 84, 4)
    assert a.shape == b.shape
    for batch in ([a, b], [b, a]):
        with pytest.raises(
            ValueError, match=r"4 frames of \(84, 84, 1\).*1 frames of|1 frames of .*4 frames"
        ):
            impl.stack(batch)
    np.testing.assert_array_equal(np.array([b, a])[1], restate([f(i) for i in range(4)], "last"))


def _copy_out_racing_drop(impl, pool, want):
    """One round: copy out of three kinds of owners while another thread drops them all."""
    refs = [pool.push(f(v)) for v in range(4)]
    lst = [pool.lazy(refs) for _ in range(300)]
    idx = np.array([ids(refs)] * 300, np.int64)
    table = impl.SlotTable(pool, 300, 4)
    table.set(np.arange(300), (pool.lazy_batch(idx, layout="last"),))
    calls = (
        lambda: impl.stack(lst, dtype=np.float64),
        lambda: pool.gather(idx, dtype=np.float64),
        lambda: table.gather(np.arange(300), 0, 4, dtype=np.float64),
    )
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


def test_copies_out_hold_references_while_copying(impl):
    # The copy runs without the GIL. Another thread dropping the owners meanwhile (clearing
    # the caller's list, the FrameRefs, or the table's rows) must not free the frames being
    # read: each copy-out gives the right values, or refuses a freed id cleanly.
    pool = make_pool(impl)
    want = restate([f(v) for v in range(4)], "last").astype(np.float64)
    for _ in range(20):
        _copy_out_racing_drop(impl, pool, want)
    gc.collect()
    assert pool.live_frames == 0


def test_lazybatch_pickles_and_copies_sharing_frames(impl):
    pool = make_pool(impl)
    s = [pool.push(f(v)) for v in range(5)]
    batch = pool.lazy_batch([s[0:4], s[1:5]], layout="last")
    want = np.asarray(batch)
    for other in (copy.copy(batch), copy.deepcopy(batch), batch.copy()):
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
