"""lazyframes.shared: one writer, reader processes that sample without locks, dead readers.

Self-checking data: frame ``f`` holds ``f`` in its first 8 bytes and ``f % 251`` elsewhere;
row ``t`` is frames ``t .. t + 4`` with action ``t``. A torn or evicted row breaks one.
"""

import copy
import multiprocessing
import os

import numpy as np
import pytest
from conftest import refused, run
from test_transport import SHAPE, _forge, vector_run

from lazyframes import shared
from lazyframes.shared import SharedReplay
from lazyframes.transport import Sender

K = 4


def frame(f, shape=SHAPE):
    """Frame number ``f``: its number in the first 8 bytes, ``f % 251`` in the others."""
    a = np.full(shape, f % 251, np.uint8)
    a.reshape(-1)[:8] = np.frombuffer(np.int64(f).tobytes(), np.uint8)
    return a


def numbers_of(frames):
    """The number written in each frame ``(..., *SHAPE)``; checks the other bytes."""
    flat = np.ascontiguousarray(frames).reshape(frames.shape[0] * K, -1)
    nums = flat[:, :8].copy().view(np.int64)[:, 0]
    assert (flat[:, 8:] == (nums % 251)[:, None].astype(np.uint8)).all()
    return nums.reshape(frames.shape[0], K)


def write_rows(writer, t0, n):
    """Rows ``t0 .. t0 + n``: row t is frames t..t+3 -> t+1..t+4, action t, reward t."""
    new = range(writer.frames_written, t0 + n + K)
    nums = writer.add_frames(np.stack([frame(f, writer.frame_shape) for f in new]))
    assert nums[-1] == t0 + n + K - 1
    t = np.arange(t0, t0 + n)
    obs = t[:, None] + np.arange(K)
    writer.add(obs, t, t.astype(np.float32), obs + 1, t % 7 == 0, t % 11 == 0)


def check(batch):
    """Every sampled row is the row its number says, whole."""
    t = batch.indices
    np.testing.assert_array_equal(batch.actions, t)
    np.testing.assert_array_equal(batch.rewards, t.astype(np.float32))
    np.testing.assert_array_equal(numbers_of(batch.observations), t[:, None] + np.arange(K))
    np.testing.assert_array_equal(
        numbers_of(batch.next_observations), t[:, None] + 1 + np.arange(K)
    )
    np.testing.assert_array_equal(batch.dones, (t % 7 == 0).astype(np.float32))
    np.testing.assert_array_equal(batch.truncations, (t % 11 == 0).astype(np.float32))


def test_write_then_sample_and_the_ring_wraps(tmp_path):
    path = tmp_path / "r.lfr"
    w = SharedReplay.create(path, capacity=50, frame_shape=SHAPE, stack_size=K)
    r = SharedReplay.attach(path)
    rng = np.random.default_rng(0)
    refused(ValueError, "no transition", r.sample, 4, rng=rng)
    write_rows(w, 0, 30)
    check(r.sample(64, rng=rng))
    for t0 in range(30, 300, 30):
        write_rows(w, t0, 30)
        b = r.sample(64, rng=rng)
        check(b)
        assert b.indices.min() >= w.rows_written - 50  # only the rows held
    assert len(r) == 50 and r.rows_written == 300
    r.close()
    w.close(unlink=True)
    assert not path.exists()


def test_readers_cannot_write_and_closed_objects_raise(tmp_path):
    path = tmp_path / "r.lfr"
    w = SharedReplay.create(path, capacity=8, frame_shape=SHAPE, stack_size=K)
    r = SharedReplay.attach(path)
    row = [[0, 1, 2, 3]], [0], [0.0], [[1, 2, 3, 4]], [False], [False]
    for exc, match, call in [
        (ValueError, "a reader cannot write", lambda: r.add_frames(np.stack([frame(0)]))),
        (ValueError, "read-only", lambda: r._frames.__setitem__(0, 1)),  # the mapping itself
        (ValueError, "only the writer", lambda: r.close(unlink=True)),
        (ValueError, "not written yet", lambda: w.add(*row)),
        (TypeError, "dtype", lambda: w.add_frames(np.zeros((1, *SHAPE), np.float32))),
        (TypeError, "pickled", lambda: copy.copy(w)),
        (TypeError, "create", SharedReplay),
    ]:
        refused(exc, match, call)
    w.add_frames(np.stack([frame(f) for f in range(10)]))
    w.add_frames(np.stack([frame(f) for f in range(10, 20)]))  # 16 slots: 0-3 replaced
    with pytest.raises(ValueError, match="already replaced"):
        w.add([[3, 4, 5, 6]], [0], [0.0], [[4, 5, 6, 7]], [False], [False])
    assert w.add([[4, 5, 6, 7]], [0], [0.0], [[5, 6, 7, 8]], [False], [False]) == 1
    r.close()
    refused(ValueError, "closed", r.sample, 1)
    w.close(unlink=True)


@pytest.mark.parametrize("damage,match", [
    (lambda b: b[:100], "too short"),
    (lambda b: b"x" * 8 + b[8:], "not a SharedReplay file"),
    (lambda b: b + b"\0" * 8, "does not match its header"),
    (lambda b: b[:-8], "does not match its header"),
    (lambda b: b[:24] + np.int64(10**12).tobytes() + b[32:], "does not match"),  # rows
    (lambda b: b[:48] + np.int64(99).tobytes() + b[56:], "corrupt header"),  # ndim
    (lambda b: b[:120] + b"<c16".ljust(16, b"\0") + b[136:], "corrupt header"),  # dtype
])  # fmt: skip
def test_attach_checks_the_file(tmp_path, damage, match):
    path = tmp_path / "r.lfr"
    SharedReplay.create(path, capacity=8, frame_shape=SHAPE, stack_size=K).close()
    bad = tmp_path / "bad.lfr"
    bad.write_bytes(damage(path.read_bytes()))
    refused(ValueError, match, SharedReplay.attach, bad)
    refused(FileNotFoundError, "", SharedReplay.attach, tmp_path / "missing.lfr")


def test_ingest_transport_messages(tmp_path):
    path = tmp_path / "r.lfr"
    w = SharedReplay.create(path, capacity=500, frame_shape=SHAPE, stack_size=K)
    sender = Sender(num_envs=2, stream=w.open(2), compress=True)
    run = vector_run(40, 2, 4)
    expected = {}
    for i, (obs, _, _, nxt, term, trunc, extras) in enumerate(run):
        act = np.array([2 * i, 2 * i + 1])  # the action names the transition
        rew = act.astype(np.float32)
        sender.add(obs, act, rew, nxt, term, trunc, **extras)
        for e in range(2):
            if not extras["autoreset"][e]:
                expected[int(act[e])] = (np.asarray(obs[e]), np.asarray(nxt[e]), term[e], trunc[e])
        if i % 10 == 9:
            assert w.ingest(sender.flush()) == 20
    assert len(w) == len(expected)  # the autoreset placeholders are not stored
    b = SharedReplay.attach(path).sample(200, rng=np.random.default_rng(1))
    for o, a, n, d, tr in zip(
        b.observations, b.actions, b.next_observations, b.dones, b.truncations, strict=True
    ):
        eo, en, et, etr = expected[int(a)]
        np.testing.assert_array_equal(o, eo)
        np.testing.assert_array_equal(n, en)
        assert (d, tr) == (float(et), float(etr))
    w.close(unlink=True)


def test_ingest_refuses_a_forged_message_before_writing(tmp_path):
    w = SharedReplay.create(tmp_path / "r.lfr", capacity=100, frame_shape=SHAPE, stack_size=K)
    sender = Sender(num_envs=2, stream=w.open(2), compress=True)
    for obs, act, rew, nxt, term, trunc, extras in vector_run(5, 2, 4):
        sender.add(obs, act, rew, nxt, term, trunc, **extras)
    msg = sender.flush()
    bad = _forge(msg, "obs", msg["obs"] + np.uint16(1000))
    refused(ValueError, "out of range", w.ingest, bad)
    refused(ValueError, "shape", w.ingest, _forge(msg, "frame_shape", (10, 12)))
    assert (w.frames_written, w.rows_written) == (0, 0)
    assert w.ingest(msg) == 10
    w.close(unlink=True)


def _reader(path, rows, queue, report_every):
    """A learner: samples and checks batches (10 at least) until ``rows`` rows are written."""
    r = SharedReplay.attach(path)
    rng = np.random.default_rng(os.getpid())
    n = 0
    queue.put(("started", os.getpid()))
    while n < 10 or r.rows_written < rows:
        check(r.sample(32, rng=rng))
        n += 1
        if n % report_every == 0:
            queue.put(("batches", n))
    queue.put(("done", n))


def race_two_readers(w, path, t0, rows):
    """Write rows while two readers sample: one killed mid-loop, one until ``rows`` are written."""
    ctx = multiprocessing.get_context("spawn")
    q_live, q_doomed = ctx.Queue(), ctx.Queue()
    live = ctx.Process(target=_reader, args=(str(path), rows, q_live, 10**9), daemon=True)
    doomed = ctx.Process(target=_reader, args=(str(path), 2**62, q_doomed, 5), daemon=True)
    live.start()
    doomed.start()
    try:
        assert q_live.get(timeout=120)[0] == "started"
        assert q_doomed.get(timeout=120)[0] == "started"
        killed, kind, n = False, None, 0
        while kind != "done" or not killed:
            assert kind == "done" or live.is_alive() or not q_live.empty(), "the reader died"
            assert killed or doomed.is_alive(), "the other reader died before it was killed"
            write_rows(w, t0, 20)  # the rings (or the log) wrap, rows and frames are replaced
            t0 += 20
            if not killed and not q_doomed.empty() and q_doomed.get()[0] == "batches":
                doomed.kill()  # mid-loop, probably mid-copy: it holds nothing
                killed = True
            if not q_live.empty():
                kind, n = q_live.get()
        assert n >= 10 and w.rows_written >= rows  # the live reader saw only whole rows
        check(SharedReplay.attach(path).sample(64, rng=np.random.default_rng(2)))
    finally:
        for p in (live, doomed):
            p.kill()
            p.join(timeout=30)


def test_readers_sample_while_the_writer_writes_and_one_is_killed(tmp_path):
    path = tmp_path / "r.lfr"
    # Atari-sized frames and small rings: the writer laps the readers during their copies
    w = SharedReplay.create(
        path, capacity=64, frame_shape=(84, 84), stack_size=K, frame_capacity=96
    )
    write_rows(w, 0, 60)
    race_two_readers(w, path, 60, rows=400)  # while the writer wraps the rings
    w.close(unlink=True)


@pytest.mark.parametrize("count", [-1, -(2**63)])
def test_a_negative_row_count_is_a_corrupt_header(tmp_path, count):
    path = tmp_path / "r.lfr"
    w = SharedReplay.create(path, capacity=8, frame_shape=SHAPE, stack_size=K)
    w.add_frames(np.stack([frame(f) for f in range(5)]))
    w.add([[0, 1, 2, 3]], [0], [0.0], [[1, 2, 3, 4]], [False], [False])
    w._head[shared._ROWS_WRITTEN] = count  # as another process could write it
    r = SharedReplay.attach(path)
    refused(ValueError, "corrupt header", r.sample, 2)
    r.close()
    w.close()


def test_attach_and_load_refuse_a_fifo_without_blocking(tmp_path):
    """Opening a FIFO blocks until a writer comes: attach and load must not wait."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code = (
        "import sys, lazyframes\n"
        "from lazyframes.shared import SharedReplay\n"
        "for f in (SharedReplay.attach, lazyframes.ReplayBuffer.load):\n"
        "    try:\n"
        "        f(sys.argv[1])\n"
        "    except ValueError as e:\n"
        "        print(e)\n"
    )
    r = run("-c", code, str(fifo), timeout=60)
    assert r.returncode == 0 and r.stdout.count("not a regular file") == 2, r.stdout + r.stderr
    refused(ValueError, "not a regular file", SharedReplay.attach, tmp_path)
