"""A large copy out split across threads (csrc/parallel.c): values, parts, fork; no timings."""

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import make_pool, recorded, refused, run

import lazyframes
from lazyframes import ReplayBuffer
from lazyframes import _core as core

K = 4
BATCHES = (1, 2, 5, 37, 200, 600)  # 1 and 2: one part, the GIL held; 5: one part, without
FS = (84, 84)
SHAPES = {"last": (84, 84, 1), "first": (1, 84, 84), "stack": FS}
DTYPES = [(None, None), (np.float32, 1 / 255)]
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
BAD_ENV = "LAZYFRAMES_NUM_THREADS must be an integer in [1, 64]"


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


def stacked(windows, layout):
    """Windows ``(..., K, 84, 84)`` as ``layout`` stacks them (frames on the channel axis)."""
    return np.moveaxis(windows, -3, -1) if layout == "last" else windows


def scaled(a, dtype, scale):
    return a if dtype is None else a.astype(dtype) * dtype(scale)


def assert_rows(s, obs, idx):
    """Samples ``s`` hold rows ``idx`` of ``obs`` and their next rows (dtype too)."""
    np.testing.assert_array_equal(s.observations, obs[idx], strict=True)
    np.testing.assert_array_equal(s.next_observations, obs[idx + 1], strict=True)


# -- the setting -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, want",
    [(None, min(CPUS, 64)), ("3", 3), (" 1 ", 1), ("64", 64)]
    + [(bad, BAD_ENV) for bad in ("0", "65", "two", "1.5", "-1")],
)
def test_the_environment_variable_sets_it_at_import(value, want):
    """Unset, the default is the CPUs of the process; a bad value fails the import, naming it."""
    env = {} if value is None else {"LAZYFRAMES_NUM_THREADS": value}
    pre = f"import os; os.environ.pop('LAZYFRAMES_NUM_THREADS', None); os.environ.update({env})"
    res = run("-c", f"{pre}; import lazyframes; print(lazyframes.get_num_threads())")
    if want == BAD_ENV:
        assert res.returncode != 0 and BAD_ENV in res.stderr, res.stderr
    else:
        assert res.returncode == 0 and int(res.stdout) == want, res.stderr


def test_set_and_get():
    for n in (1, 2, 7, 64, np.int64(3)):
        lazyframes.set_num_threads(n)
        assert lazyframes.get_num_threads() == n and type(lazyframes.get_num_threads()) is int
    assert lazyframes.set_num_threads is core.set_num_threads
    for bad in (0, -1, 65, 2**70):
        refused(ValueError, r"n must be in \[1, 64\]", lazyframes.set_num_threads, bad)
    for bad in (True, 1.0, "2", None):
        refused(TypeError, "n must be an int", lazyframes.set_num_threads, bad)
    assert lazyframes.get_num_threads() == 3  # the refused calls changed nothing


# -- values: every thread count, the bytes of one ----------------------------------------
def _frames_pool(n_frames, seed=0, shape=FS):
    """A pool of ``n_frames`` random frames: the pool, frames ``(n, 84, 84)``, ids, refs."""
    pool = make_pool(shape)
    frames = np.random.default_rng(seed).integers(0, 256, (n_frames, *FS), dtype=np.uint8)
    refs = [pool.push(fr.reshape(shape)) for fr in frames]
    return pool, frames, np.array([r.slot for r in refs]), refs


@pytest.mark.parametrize("layout", list(SHAPES))
def test_pool_gather_is_the_same_in_any_thread_count(layout):
    pool, frames, ids, refs = _frames_pool(300, 1, SHAPES[layout])
    for b in BATCHES:
        pick = np.random.default_rng(b).integers(0, len(frames), (b, K))
        want = stacked(frames[pick], layout)
        floor = core._memcpy_gather(pool, ids[pick], np.empty(want.shape, np.uint8), layout=layout)
        np.testing.assert_array_equal(floor, want, strict=True)  # the bench floor, any layout
        refused(ValueError, "shape", core._memcpy_gather, pool, ids[pick], floor[1:], layout=layout)
        # 600 rows of float64 (130 MB) left out: float32 covers the conversion at that size
        for dtype, scale in [*DTYPES, (np.float64, 0.5)][: 2 if b == 600 else 3]:
            for n in (1, 2, 3):
                g = with_threads(n, pool.gather, ids[pick], layout=layout, dtype=dtype, scale=scale)
                np.testing.assert_array_equal(g, scaled(want, dtype, scale), strict=True)
    del refs


def _pong_buffer(layout, compress, n=150, frames=None):
    """A buffer of ``n`` recorded transitions, and its observations ``0..n`` stacked.

    ``frames``: other frames than Pong's (at least ``n + K``).
    """
    frames = recorded("pong")[0] if frames is None else frames
    obs = stacked(np.stack([frames[t : t + K] for t in range(n + 1)]), layout)
    rb = ReplayBuffer(n, seed=0, layout=layout, stack_size=K, compress=compress)
    for t in range(n):
        rb.add(obs[t], t % 6, 1.0, obs[t + 1], False, False)
    rb.flush()
    return rb, obs


@pytest.mark.parametrize("compress", [False, True], ids=["raw", "compressed"])
@pytest.mark.parametrize("layout", list(SHAPES))
def test_replay_gather_is_the_same_in_any_thread_count(layout, compress):
    rb, obs = _pong_buffer(layout, compress)
    assert (rb.memory()["cold_frames"] == rb.memory()["unique_frames"]) == compress
    idxs = [np.random.default_rng(b).integers(0, len(rb), b) for b in BATCHES]
    for dtype, scale in DTYPES:
        want = scaled(obs, dtype, scale)
        for idx in idxs:
            for n in (1, 2, 3):
                assert_rows(with_threads(n, rb.gather, idx, dtype=dtype, scale=scale), want, idx)


def test_a_compressed_pool_decodes_frames_that_parts_share():
    """Rows in different parts read the same frames (consecutive windows, repeated rows)."""
    rb, obs = _pong_buffer("stack", True)
    idx = np.repeat(np.arange(len(rb)), 4)[::-1].copy()  # every row 4 times, newest first
    for n in (1, 2, 5, 64):  # a split copy's parts each resolve their chains, then copy
        s, used = parts(with_threads, n, rb.gather, idx)
        assert_rows(s, obs, idx)
        assert used == (1 if n == 1 else 2 * n) if n < 32 else 4 <= used <= 2 * n  # 600 rows


# -- the split happens -----------------------------------------------------------------
def test_decoding_by_the_codec_counts_as_work():
    """Frames the codec decodes split a batch that raw frames of the same size do not.

    Nor do patches (Pong's deltas and keyframes), which decode by copies as raw frames do.
    """
    idx = np.arange(20)  # 20 rows: 1.1 MB of output, under two parts' worth
    assert 20 * 2 * K * 84 * 84 < 2 * core._PART_BYTES
    # a scrolling texture: every byte changes each step (no patch pays), the XOR with
    # the previous frame repeats (the codec's XOR deltas do)
    tile = np.random.default_rng(0).integers(0, 256, (84, 12), dtype=np.uint8)
    scroll = np.stack([np.roll(np.tile(tile, 7), t, axis=1) for t in range(150 + K)])
    for frames, compress, split in ((None, False, False), (None, True, False),
                                    (scroll, False, False), (scroll, True, True)):  # fmt: skip
        rb, obs = _pong_buffer("stack", compress, frames=frames)
        s, used = parts(with_threads, 4, rb.gather, idx)
        assert_rows(s, obs, idx)
        assert (used > 1) == split, (frames is None, compress, used)


def test_a_large_copy_runs_in_as_many_parts_as_threads():
    pool, frames, ids, refs = _frames_pool(64)
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
    out = np.empty(big.size * 84 * 84, np.uint8)  # the benchmarks' floors: the copy splits
    assert parts(with_threads, 2, core._memcpy_gather, pool, big, out)[1] == 2  # as gathers do
    f32 = core._convert_gather_floor(pool, big, np.empty((300, K, *FS), np.float32), 1 / 255)
    assert np.array_equal(f32, pool.gather(big, layout="stack", dtype=np.float32, scale=1 / 255))
    del refs


def test_calls_from_several_threads_at_once():
    """One call holds the workers, the others copy alone: every result is exact."""
    pool, frames, ids, refs = _frames_pool(64, seed=4)
    lazyframes.set_num_threads(2)

    def exact(pick):
        want = frames[pick].astype(np.float32)
        return all(
            np.array_equal(pool.gather(ids[pick], layout="stack", dtype=np.float32), want)
            for _ in range(20)
        )

    with ThreadPoolExecutor(3) as ex:
        assert all(ex.map(exact, np.random.default_rng(5).integers(0, 64, (3, 100, K))))
    del refs


# -- errors: raised before anything is written --------------------------------------------
def test_a_freed_id_in_a_large_split_copy_writes_nothing():
    pool, frames, ids, refs = _frames_pool(64, seed=6)
    pick = ids[np.random.default_rng(7).integers(0, 64, (300, K))]
    pick[-1, -1] = pool.push(frames[0]).slot  # freed at once; the last frame of the last part
    out = np.full((300, K, *FS), 7, np.uint8)
    lazyframes.set_num_threads(4)
    _, used = parts(refused, ValueError, "free", pool.gather, pick, out, layout="stack")
    assert used == 0 and (out == 7).all()
    del refs


# -- fork ------------------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_makes_its_own_workers():
    """A child gathers with workers of its own, not its parent's; both exit without hanging."""
    code = """
import multiprocessing as mp, numpy as np
from lazyframes import _core as core
pool = core.FramePool((84, 84), np.uint8)
frames = np.random.default_rng(0).integers(0, 256, (64, 84, 84), dtype=np.uint8)
refs = [pool.push(f) for f in frames]
pick = np.random.default_rng(1).integers(0, 64, (300, 4))
ids = np.array([r.slot for r in refs])[pick]
core.set_num_threads(2)

def gather_checked():  # exact, and in 2 parts
    before = core._parallel_tasks()[0]
    out = pool.gather(ids, layout="stack")
    return bool(np.array_equal(out, frames[pick])), core._parallel_tasks()[0] - before

five = lambda: [gather_checked() for _ in range(5)]
assert five() == [(True, 2)] * 5
q = (ctx := mp.get_context("fork")).Queue()
(p := ctx.Process(target=lambda: q.put(five()))).start()  # forked: the lambda is not pickled
got = q.get(timeout=120)
p.join(120)
assert p.exitcode == 0 and got == [(True, 2)] * 5, (p.exitcode, got)
assert gather_checked() == (True, 2)  # the parent's workers still work
print("done")
"""
    res = run("-W", "ignore::DeprecationWarning", "-c", code, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "done" and res.stderr == ""
