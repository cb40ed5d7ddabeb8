"""``ReplayBuffer.sample_sequences`` against the plain-Python model: windows of stream steps."""

import itertools
import pickle
from collections import Counter

import numpy as np
import pytest
from conftest import refused
from test_model import SHAPES, K, Run, chi2_p, names

import lazyframes
from lazyframes.replay import sequence_priority

STEP_FIELDS = ("actions", "rewards", "dones", "truncations", "discounts")


def check_windows(run, B, length, burn_in=0, within=False, frames=False, **kw):
    """One ``sample_sequences`` checked step by step against the model; returns it."""
    rb, m, T = run.rb, run.model, burn_in + length
    s = rb.sample_sequences(B, length, burn_in=burn_in, within_episode=within, frames=frames, **kw)
    assert s.observations.shape == (B, T, *rb.observation_shape) and s.burn_in == burn_in
    assert s.mask.shape == s.rewards.shape == (B, T) and s.indices.dtype == np.int64
    assert (s.frames is not None) == frames and (run.prioritized or np.all(s.weights == 1))
    starts = set(m.starts(T, within))
    for b, i in enumerate(s.indices.tolist()):
        pos = m.position(m.by_number(i)) if run.prioritized else i  # ids: numbers there
        assert pos in starts, f"window {b} starts at {pos}, not a valid start: {sorted(starts)}"
        seq = m.sequence(m.at(pos), T)
        mask = m.mask(seq)
        assert s.mask[b].tolist() == [float(x) for x in mask], (b, s.mask[b], mask)
        for t, u in enumerate(seq):
            got = s.observations[b, t]
            assert np.array_equal(got, u.obs), (
                f"window {b} step {t}: frames {names(got, run.layout)}, "
                f"model {names(u.obs, run.layout)}"
            )
            want = m.expected(m.position(u), open_ok=True)
            assert s.actions[b, t] == want.actions
            if mask[t]:  # masked steps' fields are the stream's: checked where they count
                for name in STEP_FIELDS[1:]:
                    assert getattr(s, name)[b, t] == getattr(want, name), (name, b, t)
        if frames:  # observation t is frames t .. t + k - 1
            f = s.frames[b]
            for t in range(T):
                assert np.array_equal(stacked(f[t : t + K], run.layout), s.observations[b, t])
    return s


def stacked(frames, layout):
    """``K`` frames as one observation of ``layout``."""
    axis = 0 if layout == "first" else -1
    return frames if layout == "stack" else np.concatenate(frames, axis=axis)


@pytest.mark.parametrize("layout", list(SHAPES))
@pytest.mark.parametrize("kind", ["batch", "array"])
@pytest.mark.parametrize("num_envs, n_step", [(1, 1), (3, 2)])
def test_windows_match_model(layout, kind, num_envs, n_step):
    # interleaved streams (random env subsets), episode ends of every kind, wrap-around
    run = Run(40, num_envs=num_envs, n_step=n_step, layout=layout, seed=5)
    for i in range(90):
        run.add(kind, run.envs(kind) if num_envs > 1 else None, p_end=0.08)
        if i > 30 and i % 7 == 0:
            check_windows(run, 9, 3, burn_in=i % 3)
            if run.model.starts(4, True):
                check_windows(run, 5, 4, within=True, frames=layout != "last")
    assert run.model.full


def test_draws_are_uniform_over_valid_starts():
    run = Run(48, num_envs=2, seed=6)
    for _ in range(80):
        run.add("array", p_end=0.1)
    for within in (False, True):
        ok = run.model.starts(5, within)
        assert 2 <= len(ok) < len(run.model) - 8, "the test needs starts that cannot be drawn"
        draws = run.rb.sample_sequences(20_000, 5, within_episode=within).indices
        assert set(draws.tolist()) <= set(ok)
        counts = np.bincount(draws, minlength=48)[ok]
        assert chi2_p(counts, [1 / len(ok)] * len(ok)) > 1e-4, counts


def test_few_valid_starts_are_enumerated():
    # a window as long as the streams: nearly every random start is redrawn, then enumerated
    run = Run(60, num_envs=2, seed=7)
    for _ in range(30):
        run.add("array", p_end=0.0)
    ok = run.model.starts(29, False)
    assert len(ok) == 4  # 2 streams x 2 starts
    assert set(check_windows(run, 50, 29).indices.tolist()) == set(ok)
    refused(ValueError, "no window of 31 steps", run.rb.sample_sequences, 1, 31)


def test_compressed_windows_are_the_same():
    runs = [Run(200, num_envs=2, n_step=3, seed=8, compress=c) for c in (False, True)]
    for _ in range(150):
        for run in runs:
            run.rng = np.random.default_rng(len(run.model.fifo))  # the same adds
            run.add("batch", p_end=0.05)
    runs[1].rb.flush()
    a, b = (run.rb.sample_sequences(16, 6, burn_in=2) for run in runs)
    for name, x, y in zip(a._fields, a, b, strict=True):
        assert np.array_equal(x, y), name
    a, b = (run.rb.sample_sequences(8, 6, within_episode=True, frames=True) for run in runs)
    assert np.array_equal(a.frames, b.frames) and np.array_equal(a.observations, b.observations)
    assert runs[1].rb.memory()["cold_frames"] > 0


def test_out_dtype_and_scale():
    run = Run(60, seed=9)
    for _ in range(40):
        run.add("array", p_end=0.05)
    rb = run.rb
    out = np.empty((4, 3, *rb.observation_shape), np.float32)
    state = rb._rng.bit_generator.state
    s = rb.sample_sequences(4, 3, out=out, scale=1 / 255)
    assert s.observations is out
    rb._rng.bit_generator.state = state
    u = rb.sample_sequences(4, 3)
    assert np.array_equal(out, u.observations.astype(np.float32) * np.float32(1 / 255))
    frames = np.empty((4, 3 + K - 1, *SHAPES["stack"]), np.uint8)
    s = rb.sample_sequences(4, 3, within_episode=True, frames=True, out=frames)
    assert s.frames is frames and not s.observations.flags.writeable


def test_refusals_before_a_draw():
    run = Run(30, layout="last", seed=10)
    rb = run.rb
    refused(ValueError, "empty", rb.sample_sequences, 1, 2)
    for _ in range(20):
        run.add("array", p_end=0.0)
    state = rb._rng.bit_generator.state
    refused(ValueError, "length must be", rb.sample_sequences, 1, 0)
    refused(ValueError, "burn_in >= 0", rb.sample_sequences, 1, 2, burn_in=-1)
    refused(ValueError, "needs within_episode", rb.sample_sequences, 1, 2, frames=True)
    refused(ValueError, "one channel in layout 'last'", rb.sample_sequences, 1, 2,
            within_episode=True, frames=True)  # fmt: skip
    refused(ValueError, "shape", rb.sample_sequences, 2, 2, out=np.empty((2, 3, 5, 6, 6), np.uint8))
    refused(TypeError, "scale needs a float", rb.sample_sequences, 2, 2, scale=2.0)
    refused(TypeError, "integer", rb.sample_sequences, 2, 2.5)
    assert rb._rng.bit_generator.state == state  # nothing drawn


def test_frames_refused_when_stacks_share_no_frames():
    rb = lazyframes.ReplayBuffer(20, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(10):  # unrelated stacks: nothing to share
        obs, nxt = rng.integers(0, 255, (2, K, 3, 3), dtype=np.uint8)
        rb.add(obs, 0, 0.0, nxt, False, False)
    refused(ValueError, "do not share frames", rb.sample_sequences, 2, 3,
            within_episode=True, frames=True)  # fmt: skip
    assert rb.sample_sequences(2, 3).observations.shape == (2, 3, K, 3, 3)


@pytest.mark.parametrize("frames", [False, True])
def test_dict_observations(frames):
    # an image leaf (frames of one stack) and a vector leaf, per step, in windows
    rb = lazyframes.ReplayBuffer(50, seed=0, frame_keys="img")
    pool = lazyframes.FramePool((2, 2), np.uint8)
    refs = [pool.push(np.full((2, 2), t, np.uint8)) for t in range(45)]
    for t in range(40):
        obs = {"img": pool.lazy(refs[t : t + K], layout="stack"), "v": np.array([t, -t])}
        nxt = {"img": pool.lazy(refs[t + 1 : t + 1 + K], layout="stack"), "v": np.array([t + 1, 0])}
        rb.add(obs, t, 0.0, nxt, False, False)
    out = {"img": np.empty((3, 5 + K - 1, 2, 2) if frames else (3, 5, K, 2, 2), np.float32)}
    s = rb.sample_sequences(3, 5, within_episode=frames, frames=frames, out=out, dtype=np.float32)
    for b, t0 in enumerate(s.indices.tolist()):
        steps = np.arange(t0, t0 + 5)
        assert s.observations["v"][b].tolist() == [[t, -t] for t in steps]
        assert s.observations["img"][b, :, :, 0, 0].tolist() == [
            list(range(t, t + K)) for t in steps
        ]
    assert (s.frames is None) != frames and (not frames or s.frames["img"] is out["img"])
    refused(TypeError, "dict of arrays by frame key", rb.sample_sequences, 3, 5, out=out["img"])
    with rb.sequence_sampler(2, 3) as sampler:
        assert next(sampler).observations["v"].shape == (2, 3, 2)


@pytest.mark.parametrize("within, steps", [(False, 4), (True, 4), (False, 15)])
def test_prioritized_windows(within, steps):
    # drawn in proportion to the first step's priority ** alpha among the valid windows,
    # the ids are transition numbers, the weights sample's; 15 steps: few valid, enumerated
    run = Run(30, num_envs=2, n_step=2, prioritized=True, alpha=0.7, seed=11)
    for _ in range(40):  # wraps: numbers run past the capacity
        run.add("batch", p_end=0.1)
    m, rb = run.model, run.rb
    numbers = [t.number for t in m.fifo]
    prio = run.rng.uniform(0.1, 3, len(numbers))
    rb.update_priorities(numbers, prio)
    m.update_priorities(numbers, prio)
    starts = {m.at(p).number for p in m.starts(steps, within)} & set(m.probabilities())
    assert 2 <= len(starts) < len(numbers) - 4, "the test needs windows that cannot be drawn"
    s = check_windows(run, 4, steps, within=within)  # ids are numbers, not positions
    counts = Counter()
    for _ in range(20):
        s = rb.sample_sequences(500, steps, within_episode=within, beta=0.5)
        for n, w, pos in zip(s.indices.tolist(), s.weights, s.observations[:, 0], strict=True):
            t = m.by_number(n)
            assert np.array_equal(pos, t.obs) and w == m.weight(n, 0.5), n
        counts.update(s.indices.tolist())
    assert set(counts) <= starts, "drew a window that is not valid"
    powered = {n: m.by_number(n).priority ** 0.7 for n in starts}
    total = sum(powered.values())
    assert chi2_p([counts[n] for n in powered], [v / total for v in powered.values()]) > 1e-4
    rb.update_priorities(s.indices, sequence_priority(np.ones((500, steps)), s.mask))


def test_sequence_priority():
    p = [[1.0, -4.0, 2.0, 8.0], [0.5, 0.5, 0.5, 0.5]]
    got = sequence_priority(p, [[1, 1, 1, 0], [1, 1, 0, 0]], eta=0.9)
    assert got.tolist() == [0.9 * 4 + 0.1 * 7 / 3, 0.5]
    assert sequence_priority(p).tolist() == [0.9 * 8 + 0.1 * 15 / 4, 0.5]
    assert sequence_priority([[1.0]], [[0]]).tolist() == [0.0]
    refused(ValueError, "shape", sequence_priority, [1.0, 2.0])
    refused(ValueError, "eta", sequence_priority, [[1.0]], eta=1.5)
    refused(ValueError, "mask has shape", sequence_priority, [[1.0]], [[1, 1]])


def stream_buffer(cls=lazyframes.ReplayBuffer, capacity=40, **kw):
    """A buffer of 2 streams, frame ``n`` of env ``e`` filled with ``10 * n + e`` (mod 256)."""
    return cls(capacity, num_envs=2, seed=0, extras={"logits": ((3,), np.float32),
               "value": ((), np.float64)}, **kw)  # fmt: skip


def fill(rb, steps, start_every=None):
    """``steps`` adds of both envs; each step's extras encode its add count ``t`` and env.

    Returns ``{position: (t, env)}`` of the stored steps and the marked starts' positions.
    """
    f = [[np.full((2, 2), e, np.uint8)] * K for e in range(2)]
    held, marked = {}, set()
    for t in range(steps):
        nxt = [s[1:] + [np.full((2, 2), (10 * t + e) % 256, np.uint8)] for e, s in enumerate(f)]
        extras = {"logits": np.array([[t, e, -1.0] for e in range(2)], np.float32),
                  "value": np.array([t + 0.5, -t - 0.5])}  # fmt: skip
        kw = {}
        if start_every:
            mark = np.array([(t + e) % start_every == 0 for e in range(2)])
            kw = {"start_extras": {"state": np.full((2, 2, 3), t, np.float32) + [[[0]], [[1]]]},
                  "starts": mark}  # fmt: skip
        pos = rb._ring.pos
        rb.add(np.stack([np.stack(s) for s in f]), [0, 1], [0.0, 0.0],
               np.stack([np.stack(s) for s in nxt]), [False] * 2, [False] * 2,
               extras=extras, **kw)  # fmt: skip
        for e in range(2):
            p = (pos + e) % rb.capacity
            held[p] = (t, e)
            marked.discard(p)
            if start_every and mark[e]:
                marked.add(p)
        f = nxt
    return held, marked


@pytest.mark.parametrize("prioritized", [False, True])
def test_step_extras_come_with_their_steps_and_update(prioritized, tmp_path):
    cls = lazyframes.PrioritizedReplayBuffer if prioritized else lazyframes.ReplayBuffer
    rb = stream_buffer(cls)
    held, _ = fill(rb, 35)  # wraps: 70 steps into 40
    s = rb.sample_sequences(16, 5)
    pos = s.steps % rb.capacity if prioritized else s.steps
    assert np.array_equal(s.indices, s.steps[:, 0]) and s.extras["logits"].shape == (16, 5, 3)
    for (b, t), p in np.ndenumerate(pos):
        tt, e = held[int(p)]
        assert s.extras["logits"][b, t].tolist() == [tt, e, -1.0]
        assert s.extras["value"][b, t] == (tt + 0.5 if e == 0 else -tt - 0.5)
    rb.update_extras("value", s.steps[:, 1:3], np.full((16, 2), 7.0))
    again = rb.sample_sequences(200, 1).extras["value"]
    assert np.count_nonzero(again == 7.0) > 0
    updated = set(pos[:, 1:3].ravel().tolist())
    for p in range(rb.capacity):  # exactly the updated steps hold 7
        assert (rb._ring.extras(np.array([p]))["value"][0] == 7.0) == (p in updated)
    for how in ("save", "pickle"):  # checkpoints keep them, and the declarations
        if how == "save":
            rb.save(tmp_path / "rb.npz")
            copy = cls.load(tmp_path / "rb.npz")
        else:
            copy = pickle.loads(pickle.dumps(rb))
        state = rb._rng.bit_generator.state
        a = rb.sample_sequences(8, 4)
        rb._rng.bit_generator.state = state
        b = copy.sample_sequences(8, 4)
        for name in ("logits", "value"):
            assert np.array_equal(a.extras[name], b.extras[name]), name
        fill(copy, 1)  # takes extras as the original does


def test_step_extras_refusals_store_nothing():
    rb = stream_buffer()
    fill(rb, 3)
    f = np.zeros((2, K, 2, 2), np.uint8)
    args = (f, [0, 1], [0.0, 0.0], f, [False] * 2, [False] * 2)
    for extras, exc, pattern in [
        ({"nope": [1, 2]}, ValueError, "not declared"),
        ({"value": [1.0]}, ValueError, r"shape \(1,\), expected \(2,\)"),
        ({"value": [np.nan, 1.0]}, ValueError, "finite"),
        ({"logits": np.zeros((2, 3), np.complex64)}, TypeError, "numeric"),
        ([1.0], TypeError, "must be a dict"),
    ]:
        refused(exc, pattern, rb.add, *args, extras=extras)
    assert len(rb) == 6
    rb.add(*args)  # names left out: zeros
    assert rb._ring.extras(np.array([6, 7]))["value"].tolist() == [0.0, 0.0]
    refused(TypeError, "declares none", lazyframes.ReplayBuffer(5).add, f[0], 0, 0.0, f[0],
            False, False, extras={"value": 1.0})  # fmt: skip
    refused(KeyError, "no extra 'nope'", rb.update_extras, "nope", [0], [1.0])
    refused(ValueError, "out of range", rb.update_extras, "value", [99], [1.0])
    refused(ValueError, "expected", rb.update_extras, "value", [0, 1], [1.0])
    refused(ValueError, "finite", rb.update_extras, "value", [0], [np.inf])
    refused(ValueError, "identifiers", lazyframes.ReplayBuffer, 5, extras={"a b": ((), float)})
    refused(TypeError, "pair", lazyframes.ReplayBuffer, 5, extras={"a": float})
    refused(ValueError, "share the names", lazyframes.ReplayBuffer, 5,
            extras={"a": ((), float)}, start_extras={"a": ((), float)})  # fmt: skip


@pytest.mark.parametrize("prioritized", [False, True])
def test_windows_start_where_start_extras_are_stored(prioritized, tmp_path):
    cls = lazyframes.PrioritizedReplayBuffer if prioritized else lazyframes.ReplayBuffer
    rb = stream_buffer(cls, start_extras={"state": ((2, 3), np.float32)})
    held, marked = fill(rb, 60, start_every=5)  # wraps: evicted starts leave
    s = rb.sample_sequences(300, 4)
    pos = s.indices % rb.capacity if prioritized else s.indices
    assert set(pos.tolist()) <= marked and len(set(pos.tolist())) > 1
    for b, p in enumerate(pos.tolist()):
        t, e = held[p]
        assert np.all(s.extras["state"][b] == t + e), (b, p)
    assert s.extras["state"].shape == (300, 2, 3)
    assert len(rb._starts._data[0]) <= 2 * len(marked) + 2  # evicted starts' rows reused
    rb.update_extras("state", s.indices[:1], np.zeros((1, 2, 3)))
    refused(
        ValueError,
        "no window start",
        rb.update_extras,
        "state",
        s.indices[:1] + (1 if (pos[0] + 1) % 40 not in marked else 2),
        np.zeros((1, 2, 3)),
    )
    rb.save(tmp_path / "rb.npz")
    copy = cls.load(tmp_path / "rb.npz")
    state = rb._rng.bit_generator.state
    a = rb.sample_sequences(20, 3)
    rb._rng.bit_generator.state = state
    b = copy.sample_sequences(20, 3)
    assert np.array_equal(a.indices, b.indices) and np.array_equal(
        a.extras["state"], b.extras["state"]
    )
    rb.clear()
    refused(ValueError, "empty", rb.sample_sequences, 1, 1)
    fill(rb, 3)  # starts given nowhere (start_every=None): no window yet
    refused(ValueError, "no window start", rb.sample_sequences, 1, 1)


def test_marked_starts_without_values(tmp_path):
    # start_extras={}: R2D2's strided starts (an actor marks every 5th step of its episodes)
    rb = stream_buffer(start_extras={})
    f = np.zeros((2, K, 2, 2), np.uint8)
    for t in range(30):
        rb.add(f, [0, 1], [0.0, 0.0], f, [False] * 2, [False] * 2, starts=[t % 5 == 0] * 2)
    s = rb.sample_sequences(100, 3)
    assert set((s.indices // 2 % 5).tolist()) == {0} and set(s.extras) == {"logits", "value"}
    rb.save(tmp_path / "rb.npz")
    copy = lazyframes.ReplayBuffer.load(tmp_path / "rb.npz")
    assert np.array_equal(copy._starts.marked(), rb._starts.marked())


@pytest.mark.parametrize("prioritized, frames", [(False, False), (True, True)])
def test_sequence_sampler_yields_the_batches_of_sample_sequences(prioritized, frames):
    runs = [Run(300, num_envs=2, seed=12, prioritized=prioritized, compress=True) for _ in "ab"]
    for _ in range(200):
        for run in runs:
            run.rng = np.random.default_rng(len(run.model.fifo))  # the same adds
            run.add("batch", p_end=0.02)
    a, b = (run.rb for run in runs)
    kw = {"burn_in": 1, "within_episode": frames, "frames": frames, "dtype": np.float32,
          "scale": 0.5}  # fmt: skip
    with a.sequence_sampler(6, 4, prefetch=2, **kw) as sampler:
        got = [next(sampler) for _ in range(5)]
        kept = [np.array(s.observations) for s in got[-3:]]  # valid until 3 more next()
    want = []
    for _ in range(5):  # (sample_sequences reuses its output: copied)
        w = b.sample_sequences(6, 4, **kw)
        want.append(w._replace(observations=np.array(w.observations)))
    for g, w in zip(got[-3:], want[-3:], strict=True):
        for name in ("indices", "weights", "steps", "mask", "rewards", "actions"):
            assert np.array_equal(getattr(g, name), getattr(w, name)), name
    for k, w in zip(kept, want[-3:], strict=True):
        assert np.array_equal(k, w.observations)
    check_windows(runs[0], 3, 4, burn_in=1)  # the buffer goes on as before


def test_sequence_sampler_batches_are_the_buffer_at_their_draw():
    # each batch is drawn before the adds that evict its steps: its frames stay its own
    run = Run(60, seed=13)
    for _ in range(50):
        run.add("batch", p_end=0.0)
    with run.rb.sequence_sampler(4, 5, prefetch=1, within_episode=True) as sampler:
        for _ in range(30):
            s = next(sampler)
            for window in s.observations:  # one stream's consecutive stacks: a frame a step
                seen = [names(o, "stack") for o in window]
                for a, b in itertools.pairwise(seen):
                    assert b[:-1] == a[1:] and b[-1] == (a[-1][0], a[-1][1] + 1), seen
            run.add("batch", p_end=0.0)
            run.add("batch", p_end=0.0)
    refused(
        TypeError, "2 \\* prefetch \\+ 1", run.rb.sequence_sampler, 2, 2, prefetch=1, out=[None]
    )
