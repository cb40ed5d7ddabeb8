"""Every space Gymnasium's FrameStackObservation takes, against it; Box leaves lazy, a pool each."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Text, Tuple
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers import FrameStackObservation as GymFSO

from lazyframes import _core as core
from lazyframes import vector
from lazyframes.wrappers import FrameStackObservation, leaves


def image_vector_space():
    """Image + feature vector + discrete leaves, with a nested Tuple."""
    return Dict(
        {
            "image": Box(0, 255, (4, 3, 1), np.uint8),
            "vec": Box(-1.0, 1.0, (3,), np.float32),
            "pos": Box(2.0, 9.0, (2,), np.float32),  # bounds exclude zero: zero padding is 2
            "d": Discrete(5, start=2),
            "more": Tuple((MultiDiscrete([3, 4]), MultiBinary(2))),
        }
    )


def value(space, v):
    """An element of ``space`` that encodes the counter value ``v``."""
    if isinstance(space, Dict):
        return {key: value(sub, v) for key, sub in space.spaces.items()}
    if isinstance(space, Tuple):
        return tuple(value(sub, v) for sub in space.spaces)
    if isinstance(space, Box):
        x = np.full(space.shape, v % 200, np.float64) / (100 if space.dtype.kind == "f" else 1)
        return np.clip(x, space.low, space.high).astype(space.dtype)
    if isinstance(space, Discrete):
        return np.int64(space.start + v % space.n)
    if isinstance(space, MultiDiscrete):
        return (v % space.nvec).astype(space.dtype)
    if isinstance(space, MultiBinary):
        return np.full(space.shape, v % 2, space.dtype)
    if isinstance(space, Text):
        return "ab"[v % 2] * (1 + v % 3)
    raise TypeError(space)


class SpaceEnv(gym.Env):
    """Observation ``value(space, 10 * episode + t)``; episode lengths drawn in [1, 4]."""

    metadata = {"render_modes": []}  # noqa: RUF012 - Gymnasium's class attribute

    def __init__(self, space, seed=0):
        self.observation_space = space
        self.action_space = Discrete(2)
        self.rng = np.random.default_rng(seed)
        self.episode, self.t, self.len = 0, 0, 1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        self.len = int(self.rng.integers(1, 5))
        return value(self.observation_space, 10 * self.episode), {}

    def step(self, action):
        self.t += 1
        done = self.t >= self.len
        return value(self.observation_space, 10 * self.episode + self.t), 1.0, done, False, {}


def pools_of(space):
    """A dict/tuple like ``space`` with a pool for each Box leaf."""
    if isinstance(space, Dict):
        return {key: pools_of(sub) for key, sub in space.spaces.items()}
    if isinstance(space, Tuple):
        return tuple(pools_of(sub) for sub in space.spaces)
    return core.FramePool(space.shape, space.dtype) if isinstance(space, Box) else None


def assert_same(ours, ref, space, lazy=True):
    """``ours`` equals Gymnasium's ``ref`` leaf by leaf; Box leaves are LazyFrames/LazyBatch."""
    if isinstance(space, (Dict, Tuple)):
        assert type(ours) is type(ref)
    if isinstance(space, Dict):
        assert list(ours) == list(ref)
    for path, leaf in leaves(space):
        a, b = ours, ref
        for p in path:
            a, b = a[p], b[p]
        if isinstance(leaf, Box) and lazy:
            assert isinstance(a, (core.LazyFrames, core.LazyBatch))
        elif not isinstance(leaf, Text):
            assert type(a) is np.ndarray
        if isinstance(leaf, Text):
            assert a == b
        else:
            a = np.asarray(a)
            np.testing.assert_array_equal(a, b, strict=True)


SPACES = {"dict": image_vector_space(),
          "tuple": Tuple((Box(0, 255, (4, 3, 1), np.uint8), Discrete(3))),
          "discrete": Discrete(7, start=-3),
          "multidiscrete": MultiDiscrete([[2, 3], [4, 5]]),
          "text": Dict({"text": Text(4, charset="ab"), "image": Box(0, 255, (2, 2), np.uint8)}),
          "box-above-zero": Box(5, 9, (3,), np.int16)}  # fmt: skip


@pytest.mark.parametrize("padding", ["reset", "zero", "custom"])
@pytest.mark.parametrize("name", list(SPACES))
def test_single_env_equals_gymnasium(name, padding):
    space = SPACES[name]
    pad = value(space, 7) if padding == "custom" else padding
    ours = FrameStackObservation(SpaceEnv(space), 3, padding_type=pad, pool=pools_of(space))
    ref = GymFSO(SpaceEnv(space), 3, padding_type=pad)
    assert ours.observation_space == ref.observation_space and ours.padding_type == ref.padding_type
    for _ in range(2):  # step before reset: Gymnasium pads with the zero value
        assert_same(ours.step(0)[0], ref.step(0)[0], space)
    o, r = ours.reset(seed=0)[0], ref.reset(seed=0)[0]
    ends = 0
    for _ in range(30):
        assert_same(o, r, space)
        assert ours.observation_space.contains(r)
        o, _, done, _, _ = ours.step(0)
        r, *_ = ref.step(0)
        if done:
            assert_same(o, r, space)
            o, r, ends = ours.reset()[0], ref.reset()[0], ends + 1
    assert ends >= 5


def test_dict_leaves_are_stacked_lazily_one_pool_each_in_the_layout():
    space = image_vector_space()
    pools = pools_of(space)
    env = FrameStackObservation(SpaceEnv(space), 4, padding_type="zero", pool=pools)
    assert env.pool == {**pools, "d": None, "more": (None, None)}
    obs, _ = env.reset()
    assert env.pool["image"].live_frames == 2  # the zero frame and the reset frame
    assert [int(x) for x in np.asarray(obs["image"])[:, 0, 0, 0]] == [0, 0, 0, 10]
    assert np.asarray(obs["pos"]).tolist() == [[2.0, 2.0]] * 3 + [[2.0, 2.0]]
    assert obs["d"].tolist() == [2, 2, 2, 2 + 10 % 5]
    assert obs["more"][0].tolist() == [[0, 0]] * 3 + [[1, 2]]
    env.step(0)
    eager = FrameStackObservation(SpaceEnv(space), 4, lazy=False, pool=pools_of(space))
    obs, _ = eager.reset()
    assert type(obs["image"]) is np.ndarray and obs["image"].shape == (4, 4, 3, 1)
    # other layouts apply to the Box leaves
    space = Dict({"image": Box(0, 255, (4, 3, 2), np.uint8), "d": Discrete(3)})
    env = FrameStackObservation(SpaceEnv(space), 3, layout="last", pool=pools_of(space))
    assert env.observation_space == Dict(
        {"image": Box(0, 255, (4, 3, 6), np.uint8), "d": MultiDiscrete([3, 3, 3])}
    )
    obs, _ = env.reset()
    assert obs["image"].shape == (4, 3, 6) and obs["d"].tolist() == [1, 1, 1]


def test_pool_errors():
    space = image_vector_space()
    with pytest.raises(TypeError, match="dict or tuple of FramePools"):
        FrameStackObservation(SpaceEnv(space), 3, pool=core.FramePool((4, 3, 1), np.uint8))
    with pytest.raises(TypeError, match="not a Box"):
        FrameStackObservation(SpaceEnv(space), 3, pool={"d": core.FramePool((1,), np.int64)})
    with pytest.raises(ValueError, match="shape"):
        FrameStackObservation(SpaceEnv(space), 3, pool={"vec": core.FramePool((4,), np.float32)})


VECTOR_SPACES = ["dict", "tuple", "discrete", "multidiscrete", "box-above-zero"]


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("padding", ["reset", "zero", "custom"])
@pytest.mark.parametrize("name", VECTOR_SPACES)
def test_vector_equals_gymnasium_per_env(name, padding, mode):
    space, n, k = SPACES[name], 3, 3
    pad = value(space, 7) if padding == "custom" else padding
    fns = [lambda i=i: SpaceEnv(space, seed=i) for i in range(n)]
    ours = vector.FrameStackObservation(
        SyncVectorEnv(fns, autoreset_mode=mode), k, padding_type=pad, pool=pools_of(space)
    )
    ref = SyncVectorEnv(
        [lambda fn=fn: GymFSO(fn(), k, padding_type=pad) for fn in fns], autoreset_mode=mode
    )
    assert ours.single_observation_space == ref.single_observation_space
    assert ours.observation_space == ref.observation_space
    o, r = ours.reset(seed=0)[0], ref.reset(seed=0)[0]
    finals = 0
    for _ in range(25):
        assert_same(o, r, space)
        o, _, _, _, info = ours.step(np.zeros(n, np.int64))
        r, _, _, _, info2 = ref.step(np.zeros(n, np.int64))
        if "final_obs" in info2:
            np.testing.assert_array_equal(info["_final_obs"], info2["_final_obs"])
            for i in np.flatnonzero(info2["_final_obs"]):
                assert_same(info["final_obs"][i], info2["final_obs"][i], space)
                finals += 1
    assert finals >= 5 or mode == AutoresetMode.NEXT_STEP


def test_vector_refuses_other_leaves():
    space = SPACES["text"]
    with pytest.raises(TypeError, match="Box, Discrete, MultiDiscrete and MultiBinary"):
        vector.FrameStackObservation(SyncVectorEnv([lambda: SpaceEnv(space)]), 3)
