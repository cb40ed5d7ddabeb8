"""ReplayBuffer against a plain-Python model buffer, run on both cores (``impl`` fixture).

The model keeps every transition as materialised arrays, in the order added, and
computes what a sample at ``indices`` must contain (n-step returns included) by walking
that list; nothing in it shares code with lazyframes.replay. Bad-input tests check the
exception, a message naming the problem, and that the buffer, its pool and its RNG are
unchanged.
"""

import gc
import os

import numpy as np
import pytest
from conftest import f
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import lazyframes
from lazyframes.replay import ReplayBuffer, ReplaySamples, _checkpoint
from lazyframes.vector import LazyBatch

FS = (2, 3)  # small frames keep the property tests fast
SHAPES = {"stack": (2, 3), "first": (1, 2, 3), "last": (2, 3, 1)}


class Streams:
    """``num_envs`` env streams of stacked frames, handed out as a frame stacker would.

    Every frame is unique (env * 100000 + step counter), so a stack holding a frame from
    another episode or env stream is caught. Episodes restart with reset padding (the
    reset frame k times). ``mode``: "lazy" (LazyFrames / a list of them), "batch"
    (a lazyframes.vector LazyBatch) or "array" (ndarrays, as EnvPool or SB3 give).
    The rings are lists of FrameRefs of ``self.pool`` (a pool of ``core``).
    """

    def __init__(self, core, num_envs, k, mode, layout="stack", shape=None, dtype=np.int32):
        self.E, self.k, self.mode, self.layout = num_envs, k, mode, layout
        self.shape = SHAPES[layout] if shape is None else shape
        self.dtype = dtype
        self.core = core
        self.pool = core.FramePool(self.shape, dtype)
        self.counter = [e * 100000 for e in range(num_envs)]
        self.rings = [None] * num_envs
        for e in range(num_envs):
            self.reset(e)

    def _push(self, e):
        self.counter[e] += 1
        v = self.counter[e] % 251 if np.dtype(self.dtype).itemsize == 1 else self.counter[e]
        return self.pool.push(np.full(self.shape, v, self.dtype))

    def reset(self, e):
        self.rings[e] = [self._push(e)] * self.k

    def step(self):
        for e in range(self.E):
            self.rings[e] = self.rings[e][1:] + [self._push(e)]

    def live(self):
        """Frames the rings hold."""
        return len({s.slot for r in self.rings for s in r})

    def buffer_pool(self, capacity=None):
        """The pool= for a ReplayBuffer fed by these streams.

        None (the buffer adopts ``self.pool``) for lazy modes; for ndarrays a new pool of
        the same core (chunks sized to ``capacity`` frames / 256, as the buffer's own pool).
        """
        if self.mode != "array":
            return None
        chunk = 1 << 20
        if capacity is not None:
            chunk = max(1, capacity * self.pool.frame_bytes // 256)
        return self.core.FramePool(self.shape, self.dtype, chunk_bytes=min(chunk, 1 << 20))

    def arrays(self):
        """(E, *obs_shape) materialised with NumPy (the model's copy)."""
        frames = [[self.pool.get(s) for s in ring] for ring in self.rings]
        if self.layout == "stack":
            return np.stack([np.stack(fr) for fr in frames])
        axis = -1 if self.layout == "last" else 0
        return np.stack([np.concatenate(fr, axis=axis) for fr in frames])

    def current(self):
        """(what add() is given, the model's arrays)."""
        arr = self.arrays()
        if self.mode == "array":
            rep = arr if self.E > 1 else arr[0]
        elif self.mode == "batch":
            rep = LazyBatch(self.pool, np.array(self.rings), layout=self.layout)
        else:
            lz = [self.pool.lazy(r, layout=self.layout) for r in self.rings]
            rep = lz if self.E > 1 else lz[0]
        return rep, arr

    def close(self):
        self.rings = []


class Model:
    """The oracle: a list of rows of (obs, action, reward, next_obs, term, trunc, skip)."""

    def __init__(self, capacity, num_envs, n_step, gamma):
        self.E, self.rows, self.n, self.gamma = num_envs, capacity // num_envs, n_step, gamma
        self.history = []

    def add(self, row):
        self.history.append(row)

    def __len__(self):
        return min(len(self.history), self.rows) * self.E

    def _global(self, idx):
        r, e = divmod(int(idx), self.E)
        G = len(self.history)
        for g in range(max(0, G - self.rows), G):
            if g % self.rows == r:
                return g, e
        raise AssertionError(f"index {idx} is not stored")

    def expected(self, idx):
        """(valid, obs, action, reward, next_obs, done, trunc, discount) of transition idx."""
        g, e = self._global(idx)
        h = self.history
        obs, action, _, _, _, _, skip = h[g][e]
        if skip:
            return (False,) + (None,) * 7
        ret, m, last, done, trunc = 0.0, 0, h[g][e], False, False
        for j in range(self.n):
            if g + j >= len(h):
                return (False,) + (None,) * 7  # window not fully written
            t = h[g + j][e]
            if t[6]:  # an autoreset placeholder ends the window before it
                break
            ret += self.gamma**j * float(np.float32(t[2]))
            m, last = m + 1, t
            if t[4] or t[5]:
                done, trunc = bool(t[4]), bool(t[5])
                break
        return True, obs, action, ret, last[3], done, trunc, self.gamma**m

    def valid(self):
        return [i for i in range(len(self)) if self.expected(i)[0]]


def check_sample(s, model, obs_dtype=None, scale=None):
    assert isinstance(s, ReplaySamples)
    B = len(s.indices)
    assert (
        s.rewards.dtype == s.dones.dtype == s.truncations.dtype == s.discounts.dtype == np.float32
    )
    assert s.rewards.shape == s.dones.shape == s.truncations.shape == s.discounts.shape == (B,)
    for i, idx in enumerate(s.indices):
        valid, obs, action, ret, nxt, done, trunc, disc = model.expected(idx)
        assert valid, f"sampled transition {idx} is not sampleable"
        want_o, want_n = obs, nxt
        if obs_dtype is not None:
            want_o = obs.astype(obs_dtype) * (
                1 if scale is None else np.dtype(obs_dtype).type(scale)
            )
            want_n = nxt.astype(obs_dtype) * (
                1 if scale is None else np.dtype(obs_dtype).type(scale)
            )
        np.testing.assert_array_equal(s.observations[i], want_o)
        np.testing.assert_array_equal(s.next_observations[i], want_n)
        np.testing.assert_array_equal(s.actions[i], action)
        assert s.rewards[i] == pytest.approx(ret, rel=1e-6, abs=1e-6)
        assert s.dones[i] == float(done) and s.truncations[i] == float(trunc)
        assert s.discounts[i] == pytest.approx(disc, rel=1e-6)


def run_episode_steps(rb, streams, model, rng, steps, p_end=0.3, autoreset_mode=False):
    """Add ``steps`` env steps; episodes end (terminated or truncated) with ``p_end``.

    With ``autoreset_mode`` (Gymnasium's next-step autoreset) the step after an episode
    end is a placeholder joining the two episodes, marked ``autoreset``.
    """
    E = streams.E
    pending = getattr(streams, "pending", np.zeros(E, bool))
    for _ in range(steps):
        rep, arr = streams.current()
        term = rng.random(E) < p_end / 2
        trunc = (rng.random(E) < p_end / 2) & ~term
        trunc |= rng.random(E) < 0.05  # both flags at once happens (Gymnasium allows it)
        action = rng.integers(0, 6, E)
        reward = rng.integers(-3, 4, E).astype(np.float64) / 2
        if autoreset_mode:
            term &= ~pending
            trunc &= ~pending
        streams.step()
        if autoreset_mode:
            for e in np.flatnonzero(pending):
                streams.reset(e)
        nrep, narr = streams.current()
        kw = {}
        if autoreset_mode:
            kw["autoreset"] = pending.copy() if E > 1 else bool(pending[0])
        if E > 1:
            # plain arrays take the one-call fast path; other kinds (a strided action,
            # a list of rewards) the checked path: both must store the same transitions
            kind = len(model.history) % 3  # not from rng: keep the episodes' random stream
            a_arg = np.repeat(action, 2)[::2] if kind == 1 else action
            r_arg = reward.tolist() if kind == 2 else reward
            rb.add(rep, a_arg, r_arg, nrep, term, trunc, **kw)
        else:
            rb.add(rep, action[0], reward[0], nrep, term[0], trunc[0], **kw)
        model.add(
            [
                (
                    arr[e],
                    action[e],
                    reward[e],
                    narr[e],
                    bool(term[e]),
                    bool(trunc[e]),
                    bool(autoreset_mode and pending[e]),
                )
                for e in range(E)
            ]
        )
        ended = term | trunc
        if autoreset_mode:
            pending = ended
        else:
            for e in np.flatnonzero(ended):
                streams.reset(e)
    streams.pending = pending


def buffer_state(rb):
    """Everything a failed call must leave unchanged."""
    st_ = {
        "len": len(rb),
        "pos": rb._pos,
        "full": rb._full,
        "n_skip": rb._n_skip,
        "rng": repr(rb._rng.bit_generator.state),
        "actions": rb._actions.copy(),
        "rewards": rb._rewards.copy(),
        "flags": rb._flags.copy(),
        "env": rb._env.copy(),
        "next": rb._next.copy(),
        "last": rb._last.copy(),
    }
    if rb.pool is not None:
        st_.update(live=rb.pool.live_frames, held=rb.pool.bytes_held)
    if rb._table is not None:
        st_.update(ids=rb._table.ids())
    return st_


def assert_same_state(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], np.ndarray):
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        else:
            assert a[key] == b[key], key


# -- the model, under random interleavings -----------------------------------------


@pytest.mark.parametrize("mode", ["lazy", "batch", "array"])
@pytest.mark.parametrize("num_envs,n_step", [(1, 1), (3, 1), (2, 3), (1, 4)])
def test_matches_model(impl, mode, num_envs, n_step):
    if mode == "batch" and num_envs == 1:
        num_envs = 2
    rng = np.random.default_rng(num_envs * 10 + n_step)
    streams = Streams(impl, num_envs, 3, mode)
    rb = ReplayBuffer(
        7 * num_envs,
        num_envs=num_envs,
        n_step=n_step,
        gamma=0.5,
        seed=1,
        pool=streams.buffer_pool(),
    )
    model = Model(7 * num_envs, num_envs, n_step, 0.5)
    for _ in range(6):
        run_episode_steps(rb, streams, model, rng, 5)
        assert len(rb) == len(model)
        s = rb.sample(len(rb))
        check_sample(s, model)
    assert set(rb.sample(len(rb)).indices.tolist()) <= set(model.valid())
    # every sampleable transition turns up over enough draws (uniform, exact)
    seen = set()
    for _ in range(40):
        seen |= {int(i) for i in rb.sample(len(rb)).indices}
    assert seen == set(model.valid())
    del rb, s
    gc.collect()
    assert streams.pool.live_frames == streams.live()
    streams.close()
    assert streams.pool.live_frames == 0


def test_autoreset_placeholders_never_sampled(impl):
    rng = np.random.default_rng(5)
    streams = Streams(impl, 3, 4, "batch")
    rb = ReplayBuffer(30, num_envs=3, n_step=3, gamma=0.9, seed=0)
    model = Model(30, 3, 3, 0.9)
    run_episode_steps(rb, streams, model, rng, 25, p_end=0.5, autoreset_mode=True)
    n_skip = sum(t[6] for row in model.history[-10:] for t in row)
    assert n_skip > 0 and rb._n_skip == n_skip
    seen = set()
    for _ in range(30):
        s = rb.sample(len(rb))
        check_sample(s, model)
        seen |= {int(i) for i in s.indices}
    assert seen == set(model.valid())


class ReplayMachine(RuleBasedStateMachine):
    """add / sample / save+load in any order, against the model."""

    core = None
    tmpdir = None

    @initialize(
        num_envs=st.integers(1, 3),
        rows=st.integers(1, 6),
        n_step=st.integers(1, 3),
        k=st.integers(1, 3),
        mode=st.sampled_from(["lazy", "batch", "array"]),
        layout=st.sampled_from(["stack", "first", "last"]),
        seed=st.integers(0, 2**32 - 1),
    )
    def setup(self, num_envs, rows, n_step, k, mode, layout, seed):
        if mode == "batch" and num_envs == 1:
            mode = "lazy"
        self.rng = np.random.default_rng(seed)
        self.streams = Streams(self.core, num_envs, k, mode, layout=layout)
        cap = rows * num_envs + (num_envs - 1 if num_envs > 1 else 0)  # rounds down to rows
        n_step = min(n_step, rows * num_envs)  # n_step is bounded by the capacity
        self.rb = ReplayBuffer(
            cap,
            num_envs=num_envs,
            n_step=n_step,
            gamma=0.75,
            seed=seed,
            layout=layout,
            stack_size=k,
            pool=self.streams.buffer_pool(),
        )
        assert self.rb.capacity == rows * num_envs
        self.model = Model(self.rb.capacity, num_envs, n_step, 0.75)
        self.saves = 0

    @rule(steps=st.integers(1, 4), p_end=st.sampled_from([0.0, 0.5, 1.0]))
    def add(self, steps, p_end):
        run_episode_steps(self.rb, self.streams, self.model, self.rng, steps, p_end)

    @precondition(lambda self: len(self.rb) > 0)
    @rule(data=st.data())
    def sample(self, data):
        B = data.draw(st.integers(1, len(self.rb)))
        if not self.model.valid():
            with pytest.raises(ValueError, match="no transition can be sampled"):
                self.rb.sample(B)
            return
        check_sample(self.rb.sample(B), self.model)

    @rule()
    def save_load(self):
        path = os.path.join(self.tmpdir, f"rb{self.saves % 2}.npz")
        self.saves += 1
        self.rb.save(path)
        # the loaded buffer's own pool, of the same core: frames are copied in from now on
        rb2 = ReplayBuffer.load(
            path, pool=self.core.FramePool(self.streams.shape, self.streams.dtype)
        )
        if self.model.valid():
            B = min(len(self.rb), 5)
            a, b = self.rb.sample(B), rb2.sample(B)
            for x, y in zip(a, b, strict=True):
                np.testing.assert_array_equal(x, y)
        self.rb = rb2

    @invariant()
    def refcounts(self):
        rb = getattr(self, "rb", None)
        if rb is None or rb.pool is None:
            return
        refs = rb._table.ids(np.arange(len(rb))) if rb._table is not None else np.zeros(0)
        assert (refs >= 0).all()
        ids, counts = np.unique(refs, return_counts=True)
        for s, c in zip(ids, counts, strict=True):
            assert rb.pool.refcount(int(s)) >= c
        if rb.pool is not self.streams.pool:  # the buffer's own pool: nothing else holds it
            assert rb.pool.live_frames == ids.size
            assert rb.memory()["unique_frames"] == ids.size

    def teardown(self):
        if getattr(self, "streams", None) is None:
            return
        pool = self.streams.pool
        self.rb = None
        gc.collect()
        assert pool.live_frames == self.streams.live()
        self.streams.close()
        assert pool.live_frames == 0


def test_state_machine(impl, tmp_path):
    ReplayMachine.core = impl
    ReplayMachine.tmpdir = str(tmp_path)
    run_state_machine_as_test(
        ReplayMachine,
        settings=settings(
            max_examples=25,
            stateful_step_count=12,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


# -- n-step, truncation, episode boundaries --------------------------------------------


def test_nstep_returns_direct(impl):
    """One env, stack 2, rewards 2**t; episodes end by termination at t=2, truncation at t=6."""
    pool = impl.FramePool(FS, np.int32)
    gamma, n, T = 0.5, 3, 9
    ends = {2: "term", 6: "trunc"}
    rb = ReplayBuffer(100, n_step=n, gamma=gamma, seed=0)
    s0 = pool.push(np.full(FS, 0, np.int32))
    ring = [s0, s0]
    for t in range(T):
        obs = pool.lazy(ring, layout="stack")
        ring = [ring[1], pool.push(np.full(FS, t + 1, np.int32))]  # frame t + 1 follows step t
        rb.add(
            obs,
            t,
            2.0**t,
            pool.lazy(ring, layout="stack"),
            ends.get(t) == "term",
            ends.get(t) == "trunc",
        )
        if t in ends:  # reset: a fresh frame, padded
            ring = [pool.push(np.full(FS, 1000 + t, np.int32))] * 2

    def window_end(t):
        for j in range(t, t + n):
            if j >= T:
                return None  # not fully written
            if j in ends:
                return j
        return t + n - 1

    seen = set()
    for _ in range(20):
        smp = rb.sample(T)
        for i, idx in enumerate(smp.indices):
            t = int(idx)
            end = window_end(t)
            assert end is not None, f"transition {t} has an open window"
            seen.add(t)
            want = sum(gamma ** (j - t) * 2.0**j for j in range(t, end + 1))
            assert smp.rewards[i] == pytest.approx(want)
            assert smp.dones[i] == float(ends.get(end) == "term")
            assert smp.truncations[i] == float(ends.get(end) == "trunc")
            assert smp.discounts[i] == pytest.approx(gamma ** (end - t + 1))
            assert smp.actions[i] == t
            assert smp.next_observations[i][-1, 0, 0] == end + 1  # the real next frame
            assert smp.observations[i][-1, 0, 0] in (t, 1000 + t - 1)
    assert seen == set(range(7))  # steps 7 and 8 have open windows
    del rb, obs, smp, ring, s0
    gc.collect()
    assert pool.live_frames == 0


def test_c15_truncated_transition_keeps_its_next_observation(impl):
    """docs/CASES.md C15: counter env from 10, stack 4, episode truncated after 3 steps."""
    pool = impl.FramePool((84, 84, 1), np.uint8)
    rb = ReplayBuffer(16, seed=0)
    ring = [pool.push(f(10))] * 4
    for t in range(3):
        obs = pool.lazy(ring, layout="last")
        ring = ring[1:] + [pool.push(f(11 + t))]
        nxt = pool.lazy(ring, layout="last")
        rb.add(obs, 0, 1.0, nxt, False, t == 2)
    ring = [pool.push(f(20))] * 4  # the next episode's reset observation
    rb.add(pool.lazy(ring, layout="last"), 0, 1.0, pool.lazy(ring, layout="last"), False, False)
    seen = set()
    for _ in range(30):
        s = rb.sample(len(rb))
        for i, idx in enumerate(s.indices):
            seen.add(int(idx))
            if idx == 2:
                got = [int(s.next_observations[i][0, 0, j]) for j in range(4)]
                assert got == [10, 11, 12, 13]  # not the reset observation [20, 20, 20, 20]
                assert s.dones[i] == 0.0 and s.truncations[i] == 1.0
    assert 2 in seen
    # n-step: the window of step 0 stops at the truncation with its real next obs
    rb3 = ReplayBuffer(16, n_step=5, gamma=0.5, seed=0)
    for i in range(len(rb)):
        rb3.add(
            rb._table.batch([i], 0, 4, layout="last")[0],
            0,
            float(rb._rewards[i]),
            rb._table.batch([i], 4, 8, layout="last")[0],
            False,
            bool(rb._flags[i] & 2),
        )
    s = rb3.sample(4)
    assert set(s.indices.tolist()) <= {0, 1, 2}
    for i, idx in enumerate(s.indices):
        assert [int(s.next_observations[i][0, 0, j]) for j in range(4)] == [10, 11, 12, 13]
        assert s.dones[i] == 0.0 and s.truncations[i] == 1.0
        assert s.discounts[i] == pytest.approx(0.5 ** (3 - idx))
    del rb, rb3, s, obs, nxt, ring
    gc.collect()
    assert pool.live_frames == 0


def test_one_step_episodes_interleaved(impl):
    """Every step ends an episode, 3 envs: no stack ever holds two episodes' frames."""
    streams = Streams(impl, 3, 4, "batch")
    rb = ReplayBuffer(12, num_envs=3, seed=0)
    model = Model(12, 3, 1, 0.99)
    run_episode_steps(rb, streams, model, np.random.default_rng(0), 9, p_end=2.0)
    s = rb.sample(12)
    check_sample(s, model)
    for o, nx in zip(s.observations, s.next_observations, strict=True):
        assert len(np.unique(o[:-1])) == 1  # reset padding only
        assert len(np.unique(nx[:-1])) == 1 and nx[0, 0, 0] == o[0, 0, 0]


# -- refcounts, memory -------------------------------------------------------------------


def test_refcounts_balance(impl):
    streams = Streams(impl, 2, 4, "lazy", shape=(84, 84), dtype=np.uint8)
    own = streams.pool.live_frames
    rb = ReplayBuffer(20, num_envs=2, seed=0)
    model = Model(20, 2, 1, 0.99)
    run_episode_steps(rb, streams, model, np.random.default_rng(1), 40)  # wraps around
    assert rb.pool is streams.pool  # the wrapper's pool is used: no frame copied in
    assert streams.pool.live_frames > own
    del rb
    gc.collect()
    assert streams.pool.live_frames == streams.live()
    streams.close()
    assert streams.pool.live_frames == 0


def test_clear_releases_frames(impl):
    streams = Streams(impl, 1, 4, "array", shape=(84, 84), dtype=np.uint8)
    rb = ReplayBuffer(8, seed=0, pool=streams.buffer_pool())
    run_episode_steps(rb, streams, Model(8, 1, 1, 0.99), np.random.default_rng(1), 12)
    assert rb.pool.live_frames > 0 and len(rb) == 8
    rb.clear()
    assert len(rb) == 0 and rb.pool.live_frames == 0
    with pytest.raises(ValueError, match="empty"):
        rb.sample(1)


@pytest.mark.parametrize("mode", ["lazy", "array"])
def test_bytes_per_transition_at_atari_size(impl, mode):
    """84x84 uint8 frames that change every step, k=4: at most 7,161 bytes a transition.

    The floor is the frame (7,056 bytes) plus 53 bytes of tables: 8 int32 frame
    references, an int64 action, a float32 reward, a flag byte, an int32 env id and an
    int32 link to the next transition of the stream.
    """
    cap = 3000
    streams = Streams(impl, 1, 4, mode, shape=(84, 84), dtype=np.uint8)
    rb = ReplayBuffer(cap, seed=0, pool=streams.buffer_pool(cap))
    for _ in range(cap + 50):
        rep, _ = streams.current()
        streams.step()
        nrep, _ = streams.current()
        rb.add(rep, 0, 0.0, nrep, False, False)
        if mode == "lazy":
            del rep, nrep
    m = rb.memory()
    assert m["transitions"] == cap
    assert m["frame_bytes"] == 7056
    assert m["unique_frames"] == cap + 4  # one new frame per step (+ the first k - 1)
    assert m["table_bytes"] <= 53 * cap + 4
    if mode == "array":
        # a pool with the buffer's own chunk size (a partly used chunk wastes at most
        # capacity / 256 frames)
        assert rb.pool is not streams.pool
        assert m["bytes_per_transition"] <= 7161, m
    else:
        # the wrapper's pool is shared and keeps whole 1 MiB chunks (148 frames): beyond
        # the live frames (+1 pushed before the oldest is evicted) at most one chunk
        assert rb.pool is streams.pool
        spc = rb.pool.slots_per_chunk
        assert m["bytes_held"] < (cap + 4 + 1 + spc) * 7056
        # so the figure converges to frame + table bytes: <= 7,153 from ~21k transitions
        assert (m["bytes_held"] + m["table_bytes"]) / cap - spc * 7056 / cap <= 7153
    del rb
    streams.close()


def test_frames_deduplicated_for_ndarrays_and_foreign_pools(impl):
    """Ndarray stacks and LazyFrames of another pool cost one new frame per step."""
    for mode, layout in [("array", "last"), ("array", "first"), ("lazy", "stack")]:
        streams = Streams(impl, 2, 4, mode, layout=layout)
        other = Streams(impl, 2, 4, "lazy", layout=layout)
        rb = ReplayBuffer(
            40, num_envs=2, seed=0, layout=layout, stack_size=4, pool=streams.buffer_pool()
        )
        if mode == "lazy":  # adopt `other`'s pool first, then feed `streams` (a foreign pool)
            rep, _ = other.current()
            rb.add(rep, [0, 0], [0, 0], rep, [False, False], [False, False])
            rb.clear()
            del rep
        model = Model(40, 2, 1, 0.99)
        run_episode_steps(rb, streams, model, np.random.default_rng(2), 10, p_end=0.0)
        check_sample(rb.sample(20), model)
        # reset padding [r, r, r, r] is one frame, then one new frame per step
        assert rb.memory()["unique_frames"] == 2 * (1 + 10)
        run_episode_steps(rb, streams, model, np.random.default_rng(3), 10, p_end=0.6)
        check_sample(rb.sample(40), model)
        # reset padding stores the reset frame once: unique frames <= 1 per step + resets
        assert rb.memory()["unique_frames"] <= 2 * 4 + 2 * 20 + 2 * 10
        del rb
        gc.collect()
        streams.close()
        other.close()
        assert streams.pool.live_frames == other.pool.live_frames == 0


# -- sampling API -------------------------------------------------------------------------


def test_out_reuse_dtype_and_scale(impl):
    streams = Streams(impl, 2, 4, "batch", shape=(84, 84), dtype=np.uint8)
    rb = ReplayBuffer(20, num_envs=2, seed=3)
    model = Model(20, 2, 1, 0.99)
    run_episode_steps(rb, streams, model, np.random.default_rng(0), 8)
    a = rb.sample(5)
    b = rb.sample(5)
    assert a.observations is b.observations  # reused: the next sample overwrites it
    check_sample(b, model)
    c = rb.sample(5, dtype=np.float32, scale=1 / 255)
    assert c.observations.dtype == np.float32 and c.observations is not b.observations
    check_sample(c, model, np.float32, 1 / 255)
    o0 = np.empty((5, 4, 84, 84), np.float32)
    o1 = np.empty_like(o0)
    d = rb.sample(5, out=(o0, o1), scale=1 / 255)
    assert d.observations is o0 and d.next_observations is o1
    check_sample(d, model, np.float32, 1 / 255)


def test_same_seed_same_samples(impl):
    outs = []
    for _ in range(2):
        streams = Streams(impl, 2, 3, "lazy")
        rb = ReplayBuffer(30, num_envs=2, n_step=2, seed=42)
        run_episode_steps(rb, streams, Model(30, 2, 2, 0.99), np.random.default_rng(0), 20)
        outs.append([rb.sample(7).indices.copy() for _ in range(3)])
    for x, y in zip(*outs, strict=True):
        np.testing.assert_array_equal(x, y)


# -- checkpoints ----------------------------------------------------------------------------


def _filled(impl, mode="lazy", n_step=2):
    streams = Streams(impl, 2, 4, mode, shape=(84, 84), dtype=np.uint8)
    rb = ReplayBuffer(30, num_envs=2, n_step=n_step, seed=7, pool=streams.buffer_pool())
    model = Model(30, 2, n_step, 0.99)
    run_episode_steps(rb, streams, model, np.random.default_rng(0), 25)
    return streams, rb, model


def test_checkpoint_round_trip(impl, tmp_path):
    streams, rb, model = _filled(impl)
    path = tmp_path / "rb.npz"
    rb.save(path)
    rb2 = ReplayBuffer.load(path, pool=impl.FramePool((84, 84), np.uint8))
    assert len(rb2) == len(rb) and rb2.full == rb.full and rb2.pool is not rb.pool
    assert rb2.pool.live_frames == rb.memory()["unique_frames"]  # each frame stored once
    for _ in range(3):
        a, b = rb.sample(10), rb2.sample(10)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
        check_sample(b, model)
    # both carry on identically (rb2 now copies the wrapper's frames into its own pool)
    for t in range(7):
        rep, _ = streams.current()
        streams.step()
        nrep, _ = streams.current()
        for b in (rb, rb2):
            b.add(rep, [t, t], [1.0, 2.0], nrep, [False, t == 3], [t == 5, False])
    for _ in range(3):
        for x, y in zip(rb.sample(10), rb2.sample(10), strict=True):
            np.testing.assert_array_equal(x, y)
    # file holds only live frames once: its size is about unique_frames * 7056
    assert os.path.getsize(path) < (rb2.pool.live_frames + 20) * 7056
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    # without pool=, a new pool of the import-time core
    rb3 = ReplayBuffer.load(path)
    assert isinstance(rb3.pool, lazyframes.FramePool) and rb3.pool is not rb.pool
    for x, y in zip(ReplayBuffer.load(path).sample(10), rb3.sample(10), strict=True):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="shape"):
        ReplayBuffer.load(path, pool=impl.FramePool((84, 83), np.uint8))
    with pytest.raises(TypeError, match="FramePool"):
        ReplayBuffer.load(path, pool="pool")


def test_pool_argument(impl):
    """pool= chooses the store: lazy input of other pools and ndarrays are copied in."""
    streams = Streams(impl, 2, 3, "batch")
    pool = impl.FramePool(streams.shape, streams.dtype)
    rb = ReplayBuffer(10, num_envs=2, seed=0, pool=pool)
    assert rb.pool is pool
    model = Model(10, 2, 1, 0.99)
    run_episode_steps(rb, streams, model, np.random.default_rng(0), 6)
    assert rb.pool is pool and pool.live_frames == rb.memory()["unique_frames"]
    check_sample(rb.sample(10), model)
    with pytest.raises(TypeError, match="FramePool"):
        ReplayBuffer(10, pool=np.zeros(3))
    # a pool of other frames: refused at the first add, nothing stored
    rb = ReplayBuffer(10, num_envs=2, pool=impl.FramePool((3, 2), streams.dtype))
    rep, _ = streams.current()
    with pytest.raises(ValueError, match="shape"):
        rb.add(rep, [0, 0], [0, 0], rep, [False, False], [False, False])
    assert len(rb) == 0 and rb.pool.live_frames == 0 and rb.observation_shape is None


def test_empty_buffer_round_trip(impl, tmp_path):
    rb = ReplayBuffer(10, num_envs=2, seed=3, action_shape=(2,), action_dtype=np.float32)
    rb.save(tmp_path / "e.npz")
    rb2 = ReplayBuffer.load(tmp_path / "e.npz")
    assert len(rb2) == 0 and rb2.pool is None and rb2.capacity == 10
    assert rb2._rng.integers(0, 1 << 30) == rb._rng.integers(0, 1 << 30)


def test_bad_checkpoints_raise_and_keep_the_old_one(impl, tmp_path, monkeypatch):
    _streams, rb, _ = _filled(impl)
    path = tmp_path / "rb.npz"
    rb.save(path)
    good = path.read_bytes()
    # truncated
    (tmp_path / "trunc.npz").write_bytes(good[: len(good) // 2])
    with pytest.raises(ValueError, match=r"trunc\.npz"):
        ReplayBuffer.load(tmp_path / "trunc.npz")
    # corrupt frame bytes (CRC) and a corrupt table
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    (tmp_path / "corrupt.npz").write_bytes(bytes(bad))
    with pytest.raises(ValueError, match="corrupt"):
        ReplayBuffer.load(tmp_path / "corrupt.npz")
    # a foreign npz and a non-zip file
    np.savez(tmp_path / "other.npz", a=np.arange(3))
    with pytest.raises(ValueError, match="not a ReplayBuffer checkpoint"):
        ReplayBuffer.load(tmp_path / "other.npz")
    (tmp_path / "text.npz").write_text("hello")
    with pytest.raises(ValueError, match="not a ReplayBuffer checkpoint"):
        ReplayBuffer.load(tmp_path / "text.npz")
    # a mismatched table: indices beyond the frames
    with np.load(path) as z:
        entries = {k: z[k] for k in z.files}
    entries["obs_index"] = entries["obs_index"] + 10**6
    np.savez(tmp_path / "mismatch.npz", **entries)
    with pytest.raises(ValueError, match="not in the file"):
        ReplayBuffer.load(tmp_path / "mismatch.npz")

    # a save that fails half-way leaves the old checkpoint intact and no temp file
    class Boom(Exception):
        pass

    def failing_write(rb, fh):
        fh.write(b"partial")
        raise Boom

    monkeypatch.setattr(_checkpoint, "write_archive", failing_write)
    with pytest.raises(Boom):
        rb.save(path)
    assert path.read_bytes() == good
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["rb.npz", "trunc.npz", "corrupt.npz", "other.npz", "text.npz", "mismatch.npz"]
    )
    ReplayBuffer.load(path)  # still loads


# -- bad input -------------------------------------------------------------------------------


def same_step_autoreset(num_envs, steps, seed=0):
    """A same-step autoreset vector env's add() arguments and final observations.

    Yields ``(obs, action, reward, next_obs, terminated, truncated, final_obs)``: for an
    env whose episode ended, ``next_obs`` holds the reset observation and ``final_obs``
    (an object array, None for the other envs) the episode's last one, as Gymnasium
    1.x's ``infos["final_obs"]``. Frames of 16 values, so some repeat (dedup is hit).
    """
    rng = np.random.default_rng(seed)
    shape = (num_envs, 4) + FS
    obs = rng.integers(0, 16, shape, np.uint8)
    for _ in range(steps):
        last = np.concatenate([obs[:, 1:], rng.integers(0, 16, (num_envs, 1) + FS, np.uint8)], 1)
        terminated = rng.random(num_envs) < 0.15
        truncated = ~terminated & (rng.random(num_envs) < 0.15)
        ended = terminated | truncated
        next_obs = np.where(ended[:, None, None, None], rng.integers(0, 16, shape, np.uint8), last)
        final_obs = np.full(num_envs, None, object)
        for i in np.flatnonzero(ended):
            final_obs[i] = last[i]
        action = rng.integers(0, 4, num_envs)
        reward = rng.standard_normal(num_envs).astype(np.float32)
        yield obs, action, reward, next_obs, terminated, truncated, final_obs
        obs = next_obs


@pytest.mark.parametrize("num_envs", [1, 3])
@pytest.mark.parametrize("which", ["truncated", "ended"])
def test_final_obs_stores_what_the_copied_batch_stores(impl, num_envs, which):
    """``final_obs=, final_mask=`` against CleanRL's copy of the batch with rows replaced."""
    copied, masked = (
        ReplayBuffer(60, num_envs=num_envs, seed=3, pool=impl.FramePool(FS, np.uint8))
        for _ in range(2)
    )
    one = num_envs == 1  # one env: arguments without the env axis
    for obs, action, reward, next_obs, term, trunc, final_obs in same_step_autoreset(num_envs, 90):
        mask = trunc if which == "truncated" else term | trunc
        real_next_obs = next_obs.copy()
        for idx in np.flatnonzero(mask):
            real_next_obs[idx] = final_obs[idx]
        if one:
            copied.add(obs[0], action[0], reward[0], real_next_obs[0], term[0], trunc[0])
            masked.add(obs[0], action[0], reward[0], next_obs[0], term[0], trunc[0],
                       final_obs=final_obs[0], final_mask=mask[0])  # fmt: skip
        else:
            copied.add(obs, action, reward, real_next_obs, term, trunc)
            masked.add(obs, action, reward, next_obs, term, trunc,
                       final_obs=final_obs, final_mask=mask)  # fmt: skip
    assert len(copied) == len(masked) == 60  # wrapped around
    for _ in range(4):
        a, b = copied.sample(48), masked.sample(48)
        for name in a._fields:
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    ma, mb = copied.memory(), masked.memory()
    assert ma["unique_frames"] == mb["unique_frames"]
    gc.collect()
    assert copied.pool.live_frames == masked.pool.live_frames


def test_bad_input_leaves_buffer_unchanged(impl):
    streams, rb, _model = _filled(impl, mode="array", n_step=1)
    (o, _arr) = streams.current()
    good = {
        "obs": o,
        "action": np.array([1, 2]),
        "reward": np.array([0.5, 1.0]),
        "next_obs": o,
        "terminated": np.array([False, True]),
        "truncated": np.array([False, False]),
    }
    cases = [
        ({"obs": o[:1]}, ValueError, "num_envs"),
        ({"obs": o[:, :3]}, ValueError, "shape"),
        ({"next_obs": o.astype(np.float32)}, TypeError, "dtype"),
        ({"obs": o.astype(np.int16)}, TypeError, "dtype"),
        ({"action": np.array([1, 2, 3])}, ValueError, "action has shape"),
        ({"action": np.array([0.5, 1.0])}, TypeError, "action"),
        ({"reward": np.array(["a", "b"])}, TypeError, "reward"),
        ({"reward": np.array([1.0])}, ValueError, "reward has shape"),
        ({"terminated": np.array([2, 0])}, TypeError, "terminated"),
        ({"truncated": [False]}, ValueError, "truncated has shape"),
        ({"final_obs": o}, ValueError, "final_obs needs final_mask"),
        ({"final_mask": np.array([False, True])}, ValueError, "final_obs is None"),
        ({"final_obs": [o[0], None], "final_mask": [0, 1]}, ValueError, "None"),
        ({"final_obs": o, "final_mask": [True]}, ValueError, "final_mask has shape"),
        ({"final_obs": o[:1], "final_mask": [True, False]}, ValueError, "one entry per env"),
        ({"final_obs": o[:, :3], "final_mask": [True, False]}, ValueError, "final_obs has"),
        ({"final_obs": o.astype(np.int16), "final_mask": [0, 1]}, TypeError, "dtype"),
    ]
    for bad, exc, msg in cases:
        before = buffer_state(rb)
        with pytest.raises(exc, match=msg):
            rb.add(**{**good, **bad})
        assert_same_state(before, buffer_state(rb))
    before = buffer_state(rb)
    with pytest.raises(ValueError, match="batch_size"):
        rb.sample(0)
    o0 = np.zeros((4, 4, 84, 84), np.uint8)
    for out, exc, msg in [
        ((o0, o0), ValueError, "overlap"),
        ((o0, np.zeros((4, 4, 84, 83), np.uint8)), ValueError, "shape"),
        ((o0, np.zeros((4, 4, 84, 84), np.float32)), TypeError, "dtype"),
        ((o0, np.zeros((4, 4, 84, 84), np.uint8)[:, ::-1]), ValueError, "contiguous"),
        (o0, TypeError, "pair"),
    ]:
        with pytest.raises(exc, match=msg):
            rb.sample(4, out=out)
    np.testing.assert_array_equal(o0, 0)  # nothing written
    with pytest.raises(TypeError, match="scale"):
        rb.sample(4, scale=0.5)
    assert_same_state(before, buffer_state(rb))
    rb.add(**good)  # and the good call works
    assert len(rb) == 30


def test_constructor_and_first_add_errors(impl):
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(2, num_envs=3)
    with pytest.raises(ValueError, match="n_step"):
        ReplayBuffer(10, n_step=0)
    with pytest.raises(ValueError, match=r"n_step must be in \[1, capacity=10\]"):
        ReplayBuffer(10, n_step=11)
    with pytest.raises(ValueError, match="gamma"):
        ReplayBuffer(10, gamma=1.5)
    with pytest.raises(ValueError, match="layout"):
        ReplayBuffer(10, layout="middle")
    rb = ReplayBuffer(10, layout="last")
    with pytest.raises(ValueError, match="stack_size"):
        rb.add(
            np.zeros((84, 84, 4), np.uint8), 0, 0.0, np.zeros((84, 84, 4), np.uint8), False, False
        )
    assert rb.pool is None and len(rb) == 0
    rb = ReplayBuffer(10, layout="last", stack_size=3)
    with pytest.raises(ValueError, match="3 frames"):
        rb.add(
            np.zeros((84, 84, 4), np.uint8), 0, 0.0, np.zeros((84, 84, 4), np.uint8), False, False
        )
    rb = ReplayBuffer(10, layout="last", stack_size=4)
    with pytest.raises(ValueError, match="channel"):  # (84, 84, 4) as 4 frames of (84, 84, 1) ok,
        ReplayBuffer(10, layout="last", stack_size=1).add(  # but one (84, 84, 4) frame is not
            np.zeros((4, 84, 84), np.uint8), 0, 0.0, np.zeros((4, 84, 84), np.uint8), False, False
        )
    rb.add(np.zeros((84, 84, 4), np.uint8), 0, 0.0, np.ones((84, 84, 4), np.uint8), False, False)
    assert rb.observation_shape == (84, 84, 4) and rb.pool.frame_shape == (84, 84, 1)
    assert rb.memory()["unique_frames"] == 2
    with pytest.raises(ValueError, match=r"cannot sample|empty"):
        ReplayBuffer(10).sample(1)
