"""Every Gymnasium version supported (CI: newest; by hand: 0.29.1): no 1.x-only API used."""

import copy
import importlib
import sys

import gymnasium as gym
import numpy as np
import pytest
from counter_env import CounterEnv, mk, values

from lazyframes import ReplayBuffer
from lazyframes import _core as core
from lazyframes.wrappers import FrameStack, FrameStackObservation

VERSION = tuple(int(x) for x in gym.__version__.split(".")[:2])


@pytest.mark.parametrize(
    "padding, first",
    [
        ("reset", [10, 10, 10]),
        ("zero", [0, 0, 10]),
        (np.full((84, 84, 1), 7, np.uint8), [7, 7, 10]),
    ],
    ids=["reset", "zero", "custom"],
)
def test_single_env_wrapper(padding, first):
    env = mk(FrameStackObservation, CounterEnv(length=2), 3, padding_type=padding)
    assert env.observation_space == gym.spaces.Box(0, 255, (3, 84, 84, 1), np.uint8)
    assert values(env.reset()[0]) == first and values(env.step(0)[0]) == first[1:] + [11]
    twin = copy.deepcopy(env)
    assert values(twin.step(0)[0]) == values(env.step(0)[0]) == first[2:] + [11, 12]
    env.close()
    assert values(env.reset()[0]) == ([20, 20, 20] if first[0] == 10 else first[:2] + [20])


def test_framestack_and_dict_of_boxes():
    env = mk(FrameStack, CounterEnv((4, 4, 1), length=9), 4)
    env.reset()
    obs = env.step(0)[0]
    assert np.asarray(obs)[0, 0].tolist() == [10, 10, 10, 11]
    space = gym.spaces.Dict(
        {"image": gym.spaces.Box(0, 255, (2, 2), np.uint8), "vec": gym.spaces.Box(-1, 1, (3,))}
    )
    inner = CounterEnv((2, 2), length=9)
    inner.observation_space = space
    base_reset, base_step = inner.reset, inner.step

    def as_dict(frame):
        return {"image": frame, "vec": np.full(3, frame.flat[0] / 100, np.float32)}

    inner.reset = lambda **kw: (as_dict(base_reset(**kw)[0]), {})
    inner.step = lambda a: (as_dict(base_step(a)[0]), 0.0, False, False, {})
    pools = {"image": core.FramePool((2, 2), np.uint8), "vec": core.FramePool((3,), np.float32)}
    env = FrameStackObservation(inner, 2, padding_type="zero", pool=pools)
    obs, _ = env.reset()
    assert values(obs["image"]) == [0, 10]
    np.testing.assert_array_equal(
        np.asarray(obs["vec"]), np.array([[0, 0, 0], [0.1, 0.1, 0.1]], np.float32)
    )
    obs = env.step(0)[0]
    assert values(obs["image"]) == [10, 11] and isinstance(obs["vec"], core.LazyFrames)


def test_replay_buffer():
    rb = ReplayBuffer(8, seed=0, pool=core.FramePool((84, 84, 1), np.uint8))
    env = FrameStackObservation(CounterEnv(length=50), 2, pool=rb.pool)
    obs, _ = env.reset()
    for a in range(3):
        nxt, r, te, tr, _ = env.step(0)
        rb.add(obs, a, r, nxt, te, tr)
        obs = nxt
    o, actions, n, *_ = rb.sample(3)
    expected = {0: ([10, 10], [10, 11]), 1: ([10, 11], [11, 12]), 2: ([11, 12], [12, 13])}
    for a, x, y in zip(actions.tolist(), o, n, strict=True):
        assert (values(x), values(y)) == expected[a]
    assert len(rb) == 3


def test_vector_needs_gymnasium_1_1():
    sys.modules.pop("lazyframes.vector", None)
    if VERSION >= (1, 1):
        assert hasattr(importlib.import_module("lazyframes.vector"), "FrameStackObservation")
    else:
        with pytest.raises(ImportError, match=r"needs Gymnasium >= 1\.1"):
            importlib.import_module("lazyframes.vector")
