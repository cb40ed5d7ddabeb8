"""ReplayBuffer(compress=...): the uncompressed buffer's samples, bit for bit, in every add form."""

import itertools
import os
import pickle

import numpy as np
import pytest
from conftest import assert_same_samples, recorded, refused

from lazyframes import FramePool
from lazyframes._checks import DEFAULT_COMPRESSION
from lazyframes.replay import ReplayBuffer

K = 4
SHAPE = (84, 84)


def episodes(frames, starts):
    """The recording cut into episodes: a list of frame arrays."""
    bounds = sorted({int(s) for s in starts} | {0, len(frames)})
    return [frames[a:b] for a, b in itertools.pairwise(bounds)]


class Wrapper:
    """A frame-stacking wrapper over one pool: a ring of K FrameRefs per env, reset padding."""

    def __init__(self, pool, num_envs=1):
        self.pool = pool
        self.rings = [[] for _ in range(num_envs)]

    def reset(self, e, frame):
        ref = self.pool.push(frame)
        self.rings[e] = [ref] * K
        return self.obs(e)

    def step(self, e, frame):
        self.rings[e] = self.rings[e][1:] + [self.pool.push(frame)]
        return self.obs(e)

    def obs(self, e):
        return self.pool.lazy(self.rings[e], layout="stack")

    def batch(self):
        return self.pool.lazy_batch(self.rings, layout="stack")


def transitions(eps, rng):
    """``(obs_frames, next_frames, action, reward, terminated, truncated)`` of each step."""
    out = []
    for ep in eps:
        end_term = bool(rng.integers(2))
        for t in range(len(ep) - 1):
            last = t == len(ep) - 2
            o = [ep[max(0, i)] for i in range(t - K + 1, t + 1)]
            n = [ep[max(0, i)] for i in range(t - K + 2, t + 2)]
            a, r = int(rng.integers(6)), float(rng.normal())
            out.append((o, n, a, r, last and end_term, last and not end_term))
    return out


def feed_arrays(rb, eps, seed):
    """Stacked ndarray observations, one env."""
    for o, n, a, r, te, tr in transitions(eps, np.random.default_rng(seed)):
        rb.add(np.stack(o), a, r, np.stack(n), te, tr)


def feed_lazy(rb, pool, eps, seed):
    """LazyFrames of a wrapper's pool, one env; the wrapper keeps its ring alive."""
    w, steps = Wrapper(pool), iter(transitions(eps, np.random.default_rng(seed)))
    for ep in eps:
        obs = w.reset(0, ep[0])
        for frame in ep[1:]:
            _, _, a, r, term, trunc = next(steps)  # the same draws as feed_arrays'
            nxt = w.step(0, frame)
            rb.add(obs, a, r, nxt, term, trunc)
            obs = nxt
    return w


def feed_batch(rb, pool, eps, seed):
    """LazyBatch rows of a two-env wrapper: env e plays the episodes from e onwards."""
    w = Wrapper(pool, 2)
    rng = np.random.default_rng(seed)
    streams = [[f for ep in eps[e:] + eps[:e] for f in ep] for e in range(2)]
    steps = min(len(s) for s in streams) - 1
    for e in range(2):
        w.reset(e, streams[e][0])
    for t in range(1, steps + 1):
        obs = w.batch()
        ends = rng.random(2) < 0.05
        for e in range(2):
            w.step(e, streams[e][t])
        term = ends & (rng.random(2) < 0.5)
        a, r = rng.integers(6, size=2), rng.normal(size=2).astype(np.float32)
        rb.add(obs, a, r, w.batch(), term, ends & ~term)
        for e in np.flatnonzero(ends):
            w.reset(e, streams[e][t])
    return w


def build(compress, kind, eps, seed=0):
    """A buffer fed ``eps`` as ``kind`` input; (buffer, wrapper or None)."""
    pool = FramePool(SHAPE, np.uint8)
    opts = {"n_step": 3, "gamma": 0.9, "seed": seed, "compress": compress}
    if kind == "arrays":  # into a pool given to the buffer
        rb = ReplayBuffer(4096, pool=pool, **opts)
        feed_arrays(rb, eps, seed)
        return rb, None
    rb = ReplayBuffer(4096, num_envs=2 if kind == "batch" else 1, **opts)  # adopts the pool
    return rb, (feed_lazy if kind == "lazy" else feed_batch)(rb, pool, eps, seed)


def assert_same_draws(a, b, draws=12, batch=32):
    """Equal samples of ``a`` and ``b`` (same seed), uint8 and float32/255, field by field."""
    batch = min(batch, len(a))
    for i in range(draws):
        kw = {"dtype": np.float32, "scale": 1 / 255} if i % 2 else {}
        assert_same_samples(a.sample(batch, **kw), b.sample(batch, **kw), f"draw {i}")


@pytest.mark.parametrize("kind", ["arrays", "lazy", "batch"])
@pytest.mark.parametrize("game", ["pong", "breakout"])
def test_recorded_frames_bit_exact(game, kind):
    eps = episodes(*recorded(game))
    rb, w = build(True, kind, eps)
    plain, w_plain = build(False, kind, eps)
    assert rb.pool.compression == DEFAULT_COMPRESSION and plain.pool.compression is None
    m, p = rb.memory(), plain.memory()
    # every stored frame but the last few (the wrapper's ring, the delta source) is cold
    assert m["cold_frames"] >= m["unique_frames"] - 2 * K - 2 > 0
    # arrays: a compressing pool stores a frame equal to one of the K before it (a static
    # screen, flicker) as a frame of its own, where a plain pool reuses that frame's slot
    repeats = sum(
        int(any(np.array_equal(e[j], e[i]) for i in range(max(0, j - K), j)))
        for e in eps
        for j in range(1, len(e))
    )
    extra = m["unique_frames"] - p["unique_frames"]
    assert set(m) == set(p) and (extra == 0 if kind != "arrays" else 0 <= extra <= repeats)
    assert p["compression"] is None and p["cold_frames"] == p["cold_bytes"] == 0
    assert p["slot_state_bytes"] == 0 < m["slot_state_bytes"] < m["bytes_held"] - m["cold_bytes"]
    assert m["ratio"] == rb.pool.live_bytes / m["bytes_held"] > 3 > p["ratio"]
    assert 0 < m["cold_bytes"] < m["bytes_held"] < p["bytes_held"] / 3
    assert m["bytes_per_transition"] < p["bytes_per_transition"] / 3
    assert_same_draws(rb, plain)
    assert rb.memory()["hot_frames"] + rb.memory()["cold_frames"] == rb.pool.live_frames
    if w is not None:  # the observations the policy acts on read the same too
        np.testing.assert_array_equal(np.asarray(w.obs(0)), np.asarray(w_plain.obs(0)))


def test_compress_options_and_adopted_pools():
    m = ReplayBuffer(100, compress={"group": 4}).memory()  # (a filled one's: recorded frames)
    assert m["compression"] == {**DEFAULT_COMPRESSION, "group": 4}
    assert (m["hot_frames"], m["cold_frames"], m["cold_bytes"], m["ratio"]) == (0, 0, 0, 0.0)
    refused(TypeError, "", ReplayBuffer, 10, compress="lz4")
    refused(ValueError, "codec", ReplayBuffer, 10, compress={"codec": "gzip"})
    refused(ValueError, "unknown", ReplayBuffer, 10, compress={"clevel": 3})
    frames = recorded("pong")[0][:12]
    # a wrapper's pool is made to compress by the first add, not before
    pool = FramePool(SHAPE, np.uint8)
    rb = ReplayBuffer(50, compress={"codec": "lz4hc"})
    w = Wrapper(pool)
    obs = w.reset(0, frames[0])
    assert pool.compression is None
    rb.add(obs, 0, 0.0, w.step(0, frames[1]), False, False)
    assert rb.pool is pool and pool.compression["codec"] == "lz4hc"
    # a pool given to the constructor compresses at once; without compress= it is left so
    given = FramePool(SHAPE, np.uint8)
    ReplayBuffer(50, pool=given, compress=True)
    assert given.compression == DEFAULT_COMPRESSION
    rb = ReplayBuffer(50, pool=given)
    assert rb.memory()["compression"] == DEFAULT_COMPRESSION
    pool = FramePool(SHAPE, np.uint8, compress={"group": 8})
    refused(ValueError, "already compresses", ReplayBuffer, 10, pool=pool, compress={"group": 4})
    assert pool.compression["group"] == 8
    # adopting a wrapper's pool that compresses otherwise: nothing stored
    rb = ReplayBuffer(10, compress={"group": 4})
    w = Wrapper(pool)
    obs = w.reset(0, np.zeros(SHAPE, np.uint8))
    with pytest.raises(ValueError, match="already compresses"):
        rb.add(obs, 0, 0.0, w.step(0, np.ones(SHAPE, np.uint8)), False, False)
    assert len(rb) == 0 and rb.pool is None and pool.compression["group"] == 8
    # compress=True takes the options of a pool that compresses already (an old default's)
    old = FramePool(SHAPE, np.uint8, compress={"group": 64})
    old.enable_compression(True)
    rb = ReplayBuffer(10, pool=old, compress=True)
    assert rb.memory()["compression"] == old.compression == {**DEFAULT_COMPRESSION, "group": 64}
    rb = ReplayBuffer(10, compress=True)
    assert rb.memory()["compression"] == DEFAULT_COMPRESSION  # until it adopts a pool
    w = Wrapper(old)
    rb.add(w.reset(0, frames[0]), 0, 0.0, w.step(0, frames[1]), False, False)
    assert rb.pool is old and len(rb) == 1 and rb.memory()["compression"]["group"] == 64


@pytest.mark.parametrize("kind", ["arrays", "lazy", "batch"])
def test_checkpoints_and_pickles_keep_compression(kind, tmp_path):
    """The same options, the same samples (same seed); the file holds the frames compressed."""
    eps = episodes(*recorded("breakout"))
    rb, _ = build({"group": 4}, kind, eps)  # not the default options
    plain, _ = build(False, kind, eps)
    rb.save(tmp_path / "rb.npz")
    pool = FramePool(SHAPE, np.uint8)  # a given pool is made to compress as the file's
    back = ReplayBuffer.load(tmp_path / "rb.npz", pool=pool)
    again = ReplayBuffer.load(tmp_path / "rb.npz")
    assert back.pool is pool and pool.compression == {**DEFAULT_COMPRESSION, "group": 4}
    m = back.memory()
    assert m["cold_frames"] >= m["unique_frames"] - 1 > 0  # every frame cold but the newest
    data = pickle.dumps(rb)
    assert len(data) < len(rb) * 1000  # compressed frames: 7,056 B each raw
    copy = pickle.loads(data)
    assert copy.pool is not rb.pool and copy.memory()["compression"] == rb.memory()["compression"]
    assert_same_draws(back, copy, draws=4)  # the same RNG state: the same draws
    assert_same_draws(rb, pickle.loads(data), draws=4)
    assert_same_draws(plain, again, draws=4)
    if kind != "batch":  # a loaded buffer goes on compressing what it is given
        feed_arrays(again, eps[:1], 1)
        feed_arrays(plain, eps[:1], 1)
        assert_same_draws(plain, again, draws=4)
    with pytest.raises(ValueError, match="already compresses"):
        ReplayBuffer.load(tmp_path / "rb.npz", pool=FramePool(SHAPE, np.uint8, compress=True))
    empty = pickle.loads(pickle.dumps(ReplayBuffer(8, compress=True)))
    assert empty.memory()["compression"] == DEFAULT_COMPRESSION and len(empty) == 0


def test_checkpoint_is_about_as_large_as_memory(tmp_path):
    """A full buffer: the file within 1.2x of memory(), 10x below raw; load decodes it in chunks."""
    for game in ("pong", "breakout"):
        eps = episodes(*recorded(game)) * 9  # new frames each time: only stacks dedupe
        rb = ReplayBuffer(1300, n_step=3, seed=0, compress=True)
        feed_arrays(rb, eps, 0)
        assert rb.full
        m = rb.memory()
        rb.save(tmp_path / "rb.npz")
        size = os.path.getsize(tmp_path / "rb.npz")
        assert size < 1.2 * (m["bytes_held"] + m["table_bytes"]), (game, size, m)
        assert size < m["unique_frames"] * m["frame_bytes"] / 10
        back = ReplayBuffer.load(tmp_path / "rb.npz")
        assert back.memory()["bytes_held"] <= 1.2 * m["bytes_held"]
        assert back.memory()["unique_frames"] == m["unique_frames"] > 1200
        assert_same_draws(rb, back, draws=2)


# -- compression always happens (frames released after their add; partial adds) ---------
def lazy_filled(n=24):
    """A compressing buffer fed a wrapper's LazyFrames, and the wrapper (its ring holds k)."""
    frames = recorded("pong")[0][:n]
    pool = FramePool(SHAPE, np.uint8)
    w = Wrapper(pool)
    rb = ReplayBuffer(100, compress=True, seed=0)
    obs = w.reset(0, frames[0])
    for f in frames[1:]:
        nxt = w.step(0, f)
        rb.add(obs, 0, 0.0, nxt, False, False)
        obs = nxt
    return rb, w


@pytest.mark.parametrize("how", ["sample", "gather", "save", "flush", "pickle"])
def test_frames_released_after_the_last_add_are_compressed(how, tmp_path):
    rb, w = lazy_filled()
    m = rb.memory()  # the ring's frames, and the frame the last obs let go: waiting
    assert (m["pending_frames"], m["hot_frames"]) == (1, K + 1)
    del w  # the ring's frames are now held by the stored transitions only
    m = rb.memory()
    assert (m["pending_frames"], m["hot_frames"]) == (K + 1, K + 1)
    calls = {"sample": lambda: rb.sample(2), "gather": lambda: rb.gather([0, 1]),
             "save": lambda: rb.save(tmp_path / "rb.npz"), "flush": rb.flush,
             "pickle": lambda: pickle.dumps(rb)}  # fmt: skip
    calls[how]()
    m = rb.memory()
    assert (m["pending_frames"], m["hot_frames"]) == (0, 0)
    assert m["cold_frames"] == rb.pool.live_frames == m["unique_frames"]


def test_flush_compresses_the_frames_kept_for_the_next_add():
    frames = recorded("pong")[0][:20]
    rb = ReplayBuffer(100, compress=True)
    for t in range(K, len(frames) - 1):
        rb.add(frames[t - K : t], 0, 0.0, frames[t - K + 1 : t + 1], False, False)
    m = rb.memory()  # the stream's newest transition (k + 1 frames) stays hot for its next add
    assert (m["hot_frames"], m["pending_frames"]) == (K + 2, 1)
    rb.flush()
    assert rb.memory()["hot_frames"] == 0 == rb.memory()["pending_frames"]
    before = rb.memory()["unique_frames"]
    t = len(frames) - 1
    rb.add(frames[t - K : t], 0, 0.0, frames[t - K + 1 : t + 1], False, False)
    assert rb.memory()["unique_frames"] == before + K + 1  # nothing hot to share with
    rb.clear()  # the frames kept for the next add go too
    assert rb.pool.live_frames == 0


def feed_streams(rb, eps, groups):
    """Env stream e steps through ``eps[e]``; each round, each group of env ids adds its step."""
    steps = [transitions([ep], np.random.default_rng(e)) for e, ep in enumerate(eps)]
    for t in range(min(map(len, steps))):
        for ids in groups:
            o, n, *rest = zip(*(steps[e][t] for e in ids), strict=True)
            a, r, te, tr = map(np.array, rest)
            rb.add(np.stack(o), a, r.astype(np.float32), np.stack(n), te, tr, env_ids=np.array(ids))


def test_partial_adds_compress_as_synchronous_adds():
    frames, _ = recorded("pong")
    eps = [frames[e * 40 : (e + 1) * 40] for e in range(4)]  # 4 streams of 40 frames
    memory = {}
    for name, groups in {
        "sync": [[0, 1, 2, 3]],
        "halves": [[0, 1], [2, 3]],
        "actors": [[2], [0], [3], [1]],
    }.items():
        rb = ReplayBuffer(1000, num_envs=4, compress=True, seed=0)
        feed_streams(rb, eps, groups)
        rb.flush()
        memory[name] = rb.memory()
    sync = memory.pop("sync")
    assert sync["cold_frames"] == sync["unique_frames"] > 4 * 35
    for m in memory.values():  # each frame stored once, and its delta as small
        assert m["unique_frames"] == sync["unique_frames"]
        assert m["cold_bytes"] <= 1.1 * sync["cold_bytes"]
