"""lazyframes.wrappers against Gymnasium 1.x's FrameStackObservation and baselines' FrameStack."""

import gc

import gymnasium as gym
import numpy as np
import pytest
from conftest import f, refused
from counter_env import CounterEnv, mk, values
from gymnasium.wrappers import FrameStackObservation as GymFSO

import lazyframes
from bench.baselines import BaselinesFrameStack
from lazyframes import _core as core
from lazyframes.wrappers import FrameStack, FrameStackObservation


def run_both(make_env, ours_wrap, ref_wrap, steps=40, seed=0, to_ref=lambda a: a):
    """Step two copies of an env through ``ours_wrap`` and ``ref_wrap``: equal obs each step."""
    ours, ref = ours_wrap(make_env()), ref_wrap(make_env())
    o, _ = ours.reset(seed=seed)
    r, _ = ref.reset(seed=seed)
    n = 0
    for t in range(steps):
        np.testing.assert_array_equal(to_ref(np.asarray(o)), np.asarray(r), err_msg=f"step {t}")
        assert np.asarray(o).dtype == np.asarray(r).dtype
        o, _, te, tr, _ = ours.step(0)
        r, _, te2, tr2, _ = ref.step(0)
        assert (te, tr) == (te2, tr2)
        if te or tr:
            np.testing.assert_array_equal(to_ref(np.asarray(o)), np.asarray(r))
            o, _ = ours.reset()
            r, _ = ref.reset()
            n += 1
    assert n >= 3  # several episode boundaries were crossed
    return ours, ref


@pytest.mark.parametrize("padding", ["reset", "zero", "custom"])
@pytest.mark.parametrize("k", [1, 3, 4])
def test_equals_gymnasium_every_step(padding, k):
    pad = f(7) if padding == "custom" else padding
    ours, ref = run_both(lambda: CounterEnv(length=3, rng_seed=k),
                         lambda e: mk(FrameStackObservation, e, k, padding_type=pad),
                         lambda e: GymFSO(e, k, padding_type=pad))  # fmt: skip
    assert ours.observation_space == ref.observation_space
    assert ours.observation_space.shape == (k, 84, 84, 1) and ours.padding_type == ref.padding_type
    assert ours.stack_size == ref.stack_size == k and isinstance(ours.pool, core.FramePool)


@pytest.mark.parametrize("padding", ["reset", "zero", "custom"])
def test_lazy_false_returns_fresh_ndarrays(padding):
    pad = np.full((2, 3), 5, np.int16) if padding == "custom" else padding
    ours, _ = run_both(lambda: CounterEnv((2, 3), np.int16, length=2),
                       lambda e: mk(FrameStackObservation, e, 3, padding_type=pad, lazy=False),
                       lambda e: GymFSO(e, 3, padding_type=pad), steps=12)  # fmt: skip
    a, _, _, _, _ = ours.step(0)
    b, _, _, _, _ = ours.step(0)
    assert type(a) is np.ndarray and type(b) is np.ndarray
    assert not np.shares_memory(a, b)


def test_float_space_c08_and_bounds():
    env = CounterEnv((3,), np.float32, low=-1.0, high=1.0)
    stacked = mk(FrameStackObservation, env, 4)
    assert stacked.observation_space == gym.spaces.Box(-1.0, 1.0, (4, 3), np.float32)
    assert stacked.observation_space == GymFSO(env, 4).observation_space
    cat = mk(FrameStackObservation, CounterEnv((3,), np.float32, base=0, low=-1.0, high=1.0), 4,
             layout="last")  # fmt: skip
    assert cat.observation_space == gym.spaces.Box(-1.0, 1.0, (12,), np.float32)
    obs, _ = cat.reset()
    assert obs.shape == (12,) and obs.dtype == np.float32
    assert cat.observation_space.contains(np.asarray(obs))
    low = np.arange(12, dtype=np.float32).reshape(3, 2, 2)  # the bounds are the env's
    env = CounterEnv((3, 2, 2), np.float32)
    env.observation_space = gym.spaces.Box(low, low + 100, (3, 2, 2), np.float32)
    sp = mk(FrameStackObservation, env, 2, layout="last").observation_space
    np.testing.assert_array_equal(sp.low, np.concatenate([low, low], axis=-1))
    np.testing.assert_array_equal(sp.high, np.concatenate([low, low], axis=-1) + 100)
    assert mk(FrameStackObservation, env, 2).observation_space == GymFSO(env, 2).observation_space


def _error_of(fn):
    try:
        fn()
    except Exception as e:
        return type(e), str(e)
    return None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"stack_size": 0}, {"stack_size": -2}, {"stack_size": 2.0}, {"stack_size": "4"},
        {"stack_size": None}, {"stack_size": 4, "padding_type": "Reset"},
        {"stack_size": 4, "padding_type": np.zeros((3, 3), np.uint8)},
        {"stack_size": 4, "padding_type": 5},
    ],
)  # fmt: skip
def test_same_errors_as_gymnasium(kwargs):
    ours = _error_of(lambda: mk(FrameStackObservation, CounterEnv(), **kwargs))
    ref = _error_of(lambda: GymFSO(CounterEnv(), **kwargs))
    assert ref is not None and ours == ref


@pytest.mark.parametrize(
    "kw",
    [{"shape": (4,), "dtype": np.float32, "out_dtype": np.float64, "rng_seed": 1},  # cast
     {"shape": (6, 5, 1), "view": True, "rng_seed": 2}],  # read-only, non-contiguous
)  # fmt: skip
def test_odd_frames_stack_as_gymnasium(kw):
    run_both(lambda: CounterEnv(**kw),
             lambda e: mk(FrameStackObservation, e, 4, padding_type="zero"),
             lambda e: GymFSO(e, 4, padding_type="zero"))  # fmt: skip
    fr, _ = CounterEnv(**kw).reset()
    assert fr.dtype == kw.get("out_dtype", np.uint8)
    assert fr.flags.writeable == fr.flags.c_contiguous == (not kw.get("view"))


# -- docs/CASES.md -----------------------------------------------------------------------
def test_c13_reset_padding_and_zero_padding():
    env = mk(FrameStackObservation, CounterEnv(), np.int64(4))  # a NumPy integer stack_size
    obs, _ = env.reset()
    assert values(obs) == [10, 10, 10, 10]
    assert env.pool.live_frames == 1  # repeated reset frame: one slot
    env = mk(FrameStackObservation, CounterEnv(), 4, padding_type="zero")
    obs, _ = env.reset()
    assert values(obs) == [0, 0, 0, 10]
    assert env.pool.live_frames == 2  # one shared zero slot + the reset frame
    obs2, _ = env.reset()
    assert values(obs2) == [0, 0, 0, 20]
    assert env.pool.live_frames == 3  # the first observation still holds f(10)
    del obs
    gc.collect()
    assert env.pool.live_frames == 2


def test_c11_env_reusing_its_output_buffer():
    def run(wrap):
        env = wrap(CounterEnv(reuse_buffer=True, length=10))
        env.reset()
        env.unwrapped.episode = 1
        for _ in range(3):
            obs = env.step(0)[0]
        return values(obs)

    assert run(lambda e: FrameStackObservation(e, 4)) == [10, 11, 12, 13]
    assert run(lambda e: FrameStackObservation(e, 4, lazy=False)) == [10, 11, 12, 13]
    # the fault, in the peer: Gymnasium 1.4 stacks four references to one buffer
    assert run(lambda e: GymFSO(e, 4)) == [13, 13, 13, 13]
    assert run(lambda e: FrameStack(e, 4)) == [10, 11, 12, 13]


@pytest.mark.parametrize("lazy", [True, False])
def test_c12_returned_arrays_are_never_rewritten(lazy):
    env = mk(FrameStackObservation, CounterEnv(length=2), 4, lazy=lazy)
    env.reset()
    obs = env.step(0)[0]
    arr = np.asarray(obs)
    before = arr.copy()
    env.reset()
    for _ in range(6):
        env.step(0)
        if env.unwrapped.t >= env.unwrapped.len:
            env.reset()
    np.testing.assert_array_equal(arr, before)
    np.testing.assert_array_equal(np.asarray(obs), before)
    assert values(before) == [10, 10, 10, 11]


def test_c06_layout_follows_channel_axis():
    with pytest.raises(ValueError, match="spatial"):
        mk(FrameStack, CounterEnv((1, 84, 84)), 4)  # baselines' default would glue widths
    with pytest.raises(ValueError, match="spatial"):
        mk(FrameStackObservation, CounterEnv((84, 84)), 4, layout="last")
    refused(ValueError, "spatial", mk, FrameStack, CounterEnv((84, 84, 1)), 4, layout="first")
    first = mk(FrameStack, CounterEnv((1, 84, 84)), 4, layout="first")
    assert first.observation_space.shape == (4, 84, 84)
    obs, _ = first.reset()
    obs = first.step(0)[0]
    assert obs.shape == (4, 84, 84) and np.asarray(obs)[:, 0, 0].tolist() == [10, 10, 10, 11]
    last = mk(FrameStack, CounterEnv((84, 84, 1)), 4)
    assert last.observation_space.shape == (84, 84, 4) and last.reset()[0].shape == (84, 84, 4)


def test_c07_rgb_frames_stack_by_frame_depth():
    env = mk(FrameStack, CounterEnv((5, 4, 3), length=10), 3)
    env.reset()
    env.step(0)
    obs = env.step(0)[0]
    assert obs.shape == (5, 4, 9)
    assert np.asarray(obs)[2, 1].tolist() == [10, 10, 10, 11, 11, 11, 12, 12, 12]
    assert env.observation_space.shape == (5, 4, 9)


@pytest.mark.parametrize("shape", [(84, 84, 1), (7, 5, 3)])
def test_framestack_equals_baselines(shape):
    ours, ref = run_both(lambda: CounterEnv(shape, rng_seed=3),
                         lambda e: mk(FrameStack, e, 4),
                         lambda e: BaselinesFrameStack(e, 4), steps=30)  # fmt: skip
    assert ours.observation_space.shape == ref.observation_space.shape
    assert ours.observation_space.dtype == ref.observation_space.dtype
    obs = ours.reset()[0]
    assert isinstance(obs, core.LazyFrames)
    assert obs.count() == 4 * shape[-1] and len(obs) == shape[0]
    assert ours.pool.live_frames == 1


def test_framestack_step_before_reset_and_bad_options():
    env = mk(FrameStack, CounterEnv(), 4)
    refused(gym.error.ResetNeeded, "", env.step, 0)
    env = CounterEnv()  # FrameStack concatenates Box frames; FrameStackObservation takes any
    env.observation_space = gym.spaces.Discrete(5)
    refused(TypeError, "Box", mk, FrameStack, env, 4)
    refused(TypeError, "int", mk, FrameStack, CounterEnv(), 4.0)
    refused(ValueError, "at least 1", mk, FrameStack, CounterEnv(), 0)


@pytest.mark.parametrize("cls", [FrameStack, FrameStackObservation])
def test_pool_argument(cls):
    """pool= is used as given, and checked against the frames."""
    pool = core.FramePool((84, 84, 1), np.uint8)
    env = cls(CounterEnv(), 4, pool=pool)
    assert env.pool is pool
    obs, _ = env.reset()
    assert obs.pool is pool and isinstance(obs, core.LazyFrames)
    refused(TypeError, "FramePool", cls, CounterEnv(), 4, pool=np.zeros((84, 84, 1), np.uint8))
    refused(ValueError, "shape", cls, CounterEnv(), 4, pool=core.FramePool((84, 84, 2), np.uint8))
    refused(ValueError, "dtype", cls, CounterEnv(), 4, pool=core.FramePool((84, 84, 1), np.float32))
    # without pool=, a new pool of the core lazyframes was imported with
    assert isinstance(cls(CounterEnv(), 4).pool, lazyframes.FramePool)


@pytest.mark.parametrize(
    "cls,kwargs",
    [
        (FrameStackObservation, {}),
        (FrameStackObservation, {"padding_type": "zero"}),
        (FrameStackObservation, {"lazy": False}),
        (FrameStack, {}),
    ],
    ids=["fso-reset", "fso-zero", "fso-eager", "framestack"],
)
def test_refcounts_balance(cls, kwargs):
    env = mk(cls, CounterEnv(length=50), 4, **kwargs)
    pool = env.pool
    pad = 1 if getattr(env, "padding_type", "") == "zero" else 0
    env.reset()
    for t in range(1, 12):
        env.step(0)  # observations are dropped at once
        assert pool.live_frames == min(t + 1, 4) + pad
    held = [env.step(0)[0] for _ in range(6)]
    lazy = isinstance(held[0], core.LazyFrames)
    # 6 observations of 4 consecutive frames share 9 unique frames (the ring's 4 among them)
    assert pool.live_frames == (9 if lazy else 4) + pad
    env.close()
    assert pool.live_frames == (9 if lazy else 0)
    del held
    gc.collect()
    assert pool.live_frames == 0
    # dropping the wrapper without close releases its ring too
    env = mk(cls, CounterEnv(length=50), 4, **kwargs)
    pool = env.pool
    env.reset()
    obs = env.step(0)[0]
    del env
    gc.collect()
    assert pool.live_frames == (2 + pad if isinstance(obs, core.LazyFrames) else 0)
    del obs
    gc.collect()
    assert pool.live_frames == 0


def test_failed_step_leaves_the_ring_as_it_was():
    env = mk(FrameStackObservation, CounterEnv(length=100), 4)
    env.reset()
    env.step(0)
    env.unwrapped.bad_next = True
    live = env.pool.live_frames
    refused(ValueError, "shape", env.step, 0)
    assert env.pool.live_frames == live
    obs = env.step(0)[0]
    assert values(obs) == [10, 10, 11, 13]
