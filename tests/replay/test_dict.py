"""ReplayBuffer of Dict observations: exact values against the model and SB3's DictReplayBuffer."""

import pickle

import numpy as np
import pytest
from conftest import buffer_state, recorded, refused
from gymnasium.spaces import Box, Dict, Discrete
from oracle.replay import ReplayModel
from test_checkpoint import assert_refused, craft, entries, with_meta

from lazyframes import FramePool, ReplayBuffer


def per_env(batch, n):
    """A dict of ``(n, ...)`` arrays as ``n`` dicts of arrays, one per env."""
    return [{key: v[i] for key, v in batch.items()} for i in range(n)]


def check(rb, model, batch, dtype=None, scale=None):
    """Sample ``batch`` transitions and compare every field with the model's."""
    s = rb.sample(batch, dtype=dtype, scale=scale)
    assert list(s.observations) == list(s.next_observations) == list(rb.observation_shape)
    for i, idx in enumerate(s.indices.tolist()):
        want = model.expected(idx)
        assert want is not None, f"drew position {idx}, not sampleable"
        for key in want.observations:
            for got, w in ((s.observations, want.observations),
                           (s.next_observations, want.next_observations)):  # fmt: skip
                w = w[key]
                if key in rb.layout and scale is not None:  # frame leaves: converted, scaled
                    w = w.astype(dtype) * np.asarray(scale, dtype)
                np.testing.assert_array_equal(got[key][i], w, f"{key} at {idx}", strict=True)
        for name in ("actions", "dones", "truncations", "rewards", "discounts"):
            assert getattr(s, name)[i] == getattr(want, name), f"{name} at {idx}"
    return s


def vector_arrays(envs, counts, k=4):
    """Dict observations of ``envs``, stacked: env e's frames count up to ``counts[e]``."""
    c = np.array([np.arange(counts[e] - k + 1, counts[e] + 1) for e in envs])  # (E, k)
    e = np.asarray(envs)[:, None]
    image = np.broadcast_to(
        ((100 * e + c) % 251).astype(np.uint8)[..., None, None], c.shape + (6, 5)
    )
    vec = np.stack([100 * e + c, np.broadcast_to(e, c.shape), c], -1).astype(np.float32)
    return {"vec": vec, "image": image.copy()}


@pytest.mark.parametrize("compress", [False, True])
def test_ndarray_dicts_with_env_ids_and_final_obs(compress, tmp_path):
    """Batched dicts of ndarrays, async env ids, final observations; checkpoint round trip."""
    E, cap = 3, 30
    rng = np.random.default_rng(5)
    pool = {"image": FramePool((6, 5), np.uint8)}
    rb = ReplayBuffer(cap, num_envs=E, n_step=2, gamma=0.5, seed=3, pool=pool, compress=compress)
    model = ReplayModel(cap, num_envs=E, n_step=2, gamma=0.5)
    plain = ReplayBuffer(cap, num_envs=E, n_step=2, gamma=0.5, seed=3, compress=compress,
                         pool=FramePool((6, 5), np.uint8))  # the image leaf alone  # fmt: skip
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
        args = (actions, rewards)
        flags = {"env_ids": envs, "final_mask": ended}
        rb.add(obs, *args, nxt, term, ended & ~term, final_obs=final, **flags)
        images = [f and f["image"] for f in final]
        plain.add(obs["image"], *args, nxt["image"], term, ended & ~term, final_obs=images, **flags)
        n = len(envs)
        model.add(per_env(obs, n), *args, per_env(nxt, n), term, ended & ~term, final_obs=final,
                  **flags)  # fmt: skip
    assert rb.full and len(rb) == cap
    assert list(rb.observation_shape) == ["vec", "image"]  # the first add's key order
    check(rb, model, 50)
    # the image frames are de-duplicated as a plain buffer's
    assert rb.memory()["unique_frames"] == plain.memory()["unique_frames"] < 8 * cap / 2
    rb.save(tmp_path / "d.npz")
    back = ReplayBuffer.load(tmp_path / "d.npz", pool={"image": FramePool((6, 5), np.uint8)})
    assert pickle.dumps(back) == pickle.dumps(rb)  # the same checkpoint: same draws to come
    check(back, model, 20)


def test_sb3_dict_replay_buffer_values():
    """The values SB3's DictReplayBuffer stores, channels-last frames as VecFrameStack gives."""
    sb3_buffers = pytest.importorskip("stable_baselines3.common.buffers")
    E, cap, k = 2, 16, 4
    space = Dict({"pixels": Box(0, 255, (6, 5, k), np.uint8), "state": Box(-9, 9, (2 * k,))})
    sb3 = sb3_buffers.DictReplayBuffer(cap * E, space, Discrete(4), n_envs=E)
    pool = {"pixels": FramePool((6, 5, 1), np.uint8)}
    rb = ReplayBuffer(cap * E, num_envs=E, layout="last", stack_size=k, seed=0, pool=pool)
    frames = np.arange(E * 40).reshape(40, E) % 251

    def stacked(t):
        v = frames[t : t + k].T  # (E, k): env e's frames t..t+k-1
        pixels = np.broadcast_to(v[:, None, None, :].astype(np.uint8), (E, 6, 5, k)).copy()
        return {"pixels": pixels, "state": np.repeat(v * 0.5, 2, axis=1).astype(np.float32)}

    for t in range(20):
        obs, nxt = stacked(t), stacked(t + 1)
        act, rew, done = np.array([t % 4, 3 - t % 4]), np.float32([t, -t]), [t % 5 == 4] * E
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
    assert rb.stack_size == {"pixels": k} and rb.pool["pixels"].frame_shape == (6, 5, 1)


def test_frame_keys_option_and_out():
    """frame_keys names the frame leaves (here a uint8 vector too); out= fills given dicts."""
    rb = ReplayBuffer(
        8, frame_keys=["img", "tag"], seed=0, pool={"img": FramePool((2, 2), np.uint8)}
    )
    for t in range(5):
        obs = {"img": np.full((2, 2, 2), t, np.uint8),
               "tag": np.full((2, 1), t, np.uint8), "x": np.float64([t])}  # fmt: skip
        rb.add(obs, t, 1.0, {key: v + 1 for key, v in obs.items()}, False, False)
    assert rb.layout == {"img": "stack", "tag": "stack"} and rb.observation_shape["x"] == (1,)
    out = tuple({"img": np.empty((3, 2, 2, 2), np.float32),
                 "tag": np.empty((3, 2, 1), np.float32)} for _ in range(2))  # fmt: skip
    s = rb.sample(3, out=out, dtype=np.float32, scale=0.5)
    assert s.observations["img"] is out[0]["img"] and s.next_observations["tag"] is out[1]["tag"]
    t = s.indices.astype(np.float32)
    np.testing.assert_array_equal(s.observations["tag"][:, 0, 0], t * 0.5)
    np.testing.assert_array_equal(s.next_observations["img"][:, 1, 1, 1], (t + 1) * 0.5)
    np.testing.assert_array_equal(s.observations["x"][:, 0], t)  # as stored, not scaled
    refused(TypeError, "out must be a pair", rb.sample, 3, out=(out[0], {"img": out[1]["img"]}))

    twin = pickle.loads(pickle.dumps(rb))  # the same transitions and RNG state
    twin.clear()

    class Clears(dict):  # an out whose key check empties the buffer
        def keys(self):
            rb.clear()
            return super().keys()

    with pytest.raises(ValueError, match="empty ReplayBuffer"):
        rb.sample(3, out=(Clears(out[0]), out[1]), dtype=np.float32)
    assert pickle.dumps(rb) == pickle.dumps(twin)  # cleared, and no draw was made


def test_bad_dict_input_stores_nothing():
    pool = FramePool((2, 2), np.uint8)
    rb = ReplayBuffer(8, seed=0, pool={"img": pool})
    obs = {"img": np.zeros((2, 2, 2), np.uint8), "v": np.zeros(3, np.float32)}
    rb.add(obs, 0, 1.0, obs, False, False)
    before = buffer_state(rb)

    def refused(exc, match, o=obs, n=obs, **kw):
        with pytest.raises(exc, match=match):
            rb.add(o, 0, 1.0, n, False, False, **kw)
        assert buffer_state(rb) == before

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
    # (frame_keys=[1]: test_buffer's constructor table)
    assert buffer_state(rb) == before


def test_a_large_capacity_dict_buffer_grows_its_leaves():
    rb = ReplayBuffer(10**9, seed=0, pool={"img": FramePool((2, 2), np.uint8)})
    sizes = []
    for t in range(70):
        obs = {"img": np.full((2, 2, 2), t, np.uint8), "v": np.full(5, t, np.float32)}
        rb.add(obs, t, 0.0, obs, False, False)
        sizes.append(rb.memory()["table_bytes"])
    fixed = ReplayBuffer(10**9).memory()["table_bytes"]
    per_row = (sizes[0] - fixed) / 64  # 64 rows first, then 128: the leaf's rows too
    assert per_row >= 2 * 5 * 4 and sizes[63] == sizes[0] and sizes[64] == fixed + 128 * per_row
    assert sizes[-1] < 16 << 10
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


@pytest.mark.parametrize(
    "leaf,changes,match",
    [
        (0, {"kind": "other"}, "unexpected entries"), (0, {"key": 3}, "bad or repeated key"),
        (1, {"key": "img"}, "bad or repeated key"), (0, {"stack_size": 2**40}, "stack_size"),
        (0, {"frame_dtype": "<f8"}, "dtype float64"), (1, {"shape": [10**7]}, "leaf 'v' shape"),
        (1, {"shape": [4]}, r"shape \(5, 3\)"), (1, {"dtype": "|O"}, "bad dtype"),
        (1, {"kind": "frames"}, "unexpected entries"),
    ],
)  # fmt: skip
def test_crafted_dict_checkpoints_are_refused(tmp_path, leaf, changes, match):
    members = with_meta(dict_checkpoint(tmp_path), lambda m: m["leaves"][leaf].update(changes))
    assert_refused(craft(tmp_path / "bad.npz", members), match)


def test_dict_checkpoint_entries_and_pools(tmp_path):
    members = dict_checkpoint(tmp_path)
    assert set(members) == {
        *("meta.npy", "actions.npy", "rewards.npy", "flags.npy", "env_ids.npy"),
        *("frames_0.npy", "obs_index_0.npy", "next_index_0.npy", "obs_1.npy", "next_obs_1.npy"),
    }
    with pytest.raises(ValueError, match="unexpected entries"):
        ReplayBuffer.load(craft(tmp_path / "x.npz", {**members, "obs_0.npy": members["obs_1.npy"]}))
    with pytest.raises(ValueError, match="pool must be a dict"):
        ReplayBuffer.load(tmp_path / "d.npz", pool=FramePool((2, 2), np.uint8))
    with pytest.raises(ValueError, match="not frame keys"):
        ReplayBuffer.load(tmp_path / "d.npz", pool={"v": FramePool((3,), np.float32)})
    plain = ReplayBuffer(4)
    plain.add(np.zeros((2, 2, 2), np.uint8), 0, 0.0, np.zeros((2, 2, 2), np.uint8), False, False)
    plain.save(tmp_path / "p.npz")
    with pytest.raises(ValueError, match="single observations"):
        ReplayBuffer.load(tmp_path / "p.npz", pool={"img": FramePool((2, 2), np.uint8)})


def test_every_form_of_batched_dicts_stores_the_same():
    """Dicts of arrays or LazyBatch leaves, lists of dicts; final_obs as objects or as next_obs."""
    E, pool, vpool = 2, FramePool((2, 2), np.uint8), FramePool((2,), np.float32)
    frames = [[pool.push(np.full((2, 2), 10 * e + t, np.uint8)) for t in range(8)]
              for e in range(E)]  # fmt: skip
    vecs = [[vpool.push(np.float32([e, t])) for t in range(8)] for e in range(E)]

    def lazy(p, refs, t):
        return p.lazy_batch([refs[e][t : t + 3] for e in range(E)], layout="stack")

    def forms(t):
        img, v = lazy(pool, frames, t), lazy(vpool, vecs, t)
        arrays = {"img": np.asarray(img), "v": np.asarray(v)}
        return [arrays, [{key: x[e] for key, x in arrays.items()} for e in range(E)],
                {"img": img, "v": v}, [{"img": img[e], "v": v[e]} for e in range(E)]]  # fmt: skip

    pools = [{"img": pool}] * 3 + [None]  # the LazyFrames form: the buffer adopts their pool
    buffers = [ReplayBuffer(16, num_envs=E, seed=1, pool=pools[i % 4]) for i in range(8)]
    for t in range(5):
        mask = np.array([t == 3, t == 2])
        fin = forms(t + 2)[0]  # some other observation as the final one
        as_objects = np.array([{key: v[e] for key, v in fin.items()} if mask[e] else None
                               for e in range(E)] + [None], object)[:-1]  # fmt: skip
        for i, rb in enumerate(buffers):
            o, n = forms(t)[i % 4], forms(t + 1)[i % 4]
            final = as_objects if i < 4 else forms(t + 2)[i % 4]
            rb.add(o, [0, 1], [t, -t], n, mask, [False] * E, final_obs=final, final_mask=mask)
    assert buffers[3].pool == {"img": pool}  # the LazyFrames' pool, adopted: no frame copied
    assert buffers[3].observation_shape == {"img": (3, 2, 2), "v": (3, 2)}
    want = buffers[0].sample(32)
    assert set(want.indices.tolist()) == set(range(10))
    for rb in buffers[1:]:
        got = rb.sample(32)
        for key in ("img", "v"):
            np.testing.assert_array_equal(got.observations[key], want.observations[key])
            np.testing.assert_array_equal(got.next_observations[key], want.next_observations[key])
    i = list(want.indices).index(3 * E)  # env 0 at t == 3: its final observation
    np.testing.assert_array_equal(want.next_observations["v"][i][:, 1], [5, 6, 7])
    np.testing.assert_array_equal(want.next_observations["img"][i][:, 0, 0], [5, 6, 7])


def test_one_unbatched_dict_transition_with_its_final_obs():
    rb = ReplayBuffer(4, seed=0, pool={"img": FramePool((2, 2), np.uint8)})
    obs = {"img": np.zeros((3, 2, 2), np.uint8), "v": np.float32([1])}
    fin = {"img": np.full((3, 2, 2), 9, np.uint8), "v": np.float32([9])}
    rb.add(obs, 1, 1.0, obs, False, True, final_obs=fin, final_mask=True)
    s = rb.sample(1)
    assert s.next_observations["v"].tolist() == [[9.0]] and s.truncations.tolist() == [1.0]
    assert (s.next_observations["img"] == 9).all() and (s.observations["img"] == 0).all()


def test_dict_memory_and_clear():
    pools = {"a": FramePool((2, 2), np.uint8), "b": FramePool((3, 3), np.uint8)}
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


@pytest.mark.parametrize("restore", ["load", "pickle"])
def test_compressed_dict_buffers_stay_compressed(restore, tmp_path):
    """Checkpoints hold the frame leaf compressed; a restored buffer keeps compressing."""
    frames = recorded("pong")[0]  # real frames: they compress

    def add(rb, t):
        obs = {"pixels": frames[t : t + 4], "state": np.float32([t, -t])}
        nxt = {"pixels": frames[t + 1 : t + 5], "state": np.float32([t + 1, -t - 1])}
        rb.add(obs, t % 3, 1.0, nxt, False, False)

    rb = ReplayBuffer(200, compress={"group": 8}, seed=0)
    for t in range(60):
        add(rb, t)
    rb.save(tmp_path / "rb.npz")
    raw = 64 * frames[0].nbytes  # the frames of the file, uncompressed
    assert (tmp_path / "rb.npz").stat().st_size < raw / 4
    if restore == "load":
        back = ReplayBuffer.load(tmp_path / "rb.npz")
    else:
        back = pickle.loads(pickle.dumps(rb))
    rb.flush()
    assert back.memory()["compression"] == rb.memory()["compression"]
    assert back.memory()["cold_frames"] == rb.memory()["cold_frames"] == 64  # repeats too
    for t in range(60, 100):
        add(back, t)
    back.flush()
    m = back.memory()
    # 40 new frames (frame 99 repeats 98, yet is a frame of its own: see FramePool._push_dedup),
    # and the k old ones of the first add's observation stored anew (see ReplayBuffer.flush)
    assert np.array_equal(frames[98], frames[99])
    assert m["hot_frames"] == 0 and m["cold_frames"] == m["unique_frames"] == 64 + 40 + 4
    assert m["cold_bytes"] < m["unique_frames"] * frames[0].nbytes / 4
