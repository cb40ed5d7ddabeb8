"""Property tests of the core (hypothesis).

(a) Differential: the compiled core and the NumPy twin against a plain restatement with
    ``np.concatenate`` / ``np.stack`` (+ ``astype`` and ``* dtype(scale)``), for every layout,
    several dtypes and frame shapes, stack sizes 1-16 and fused conversions; and the two
    cores against each other, including the exception type and message when a layout,
    conversion or ``out`` does not fit.
(b) A state machine driving both cores' FramePool in lockstep against a plain model
    (slot -> (bytes, refcount)): same slot ids, refcounts, contents and stats, and zero live
    frames once everything is dropped.

The number of examples follows the profile in conftest.py (LAZYFRAMES_HYPOTHESIS_EXAMPLES).
"""

import copy
import gc
import importlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from conftest import restate
from lazyframes import _backend

LAYOUTS = ("last", "first", "stack")
DTYPES = [np.uint8, np.int16, np.float32, np.float64, np.bool_]
TARGETS = [np.uint8, np.int16, np.int32, np.int64, np.uint16, np.float32, np.float64, np.bool_]
NAMED_SHAPES = [(84, 84), (84, 84, 1), (1, 84, 84), (7,), (3,)]
BIG_SHAPE = (210, 160, 3)
SCALES = [1 / 255, 0.5, 2.0, -1.5, 1e-3, 3, 255.0]

fixture_ok = settings(suppress_health_check=[HealthCheck.function_scoped_fixture,
                                             HealthCheck.too_slow])


def core(name):
    return importlib.import_module(_backend._NAMES[name])




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
    scale = None
    if out_dt.kind == "f" and draw(st.booleans()):
        scale = draw(st.one_of(st.sampled_from(SCALES),
                               st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)))
    return dst, scale


@st.composite
def cases(draw):
    shape = draw(frame_shapes())
    dtype = draw(st.sampled_from(DTYPES))
    big = shape == BIG_SHAPE or np.prod(shape) > 5000
    k = draw(st.integers(1, 4 if big else 16))
    batch = draw(st.integers(1, 2 if big else 4))
    n = draw(st.integers(1, k + 2))
    idx = draw(st.lists(st.lists(st.integers(0, n - 1), min_size=k, max_size=k),
                        min_size=batch, max_size=batch))
    layout = draw(st.sampled_from(LAYOUTS))
    conv = draw(conversions(dtype))
    seed = draw(st.integers(0, 2**32 - 1))
    chunk_bytes = draw(st.sampled_from([1, 3 * 64, 1 << 20]))
    return shape, dtype, n, np.array(idx, np.int64), layout, conv, seed, chunk_bytes


def expected(frames, idx, layout, dtype, scale):
    want = np.stack([restate([frames[i] for i in row], layout) for row in idx])
    if dtype is not None:
        want = want.astype(dtype)
    if scale is not None:
        want = want * want.dtype.type(scale)
    return want


def run(mod, shape, dtype, frames, idx, layout, conv, chunk_bytes):
    """Everything one core produces for a case, or the exception it raises."""
    dst, scale = conv
    try:
        pool = mod.FramePool(shape, dtype, chunk_bytes=chunk_bytes)
        slots = pool.push_many(frames)
        g = pool.gather(slots[idx], layout=layout, dtype=dst, scale=scale)
        obs = [pool.lazy(slots[row], layout=layout) for row in idx]
        s = mod.stack(obs, dtype=dst, scale=scale)
        out = np.full(g.shape, 1, g.dtype)
        s2 = mod.stack(obs, out, dtype=dst, scale=scale)
        assert s2 is out
        one = obs[0].astype(dst if dst is not None else dtype, scale=scale)
        arr = np.asarray(obs[0])
        stats = pool.stats()
        slot_list = [o.slots for o in obs]
        pool.release(slots)
        del obs
        gc.collect()
        live_after = pool.live_frames
        return ("ok", g, s, out, one, arr, stats, slot_list, live_after)
    except (ValueError, TypeError, IndexError) as e:
        return ("error", type(e), str(e))


def check_against_numpy(res, frames, idx, layout, conv):
    dst, scale = conv
    if res[0] == "error":
        # only layouts that do not fit the frame shape may fail here
        assert res[1] is ValueError and "layout" in res[2], res
        return False
    _, g, s, out, one, arr, stats, _, live_after = res
    want = expected(list(frames), idx, layout, dst, scale)
    for got in (g, s, out):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
        assert got.tobytes() == want.tobytes()  # bit for bit, signed zeros included
    np.testing.assert_array_equal(one, want[0])
    np.testing.assert_array_equal(arr, expected(list(frames), idx[:1], layout, None, None)[0])
    assert live_after == 0
    assert stats["live_frames"] == len(frames)
    return True


@fixture_ok
@given(case=cases())
def test_core_matches_numpy_restatement(impl, case):
    shape, dtype, n, idx, layout, conv, seed, chunk_bytes = case
    frames = random_frames(np.random.default_rng(seed), n, shape, dtype)
    note(f"shape={shape} dtype={np.dtype(dtype)} layout={layout} idx={idx.tolist()} conv={conv}")
    res = run(impl, shape, dtype, frames, idx, layout, conv, chunk_bytes)
    check_against_numpy(res, frames, idx, layout, conv)


@st.composite
def any_conversions(draw):
    """Any (dtype, scale), supported or not; with an ``out`` of a right or wrong kind."""
    dst = draw(st.sampled_from([None, *TARGETS, np.float16, np.complex64, np.int8]))
    scale = draw(st.sampled_from([None, None, 0.5, 1 / 255, 2, "x", True]))
    return dst, scale


def _both(fn):
    """Run fn(core) on both cores; return what each gave (value or exception)."""
    out = []
    for name in ("compiled", "reference"):
        try:
            out.append(("ok", fn(core(name))))
        except Exception as e:  # noqa: BLE001 - compared below
            out.append(("error", type(e).__name__, str(e)))
    return out


def _same(a, b):
    if a[0] != b[0]:
        return False
    if a[0] == "error":
        return a == b
    x, y = a[1], b[1]
    if isinstance(x, np.ndarray):
        return (isinstance(y, np.ndarray) and x.shape == y.shape and x.dtype == y.dtype
                and x.tobytes() == y.tobytes())
    return x == y


@given(case=cases(), conv=any_conversions(), out_kind=st.sampled_from(
    ["none", "right", "shape", "dtype", "fortran", "readonly", "list"]))
def test_cores_agree_including_errors(case, conv, out_kind):
    shape, dtype, n, idx, layout, _, seed, chunk_bytes = case
    frames = random_frames(np.random.default_rng(seed), n, shape, dtype)
    dst, scale = conv
    note(f"shape={shape} dtype={np.dtype(dtype)} layout={layout} conv={conv} out={out_kind}")

    def go(mod):
        pool = mod.FramePool(shape, dtype, chunk_bytes=chunk_bytes)
        slots = pool.push_many(frames)
        try:
            try:
                full = (len(idx),) + pool.lazy(slots[idx[0]], layout=layout).shape
            except ValueError:
                full = (len(idx), 1)
            out_dt = np.dtype(dst) if dst is not None else np.dtype(dtype)
            out = {
                "none": None,
                "right": np.zeros(full, out_dt),
                "shape": np.zeros(full[:-1] + (full[-1] + 1,), out_dt),
                "dtype": np.zeros(full, np.complex128),
                "fortran": np.asfortranarray(np.zeros(full + (2,), out_dt))[..., 0],
                "readonly": np.zeros(full, out_dt),
                "list": [[0]],
            }[out_kind]
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
            pool.release(slots)

    a, b = _both(go)
    assert _same(a, b), (a, b)


@given(case=cases())
def test_cores_agree_on_observations(case):
    shape, dtype, n, idx, layout, conv, seed, chunk_bytes = case
    frames = random_frames(np.random.default_rng(seed), n, shape, dtype)
    results = [run(core(name), shape, dtype, frames, idx, layout, conv, chunk_bytes)
               for name in ("compiled", "reference")]
    a, b = results
    assert a[0] == b[0], (a[:3], b[:3])
    if a[0] == "error":
        assert a == b
        return
    for x, y in zip(a[1:6], b[1:6]):
        assert x.shape == y.shape and x.dtype == y.dtype and x.tobytes() == y.tobytes()
    assert a[6:] == b[6:]  # stats, slot ids, live frames after release


@fixture_ok
@given(layout=st.sampled_from(LAYOUTS), shape=st.sampled_from(NAMED_SHAPES + [(2, 3, 2)]),
       dtype=st.sampled_from(DTYPES), k=st.integers(1, 16))
def test_lazyframes_from_list_matches_restatement(impl, layout, shape, dtype, k):
    frames = list(random_frames(np.random.default_rng(k), k, shape, dtype))
    try:
        lz = impl.LazyFrames(frames, layout=layout)
    except ValueError as e:
        assert "layout" in str(e) or "channel" in str(e)
        assert layout != "stack" and len(shape) >= 2
        return
    want = restate(frames, layout)
    a = np.asarray(lz)
    assert a.shape == want.shape == lz.shape and a.dtype == want.dtype == lz.dtype
    np.testing.assert_array_equal(a, want)
    assert len(lz) == len(want) and lz.count() == want.shape[-1]
    i = k % want.shape[-1]
    np.testing.assert_array_equal(lz.frame(i), want[..., i])


# -- (b) the pool against a model ------------------------------------------------------------

SHAPE = (2, 3, 2)
DT = np.uint8
FRAME_BYTES = 12


class PoolMachine(RuleBasedStateMachine):
    """Both cores' pools in lockstep with a plain model of slots and refcounts."""

    def __init__(self):
        super().__init__()
        self.mods = [core("compiled"), core("reference")]
        self.pools = [m.FramePool(SHAPE, DT, chunk_bytes=3 * FRAME_BYTES) for m in self.mods]
        self.model = {}  # slot -> [bytes, refcount]
        self.owned = []  # references this test holds directly (slot ids, with repeats)
        self.obs = []  # per core-independent index: list of LazyFrames, one per core
        self.counter = 0

    def _frame(self):
        self.counter += 1
        return np.full(SHAPE, self.counter % 256, DT) + np.arange(12, dtype=DT).reshape(SHAPE)

    def _all(self, fn):
        return [fn(p) for p in self.pools]

    def _same_error(self, fn):
        errs = []
        before = [p.stats() for p in self.pools]
        for p in self.pools:
            try:
                fn(p)
                errs.append(None)
            except (ValueError, IndexError, TypeError) as e:
                errs.append((type(e), str(e)))
        assert errs[0] is not None and errs[0] == errs[1], errs
        assert [p.stats() for p in self.pools] == before

    @rule()
    def push(self):
        fr = self._frame()
        slots = self._all(lambda p: p.push(fr))
        assert slots[0] == slots[1], slots
        s = slots[0]
        assert s not in self.model
        self.model[s] = [fr.tobytes(), 1]
        self.owned.append(s)

    @rule(n=st.integers(1, 4))
    def push_many(self, n):
        frs = np.stack([self._frame() for _ in range(n)])
        slots = self._all(lambda p: p.push_many(frs))
        assert list(slots[0]) == list(slots[1])
        for s, fr in zip(slots[0].tolist(), frs):
            assert s not in self.model
            self.model[s] = [fr.tobytes(), 1]
            self.owned.append(s)

    @precondition(lambda self: self.owned)
    @rule(i=st.integers(0, 10**6), times=st.integers(1, 3))
    def retain(self, i, times):
        s = self.owned[i % len(self.owned)]
        for p in self.pools:
            p.retain([s] * times)
        self.model[s][1] += times
        self.owned.extend([s] * times)

    @precondition(lambda self: self.owned)
    @rule(i=st.integers(0, 10**6))
    def release(self, i):
        s = self.owned.pop(i % len(self.owned))
        for p in self.pools:
            p.release(s)
        self._decref(s)

    def _decref(self, s):
        self.model[s][1] -= 1
        if self.model[s][1] == 0:
            del self.model[s]

    @precondition(lambda self: self.owned)
    @rule(i=st.integers(0, 10**6))
    def release_too_often(self, i):
        s = self.owned[i % len(self.owned)]
        n = self.model[s][1] + 1
        self._same_error(lambda p: p.release([s] * n))

    @rule(s=st.integers(-3, 40))
    def bad_slot(self, s):
        if s in self.model:
            return
        self._same_error(lambda p: p.retain(s))
        self._same_error(lambda p: p.get(s))
        self._same_error(lambda p: p.gather([[s]], layout="stack"))

    @precondition(lambda self: self.model)
    @rule(i=st.integers(0, 10**6))
    def get(self, i):
        s = sorted(self.model)[i % len(self.model)]
        for p in self.pools:
            assert p.get(s).tobytes() == self.model[s][0]

    @precondition(lambda self: self.model)
    @rule(picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=5),
          batch=st.integers(1, 3), layout=st.sampled_from(LAYOUTS))
    def gather(self, picks, batch, layout):
        live = sorted(self.model)
        row = [live[i % len(live)] for i in picks]
        idx = np.array([row] * batch)
        frames = {s: np.frombuffer(self.model[s][0], DT).reshape(SHAPE) for s in row}
        want = np.stack([restate([frames[s] for s in r], layout) for r in idx])
        for p in self.pools:
            out = np.empty_like(want)
            assert p.gather(idx, out, layout=layout) is out
            np.testing.assert_array_equal(out, want)

    @precondition(lambda self: self.model)
    @rule(picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=4),
          layout=st.sampled_from(LAYOUTS))
    def lazy(self, picks, layout):
        live = sorted(self.model)
        row = [live[i % len(live)] for i in picks]
        self.obs.append([p.lazy(row, layout=layout) for p in self.pools])
        for s in row:
            self.model[s][1] += 1

    @precondition(lambda self: self.obs)
    @rule(i=st.integers(0, 10**6))
    def copy_obs(self, i):
        pair = self.obs[i % len(self.obs)]
        self.obs.append([copy.copy(pair[0]), copy.deepcopy(pair[1])])
        for s in pair[0].slots:
            self.model[s][1] += 1

    @precondition(lambda self: self.obs)
    @rule(i=st.integers(0, 10**6))
    def drop_obs(self, i):
        pair = self.obs.pop(i % len(self.obs))
        a, b = (np.asarray(o) for o in pair)
        assert a.tobytes() == b.tobytes() and a.shape == b.shape
        slots = pair[0].slots
        assert pair[1].slots == slots
        del pair, a, b
        for s in slots:
            self._decref(s)

    @invariant()
    def agree_with_model(self):
        live = sum(1 for _ in self.model)
        for p in self.pools:
            assert p.live_frames == live
            assert p.live_bytes == live * FRAME_BYTES
            for s, (_, rc) in self.model.items():
                assert p.refcount(s) == rc
        a, b = (p.stats() for p in self.pools)
        assert a == b
        for s in range(self.pools[0].capacity):
            if s not in self.model:
                try:
                    rcs = [p.refcount(s) for p in self.pools]
                except IndexError:
                    continue
                assert rcs == [0, 0]

    def teardown(self):
        for s in self.owned:
            for p in self.pools:
                p.release(s)
        self.owned.clear()
        self.obs.clear()
        gc.collect()
        for p in self.pools:
            assert p.live_frames == 0


PoolMachine.TestCase.settings = settings(
    max_examples=max(10, settings.default.max_examples // 2),
    stateful_step_count=40,
    deadline=None,
)
TestPoolMachine = PoolMachine.TestCase


def test_machine_model_alone_detects_a_leak():
    """The teardown check can fail: an observation kept alive holds live frames."""
    m = core("reference")
    pool = m.FramePool(SHAPE, DT, chunk_bytes=3 * FRAME_BYTES)
    s = pool.push(np.zeros(SHAPE, DT))
    lz = pool.lazy([s], layout="stack")
    pool.release(s)
    assert pool.live_frames == 1
    del lz
    assert pool.live_frames == 0


@pytest.mark.parametrize("name", ["compiled", "reference"])
def test_same_slot_ids_under_churn(name):
    """Allocation policy pinned on a fixed sequence (both cores must give these ids)."""
    pool = core(name).FramePool(SHAPE, DT, chunk_bytes=5 * FRAME_BYTES)
    assert pool.slots_per_chunk == 4  # the largest power of two that fits 5 frames
    z = np.zeros(SHAPE, DT)
    got = [pool.push(z) for _ in range(9)]  # chunks 0, 1 full, chunk 2 has one
    pool.release([5, 4, 6, 7])  # chunk 1 empties: kept as the spare
    assert pool.bytes_held == 12 * FRAME_BYTES
    pool.release([0, 1, 2, 3])  # chunk 0 empties: released (a spare exists)
    assert pool.bytes_held == 8 * FRAME_BYTES
    got += [pool.push(z) for _ in range(7)]  # chunk 1, last freed first; then chunk 2
    got += [pool.push(z)]  # then the released chunk 0 again, from offset 0
    assert got == [0, 1, 2, 3, 4, 5, 6, 7, 8, 7, 6, 4, 5, 9, 10, 11, 0]
    assert pool.bytes_held == pool.peak_bytes == 12 * FRAME_BYTES
