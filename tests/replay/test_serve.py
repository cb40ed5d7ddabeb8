"""lazyframes.serve: batches served to learner processes (spawned) through shared memory."""

import copy
import json
import multiprocessing as mp
import os
import queue
import signal
import time

import numpy as np
import pytest
from conftest import assert_same_samples, refused

from lazyframes import PrioritizedReplayBuffer, ReplayBuffer
from lazyframes.serve import BatchClient, BatchServer

CTX = mp.get_context("spawn")  # a fresh interpreter: nothing of the owner inherited
FS = (16, 16)


def frames(t):
    """Frames ``t .. t + 3``: frame ``u`` is a pattern of ``u`` (each distinct)."""
    u = np.arange(t, t + 4)[:, None]
    return ((u * 31 + np.arange(FS[0] * FS[1]) * 7) % 253).astype(np.uint8).reshape(4, *FS)


def make(kind, steps=150):
    if kind == "dict":
        rb = ReplayBuffer(1000, seed=1, frame_keys=["image"])
    elif kind == "prioritized":
        rb = PrioritizedReplayBuffer(1000, alpha=0.6, seed=1)
    else:
        rb = ReplayBuffer(1000, seed=1, n_step=3 if kind == "nstep" else 1, gamma=0.9,
                          compress=kind == "nstep")  # fmt: skip
    for t in range(steps):
        add(rb, t)
    return rb


def add(rb, t):
    obs, nxt, end = frames(t), frames(t + 1), t % 17 == 16
    if rb.pool is not None and isinstance(rb.pool, dict):  # the Dict buffer
        obs = {"image": obs, "vec": np.full(3, t, np.float32)}
        nxt = {"image": nxt, "vec": np.full(3, t + 1, np.float32)}
    rb.add(obs, t, float(t % 5), nxt, end, False)


def learner(path, i, n, results, mode=""):
    """A learner process: ``n`` batches (copies) put in ``results``; then per ``mode``."""
    client = BatchClient(path, learner=i)
    got = []
    for _ in range(n):
        batch = client.next(timeout=120)
        got.append(copy.deepcopy(batch))
        if mode == "update":
            client.update_priorities(batch.indices, 1.0 + batch.indices % 7)
    results.put(got)
    if mode == "stall":  # holds its batch, reads no more
        time.sleep(3600)
    client.close()


def hostile(path, i, rounds, results):
    """Claims learner ``i``, then writes random words over its whole region, again and again.

    Half the words are small (below 8): counters, counts and indices an owner may take.
    """
    client = BatchClient(path, learner=i)
    with open(path, "r+b") as f:
        head = f.read(4096)
        d = json.loads(head[64 : 64 + int.from_bytes(head[12:16], "little")])
        base = d["first"] + i * d["learner_bytes"]
        rng = np.random.default_rng(i)
        for _ in range(rounds):
            words = rng.integers(-(2**63), 2**63 - 1, d["learner_bytes"] // 8)
            words[rng.random(words.size) < 0.5] %= 8
            f.seek(base)
            f.write(words.tobytes())
            f.flush()
    results.put("done")
    client.close()


def start(fn, *args):
    p = CTX.Process(target=fn, args=args, daemon=True)
    p.start()
    return p


def pump_until(server, results, want, rb=None, rounds=100_000):
    """Pump (and add, with ``rb``) until ``want`` results came: bounded work, never a wait."""
    got = []
    for r in range(rounds):
        server.pump()
        if rb is not None:
            add(rb, 150 + r % 700)
        try:
            got.append(results.get_nowait())
        except queue.Empty:
            time.sleep(0.001)
        if len(got) == want:
            return got
    raise AssertionError(f"{len(got)} of {want} learners done after {rounds} pumps")


def check_batches(rb, got, opts):
    for j, batch in enumerate(got):
        want = rb.gather(batch.indices, **opts)
        assert_same_samples(batch._replace(weights=want.weights), want, f"batch {j}")


@pytest.mark.parametrize(
    "kind, opts",
    [("plain", {}), ("plain", {"dtype": np.float32, "scale": 1 / 255}), ("nstep", {}),
     ("dict", {}), ("prioritized", {})],
    ids=["uint8", "float32", "compressed-nstep3", "dict", "prioritized"],
)  # fmt: skip
def test_a_learner_process_gets_the_batches_the_buffer_holds(kind, opts):
    rb = make(kind)
    mode = "update" if kind == "prioritized" else ""
    with BatchServer(rb, 8, learners=2, prefetch=2, **opts) as server:
        results = CTX.Queue()
        procs = [start(learner, server.path, i, 12, results, mode) for i in range(2)]
        got = pump_until(server, results, 2)
        for _ in range(100):  # the last updates: sent before the results, taken by pumps
            server.pump()
        assert [e for *_, e in server.status] == [None, None]
    for p in procs:
        p.join()
    for batches in got:
        check_batches(rb, batches, opts)
        assert all(b.observations is not None for b in batches) and len(batches) == 12
    if kind == "prioritized":
        assert [u for _, u, _ in server.status] == [12, 12]
        last = {}
        for batches in got:
            for b in batches:
                assert (b.weights > 0).all() and (b.weights <= 1).all()
                last.update((int(i), 1.0 + i % 7) for i in b.indices)
        idx = np.array(sorted(last))
        # both learners sent 1 + i % 7 for transition i: whatever the order, the tree has it
        np.testing.assert_allclose(rb.priorities(idx), [last[i] for i in idx], rtol=1e-6)
        assert rb.max_priority == max(last.values())


def test_a_stalled_or_killed_learner_never_blocks_the_owner_or_the_others():
    rb, P = make("plain"), 2
    with BatchServer(rb, 8, learners=2, prefetch=P) as server:
        results = CTX.Queue()
        stalled = start(learner, server.path, 0, 2, results, "stall")
        reader = start(learner, server.path, 1, 40, results)
        got = pump_until(server, results, 2, rb=rb)  # adds and pumps while 0 holds a batch
        first = min(got, key=len)
        assert len(first) == 2 and len(max(got, key=len)) == 40
        # learner 0 released one batch: it was given at most P + 1 more
        assert server.status[0][0] <= 1 + P + 1 and server.status[1][0] >= 40
        os.kill(stalled.pid, signal.SIGKILL)
        stalled.join()
        before = server.status[1][0]
        for t in range(200):  # adds and pumps go on with a dead learner
            add(rb, 150 + t)
            server.pump()
        assert server.status[0][0] <= 1 + P + 1 and [e for *_, e in server.status] == [None, None]
        # the dead process's claim is taken over: a new learner 0 is served
        taker = start(learner, server.path, 0, 5, results)
        (batches,) = pump_until(server, results, 1)
        taker.join()
        assert len(batches) == 5 and server.status[1][0] == before
        reader.join()


def test_a_hostile_learner_never_crashes_blocks_or_corrupts_the_others():
    rb = make("prioritized")  # its updates reach the buffer's checks
    with BatchServer(rb, 8, learners=2, prefetch=2) as server:
        results = CTX.Queue()
        bad = start(hostile, server.path, 0, 3000, results)
        good = start(learner, server.path, 1, 30, results)
        got = pump_until(server, results, 2)
        bad.join()
        good.join()
        for _ in range(50):
            server.pump()
        (batches,) = [g for g in got if g != "done"]
        check_batches(rb, batches, {})
        assert server.status[1][2] is None and server.status[1][0] >= 30
        assert server.status[0][2] is not None  # seen and disconnected


def test_a_learner_whose_update_is_impossible_is_disconnected():
    rb = make("prioritized")
    with BatchServer(rb, 4, learners=4, prefetch=1) as server:
        a, b = BatchClient(server.path, learner=0), BatchClient(server.path, learner=1)
        server.pump()
        batch = a.next(timeout=10)
        a.update_priorities(batch.indices, [1.0, np.inf, 1.0, 1.0])
        b.update_priorities([10**12], [1.0])  # never written
        with open(server.path, "rb") as f:
            d = json.loads(f.read()[64:].split(b"\0")[0])
        with open(server.path, "r+b") as f:  # learner 2's tail, learner 3's update ring
            f.seek(d["first"] + 2 * d["learner_bytes"] + 128)
            f.write((10**9).to_bytes(8, "little"))
            f.seek(d["first"] + 3 * d["learner_bytes"] + 192)  # one update published
            f.write((1).to_bytes(8, "little"))
            f.seek(d["first"] + 3 * d["learner_bytes"] + 320 + 3 * d["slot_bytes"])
            f.write((5).to_bytes(8, "little"))  # of 5 priorities, batch_size 4
        server.pump()
        assert "not positive and finite" in server.status[0][2]
        assert "refused" in server.status[1][2]
        assert "released count is impossible" in server.status[2][2]
        assert "an update of 5 priorities" in server.status[3][2]
        refused(ConnectionError, "disconnected", a.next, timeout=10)
        refused(RuntimeError, "claimed by process", BatchClient, server.path, learner=1)


def test_a_truncated_or_garbage_file_is_a_value_error(tmp_path):
    rb = make("dict")
    with BatchServer(rb, 4, learners=1, prefetch=1) as server, open(server.path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[12:16], "little")
    d = json.loads(data[64 : 64 + n])
    rng = np.random.default_rng(0)
    cases = [data[:0], data[:10], data[:100], data[: len(data) // 2], data[:-1],
             rng.integers(0, 256, len(data), np.uint8).tobytes(),
             data[:64] + b"{" * n + data[64 + n :],
             data[:12] + (10**9).to_bytes(4, "little") + data[16:]]  # fmt: skip

    def header(**change):  # the file with its JSON changed
        text = json.dumps({**d, **change}).encode().ljust(d["first"] - 64)
        return data[:12] + len(text).to_bytes(4, "little") + data[16:64] + text + data[d["first"] :]

    leaves = [dict(leaf) for leaf in d["leaves"]]
    leaves[0]["offset"] = d["slot_bytes"]  # the first leaf outside its slot
    cases += [header(slot_bytes=64), header(learners=2), header(first=0), header(batch_size=10**6),
              header(leaves=d["leaves"][:-1]), header(prefetch=3), header(keys=["vec", "image"]),
              header(leaves=leaves), header(prioritized=1),
              header(prefetch=1025, slots=2051, records=2051)]  # fmt: skip
    for i, case in enumerate(cases):
        path = tmp_path / f"bad{i}"
        path.write_bytes(case)
        refused(ValueError, ".", BatchClient, str(path))
    (tmp_path / "good").write_bytes(header())  # the file as made (JSON padded): accepted
    BatchClient(str(tmp_path / "good")).close()


def test_the_file_outlives_no_owner_and_is_the_owners_alone():
    rb = make("prioritized")
    server = BatchServer(rb, 4, learners=1, prefetch=1)
    path, client = server.path, BatchClient(server.path)
    refused(PermissionError, "", os.truncate, path, 4096)  # sealed: no SIGBUS for the owner
    refused(ValueError, "prefetch in", BatchServer, rb, 4, prefetch=1025)
    client.update_priorities([], [])  # an empty update: applied by the next pump
    for fn in (server.close, client.next):  # in a forked child: closes nothing, reads nothing
        pid = os.fork()
        if pid == 0:
            try:
                fn()
            finally:
                os._exit(0 if fn == server.close else 3)
        assert os.waitpid(pid, 0)[1] == 0 if fn == server.close else 3 << 8
    assert server.pump() == 2 and client.next(timeout=10).actions.shape == (4,)
    assert server.status == [(2, 1, None)]
    server.close()
    refused(ConnectionError, "closed", client.next, timeout=10)
    client.close()
    assert not os.path.exists(path)  # the owner's descriptor closed: no file left anywhere


def test_a_learner_outlives_a_buffer_with_nothing_sampleable_for_a_while():
    # 2 envs, 2 steps of each held, 3-step windows: sampleable only while an end is held
    def step(t, end):
        obs, nxt = np.stack([frames(t), frames(t + 50)]), np.stack([frames(t + 1), frames(t + 51)])
        rb.add(obs, np.full(2, t), np.ones(2), nxt, np.full(2, end), np.zeros(2, bool))

    rb = ReplayBuffer(4, seed=1, n_step=3, gamma=0.9, num_envs=2)
    step(0, True)
    with BatchServer(rb, 4, prefetch=1) as server:
        client = BatchClient(server.path, learner=0)
        assert server.pump() == 2  # batches 0 and 1; batch 2 asked for
        step(1, False)  # (batch 2 drawn first) the ends evicted: nothing sampleable
        step(2, False)
        for _ in range(3):  # batches 0, 1, 2 read; batch 3's draw finds nothing
            batch = client.next(timeout=10)
            assert (batch.actions == 0).all(), batch.actions
            server.pump()
        assert server.status[0][2] is None  # served still
        step(3, True)
        server.pump()
        batch = client.next(timeout=10)  # in slot 3 % 3: where the learner reads it
        assert np.isin(batch.actions, [2, 3]).all(), batch.actions  # the windows that end
        want = rb.gather(batch.indices)
        assert_same_samples(batch._replace(weights=want.weights), want, "after")
        client.close()
