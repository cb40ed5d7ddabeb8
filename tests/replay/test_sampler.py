"""ReplayBuffer.sampler: batches drawn ahead by the buffer's thread, copied out by the sampler's."""

import contextlib
import copy
import gc
import itertools
import os
import threading
import time
import traceback
import weakref

import numpy as np
import pytest
from conftest import assert_same_samples, refused, run

from lazyframes import FramePool, PrioritizedReplayBuffer, ReplayBuffer
from lazyframes.replay import Sampler, _samples

FS = (84, 84)  # large enough that a batch's copy releases the GIL


def frame(t):
    """Frame ``t``: its number in its first 8 bytes, then a pattern that drifts with it."""
    f = ((np.arange(FS[0] * FS[1]) * 7 + t // 16) % 251).astype(np.uint8)
    f[:8] = np.frombuffer(np.int64(t).tobytes(), np.uint8)
    f[8 + (t * 13) % 1000] = t % 256  # a small change from frame t - 1: a patch
    return f.reshape(FS)


FRAMES = np.stack([frame(t) for t in range(4000)])


def add(rb, t, **kw):
    """Transition ``t`` of one stream: frames ``t .. t + 3``, then ``t + 1 .. t + 4``."""
    rb.add(FRAMES[t : t + 4], t, float(t % 1000), FRAMES[t + 1 : t + 5], False, False, **kw)


def filled(kind="plain", steps=60, cls=ReplayBuffer, **kw):
    """A buffer of ``steps`` transitions of one of several kinds; two made alike are equal."""
    if kind == "streams":  # two streams, 3-step windows, episodes that end
        rb = cls(100, num_envs=2, n_step=3, gamma=0.9, seed=5, **kw)
        for t in range(steps // 2):
            rb.add(FRAMES[[t, t + 1]][:, None].repeat(4, 1), [t, t + 1], [1.0, 2.0],
                   FRAMES[[t + 1, t + 2]][:, None].repeat(4, 1), [t % 7 == 6, False],
                   [False, t % 11 == 10])  # fmt: skip
        return rb
    if kind == "dict":  # a frame leaf and a vector leaf
        rb = cls(100, seed=5, frame_keys=["image"], **kw)
        for t in range(steps):
            obs = {"image": FRAMES[t : t + 4], "vec": np.full(3, t, np.float32)}
            nxt = {"image": FRAMES[t + 1 : t + 5], "vec": np.full(3, t + 1, np.float32)}
            rb.add(obs, t, 1.0, nxt, False, False)
        return rb
    rb = cls(100, seed=5, compress=kind == "compressed", **kw)
    for t in range(steps):
        add(rb, t)
    return rb


#: A Samples whose arrays are copies (a sampler's and sample's observations are reused).
copied = copy.deepcopy


def sampler_threads():  # a sampler's one thread (draws and copies)
    return [t for t in threading.enumerate() if t.name == "lazyframes-sampler"]


@pytest.fixture(autouse=True)
def _no_thread_left():
    """Every test stops the threads it started (a buffer has none of its own)."""
    yield
    gc.collect()  # a sampler in a reference cycle stops when collected
    assert sampler_threads() == []


# -- the batches of sample() --------------------------------------------------------------
@pytest.mark.parametrize("kind", ["plain", "compressed", "streams", "dict"])  # prioritized: below
@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_the_batches_of_successive_samples(kind, prefetch):
    a, b = filled(kind), filled(kind)
    opts = {"dtype": np.float32, "scale": 1 / 255} if kind != "dict" else {}
    with a.sampler(7, prefetch=prefetch, **opts) as batches:
        got = [copied(s) for _, s in zip(range(10), batches, strict=False)]
        assert batches.prefetch == prefetch
    want = [copied(b.sample(7, **opts)) for _ in range(10)]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_same_samples(g, w, f"batch {i}")
    # the sampler drew `prefetch` batches more: the RNG is where as many samples leave it
    for _ in range(prefetch):
        b.sample(7, **opts)
    assert_same_samples(a.sample(3, **opts), b.sample(3, **opts), "after")


def test_a_batch_is_valid_for_prefetch_plus_one_calls_then_its_set_is_reused():
    rb, P = filled(), 2
    batches = rb.sampler(5, prefetch=P)
    seen = []
    for j in range(8):
        s = next(batches)
        keep = copied(s)
        for t in range(60 + 3 * j, 63 + 3 * j):  # adds evict nothing here; the thread copies
            add(rb, t)
        time.sleep(0.01)
        check_batch(s, j)
        seen.append((s, keep))
        for i, (old, kept) in enumerate(seen[-P - 1 :]):  # the last P + 1 batches: intact
            assert_same_samples(old, kept, f"batch {len(seen) - P - 1 + i} changed")
    seen = [s for s, _ in seen]
    for field in ("observations", "next_observations"):  # 2P + 1 sets of arrays, in turn
        ids = [id(getattr(s, field)) for s in seen]
        assert ids == [ids[j % (2 * P + 1)] for j in range(len(ids))] and len(set(ids)) == 2 * P + 1
    assert not any(np.shares_memory(a.observations, b.next_observations) for a, b in
                   itertools.pairwise(seen))  # fmt: skip
    assert all(s.actions is not t.actions for s, t in itertools.pairwise(seen))  # fresh
    out = rb.sample(5)  # sample's own arrays: not a sampler's
    assert not any(np.shares_memory(out.observations, s.observations) for s in seen[-2 * P - 1 :])
    batches.close()


def test_out_sets_are_filled_in_turn_and_checked():
    rb, P, f32 = filled(), 1, np.float32
    sets = [(np.empty((5, 4, *FS), f32), np.empty((5, 4, *FS), f32)) for _ in range(3)]
    with rb.sampler(5, prefetch=P, dtype=f32, out=sets) as a, filled().sampler(5, dtype=f32) as b:
        for j in range(5):  # batch j in sets[j % 3], the values of a sampler without out
            s = next(a)
            assert s.observations is sets[j % 3][0] and s.next_observations is sets[j % 3][1]
            assert_same_samples(s, next(b), f"batch {j}")
    refused(TypeError, r"2 \* prefetch \+ 1 = 3", rb.sampler, 5, prefetch=P, out=sets[:2])
    refused(ValueError, "overlap", rb.sampler, 5, prefetch=P, out=[sets[0], sets[1], sets[0]])
    refused(TypeError, "dtype", rb.sampler, 5, prefetch=P, out=sets, dtype=np.uint8)


# -- adds while the thread copies ---------------------------------------------------------
def check_batch(s, j):
    """Every frame of batch ``j`` is the frame its transition stored (``add``), whole."""
    t = s.actions
    assert t.min() >= 0, j
    assert np.array_equal(s.rewards, (t % 1000).astype(np.float32)), j
    k = np.arange(4)
    obs, nxt = s.observations, s.next_observations
    for i in range(len(t)):
        if not (np.array_equal(obs[i], FRAMES[t[i] + k])
                and np.array_equal(nxt[i], FRAMES[t[i] + 1 + k])):  # fmt: skip
            got = obs[i].reshape(4, -1)[:, :8].copy().view(np.int64).ravel().tolist()
            raise AssertionError(f"batch {j} row {i}: transition {t[i]}, frames {got}")


@pytest.mark.parametrize("compress", [False, True], ids=["raw", "compressed"])
@pytest.mark.parametrize("prefetch", [1, 3])
def test_adds_while_the_thread_copies_never_tear_a_frame(compress, prefetch):
    """Adds evict, grow chunks, compress, flush while the thread copies: each batch one draw."""
    rb = ReplayBuffer(300, seed=1, compress=compress)
    t = 0
    for t in range(40):
        add(rb, t)
    t += 1
    with rb.sampler(32, prefetch=prefetch, dtype=np.uint8) as batches:
        for j in range(150):
            s = next(batches)
            for _ in range(5):  # the buffer wraps after ~50 batches: evictions from then on
                add(rb, t)
                t += 1
            if j % 17 == 0:
                rb.flush()
            check_batch(s, j)
            newest = 39 + 5 * max(j - prefetch, 0)  # at its draw, `prefetch` calls ago
            assert newest - 299 <= s.actions.min() and s.actions.max() <= newest, j
    assert rb.memory()["transitions"] == 300
    if compress:
        assert rb.memory()["cold_frames"] > 0
    del batches, s
    rb.clear()
    assert rb.pool.live_frames == 0


def test_adds_from_lazyframes_of_a_wrapper_pool_while_copying():
    """The buffer shares the wrapper's pool: the ring's frames stay hot, the rest evicted."""
    pool = FramePool(FS, np.uint8)
    rb = ReplayBuffer(200, seed=2)
    ring = [pool.push(FRAMES[j]) for j in range(4)]
    for t in range(600):
        new = pool.push(FRAMES[t + 4])
        rb.add(pool.lazy(ring, layout="stack"), t, float(t), pool.lazy(ring[1:] + [new],
               layout="stack"), False, False)  # fmt: skip
        ring = ring[1:] + [new]
        if t == 30:
            batches = rb.sampler(16, prefetch=2)
        if t > 30 and t % 3 == 0:
            check_batch(next(batches), t)
    batches.close()


def test_a_draw_is_made_where_the_caller_asked_for_it(monkeypatch):
    """An add waits for the draw next() asked for, not for a copy: it sees the buffer of then."""
    rb = filled()
    seen, pick, fill, go, calls = [], rb._pick, _samples.fill, threading.Event(), itertools.count()

    def slow_pick(batch_size, options):  # the drawing thread's draw, slowed down
        time.sleep(0.05)
        seen.append(len(rb))
        return pick(batch_size, options)

    rb._pick = slow_pick  # and the copy of batch 1 held until the first add has returned
    monkeypatch.setattr(_samples, "fill", lambda *a: (next(calls) != 1 or go.wait(30)) and fill(*a))
    with rb.sampler(4, prefetch=2) as batches:
        for t in range(60, 64):
            assert next(batches).actions.size == 4  # batch 1 too: its copy did not time out
            add(rb, t)  # waits for the draw asked for above (batch 1 may still be copying)
            go.set()
            assert seen[-1] == t, seen  # which saw the buffer without transition t
    assert seen == [60, 60, 60, 61, 62, 63]  # at creation, then one per next()


def test_an_interrupt_in_a_draw_the_caller_makes_loses_no_batch(monkeypatch):
    """A KeyboardInterrupt while an add makes an owed draw (the thread busy copying).

    It is raised by the add, before anything is written; the draw stays owed, and the
    next call makes it: the sampler's batches go on, none lost, none twice.
    """
    rb = filled()
    fill, go, copies = _samples.fill, threading.Event(), [0]

    def held(*args):  # the sampler's second copy waits for go
        copies[0] += 1
        return (copies[0] != 2 or go.wait(30)) and fill(*args)

    def interrupted(*args):  # the draw made (the RNG moved on), then the interrupt
        pick(*args)
        raise KeyboardInterrupt

    monkeypatch.setattr(_samples, "fill", held)
    pick = rb._pick
    with rb.sampler(4, prefetch=2) as batches:  # batches 0 and 1 drawn; 1's copy held
        assert next(batches).actions.size == 4  # batch 0; batch 2 owed
        assert len(rb._draws.owed) == 1
        n = len(rb)
        rb._pick = interrupted
        refused(KeyboardInterrupt, "", add, rb, n)
        assert len(rb._draws.owed) == 1 and len(rb) == n  # still owed, nothing written
        rb._pick = pick
        add(rb, n)  # made now
        assert not rb._draws.owed and len(rb) == n + 1
        go.set()
        for _ in range(3):  # batches 1, 2 and 3
            assert next(batches).actions.size == 4


def test_a_collection_inside_a_draw_closes_a_sampler_without_a_hang():
    """A draw that collects a sampler in a reference cycle, whose thread waits to draw.

    The draw holds the gate's settling lock; the collected sampler's close() joins its
    thread, which gives up waiting for that lock once closed. In the caller's draw and
    in another sampler's thread's.
    """
    code = """if 1:
        import gc, sys, threading
        import numpy as np
        from lazyframes import ReplayBuffer
        where = sys.argv[1]
        frames = np.random.default_rng(0).integers(0, 255, (400, 84, 84), np.uint8)
        rb = ReplayBuffer(1000, seed=0, compress=True)
        for t in range(300):
            rb.add(frames[t:t + 4], t, 1.0, frames[t + 1:t + 5], False, False)
        pick, armed, collected = rb._pick, [False], []

        def collecting(*args):
            if armed[0] and (threading.current_thread() is threading.main_thread()) == (
                    where == "caller"):
                armed[0] = False
                collected.append(gc.collect())
            return pick(*args)

        rb._pick = collecting
        for t in range(5):
            s = rb.sampler(128, prefetch=4)  # its thread behind with copies for a while
            s.me = s  # a reference cycle
            next(s), next(s)  # the draws of batches 4 and 5 owed
            del s
            armed[0] = True
            if where == "thread":  # another sampler's thread makes them, if first
                other = rb.sampler(8, prefetch=1)
                next(other), next(other)
                other.close()
            rb.add(frames[t:t + 4], t, 1.0, frames[t + 1:t + 5], False, False)
        assert collected and len(rb) == 305, (collected, len(rb))
        print("ok")
    """
    for where in ("caller", "thread"):
        r = run("-c", code, where, timeout=120)
        assert r.returncode == 0 and r.stdout.strip() == "ok", where + r.stdout + r.stderr


def test_two_samplers_of_a_buffer_draw_in_the_order_asked():
    """A draw slower than the next one asked (another sampler's) still comes first."""
    a, b = filled(), filled()
    pick, calls = a._pick, itertools.count()
    a._pick = lambda *args: (next(calls) != 2 or time.sleep(0.2) is None) and pick(*args)
    with a.sampler(4, prefetch=1) as s1, a.sampler(4, prefetch=1) as s2:  # draws 0 and 1
        got = [copied(next(s)) for s in (s1, s2, s1, s2)]  # asks 2 (slow), 3, 4, 5
    assert [g.indices.tolist() for g in got] == [b.sample(4).indices.tolist() for _ in range(4)]


# -- priorities ---------------------------------------------------------------------------
@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_priorities_are_those_of_the_draw(prefetch):
    """Batch j + prefetch is drawn when batch j is returned: a twin's ``sample`` calls match."""
    a, b = (filled(cls=PrioritizedReplayBuffer, steps=80) for _ in range(2))
    rng = np.random.default_rng(0)
    drawn = [copied(b.sample(8, beta=0.7)) for _ in range(prefetch)]
    with a.sampler(8, beta=0.7, prefetch=prefetch) as batches:
        for j in range(25):
            s = copied(next(batches))
            drawn.append(copied(b.sample(8, beta=0.7)))
            assert_same_samples(s, drawn[j], f"batch {j}")
            td = rng.uniform(0.01, 10.0, 8)
            for rb in (a, b):  # skewed priorities: a draw that used other ones would differ
                rb.update_priorities(s.indices, td**3, skip_evicted=True)
            add(a, 80 + j)
            add(b, 80 + j)


def test_update_priorities_skips_evicted_transitions_when_asked():
    rb = filled(cls=PrioritizedReplayBuffer, steps=100)  # capacity 100: numbers 0 .. 99
    with rb.sampler(16, prefetch=2) as batches:
        s = next(batches)
        for t in range(100, 120):  # numbers 0 .. 19 evicted
            add(rb, t)
        idx = np.concatenate([s.indices, [3, 150, 119]])[:-1]  # 3 evicted, 150 never written
        with pytest.raises(ValueError, match="never written"):
            rb.update_priorities(idx, np.ones(idx.size), skip_evicted=True)
        idx = np.array([3, 50, 119, 4])
        refused(ValueError, "evicted", rb.update_priorities, idx, [1.0, 2.0, 3.0, 4.0])
        with pytest.raises(ValueError, match=r"priorities\[0\]"):  # an evicted one: checked
            rb.update_priorities(idx, [np.nan, 2.0, 3.0, 4.0], skip_evicted=True)
        assert rb.priorities([50, 119]).tolist() == [1.0, 1.0]
        rb.update_priorities(idx, [99.0, 2.0, 3.0, 4.0], skip_evicted=True)
        assert rb.priorities([50, 119]).tolist() == [2.0, 3.0]
        assert rb.max_priority == 3.0  # the evicted transition's priority was left out
        rb.update_priorities(s.indices, np.full(16, 0.5), skip_evicted=True)
        assert next(batches).weights.dtype == np.float32


# -- arguments ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, kwargs, exc, match",
    [
        ((0,), {}, ValueError, "batch_size must be at least 1"),
        ((4,), {"prefetch": -1}, ValueError, "prefetch must be at least 0"),
        ((4,), {"prefetch": 1.5}, TypeError, "integer"),
        ((4.0,), {}, TypeError, "integer"),
        ((4,), {"dtype": np.complex64}, TypeError, "complex64"),
        ((4,), {"scale": 0.5}, TypeError, "scale needs a float"),
        ((4,), {"beta": 1.5}, ValueError, "beta"),
        ((4, 2), {}, TypeError, "positional"),
    ],
)  # fmt: skip
def test_bad_arguments_start_nothing(args, kwargs, exc, match):
    cls = PrioritizedReplayBuffer if "beta" in kwargs else ReplayBuffer
    rb, twin = filled(cls=cls), filled(cls=cls)
    refused(exc, match, rb.sampler, *args, **kwargs)
    assert sampler_threads() == []
    assert_same_samples(rb.sample(4), twin.sample(4))  # nothing drawn


def test_empty_or_unsampleable_buffers_are_refused():
    refused(ValueError, "empty", ReplayBuffer(10).sampler, 4)
    rb = ReplayBuffer(10, n_step=3, seed=0)
    add(rb, 0)  # its 3-step window is open
    refused(ValueError, "no transition can be sampled yet", rb.sampler, 4)
    refused(ValueError, "sampled yet", next, rb.sampler(4, prefetch=0))  # raised, then dropped:
    assert sampler_threads() == []  # its threads went with it (neither keeps the error)
    with rb.sampler(4, prefetch=0) as batches:  # no draw before the first next()
        refused(ValueError, "no transition can be sampled yet", next, batches)
        add(rb, 1), add(rb, 2)
        assert next(batches).actions.tolist() == [0, 0, 0, 0]  # it works once one can


# -- stopping -----------------------------------------------------------------------------
def test_close_with_and_clear_stop_the_thread():
    rb = filled()
    threads = threading.active_count()
    s = rb.sampler(4)
    assert isinstance(s, Sampler) and iter(s) is s and not s.closed
    assert len(sampler_threads()) == 1 and threading.active_count() == threads + 1
    assert "prefetch=2" in repr(s)
    kept = copied(batch := next(s))
    s.close()
    s.close()  # idempotent
    assert s.closed and sampler_threads() == [] and "closed" in repr(s)
    refused(StopIteration, "", next, s)
    assert_same_samples(batch, kept)  # a batch returned before close stays valid
    with rb.sampler(4) as s2:
        next(s2)
    assert s2.closed and sampler_threads() == []
    s3, s4 = rb.sampler(4), rb.sampler(4, prefetch=0)
    for _ in zip(range(3), s3, strict=False):
        pass
    rb.clear()
    assert s3.closed and s4.closed and sampler_threads() == []
    assert list(s3) == []
    add(rb, 0)
    assert next(rb.sampler(2)).actions.tolist() == [0, 0]  # the buffer samples on


def _threads_end(timeout=30):
    """Whether every sampler thread ends within ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while sampler_threads() and time.monotonic() < end:
        time.sleep(0.01)
    return sampler_threads() == []


def test_a_close_in_the_samplers_own_thread_ends_it(monkeypatch):
    """As a garbage collection in the sampler's thread closes it (a reference cycle)."""
    rb, box = filled(), []
    fill = _samples.fill

    def closing(*args):
        if box:
            box.pop().close()
        return fill(*args)

    monkeypatch.setattr(_samples, "fill", closing)
    s = rb.sampler(4, prefetch=0)  # nothing copied before next()
    box.append(s)
    with contextlib.suppress(StopIteration):
        next(s)
    assert s.closed and _threads_end()


def test_an_interrupted_start_leaves_no_thread(monkeypatch):
    rb, start = filled(), threading.Thread.start

    def started_then_interrupted(thread):
        start(thread)
        raise KeyboardInterrupt

    monkeypatch.setattr(threading.Thread, "start", started_then_interrupted)
    refused(KeyboardInterrupt, "", rb.sampler, 4)
    monkeypatch.undo()
    gc.collect()  # the sampler made, then dropped: closed
    assert _threads_end() and next(rb.sampler(4)).actions.size == 4


def test_a_dropped_sampler_stops_its_thread_and_releases_its_frames(monkeypatch):
    rb = filled(kind="compressed")
    rb.flush()  # every frame compressed now: a draw's flush then codes no new delta
    ids = np.unique(rb._stores[0].frame_ids(len(rb)))
    before = [rb.pool.refcount(int(i)) for i in ids]
    fill, go = _samples.fill, threading.Event()
    monkeypatch.setattr(_samples, "fill", lambda *a: go.wait() and fill(*a))
    s = rb.sampler(16, prefetch=4)  # the thread waits in its first copy: 4 batches pinned
    assert [rb.pool.refcount(int(i)) for i in ids] != before  # the batches drawn ahead
    go.set()
    next(s)
    ref = weakref.ref(s)
    del s  # no reference from the thread: the sampler goes now
    assert ref() is None and sampler_threads() == [] and rb.memory()  # draws asked: made
    assert [rb.pool.refcount(int(i)) for i in ids] == before  # their references dropped
    for _ in zip(range(5), rb.sampler(8), strict=False):  # a loop that stops drops it too
        pass
    assert sampler_threads() == []
    batches = [rb.sampler(2, prefetch=p) for p in range(4) for _ in range(5)]
    assert len(sampler_threads()) == 20
    del batches
    assert sampler_threads() == []


def test_close_from_another_thread_wakes_a_waiting_next(monkeypatch):
    fill = _samples.fill

    def slow(*args):
        time.sleep(0.3)
        return fill(*args)

    monkeypatch.setattr(_samples, "fill", slow)
    rb = filled()
    s = rb.sampler(4, prefetch=0)
    timer = threading.Timer(0.05, s.close)
    timer.start()
    with contextlib.suppress(StopIteration):
        next(s)  # the copy in progress ends (a batch), or close() wins (StopIteration)
    timer.join()
    assert s.closed
    refused(StopIteration, "", next, s)


def _boom_in_the_thread(*args):
    raise RuntimeError("boom")


def test_an_exception_in_the_thread_is_raised_by_next_with_its_traceback(monkeypatch):
    rb = filled()
    monkeypatch.setattr(_samples, "fill", _boom_in_the_thread)
    s = rb.sampler(4, prefetch=2)
    with pytest.raises(RuntimeError, match="boom") as info:
        next(s)
    names = [
        frame.name.rsplit(".", 1)[-1] for frame in traceback.extract_tb(info.value.__traceback__)
    ]
    assert names[-4:] == ["__next__", "_copies", "fill_set", "_boom_in_the_thread"], names
    assert s.closed and sampler_threads() == []
    refused(StopIteration, "", next, s)
    monkeypatch.undo()
    assert next(rb.sampler(4)).observations.shape == (4, 4, *FS)


@pytest.mark.parametrize(
    "how", ["global", "cycle", "iterating"] + (["fork"] if hasattr(os, "fork") else [])
)
def test_the_interpreter_exits_with_a_live_sampler(how):
    """No hang, no crash, no message: the sampler is closed at exit, whatever holds it."""
    code = f"""
import numpy as np, threading, time
from lazyframes import ReplayBuffer
rb = ReplayBuffer(500, seed=0, compress=True)
frames = np.random.default_rng(0).integers(0, 255, (300, 84, 84), dtype=np.uint8)
for t in range(290):
    rb.add(frames[t : t + 4], t, 1.0, frames[t + 1 : t + 5], False, False)
s = rb.sampler(64, prefetch=4, dtype=np.float32, scale=1 / 255)
next(s)
how = {how!r}
if how == "cycle":  # collected with its buffer, in one collection (no thread waited for)
    s.me, s.rb = s, rb
    del s, rb
    __import__("gc").collect()
elif how == "iterating":
    def learn():
        for batch in s:
            pass
    threading.Thread(target=learn, daemon=True).start()
    time.sleep(0.05)
elif how == "fork":  # the child has no sampler thread: its samplers are closed; and the
    import os, signal  # fork waited for the draw in progress: the child's RNG is not locked
    pick, drawing = rb._pick, threading.Event()
    def slow(*args):  # holds the RNG's lock a while, as a draw does for a moment
        with rb._rng.bit_generator.lock:
            drawing.set()
            time.sleep(0.3)
        return pick(*args)
    rb._pick = slow
    next(s)  # asks for a draw: the buffer's thread makes it
    drawing.wait()
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)
        try:
            next(s)
        except StopIteration:
            rb._pick = pick
            os._exit(0 if rb.sample(4).indices.size == 4 else 4)
        os._exit(3)
    assert os.waitpid(pid, 0)[1] == 0
    next(s)  # the parent's goes on
print("done")
"""
    res = run("-W", "ignore::DeprecationWarning", "-c", code, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "done" and res.stderr == ""
