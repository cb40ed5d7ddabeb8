"""ScaledFloatFrame keeps the saving: uint8 frames stored once, baselines' float32 values out.

Differential against the restatement of baselines' ``ScaledFloatFrame`` + ``FrameStack``
(bench/baselines.py) and Gymnasium's stackers, on real ALE frames.
"""

import pickle

import ale_py
import gymnasium as gym
import numpy as np
import pytest
from conftest import refused

import lazyframes
from bench.baselines import BaselinesFrameStack, BaselinesScaledFloatFrame
from lazyframes import ScaledFloatFrame, ScaledLazyBatch, ScaledLazyFrames

gym.register_envs(ale_py)


class WarpFrame(gym.ObservationWrapper):
    """baselines' WarpFrame in shape: 84x84 grayscale frames with a channel axis."""

    def __init__(self, env):
        super().__init__(gym.wrappers.AtariPreprocessing(env, frame_skip=1, noop_max=0))
        self.observation_space = gym.spaces.Box(0, 255, (84, 84, 1), np.uint8)

    def observation(self, frame):
        return frame[:, :, None]


class ClipReward(gym.RewardWrapper):  # baselines' ClipRewardEnv: between the two
    def reward(self, reward):
        return float(np.sign(reward))


def atari():
    return WarpFrame(gym.make("ALE/Breakout-v5", frameskip=4, repeat_action_probability=0.0))


def test_the_exact_values_are_baselines_division_not_a_multiply():
    x = np.arange(256, dtype=np.uint8)
    pool = lazyframes.FramePool((256,), np.uint8)
    obs = ScaledLazyFrames(pool.lazy([pool.push(x)], layout="stack"))
    want = x.astype(np.float32) / 255.0
    assert np.asarray(obs).tobytes() == want.tobytes()  # bit for bit
    assert np.count_nonzero(x.astype(np.float32) * np.float32(1 / 255) != want) == 126
    assert obs.astype(np.float64)[0].tolist() == want.astype(np.float64).tolist()


def test_frame_stack_over_scaled_float_frame_equals_baselines_on_atari():
    # wrap_deepmind(scale=True)'s order: WarpFrame, ScaledFloatFrame, ClipRewardEnv, FrameStack
    ours = lazyframes.FrameStack(ClipReward(ScaledFloatFrame(atari())), 4)
    ref = BaselinesFrameStack(ClipReward(BaselinesScaledFloatFrame(atari())), 4)
    assert ours.observation_space == gym.spaces.Box(0, 1, (84, 84, 4), np.float32)
    o, _ = ours.reset(seed=1)
    r, _ = ref.reset(seed=1)
    rng = np.random.default_rng(0)
    for t in range(300):
        assert type(o) is ScaledLazyFrames and o.pool.dtype == np.uint8
        a = np.asarray(o)
        assert a.dtype == np.float32 and a.tobytes() == np.asarray(r).tobytes(), f"step {t}"
        if t % 50 == 0:  # baselines' accessors on the float values
            assert len(o) == len(r) and o.count() == r.count()
            assert np.array_equal(o[3], r[3]) and np.array_equal(o.frame(2), r.frame(2))
        act = int(rng.integers(4))
        o, rw, te, tr, _ = ours.step(act)
        r, rw2, te2, tr2, _ = ref.step(act)
        assert (rw, te, tr) == (rw2, te2, tr2)
        if te or tr:
            o, _ = ours.reset()
            r, _ = ref.reset()
    # each frame's bytes, once: 7,056 B a frame, not baselines' 28,224
    assert o.pool.frame_bytes == 84 * 84 and o.pool.live_frames <= 4
    back = pickle.loads(pickle.dumps(o))
    assert type(back) is ScaledLazyFrames and np.asarray(back).tobytes() == np.asarray(o).tobytes()


def test_scaled_float_frame_alone_is_baselines():
    ours, ref = ScaledFloatFrame(atari()), BaselinesScaledFloatFrame(atari())
    assert ours.observation_space == ref.observation_space
    o, _ = ours.reset(seed=2)
    r, _ = ref.reset(seed=2)
    assert type(o) is np.ndarray and o.dtype == np.float32 and o.tobytes() == r.tobytes()


def test_gymnasium_stackers_over_it_give_the_same_values():
    ours = lazyframes.FrameStackObservation(ScaledFloatFrame(atari()), 4, padding_type="zero")
    ref = gym.wrappers.FrameStackObservation(ScaledFloatFrame(atari()), 4, padding_type="zero")
    assert ours.observation_space == ref.observation_space
    o, _ = ours.reset(seed=3)
    r, _ = ref.reset(seed=3)
    for t in range(40):
        assert np.asarray(o).tobytes() == r.tobytes(), t
        o, *_ = ours.step(t % 4)
        r, *_ = ref.step(t % 4)
    make = [lambda: ScaledFloatFrame(atari()) for _ in range(2)]
    vec = lazyframes.vector.FrameStackObservation(gym.vector.SyncVectorEnv(make), 4)
    o, _ = vec.reset(seed=[4, 5])  # against Gymnasium's single-env stacks, env by env
    singles = [gym.wrappers.FrameStackObservation(ScaledFloatFrame(atari()), 4) for _ in range(2)]
    rs = [s.reset(seed=4 + i)[0] for i, s in enumerate(singles)]
    for t in range(30):
        assert type(o) is ScaledLazyBatch and type(o[1]) is ScaledLazyFrames
        assert np.asarray(o).tobytes() == np.stack(rs).tobytes(), t
        o, _, te, tr, _ = vec.step(np.array([t % 4, 1]))
        rs = [s.step(a)[0] for s, a in zip(singles, (t % 4, 1), strict=True)]
        assert not (te.any() or tr.any())


@pytest.mark.parametrize("compress", [False, True])
def test_replay_keeps_the_bytes_and_samples_the_exact_floats(compress, tmp_path):
    envs = [lazyframes.FrameStack(ScaledFloatFrame(atari()), 4, layout="stack") for _ in "ab"]
    plain = lazyframes.FrameStack(atari(), 4, layout="stack")
    bufs = [lazyframes.ReplayBuffer(500, seed=0, compress=compress) for _ in "ab"]
    obs = [envs[0].reset(seed=6)[0], plain.reset(seed=6)[0]]
    floats = {}
    for t in range(200):
        nxt = [envs[0].step(t % 4)[0], plain.step(t % 4)[0]]
        for rb, o, n in zip(bufs, obs, nxt, strict=True):
            rb.add(o, t, 0.0, n, False, False)
        floats[t] = np.asarray(obs[0])
        obs = nxt
    scaled, raw = bufs
    assert scaled.memory()["bytes_held"] == raw.memory()["bytes_held"]  # the same bytes
    s = scaled.sample(64)
    assert s.observations.dtype == np.float32
    for i, a in zip(s.indices.tolist(), s.observations, strict=True):
        assert a.tobytes() == floats[i].tobytes()
    u = raw.gather(s.indices)  # the bytes of the same transitions
    assert s.observations.tobytes() == (u.observations.astype(np.float32) / 255.0).tobytes()
    w = scaled.sample_sequences(2, 5, within_episode=True, frames=True)
    assert (
        w.frames.dtype == np.float32
        and w.observations[0, 0].tobytes() == floats[int(w.indices[0])].tobytes()
    )
    refused(
        TypeError, "ScaledFloatFrame's floats", scaled.sample, 4, dtype=np.float32, scale=1 / 255
    )
    refused(TypeError, "ScaledFloatFrame's floats", scaled.sample, 4, dtype=np.uint8)
    refused(
        ValueError, "is not ScaledFloatFrame's", scaled.add, obs[1], 0, 0.0, obs[1], False, False
    )
    refused(ValueError, "is ScaledFloatFrame's", raw.add, obs[0], 0, 0.0, obs[0], False, False)
    scaled.save(tmp_path / "rb.npz")
    back = lazyframes.ReplayBuffer.load(tmp_path / "rb.npz")
    assert back.sample(8).observations.dtype == np.float32
    assert np.array_equal(back.gather(s.indices).observations, s.observations)


def test_values_that_are_not_its_quotients_are_refused():
    class Brighten(gym.ObservationWrapper):  # changes the floats after ScaledFloatFrame
        def observation(self, obs):
            return np.minimum(obs * 1.01, 1.0).astype(np.float32)

    env = lazyframes.FrameStack(Brighten(ScaledFloatFrame(atari())), 4)
    refused(ValueError, "not a byte divided by 255", env.reset, seed=0)
    # over float observations ScaledFloatFrame is baselines' and the stack stacks floats
    cart = lazyframes.FrameStack(ScaledFloatFrame(gym.make("CartPole-v1")), 2)
    o, _ = cart.reset(seed=0)
    assert type(o) is lazyframes.LazyFrames and o.dtype == np.float32
