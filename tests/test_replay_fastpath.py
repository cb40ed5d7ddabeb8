"""ReplayBuffer.add's fast path stores exactly what the general path stores (both cores).

``add`` of the usual transitions (every env, no ``env_ids``/``autoreset``/``final_obs``)
takes a fast path (``_ingest.fast_add``) that checks against cached per-buffer state and
hands anything it does not accept to the general path. The same transitions are added
to two buffers: one the usual way, one with ``env_ids`` naming every env (the general
path, same meaning); their whole state and samples must agree, and the fast path must
have been taken. Inputs the fast path declines must still raise, with nothing stored.
"""

import numpy as np
import pytest
from test_replay import assert_same_state, buffer_state

from lazyframes.replay import PrioritizedReplayBuffer, ReplayBuffer, _ingest

K = 3
FRAME = {"stack": (2, 3), "last": (2, 3, 1), "first": (1, 2, 3)}
AXIS = {"stack": 0, "last": -1, "first": 0}


def frame(layout, v):
    return np.full(FRAME[layout], v % 256, np.uint8)


def obs_of(layout, frames):
    if layout == "stack":
        return np.stack(frames)
    return np.concatenate(frames, axis=AXIS[layout])


def scalars(t):
    """Scalar action, reward and flags of step ``t``, of the types the fast path takes."""
    action = [3, np.int64(5), np.uint8(7), 0][t % 4]
    reward = [0.5, np.float32(-1.25), 3.0e38, np.float64(1e-3), 7, -(1 << 24)][t % 6]
    term = [False, np.False_, False, np.True_, False, True, False][t % 7]
    trunc = np.bool_(t % 5 == 4)
    return action, reward, term, trunc


def transitions(impl, form, layout, num_envs, steps, seed):
    """``steps`` add() argument dicts of ``num_envs`` envs in ``form`` (a fresh source pool)."""
    rng = np.random.default_rng(seed)
    E = num_envs
    pool = impl.FramePool(FRAME[layout], np.uint8) if form != "array" else None
    count = [0]

    def new(e):
        count[0] += 1
        return frame(layout, 1000 * e + count[0])

    stacks = [[new(e)] * K for e in range(E)]  # reset padding
    rings = None
    if form == "lazy":
        rings = [pool.lazy([pool.push(fr) for fr in s], layout=layout) for s in stacks]
    elif form == "batch":
        rings = pool.push_batch(np.stack([s[-1] for s in stacks]), k=K, layout=layout)
    out = []
    for t in range(steps):
        fresh = [new(e) for e in range(E)]
        nxt = [s[1:] + [fr] for s, fr in zip(stacks, fresh, strict=True)]
        if form == "array":
            o = [obs_of(layout, s) for s in stacks]
            n = [obs_of(layout, s) for s in nxt]
            o, n = (o[0], n[0]) if E == 1 else (np.stack(o), np.stack(n))
        elif form == "lazy":
            n = [r.shift(fr) for r, fr in zip(rings, fresh, strict=True)]
            o, n, rings = (rings[0], n[0], n) if E == 1 else (rings, n, n)  # a list per env
        else:
            n = rings.shift(np.stack(fresh))
            o, rings = rings, n
        args = [scalars(t + e) for e in range(E)]
        if E == 1:
            action, reward, term, trunc = args[0]
        else:
            action = np.array([int(a[0]) for a in args], np.int64)
            reward = np.array([float(a[1]) for a in args], np.float32)
            term = np.array([bool(a[2]) for a in args])
            trunc = np.array([bool(a[3]) for a in args])
        out.append(
            {
                "obs": o,
                "action": action,
                "reward": reward,
                "next_obs": n,
                "terminated": term,
                "truncated": trunc,
            }
        )
        stacks = nxt
        ended = [bool(a[2]) or bool(a[3]) for a in args]
        for e in np.flatnonzero(ended):  # a new episode (arrays: a new reset stack)
            if form == "array":
                stacks[e] = [new(e)] * K
        if rng.random() < 0.1 and form == "array" and E > 1:
            stacks[0] = [stacks[0][-1]] * K  # a repeated frame inside an observation
    return out


def both(impl, form, layout, num_envs, steps, *, cls=ReplayBuffer, **kw):
    """Buffers fed the same transitions: usual adds, and adds naming every env."""
    fast_calls = []
    real = _ingest.fast_add

    def spy(*args):
        idx = real(*args)
        fast_calls.append(idx is not None)
        return idx

    bufs = []
    for general in (False, True):
        opts = dict(num_envs=num_envs, stack_size=K, layout=layout, seed=3, **kw)
        if form == "array":
            opts["pool"] = impl.FramePool(FRAME[layout], np.uint8)
        rb = cls(**opts)
        ids = (0 if num_envs == 1 else np.arange(num_envs)) if general else None
        for t, args in enumerate(transitions(impl, form, layout, num_envs, steps, 1)):
            if general:
                rb.add(**args, env_ids=ids)
            else:
                _ingest.fast_add = spy
                try:
                    rb.add(**args)
                finally:
                    _ingest.fast_add = real
            if t == 0 and not general:
                fast_calls.clear()  # the first add always takes the general path
        bufs.append(rb)
    return bufs, fast_calls


def assert_same_buffers(a, b):
    assert_same_state(buffer_state(a), buffer_state(b))
    if len(a):
        sa, sb = a.sample(16), b.sample(16)
        np.testing.assert_array_equal(sa.observations, sb.observations)
        np.testing.assert_array_equal(sa.next_observations, sb.next_observations)
        np.testing.assert_array_equal(sa.rewards, sb.rewards)
        np.testing.assert_array_equal(sa.actions, sb.actions)


@pytest.mark.parametrize("layout", ["stack", "last", "first"])
@pytest.mark.parametrize(
    "form,num_envs", [("array", 1), ("array", 3), ("lazy", 1), ("lazy", 3), ("batch", 3)]
)
@pytest.mark.parametrize("compress", [False, True])
def test_fast_path_stores_what_the_general_path_stores(impl, form, num_envs, layout, compress):
    # capacity below the steps: the ring wraps and evicts
    (a, b), fast = both(
        impl, form, layout, num_envs, 25, capacity=12 * num_envs, n_step=2, compress=compress
    )
    assert fast and all(fast), "the fast path was not taken"
    assert_same_buffers(a, b)
    assert len(a) == 12 * num_envs


def test_capacity_one_evicts_each_add(impl):
    (a, b), fast = both(impl, "array", "stack", 1, 6, capacity=1)
    assert all(fast)
    assert_same_buffers(a, b)
    assert a._last.tolist() == [0] and a._next.tolist() == [-1]


def test_prioritized_gets_the_fast_path_positions(impl):
    (a, b), fast = both(impl, "array", "stack", 2, 9, capacity=8, cls=PrioritizedReplayBuffer)
    assert all(fast)
    assert_same_buffers(a, b)
    numbers = np.arange(a._added - len(a), a._added)  # transitions are numbered as added
    assert a._added == b._added == 18
    np.testing.assert_array_equal(a.priorities(numbers), b.priorities(numbers))
    np.testing.assert_array_equal(a.sample(8).indices, b.sample(8).indices)


def test_a_wrapping_add_after_env_ids_goes_the_general_way(impl):
    rb = ReplayBuffer(6, num_envs=2, stack_size=K, seed=1, pool=impl.FramePool((2, 3), np.uint8))
    ref = ReplayBuffer(6, num_envs=2, stack_size=K, seed=1, pool=impl.FramePool((2, 3), np.uint8))
    steps = transitions(impl, "array", "stack", 2, 5, 0)
    one = {key: v[:1] for key, v in steps[0].items()}
    for r in (rb, ref):
        r.add(**one, env_ids=np.array([0]))  # pos 1: three 2-env adds wrap at 6
    for args in steps[1:]:
        rb.add(**args)
        ref.add(**args, env_ids=np.arange(2))
    assert_same_buffers(rb, ref)


@pytest.mark.parametrize("num_envs", [1, 2])
def test_placeholders_evicted_by_fast_adds_are_uncounted(impl, num_envs):
    bufs = [
        ReplayBuffer(
            4, num_envs=num_envs, stack_size=K, seed=2, pool=impl.FramePool((2, 3), np.uint8)
        )
        for _ in range(2)
    ]
    ids = 0 if num_envs == 1 else np.arange(num_envs)
    steps = transitions(impl, "array", "stack", num_envs, 8, 0)
    for rb, general in zip(bufs, (False, True), strict=True):
        for t, args in enumerate(steps):
            skip = t in (1, 2)  # placeholders, evicted later
            if skip or general:
                mark = skip if num_envs == 1 else np.full(num_envs, skip)
                rb.add(**args, autoreset=mark, env_ids=ids)
            else:
                rb.add(**args)
    assert bufs[0]._n_skip == bufs[1]._n_skip == 0
    assert_same_buffers(*bufs)


BAD_SCALARS = [
    ({"reward": float("nan")}, ValueError, "reward"),
    ({"reward": float("inf")}, ValueError, "reward"),
    ({"reward": 1e39}, ValueError, "reward"),
    ({"reward": np.float64(-1e39)}, ValueError, "reward"),
    ({"reward": 1 << 70}, ValueError, "reward"),
    ({"reward": "1"}, TypeError, "reward"),
    ({"action": 1 << 63}, ValueError, "action"),
    ({"action": -1}, ValueError, "action"),
    ({"action": np.uint64(1 << 63)}, ValueError, "action"),
    ({"action": 0.5}, TypeError, "action"),
    ({"action": np.timedelta64(1)}, TypeError, "action"),
    ({"reward": np.datetime64(1, "s")}, TypeError, "reward"),
    ({"action": [1]}, ValueError, "action has shape"),
    ({"terminated": 2}, TypeError, "terminated"),
    ({"truncated": "yes"}, TypeError, "truncated"),
    ({"obs": np.zeros((K, 2, 3), np.int16)}, TypeError, "dtype"),
    ({"next_obs": np.zeros((K, 2, 4), np.uint8)}, ValueError, "shape"),
    ({"next_obs": np.zeros((1, K, 2, 3), np.uint8)}, ValueError, "next_obs has shape"),
]


@pytest.mark.parametrize("bad,exc,msg", BAD_SCALARS)
def test_bad_input_still_raises_and_stores_nothing(impl, bad, exc, msg):
    rb = ReplayBuffer(
        8, stack_size=K, action_dtype=np.uint32, pool=impl.FramePool((2, 3), np.uint8)
    )
    good = {
        "obs": np.zeros((K, 2, 3), np.uint8),
        "action": 1,
        "reward": 1.0,
        "next_obs": np.ones((K, 2, 3), np.uint8),
        "terminated": False,
        "truncated": False,
    }
    rb.add(**good)
    before = buffer_state(rb)
    with pytest.raises(exc, match=msg):
        rb.add(**{**good, **bad})
    assert_same_state(before, buffer_state(rb))


def test_accepted_edge_values_are_stored_exactly(impl):
    rb = ReplayBuffer(
        8, stack_size=K, action_dtype=np.uint64, pool=impl.FramePool((2, 3), np.uint8)
    )
    o = np.zeros((K, 2, 3), np.uint8)
    top = float(np.finfo(np.float32).max)
    for a, r in [(0, 1.0), ((1 << 64) - 1, top), (np.uint64(1 << 63), -top), (True, 1 << 24)]:
        rb.add(o, a, r, o, np.True_, True)
    assert rb._actions[:4].tolist() == [0, (1 << 64) - 1, 1 << 63, 1]
    assert rb._rewards[:4].tolist() == [1.0, top, -top, float(1 << 24)]
    assert rb._flags[:4].tolist() == [3, 3, 3, 3]
    rb.add(o, np.int16(2), np.float32(0.5), o, np.array(True), 0)  # 0-d array, 0: general path
    assert (rb._actions[4], rb._rewards[4], rb._flags[4]) == (2, 0.5, 1)
    one = ReplayBuffer(4, stack_size=K, pool=impl.FramePool((2, 3), np.uint8))
    one.add(o, 1, 0.0, o, False, False)
    one.add(o[None], [1], np.array([2.5]), o[None], [False], [True])  # batched, E=1
    assert one._rewards[:2].tolist() == [0.0, 2.5] and one._flags[:2].tolist() == [0, 2]
