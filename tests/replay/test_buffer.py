"""ReplayBuffer beyond the values test_model.py checks; a refused call changes nothing."""

import gc

import numpy as np
import pytest
from conftest import assert_same_samples, buffer_state, f, refused

from lazyframes import FramePool, ReplayBuffer
from lazyframes.replay import Samples

FS = (2, 3)  # small frames keep the tests fast
K = 3


def stack(*values):
    """An ndarray observation ("stack" layout) of frames filled with ``values``."""
    return np.stack([np.full(FS, v, np.uint8) for v in values])


def obs_at(e, t):
    """Env ``e``'s observation after ``t`` steps: frames ``50 e + t - 2 .. 50 e + t``."""
    return stack(*(50 * e + max(t - i, 0) for i in range(K - 1, -1, -1)))


def filled(num_envs=2, steps=12, **kw):
    """A buffer of ``num_envs`` streams after ``steps`` batched ndarray adds (it wraps)."""
    rb = ReplayBuffer(8 * num_envs, num_envs=num_envs, seed=3, **kw)
    for t in range(steps):
        rb.add(
            np.stack([obs_at(e, t) for e in range(num_envs)]), np.arange(num_envs) + t,
            np.full(num_envs, 0.5 * t), np.stack([obs_at(e, t + 1) for e in range(num_envs)]),
            np.arange(num_envs) == t % 5, np.zeros(num_envs, bool),
        )  # fmt: skip
    return rb


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"capacity": 2, "num_envs": 3}, ValueError, "capacity"),
        ({"num_envs": 0}, ValueError, "num_envs"), ({"n_step": 0}, ValueError, "n_step"),
        ({"n_step": 11}, ValueError, r"n_step must be in \[1, capacity=10\]"),
        ({"gamma": 1.5}, ValueError, "gamma"), ({"layout": "middle"}, ValueError, "layout"),
        ({"stack_size": 0}, ValueError, "stack_size"),
        ({"action_shape": (2, -1)}, ValueError, "negative"),
        ({"action_dtype": object}, TypeError, "action_dtype"),
        ({"pool": np.zeros(3)}, TypeError, "FramePool"),
        ({"frame_keys": [1]}, TypeError, "frame_keys"),
    ],
)  # fmt: skip
def test_constructor_refuses_bad_options(kwargs, exc, match):
    refused(exc, match, ReplayBuffer, **{"capacity": 10, **kwargs})


def test_properties_before_and_after_the_first_add():
    rb = ReplayBuffer(10, num_envs=3, layout=np.str_("last"), stack_size=4, action_shape=2,
                      action_dtype=np.float32)  # fmt: skip
    assert (rb.capacity, rb.num_envs, rb.n_step, rb.gamma) == (9, 3, 1, 0.99)  # rounded down
    assert rb.action_shape == (2,) and rb.action_dtype == np.float32
    assert rb.pool is rb.observation_shape is rb.stack_size is None and rb.layout is None
    assert len(rb) == 0 and not rb.full and rb.memory()["bytes_per_transition"] == 0.0
    refused(ValueError, "empty", rb.sample, 1)
    o = np.zeros((3, 84, 84, 4), np.uint8)
    rb.add(o, np.zeros((3, 2)), [0, 0, 0], o + 1, [False] * 3, [False] * 3)
    assert rb.observation_shape == (84, 84, 4) and rb.pool.frame_shape == (84, 84, 1)
    assert (rb.stack_size, rb.layout) == (4, "last") and type(rb.layout) is str
    assert rb.memory()["unique_frames"] == 3 * 2  # frames are de-duplicated per env stream
    assert repr(rb) == (
        "ReplayBuffer(capacity=9, num_envs=3, n_step=1, len=3, observation_shape=(84, 84, 4), "
        "layout='last')"
    )


@pytest.mark.parametrize("kwargs, obs, match", [
    ({"layout": "last"}, np.zeros((84, 84, 4), np.uint8), "stack_size"),
    ({"layout": "last", "stack_size": 3}, np.zeros((84, 84, 4), np.uint8), "3 frames"),
    ({"layout": "last", "stack_size": 1}, np.zeros((4, 84, 84), np.uint8), "channel"),
    ({"pool": FramePool((3, 2), np.uint8)}, stack(1, 2, 3), "shape"),
])  # fmt: skip
def test_a_refused_first_add_stores_nothing(kwargs, obs, match):
    rb = ReplayBuffer(10, **kwargs)
    refused(ValueError, match, rb.add, obs, 0, 0.0, obs, False, False)
    assert len(rb) == 0 and rb.observation_shape is None
    assert rb.pool is None or rb.pool.live_frames == 0


# -- refused calls change nothing ---------------------------------------------------------
o2 = np.stack([obs_at(0, 20), obs_at(1, 20)])
GOOD = {"obs": o2, "action": np.array([1, 2]), "reward": np.array([0.5, 1.0]), "next_obs": o2,
        "terminated": np.array([False, True]), "truncated": np.array([False, False])}  # fmt: skip
TWO = {"obs": o2, "action": [0, 1], "reward": [0.0, 0.0], "next_obs": o2,
       "terminated": [0, 0], "truncated": [0, 0]}  # fmt: skip
REFUSED_BATCHES = [
    ({"obs": o2[:1]}, ValueError, "num_envs"),
    ({"obs": o2[:, :2]}, ValueError, "shape"),
    ({"next_obs": o2.astype(np.float32)}, TypeError, "dtype"),
    ({"obs": o2.astype(np.int16)}, TypeError, "dtype"),
    ({"action": np.array([1, 2, 3])}, ValueError, "action has shape"),
    ({"action": np.array([0.5, 1.0])}, TypeError, "action"),
    ({"reward": np.array(["a", "b"])}, TypeError, "reward"),
    ({"reward": np.array([1.0])}, ValueError, "reward has shape"),
    ({"reward": np.array([1.0, np.nan])}, ValueError, "finite"),
    ({"terminated": np.array([2, 0])}, TypeError, "terminated"),
    ({"truncated": [False]}, ValueError, "truncated has shape"),
    ({"final_obs": o2}, ValueError, "final_obs needs final_mask"),
    ({"final_mask": np.array([False, True])}, ValueError, "final_obs is None"),
    ({"final_obs": [o2[0], None], "final_mask": [0, 1]}, ValueError, "None"),
    ({"final_obs": o2, "final_mask": [True]}, ValueError, "final_mask has shape"),
    ({"final_obs": o2[:1], "final_mask": [True, False]}, ValueError, "one entry per env"),
    ({"final_obs": o2[:, :2], "final_mask": [True, False]}, ValueError, "final_obs has"),
    ({"final_obs": o2.astype(np.int16), "final_mask": [0, 1]}, TypeError, "dtype"),
    ({"autoreset": [True]}, ValueError, "autoreset"),
    ({**TWO, "env_ids": [0, 3]}, ValueError, "out of range"),
    ({**TWO, "env_ids": [-1, 0]}, ValueError, "out of range"),
    ({**TWO, "env_ids": np.array([2**64 - 1, 0], np.uint64)}, ValueError, "out of range"),
    ({**TWO, "env_ids": [1, 1]}, ValueError, "repeats"),
    ({**TWO, "env_ids": [0.0, 1.0]}, TypeError, "integers"),
    ({**TWO, "env_ids": [[0, 1]]}, ValueError, "1-D"),
    ({**TWO, "env_ids": [0, 1, 2]}, ValueError, "shape|observations"),
    ({**TWO, "env_ids": np.zeros(0, int)}, ValueError, "empty"),
    ({**TWO, "obs": o2[:1], "next_obs": o2[:1], "env_ids": 1}, ValueError, "shape"),
]


@pytest.mark.parametrize("bad, exc, match", REFUSED_BATCHES)
def test_a_refused_batched_add_changes_nothing(bad, exc, match):
    ids = "env_ids" in bad  # a buffer of 3 envs, two of which add
    rb = filled(num_envs=3 if ids else 2)
    before = buffer_state(rb)
    refused(exc, match, rb.add, **{**(TWO if ids else GOOD), **bad})
    assert buffer_state(rb) == before
    rb.add(**(TWO if ids else GOOD), **({"env_ids": [0, 2]} if ids else {}))  # a good add works
    assert len(rb) == rb.capacity


ONE = {"obs": stack(1, 2, 3), "action": 1, "reward": 1.0, "next_obs": stack(2, 3, 4),
       "terminated": False, "truncated": False}  # fmt: skip
REFUSED_ONES = [  # (Python rewards nan, inf, 1e39, 10**400: VALUES, on every path)
    ({"reward": np.float64(-1e39)}, ValueError, "reward"), ({"reward": "1"}, TypeError, "reward"),
    *[({"action": a}, ValueError, "action")
      for a in (1 << 63, -1, np.uint64(1 << 63), np.int64(-1))],
    ({"action": np.float32(1.0)}, TypeError, "action"),
    ({"reward": np.float32("nan")}, ValueError, "reward"),
    ({"reward": np.float16("inf")}, ValueError, "reward"),
    ({"terminated": np.int64(2)}, TypeError, "terminated"),
    ({"action": 0.5}, TypeError, "action"), ({"action": np.timedelta64(1)}, TypeError, "action"),
    ({"reward": np.datetime64(1, "s")}, TypeError, "reward"),
    ({"action": [1, 2]}, ValueError, "action has shape"),
    ({"terminated": 2}, TypeError, "terminated"), ({"truncated": "yes"}, TypeError, "truncated"),
    ({"obs": stack(1, 2, 3).astype(np.int16)}, TypeError, "dtype"),
    ({"next_obs": np.zeros((K, 2, 4), np.uint8)}, ValueError, "shape"),
    ({"next_obs": stack(1, 2, 3)[None, None]}, ValueError, "next_obs has shape"),
]  # fmt: skip


@pytest.mark.parametrize("bad, exc, match", REFUSED_ONES)
def test_a_refused_unbatched_add_changes_nothing(bad, exc, match):
    rb = ReplayBuffer(8, action_dtype=np.uint32, seed=0)
    rb.add(**ONE)
    before = buffer_state(rb)
    refused(exc, match, rb.add, **{**ONE, **bad})
    assert buffer_state(rb) == before


VALUES = [({"action": np.uint64(2**63)}, np.int64, "does not fit int64"),
          ({"action": 2**70}, np.int64, "beyond 64 bits|does not fit int64"),
          ({"action": 300}, np.int8, "does not fit int8"),
          ({"action": -1}, np.uint8, "does not fit uint8"),
          ({"action": np.nan}, np.float32, "finite"),
          ({"action": 1e300}, np.float32, "finite and fit float32"),
          ({"reward": 10**400}, np.int64, "beyond 64 bits"),
          ({"reward": float("inf")}, np.int64, "finite"),
          ({"reward": float("nan")}, np.int64, "finite"),
          ({"reward": 1e39}, np.int64, "fit float32")]  # fmt: skip
#: How an add is called: (num_envs, env_ids, batched, input form); "first": the first add.
PATHS = {"first": (1, None, False, "array"), "lazy": (1, None, False, "lazy"),
         "array": (1, None, False, "array"), "batch": (2, None, True, "batch"),
         "list": (2, None, True, "lazy"), "array_batch": (2, None, True, "array"),
         "subset": (2, [1], True, "array"), "scalar_id": (2, 1, False, "lazy")}  # fmt: skip


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("bad, action_dtype, match", VALUES)
def test_values_that_do_not_fit_are_refused_on_every_add_path(path, bad, action_dtype, match):
    num_envs, env_ids, batched, form = PATHS[path]
    n = len(env_ids) if isinstance(env_ids, list) else num_envs if batched else 1
    src = FramePool(FS, np.uint8)

    def observations(v):  # ``n`` observations of frames v + 10 e + i, in input form ``form``
        refs = [[src.push(np.full(FS, v + 10 * e + i, np.uint8)) for i in range(K)]
                for e in range(n)]  # fmt: skip
        lazy = [src.lazy(r, layout="stack") for r in refs]
        o = {"lazy": lazy, "batch": src.lazy_batch(refs, layout="stack"),
             "array": np.stack([np.asarray(x) for x in lazy])}[form]  # fmt: skip
        return o if batched else o[0]

    kw = {"action": [1] * n, "reward": [0.5] * n, "terminated": [False] * n,
          "truncated": [False] * n, "env_ids": env_ids}  # fmt: skip
    if not batched:
        kw = {key: v if key == "env_ids" else v[0] for key, v in kw.items()}
    # a pool of one slot per chunk: a refused add that pushed ``fresh``'s frames shows
    pool = FramePool(FS, np.uint8, chunk_bytes=1)
    rb = ReplayBuffer(8, num_envs=num_envs, action_dtype=action_dtype, seed=0, pool=pool)
    obs, fresh = observations(0), observations(100)
    if path != "first":
        rb.add(obs, next_obs=obs, **kw)
    ((name, value),) = bad.items()
    if batched:
        value = np.array([value] * n, object if isinstance(value, int) and value >= 2**63 else None)
    before = buffer_state(rb)
    refused(ValueError, match, rb.add, fresh, next_obs=fresh, **{**kw, name: value})
    assert buffer_state(rb) == before
    rb.add(fresh, next_obs=fresh, **kw)  # and the buffer takes the good values afterwards
    assert len(rb) == (1 if path == "first" else 2) * n


def test_refused_samples_change_nothing():
    rb = filled()
    before = buffer_state(rb)
    o0 = np.zeros((4, K, *FS), np.uint8)
    for kw, exc, match in [
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"out": (o0, o0)}, ValueError, "overlap"),
        ({"out": (o0, np.zeros((4, K, 2, 2), np.uint8))}, ValueError, "shape"),
        ({"out": (o0, np.zeros((4, K, *FS), np.float32))}, TypeError, "dtype"),
        ({"out": (o0, np.zeros((4, K, *FS), np.uint8)[:, ::-1])}, ValueError, "contiguous"),
        ({"out": o0}, TypeError, "pair"),
        ({"scale": 0.5}, TypeError, "scale"),
        ({"dtype": np.complex64}, TypeError, "conversion"),
    ]:
        refused(exc, match, rb.sample, **{"batch_size": 4, **kw})
        assert buffer_state(rb) == before, kw
    np.testing.assert_array_equal(o0, 0)  # nothing written


def test_edge_values_are_stored_exactly():
    rb = ReplayBuffer(8, action_dtype=np.uint64)
    o = stack(1, 2, 3)
    top = float(np.finfo(np.float32).max)
    for a, r in [(0, 1.0), ((1 << 64) - 1, top), (np.uint64(1 << 63), -top), (True, 1 << 24)]:
        rb.add(o, a, r, o, np.True_, True)
    rb.add(o, np.int16(2), np.float32(0.5), o, np.array(True), 0)  # 0-d arrays, an int flag
    rb.add(o[None], [3], np.array([2.5]), o[None], [False], [True])  # batched, num_envs 1
    s = rb.gather(np.arange(6))
    assert s.actions.tolist() == [0, (1 << 64) - 1, 1 << 63, 1, 2, 3]
    assert s.rewards.tolist() == [1.0, top, -top, float(1 << 24), 0.5, 2.5]
    assert s.dones.tolist() == [1, 1, 1, 1, 1, 0] and s.truncations.tolist() == [1] * 4 + [0, 1]


def test_c15_truncated_transition_keeps_its_next_observation():
    """docs/CASES.md C15: counter env from 10, stack 4, episode truncated after 3 steps."""
    pool = FramePool((84, 84, 1), np.uint8)
    one, five = ReplayBuffer(16, seed=0), ReplayBuffer(16, n_step=5, gamma=0.5, seed=0)
    ring = [pool.push(f(10))] * 4
    for t in range(3):
        obs = pool.lazy(ring, layout="last")
        ring = ring[1:] + [pool.push(f(11 + t))]
        for rb in (one, five):
            rb.add(obs, 0, 1.0, pool.lazy(ring, layout="last"), False, t == 2)
    reset = pool.lazy([pool.push(f(20))] * 4, layout="last")  # the next episode's
    for rb in (one, five):
        rb.add(reset, 0, 1.0, reset, False, False)
    s = one.gather([2])
    assert s.next_observations[0, 0, 0].tolist() == [10, 11, 12, 13]  # not [20, 20, 20, 20]
    assert (s.dones[0], s.truncations[0]) == (0.0, 1.0)
    s = five.sample(64)  # the windows of steps 0-2 stop at the truncation, its real next obs
    assert set(s.indices.tolist()) == {0, 1, 2}
    assert (s.next_observations[:, 0, 0] == [10, 11, 12, 13]).all()
    assert (s.truncations == 1).all() and (s.dones == 0).all()
    np.testing.assert_array_equal(s.discounts, np.float32(0.5) ** (3 - s.indices))
    np.testing.assert_array_equal(s.rewards, [sum(0.5**i for i in range(3 - t)) for t in s.indices])


def test_gather_gives_the_samples_at_ring_positions():
    rb = filled(num_envs=2, steps=12, n_step=3, gamma=0.5)
    s = Samples(*(np.array(x) for x in rb.sample(40)))  # copied: gather reuses the arrays
    assert s.weights.dtype == np.float32 and (s.weights == 1).all()
    assert_same_samples(rb.gather(s.indices), s, "gather of the drawn positions")
    out = (np.empty((3, K, *FS), np.float32), np.empty((3, K, *FS), np.float32))
    h = rb.gather([5, 0, 5], out=out, scale=0.5)
    assert h.observations is out[0] and h.next_observations is out[1]
    np.testing.assert_array_equal(h.observations, rb.gather([5, 0, 5]).observations * 0.5)
    assert rb.gather(np.array([], int)).observations.shape == (0, K, *FS)  # an empty batch
    for bad, exc in [([16], IndexError), ([-1], IndexError), ([0.0], TypeError),
                     ([[0]], TypeError)]:  # fmt: skip
        refused(exc, "", rb.gather, bad)
    # nothing is checked for sampleability: a window open at the newest transition ends there
    rb = ReplayBuffer(10, n_step=3, gamma=0.5)
    rb.add(obs_at(0, 0), 1, 1.0, obs_at(0, 1), False, False)
    rb.add(obs_at(0, 1), 2, 2.0, obs_at(0, 2), False, False)
    refused(ValueError, "no transition can be sampled", rb.sample, 1)
    g = rb.gather([0, 1])
    assert g.rewards.tolist() == [2.0, 2.0] and g.discounts.tolist() == [0.25, 0.5]
    np.testing.assert_array_equal(g.next_observations, [obs_at(0, 2)] * 2)
    refused(ValueError, "empty", ReplayBuffer(4).gather, [0])


def test_out_reuse_dtype_and_scale():
    rb = filled()
    a, b = rb.sample(5), rb.sample(5)
    assert a.observations is b.observations  # reused: the next sample overwrites it
    want = rb.gather(b.indices)
    np.testing.assert_array_equal(b.observations, want.observations)
    c = rb.sample(5, dtype=np.float32, scale=1 / 255)
    assert c.observations.dtype == np.float32 and c.observations is not b.observations
    scaled = rb.gather(c.indices).observations.astype(np.float32) * np.float32(1 / 255)
    np.testing.assert_array_equal(c.observations, scaled)
    o0, o1 = np.empty((5, K, *FS), np.float64), np.empty((5, K, *FS), np.float64)
    d = rb.sample(5, out=(o0, o1), scale=2)
    assert d.observations is o0 and d.next_observations is o1 and o0.dtype == np.float64
    np.testing.assert_array_equal(o1, rb.gather(d.indices).next_observations * 2.0)


def test_samples_depend_only_on_seed_and_stored_transitions(tmp_path):
    """Batched or one at a time, LazyFrames or ndarrays, or reloaded: the same samples."""
    pool = FramePool(FS, np.uint8)

    def lazy(e, t):
        return pool.lazy([pool.push(fr) for fr in obs_at(e, t)], layout="stack")

    def add(rb, how, t):
        action, reward = np.array([t, t + 1, t + 2]), np.array([0.5, -1.0, t])
        term, trunc = np.array([t == 1, False, t == 3]), np.array([False, t == 2, False])
        if how == "batched":
            refs = [[pool.push(fr) for fr in obs_at(e, t)] for e in range(3)]
            nxt = np.stack([obs_at(e, t + 1) for e in range(3)])
            rb.add(pool.lazy_batch(refs, layout="stack"), action, reward, nxt, term, trunc)
            return
        for e in range(3):  # one transition at a time, scalar env ids, in env order
            ob = lazy if how == "lazy" else obs_at
            o, n = ob(e, t), ob(e, t + 1)
            if how == "axis":  # a leading axis of 1 with a list of one id
                o, n = o[None], n[None]
                rb.add(o, action[[e]], reward[[e]], n, term[[e]], trunc[[e]], env_ids=[e])
            else:
                rb.add(o, action[e], reward[e], n, term[e], trunc[e], env_ids=e)

    buffers = []
    for how in ("batched", "lazy", "array", "axis"):
        rb = ReplayBuffer(12, num_envs=3, n_step=2, gamma=0.9, seed=11)
        for t in range(5):
            add(rb, how, t)
        buffers.append(rb)
    buffers[0].save(tmp_path / "rb.npz")
    buffers.append(ReplayBuffer.load(tmp_path / "rb.npz"))
    for B in (1, 7, 40):
        draws = [rb.sample(B) for rb in buffers]
        for i, other in enumerate(draws[1:]):
            assert_same_samples(draws[0], other, f"buffer {i + 1}, B={B}")


def test_frames_are_released_with_the_transitions():
    pool = FramePool((84, 84), np.uint8)
    ring = [pool.push(np.zeros((84, 84), np.uint8))] * 4
    rb = ReplayBuffer(20, seed=0)
    for t in range(40):  # wraps around: evicted transitions release their frames
        obs = pool.lazy(ring, layout="stack")
        ring = ring[1:] + [pool.push(np.full((84, 84), t, np.uint8))]
        rb.add(obs, 0, 0.0, pool.lazy(ring, layout="stack"), False, False)
    assert rb.pool is pool  # the wrapper's pool is used: no frame copied in
    assert pool.live_frames == rb.memory()["unique_frames"] == 20 + 4
    del obs
    rb.clear()
    assert len(rb) == 0 and pool.live_frames == 4  # the ring's frames
    refused(ValueError, "empty", rb.sample, 1)
    rb.add(pool.lazy(ring, layout="stack"), 0, 0.0, pool.lazy(ring, layout="stack"), False, False)
    del rb
    gc.collect()
    assert pool.live_frames == 4
    del ring
    assert pool.live_frames == 0


def test_pool_argument_chooses_the_store():
    """pool= chooses where frames go: LazyFrames of other pools and ndarrays are copied in."""
    src, pool = FramePool(FS, np.uint8), FramePool(FS, np.uint8)
    rb = ReplayBuffer(10, seed=0, pool=pool)
    lazy = src.lazy([src.push(fr) for fr in obs_at(0, 5)], layout="stack")
    rb.add(lazy, 0, 0.0, obs_at(0, 6), False, False)
    assert rb.pool is pool and pool.live_frames == rb.memory()["unique_frames"]
    np.testing.assert_array_equal(rb.gather([0]).observations[0], obs_at(0, 5))


@pytest.mark.parametrize("layout", ["stack", "first", "last"])
def test_ndarray_and_foreign_observations_cost_one_new_frame_per_step(layout):
    """Interleaved ndarray adds (any env_ids subset, or every env) or LazyFrames of another pool."""
    axis = {"stack": None, "first": 0, "last": -1}[layout]
    shape = {"stack": FS, "first": (1, *FS), "last": (*FS, 1)}[layout]

    def ob(e, t):
        o = obs_at(e, t)
        return o if axis is None else np.concatenate(list(o.reshape(K, *shape)), axis=axis)

    rb = ReplayBuffer(1000, num_envs=3, layout=layout, stack_size=K, seed=0)
    rng, t, steps = np.random.default_rng(3), [0, 0, 0], 0
    for _ in range(30):
        every = rng.random() < 0.3  # env_ids=None: the rows held for it went stale once
        envs = [0, 1, 2] if every else rng.permutation(3)[: rng.integers(1, 4)].tolist()
        o = np.stack([ob(e, t[e]) for e in envs])
        for e in envs:
            t[e] += 1
        n = np.stack([ob(e, t[e]) for e in envs])
        rb.add(o, [0] * len(envs), [0.0] * len(envs), n, [False] * len(envs),
               [False] * len(envs), env_ids=None if every else envs)  # fmt: skip
        steps += len(envs)
    # per stream: the first observation (one frame, K times), then one new frame a step
    assert rb.memory()["unique_frames"] == steps + 3
    s = rb.gather(np.arange(len(rb)))
    assert len({o.tobytes() for o in s.observations}) == len(rb)


def test_observations_that_are_not_stacks_keep_a_bounded_table():
    """Rows that are not frame stacks take overflow records, reused once the buffer is full.

    A next observation that is not the observation shifted by a frame keeps its ids in an
    overflow record: a full buffer's adds reuse the evicted rows' records, and values hold.
    """
    cap, k = 64, 4
    rb = ReplayBuffer(cap, seed=0)
    rng = np.random.default_rng(0)

    def add():
        obs, nxt = rng.integers(0, 256, (2, k, 2, 2), dtype=np.uint8)
        rb.add(obs, 0, 0.0, nxt, False, False)
        return obs, nxt

    added = [add() for _ in range(cap)]
    full = rb.memory()["table_bytes"]
    added += [add() for _ in range(3 * cap)]  # every row rewritten, three times
    assert rb.memory()["table_bytes"] == full
    s = rb.gather(np.arange(cap))
    order = [i % cap for i in range(len(added) - cap, len(added))]  # ring positions
    for (obs, nxt), pos in zip(added[-cap:], order, strict=True):
        np.testing.assert_array_equal(s.observations[pos], obs)
        np.testing.assert_array_equal(s.next_observations[pos], nxt)


@pytest.mark.parametrize("mode", ["lazy", "array"])
def test_bytes_per_transition_at_atari_size(mode):
    """A new 84x84 frame a step, k=4: at most 7,145 bytes a transition (7,056 + 22 of tables).

    The tables: one int32 frame reference (the next observation's newest frame: the rest
    of the row is read along the previous frames the pool records), int64 action,
    float32 reward, flags, a uint8 env id and an int32 link.
    """
    cap = 3000
    pool = FramePool((84, 84), np.uint8)
    ring = [pool.push(np.zeros((84, 84), np.uint8))] * 4
    rb = ReplayBuffer(cap, seed=0)
    for t in range(cap + 50):
        frame = np.full((84, 84), t % 251, np.uint8)
        frame[0, :2] = t % 256, t // 256
        nxt = ring[1:] + [pool.push(frame)]
        if mode == "lazy":
            rb.add(pool.lazy(ring, layout="stack"), 0, 0.0, pool.lazy(nxt, layout="stack"),
                   False, False)  # fmt: skip
        else:
            o, n = (pool.gather([[r.slot for r in x]], layout="stack")[0] for x in (ring, nxt))
            rb.add(o, 0, 0.0, n, False, False)
        ring = nxt
    m = rb.memory()
    assert (m["transitions"], m["frame_bytes"]) == (cap, 7056)
    assert m["unique_frames"] == cap + 4  # one new frame per step (+ the first k - 1)
    assert m["table_bytes"] <= 22 * cap + 4
    if mode == "array":
        # the buffer's own pool, sized by the capacity: at most capacity / 256 frames wasted
        assert rb.pool is not pool and m["bytes_per_transition"] <= 7145, m
    else:
        # the wrapper's shared pool: the live frames (+1 before an eviction) and one chunk
        spc = rb.pool.slots_per_chunk
        assert rb.pool is pool and m["bytes_held"] < (cap + 4 + 1 + spc) * 7056
        # so the figure converges to frame + table bytes: <= 7,137 from ~21k transitions
        assert (m["bytes_held"] + m["table_bytes"]) / cap - spc * 7056 / cap <= 7137
