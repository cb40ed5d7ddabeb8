"""Cases C01-C10 of the fault catalogue, exact values (C08's wrapper part: the wrapper tests)."""

import gc
import pickle
import tracemalloc
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import f, raised, refused

from bench.baselines import BaselinesLazyFrames
from lazyframes import _core as core

FB = 84 * 84  # bytes of f(v)


def retained_by(fn):
    """Bytes of Python allocations ``fn()`` leaves behind (traced, cycles collected)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        fn()
        gc.collect()
        return sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    finally:
        tracemalloc.stop()


def test_c01_indexing_follows_the_layout():
    lz = core.LazyFrames([f(0), f(1), f(2), f(3)])
    a = np.asarray(lz)
    assert a.shape == (84, 84, 4) and len(lz) == 84
    assert lz.count() == 4 and lz[0].shape == (84, 4)
    for key in (0, 83, -1, slice(None), slice(2, 5), slice(None, None, -7), (0, 1),
                (5, slice(None), 2), (Ellipsis, 3), (slice(1, 3), 4, slice(None))):  # fmt: skip
        np.testing.assert_array_equal(lz[key], a[key], strict=True)
    fr = lz.frame(3)
    assert fr.shape == (84, 84) and fr.dtype == np.uint8 and (fr == 3).all()
    np.testing.assert_array_equal(a[..., 2], np.full((84, 84), 2, np.uint8))
    lz = core.LazyFrames([f(v, shape=(84, 84)) for v in range(4)], layout="stack")  # a new axis
    assert len(lz) == 4 and lz.shape == (4, 84, 84)
    for i in range(4):
        assert lz[i].shape == (84, 84) and (lz[i] == i).all()
    np.testing.assert_array_equal(lz[-1], np.full((84, 84), 3, np.uint8))
    lz1 = core.LazyFrames([f(v) for v in range(4)], layout="stack")
    assert len(lz1) == 4 and lz1[2].shape == (84, 84, 1) and (lz1[2] == 2).all()


def test_c03_array_like_without_materialising():
    pool = core.FramePool((84, 84, 1), np.uint8)
    refs = [pool.push(f(v)) for v in range(4)]
    lz = pool.lazy(refs, layout="last")
    del refs  # the observation is the frames' only owner now
    meta = []  # reading the metadata allocates no observation
    assert (
        retained_by(lambda: meta.append((lz.shape, lz.dtype, lz.ndim, lz.size, lz.nbytes))) < 4 * FB
    )
    a = np.asarray(lz)
    assert meta == [(a.shape, a.dtype, a.ndim, a.size, a.nbytes)]
    space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gymnasium warns it casts non-ndarrays
        assert space.contains(lz)
    f32 = lz.astype(np.float32)
    np.testing.assert_array_equal(f32, a.astype(np.float32), strict=True)  # (84, 84, 4) float32


def test_c03_eq_is_a_bool_and_observations_are_unhashable():
    a = core.LazyFrames([f(0), f(1), f(2), f(3)])
    b = core.LazyFrames([f(0), f(1), f(2), f(3)])
    c = core.LazyFrames([f(0), f(1), f(2), f(4)])
    assert (a == b) is True and (a != b) is False
    assert (a == c) is False and (a != c) is True
    assert (a == np.asarray(b)) is True and (np.asarray(b) == a) is True
    assert type(a == b) is bool and type(np.asarray(c) != a) is bool  # one bool, not an array
    assert (np.asarray(c) == a) is False and (np.asarray(c) != a) is True
    assert (a == core.LazyFrames([f(0), f(1), f(2)])) is False  # same values, other shape
    assert (a == np.asarray(a).reshape(84, 4, 84)) is False
    assert (a == 3) is False and (a != "x") is True
    for x in (a, core.LazyFrames([f(0)] * 2, layout="stack").copy()):
        refused(TypeError, "unhashable", hash, x)


def test_c04_numpy2_protocol():
    lz = core.LazyFrames([f(0), f(1), f(2), f(3)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a, b = np.asarray(lz), np.array(lz)
        c = np.asarray(lz, dtype=np.float32)
        d = np.array([lz, lz])  # C02: a list of observations converts
    ref = np.concatenate([f(0), f(1), f(2), f(3)], axis=-1)
    for got, want in ((a, ref), (b, ref), (c, ref.astype(np.float32)), (d, np.stack([ref, ref]))):
        np.testing.assert_array_equal(got, want, strict=True)
    msg = raised(ValueError, np.array, lz, copy=False)
    assert msg and all(s in msg for s in ("np.asarray(obs)", "copy=False", "lazyframes.stack"))
    with pytest.raises(ValueError, match=r"np\.asarray\(obs\)"):
        np.array([np.array(lz, copy=False)])  # the old idiom gets the same advice


@pytest.mark.parametrize("convert", [torch.as_tensor, torch.tensor])
def test_c05_torch_converts_right(convert):
    lz = core.LazyFrames([f(0), f(1), f(2), f(3)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: "list of ndarrays is slow"
        t = convert(lz)
    assert isinstance(t, torch.Tensor) and tuple(t.shape) == (84, 84, 4) and t.dtype == torch.uint8
    np.testing.assert_array_equal(t.numpy(), np.asarray(lz))


def test_c05_documented_fast_paths():
    obs = [core.LazyFrames([f(v + i) for v in range(4)]) for i in range(3)]
    t = torch.from_numpy(np.asarray(obs[0]))
    assert tuple(t.shape) == (84, 84, 4) and t.dtype == torch.uint8
    np.testing.assert_array_equal(t.numpy(), np.asarray(obs[0]))
    batch = torch.empty((3, 84, 84, 4), dtype=torch.float32)
    res = core.stack(obs, out=batch.numpy(), scale=1 / 255)
    assert np.shares_memory(res, batch.numpy())  # filled in place, no extra copy
    want = np.stack([np.asarray(o) for o in obs]).astype(np.float32) * np.float32(1 / 255)
    np.testing.assert_array_equal(batch.numpy(), want)
    tb = torch.empty((3, 84, 84, 4), dtype=torch.uint8)
    core.stack(obs, out=tb.numpy())
    np.testing.assert_array_equal(tb.numpy(), np.stack([np.asarray(o) for o in obs]))


def test_c06_layout_is_explicit():
    first = [f(v, shape=(1, 84, 84)) for v in range(4)]
    last = [f(v) for v in range(4)]
    flat = [f(v, shape=(84, 84)) for v in range(4)]
    # the baselines default on channels-first frames would glue along the width: rejected
    refused(ValueError, r"\(1, 84, 84\).*channels-first.*layout='first'", core.LazyFrames, first)
    stacked_first = core.LazyFrames(first, layout="first")
    assert stacked_first.shape == np.asarray(stacked_first).shape == (4, 84, 84)
    assert core.LazyFrames(last).shape == (84, 84, 4)
    refused(ValueError, r"channels-last.*layout='last'", core.LazyFrames, last, layout="first")
    for layout in ("last", "first"):
        refused(ValueError, "no channel axis", core.LazyFrames, flat, layout=layout)
    np.testing.assert_array_equal(np.asarray(core.LazyFrames(flat, layout="stack")), np.stack(flat))
    np.testing.assert_array_equal(np.asarray(stacked_first), np.concatenate(first, axis=0))
    np.testing.assert_array_equal(
        np.asarray(core.LazyFrames(first, layout="stack")), np.stack(first)
    )
    pool = core.FramePool((1, 84, 84), np.uint8)
    s = [pool.push(a) for a in first]
    with pytest.raises(ValueError, match="channels-first"):
        pool.lazy(s)  # default layout is "last": rejected for channels-first frames
    refused(ValueError, "channels-first", pool.gather, [[r.slot for r in s]])
    refused(ValueError, "channels-first", pool.lazy_batch, [s], layout="last")


def test_c07_rgb_frames_stack_by_frame_depth():
    frames = [np.full((210, 160, 3), v, np.uint8) for v in (10, 11, 12)]
    lz = core.LazyFrames(frames)
    a = np.asarray(lz)
    assert a.shape == (210, 160, 9) and lz.count() == 9
    assert a[0, 0].tolist() == [10, 10, 10, 11, 11, 11, 12, 12, 12]
    assert (a == np.array([10, 10, 10, 11, 11, 11, 12, 12, 12], np.uint8)).all()
    assert [int(lz.frame(i)[5, 7]) for i in range(9)] == [10, 10, 10, 11, 11, 11, 12, 12, 12]
    # distinct channel values too: channel c of frame j lands at j*3 + c
    rgb = [
        np.stack([np.full((4, 5), 10 * j + c, np.uint8) for c in range(3)], -1) for j in range(3)
    ]
    got = np.asarray(core.LazyFrames(rgb))
    assert got[2, 3].tolist() == [0, 1, 2, 10, 11, 12, 20, 21, 22]
    np.testing.assert_array_equal(got, np.concatenate(rgb, axis=-1))


def test_c08_vector_frames():
    frames = [np.array([-1.0, 0.5, 1.0], np.float32) * (v / 4) for v in range(1, 5)]
    st = core.LazyFrames(frames, layout="stack")
    assert st.shape == (4, 3) and st.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(st), np.stack(frames))
    cat = core.LazyFrames(frames)
    assert cat.shape == (12,) and cat.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(cat), np.concatenate(frames))
    assert core.LazyFrames(frames, layout="first").shape == (12,)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert gym.spaces.Box(-1.0, 1.0, (4, 3), np.float32).contains(st)
        assert gym.spaces.Box(-1.0, 1.0, (12,), np.float32).contains(cat)


C09_FRAMES = [f(v % 256) for v in range(103)]


def test_c09_conversion_never_retains_a_copy():
    frames, pool = C09_FRAMES, core.FramePool((84, 84, 1), np.uint8)
    refs = [pool.push(a) for a in frames]
    obs = [pool.lazy(refs[i : i + 4], layout="last") for i in range(100)]
    del refs
    assert pool.live_frames == 103 and pool.live_bytes == 726_768
    before = pool.stats()
    for i, o in enumerate(obs):
        a = np.asarray(o)
        assert a.shape == (84, 84, 4) and a[0, 0].tolist() == [i, i + 1, i + 2, i + 3]
    del a
    assert pool.stats() == before and pool.live_bytes == 726_768
    # converting again keeps nothing: far below one frame, let alone 100 materialised stacks
    assert retained_by(lambda observations=obs: [np.asarray(o) for o in observations]) < FB
    del obs, o
    assert pool.live_frames == 0


def test_c09_lazyframes_from_lists_store_103_frames():
    pool = core.default_pool((84, 84, 1), np.uint8)
    gc.collect()
    base = pool.live_bytes
    obs = [core.LazyFrames(C09_FRAMES[i : i + 4]) for i in range(100)]
    for o in obs:
        np.asarray(o)
    assert pool.live_bytes - base == 726_768  # each array stored once, nothing kept
    del obs, o
    assert pool.live_bytes == base


def _baselines_held(observations):
    """Bytes a list of baselines LazyFrames holds: cached ``_out`` + unique live frames."""
    frames, out = {}, 0
    for o in observations:
        if o._out is not None:
            out += o._out.nbytes
        for a in o._frames or ():
            frames[id(a)] = a.nbytes
    return out + sum(frames.values())


def test_c09_baselines_lazyframes_grow_3_9x():
    obs = [BaselinesLazyFrames(C09_FRAMES[i : i + 4]) for i in range(100)]
    before = _baselines_held(obs)
    assert before == 726_768
    for o in obs:
        np.asarray(o)
    after = _baselines_held(obs)
    assert after == 100 * 84 * 84 * 4 == 2_822_400
    assert round(after / before, 1) == 3.9


@pytest.mark.parametrize(
    "layout,shape", [("last", (84, 84, 1)), ("first", (1, 84, 84)), ("stack", (84, 84))]
)
def test_c10_pickle_shares_frames_within_one_dump(layout, shape):
    frames = [f(v, shape=shape) for v in range(5)]
    a = core.LazyFrames(frames[0:4], layout=layout)
    b = core.LazyFrames(frames[1:5], layout=layout)
    data = pickle.dumps([a, b])
    assert 5 * FB <= len(data) < 6 * FB  # 5 frames stored, not 8
    pool = core.default_pool(shape, np.uint8)
    gc.collect()
    base = pool.live_frames
    a2, b2 = pickle.loads(data)
    assert pool.live_frames - base == 5  # the restored observations share 3 frames again
    for x, y in ((a, a2), (b, b2)):
        assert type(y) is type(x)
        assert (y.shape, y.dtype, y.layout, y.stack_size) == (x.shape, x.dtype, x.layout,
                                                              x.stack_size)  # fmt: skip
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
    assert a2.slots[1:] == b2.slots[:3]
    # separate dumps round-trip exactly too (each stores its own 4 frames)
    da, db = pickle.dumps(a), pickle.dumps(b)
    assert 4 * FB <= len(da) < 5 * FB and 4 * FB <= len(db) < 5 * FB
    for x, d in ((a, da), (b, db)):
        y = pickle.loads(d)
        assert (y.shape, y.dtype, y.layout) == (x.shape, x.dtype, x.layout)
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
    del a2, b2, y
    gc.collect()
    assert pool.live_frames == base


def test_c10_pickle_other_dtypes_and_protocols():
    frames = [np.arange(6, dtype=np.float64).reshape(2, 3) * v for v in range(3)]
    lz = core.LazyFrames(frames, layout="stack")
    for proto in range(2, pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(lz, protocol=proto))
        assert back.dtype == np.float64 and back.shape == (3, 2, 3) and back.layout == "stack"
        np.testing.assert_array_equal(np.asarray(back), np.stack(frames))
