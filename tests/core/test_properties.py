"""Hypothesis: every copy out equals the NumPy oracle's, bit for bit; refused ones write nothing."""

import gc

import numpy as np
import pytest
from conftest import refused
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from oracle import core as ref

from lazyframes import _core as core

LAYOUTS = ("last", "first", "stack")
DTYPES = [np.uint8, np.int16, np.float32, np.float64, np.bool_]
TARGETS = [np.uint8, np.int16, np.int32, np.int64, np.uint16, np.float32, np.float64, np.bool_]
NAMED_SHAPES = [(84, 84), (84, 84, 1), (1, 84, 84), (7,), (3,)]
BIG_SHAPE = (210, 160, 3)
SCALES = [1 / 255, 0.5, 2.0, -1.5, 1e-3, 3, 255.0]

fixture_ok = settings(
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
# the tests against the restatement draw big cases: a third of the profile's examples each
differential = settings(
    max_examples=max(10, settings.default.max_examples // 3),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def random_frames(rng, n, shape, dtype):
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, (n,) + shape).astype(bool)
    if dt.kind == "f":
        a = (rng.standard_normal((n,) + shape) * 300).astype(dt)
        if a.size:
            a.flat[0] = -0.0
        return a
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, (n,) + shape, dtype=dt, endpoint=True)


@st.composite
def frame_shapes(draw):
    kind = draw(st.integers(0, 19))
    if kind == 0:
        return BIG_SHAPE  # rare: big frames are slow to draw and compare
    if kind < 8:
        return draw(st.sampled_from(NAMED_SHAPES))
    return tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=4)))


@st.composite
def conversions(draw, src):
    """A supported conversion of ``src``: (dtype or None, scale or None)."""
    src = np.dtype(src)
    targets = [None] + [t for t in TARGETS if np.can_cast(src, t, casting="same_kind")]
    dst = draw(st.sampled_from(targets))
    out_dt = src if dst is None else np.dtype(dst)
    if out_dt.kind != "f" or not draw(st.booleans()):
        return dst, None
    finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)
    return dst, draw(st.one_of(st.sampled_from(SCALES), finite))


@st.composite
def cases(draw):
    shape = draw(frame_shapes())
    dtype = draw(st.sampled_from(DTYPES))
    big = shape == BIG_SHAPE or np.prod(shape) > 5000
    k = draw(st.integers(1, 4 if big else 16))
    batch = draw(st.integers(1, 2 if big else 4))
    n = draw(st.integers(1, k + 2))
    row = st.lists(st.integers(0, n - 1), min_size=k, max_size=k)
    idx = draw(st.lists(row, min_size=batch, max_size=batch))
    layout = draw(st.sampled_from(LAYOUTS))
    conv = draw(conversions(dtype))
    seed = draw(st.integers(0, 2**32 - 1))
    chunk_bytes = draw(st.sampled_from([1, 3 * 64, 1 << 20]))
    return shape, dtype, n, np.array(idx, np.int64), layout, conv, seed, chunk_bytes


def run(shape, dtype, frames, idx, layout, conv, chunk_bytes):
    """Everything the core produces for a case, or the exception it raises."""
    dst, scale = conv
    try:
        pool = core.FramePool(shape, dtype, chunk_bytes=chunk_bytes)
        owner = pool.push_batch(frames)
        slots = owner.slots[:, 0]
        g = pool.gather(slots[idx], layout=layout, dtype=dst, scale=scale)
        obs = [pool.lazy(slots[row], layout=layout) for row in idx]
        s = core.stack(obs, dtype=dst, scale=scale)
        out = np.full(g.shape, 1, g.dtype)
        s2 = core.stack(obs, out, dtype=dst, scale=scale)
        assert s2 is out
        one = obs[0].astype(dst if dst is not None else dtype, scale=scale)
        arr = np.asarray(obs[0])
        batch = pool.lazy_batch(slots[idx], layout=layout)
        b = batch.numpy(np.full(g.shape, 1, g.dtype), dtype=dst, scale=scale)  # into an out
        plain = (np.asarray(batch), np.array(obs))  # the NumPy protocol, unconverted
        live = pool.live_frames
        refcounts = sorted(pool.refcount(int(x)) for x in slots)
        del owner, obs, batch
        gc.collect()
        live_after = pool.live_frames
        return ("ok", (g, s, out, b), one, arr, plain, live, refcounts, live_after)
    except (ValueError, TypeError, IndexError) as e:
        return ("error", type(e), str(e))


def check_against_numpy(res, frames, idx, layout, conv):
    dst, scale = conv
    if res[0] == "error":
        # only layouts that do not fit the frame shape may fail here
        assert res[1] is ValueError and "layout" in res[2], res
        return False
    _, copies, one, arr, plain, live, refcounts, live_after = res
    want = ref.gather(list(frames), idx, layout, dst, scale)
    for got in copies:
        np.testing.assert_array_equal(got, want, strict=True)
        assert got.tobytes() == want.tobytes()  # bit for bit, signed zeros included
    np.testing.assert_array_equal(one, want[0])
    unconverted = ref.gather(list(frames), idx, layout, None, None)
    np.testing.assert_array_equal(arr, unconverted[0])
    for got in plain:
        assert got.tobytes() == unconverted.tobytes() and got.dtype == unconverted.dtype
    assert live_after == 0 and live == len(frames)
    uses = np.bincount(idx.ravel(), minlength=len(frames))
    assert refcounts == sorted(1 + 2 * uses)  # push_batch's, and one per use in obs, batch
    return True


@differential
@given(case=cases())
def test_core_matches_numpy_restatement(case):
    shape, dtype, n, idx, layout, conv, seed, chunk_bytes = case
    frames = random_frames(np.random.default_rng(seed), n, shape, dtype)
    note(f"shape={shape} dtype={np.dtype(dtype)} layout={layout} idx={idx.tolist()} conv={conv}")
    res = run(shape, dtype, frames, idx, layout, conv, chunk_bytes)
    check_against_numpy(res, frames, idx, layout, conv)


@st.composite
def any_conversions(draw):
    """Any (dtype, scale), supported or not; with an ``out`` of a right or wrong kind."""
    dst = draw(st.sampled_from([None, *TARGETS, np.float16, np.complex64, np.int8]))
    scale = draw(st.sampled_from([None, None, 0.5, 1 / 255, 2, "x", True]))
    return dst, scale


@differential
@given(
    case=cases(),
    conv=any_conversions(),
    out_kind=st.sampled_from(["none", "right", "shape", "dtype", "fortran", "readonly", "list"]),
)
def test_refused_conversions_and_outs_write_nothing(case, conv, out_kind):
    shape, dtype, n, idx, layout, _, seed, chunk_bytes = case
    frames = random_frames(np.random.default_rng(seed), n, shape, dtype)
    dst, scale = conv
    note(f"shape={shape} dtype={np.dtype(dtype)} layout={layout} conv={conv} out={out_kind}")

    def go():
        pool = core.FramePool(shape, dtype, chunk_bytes=chunk_bytes)
        owner = pool.push_batch(frames)
        slots = owner.slots[:, 0]
        try:
            try:
                full = (len(idx),) + pool.lazy(slots[idx[0]], layout=layout).shape
            except ValueError:
                full = (len(idx), 1)
            out_dt = np.dtype(dst) if dst is not None else np.dtype(dtype)
            out = {"none": None, "right": np.zeros(full, out_dt), "list": [[0]],
                   "shape": np.zeros(full[:-1] + (full[-1] + 1,), out_dt),
                   "dtype": np.zeros(full, np.complex128), "readonly": np.zeros(full, out_dt),
                   "fortran": np.asfortranarray(np.zeros(full + (2,), out_dt))[..., 0],
                   }[out_kind]  # fmt: skip
            if out_kind == "readonly":
                out.flags.writeable = False
            keep = None if out is None or isinstance(out, list) else out.copy()
            try:
                res = pool.gather(slots[idx], out, layout=layout, dtype=dst, scale=scale)
                return res.copy()
            except Exception:
                if keep is not None:
                    assert out.tobytes() == keep.tobytes(), "out written by a failed call"
                assert pool.live_frames == len(frames)
                raise
        finally:
            del owner
            assert pool.live_frames == 0

    try:
        res = go()
    except (TypeError, ValueError):
        return
    want = ref.gather(list(frames), idx, layout, dst, scale)
    assert res.dtype == want.dtype and res.tobytes() == want.tobytes()


@fixture_ok
@given(
    layout=st.sampled_from(LAYOUTS),
    shape=st.sampled_from(NAMED_SHAPES + [(2, 3, 2)]),
    dtype=st.sampled_from(DTYPES),
    k=st.integers(1, 16),
)
def test_lazyframes_from_list_matches_restatement(layout, shape, dtype, k):
    frames = list(random_frames(np.random.default_rng(k), k, shape, dtype))
    if layout != "stack" and len(shape) == 2:
        refused(ValueError, "no channel axis", core.LazyFrames, frames, layout=layout)
        return
    if layout != "stack" and len(shape) >= 3 and shape[-1 if layout == "last" else 0] > min(shape):
        with pytest.raises(ValueError, match="would glue them along a spatial axis"):
            core.LazyFrames(frames, layout=layout)
        return
    lz = core.LazyFrames(frames, layout=layout)
    want = ref.observation(frames, layout)
    a = np.asarray(lz)
    assert a.shape == want.shape == lz.shape and a.dtype == want.dtype == lz.dtype
    np.testing.assert_array_equal(a, want)
    assert len(lz) == len(want) and lz.count() == want.shape[-1]
    i = k % want.shape[-1]
    np.testing.assert_array_equal(lz.frame(i), want[..., i])
