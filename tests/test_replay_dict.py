"""ReplayBuffer of Dict observations (image + vector), exact values on both cores.

The oracle is ``RingModel`` (the ring of materialised transitions in the order added,
from test_replay_streams), holding each observation as a dict of arrays; SB3's
``DictReplayBuffer`` is the peer whose stored values the buffer must return.
"""

import io
import json

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.spaces import Box, Dict, Discrete
from test_checkpoint import assert_refused_quickly, craft, entries, npy
from test_replay_streams import RingModel

import lazyframes
from lazyframes.replay import ReplayBuffer


def materialise(obs):
    """A Dict observation as a dict of fresh arrays (LazyFrames copied out)."""
    return {key: np.array(v) for key, v in obs.items()}


def check(rb, model, batch, dtype=None, scale=None):
    """Sample ``batch`` transitions and compare every field with the model's."""
    s = rb.sample(batch, dtype=dtype, scale=scale)
    assert list(s.observations) == list(s.next_observations) == list(rb.observation_shape)
    for i, idx in enumerate(s.indices.tolist()):
        valid, obs, action, ret, nxt, done, trunc, disc = model.expected(idx)
        assert valid
        for key in obs:
            want, want_next = obs[key], nxt[key]
            if key in rb.layout and scale is not None:  # frame leaves: converted, scaled
                want = want.astype(dtype) * np.asarray(scale, dtype)
                want_next = want_next.astype(dtype) * np.asarray(scale, dtype)
            np.testing.assert_array_equal(s.observations[key][i], want)
            np.testing.assert_array_equal(s.next_observations[key][i], want_next)
            assert s.observations[key].dtype == want.dtype
        assert s.actions[i] == action and s.dones[i] == done and s.truncations[i] == trunc
        assert s.rewards[i] == np.float32(ret) and s.discounts[i] == np.float32(disc)
    return s


class DictEnv(gym.Env):
    """Image (6, 5) uint8 and vector (3,) float32 encoding a counter; episodes of 1-6 steps."""

    metadata = {"render_modes": []}  # noqa: RUF012 - Gymnasium's class attribute

    def __init__(self, base=0):
        self.observation_space = Dict(
            {"image": Box(0, 255, (6, 5), np.uint8), "vec": Box(-1e6, 1e6, (3,), np.float32)}
        )
        self.action_space = Discrete(3)
        self.base, self.count, self.rng = base, 0, np.random.default_rng(base)

    def obs(self):
        self.count += 1
        c = self.base + self.count
        return {"image": np.full((6, 5), c % 251, np.uint8), "vec": np.float32([c, -c, 0.5 * c])}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.left = int(self.rng.integers(1, 7))
        return self.obs(), {}

    def step(self, action):
        self.left -= 1
        return self.obs(), float(action) - 0.5, self.left == 0, self.left == 1, {}


@pytest.mark.parametrize("n_step", [1, 3])
def test_dict_env_through_lazy_wrapper(impl, n_step):
    """lazyframes.FrameStackObservation of a Dict env into the buffer: images de-duplicated."""
    pools = {"image": impl.FramePool((6, 5), np.uint8), "vec": impl.FramePool((3,), np.float32)}
    env = lazyframes.FrameStackObservation(DictEnv(), 4, pool=pools)
    ref = gym.wrappers.FrameStackObservation(DictEnv(), 4)
    rb = ReplayBuffer(40, n_step=n_step, gamma=0.5, seed=1)
    model = RingModel(40, n_step, 0.5)
    obs, _ = env.reset(seed=0)
    want, _ = ref.reset(seed=0)
    for t in range(70):
        a = t % 3
        nxt, r, term, trunc, _ = env.step(a)
        want_next, *_ = ref.step(a)
        for key in want:  # the wrapper gives Gymnasium's values
            np.testing.assert_array_equal(np.asarray(nxt[key]), want_next[key])
        rb.add(obs, a, r, nxt, term, trunc)
        model.add(0, materialise(obs), a, r, materialise(nxt), term, trunc)
        obs, want = nxt, want_next
        if term or trunc:
            obs, _ = env.reset()
            want, _ = ref.reset()
    assert rb.pool["image"] is pools["image"]  # the wrapper's pool, adopted: no frame copied
    assert rb.observation_shape == {"image": (4, 6, 5), "vec": (4, 3)}
    assert rb.layout == {"image": "stack"}
    check(rb, model, 64)
    check(rb, model, 16, dtype=np.float32, scale=1 / 255)
    ids = rb.pool["image"].stats()
    held = np.unique(np.concatenate([rb._leaves["image"]._table.ids(np.arange(40)).ravel()]))
    assert held.size <= 40 + 4 * 14 and ids["live_frames"] <= held.size + 8  # one frame a step


def vector_arrays(envs, counts, k=4):
    """Dict observations of ``envs`` as Gymnasium's FrameStackObservation + SyncVectorEnv give.

    Env ``e``'s frames are counters ``counts[e] - k + 1 .. counts[e]``.
    """
    image = np.stack(
        [
            [
                np.full((6, 5), (100 * e + c) % 251, np.uint8)
                for c in range(counts[e] - k + 1, counts[e] + 1)
            ]
            for e in envs
        ]
    )
    vec = np.stack(
        [
            [np.float32([100 * e + c, e, c]) for c in range(counts[e] - k + 1, counts[e] + 1)]
            for e in envs
        ]
    )
    return {"vec": vec, "image": image}


@pytest.mark.parametrize("compress", [False, True])
def test_ndarray_dicts_with_env_ids_and_final_obs(impl, compress, tmp_path):
    """Batched dicts of ndarrays, async env ids, final observations; checkpoint round trip."""
    E, cap = 3, 30
    rng = np.random.default_rng(5)
    pool = {"image": impl.FramePool((6, 5), np.uint8)}
    rb = ReplayBuffer(cap, num_envs=E, n_step=2, gamma=0.5, seed=3, pool=pool, compress=compress)
    model = RingModel(cap, 2, 0.5)
    plain = ReplayBuffer(
        cap,
        num_envs=E,
        n_step=2,
        gamma=0.5,
        seed=3,
        compress=compress,
        pool=impl.FramePool((6, 5), np.uint8),
    )  # the image leaf alone
    counts = [10] * E
    for t in range(40):
        envs = np.sort(rng.choice(E, size=int(rng.integers(1, E + 1)), replace=False))
        obs = vector_arrays(envs, counts)
        for e in envs:
            counts[e] += 1
        nxt = vector_arrays(envs, counts)
        ended = rng.random(len(envs)) < 0.3
        final = np.full(len(envs), None, object)
        for i in np.flatnonzero(ended):  # the real last observation; next_obs is the reset one
            final[i] = {key: v[i] for key, v in nxt.items()}
            nxt["image"][i] = 0
            nxt["vec"][i] = -1
        term = ended & (rng.random(len(envs)) < 0.5)
        actions, rewards = envs * 10 + t, rng.normal(size=len(envs)).astype(np.float32)
        rb.add(
            obs,
            actions,
            rewards,
            nxt,
            term,
            ended & ~term,
            env_ids=envs,
            final_obs=final,
            final_mask=ended,
        )
        plain.add(
            obs["image"],
            actions,
            rewards,
            nxt["image"],
            term,
            ended & ~term,
            env_ids=envs,
            final_obs=[f and f["image"] for f in final],
            final_mask=ended,
        )
        for i, e in enumerate(envs.tolist()):
            real = final[i] if ended[i] else {key: v[i] for key, v in nxt.items()}
            model.add(
                e,
                {key: v[i] for key, v in obs.items()},
                actions[i],
                rewards[i],
                {key: np.array(v) for key, v in real.items()},
                term[i],
                ended[i] & ~term[i],
            )
    assert rb.full and len(rb) == cap
    assert list(rb.observation_shape) == ["vec", "image"]  # the first add's key order
    check(rb, model, 50)
    # the image frames are de-duplicated as a plain buffer's
    assert rb.memory()["unique_frames"] == plain.memory()["unique_frames"] < 8 * cap / 2
    rb.save(tmp_path / "d.npz")
    back = ReplayBuffer.load(tmp_path / "d.npz", pool={"image": impl.FramePool((6, 5), np.uint8)})
    a, b = rb.sample(20), back.sample(20)
    for x, y in zip(a, b, strict=True):
        for key in x if isinstance(x, dict) else [None]:
            np.testing.assert_array_equal(
                x if key is None else x[key], y if key is None else y[key]
            )
    check(back, model, 20)


def test_sb3_dict_replay_buffer_values(impl):
    """The values SB3's DictReplayBuffer stores, channels-last frames as VecFrameStack gives."""
    sb3_buffers = pytest.importorskip("stable_baselines3.common.buffers")
    E, cap, k = 2, 16, 4
    space = Dict({"pixels": Box(0, 255, (6, 5, k), np.uint8), "state": Box(-9, 9, (2 * k,))})
    sb3 = sb3_buffers.DictReplayBuffer(cap * E, space, Discrete(4), n_envs=E)
    rb = ReplayBuffer(
        cap * E,
        num_envs=E,
        layout="last",
        stack_size=k,
        seed=0,
        pool={"pixels": impl.FramePool((6, 5, 1), np.uint8)},
    )
    frames = np.arange(E * 40).reshape(40, E) % 251

    def stacked(t):
        pixels = np.stack(
            [
                np.stack([np.full((6, 5), frames[t + i, e], np.uint8) for i in range(k)], -1)
                for e in range(E)
            ]
        )
        state = np.float32(
            [[frames[t + i, e] * 0.5 for i in range(k) for _ in (0, 1)] for e in range(E)]
        )
        return {"pixels": pixels, "state": state}

    for t in range(20):
        obs, nxt = stacked(t), stacked(t + 1)
        act, rew, done = (
            np.array([t % 4, 3 - t % 4]),
            np.float32([t, -t]),
            np.array([t % 5 == 4] * E),
        )
        sb3.add(obs, nxt, act, rew, done, [{}] * E)
        rb.add(obs, act, rew, nxt, done, [False] * E)
    s = rb.sample(40)
    row, env = s.indices // E, s.indices % E
    for key in ("pixels", "state"):
        np.testing.assert_array_equal(s.observations[key], sb3.observations[key][row, env])
        np.testing.assert_array_equal(
            s.next_observations[key], sb3.next_observations[key][row, env]
        )
    np.testing.assert_array_equal(s.actions, sb3.actions[row, env, 0])
    np.testing.assert_array_equal(s.rewards, sb3.rewards[row, env])
    np.testing.assert_array_equal(s.dones, sb3.dones[row, env])
    assert rb.observation_shape == {"pixels": (6, 5, k), "state": (2 * k,)}
    assert rb._leaves["pixels"]._k == k and rb._leaves["pixels"]._frame_shape == (6, 5, 1)


def test_frame_keys_option_and_out(impl):
    """frame_keys names the frame leaves (here a uint8 vector too); out= fills given dicts."""
    rb = ReplayBuffer(
        8, frame_keys=["img", "tag"], seed=0, pool={"img": impl.FramePool((2, 2), np.uint8)}
    )
    for t in range(5):
        obs = {
            "img": np.full((2, 2, 2), t, np.uint8),
            "tag": np.full((2, 1), t, np.uint8),
            "x": np.float64([t]),
        }
        rb.add(obs, t, 1.0, {key: v + 1 for key, v in obs.items()}, False, False)
    assert rb.layout == {"img": "stack", "tag": "stack"} and rb.observation_shape["x"] == (1,)
    out = tuple(
        {"img": np.empty((3, 2, 2, 2), np.float32), "tag": np.empty((3, 2, 1), np.float32)}
        for _ in range(2)
    )
    s = rb.sample(3, out=out, dtype=np.float32, scale=0.5)
    assert s.observations["img"] is out[0]["img"] and s.next_observations["tag"] is out[1]["tag"]
    t = s.indices.astype(np.float32)
    np.testing.assert_array_equal(s.observations["tag"][:, 0, 0], t * 0.5)
    np.testing.assert_array_equal(s.next_observations["img"][:, 1, 1, 1], (t + 1) * 0.5)
    np.testing.assert_array_equal(s.observations["x"][:, 0], t)  # as stored, not scaled
    with pytest.raises(TypeError, match="out must be a pair"):
        rb.sample(3, out=(out[0], {"img": out[1]["img"]}))

    state = rb._rng.bit_generator.state

    class Clears(dict):  # an out whose key check empties the buffer
        def keys(self):
            rb.clear()
            return super().keys()

    with pytest.raises(ValueError, match="empty ReplayBuffer"):
        rb.sample(3, out=(Clears(out[0]), out[1]), dtype=np.float32)
    assert rb._rng.bit_generator.state == state


def test_bad_dict_input_stores_nothing(impl):
    pool = impl.FramePool((2, 2), np.uint8)
    rb = ReplayBuffer(8, seed=0, pool={"img": pool})
    obs = {"img": np.zeros((2, 2, 2), np.uint8), "v": np.zeros(3, np.float32)}
    rb.add(obs, 0, 1.0, obs, False, False)
    live = pool.live_frames

    def refused(exc, match, o=obs, n=obs, **kw):
        with pytest.raises(exc, match=match):
            rb.add(o, 0, 1.0, n, False, False, **kw)
        assert len(rb) == 1 and pool.live_frames == live

    new = {"img": np.ones((2, 2, 2), np.uint8), "v": np.ones(3, np.float32)}
    refused(ValueError, "keys", n={"img": new["img"]})
    refused(TypeError, r"obs\['v'\] has dtype float64", o={**new, "v": np.ones(3)})
    refused(ValueError, r"next_obs\['v'\] has shape", n={**new, "v": np.ones(4, np.float32)})
    refused(TypeError, "must be a dict", o=new["img"])
    refused(ValueError, "but final_obs is None", n=new, final_obs=None, final_mask=True)
    with pytest.raises(ValueError, match="no frame leaf"):
        ReplayBuffer(4).add({"v": np.zeros(3)}, 0, 0.0, {"v": np.zeros(3)}, False, False)
    with pytest.raises(TypeError, match="keys must be strings"):
        ReplayBuffer(4).add({1: obs["img"]}, 0, 0.0, {1: obs["img"]}, False, False)
    plain = ReplayBuffer(4)
    plain.add(obs["img"], 0, 0.0, obs["img"], False, False)
    with pytest.raises(TypeError, match="single observations"):
        plain.add(obs, 0, 0.0, obs, False, False)
    with pytest.raises(TypeError, match="obs is not a dict"):
        ReplayBuffer(4, pool={"img": pool}).add(obs["img"], 0, 0.0, obs["img"], False, False)
    with pytest.raises(TypeError, match="pool must be a dict"):
        ReplayBuffer(4, pool=pool).add(obs, 0, 0.0, obs, False, False)
    with pytest.raises(TypeError, match="frame_keys"):
        ReplayBuffer(4, frame_keys=[1])
    assert pool.live_frames == live


def test_a_large_capacity_dict_buffer_grows_its_leaves(impl):
    rb = ReplayBuffer(10**9, seed=0, pool={"img": impl.FramePool((2, 2), np.uint8)})
    for t in range(70):
        obs = {"img": np.full((2, 2, 2), t, np.uint8), "v": np.full(5, t, np.float32)}
        rb.add(obs, t, 0.0, obs, False, False)
    assert rb._rows == 128 and rb._leaves["v"].obs.shape == (128, 5)
    assert rb.memory()["table_bytes"] < 16 << 10
    s = rb.sample(10)
    np.testing.assert_array_equal(s.observations["v"][:, 0], s.indices)
    np.testing.assert_array_equal(s.next_observations["img"][:, 0, 0, 0], s.indices)


def dict_checkpoint(tmp_path):
    """The members of a checkpoint of 5 Dict transitions (image (2, 2, 2) + vector (3,))."""
    rb = ReplayBuffer(8, seed=0)
    for t in range(5):
        obs = {"img": np.full((2, 2, 2), t, np.uint8), "v": np.full(3, t, np.float32)}
        rb.add(obs, t, 1.0, obs, False, False)
    rb.save(tmp_path / "d.npz")
    return entries(tmp_path / "d.npz")


def leaves_with(members, i, **changes):
    meta = json.loads(str(np.load(io.BytesIO(members["meta.npy"]))[()]))
    meta["leaves"][i].update(changes)
    return {**members, "meta.npy": npy(np.array(json.dumps(meta)))}


@pytest.mark.parametrize(
    "leaf,changes,match",
    [
        (0, {"kind": "other"}, "unexpected entries"),
        (0, {"key": 3}, "bad or repeated key"),
        (1, {"key": "img"}, "bad or repeated key"),
        (0, {"stack_size": 2**40}, "stack_size"),
        (0, {"frame_dtype": "<f8"}, "dtype float64"),
        (1, {"shape": [10**7]}, "leaf 'v' shape"),
        (1, {"shape": [4]}, r"shape \(5, 3\)"),
        (1, {"dtype": "|O"}, "bad dtype"),
        (1, {"kind": "frames"}, "unexpected entries"),
    ],
)
def test_crafted_dict_checkpoints_are_refused(tmp_path, leaf, changes, match):
    members = leaves_with(dict_checkpoint(tmp_path), leaf, **changes)
    assert_refused_quickly(craft(tmp_path / "bad.npz", members), match)


def test_dict_checkpoint_entries_and_pools(tmp_path):
    members = dict_checkpoint(tmp_path)
    assert set(members) == {
        *("meta.npy", "actions.npy", "rewards.npy", "flags.npy", "env_ids.npy"),
        *("frames_0.npy", "obs_index_0.npy", "next_index_0.npy", "obs_1.npy", "next_obs_1.npy"),
    }
    with pytest.raises(ValueError, match="unexpected entries"):
        ReplayBuffer.load(craft(tmp_path / "x.npz", {**members, "obs_0.npy": members["obs_1.npy"]}))
    with pytest.raises(ValueError, match="pool must be a dict"):
        ReplayBuffer.load(tmp_path / "d.npz", pool=lazyframes.FramePool((2, 2), np.uint8))
    with pytest.raises(ValueError, match="not frame keys"):
        ReplayBuffer.load(tmp_path / "d.npz", pool={"v": lazyframes.FramePool((3,), np.float32)})
    plain = ReplayBuffer(4)
    plain.add(np.zeros((2, 2, 2), np.uint8), 0, 0.0, np.zeros((2, 2, 2), np.uint8), False, False)
    plain.save(tmp_path / "p.npz")
    with pytest.raises(ValueError, match="single observations"):
        ReplayBuffer.load(tmp_path / "p.npz", pool={"img": lazyframes.FramePool((2, 2), np.uint8)})


def test_every_form_of_batched_dicts_stores_the_same(impl):
    """Dicts of (E, ...) arrays, lists of E dicts, LazyBatch leaves: the same transitions.

    And final_obs as an object array of dicts or as a dict of batched leaves.
    """
    E = 2
    pool = impl.FramePool((2, 2), np.uint8)
    frames = [
        [pool.push(np.full((2, 2), 10 * e + t, np.uint8)) for t in range(8)] for e in range(E)
    ]

    def lazy(t):
        return pool.lazy_batch([frames[e][t : t + 3] for e in range(E)], layout="stack")

    def vec(t):
        return np.float32([[e, t] for e in range(E)])

    def forms(t):
        arrays = {"img": np.asarray(lazy(t)), "v": vec(t)}
        return [
            arrays,
            [{key: v[e] for key, v in arrays.items()} for e in range(E)],
            {"img": lazy(t), "v": vec(t)},
        ]

    buffers = [ReplayBuffer(16, num_envs=E, seed=1, pool={"img": pool}) for _ in range(6)]
    for t in range(5):
        mask = np.array([t == 3, t == 2])
        fin = forms(t + 2)[0]  # some other observation as the final one
        as_objects = np.array([{key: v[e] for key, v in fin.items()} if mask[e] else None
                               for e in range(E)] + [None], object)[:-1]  # fmt: skip
        for i, rb in enumerate(buffers):
            o, n = forms(t)[i % 3], forms(t + 1)[i % 3]
            final = as_objects if i < 3 else forms(t + 2)[i % 3]
            rb.add(o, [0, 1], [t, -t], n, mask, [False] * E, final_obs=final, final_mask=mask)
    want = buffers[0].sample(32)
    assert set(want.indices.tolist()) == set(range(10))
    for rb in buffers[1:]:
        got = rb.sample(32)
        for key in ("img", "v"):
            np.testing.assert_array_equal(got.observations[key], want.observations[key])
            np.testing.assert_array_equal(got.next_observations[key], want.next_observations[key])
    i = list(want.indices).index(3 * E)  # env 0 at t == 3: its final observation
    np.testing.assert_array_equal(want.next_observations["v"][i], [0, 5])
    np.testing.assert_array_equal(want.next_observations["img"][i][:, 0, 0], [5, 6, 7])


def test_one_unbatched_dict_transition_with_its_final_obs(impl):
    rb = ReplayBuffer(4, seed=0, pool={"img": impl.FramePool((2, 2), np.uint8)})
    obs = {"img": np.zeros((3, 2, 2), np.uint8), "v": np.float32([1])}
    fin = {"img": np.full((3, 2, 2), 9, np.uint8), "v": np.float32([9])}
    rb.add(obs, 1, 1.0, obs, False, True, final_obs=fin, final_mask=True)
    s = rb.sample(1)
    assert s.next_observations["v"].tolist() == [[9.0]] and s.truncations.tolist() == [1.0]
    assert (s.next_observations["img"] == 9).all() and (s.observations["img"] == 0).all()


def test_dict_memory_and_clear(impl):
    pools = {"a": impl.FramePool((2, 2), np.uint8), "b": impl.FramePool((3, 3), np.uint8)}
    rb = ReplayBuffer(8, seed=0, pool=pools)
    for t in range(4):
        obs = {key: np.full((2, *p.frame_shape), t, np.uint8) for key, p in pools.items()}
        obs["v"] = np.float32([t, t])
        rb.add(obs, t, 1.0, {key: v + 1 for key, v in obs.items()}, False, False)
    m = rb.memory()
    assert m["unique_frames"] == 2 * 5 and m["frame_bytes"] == 4 + 9 and m["transitions"] == 4
    assert rb.pool == pools and rb.layout == {"a": "stack", "b": "stack"}
    rb.clear()
    assert len(rb) == 0 and all(p.live_frames == 0 for p in pools.values())
    rb.add(obs, 0, 2.0, obs, True, False)
    s = rb.sample(2)
    assert s.rewards.tolist() == [2.0, 2.0] and (s.observations["b"] == 3).all()
