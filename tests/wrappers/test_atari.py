"""Real Atari frames, live (ale-py): our vector stacker equals ale-py's own C++ stacker.

N = 1000 emulator frames per autoreset mode (250 steps of 2 envs); ``LAZYFRAMES_LONG=1``: 5000.
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


class Recorder(gym.vector.VectorWrapper):
    """Keeps each batch the vector env returns: its env ids and frames."""

    def __init__(self, envs):
        super().__init__(envs)
        self.batches: list = []

    def reset(self, **kw):
        obs, info = self.env.reset(**kw)
        self.batches.append((info["env_id"].copy(), obs[:, 0].copy(), None))
        return obs, info

    def step(self, actions):
        obs, rew, te, tr, info = self.env.step(actions)
        self.batches.append((info["env_id"].copy(), obs[:, 0].copy(), te | tr))
        return obs, rew, te, tr, info


def test_vector_stacks_asynchronous_batches_by_env_id():
    """ale-py with batch_size < num_envs: each row stacks the frames its own env returned."""
    k, n = 4, 4
    atari = AtariVectorEnv("pong", num_envs=n, batch_size=2, stack_num=1, num_threads=1,
                           max_num_frames_per_episode=60)  # fmt: skip
    rec = Recorder(atari)
    ours = mk(vector.FrameStackObservation, rec, k, layout="first")
    try:
        assert ours.asynchronous
        obs, info = ours.reset(seed=0)
        got = [(info["env_id"], np.asarray(obs), None)]
        rng = np.random.default_rng(0)
        for _ in range(48):
            obs, _, _, _, info = ours.step(rng.integers(ours.single_action_space.n, size=2))
            got.append((info["env_id"], np.asarray(obs), info))
        # rebuild each env's stacks from its own frames, episode by episode (reset padding)
        episode: dict = {}
        stack: dict = {}  # each env's latest stack, rebuilt
        ended = np.zeros(n, np.bool_)
        checked, ends = 0, 0
        for (ids, frames, done), (ids2, stacks, info) in zip(rec.batches, got, strict=True):
            np.testing.assert_array_equal(ids, ids2)
            for j, i in enumerate(ids):
                fresh = i not in episode or ended[i]  # NEXT_STEP: a reset frame after an end
                if info is not None:
                    assert info["autoreset"][j] == (fresh and done is not None)
                    if not fresh:  # the observation this env's last action was taken in
                        np.testing.assert_array_equal(np.asarray(info["prev_obs"][j]), stack[i])
                episode[i] = [frames[j]] if fresh else episode[i] + [frames[j]]
                last = episode[i][-k:]
                stack[i] = np.stack([last[0]] * (k - len(last)) + last)
                np.testing.assert_array_equal(stacks[j], stack[i], err_msg=f"env {i}")
                checked += 1
                if done is not None:
                    ended[i] = done[j]
                    ends += int(done[j])
        assert checked == 2 * 49 and ends >= 2
        assert len({int(i) for ids, _, _ in rec.batches for i in ids}) == n
    finally:
        ours.close()
