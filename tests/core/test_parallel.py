"""A large copy out split across threads (csrc/parallel.c, ``_copy`` in csrc/_copyout.pxi).

Values only, never timings: every thread count gives the bytes one thread gives, and
those of a NumPy restatement; the split really happens (the core counts the parts it
runs); a forked child makes its own workers; bad input raises before anything is written.
"""

import os
import threading

import numpy as np
import pytest
from conftest import make_pool, recorded, refused, run

import lazyframes
from lazyframes import ReplayBuffer
from lazyframes import _core as core

K = 4
BATCHES = (1, 2, 5, 37, 200, 600)  # 1 and 2: one part, the GIL held; 5: one part, without
FS = (84, 84)


@pytest.fixture(autouse=True)
def _threads():
    """Each test starts with the default and leaves it as it was."""
    before = lazyframes.get_num_threads()
    yield
    lazyframes.set_num_threads(before)


def parts(fn, *args, **kw):
    """``fn``'s result and the parts its copies ran in (the core's counter)."""
    before = core._parallel_tasks()[0]
    res = fn(*args, **kw)
    return res, core._parallel_tasks()[0] - before


def with_threads(n, fn, *args, **kw):
    lazyframes.set_num_threads(n)
    return fn(*args, **kw)


# -- the setting -----------------------------------------------------------------------
def test_the_default_is_the_cpus_of_the_process():
    code = "import lazyframes; print(lazyframes.get_num_threads())"
    want = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    res = run("-c", f"import os; os.environ.pop('LAZYFRAMES_NUM_THREADS', None); {code}")
    assert res.returncode == 0, res.stderr
    assert int(res.stdout) == min(want, 64)


@pytest.mark.parametrize("value, want", [("3", 3), (" 1 ", 1), ("64", 64)])
def test_the_environment_variable_sets_it_at_import(value, want):
    res = run(
        "-c",
        f"""
import os
os.environ["LAZYFRAMES_NUM_THREADS"] = {value!r}
import lazyframes
print(lazyframes.get_num_threads())
""",
    )
    assert res.returncode == 0, res.stderr
    assert int(res.stdout) == want


@pytest.mark.parametrize("value", ["0", "65", "two", "1.5", "-1"])
def test_a_bad_environment_variable_fails_the_import_naming_it(value):
    res = run(
        "-c",
        f"""
import os
os.environ["LAZYFRAMES_NUM_THREADS"] = {value!r}
import lazyframes
""",
    )
    assert res.returncode != 0
    assert "LAZYFRAMES_NUM_THREADS must be an integer in [1, 64]" in res.stderr, res.stderr


def test_set_and_get():
    for n in (1, 2, 7, 64, np.int64(3)):
        lazyframes.set_num_threads(n)
        assert lazyframes.get_num_threads() == n
        assert type(lazyframes.get_num_threads()) is int
    assert lazyframes.set_num_threads is core.set_num_threads
    for bad in (0, -1, 65, 2**70):
        refused(ValueError, r"n must be in \[1, 64\]", lazyframes.set_num_threads, bad)
    for bad in (True, 1.0, "2", None):
        refused(TypeError, "n must be an int", lazyframes.set_num_threads, bad)
    assert lazyframes.get_num_threads() == 3  # the refused calls changed nothing


# -- values: every thread count, the bytes of one ----------------------------------------
def _frames_pool(n_frames, seed=0):
    pool = make_pool(FS)
    frames = np.random.default_rng(seed).integers(0, 256, (n_frames, *FS), dtype=np.uint8)
    refs = [pool.push(fr) for fr in frames]
    return pool, frames, refs


@pytest.mark.parametrize("layout", ["last", "first", "stack"])
def test_pool_gather_is_the_same_in_any_thread_count(layout):
    shape = {"last": (84, 84, 1), "first": (1, 84, 84), "stack": FS}[layout]
    pool = make_pool(shape)
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 256, (300, *shape), dtype=np.uint8)
    refs = [pool.push(fr) for fr in frames]
    ids = np.array([r.slot for r in refs])
    for b in BATCHES:
        pick = rng.integers(0, len(frames), (b, K))
        stacked = frames[pick]  # (b, K, *shape)
        if layout == "stack":
            want = stacked
        else:  # frame j of each row, concatenated on the channel axis
            axis = -1 if layout == "last" else 1
            want = np.concatenate([stacked[:, j] for j in range(K)], axis=axis)
        for dtype, scale in [(None, None), (np.float32, 1 / 255), (np.float64, 0.5)]:
            if b == 600 and dtype is np.float64:
                continue  # 130 MB: the float32 case covers the conversion at that size
            expect = want if dtype is None else want.astype(dtype) * dtype(scale)
            got = [
                with_threads(n, pool.gather, ids[pick], layout=layout, dtype=dtype, scale=scale)
                for n in (1, 2, 3)
            ]
            for g in got:
                assert g.dtype == expect.dtype
                np.testing.assert_array_equal(g, expect)
    del refs


def _pong_buffer(layout, compress, n=150):
    frames, _ = recorded("pong")
    frames = frames[: n + K]
    shape = {"last": (84, 84, 1), "first": (1, 84, 84), "stack": FS}[layout]
    fr = frames.reshape(-1, *shape)

    def obs(t):
        s = fr[t : t + K]
        if layout == "last":
            return np.concatenate(list(s), axis=-1)
        if layout == "first":
            return np.concatenate(list(s), axis=0)
        return s

    rb = ReplayBuffer(n, seed=0, layout=layout, stack_size=K, compress=compress)
    for t in range(n):
        rb.add(obs(t), t % 6, 1.0, obs(t + 1), False, False)
    rb.flush()
    return rb, np.stack([obs(t) for t in range(n + 1)])


@pytest.mark.parametrize("compress", [False, True], ids=["raw", "compressed"])
@pytest.mark.parametrize("layout", ["last", "first", "stack"])
def test_replay_gather_is_the_same_in_any_thread_count(layout, compress):
    rb, obs = _pong_buffer(layout, compress)
    assert (rb.memory()["cold_frames"] == rb.memory()["unique_frames"]) == compress
    rng = np.random.default_rng(2)
    for b in BATCHES:
        idx = rng.integers(0, len(rb), b)
        for dtype, scale in [(None, None), (np.float32, 1 / 255)]:
            want_o = obs[idx] if dtype is None else obs[idx].astype(dtype) * dtype(scale)
            want_n = obs[idx + 1] if dtype is None else obs[idx + 1].astype(dtype) * dtype(scale)
            for n in (1, 2, 3):
                s = with_threads(n, rb.gather, idx, dtype=dtype, scale=scale)
                np.testing.assert_array_equal(s.observations, want_o)
                np.testing.assert_array_equal(s.next_observations, want_n)


def test_a_compressed_pool_decodes_frames_that_parts_share():
    """Rows in different parts read the same frames (consecutive windows, repeated rows)."""
    rb, obs = _pong_buffer("stack", True)
    idx = np.repeat(np.arange(len(rb)), 4)[::-1].copy()  # every row 4 times, newest first
    for n in (1, 2, 5, 64):
        s, used = parts(with_threads, n, rb.gather, idx)
        np.testing.assert_array_equal(s.observations, obs[idx])
        np.testing.assert_array_equal(s.next_observations, obs[idx + 1])
        assert used == n if n < 32 else 2 <= used <= n  # 600 rows: 34 MB, 32 parts at least


# -- the split happens -----------------------------------------------------------------
def test_decoding_counts_as_work():
    """Compressed frames split a batch that raw frames of the same size do not."""
    lazyframes.set_num_threads(4)
    idx = np.arange(20)  # 20 rows: 1.1 MB of output, under two parts' worth
    assert 20 * 2 * K * 84 * 84 < 2 * core._PART_BYTES
    for compress in (False, True):
        rb, obs = _pong_buffer("stack", compress)
        s, used = parts(rb.gather, idx)
        np.testing.assert_array_equal(s.observations, obs[idx])
        np.testing.assert_array_equal(s.next_observations, obs[idx + 1])
        assert (used > 1) == compress, used


def test_a_large_copy_runs_in_as_many_parts_as_threads():
    pool, frames, refs = _frames_pool(64)
    ids = np.array([r.slot for r in refs])
    pick = np.random.default_rng(3).integers(0, 64, (300, K))
    big = ids[pick]  # 8.5 MB of output
    assert big.shape[0] * K * 84 * 84 >= 4 * core._PART_BYTES
    for n in (1, 2, 3, 4):
        out, used = parts(with_threads, n, pool.gather, big, layout="stack")
        assert used == n
        np.testing.assert_array_equal(out, frames[pick])
    # one part below twice the part size, rows of 28,224 bytes
    lazyframes.set_num_threads(4)
    rows = -(-2 * core._PART_BYTES // (K * 84 * 84))  # the fewest rows that make 2 parts
    assert parts(pool.gather, big[: rows - 1], layout="stack")[1] == 1
    assert parts(pool.gather, big[:rows], layout="stack")[1] == 2
    assert parts(pool.gather, big[:1], layout="stack")[1] == 1  # the GIL held
    lazyframes.set_num_threads(2)
    _, used = parts(core._memcpy_gather, pool, big, np.empty(big.size * 84 * 84, np.uint8))
    assert used == 2  # the benchmarks' floor splits as the gathers do
    del refs


def test_calls_from_several_threads_at_once():
    """One call holds the workers, the others copy alone: every result is exact."""
    pool, frames, refs = _frames_pool(64, seed=4)
    ids = np.array([r.slot for r in refs])
    lazyframes.set_num_threads(2)
    rng = np.random.default_rng(5)
    picks = [rng.integers(0, 64, (100, K)) for _ in range(3)]
    bad = []

    def work(pick):
        for _ in range(20):
            out = pool.gather(ids[pick], layout="stack", dtype=np.float32)
            if not np.array_equal(out, frames[pick].astype(np.float32)):
                bad.append(1)

    threads = [threading.Thread(target=work, args=(p,)) for p in picks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad
    del refs


# -- errors: raised before anything is written --------------------------------------------
def test_a_freed_id_in_a_large_split_copy_writes_nothing():
    pool, frames, refs = _frames_pool(64, seed=6)
    ids = np.array([r.slot for r in refs])
    pick = ids[np.random.default_rng(7).integers(0, 64, (300, K))]
    gone = pool.push(frames[0])
    freed = gone.slot
    del gone
    pick[-1, -1] = freed  # the last frame of the last part
    out = np.full((300, K, *FS), 7, np.uint8)
    lazyframes.set_num_threads(4)
    before = core._parallel_tasks()[0]
    refused(ValueError, "free", pool.gather, pick, out, layout="stack")
    assert core._parallel_tasks()[0] == before  # no part ran
    assert (out == 7).all()
    del refs


# -- fork ------------------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_makes_its_own_workers():
    """A child gathers with workers of its own: its parent's threads are not in it.

    Then parent and child exit without hanging, their workers asleep.
    """
    code = """
import multiprocessing as mp
import numpy as np
import lazyframes
from lazyframes import _core as core

pool = core.FramePool((84, 84), np.uint8)
frames = np.random.default_rng(0).integers(0, 256, (64, 84, 84), dtype=np.uint8)
refs = [pool.push(f) for f in frames]
ids = np.array([r.slot for r in refs])
pick = np.random.default_rng(1).integers(0, 64, (300, 4))
lazyframes.set_num_threads(2)

def gather_checked():
    before = core._parallel_tasks()
    out = pool.gather(ids[pick], layout="stack")
    after = core._parallel_tasks()
    return bool(np.array_equal(out, frames[pick])), after[0] - before[0]

for _ in range(5):
    assert gather_checked() == (True, 2)

def child(q):
    q.put([gather_checked() for _ in range(5)])

ctx = mp.get_context("fork")
q = ctx.Queue()
p = ctx.Process(target=child, args=(q,))
p.start()
got = q.get(timeout=120)
p.join(120)
assert p.exitcode == 0, p.exitcode
assert got == [(True, 2)] * 5, got
assert gather_checked() == (True, 2)  # the parent's workers still work
print("done")
"""
    res = run("-W", "ignore::DeprecationWarning", "-c", code, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "done" and res.stderr == ""
