"""ReplayBuffer and PrioritizedReplayBuffer against the plain-Python model, after every add."""

import math
import pickle
from collections import Counter
from typing import NamedTuple

import numpy as np
import pytest
from conftest import assert_same_samples, refused
from oracle import replay as model

import lazyframes
from lazyframes import PrioritizedReplayBuffer, ReplayBuffer

K = 3  # frames per observation
SHAPES = {"stack": (5, 6), "first": (2, 5, 6), "last": (5, 6, 2)}  # frames per layout
KINDS = ("lazy", "list", "batch", "array")  # LazyFrames, a list of them, LazyBatch, ndarray
HOWS = ("plain", "autoreset", "final")  # what follows an episode's end, see Feed.step
FIELDS = model.Expected._fields


def frame(env, n, shape):
    """Frame ``n`` of stream ``env``: pixels 0-2 are env, n % 256, n // 256."""
    a = (np.arange(math.prod(shape)) * 3 + env * 37 + n * 11) % 256
    a[:3] = env, n % 256, n // 256
    return a.astype(np.uint8).reshape(shape)


def names(obs, layout):
    """``(env, n)`` of each frame of one observation, for failure messages."""
    axis = {"stack": 0, "first": 0, "last": -1}[layout]
    parts = [np.ascontiguousarray(p).reshape(-1) for p in np.split(obs, K, axis=axis)]
    return [(int(p[0]), int(p[1]) + 256 * int(p[2])) for p in parts]


def chi2_p(counts, probs):
    """p-value of Pearson's chi-square test (Wilson-Hilferty approximation)."""
    n, dof = sum(counts), len(counts) - 1
    x = sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs, strict=True))
    z = ((x / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


class Row(NamedTuple):
    """One env step: stacks of FrameRefs, the flags, and the final stack (or None)."""

    obs: list
    next: list
    term: bool
    trunc: bool
    skip: bool
    final: list | None


class Feed:
    """``num_envs`` env streams of ``K``-frame stacks in one pool, as a frame stacker gives."""

    def __init__(self, num_envs, layout):
        self.layout, self.shape = layout, SHAPES[layout]
        self.pool = lazyframes.FramePool(self.shape, np.uint8)
        self.count = [0] * num_envs
        self.stacks = [self.reset(e) for e in range(num_envs)]
        self.owed = [False] * num_envs  # the next step of the env is an autoreset step

    def reset(self, e):
        self.count[e] += 1
        return [self.pool.push(frame(e, self.count[e], self.shape))] * K  # reset padding

    def step(self, e, term, trunc, how, skip=False):
        """Env ``e``'s next step; after an episode's end, ``how`` the env resets.

        "plain": from the reset stack; "autoreset": the next step is a placeholder; "final":
        next_obs is the reset stack, final_obs the last. ``skip``: a placeholder now anyway.
        """
        obs = self.stacks[e]
        if self.owed[e] or skip:
            self.owed[e], self.stacks[e] = False, self.reset(e)
            return Row(obs, self.stacks[e], term and skip, trunc and skip, True, None)
        self.count[e] += 1
        nxt = obs[1:] + [self.pool.push(frame(e, self.count[e], self.shape))]
        self.stacks[e] = nxt
        if not (term or trunc) or how == "plain":
            self.stacks[e] = self.reset(e) if term or trunc else nxt
            return Row(obs, nxt, term, trunc, False, None)
        if how == "autoreset":
            self.owed[e] = True
            return Row(obs, nxt, term, trunc, False, None)
        self.stacks[e] = self.reset(e)
        return Row(obs, self.stacks[e], term, trunc, False, nxt)

    def lazy(self, refs):
        return self.pool.lazy(refs, layout=self.layout)

    def pack(self, kind, stacks):
        """The observations of ``stacks`` in input form ``kind``, batched."""
        if kind == "batch":
            slots = np.array([[r.slot for r in refs] for refs in stacks])
            return self.pool.lazy_batch(slots, layout=self.layout)
        if kind == "array":
            return np.stack([np.asarray(self.lazy(refs)) for refs in stacks])
        return [self.lazy(refs) for refs in stacks]


class Run:
    """A buffer and its model, fed the same transitions by a :class:`Feed`."""

    def __init__(self, capacity, *, num_envs=1, n_step=1, layout="stack", seed=0, **kw):
        self.prioritized = kw.pop("prioritized", False)
        alpha = kw.pop("alpha", 0.6)
        opts = {"num_envs": num_envs, "n_step": n_step, "gamma": kw.pop("gamma", 0.9)}
        opts["action_dtype"] = kw.pop("action_dtype", np.int64)
        geometry = {"layout": layout, "stack_size": K} if kw.pop("tell", True) else {}
        cls, model_cls = ((PrioritizedReplayBuffer, model.PrioritizedModel) if self.prioritized
                          else (ReplayBuffer, model.ReplayModel))  # fmt: skip
        extra = {"alpha": alpha} if self.prioritized else {}
        self.rb = cls(capacity, seed=seed, **geometry, **opts, **extra, **kw)
        self.model = model_cls(capacity, **extra, **opts)
        self.num_envs, self.layout = num_envs, layout
        self.feed = Feed(num_envs, layout)
        self.rng = np.random.default_rng(seed)

    def envs(self, kind):
        """A random env_ids subset (in random order) of at least one env, or None (every env)."""
        rng, n = self.rng, self.num_envs
        if kind == "lazy" and (n > 1 or rng.random() < 0.3):  # one transition, env_ids=int
            return [int(rng.integers(n))]
        if rng.random() < 0.4:
            return None
        return rng.permutation(n)[: rng.integers(1, n + 1)].tolist()

    def add(self, kind, envs=None, p_end=0.15, how=None, p_skip=0.03):
        """One add of the envs ``envs`` (None: every env, no env_ids) in input form ``kind``."""
        rng, feed = self.rng, self.feed
        ids = list(range(self.num_envs)) if envs is None else envs
        E = len(ids)
        ends = rng.random((E, 3)) < [p_end, p_end, p_skip]
        hows = [how or rng.choice(HOWS) for _ in ids]
        rows = [feed.step(e, *ends[i, :2], hows[i], ends[i, 2]) for i, e in enumerate(ids)]
        batched = E > 1 or kind in ("list", "batch") or (kind == "array" and rng.random() < 0.5)
        kind = "list" if kind == "lazy" and batched else kind
        actions, rewards = rng.integers(0, 5, E), rng.normal(0, 2, E)
        term, trunc, skip = (np.array([r[i] for r in rows]) for i in (2, 3, 4))
        mask = np.array([r.final is not None for r in rows])
        autoreset = skip if skip.any() or rng.random() < 0.5 else None
        final_mask = mask if mask.any() or rng.random() < 0.5 else None
        final_obs = None
        if mask.any() and (kind == "batch" or rng.random() < 0.5):  # next_obs with finals
            final_obs = feed.pack(kind, [r.final or r.next for r in rows])
        elif mask.any():  # Gymnasium's infos["final_obs"]: None for the other envs
            final_obs = np.empty(E, object)
            for i in np.flatnonzero(mask):
                final_obs[i] = feed.pack(kind, [rows[i].final])[0]
        obs, nxt = feed.pack(kind, [r.obs for r in rows]), feed.pack(kind, [r.next for r in rows])
        args = [obs, actions, rewards, nxt, term, trunc]
        extra = {"autoreset": autoreset, "final_obs": final_obs, "final_mask": final_mask}
        if not batched:  # one transition without a leading axis
            args = [a[0] for a in args]
            extra = {key: None if v is None else v[0] for key, v in extra.items()}
            extra["final_mask"] = None if final_mask is None else bool(final_mask[0])
            extra["autoreset"] = None if autoreset is None else bool(autoreset[0])
        env_ids = None if envs is None else np.array(ids) if batched else ids[0]
        self.rb.add(*args, env_ids=env_ids, **extra)
        arrays = ([np.asarray(feed.lazy(r.obs)) for r in rows],
                  [np.asarray(feed.lazy(r.next)) for r in rows])  # fmt: skip
        finals = [None if r.final is None else np.asarray(feed.lazy(r.final)) for r in rows]
        self.model.add(arrays[0], actions, rewards, arrays[1], term, trunc,
                       autoreset=autoreset, env_ids=envs, final_obs=finals,
                       final_mask=final_mask)  # fmt: skip

    def sample(self, batch_size=None, beta=None):
        """A batch of the buffer (copied), checked against the model; None if none can be."""
        rb, m = self.rb, self.model
        B = int(self.rng.integers(1, 24)) if batch_size is None else batch_size
        beta = float(self.rng.random()) if beta is None else beta
        extra = {"beta": beta} if self.prioritized else {}
        if not m.sampleable():
            refused(ValueError, r"no transition can be|empty", rb.sample, B, **extra)
            return None
        s = rb.sample(B, **extra)
        s = type(s)(*(np.array(a) for a in s))
        assert s.indices.dtype == np.int64 and s.actions.dtype == m.action_dtype
        for name in ("dones", "rewards", "truncations", "discounts"):
            assert getattr(s, name).dtype == np.float32, name
        for j, i in enumerate(s.indices.tolist()):
            if self.prioritized:
                t = m.by_number(i)  # a number of a stored transition
                assert s.weights[j] == m.weight(i, beta), f"weight of transition {i}"
                i = m.position(t)
            want = m.expected(i)
            assert want is not None, f"drew position {i}, not sampleable: {m.positions()}"
            for name, value in zip(FIELDS, want, strict=True):
                got = getattr(s, name)[j]
                if name.endswith("observations"):
                    assert np.array_equal(got, value), (
                        f"{name} at position {i}: frames {names(got, self.layout)}, "
                        f"model {names(value, self.layout)}"
                    )
                else:
                    assert got == value, f"{name} at position {i}: {got!r}, model {value!r}"
        return s

    def check(self):
        """``len``, ``full`` and ``memory()`` as the model's, and one batch checked."""
        m = self.model
        assert len(self.rb) == len(m) == self.rb.memory()["transitions"], (len(self.rb), len(m))
        assert self.rb.full == m.full and self.rb.capacity == m.capacity
        return self.sample()

    def roundtrip(self, how, path):
        """Replace the buffer by its save/load or pickle copy, checking both sample alike."""
        rb = self.rb
        if how == "save":
            rb.save(path)
            copy = type(rb).load(path)
        else:
            copy = pickle.loads(pickle.dumps(rb))
        if self.model.sampleable():
            B = int(self.rng.integers(1, 24))
            extra = {"beta": 0.5} if self.prioritized else {}
            assert_same_samples(rb.sample(B, **extra), copy.sample(B, **extra), how)
        if self.prioritized and len(self.model):  # a checkpoint keeps the priorities
            numbers = [t.number for t in self.model.fifo]
            assert copy.priorities(numbers).tolist() == self.model.priorities(numbers), how
        self.rb = copy
        self.check()


@pytest.mark.parametrize("layout", list(SHAPES))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("num_envs, n_step", [(1, 1), (1, 3), (3, 1), (3, 3)])
def test_buffer_matches_model(layout, kind, num_envs, n_step):
    run = Run(14, num_envs=num_envs, n_step=n_step, layout=layout, seed=n_step)
    for _ in range(45):
        run.add(kind, run.envs(kind))
        run.check()
    assert run.model.full and len(run.model) == 14 // num_envs * num_envs  # wrapped around


@pytest.mark.parametrize("how", HOWS)
def test_episode_ends(how):
    # frequent ends: windows end by termination, truncation, placeholders or final_obs
    run = Run(20, num_envs=2, n_step=3, seed=1)
    for _ in range(30):
        run.add("array", how=how, p_end=0.4)
        run.check()


@pytest.mark.parametrize("prioritized", [False, True])
@pytest.mark.parametrize("n_step", [1, 3])
def test_clear_save_load_pickle(prioritized, n_step, tmp_path):
    run = Run(12, num_envs=2, n_step=n_step, prioritized=prioritized, seed=2)
    for step in range(40):
        run.add(KINDS[step % 4], run.envs(KINDS[step % 4]))
        run.check()
        if step in (9, 25):
            run.rb.clear()
            run.model.clear()
            run.check()
        if step % 6 == 5:
            run.roundtrip("save" if step % 12 == 5 else "pickle", tmp_path / "rb.npz")


@pytest.mark.parametrize("n_step, num_envs, adds", [(3, 2, 120), (12, 4, 12)])
def test_draws_are_uniform_over_sampleable(n_step, num_envs, adds):
    # many sure positions (redrawing the others) and few (enumerating them)
    run = Run(48, num_envs=num_envs, n_step=n_step, seed=3)
    for _ in range(adds):
        run.add("array", p_end=0.1)
    ok = run.model.positions()
    assert 2 <= len(ok) < len(run.model), "the test needs positions that cannot be drawn"
    draws = run.rb.sample(30_000).indices
    assert set(draws.tolist()) <= set(ok), "drew a position that is not sampleable"
    counts = np.bincount(draws, minlength=48)[ok]
    assert chi2_p(counts, [1 / len(ok)] * len(ok)) > 1e-4, counts


def test_prioritized_numbers_weights_and_frequencies():
    run = Run(30, num_envs=2, n_step=3, prioritized=True, alpha=0.7, seed=4)
    for _ in range(40):  # wraps: numbers run past the capacity
        run.add("batch", run.envs("batch"))
        run.check()
    numbers = [t.number for t in run.model.fifo]
    # the transitions that cannot be drawn get the lowest priorities: not the weights' min
    prio = [
        0.05 if run.model.window(t) is None else run.rng.uniform(0.1, 3) for t in run.model.fifo
    ]
    assert 0.05 in prio, "the test needs transitions that cannot be drawn"
    run.rb.update_priorities(numbers, prio)
    run.model.update_priorities(numbers, prio)
    assert run.rb.priorities(numbers).tolist() == run.model.priorities(numbers)
    probs = run.model.probabilities()
    counts = Counter()
    for _ in range(60):
        counts.update(run.sample(256).indices.tolist())  # weights checked per draw
    assert set(counts) <= set(probs), "drew a transition that is not sampleable"
    assert chi2_p([counts[n] for n in probs], list(probs.values())) > 1e-4, counts
    run.add("array")  # a new transition gets the largest priority given so far
    newest = run.model.fifo[-1].number
    assert run.rb.priorities([newest]).tolist() == [max(prio)] == run.model.priorities([newest])


@pytest.mark.parametrize("compress", [False, True])
def test_rows_along_far_links(compress):
    """Rows read along far links (past 16,383 slots) hold what was added, in one id each.

    A row is stored as one id and read along each frame's link to the frame before it:
    the distance between their slots, or an entry in the chunk's table of far links. A
    large buffer that evicts, whose envs' episodes end apart, takes freed slots out of
    order, so some links are far: every batch is still the model's, and every row is still
    one id (a link read wrong would make rows overflow records instead).
    """
    run = Run(24_000, num_envs=3, seed=3, compress=compress)
    for _ in range(20_000):
        run.add("array", p_end=0.01, how="plain", p_skip=0)  # every row a walk along a stream
    for _ in range(20):  # (Run.sample checks every position sampleable: too slow here)
        s = run.rb.sample(24)
        for j, i in enumerate(s.indices.tolist()):
            want = run.model.expected(i)._asdict()
            for name in ("observations", "next_observations"):
                assert np.array_equal(getattr(s, name)[j], want[name]), (name, i)
    (table,) = run.rb._tables
    rows, width = table.shape
    assert table.memory() <= rows * 4 + 16 * width * 4  # no more than the first 16 records
    stats = run.rb.pool.stats()
    if compress:  # a 16-byte record, refcount and link a slot, and the far links' tables
        assert stats["slot_state_bytes"] > 16 * stats["capacity"], stats
