"""The vector stacker over asynchronous envs: each env as a synchronous run of it alone."""

import gymnasium as gym
import numpy as np
import pytest
from conftest import refused
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv
from gymnasium.vector.utils import batch_space
from gymnasium.wrappers import FrameStackObservation as GymFSO

import lazyframes
from lazyframes.replay._ring import SKIP
from lazyframes.vector import FrameStackObservation, LazyBatch

SHAPE = (84, 84)
NEXT, SAME, DISABLED = AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED
# episode e of env i lasts LENGTHS[i][(e - 1) % len(LENGTHS[i])] steps (1-step ones included)
LENGTHS = [(1, 3), (2, 4, 1), (3,), (1, 2, 5), (4, 1)]


class Counter(gym.Env):
    """Frame rows 0-2: env id, episode, step; reward: step + action / 4; odd episodes terminate."""

    metadata = {"render_modes": []}  # noqa: RUF012 - Gymnasium's class attribute

    def __init__(self, env_id: int, lengths: tuple):
        self.env_id, self.lengths = env_id, lengths
        self.observation_space = gym.spaces.Box(0, 255, SHAPE, np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self.episode = self.t = 0

    def _frame(self):
        f = np.zeros(SHAPE, np.uint8)
        f[0], f[1], f[2] = self.env_id, self.episode, self.t
        return f

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return self._frame(), {}

    def step(self, action):
        self.t += 1
        done = self.t >= self.lengths[(self.episode - 1) % len(self.lengths)]
        term, trunc = (done, False) if self.episode % 2 else (False, done)
        return self._frame(), self.t + int(action) / 4, term, trunc, {}


class AsyncCounters(VectorEnv):
    """Counter envs behind EnvPool's / ale-py's asynchronous interface (``info["env_id"]``).

    ``step`` acts on the envs of the batch returned last; each call returns ``batch`` waiting
    envs (1 to ``batch`` with ``vary``) in a drawn order. ``force_ids``: the next batch's ids.
    """

    def __init__(self, mode=NEXT, batch=2, reset_batch=2, seed=0, vary=False, advertise=True):
        self.envs = [Counter(i, lengths) for i, lengths in enumerate(LENGTHS)]
        self.num_envs = len(self.envs)
        self.single_observation_space = gym.spaces.Box(0, 255, SHAPE, np.uint8)
        self.observation_space = batch_space(self.single_observation_space, batch)
        self.single_action_space = gym.spaces.Discrete(3)
        self.action_space = batch_space(self.single_action_space, batch)
        self.metadata = {"autoreset_mode": mode}
        if advertise == "config":  # EnvPool's way; True: ale-py's
            self.config = {"batch_size": batch, "num_envs": self.num_envs}
        elif advertise:
            self.batch_size = batch
        self.mode, self.batch, self.reset_batch, self.vary = mode, batch, reset_batch, vary
        self.rng = np.random.default_rng(seed)
        self.ready: dict = {}  # env id -> (frame, reward, terminated, truncated, final frame)
        self.ended = np.zeros(self.num_envs, np.bool_)
        self.last = np.arange(0)
        self.force_ids, self.force_rows, self.no_ids = None, None, False

    def _returned(self, size: int):
        if self.force_ids is not None:
            given, self.force_ids = self.force_ids, None
            ids = np.asarray(given).astype(np.int64) % self.num_envs
            ids = ids[: self.force_rows or len(ids)]
            rows = [self.ready[i] for i in ids]
        else:
            ids = self.rng.permutation(sorted(self.ready))[:size]
            given = ids.astype(np.int32)
            rows = [self.ready.pop(i) for i in ids]
        self.last = ids
        obs = np.stack([r[0] for r in rows])
        info = {} if self.no_ids else {"env_id": given}
        finals = [r[4] for r in rows]
        if any(f is not None for f in finals):
            info["final_obs"] = np.array(finals + [None], dtype=object)[:-1]
            info["_final_obs"] = np.array([f is not None for f in finals])
        flags = [np.array([r[k] for r in rows], np.bool_) for k in (2, 3)]
        return obs, np.array([r[1] for r in rows]), *flags, info

    def reset(self, *, seed=None, options=None):
        self.ready = {i: (e.reset()[0], 0.0, False, False, None) for i, e in enumerate(self.envs)}
        self.ended[:] = False
        if self.reset_batch == self.num_envs:  # every env, in order
            self.last = np.arange(self.num_envs)
            self.ready = {}
            frames = np.stack([e._frame() for e in self.envs])
            return frames, {"env_id": self.last.astype(np.int32)}
        obs, *_, info = self._returned(self.reset_batch)
        return obs, info

    def step(self, actions):
        actions = np.asarray(actions)
        assert actions.shape == self.last.shape, (actions.shape, self.last.shape)
        for i, a in zip(self.last, actions, strict=True):
            env = self.envs[i]
            if self.ended[i] and self.mode == NEXT:
                self.ready[i] = (env.reset()[0], 0.0, False, False, None)
                self.ended[i] = False
                continue
            obs, r, term, trunc, _ = env.step(a)
            final = None
            if (term or trunc) and self.mode == SAME:
                final, obs = obs, env.reset()[0]
            self.ended[i] = term or trunc
            self.ready[i] = (obs, r, term, trunc, final)
        size = int(self.rng.integers(1, self.batch + 1)) if self.vary else self.batch
        return self._returned(size)


def policy(obs) -> np.ndarray:
    """An action per row, from its newest frame: (env id + episode + step) mod 3."""
    newest = np.asarray(obs)[:, -1, :3, 0].astype(np.int64)
    return newest.sum(axis=1) % 3


def stream(rb, env: int):
    """Env ``env``'s transitions in ``rb``, oldest first, and their autoreset flags."""
    pos = np.flatnonzero(rb._ring.env[: len(rb)] == env)
    s = rb.gather(pos)
    fields = (s.observations, s.actions, s.rewards, s.next_observations, s.dones, s.truncations)
    skip = (rb._ring.flags[pos] & SKIP) != 0
    return [np.array(f) for f in fields], skip


def run_async(envs, steps):
    """The user's loop: each env's rows (stacked obs, as arrays) and a buffer of its steps."""
    rb = lazyframes.ReplayBuffer(10_000, num_envs=envs.num_envs)
    rows: list = [[] for _ in range(envs.num_envs)]
    finals: list = [[] for _ in range(envs.num_envs)]
    first_in_reset = np.zeros(envs.num_envs, np.bool_)
    obs, info = envs.reset(seed=0)
    first_in_reset[info["env_id"]] = True
    for i, o in zip(info["env_id"], np.asarray(obs), strict=True):
        rows[i].append(o)
    for _ in range(steps):
        obs, rewards, term, trunc, info = envs.step(policy(obs))
        ids = info["env_id"]
        assert isinstance(obs, LazyBatch) and isinstance(info["prev_obs"], LazyBatch)
        final = {}
        if "final_obs" in info:
            final = {"final_obs": info["final_obs"], "final_mask": info["_final_obs"]}
            for j in np.flatnonzero(info["_final_obs"]):
                finals[ids[j]].append(np.asarray(info["final_obs"][j]))
        # the one line the docstring promises
        rb.add(info["prev_obs"], info["prev_action"], rewards, obs, term, trunc,
               env_ids=ids, autoreset=info["autoreset"], **final)  # fmt: skip
        for i, o in zip(ids, np.asarray(obs), strict=True):
            rows[i].append(o)
    return rows, finals, rb, first_in_reset


def run_sync(env_id, mode, k, padding, steps):
    """Env ``env_id`` alone, synchronously: its observations, final obs and buffer."""
    envs = SyncVectorEnv(
        [lambda: GymFSO(Counter(env_id, LENGTHS[env_id]), k, padding_type=padding)],
        autoreset_mode=mode,
    )
    rb = lazyframes.ReplayBuffer(10_000)
    obs, _ = envs.reset(seed=0)
    rows, finals = [obs[0]], []
    prev_done = np.zeros(1, np.bool_)
    for _ in range(steps):
        actions = policy(obs)
        nxt, rewards, term, trunc, info = envs.step(actions)
        final = {}
        if "final_obs" in info:
            final = {"final_obs": info["final_obs"], "final_mask": info["_final_obs"]}
            finals.extend(np.asarray(f) for f in info["final_obs"][info["_final_obs"]])
        # NEXT_STEP: the step after an episode's end joins two episodes, a placeholder
        skip = prev_done if mode == NEXT else None
        rb.add(obs, actions, rewards, nxt, term, trunc, autoreset=skip, **final)
        prev_done = term | trunc
        obs = nxt
        rows.append(obs[0])
    return rows, finals, rb


CASES = {
    "batch2": {"batch": 2, "reset_batch": 2},
    "batch3_reset_all_varying": {"batch": 3, "reset_batch": 5, "vary": True, "advertise": False},
    "batch4_reset1": {"batch": 4, "reset_batch": 1, "seed": 3},
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("mode", [NEXT, SAME], ids=["next_step", "same_step"])
@pytest.mark.parametrize("padding", ["reset", "zero"])
def test_async_equals_sync_run_frame_for_frame(case, mode, padding):
    k = 4
    envs = FrameStackObservation(AsyncCounters(mode, **CASES[case]), k, padding_type=padding)
    assert envs.asynchronous == CASES[case].get("advertise", True)
    rows, finals, rb, first_in_reset = run_async(envs, 70)
    assert envs.asynchronous
    for i in range(envs.num_envs):
        ref_rows, ref_finals, ref_rb = run_sync(i, mode, k, padding, len(rows[i]) - 1)
        np.testing.assert_array_equal(np.array(rows[i]), np.array(ref_rows), err_msg=f"env {i}")
        np.testing.assert_array_equal(np.array(finals[i]), np.array(ref_finals))
        got, skip = stream(rb, i)
        want, ref_skip = stream(ref_rb, 0)
        if not first_in_reset[i]:  # its reset frame came in a step: a placeholder first
            assert skip[0]
            np.testing.assert_array_equal(got[0][0], got[3][0])  # from the frame to itself
            got, skip = [f[1:] for f in got], skip[1:]
        np.testing.assert_array_equal(skip, ref_skip, err_msg=f"env {i}")
        names = ["obs", "action", "reward", "next", "done", "trunc"]
        for g, w, name in zip(got, want, names, strict=True):
            np.testing.assert_array_equal(g, w, err_msg=f"env {i}: {name}")
        # the run crossed episode ends of both kinds, and autoresets under NEXT_STEP
        assert want[4].any() and want[5].any(), f"env {i}"
        assert ref_skip.any() == (mode == NEXT) and len(rows[i]) >= 10


def test_lazy_false():
    """lazy=False returns ndarrays, info["prev_obs"] too: each env's observation before."""
    envs = FrameStackObservation(AsyncCounters(NEXT, batch=3, reset_batch=3), 3, lazy=False)
    obs, _ = envs.reset()
    paired = 0
    for _ in range(20):
        prev = dict(zip(envs.env.last, obs, strict=True))
        obs, *_, info = envs.step(policy(obs))
        assert type(obs) is np.ndarray and type(info["prev_obs"]) is np.ndarray
        for j, i in enumerate(info["env_id"]):
            if i in prev and not info["autoreset"][j]:
                np.testing.assert_array_equal(info["prev_obs"][j], prev[i])
                paired += 1
    assert paired >= 10


def frames_of(obs) -> list:
    """(env id, episode, step) of each frame of each row of a stacked batch."""
    a = np.asarray(obs)[:, :, :3, 0]
    return [[tuple(int(v) for v in f) for f in row] for row in a]


def test_rows_follow_env_ids_not_positions():
    envs = FrameStackObservation(AsyncCounters(NEXT, batch=2, reset_batch=2, seed=1), 2)
    obs, info = envs.reset()
    ids = info["env_id"].tolist()
    assert frames_of(obs) == [[(i, 1, 0)] * 2 for i in ids]
    assert envs.observation_space.shape == (2, 2, 84, 84)
    obs, _, _, _, info = envs.step(np.zeros(2, np.int64))
    for row, i, fresh in zip(frames_of(obs), info["env_id"], info["autoreset"], strict=True):
        # a fresh env starts at its reset frame; one stepped goes on from its own frames
        assert row == ([(i, 1, 0)] * 2 if fresh else [(i, 1, 0), (i, 1, 1)])
        assert fresh == (i not in ids)
    # the current observation of any env, in the order asked
    seen = {int(i): r for i, r in zip(info["env_id"], frames_of(obs), strict=True)}
    order = list(seen)[::-1]
    assert frames_of(envs.observations(order)) == [seen[i] for i in order]


def test_reset_restarts_envs_as_they_come():
    envs = FrameStackObservation(AsyncCounters(DISABLED, batch=2, reset_batch=2), 3)
    obs, info = envs.reset()
    for _ in range(6):
        obs, *_, info = envs.step(np.zeros(2, np.int64))
    # disabled autoreset: only a reset starts an episode (the counters go on past theirs)
    assert not info["autoreset"].any()
    obs, info = envs.reset()
    back = info["env_id"].tolist()
    others = [i for i in range(5) if i not in back]
    for env_ids in (others[:1], None):  # one of them, and all (the default)
        refused(ValueError, "no observation since it was reset", envs.observations, env_ids)
    for _ in range(10):
        obs, *_, info = envs.step(np.zeros(2, np.int64))
        for j, i in enumerate(info["env_id"]):
            fresh = i in others
            assert info["autoreset"][j] == fresh
            if fresh:  # its new episode's reset frame, and a placeholder from it to itself
                others.remove(i)
                ep = frames_of(obs)[j][-1][1]
                assert frames_of(obs)[j] == [(i, ep, 0)] * 3
                np.testing.assert_array_equal(np.asarray(info["prev_obs"][j]), np.asarray(obs[j]))
    assert not others and envs.observations().shape == (5, 3, 84, 84)


@pytest.mark.parametrize("advertise", [True, "config"])
def test_an_advertised_batch_size_makes_the_stacker_asynchronous(advertise):
    envs = FrameStackObservation(
        AsyncCounters(NEXT, batch=2, reset_batch=2, advertise=advertise), 3
    )
    assert envs.asynchronous and envs.observation_space.shape == (2, 3, 84, 84)  # a batch's
    with_zero = AsyncCounters(NEXT, batch=5, reset_batch=5, advertise="config")
    with_zero.config["batch_size"] = 0  # EnvPool's 0: every env
    envs = FrameStackObservation(with_zero, 3)
    obs, info = envs.reset()
    assert not envs.asynchronous and envs.observation_space.shape == (5, 3, 84, 84)
    assert obs.shape == (5, 3, 84, 84) and info["env_id"].tolist() == [0, 1, 2, 3, 4]


def test_a_whole_batch_out_of_order_is_taken_by_env_id():
    envs = FrameStackObservation(AsyncCounters(NEXT, batch=5, reset_batch=5, advertise=False), 3)
    envs.reset()  # every env, in order: synchronous so far
    assert not envs.asynchronous
    envs.env.force_ids = np.array([1, 2, 3, 4, 0])
    obs, *_, info = envs.step(np.zeros(5, np.int64))
    assert envs.asynchronous and frames_of(obs)[4] == [(0, 1, 0), (0, 1, 0), (0, 1, 1)]
    assert info["env_id"].tolist() == [1, 2, 3, 4, 0] and info["prev_obs"].shape == (5, 3, 84, 84)
    assert info["prev_action"].tolist() == [0] * 5 and not info["autoreset"].any()
    assert envs.pool.live_frames == 10  # the reset frames and those of the step


def test_sync_envs_are_unchanged():
    """Batches of every env in order: no extra info, the ring is the observation."""
    envs = FrameStackObservation(SyncVectorEnv([lambda i=i: Counter(i, (3,)) for i in range(3)]), 2)
    assert not envs.asynchronous
    obs, info = envs.reset()
    for _ in range(5):
        obs, *_, info = envs.step(np.zeros(3, np.int64))
        assert not {"prev_obs", "prev_action", "autoreset"} & set(info)
        assert envs.observations() is obs
    assert not envs.asynchronous
    assert frames_of(envs.observations([2, 0])) == [frames_of(obs)[2], frames_of(obs)[0]]


@pytest.mark.parametrize("bad, match", [
    ([1, 1], "env id 1 appears more than once"),
    ([0, 7], r"env id 7 is out of range \[0, num_envs=5\)"),
    ([-1, 0], "env id -1 is out of range"),
    ([0, 1, 2], "1-D integer array of 2 env ids"),
    ([0.0, 1.0], "1-D integer array"),
    (None, r"batch of 2 observations, .* without info\['env_id'\]"),  # no ids at all
])  # fmt: skip
def test_bad_env_ids_raise_before_any_ring_changes(bad, match):
    envs = FrameStackObservation(AsyncCounters(NEXT, batch=2, reset_batch=2), 4)
    envs.reset()
    envs.step(np.zeros(2, np.int64))
    slots, live = envs._ring[0].slots, envs.pool.live_frames
    pending, autoreset = envs._pending.copy(), envs._autoreset.copy()
    last = envs._last_ids
    envs.env.force_ids, envs.env.force_rows, envs.env.no_ids = bad, 2, bad is None
    refused(ValueError, match, envs.step, np.zeros(2, np.int64))
    np.testing.assert_array_equal(envs._ring[0].slots, slots)
    assert envs.pool.live_frames == live
    np.testing.assert_array_equal(envs._pending, pending)
    np.testing.assert_array_equal(envs._autoreset, autoreset)
    assert envs._last_ids is last
    refused(ValueError, "out of range", envs.observations, [5])
    refused(ValueError, "more than once", envs.observations, [0, 0])


def test_prev_action_needs_one_action_per_row():
    """Actions that are not one per row of the last batch are not recorded (no key)."""

    class AnyActions(AsyncCounters):
        def step(self, actions):
            return super().step(np.zeros(len(self.last), np.int64))

    envs = FrameStackObservation(AnyActions(NEXT, batch=2, reset_batch=2), 4)
    envs.reset()
    *_, info = envs.step(np.zeros(5, np.int64))  # one per env, not one per row
    assert "prev_action" not in info and "prev_obs" in info
    *_, info = envs.step(np.array([2, 1]))
    assert info["prev_action"].dtype == np.int64 and len(info["prev_action"]) == 2
