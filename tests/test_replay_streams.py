"""ReplayBuffer v2: per-env adds (``env_ids``), any batch size, exact values on add.

Run on both cores (``impl`` fixture). The oracle here is a ring of materialised
transitions in the order added; a transition's n-step window walks the later stored
transitions of the same env, so it is exact however the env streams interleave.
"""

import numpy as np
import pytest
from test_replay import Streams, assert_same_state, buffer_state, check_sample

from lazyframes.replay import ReplayBuffer, _ingest
from lazyframes.vector import LazyBatch


class RingModel:
    """The oracle: ``capacity`` positions written in turn.

    Each holds a transition ``(env, obs, action, reward, next_obs, term, trunc, skip)``.
    """

    def __init__(self, capacity, n_step, gamma):
        self.capacity, self.n, self.gamma = capacity, n_step, gamma
        self.added = []  # every transition ever added, in order

    def add(self, env, obs, action, reward, next_obs, term, trunc, skip=False):
        self.added.append((env, obs, action, reward, next_obs, term, trunc, skip))

    def __len__(self):
        return min(len(self.added), self.capacity)

    def stored(self):
        """Indices into ``added`` of the stored transitions, oldest first."""
        return range(max(0, len(self.added) - self.capacity), len(self.added))

    def expected(self, idx):
        """(valid, obs, action, reward, next_obs, done, trunc, discount) at position idx."""
        g = next(g for g in self.stored() if g % self.capacity == idx)
        env, obs, action, _, _, _, _, skip = self.added[g]
        if skip:
            return (False,) + (None,) * 7
        window = [t for t in self.added[g:] if t[0] == env]
        ret, m, last, done, trunc = 0.0, 0, window[0], False, False
        for j in range(self.n):
            if j >= len(window):
                return (False,) + (None,) * 7  # the stream has not written the window yet
            t = window[j]
            if t[7]:
                break
            ret += self.gamma**j * float(np.float32(t[3]))
            m, last = m + 1, t
            if t[5] or t[6]:
                done, trunc = bool(t[5]), bool(t[6])
                break
        return True, obs, action, ret, last[4], done, trunc, self.gamma**m

    def valid(self):
        return [g % self.capacity for g in self.stored() if self.expected(g % self.capacity)[0]]


def step_envs(streams, envs):
    """Advance only the streams ``envs`` by one frame."""
    for e in envs:
        streams.rings[e] = streams.rings[e][1:] + [streams._push(e)]


def observations(streams, envs, batched):
    """What add() is given for streams ``envs`` (one observation when not batched)."""
    arr = streams.arrays()[envs]
    if streams.mode == "array":
        return arr if batched else arr[0]
    if not batched:
        return streams.pool.lazy(streams.rings[envs[0]], layout=streams.layout)
    if streams.mode == "batch":
        rings = np.array([streams.rings[e] for e in envs])
        return LazyBatch(streams.pool, rings, layout=streams.layout)
    return [streams.pool.lazy(streams.rings[e], layout=streams.layout) for e in envs]


def add_async(rb, model, streams, rng, envs, scalar=False):
    """One add for the streams ``envs`` (a scalar env id when ``scalar``), model too."""
    assert not scalar or len(envs) == 1
    batched = not scalar
    obs = observations(streams, envs, batched)
    obs_arr = streams.arrays()[envs]
    step_envs(streams, envs)
    nxt = observations(streams, envs, batched)
    nxt_arr = streams.arrays()[envs]
    E = len(envs)
    term = rng.random(E) < 0.15
    trunc = (rng.random(E) < 0.1) & ~term
    action = rng.integers(0, 6, E)
    reward = rng.integers(-3, 4, E) / 2
    if batched:
        rb.add(obs, action, reward, nxt, term, trunc, env_ids=np.asarray(envs))
    else:
        rb.add(obs, action[0], reward[0], nxt, term[0], trunc[0], env_ids=int(envs[0]))
    for i, e in enumerate(envs):
        model.add(e, obs_arr[i], action[i], reward[i], nxt_arr[i], term[i], trunc[i])
        if term[i] or trunc[i]:
            streams.reset(e)


# -- item 2: per-env adds ------------------------------------------------------------


@pytest.mark.parametrize("mode", ["lazy", "batch", "array"])
@pytest.mark.parametrize("n_step", [1, 3])
@pytest.mark.parametrize("links", ["each", "arrays"])
def test_interleaved_streams_match_model(impl, mode, n_step, links, monkeypatch):
    """Random subsets of 4 streams in random order, scalar ids too, through eviction.

    ``links``: small adds link transitions one by one, large ones with array operations;
    "arrays" makes every add take the second way.
    """
    if links == "arrays":
        monkeypatch.setattr(_ingest, "SCALAR_LINKS", 0)
    rng = np.random.default_rng(n_step)
    streams = Streams(impl, 4, 3, mode)
    rb = ReplayBuffer(12, num_envs=4, n_step=n_step, gamma=0.5, seed=1, pool=streams.buffer_pool())
    model = RingModel(12, n_step, 0.5)
    for step in range(60):
        envs = rng.permutation(4)[: rng.integers(1, 5)]
        scalar = len(envs) == 1 and step % 2 == 0
        if scalar and mode == "batch":
            scalar = False
        add_async(rb, model, streams, rng, envs.tolist(), scalar=scalar)
        assert len(rb) == len(model)
        if not model.valid():
            with pytest.raises(ValueError, match="no transition can be sampled"):
                rb.sample(4)
            continue
        check_sample(rb.sample(16), model)
    seen = set()
    for _ in range(40):
        seen |= {int(i) for i in rb.sample(32).indices}
    assert seen == set(model.valid())


def test_all_envs_each_step_is_the_row_order(impl):
    """env_ids covering every env in order = no env_ids: same positions, same samples."""
    a, b = (Streams(impl, 3, 2, "array") for _ in range(2))
    rb_a = ReplayBuffer(9, num_envs=3, n_step=2, seed=5)
    rb_b = ReplayBuffer(9, num_envs=3, n_step=2, seed=5)
    for t in range(7):
        for streams, rb, ids in ((a, rb_a, None), (b, rb_b, [0, 1, 2])):
            obs = streams.arrays()
            streams.step()
            rb.add(
                obs,
                [t, t, t],
                [1.0, 2.0, t],
                streams.arrays(),
                [0, t == 3, 0],
                [0, 0, 0],
                env_ids=ids,
            )
    np.testing.assert_array_equal(rb_a._env, np.tile([0, 1, 2], 3))
    for x, y in zip(rb_a.sample(20), rb_b.sample(20), strict=True):
        np.testing.assert_array_equal(x, y)


def test_capacity_counts_transitions_over_all_streams(impl):
    """One busy stream fills the ring; another stream's add evicts the oldest."""
    streams = Streams(impl, 2, 2, "array")
    rb = ReplayBuffer(4, num_envs=2, n_step=2, gamma=0.5, seed=0)
    model = RingModel(4, 2, 0.5)
    rng = np.random.default_rng(0)
    for _ in range(5):
        add_async(rb, model, streams, rng, [0], scalar=True)
    assert len(rb) == 4 and rb.full
    assert rb._env.tolist() == [0, 0, 0, 0]
    add_async(rb, model, streams, rng, [1])
    assert rb._env.tolist() == [0, 1, 0, 0]  # position 1 held env 0's oldest transition
    assert rb._pos == 2
    check_sample(rb.sample(64), model)
    assert set(rb.sample(256).indices.tolist()) == set(model.valid())


def test_ndarray_frames_deduplicated_per_stream(impl):
    """Interleaved ndarray adds still cost one new frame per step of a stream."""
    streams = Streams(impl, 3, 4, "array", shape=(4, 4), dtype=np.uint8)
    rb = ReplayBuffer(1000, num_envs=3, seed=0)
    rng = np.random.default_rng(3)
    steps = 0
    for _ in range(30):
        envs = rng.permutation(3)[: rng.integers(1, 4)].tolist()
        obs = streams.arrays()[envs]
        step_envs(streams, envs)
        rb.add(
            obs,
            np.zeros(len(envs), int),
            np.zeros(len(envs)),
            streams.arrays()[envs],
            np.zeros(len(envs), bool),
            np.zeros(len(envs), bool),
            env_ids=envs,
        )
        steps += len(envs)
    # per stream: the first observation (reset padding: one frame k times), then one
    # new frame a step
    assert (rb._last >= 0).all()
    assert rb.memory()["unique_frames"] == steps + 3


def test_num_envs_1_accepts_a_leading_axis_of_1(impl):
    streams = Streams(impl, 1, 3, "array")
    rb_a = ReplayBuffer(5, seed=2)
    rb_b = ReplayBuffer(5, seed=2)
    for t in range(4):
        obs = streams.arrays()
        streams.step()
        nxt = streams.arrays()
        rb_a.add(obs[0], t, 0.5 * t, nxt[0], t == 2, False)
        rb_b.add(obs, [t], [0.5 * t], nxt, [t == 2], [False])
    rb_c = ReplayBuffer(5, seed=2)
    lz = [streams.pool.lazy(streams.rings[0], layout="stack")]
    rb_c.add(lz, [1], [1.0], lz, [True], [False])  # a list of one LazyFrames is batched
    assert len(rb_c) == 1
    for x, y in zip(rb_a.sample(9), rb_b.sample(9), strict=True):
        np.testing.assert_array_equal(x, y)


def test_scalar_env_id_adds_one_unbatched_transition(impl):
    streams = Streams(impl, 3, 2, "lazy")
    rb = ReplayBuffer(6, num_envs=3, seed=0)
    obs = streams.pool.lazy(streams.rings[2], layout="stack")
    rb.add(obs, 4, 1.5, obs, True, False, env_ids=np.int64(2))
    s = rb.sample(3)
    assert len(rb) == 1 and rb._env[0] == 2
    assert s.actions.tolist() == [4, 4, 4] and s.rewards.tolist() == [1.5, 1.5, 1.5]
    np.testing.assert_array_equal(s.observations[0], streams.arrays()[2])


def test_bad_env_ids_leave_buffer_unchanged(impl):
    streams = Streams(impl, 3, 2, "array")
    rb = ReplayBuffer(6, num_envs=3, seed=0)
    obs = streams.arrays()
    rb.add(obs, [0, 1, 2], [0.0, 0.0, 0.0], obs, [0, 0, 0], [0, 0, 0])
    two = {
        "obs": obs[:2],
        "action": [0, 1],
        "reward": [0.0, 0.0],
        "next_obs": obs[:2],
        "terminated": [0, 0],
        "truncated": [0, 0],
    }
    cases = [
        ([0, 3], ValueError, "out of range"),
        ([-1, 0], ValueError, "out of range"),
        (np.array([2**64 - 1, 0], np.uint64), ValueError, "out of range"),
        ([1, 1], ValueError, "repeats"),
        ([0.0, 1.0], TypeError, "integers"),
        ([[0, 1]], ValueError, "1-D"),
        ([0, 1, 2], ValueError, "shape|observations"),  # 3 ids for 2 transitions
        (np.zeros(0, int), ValueError, "empty"),
    ]
    for ids, exc, msg in cases:
        before = buffer_state(rb)
        with pytest.raises(exc, match=msg):
            rb.add(**two, env_ids=ids)
        assert_same_state(before, buffer_state(rb))
    with pytest.raises(ValueError, match="shape"):  # a scalar id takes no leading axis
        rb.add(obs[:1], [0], [0.0], obs[:1], [0], [0], env_ids=1)


# -- item 1: any batch size, reproducible draws ----------------------------------------


def test_any_batch_size_once_one_transition_is_sampleable(impl):
    """SB3/baselines: sample(256) right after the first transitions (learning_starts < B)."""
    streams = Streams(impl, 1, 2, "array")
    rb = ReplayBuffer(100, n_step=3, gamma=0.5, seed=0)
    obs = streams.arrays()[0]
    streams.step()
    rb.add(obs, 1, 1.0, streams.arrays()[0], False, False)
    with pytest.raises(ValueError, match="no transition can be sampled"):
        rb.sample(256)  # its 3-step window is still open
    rb.add(streams.arrays()[0], 2, 2.0, streams.arrays()[0], True, False)
    s = rb.sample(256)
    assert s.observations.shape[0] == 256
    assert sorted(set(s.indices.tolist())) == [0, 1]
    for i, idx in enumerate(s.indices):
        want = (1.0 + 0.5 * 2.0, 0.25) if idx == 0 else (2.0, 0.5)
        assert (s.rewards[i], s.discounts[i]) == want and s.dones[i] == 1.0
    rb1 = ReplayBuffer(100, seed=0)
    rb1.add(obs, 3, 0.5, obs, False, False)
    s = rb1.sample(32)
    assert s.indices.tolist() == [0] * 32 and s.actions.tolist() == [3] * 32


def fill(rb, streams_mode, impl, how):
    """The same 12 transitions (3 envs x 4 steps) added in one of several ways."""
    streams = Streams(impl, 3, 2, streams_mode)
    for t in range(4):
        action = np.array([t, t + 1, t + 2])
        reward = np.array([0.5, -1.0, t])
        term, trunc = np.array([t == 1, False, t == 3]), np.array([False, t == 2, False])
        if how == "batched":
            obs = observations(streams, [0, 1, 2], True)
            streams.step()
            rb.add(obs, action, reward, observations(streams, [0, 1, 2], True), term, trunc)
        else:  # one transition at a time, scalar env ids, in env order
            for e in range(3):
                obs = observations(streams, [e], False)
                step_envs(streams, [e])
                nxt = observations(streams, [e], False)
                rb.add(obs, action[e], reward[e], nxt, term[e], trunc[e], env_ids=e)
        for e in np.flatnonzero(term | trunc):
            streams.reset(e)
    return streams


def test_samples_depend_only_on_seed_and_stored_transitions(impl, tmp_path):
    """Batched or one at a time, LazyFrames or ndarrays, or reloaded: the same samples."""
    buffers = []
    for mode, how in [("batch", "batched"), ("lazy", "single"), ("array", "single")]:
        rb = ReplayBuffer(12, num_envs=3, n_step=2, gamma=0.9, seed=11)
        fill(rb, mode, impl, how)
        buffers.append(rb)
    buffers[0].save(tmp_path / "rb.npz")
    buffers.append(ReplayBuffer.load(tmp_path / "rb.npz"))
    for B in (1, 7, 40):
        draws = [rb.sample(B) for rb in buffers]
        for other in draws[1:]:
            for x, y in zip(draws[0], other, strict=True):
                np.testing.assert_array_equal(x, y)


# -- item 3: values that do not fit their dtype ------------------------------------------

BAD_VALUES = [
    ({"action": np.uint64(2**63)}, np.int64, "does not fit int64"),
    ({"action": 2**70}, np.int64, "beyond 64 bits"),
    ({"action": 300}, np.int8, "does not fit int8"),
    ({"action": -1}, np.uint8, "does not fit uint8"),
    ({"action": np.nan}, np.float32, "finite"),
    ({"action": 1e300}, np.float32, "finite and fit float32"),
    ({"reward": 10**400}, np.int64, "beyond 64 bits"),
    ({"reward": float("inf")}, np.int64, "finite"),
    ({"reward": float("nan")}, np.int64, "finite"),
    ({"reward": 1e39}, np.int64, "fit float32"),
]


def add_path(impl, path, action_dtype):
    """A buffer with a first transition stored, and the kwargs of a good add on ``path``."""
    mode = {"lazy": "lazy", "batch": "batch", "list": "lazy"}.get(path, "array")
    E = 1 if path in ("lazy", "array", "first") else 2
    streams = Streams(impl, max(E, 2), 2, mode)
    num_envs = 2 if path in ("batch", "list", "subset", "scalar_id", "array_batch") else 1
    rb = ReplayBuffer(
        8, num_envs=num_envs, action_dtype=action_dtype, seed=0, pool=streams.buffer_pool()
    )
    envs = {"subset": [1], "scalar_id": [1]}.get(path, list(range(num_envs)))
    batched = path not in ("lazy", "array", "first", "scalar_id")
    obs = observations(streams, envs, batched)
    kw = {
        "obs": obs,
        "next_obs": obs,
        "terminated": False,
        "truncated": False,
        "action": 1,
        "reward": 0.5,
    }
    if batched:
        n = len(envs)
        kw.update(terminated=[False] * n, truncated=[False] * n, action=[1] * n, reward=[0.5] * n)
    if path in ("subset", "scalar_id"):
        kw["env_ids"] = envs if path == "subset" else envs[0]
    if path != "first":
        rb.add(**kw)
    return rb, kw, batched


@pytest.mark.parametrize(
    "path", ["first", "lazy", "array", "batch", "list", "array_batch", "subset", "scalar_id"]
)
@pytest.mark.parametrize("bad,action_dtype,msg", BAD_VALUES)
def test_values_that_do_not_fit_are_refused_on_every_add_path(impl, path, bad, action_dtype, msg):
    rb, kw, batched = add_path(impl, path, action_dtype)
    ((name, value),) = bad.items()
    if batched:
        n = len(kw["reward"])
        value = np.array([value] * n, dtype=object if isinstance(value, int) else None)
        if isinstance(bad[name], int) and abs(bad[name]) < 2**63:
            value = value.astype(np.int64)
        elif isinstance(bad[name], np.generic):
            value = value.astype(type(bad[name]))
    before = buffer_state(rb)
    with pytest.raises(ValueError, match=msg):
        rb.add(**{**kw, name: value})
    assert_same_state(before, buffer_state(rb))
    rb.add(**kw)  # and the buffer takes the good values afterwards
    assert len(rb) == before["len"] + len(np.atleast_1d(kw["reward"]))
