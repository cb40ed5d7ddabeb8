"""Real Atari frames (ale-py): our stackers equal Gymnasium's, baselines' and ALE's own.

They are compared at every step.

Each game is played once per session with seeded random actions through Gymnasium's
``AtariPreprocessing(frame_skip=4, screen_size=84, grayscale)`` under a 200-step
``TimeLimit`` (so N steps cross several episode ends); the recorded real frames are then
replayed, the same to both sides of every comparison, for both cores. The vector
stacker is also checked live against ale-py's ``AtariVectorEnv``, whose C++ stacker
(``stack_num=4``) equals ours with zero padding.

N = 1000 steps per single-env comparison by default (the vector ones run N/2 steps of 3
envs on replay, N/4 steps of 2 live envs); the file runs in about 25 s on one busy core.
``LAZYFRAMES_LONG=1`` sets N = 5000.
"""

import os

import ale_py
import gymnasium as gym
import numpy as np
import pytest
from ale_py.vector_env import AtariVectorEnv
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers import AtariPreprocessing, TimeLimit
from gymnasium.wrappers import FrameStackObservation as GymFSO
from test_wrappers import mk

from bench.baselines_reference import BaselinesFrameStack
from lazyframes import vector
from lazyframes.wrappers import FrameStack, FrameStackObservation

gym.register_envs(ale_py)

N = 5000 if os.environ.get("LAZYFRAMES_LONG", "") not in ("", "0") else 1000
GAMES = ["Pong", "Breakout"]
MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP]


def make_atari(game, newaxis=False):
    env = gym.make(f"ALE/{game}-v5", frameskip=1)
    env = AtariPreprocessing(
        env, frame_skip=4, screen_size=84, grayscale_obs=True, grayscale_newaxis=newaxis
    )
    return TimeLimit(env, max_episode_steps=200)


_RECORDED = {}


def recording(game):
    """Episodes of the live game: [(reset_frame, [(frame, reward, terminated, truncated), ...])]."""
    if game not in _RECORDED:
        env = make_atari(game)
        rng = np.random.default_rng(0)
        frame, _ = env.reset(seed=0)
        episodes, steps = [(frame, [])], 0
        while steps < N or len(episodes) < 2:
            frame, r, te, tr, _ = env.step(int(rng.integers(env.action_space.n)))
            episodes[-1][1].append((frame, float(r), bool(te), bool(tr)))
            steps += 1
            if te or tr:
                frame, _ = env.reset()
                episodes.append((frame, []))
        env.close()
        _RECORDED[game] = episodes[:-1]  # complete episodes only
    return _RECORDED[game]


class ReplayEnv(gym.Env):
    """Replays recorded Atari episodes (starting at episode ``start``, cycling)."""

    def __init__(self, game, *, start=0, newaxis=False):
        self.episodes = recording(game)
        self.newaxis = newaxis
        shape = (84, 84, 1) if newaxis else (84, 84)
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(4)
        self.e = start - 1
        self.t = 0

    def _out(self, frame):
        return frame[..., None] if self.newaxis else frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.e = (self.e + 1) % len(self.episodes)
        self.t = 0
        return self._out(self.episodes[self.e][0]), {}

    def step(self, action):
        frame, r, te, tr = self.episodes[self.e][1][self.t]
        self.t += 1
        return self._out(frame), r, te, tr, {}


def test_recording_crosses_episode_ends():
    for game in GAMES:
        episodes = recording(game)
        assert len(episodes) >= 4
        assert sum(len(s) for _, s in episodes) >= 0.8 * N
        assert all(s[-1][2] or s[-1][3] for _, s in episodes)
        assert episodes[0][0].shape == (84, 84) and episodes[0][0].dtype == np.uint8


def run_pair(ours, ref, steps):
    o, _ = ours.reset(seed=0)
    r, _ = ref.reset(seed=0)
    ends = 0
    for t in range(steps):
        np.testing.assert_array_equal(np.asarray(o), np.asarray(r), err_msg=f"step {t}")
        o, rew, te, tr, _ = ours.step(0)
        r, rew2, te2, tr2, _ = ref.step(0)
        assert (rew, te, tr) == (rew2, te2, tr2)
        if te or tr:
            np.testing.assert_array_equal(np.asarray(o), np.asarray(r), err_msg=f"end {t}")
            o, _ = ours.reset()
            r, _ = ref.reset()
            ends += 1
    return ends


@pytest.mark.parametrize("padding", ["reset", "zero"])
@pytest.mark.parametrize("game", GAMES)
def test_frame_stack_observation_equals_gymnasium(impl, game, padding):
    ours = mk(impl, FrameStackObservation, ReplayEnv(game), 4, padding_type=padding)
    ref = GymFSO(ReplayEnv(game), 4, padding_type=padding)
    assert ours.observation_space == ref.observation_space
    assert run_pair(ours, ref, N) >= 4
    assert ours.pool.live_frames <= 4 + 1


@pytest.mark.parametrize("game", GAMES)
def test_frame_stack_equals_baselines(impl, game):
    ours = mk(impl, FrameStack, ReplayEnv(game, newaxis=True), 4)
    ref = BaselinesFrameStack(ReplayEnv(game, newaxis=True), 4)
    assert ours.observation_space.shape == ref.observation_space.shape == (84, 84, 4)
    assert run_pair(ours, ref, N) >= 4


@pytest.mark.parametrize("mode", MODES, ids=["next_step", "same_step"])
@pytest.mark.parametrize("game", GAMES)
def test_vector_equals_per_env_stacking(impl, game, mode):
    n, steps = 3, N // 2
    ours = mk(
        impl,
        vector.FrameStackObservation,
        SyncVectorEnv(
            [lambda i=i: ReplayEnv(game, start=i) for i in range(n)], autoreset_mode=mode
        ),
        4,
    )
    ref = SyncVectorEnv(
        [lambda i=i: GymFSO(ReplayEnv(game, start=i), 4) for i in range(n)], autoreset_mode=mode
    )
    o, _ = ours.reset(seed=0)
    r, _ = ref.reset(seed=0)
    ends = 0
    for t in range(steps):
        np.testing.assert_array_equal(np.asarray(o), r, err_msg=f"step {t}")
        a = np.zeros(n, np.int64)
        o, _, te, tr, info = ours.step(a)
        r, _, te2, tr2, info2 = ref.step(a)
        np.testing.assert_array_equal(te | tr, te2 | tr2)
        ends += int((te | tr).sum())
        for i in np.flatnonzero(info2.get("_final_obs", np.zeros(n, bool))):
            np.testing.assert_array_equal(np.asarray(info["final_obs"][i]), info2["final_obs"][i])
    assert ends >= 3
    assert ours.pool.live_frames <= n * 4


@pytest.mark.parametrize("mode", MODES, ids=["next_step", "same_step"])
def test_vector_equals_ale_native_stacking(impl, mode):
    """ale-py's AtariVectorEnv stacks 4 frames in C++, zero-padded; ours over stack_num=1 too."""
    kw = {
        "num_envs": 2,
        "autoreset_mode": mode,
        "max_num_frames_per_episode": 400,
        "num_threads": 1,
    }
    steps = N // 4  # live: 2 x 2 envs, 4 emulator frames per step
    ale = AtariVectorEnv("breakout", stack_num=4, **kw)
    ours = mk(
        impl,
        vector.FrameStackObservation,
        AtariVectorEnv("breakout", stack_num=1, **kw),
        4,
        padding_type="zero",
        layout="first",
    )
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


def test_vector_rejects_asynchronous_batches(impl):
    envs = AtariVectorEnv("pong", num_envs=2, batch_size=1, stack_num=1, num_threads=1)
    try:
        with pytest.raises(ValueError, match="batch_size"):
            mk(impl, vector.FrameStackObservation, envs, 4, layout="first")
    finally:
        envs.close()
