"""lazyframes.vector.FrameStackObservation equals Gymnasium's stacker per sub-env, in every mode."""

import gc

import gymnasium as gym
import numpy as np
import pytest
from conftest import refused
from counter_env import CounterEnv, mk, values
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
from gymnasium.wrappers import FrameStackObservation as GymFSO

from lazyframes import _core as core
from lazyframes import vector
from lazyframes.vector import FrameStackObservation, LazyBatch

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP]


def counter_fns(n, shape=(3, 2, 1), **kw):
    kw = {"dtype": np.int32, "base": 1000, **kw}
    return [lambda i=i: CounterEnv(shape, rng_seed=100 + i, max_len=4, **kw) for i in range(n)]


def stacker(fns, k, mode=AutoresetMode.NEXT_STEP, **kw):
    """Our stacker over a ``SyncVectorEnv`` of ``fns``, storing its frames in a new pool."""
    return mk(FrameStackObservation, SyncVectorEnv(fns, autoreset_mode=mode), k, **kw)


def reference(n, k, padding, mode, **kw):
    """Gymnasium's own stacker applied per sub-env, then vectorised."""
    fns = counter_fns(n, **kw)
    return SyncVectorEnv(
        [lambda fn=fn: GymFSO(fn(), k, padding_type=padding) for fn in fns], autoreset_mode=mode
    )


def to_layout(ref_obs, layout):
    """Gymnasium's ``(n, k, *S)`` observations in another layout."""
    if layout == "stack":
        return ref_obs
    axis = -1 if layout == "last" else 0
    return np.stack([np.concatenate(list(o), axis=axis) for o in ref_obs])


def compare(ours, ref, steps, layout="stack", seed=0, partial=False):
    """Step both with the same actions; assert equal observations, rewards, flags and final obs."""
    o, _ = ours.reset(seed=seed)
    r, _ = ref.reset(seed=seed)
    ends = 0
    for t in range(steps):
        np.testing.assert_array_equal(np.asarray(o), to_layout(r, layout), err_msg=f"step {t}")
        a = np.zeros(ours.num_envs, np.int64)
        o, rew, te, tr, info = ours.step(a)
        r, rew2, te2, tr2, info2 = ref.step(a)
        for got, want in ((rew, rew2), (te, te2), (tr, tr2)):
            np.testing.assert_array_equal(got, want)
        done = te | tr
        ends += int(done.sum())
        if "final_obs" in info2:
            np.testing.assert_array_equal(info["_final_obs"], info2["_final_obs"])
            for i in np.flatnonzero(info2["_final_obs"]):
                np.testing.assert_array_equal(
                    np.asarray(info["final_obs"][i]),
                    to_layout(info2["final_obs"][i][None], layout)[0],
                )
            for i in np.flatnonzero(~info2["_final_obs"]):
                assert info["final_obs"][i] is None
        else:
            assert "final_obs" not in info
        if partial and done.any():
            np.testing.assert_array_equal(np.asarray(o), to_layout(r, layout))
            o, _ = ours.reset(options={"reset_mask": done.copy()})
            r, _ = ref.reset(options={"reset_mask": done.copy()})
    assert ends >= 10
    return o


@pytest.mark.parametrize("mode", MODES, ids=["next_step", "same_step"])
@pytest.mark.parametrize("padding", ["reset", "zero", "custom"])
def test_equals_per_env_stacking(mode, padding):
    n, k = 3, 4
    pad = np.full((3, 2, 1), 7, np.int32) if padding == "custom" else padding
    ours = stacker(counter_fns(n), k, mode, padding_type=pad)
    ref = reference(n, k, pad, mode)
    assert ours.autoreset_mode == mode
    compare(ours, ref, 40)
    assert ours.single_observation_space == ref.single_observation_space
    assert ours.observation_space == ref.observation_space and isinstance(ours.pool, core.FramePool)


@pytest.mark.parametrize("layout", ["last", "first"])
@pytest.mark.parametrize("mode", MODES, ids=["next_step", "same_step"])
def test_other_layouts(layout, mode):
    shape = (3, 2, 2) if layout == "last" else (2, 3, 4)
    ours = stacker(counter_fns(2, shape), 3, mode, layout=layout)
    compare(ours, reference(2, 3, "reset", mode, shape=shape), 30, layout=layout)
    assert ours.single_observation_space.shape == ((3, 2, 6) if layout == "last" else (6, 3, 4))
    assert ours.observation_space.shape == (2,) + ours.single_observation_space.shape


@pytest.mark.parametrize(
    "n, k, mode, padding, lazy",
    [(3, 1, m, "zero", False) for m in MODES] + [(3, 2, m, "zero", False) for m in MODES]
    + [(4, 3, AutoresetMode.DISABLED, p, True) for p in ("reset", "zero")],  # partial resets
)  # fmt: skip
def test_small_stacks_lazy_false_and_partial_resets(n, k, mode, padding, lazy):
    ours = stacker(counter_fns(n), k, mode, padding_type=padding, lazy=lazy)
    disabled = mode == AutoresetMode.DISABLED
    o = compare(ours, reference(n, k, padding, mode), 40 if disabled else 30, partial=disabled)
    assert isinstance(o, LazyBatch) if lazy else type(o) is np.ndarray


def test_partial_reset_keeps_other_envs():
    envs = mk(FrameStackObservation, SyncVectorEnv([lambda: CounterEnv(length=9)] * 2), 3)
    envs.reset()
    envs.step(np.zeros(2, np.int64))
    o, *_ = envs.step(np.zeros(2, np.int64))
    assert [values(x) for x in o] == [[10, 11, 12]] * 2
    held, before = o, np.asarray(o)
    o, _ = envs.reset(options={"reset_mask": np.array([False, True])})
    assert [values(x) for x in o] == [[10, 11, 12], [20, 20, 20]]
    o, *_ = envs.step(np.zeros(2, np.int64))
    assert [values(x) for x in o] == [[11, 12, 13], [20, 20, 21]]
    # an observation returned earlier is never changed by later resets or steps
    np.testing.assert_array_equal(np.asarray(held), before)


@pytest.mark.parametrize("mode", MODES, ids=["next_step", "same_step"])
def test_c14_terminal_observation_under_autoreset(mode):
    envs = stacker([lambda: CounterEnv(length=3)] * 2, 4, mode)
    obs, _ = envs.reset()
    seen = [[values(x) for x in obs]]
    finals = []
    for _ in range(5):
        obs, _, _te, _tr, info = envs.step(np.zeros(2, np.int64))
        seen.append([values(x) for x in obs])
        if "final_obs" in info:
            final = info["final_obs"][info["_final_obs"]]
            assert info["final_obs"].dtype == object  # of LazyFrames, None for the other envs
            assert all(isinstance(x, core.LazyFrames) for x in final)
            finals.append([values(x) for x in final])
    env0 = [s[0] for s in seen]
    if mode == AutoresetMode.NEXT_STEP:
        assert env0 == [[10] * 4, [10, 10, 10, 11], [10, 10, 11, 12], [10, 11, 12, 13],
                        [20] * 4, [20, 20, 20, 21]]  # fmt: skip
        assert finals == []
    else:
        assert env0 == [[10] * 4, [10, 10, 10, 11], [10, 10, 11, 12], [20] * 4,
                        [20, 20, 20, 21], [20, 20, 21, 22]]  # fmt: skip
        assert finals == [[[10, 11, 12, 13]] * 2]


def test_lazybatch_api():
    envs = mk(FrameStackObservation, SyncVectorEnv([lambda: CounterEnv(length=9)] * 3), 4)
    obs, _ = envs.reset()
    obs, *_ = envs.step(np.zeros(3, np.int64))
    assert isinstance(obs, LazyBatch) and isinstance(obs, vector.LazyBatch)
    assert len(obs) == 3 and obs.shape == (3, 4, 84, 84, 1) and obs.dtype == np.uint8
    assert obs.ndim == 5 and obs.layout == "stack" and obs.stack_size == 4 and obs.pool is envs.pool
    a = np.asarray(obs)
    assert a.shape == obs.shape and a.dtype == obs.dtype
    assert envs.observation_space.contains(a) and envs.observation_space.contains(obs)
    slots = obs.slots
    assert slots.dtype == np.int64 and slots.shape == (3, 4)
    slots[:] = -1
    assert (obs.slots >= 0).all()  # a copy
    one = obs[1]
    assert isinstance(one, core.LazyFrames) and values(one) == [10, 10, 10, 11]
    assert list(one.slots) == list(obs.slots[1])  # the same slots: no frame copied
    np.testing.assert_array_equal(np.asarray(obs[-1]), a[2])
    np.testing.assert_array_equal(np.asarray(obs[1:]), a[1:])
    assert [values(x) for x in obs] == [[10, 10, 10, 11]] * 3
    with pytest.raises(IndexError, match="3 environments"):
        obs[3]
    assert repr(obs).startswith("LazyBatch(")
    with pytest.raises(TypeError, match=r"np\.asarray"):
        obs[0, 1]
    refused(ValueError, "copy", np.array, obs, copy=False)
    np.testing.assert_array_equal(np.from_dlpack(obs), a)  # torch.as_tensor's fast path
    assert obs.__dlpack_device__() == (1, 0)
    f32 = obs.numpy(dtype=np.float32, scale=1 / 255)
    np.testing.assert_allclose(f32, a.astype(np.float32) * np.float32(1 / 255))
    out = np.empty(obs.shape, np.uint8)
    assert obs.numpy(out) is out
    np.testing.assert_array_equal(out, a)
    np.testing.assert_array_equal(np.asarray(obs, dtype=np.float64), a.astype(np.float64))
    refused(ValueError, "shape", obs.numpy, np.empty((2, 4, 84, 84, 1), np.uint8))


def test_one_core_call_per_step_and_per_batch():
    """reset: one push_batch; a step: one LazyBatch.shift, whose result is the observation."""
    envs = mk(FrameStackObservation, SyncVectorEnv([lambda: CounterEnv(length=4)] * 4), 4)
    calls = {"push_batch": 0, "push": 0, "lazy": 0, "lazy_batch": 0, "gather": 0}

    class Spy:
        def __init__(self, pool):
            self.pool = pool

        def __getattr__(self, name):
            attr = getattr(self.pool, name)
            if name in calls:

                def counted(*a, **kw):
                    calls[name] += 1
                    return attr(*a, **kw)

                return counted
            return attr

    envs._leaves[0].pool = Spy(envs.pool)
    obs, _ = envs.reset()
    for _ in range(10):
        prev = obs
        obs, *_ = envs.step(np.zeros(4, np.int64))
        assert obs is envs._ring[0] and obs is not prev  # the ring is the observation
        np.asarray(obs)
    # the rings restarted by autoreset are part of LazyBatch.shift: no other pool call
    assert calls == {"push_batch": 1, "push": 0, "lazy": 0, "lazy_batch": 0, "gather": 0}


def test_c12_buffer_reusing_vector_env():
    # SyncVectorEnv(copy=False) returns its own observation buffer, rewritten every step
    ours = mk(FrameStackObservation, SyncVectorEnv(counter_fns(3), copy=False), 3)
    compare(ours, reference(3, 3, "reset", AutoresetMode.NEXT_STEP), 30)
    envs = mk(
        FrameStackObservation, SyncVectorEnv([lambda: CounterEnv(length=2)] * 2, copy=False), 4
    )
    envs.reset()
    obs, *_ = envs.step(np.zeros(2, np.int64))
    arr = np.asarray(obs)
    before = arr.copy()
    envs.reset()
    for _ in range(5):
        envs.step(np.zeros(2, np.int64))
    np.testing.assert_array_equal(arr, before)
    np.testing.assert_array_equal(np.asarray(obs), before)
    assert values(before[0]) == [10, 10, 10, 11]


def test_refcounts_balance():
    n, k = 3, 4
    envs = stacker(counter_fns(n), k, AutoresetMode.SAME_STEP, padding_type="zero")
    pool = envs.pool
    envs.reset(seed=1)
    for _ in range(30):
        obs, _, _, _, info = envs.step(np.zeros(n, np.int64))
        assert pool.live_frames <= n * k + 1 + n * k * 2  # ring + pad + this batch + finals
    del obs, info
    gc.collect()
    assert pool.live_frames <= n * k + 1
    held, _ = envs.reset()
    envs.close()
    assert pool.live_frames == n + 1  # the held batch: 3 reset frames + the zero frame
    del held
    gc.collect()
    assert pool.live_frames == 0
    envs = mk(FrameStackObservation, SyncVectorEnv(counter_fns(n)), k)
    pool = envs.pool
    envs.reset()
    envs.step(np.zeros(n, np.int64))
    del envs
    gc.collect()
    assert pool.live_frames == 0


def test_errors():
    envs, text = SyncVectorEnv(counter_fns(2)), CounterEnv()
    text.observation_space = gym.spaces.Text(5)
    FSO, pool = FrameStackObservation, core.FramePool
    for exc, match, call in [
        (TypeError, "VectorEnv", lambda: mk(FSO, CounterEnv(), 4)),
        (ValueError, "stack_size", lambda: mk(FSO, envs, 0)),
        (TypeError, "stack_size", lambda: mk(FSO, envs, 2.5)),
        (ValueError, "padding_type", lambda: mk(FSO, envs, 4, padding_type="Zero")),
        (ValueError, "spatial", lambda: mk(FSO, envs, 4, layout="first")),
        (TypeError, "Box, Discrete", lambda: FSO(SyncVectorEnv([lambda: text]), 4)),
        (TypeError, "FramePool", lambda: FSO(envs, 3, pool="pool")),
        (ValueError, "shape", lambda: FSO(envs, 3, pool=pool((84, 84), np.uint8))),
        (ValueError, "dtype", lambda: FSO(envs, 3, pool=pool((84, 84, 1), np.int16))),
    ]:
        refused(exc, match, call)
    stacked = mk(FrameStackObservation, envs, 3)
    refused(gym.error.ResetNeeded, "", stacked.step, np.zeros(2, np.int64))
    with pytest.raises(gym.error.ResetNeeded):
        stacked.reset(options={"reset_mask": np.array([True, False])})
    stacked.reset()
    stacked.reset(options={"reset_mask": np.array([True, True])})
    assert stacked.pool.live_frames == 2


def test_async_vector_env():
    mode = AutoresetMode.SAME_STEP
    envs = AsyncVectorEnv(counter_fns(2), autoreset_mode=mode)
    try:
        ours = mk(FrameStackObservation, envs, 3)
        compare(ours, reference(2, 3, "reset", mode), 25)
    finally:
        envs.close()
