"""copy.deepcopy of the stackers (as Gymnasium's, sharing the pool); the padding after close()."""

import copy
import gc

import numpy as np
import pytest
from conftest import f
from counter_env import CounterEnv, mk, values
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers import FrameStackObservation as GymFSO
from test_spaces import SpaceEnv, assert_same, image_vector_space, pools_of

from lazyframes import vector
from lazyframes.wrappers import FrameStack, FrameStackObservation


def run(env, steps=3):
    """Observations of ``steps`` steps, then of a reset and a step (the padding)."""
    out = [values(env.step(0)[0]) for _ in range(steps)]
    out.append(values(env.reset()[0]))
    out.append(values(env.step(0)[0]))
    return out


@pytest.mark.parametrize("padding", ["reset", "zero", "custom"])
def test_deepcopy_goes_on_as_gymnasiums(padding):
    pad = f(7) if padding == "custom" else padding
    ours = mk(FrameStackObservation, CounterEnv(length=50), 4, padding_type=pad)
    ref = GymFSO(CounterEnv(length=50), 4, padding_type=pad)
    for env in (ours, ref):
        env.reset()
        env.step(0)
    live = ours.pool.live_frames
    twin, ref_twin = copy.deepcopy(ours), copy.deepcopy(ref)
    assert twin.pool is ours.pool and ours.pool.live_frames == live  # no frame copied
    assert twin.env is not ours.env and twin.padding_type == ours.padding_type
    expected = run(ref_twin)
    assert run(twin) == expected
    first = {"reset": 20, "zero": 0, "custom": 7}[padding]  # padding of episode 2
    assert expected == [[10 if padding == "reset" else first, 10, 11, 12],
                        [10, 11, 12, 13], [11, 12, 13, 14], [first] * 3 + [20],
                        [first] * 2 + [20, 21]]  # fmt: skip
    # the original is where it was: it goes on exactly as the copy did
    assert run(ours) == run(ref) == expected


def test_deepcopy_of_framestack_and_before_reset_and_refcounts():
    env = mk(FrameStack, CounterEnv(length=50), 3)
    env.reset()
    env.step(0)
    twin = copy.deepcopy(env)
    assert twin.pool is env.pool
    expected = [[10, 11, 12], [11, 12, 13], [12, 13, 14], [20, 20, 20], [20, 20, 21]]
    assert run(twin) == run(env) == expected
    env = mk(FrameStackObservation, CounterEnv(length=50), 3, padding_type="zero")
    twin = copy.deepcopy(env)  # nothing stacked yet
    assert values(twin.reset()[0]) == [0, 0, 10]
    assert env.pool.live_frames == 2  # the zero frame, shared, and the twin's reset frame
    assert values(env.reset()[0]) == [0, 0, 10]
    pool = env.pool
    del env, twin
    gc.collect()
    assert pool.live_frames == 0


def test_deepcopy_of_a_dict_space():
    space = image_vector_space()
    ours = FrameStackObservation(SpaceEnv(space), 3, pool=pools_of(space))
    ref = GymFSO(SpaceEnv(space), 3)
    for env in (ours, ref):
        env.reset(seed=0)
        env.step(0)
    twin, ref_twin = copy.deepcopy(ours), copy.deepcopy(ref)
    assert twin.pool == ours.pool
    for _ in range(8):
        o, *_ = twin.step(0)
        r, *_ = ref_twin.step(0)
        assert_same(o, r, space)
    assert_same(ours.step(0)[0], ref.step(0)[0], space)


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_deepcopy_of_the_vector_stacker(mode):
    fns = [lambda: CounterEnv(length=3)] * 2
    envs = mk(vector.FrameStackObservation, SyncVectorEnv(fns, autoreset_mode=mode), 3)
    envs.reset()
    envs.step(np.zeros(2, np.int64))
    live = envs.pool.live_frames
    twin = copy.deepcopy(envs)
    assert twin.pool is envs.pool and envs.pool.live_frames == live
    steps = [[values(x) for x in twin.step(np.zeros(2, np.int64))[0]] for _ in range(3)]
    if mode == AutoresetMode.NEXT_STEP:
        assert steps == [[[10, 11, 12]] * 2, [[11, 12, 13]] * 2, [[20, 20, 20]] * 2]
    else:
        assert steps == [[[10, 11, 12]] * 2, [[20, 20, 20]] * 2, [[20, 20, 21]] * 2]
    assert [[values(x) for x in envs.step(np.zeros(2, np.int64))[0]] for _ in range(3)] == steps


@pytest.mark.parametrize("padding", ["zero", "custom"])
def test_reset_after_close_keeps_the_padding(padding):
    # (the single-env wrapper: test_gymnasium_versions, test_wrappers' refcounts)
    pad = f(7) if padding == "custom" else padding
    first = 0 if padding == "zero" else 7
    envs = mk(vector.FrameStackObservation, SyncVectorEnv([CounterEnv] * 2), 3, padding_type=pad)
    envs.reset()
    envs.close()
    assert envs.pool.live_frames == 0
    assert [values(x) for x in envs.reset()[0]] == [[first, first, 20]] * 2


def test_custom_padding_is_copied_when_given():
    # the padding is pushed at the first reset: changing the caller's array before is no matter
    pad = f(7)
    env = mk(FrameStackObservation, CounterEnv(), 3, padding_type=pad)
    pad[...] = 99
    assert values(env.reset()[0]) == [7, 7, 10]
