"""Real Atari frames, live (ale-py): our vector stacker equals ale-py's own C++ stacker.

ale-py's ``AtariVectorEnv(stack_num=4)`` (zero padding) against ours over ``stack_num=1``, at
every step, both autoreset modes, across episode ends. The comparisons with Gymnasium's and
baselines' stackers run on counter envs (test_wrappers.py, test_vector.py): frames are opaque
bytes to a stacker. N = 1000 (250 steps of 2 envs); ``LAZYFRAMES_LONG=1`` sets N = 5000.
"""

import os

import ale_py
import gymnasium as gym
import numpy as np
import pytest
from ale_py.vector_env import AtariVectorEnv
from counter_env import mk
from gymnasium.vector import AutoresetMode

from lazyframes import vector

gym.register_envs(ale_py)

N = 5000 if os.environ.get("LAZYFRAMES_LONG", "") not in ("", "0") else 1000
MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP]


@pytest.mark.parametrize("mode", MODES, ids=["next_step", "same_step"])
def test_vector_equals_ale_native_stacking(mode):
    """ale-py's AtariVectorEnv stacks 4 frames in C++, zero-padded; ours over stack_num=1 too."""
    kw = {"num_envs": 2, "autoreset_mode": mode, "max_num_frames_per_episode": 400,
          "num_threads": 1}  # fmt: skip
    steps = N // 4  # live: 2 x 2 envs, 4 emulator frames per step
    ale = AtariVectorEnv("breakout", stack_num=4, **kw)
    ours = mk(vector.FrameStackObservation,
              AtariVectorEnv("breakout", stack_num=1, **kw), 4, padding_type="zero",
              layout="first")  # fmt: skip
    try:
        assert ours.autoreset_mode == mode
        assert ours.single_observation_space == ale.single_observation_space
        a, _ = ale.reset(seed=3)
        o, _ = ours.reset(seed=3)
        rng = np.random.default_rng(1)
        ends = 0
        for t in range(steps):
            np.testing.assert_array_equal(np.asarray(o), a, err_msg=f"step {t}")
            act = rng.integers(4, size=2)
            a, _, te, tr, ia = ale.step(act)
            o, _, te2, tr2, io = ours.step(act)
            np.testing.assert_array_equal(te | tr, te2 | tr2)
            done = te | tr
            ends += int(done.sum())
            if mode == AutoresetMode.SAME_STEP:
                for i in np.flatnonzero(done):
                    np.testing.assert_array_equal(
                        np.asarray(io["final_obs"][i]), ia["final_obs"][i]
                    )
        assert ends >= 4
    finally:
        ale.close()
        ours.close()


def test_vector_rejects_asynchronous_batches():
    envs = AtariVectorEnv("pong", num_envs=2, batch_size=1, stack_num=1, num_threads=1)
    try:
        with pytest.raises(ValueError, match="batch_size"):
            mk(vector.FrameStackObservation, envs, 4, layout="first")
    finally:
        envs.close()
