"""PrioritizedReplayBuffer and SumTree against a plain-Python model, on both cores.

The model keeps every transition added (number, env, flags, priority) in a list and
decides sampleability by walking each env stream, with nothing shared with
lazyframes.replay: ``P(i) = p_i**alpha / sum_k p_k**alpha`` over the stored sampleable
transitions, weights ``(N P(i))**-beta / (N P_min)**-beta``. Misuse tests check the
exception, its message and that nothing changed (trees, priorities, RNG).
"""

import math
import pickle
import subprocess
import sys

import numpy as np
import pytest
from conftest import IMPLS, ROOT, core, needs_both

import lazyframes
from lazyframes.replay import PrioritizedReplayBuffer, PrioritizedSamples, ReplayBuffer

FS = (2, 3)
TERM, TRUNC, SKIP = 1, 2, 4


class Model:
    """A prioritized buffer as a list of transitions; the ring is ``capacity`` of them."""

    def __init__(self, capacity, n_step, alpha):
        self.capacity, self.n, self.alpha = capacity, n_step, alpha
        self.rows = []  # per transition number: [env, flags, priority]
        self.max_p = 1.0
        self.base = 0  # number of the first transition after the last clear

    def add(self, env, flags):
        self.rows.append([env, flags, self.max_p])

    def stored(self):
        start = max(self.base, len(self.rows) - self.capacity)
        return range(start, len(self.rows))

    def sampleable(self, t):
        env, fl, _ = self.rows[t]
        if fl & SKIP:
            return False
        if fl & (TERM | TRUNC):
            return True
        later = [u for u in range(t + 1, len(self.rows)) if self.rows[u][0] == env]
        for j in range(1, self.n):
            if j > len(later):
                return False  # the window is still open
            fl2 = self.rows[later[j - 1]][1]
            if fl2 & SKIP or fl2 & (TERM | TRUNC):
                return True
        return True

    def leaves(self):
        """The tree's leaves by ring position: p**alpha where sampleable, else 0."""
        out = np.zeros(self.capacity)
        for t in self.stored():
            if self.sampleable(t):
                out[t % self.capacity] = self.rows[t][2] ** self.alpha
        return out

    def update(self, numbers, prios):
        for t, p in zip(numbers, prios, strict=True):
            self.rows[int(t)][2] = float(p)
        self.max_p = max([self.max_p, *map(float, prios)])

    def weights(self, numbers, beta):
        leaf = {t: self.rows[t][2] ** self.alpha for t in self.stored() if self.sampleable(t)}
        n, total, lo = len(leaf), sum(leaf.values()), min(leaf.values())
        return np.array(
            [(n * leaf[t] / total) ** -beta / (n * lo / total) ** -beta for t in numbers]
        )


def frames(v):
    return np.full((4, *FS), v % 200, np.uint8)


def make(impl, capacity=16, **kw):
    pool = impl.FramePool(FS, np.uint8)
    rb = PrioritizedReplayBuffer(capacity, pool=pool, **kw)
    assert type(rb._tree).__module__ == impl.__name__
    return rb


def add(rb, model, env=0, flags=0, env_ids=None):
    """One transition of stream ``env``; its action is its number (checked in samples)."""
    t = len(model.rows)
    kw = {}
    if rb.num_envs > 1:
        kw["env_ids"] = env
    rb.add(
        frames(t),
        t,
        float(t),
        frames(t + 1),
        bool(flags & TERM),
        bool(flags & TRUNC),
        autoreset=bool(flags & SKIP),
        **kw,
    )
    model.add(env, flags)


def state(rb):
    """Everything a refused call must leave as it was."""
    return (
        rb._tree.get(np.arange(rb.capacity)).tolist(),
        rb._prio.tolist(),
        rb.max_priority,
        rb._added,
        rb._rng.bit_generator.state,
        rb._open.tolist(),
    )


def chi2_critical(df, z=3.09):
    """Upper 0.1% point of chi-square(df), Wilson-Hilferty."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.fixture(params=IMPLS)
def impl(request):
    return core(request.param)


# -- the SumTree ------------------------------------------------------------------------
def test_sumtree_api(impl):
    t = impl.SumTree(5)
    assert t.capacity == 5 and t.total() == 0.0 and t.min() == math.inf
    t.set([0, 2, 4, 2], [1.0, 9.0, 4.0, 3.0])  # a repeated index keeps its last value
    assert t.get([0, 1, 2, 3, 4]).tolist() == [1.0, 0.0, 3.0, 0.0, 4.0]
    assert t.total() == 8.0 and t.min() == 1.0
    assert t.sample([0.5] * 8).tolist() == [0, 2, 2, 2, 4, 4, 4, 4]  # one per segment
    idx, w = t.sample_weighted([0.5, 0.5], 0.5)
    assert idx.tolist() == [2, 4] and w.dtype == np.float32
    np.testing.assert_allclose(w, [3**-0.5, 4**-0.5], rtol=1e-7)
    before = t.get(np.arange(5)).tolist()
    for bad_i, bad_v, exc, msg in [
        ([5], [1.0], ValueError, "out of range"),
        ([-1], [1.0], ValueError, "out of range"),
        ([1], [-1.0], ValueError, ">= 0"),
        ([1], [np.nan], ValueError, ">= 0"),
        ([1], [np.inf], ValueError, ">= 0"),
        ([1, 2], [1.0], ValueError, "differ in size"),
        ([1.0], [1.0], TypeError, "integers"),
        ([1], ["a"], TypeError, "real numbers"),
    ]:
        with pytest.raises(exc, match=msg):
            t.set(bad_i, bad_v)
    assert t.get(np.arange(5)).tolist() == before and t.total() == 8.0
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        t.sample([1.0])
    with pytest.raises(IndexError):
        t.get([5])
    t.clear()
    with pytest.raises(ValueError, match="empty"):
        t.sample([0.5])
    t.set([0, 1], [1e308, 1e308])  # finite leaves whose sum overflows
    with pytest.raises(ValueError, match="float64 max"):
        t.sample([0.5])
    t.clear()
    with pytest.raises(TypeError):
        impl.SumTree.__new__(impl.SumTree).total()
    with pytest.raises(RuntimeError):
        t.__init__(3)
    with pytest.raises(TypeError, match="pickled"):
        t.__reduce__()
    with pytest.raises(ValueError, match=">= 0"):
        impl.SumTree(-1)
    with pytest.raises(MemoryError, match="no memory"):
        impl.SumTree(2**62)


def test_sumtree_no_drift(impl):
    """The drift guard: after many updates the tree equals one built from its leaves."""
    rng = np.random.default_rng(7)
    n = 300
    t = impl.SumTree(n)
    for _ in range(400):
        idx = rng.integers(0, n, rng.integers(1, 40))
        t.set(idx, 10.0 ** rng.uniform(-6, 6, idx.size) * (rng.random(idx.size) > 0.1))
    leaves = t.get(np.arange(n))
    fresh = impl.SumTree(n)
    fresh.set(np.arange(n), leaves)
    assert t.total() == fresh.total() and t.min() == fresh.min()
    assert abs(t.total() - math.fsum(leaves)) <= 16 * np.finfo(float).eps * math.fsum(leaves)
    u = rng.random(500)
    assert t.sample(u).tolist() == fresh.sample(u).tolist()


@needs_both
def test_cores_draw_alike():
    rng = np.random.default_rng(3)
    trees = [core(name).SumTree(77) for name in IMPLS]
    for _ in range(30):
        idx = rng.integers(0, 77, 20)
        v = rng.random(20) * (rng.random(20) > 0.3)
        for t in trees:
            t.set(idx, v)
    trees[0].set([0], [0.5]), trees[1].set([0], [0.5])
    assert trees[0].total() == trees[1].total() and trees[0].min() == trees[1].min()
    u = rng.random(256)
    (ia, wa), (ib, wb) = (t.sample_weighted(u, 0.4) for t in trees)
    assert ia.tolist() == ib.tolist()
    np.testing.assert_allclose(wa, wb, rtol=1e-6)


# -- the buffer against the model --------------------------------------------------------
def test_chi_square_draw_frequencies(impl):
    rb = make(impl, 40, alpha=0.7, seed=11)
    model = Model(40, 1, 0.7)
    for _ in range(40):
        add(rb, model)
    rng = np.random.default_rng(0)
    p = rng.uniform(0.05, 5.0, 40)
    rb.update_priorities(np.arange(40), p)
    model.update(range(40), p)
    counts = np.zeros(40)
    for _ in range(400):
        batch = rb.sample(50, beta=0.5)
        counts += np.bincount(batch.indices, minlength=40)
        # actions hold the transition numbers: the indices name the sampled rows
        assert batch.actions.tolist() == batch.indices.tolist()
    expected = model.leaves() / model.leaves().sum() * counts.sum()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < chi2_critical(39), chi2
    uniform = np.full(40, counts.sum() / 40)  # the test can tell P(i) from uniform
    assert float(((counts - uniform) ** 2 / uniform).sum()) > 10 * chi2_critical(39)


def test_weights_match_formula(impl):
    rb = make(impl, 32, alpha=0.6, seed=1)
    model = Model(32, 1, 0.6)
    for _ in range(20):
        add(rb, model)
    rng = np.random.default_rng(2)
    for beta in (0.0, 0.4, 1.0):
        batch = rb.sample(64, beta=beta)
        assert isinstance(batch, PrioritizedSamples) and batch.weights.dtype == np.float32
        np.testing.assert_allclose(batch.weights, model.weights(batch.indices, beta), rtol=1e-6)
        assert batch.weights.max() <= 1.0
        p = rng.uniform(0.01, 3.0, 64)
        rb.update_priorities(batch.indices, p)
        model.update(batch.indices, p)  # in order: a repeated index keeps its last
        np.testing.assert_allclose(rb._tree.get(np.arange(32)), model.leaves(), rtol=1e-12)
    assert rb.max_priority == model.max_p
    add(rb, model)  # a new transition gets the largest priority seen
    assert rb.priorities([20])[0] == model.max_p


def test_eviction_wraparound_and_stale_indices(impl):
    rb = make(impl, 8, alpha=1.0, seed=3)
    model = Model(8, 1, 1.0)
    for _ in range(5):
        add(rb, model)
    rb.update_priorities([1, 3], [4.0, 0.5])
    model.update([1, 3], [4.0, 0.5])
    for _ in range(15):  # wraps around twice
        add(rb, model)
        np.testing.assert_allclose(rb._tree.get(np.arange(8)), model.leaves(), rtol=1e-12)
    batch = rb.sample(32)
    assert set(batch.indices.tolist()) <= set(range(12, 20))
    np.testing.assert_array_equal(batch.indices % 8, batch.actions % 8)
    before = state(rb)
    for bad, msg in [(3, "evicted"), (11, "evicted"), (20, "never written"), (-1, "evicted")]:
        with pytest.raises(ValueError, match=msg):
            rb.update_priorities([12, bad], [1.0, 1.0])
        assert state(rb) == before
    rb.update_priorities([12, 19], [0.25, 2.0])  # still stored after the wrap
    model.update([12, 19], [0.25, 2.0])
    np.testing.assert_allclose(rb._tree.get(np.arange(8)), model.leaves(), rtol=1e-12)
    rb.clear()
    with pytest.raises(ValueError, match="holds no transition"):
        rb.update_priorities([19], [1.0])
    add(rb, model)  # numbers go on from the next multiple of the capacity
    assert rb.sample(1).indices.tolist() == [24]


@pytest.mark.parametrize("n_step", [1, 3])
def test_nstep_windows_streams_and_placeholders(impl, n_step):
    """Random interleaved streams with episode ends and placeholders: the trees follow."""
    rng = np.random.default_rng(n_step)
    rb = make(impl, 24, alpha=0.5, n_step=n_step, num_envs=3, seed=5)
    model = Model(24, n_step, 0.5)
    model.base = 0
    for step in range(150):
        env = int(rng.integers(3))
        r = rng.random()
        flags = TERM if r < 0.08 else TRUNC if r < 0.14 else SKIP if r < 0.2 else 0
        add(rb, model, env, flags)
        np.testing.assert_allclose(rb._tree.get(np.arange(24)), model.leaves(), rtol=1e-12)
        if step % 7 == 6 and rb._tree.total() > 0:
            batch = rb.sample(16)
            assert all(model.sampleable(t) for t in batch.indices)
            p = rng.uniform(0.1, 2.0, 16)
            rb.update_priorities(batch.indices, p)
            model.update(batch.indices, p)
        if step % 11 == 10:  # an update to a transition whose window is open is kept
            t = len(model.rows) - 1
            rb.update_priorities([t], [1.5])
            model.update([t], [1.5])


def test_no_sampleable_transition_yet(impl):
    rb = make(impl, 8, n_step=3, seed=0)
    model = Model(8, 3, 0.6)
    add(rb, model)
    before = state(rb)
    with pytest.raises(ValueError, match="still open"):
        rb.sample(4)
    assert state(rb) == before
    add(rb, model)
    add(rb, model)
    assert rb.sample(4).indices.tolist() == [0, 0, 0, 0]


def test_compress_same_samples(impl):
    bufs = []
    for compress in (False, True):
        rb = make(impl, 64, seed=9, compress=compress)
        model = Model(64, 1, 0.6)
        for _ in range(50):
            add(rb, model)
        rb.update_priorities(np.arange(50), np.linspace(0.1, 3.0, 50))
        bufs.append(rb)
    assert bufs[1].pool.compression is not None
    for _ in range(3):
        a, b = (rb.sample(16, beta=0.7) for rb in bufs)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
        for rb in bufs:
            rb.update_priorities(a.indices, a.weights + 0.5)


def test_same_seed_same_batches(impl):
    out = []
    for _ in range(2):
        rb = make(impl, 32, seed=4, n_step=2)
        model = Model(32, 2, 0.6)
        for i in range(40):
            add(rb, model, flags=TERM if i % 9 == 8 else 0)
        seq = []
        for _ in range(5):
            b = rb.sample(8, beta=0.3)
            rb.update_priorities(b.indices, b.rewards + 1.0)
            seq.append((b.indices.tolist(), b.weights.tolist()))
        out.append(seq)
    assert out[0] == out[1]


def test_checkpoint_round_trip(impl, tmp_path):
    rb = make(impl, 16, alpha=0.8, n_step=2, num_envs=2, seed=6)
    model = Model(16, 2, 0.8)
    for i in range(30):
        add(rb, model, env=i % 2, flags=SKIP if i == 13 else 0)
    b = rb.sample(8)
    rb.update_priorities(b.indices, np.arange(8) + 0.5)
    path = tmp_path / "per.npz"
    rb.save(path)
    back = PrioritizedReplayBuffer.load(path, pool=impl.FramePool(FS, np.uint8))
    assert type(back._tree).__module__ == impl.__name__
    assert back.alpha == 0.8 and back.max_priority == rb.max_priority
    assert state(back) == state(rb)
    for _ in range(3):
        x, y = rb.sample(8), back.sample(8)
        for u, v in zip(x, y, strict=True):
            np.testing.assert_array_equal(u, v)
        for buf in (rb, back):  # numbers issued before the save still work after the load
            buf.update_priorities(b.indices, np.full(8, 2.5))
    # a plain ReplayBuffer reads it (priorities ignored); a plain file loads with priority 1
    plain = ReplayBuffer.load(path)
    assert len(plain) == len(rb)
    plain.save(tmp_path / "plain.npz")
    per = PrioritizedReplayBuffer.load(tmp_path / "plain.npz")
    assert per.max_priority == 1.0 and per.priorities(np.arange(14, 30)).tolist() == [1.0] * 16
    # a crafted file: a negative priority
    rb._prio[3] = -1.0
    rb.save(tmp_path / "bad.npz")
    with pytest.raises(ValueError, match="bad priorities"):
        PrioritizedReplayBuffer.load(tmp_path / "bad.npz")
    rb._prio[3] = 1.0
    for attr, value, match in [
        ("_added", 2**62 + 14, "bad transition count"),  # beyond int64 once drawn
        ("_alpha", "0.8", "bad alpha"),  # a number as a JSON string
        ("_alpha", True, "bad alpha"),
    ]:
        good = getattr(rb, attr)
        setattr(rb, attr, value)
        rb.save(tmp_path / "bad.npz")
        setattr(rb, attr, good)
        with pytest.raises(ValueError, match=match):
            PrioritizedReplayBuffer.load(tmp_path / "bad.npz")


def test_pickle_keeps_priorities(impl):
    rb = make(impl, 16, alpha=0.7, seed=3, compress=True)
    model = Model(16, 1, 0.7)
    for _ in range(20):
        add(rb, model)
    b = rb.sample(8)
    rb.update_priorities(b.indices, np.arange(8) + 0.25)
    back = pickle.loads(pickle.dumps(rb))
    assert type(back) is PrioritizedReplayBuffer and back.alpha == 0.7
    assert back.max_priority == rb.max_priority and state(back) == state(rb)
    for u, v in zip(rb.sample(8, beta=0.5), back.sample(8, beta=0.5), strict=True):
        np.testing.assert_array_equal(u, v)


def test_misuse_leaves_state_unchanged(impl):
    with pytest.raises(ValueError, match="alpha"):
        PrioritizedReplayBuffer(8, alpha=-0.1)
    with pytest.raises(ValueError, match="alpha"):
        PrioritizedReplayBuffer(8, alpha=float("nan"))
    rb = make(impl, 8, seed=0)
    model = Model(8, 1, 0.6)
    for _ in range(6):
        add(rb, model)
    before = state(rb)
    for idx, prio, exc, msg in [
        ([0, 1], [1.0, -1.0], ValueError, "positive and finite"),
        ([0, 1], [1.0, 0.0], ValueError, "positive and finite"),
        ([0, 1], [1.0, np.nan], ValueError, "positive and finite"),
        ([0, 1], [1.0, np.inf], ValueError, "positive and finite"),
        ([0, 1], [1.0], ValueError, "differ in size"),
        ([0.0, 1.0], [1.0, 1.0], TypeError, "integers"),
        ([0, 1], ["a", "b"], TypeError, "real numbers"),
        ([0, 6], [1.0, 1.0], ValueError, "never written"),
        ([0, 2**63 - 1], [1.0, 1.0], ValueError, "never written"),
        (np.array([0, 2**64 - 1], np.uint64), [1.0, 1.0], ValueError, "never written"),
    ]:
        with pytest.raises(exc, match=msg):
            rb.update_priorities(idx, prio)
        assert state(rb) == before, (idx, prio)
    for beta in ("0.5", True, None):
        with pytest.raises(TypeError, match="beta must be a real number"):
            rb.sample(4, beta=beta)
    for alpha in ("0.5", False):
        with pytest.raises(TypeError, match="alpha must be a real number"):
            PrioritizedReplayBuffer(8, alpha=alpha)
    for beta in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="beta"):
            rb.sample(4, beta=beta)
        assert state(rb) == before
    with pytest.raises(ValueError, match="batch_size"):
        rb.sample(0)
    assert state(rb) == before
    rb.update_priorities(np.array([[1], [2]]), np.array([[2.0], [3.0]]))  # any shape, one size
    assert rb.priorities([1, 2]).tolist() == [2.0, 3.0]
    rb2 = make(impl, 8, alpha=2.0)
    add(rb2, Model(8, 1, 2.0))
    before = state(rb2)
    for p in (1e200, 1e-200):  # p ** alpha overflows or underflows
        with pytest.raises(ValueError, match=r"priority \*\* alpha"):
            rb2.update_priorities([0], [p])
        assert state(rb2) == before


def test_update_callback_that_moves_the_window(impl):
    """An __array__ that adds or clears runs before the stored numbers are read."""
    rb = make(impl, 4, seed=0)
    model = Model(4, 1, 0.6)
    for _ in range(4):
        add(rb, model)

    class Calls:
        def __init__(self, value, call):
            self.value, self.call = value, call

        def __array__(self, dtype=None, copy=None):
            self.call()
            return np.asarray(self.value)

    # number 0 is stored when the call starts; the add evicts it (number 4 takes its place)
    with pytest.raises(ValueError, match="evicted"):
        rb.update_priorities(Calls([0], lambda: add(rb, model)), [50.0])
    assert rb.priorities([4]).tolist() == [1.0] and rb.max_priority == 1.0
    with pytest.raises(ValueError, match="holds no transition"):
        rb.update_priorities([1, 2], Calls([5.0, 5.0], rb.clear))
    assert rb.max_priority == 1.0


_RACE = """
import threading, time
import numpy as np
import lazyframes

n, m = 1 << 10, 1 << 20
tree = lazyframes._impl.SumTree(n)
good, bad = np.full(m, 5, np.int64), np.full(m, -(1 << 40), np.int64)
idx, ones, raw = good.copy(), np.ones(m), np.zeros(n)
stop = []


def flip():  # another thread writes the caller's indices while the tree uses them
    while not stop:
        np.copyto(idx, bad)
        np.copyto(idx, good)


th = threading.Thread(target=flip)
th.start()
end = time.monotonic() + 2.0
while time.monotonic() < end:
    for call in (
        lambda: tree.set(idx, ones),
        lambda: tree.update_priorities(idx, ones, 1.0, 0, 1 << 50, raw),
    ):
        try:
            call()
        except ValueError:
            pass
stop.append(1)
th.join()
assert tree.get(np.arange(n)).sum() in (0.0, 1.0) and raw[6:].sum() == raw[:5].sum() == 0
print("raced")
"""


def test_indices_written_by_another_thread_mid_call():
    """The tree checks private copies: a racing writer cannot slip an index past the check.

    Before, ``set`` used the caller's int64 array as it was: checked, then written
    without the GIL, while another thread could change it (a write out of the tree).
    """
    r = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", _RACE],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 0 and "raced" in r.stdout, r.stdout + r.stderr


def test_exported():
    assert lazyframes.PrioritizedReplayBuffer is PrioritizedReplayBuffer
    rb = PrioritizedReplayBuffer(10, alpha=0.5)
    assert repr(rb).startswith("PrioritizedReplayBuffer(") and "alpha=0.5" in repr(rb)


def test_dict_observations(impl):
    """Image + vector observations: the sampled leaves are those of the drawn transitions."""
    pool = impl.FramePool((6, 5), np.uint8)
    rb = PrioritizedReplayBuffer(32, n_step=2, seed=5, pool={"image": pool}, compress=True)
    frames = np.arange(60 * 30, dtype=np.uint8).reshape(60, 6, 5)
    for t in range(40):
        obs = {"image": frames[t : t + 4], "vec": np.full(3, t, np.float32)}
        nxt = {"image": frames[t + 1 : t + 5], "vec": np.full(3, t + 1, np.float32)}
        rb.add(obs, t, 0.0, nxt, t % 9 == 8, False)
    b = rb.sample(16, beta=0.5)
    t = b.indices  # transition numbers: the t of each add above
    np.testing.assert_array_equal(b.actions, t)
    np.testing.assert_array_equal(b.observations["vec"][:, 0], t)
    np.testing.assert_array_equal(b.observations["image"], frames[t[:, None] + np.arange(4)])
    m = np.where(t % 9 == 8, 1, 2)  # a window stops at its episode's end
    np.testing.assert_array_equal(b.next_observations["vec"][:, 0], t + m)
    rb.update_priorities(b.indices, np.arange(16) + 1.0)
    given = dict(zip(b.indices.tolist(), np.arange(16) + 1.0, strict=True))  # the last one wins
    assert rb.priorities(np.array(list(given))).tolist() == list(given.values())
