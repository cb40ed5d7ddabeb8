"""lazyframes.sb3 against Stable-Baselines3 itself: same samples, same stacks, DQN trains."""

import io
import os
import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import ROOT, refused
from gymnasium import spaces
from stable_baselines3.common import buffers as sb3_buffers
from stable_baselines3.common.save_util import load_from_pkl, save_to_pkl
from stable_baselines3.common.vec_env import DummyVecEnv
from stable_baselines3.common.vec_env import VecFrameStack as SB3VecFrameStack

from lazyframes import sb3

K = 4


def stream(n_envs, steps, shape=(K, 84, 84), seed=0):
    """SB3-style add() arguments of frame-stacked observations with dones and timeouts."""
    rng = np.random.default_rng(seed)
    stacks = rng.integers(0, 255, (n_envs,) + shape, np.uint8)
    for _ in range(steps):
        frame = rng.integers(0, 255, (n_envs, 1) + shape[1:], np.uint8)
        nxt = np.concatenate([stacks[:, 1:], frame], axis=1)
        done = rng.random(n_envs) < 0.1
        # a timeout with done (a VecEnv's) and, rarely, without (SB3's own tests do it)
        timeout = (done & (rng.random(n_envs) < 0.5)) | (rng.random(n_envs) < 0.03)
        infos = [{"TimeLimit.truncated": bool(t)} if d or t else {}
                 for d, t in zip(done, timeout, strict=True)]  # fmt: skip
        action = rng.integers(0, 6, n_envs)
        reward = rng.standard_normal(n_envs).astype(np.float32)
        yield stacks, nxt, action, reward, done, infos
        # an env that is done starts again from a fresh stack
        reset = rng.integers(0, 255, (n_envs,) + shape, np.uint8)
        stacks = np.where(done[:, None, None, None], reset, nxt)


def both(cls_sb3, cls_ours, n_envs, steps, ours_kw=(), **kw):
    """SB3's buffer and ours (with ``ours_kw`` too) filled with the same transitions."""
    obs_space = spaces.Box(0, 255, (K, 84, 84), np.uint8)
    act_space = spaces.Discrete(6)
    theirs = cls_sb3(50, obs_space, act_space, device="cpu", n_envs=n_envs, **kw)
    ours = cls_ours(50, obs_space, act_space, device="cpu", n_envs=n_envs, **kw, **dict(ours_kw))
    for args in stream(n_envs, steps):
        theirs.add(*args)
        ours.add(*args)
    return theirs, ours


def drawn(seed, fn, *args):
    """``fn(*args)`` after seeding NumPy's global generator, the one SB3's buffers draw from."""
    np.random.seed(seed)  # noqa: NPY002
    return fn(*args)


def assert_same_samples(a, b, exact=True):
    assert a._fields == b._fields
    for name in a._fields:
        x, y = getattr(a, name), getattr(b, name)
        if x is None:
            assert y is None, name
            continue
        assert x.shape == y.shape and x.dtype == y.dtype, name
        if exact or x.dtype == torch.uint8:
            assert torch.equal(x, y), name
        else:
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)


#: (SB3's buffer, ours, options): the n-step one sums rewards in another order (not exact)
BUFFERS = [
    (sb3_buffers.ReplayBuffer, sb3.ReplayBuffer, {}),
    (sb3_buffers.NStepReplayBuffer, sb3.NStepReplayBuffer, {"n_steps": 3, "gamma": 0.9}),
]


@pytest.mark.parametrize("n_envs", [1, 3])
@pytest.mark.parametrize("steps", [20, 73])  # not full, and wrapped around
@pytest.mark.parametrize("cls_sb3, cls_ours, kw", BUFFERS, ids=["replay", "nstep"])
def test_samples_equal_sb3s_for_the_same_draws(cls_sb3, cls_ours, kw, n_envs, steps):
    theirs, ours = both(cls_sb3, cls_ours, n_envs, steps, **kw)
    assert (ours.pos, ours.full, ours.size()) == (theirs.pos, theirs.full, theirs.size())
    for seed in range(5):
        a, b = drawn(seed, theirs.sample, 64), drawn(seed, ours.sample, 64)
        assert_same_samples(a, b, exact=not kw)
    if not kw:
        inds = np.arange(ours.size())
        assert_same_samples(drawn(7, theirs._get_samples, inds), drawn(7, ours._get_samples, inds))


def test_replay_stores_each_frame_once_and_pickles():
    _, ours = both(sb3_buffers.ReplayBuffer, sb3.ReplayBuffer, 1, 40)
    mem = ours.memory()
    assert mem["transitions"] == 40
    assert mem["unique_frames"] < 2 * 40 + 4 * 8  # ~1 new frame per step, 4 per reset
    copy = pickle.loads(pickle.dumps(ours))
    assert (copy.pos, copy.full, copy.size(), copy.n_envs) == (ours.pos, ours.full, 40, 1)
    assert_same_samples(drawn(3, ours.sample, 16), drawn(3, copy.sample, 16))


@pytest.mark.parametrize("cls_sb3, cls_ours, kw", BUFFERS, ids=["replay", "nstep"])
def test_compressed_samples_equal_uncompressed_and_survive_save_replay_buffer(
    tmp_path, cls_sb3, cls_ours, kw
):
    _, plain = both(cls_sb3, cls_ours, 2, 73, **kw)
    _, packed = both(cls_sb3, cls_ours, 2, 73, {"compress": {"group": 4}}, **kw)
    for seed in range(3):
        assert_same_samples(drawn(seed, plain.sample, 32), drawn(seed, packed.sample, 32))
    mem = packed.memory()
    assert mem["compression"]["group"] == 4 and plain.memory()["compression"] is None
    assert mem["cold_frames"] > 0 and mem["cold_bytes"] > 0
    # what model.save_replay_buffer / load_replay_buffer do
    save_to_pkl(tmp_path / "rb", packed)
    back = load_from_pkl(tmp_path / "rb")
    assert isinstance(back, cls_ours) and back.memory()["compression"] == mem["compression"]
    assert (back.pos, back.full, back.size()) == (packed.pos, packed.full, packed.size())
    assert_same_samples(drawn(5, packed.sample, 32), drawn(5, back.sample, 32))


@pytest.mark.parametrize("n_envs", [1, 3])
def test_final_obs_replaces_only_the_masked_rows(n_envs):
    """add(..., final_obs=, final_mask=) stores what CleanRL's copied batch stores."""
    space = spaces.Box(0, 255, (K, 84, 84), np.uint8)
    copied, masked = (
        sb3.ReplayBuffer(60, space, spaces.Discrete(6), "cpu", n_envs=n_envs) for _ in range(2)
    )
    rng = np.random.default_rng(1)
    for obs, last, action, reward, done, infos in stream(n_envs, 50):
        # same-step autoreset: the reset observation in next_obs, the last one in infos
        next_obs = np.where(
            done[:, None, None, None], rng.integers(0, 255, obs.shape, np.uint8), last
        )
        final_obs = np.full(n_envs, None, object)  # Gymnasium's infos["final_obs"]
        for i in np.flatnonzero(done):
            final_obs[i] = last[i]
        real_next_obs = next_obs.copy()
        for idx, d in enumerate(done):
            if d:
                real_next_obs[idx] = final_obs[idx]
        copied.add(obs, real_next_obs, action, reward, done, infos)
        masked.add(obs, next_obs, action, reward, done, infos, final_obs=final_obs, final_mask=done)
    for seed in range(3):
        assert_same_samples(drawn(seed, copied.sample, 32), drawn(seed, masked.sample, 32))


def test_replay_refuses_what_it_cannot_store():
    act = spaces.Discrete(2)
    with pytest.raises(ValueError, match="image observations"):
        sb3.ReplayBuffer(10, spaces.Box(0, 1, (8,), np.float32), act)


def test_optimize_memory_usage_stores_the_frames_compressed():
    # CleanRL's call (optimize_memory_usage=True) switches with the import line alone
    space, act = spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6)
    for flag, kw, compressed in [
        (True, {}, True),
        (False, {}, False),
        (True, {"compress": False}, False),
    ]:
        rb = sb3.ReplayBuffer(60, space, act, "cpu", 1, flag, False, **kw)
        for args in stream(1, 50):
            rb.add(*args)
        assert (rb.memory()["cold_frames"] > 0) == compressed, (flag, kw)


#: CleanRL's use of the buffer (dqn_atari.py), in a process where SB3 cannot be imported
WITHOUT_SB3 = """
import pickle, sys
sys.modules["stable_baselines3"] = None  # not installed, as in CleanRL's venv
import numpy as np, torch
from gymnasium import spaces
from lazyframes.sb3 import ReplayBuffer, ReplayBufferSamples, HAVE_SB3
assert not HAVE_SB3
obs_space, act_space = spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6)
rb = ReplayBuffer(100, obs_space, act_space, "cpu", optimize_memory_usage=True,
                  handle_timeout_termination=False)
rng = np.random.default_rng(0)
frames = rng.integers(0, 255, (60, 84, 84), dtype=np.uint8)
for t in range(50):
    rb.add(frames[t : t + 4][None], frames[t + 1 : t + 5][None], np.array([t % 6]),
           np.array([1.0]), np.array([t % 17 == 16]), [{}])
np.random.seed(0)
s = rb.sample(8)
assert type(s) is ReplayBufferSamples and s.discounts is None
assert s.observations.shape == (8, 4, 84, 84) and s.observations.dtype == torch.uint8
assert s.actions.shape == s.rewards.shape == s.dones.shape == (8, 1)
assert (s.next_observations[:, :3] == s.observations[:, 1:]).all()
sys.stdout.buffer.write(pickle.dumps(rb))
"""


def test_the_buffer_works_without_sb3_and_its_pickles_travel(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", WITHOUT_SB3], capture_output=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr.decode()
    rb = pickle.loads(r.stdout)  # made without SB3, loaded with it: SB3's class, SB3's samples
    assert isinstance(rb, sb3_buffers.ReplayBuffer) and rb.size() == 50
    np.random.seed(0)  # noqa: NPY002
    s = rb.sample(8)
    assert type(s).__module__.startswith("stable_baselines3") and s.observations.shape[0] == 8
    back = (
        "import pickle, sys; sys.modules['stable_baselines3'] = None; rb = "
        "pickle.loads(sys.stdin.buffer.read()); print(rb.size(), type(rb.sample(4)).__name__)"
    )
    r = subprocess.run([sys.executable, "-c", back], input=pickle.dumps(rb), capture_output=True,
                       cwd=ROOT)  # fmt: skip
    assert r.returncode == 0 and r.stdout.split() == [b"50", b"ReplayBufferSamples"], r.stderr


def test_the_restatements_of_sb3_agree_with_sb3():
    from stable_baselines3.common import preprocessing, utils

    from lazyframes import _sb3_free as free

    obs = [spaces.Box(0, 255, s, np.uint8) for s in ((4, 84, 84), (84, 84, 4), (3, 2, 5))]
    obs += [spaces.Discrete(3), spaces.MultiDiscrete([2, 3]), spaces.MultiBinary(4)]
    for o in obs:
        assert free.get_obs_shape(o) == preprocessing.get_obs_shape(o)
    acts = [spaces.Discrete(6), spaces.Box(-1, 1, (2, 3)), spaces.MultiDiscrete([2, 2]),
            spaces.MultiBinary(5)]  # fmt: skip
    for a in acts:
        assert free.get_action_dim(a) == preprocessing.get_action_dim(a)
    for o in obs[:2]:
        assert free.is_image_space_channels_first(o) == preprocessing.is_image_space_channels_first(
            o
        )
    for d in ("auto", "cpu", "cuda"):
        assert free.get_device(d) == utils.get_device(d)
    for dt in (np.float64, np.float32, np.int64):
        assert free.BufferBase._maybe_cast_dtype(dt) == sb3_buffers.ReplayBuffer._maybe_cast_dtype(
            dt
        )


class Frames(gym.Env):
    """Random frames of ``shape`` (Box) or a Dict of two; episodes of random length."""

    def __init__(self, shape, dict_obs=False, seed=0):
        box = spaces.Box(0, 255, shape, np.uint8)
        self.observation_space = spaces.Dict({"a": box, "b": box}) if dict_obs else box
        self.action_space = spaces.Discrete(2)
        self._rng = np.random.default_rng(seed)
        self._t = 0

    def _obs(self):
        return self.observation_space.sample()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(int(self._rng.integers(1 << 30)))
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        end = self._rng.random() < 0.15
        return self._obs(), 1.0, end, self._t >= 12, {}


def assert_same_obs(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same_obs(a[key], b[key])
        return
    assert isinstance(b, np.ndarray)
    np.testing.assert_array_equal(a, b, strict=True)


@pytest.mark.parametrize(
    "shape, order, dict_obs",
    [
        ((84, 84, 1), None, False), ((1, 84, 84), None, False), ((84, 84, 3), "last", False),
        ((2, 10, 10), "first", False), ((10, 10, 1), None, True),
        # orders SB3 is told against the shape's look: honoured, as SB3 does
        ((12, 8, 3), "first", False), ((16, 8, 8), "first", False), ((3, 8, 12), "last", False),
    ],
)  # fmt: skip
@pytest.mark.parametrize("reset_first", [True, False])  # SB3's stacks start as zeros
@pytest.mark.filterwarnings("ignore:Treating image space as channels-last")
def test_vec_frame_stack_equals_sb3s(shape, order, dict_obs, reset_first):
    def make(cls):
        venv = DummyVecEnv([lambda i=i: Frames(shape, dict_obs, seed=i) for i in range(3)])
        venv.seed(0)
        return cls(venv, 4, channels_order=order)

    theirs, ours = make(SB3VecFrameStack), make(sb3.VecFrameStack)
    assert ours.observation_space == theirs.observation_space
    if reset_first:
        assert_same_obs(theirs.reset(), ours.reset())
    else:
        for venv in (theirs.venv, ours.venv):  # the envs ready, the stackers not reset
            venv.reset()
    ended = 0
    for _ in range(60):
        a = theirs.step(np.zeros(3, np.int64))
        b = ours.step(np.zeros(3, np.int64))
        assert_same_obs(a[0], b[0])
        for ia, ib in zip(a[3], b[3], strict=True):
            assert ia.keys() == ib.keys()
            if "terminal_observation" in ia:
                ended += 1
                assert_same_obs(ia["terminal_observation"], ib["terminal_observation"])
    assert ended > 5


def atari_env(stacker):
    import ale_py
    from stable_baselines3.common.env_util import make_atari_env

    gym.register_envs(ale_py)
    return stacker(make_atari_env("BreakoutNoFrameskip-v4", n_envs=1, seed=0), 4)


def test_sb3_dqn_trains_on_breakout_with_the_lazyframes_buffer(tmp_path):
    from stable_baselines3 import DQN

    torch.set_num_threads(1)
    model = DQN("CnnPolicy", atari_env(sb3.VecFrameStack), buffer_size=5_000,
                learning_starts=1_000, train_freq=4, batch_size=32,
                target_update_interval=500, replay_buffer_class=sb3.ReplayBuffer,
                seed=0, device="cpu")  # fmt: skip
    before = [p.detach().clone() for p in model.q_net.parameters()]
    model.learn(2_000)
    rb = model.replay_buffer
    assert isinstance(rb, sb3.ReplayBuffer) and rb.size() == 2_000
    assert rb.memory()["bytes_per_transition"] < 2 * 84 * 84  # one 7 KB frame per step
    assert any(not torch.equal(p, q) for p, q in zip(before, model.q_net.parameters(), strict=True))
    path = tmp_path / "rb.pkl"
    model.save_replay_buffer(path)
    model.load_replay_buffer(path)
    assert isinstance(model.replay_buffer, sb3.ReplayBuffer) and model.replay_buffer.size() == 2_000
    model.learn(100, reset_num_timesteps=False)


def test_qrdqn_takes_the_nstep_buffer():
    from sb3_contrib import QRDQN

    torch.set_num_threads(1)
    model = QRDQN("CnnPolicy", atari_env(sb3.VecFrameStack), buffer_size=1_000,
                  learning_starts=200, train_freq=4, batch_size=16,
                  replay_buffer_class=sb3.NStepReplayBuffer,
                  replay_buffer_kwargs={"n_steps": 3, "gamma": 0.99}, seed=0,
                  device="cpu")  # fmt: skip
    model.learn(400)
    assert model.replay_buffer.size() == 400
    buf = io.BytesIO()
    model.save_replay_buffer(buf)
    assert buf.tell() > 0


@pytest.mark.parametrize("algo", ["dqn", "qrdqn"])
def test_zoo_hyperparameters_load_the_way_the_zoo_does(algo):
    """examples/zoo/: rl-baselines3-zoo evals these strings in its own module (no lazyframes)."""
    import builtins

    import yaml
    from stable_baselines3 import DQN

    with open(os.path.join(ROOT, "examples", "zoo", f"{algo}.yml")) as fh:
        hp = dict(yaml.safe_load(fh)["atari"])
    zoo = {"__builtins__": builtins}  # what exp_manager's eval sees of lazyframes: nothing
    refused(NameError, "lazyframes", eval, "lazyframes.sb3.ReplayBuffer", zoo)  # the old line
    for key in ("policy_kwargs", "replay_buffer_class", "replay_buffer_kwargs"):
        if isinstance(hp.get(key), str):
            hp[key] = eval(hp[key], dict(zoo))
    assert hp["replay_buffer_class"] is sb3.ReplayBuffer
    assert hp["replay_buffer_kwargs"] == {"compress": True} and hp["buffer_size"] == 1_000_000
    if algo == "qrdqn":
        from sb3_contrib import QRDQN as DQN
    torch.set_num_threads(1)
    options = {
        k: v for k, v in hp.items() if k not in ("env_wrapper", "frame_stack", "n_timesteps")
    }
    options.update(buffer_size=500, learning_starts=100)  # (a small run)
    model = DQN(env=atari_env(sb3.VecFrameStack), seed=0, device="cpu", **options)
    model.learn(150)
    assert isinstance(model.replay_buffer, sb3.ReplayBuffer)
    assert model.replay_buffer.memory()["compression"] is not None
