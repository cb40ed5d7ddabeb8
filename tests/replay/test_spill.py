"""SharedReplay(compress=True): frames as blobs in a circular byte log (docs/SHARED.md)."""

import numpy as np
import pytest
from conftest import recorded, refused
from test_shared import K, check, race_two_readers, write_rows
from test_transport import SHAPE, vector_run

from lazyframes import _core
from lazyframes.shared import (
    _GROUP,
    _LOG_BYTES,
    _LOG_HEAD,
    BLOB_RECORD,
    HEADER_WORDS,
    SharedReplay,
    _layout,
)
from lazyframes.transport import Sender

PONG = recorded("pong")[0]
FB = 84 * 84


def two_envs(steps):
    """Two envs' Pong frames: env 0 plays the recording forwards, env 1 backwards."""
    for i in range(steps):
        j = i % len(PONG)
        yield PONG[j], PONG[len(PONG) - 1 - j]


def fill(writer, steps):
    """Write two envs' frames and rows; ``{row: (obs frames, next obs frames)}`` as written."""
    model, last = {}, [[], []]
    for a, b in two_envs(steps):
        prev = [last[e][-1] if last[e] else -1 for e in range(2)]
        nums = writer.add_frames(np.stack([a, b]), prev=prev)
        for e in range(2):
            last[e] = (last[e] + [int(nums[e])])[-5:]
        if len(last[0]) == 5:
            obs = np.array([last[0][:4], last[1][:4]])
            t0 = writer.rows_written
            writer.add(obs, [t0, t0 + 1], [0.5, -0.5], obs + 2, [False, True], [False, False])
            for e in range(2):
                model[t0 + e] = last[e][:4], last[e][1:]
    return model


def frames_written(steps):
    """Every frame ``fill`` wrote, by number (two per step)."""
    return np.stack([f for pair in two_envs(steps) for f in pair])


def test_values_equal_the_frames_written_over_wraparound(tmp_path):
    steps = 700  # 1,400 frames: the log and the frame ring both wrap
    opts = {"frame_capacity": 1000, "compress": True, "log_bytes": 40 * (FB + 32)}
    w = SharedReplay.create(
        tmp_path / "c.lfr", capacity=600, frame_shape=(84, 84), stack_size=K, **opts
    )
    model = fill(w, steps)
    r = SharedReplay.attach(tmp_path / "c.lfr")
    rng = np.random.default_rng(0)
    held = len(r)
    table = frames_written(steps)
    assert 0 < held <= 600 and r.rows_written == 2 * (steps - 4)
    assert held == 600  # compressed, 40 frames' raw bytes hold the frames of 600 rows
    for dtype, scale in ((None, None), (np.float32, 1 / 255)):
        b = r.sample(256, rng=rng, dtype=dtype, scale=scale)
        assert b.indices.min() >= r.rows_written - held
        for i, t in enumerate(b.indices):
            o, n = model[int(t)]
            want_o, want_n = table[list(o)], table[list(n)]
            if dtype is not None:
                want_o = want_o.astype(np.float32) * np.float32(scale)
                want_n = want_n.astype(np.float32) * np.float32(scale)
            np.testing.assert_array_equal(b.observations[i], want_o)
            np.testing.assert_array_equal(b.next_observations[i], want_n)
        assert b.observations.dtype == (np.uint8 if dtype is None else np.float32)
        np.testing.assert_array_equal(b.dones, (b.indices % 2).astype(np.float32))
        np.testing.assert_array_equal(b.rewards, np.where(b.indices % 2, -0.5, 0.5))
    # deltas, chains of at most 4 blobs
    kinds, depth = r._blobs["kind"].copy(), r._blobs["depth"].copy()
    assert (kinds == _core.KIND_DELTA).sum() > 2 * (kinds == _core.KIND_KEY).sum()
    assert depth.max() == 3
    r.close()
    w.close(unlink=True)


def test_ingest_transport_messages_compressed(tmp_path):
    path = tmp_path / "r.lfr"
    w = SharedReplay.create(  # a log that would hold raw blobs too
        path, capacity=500, frame_shape=SHAPE, stack_size=K, compress={"group": 8}, log_bytes=10**5
    )
    plain = SharedReplay.create(tmp_path / "p.lfr", capacity=500, frame_shape=SHAPE, stack_size=K)
    senders = [Sender(num_envs=3, stream=x.open(3), compress=True) for x in (w, plain)]
    for i, (obs, _, _, nxt, term, trunc, extras) in enumerate(vector_run(60, 3, 5)):
        act = np.arange(3 * i, 3 * i + 3)
        for s in senders:
            s.add(obs, act, act.astype(np.float32), nxt, term, trunc, **extras)
        if i % 10 == 9:
            assert w.ingest(senders[0].flush()) == plain.ingest(senders[1].flush()) == 30
    assert len(w) == len(plain) > 100 and w.frames_written == plain.frames_written
    rows = np.arange(len(w))
    np.testing.assert_array_equal(w._refs[rows], plain._refs[rows])  # the same frame numbers
    a = SharedReplay.attach(path).sample(300, rng=np.random.default_rng(1))
    b = plain.sample(300, rng=np.random.default_rng(1))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert (w._blobs["kind"][: w.frames_written] == _core.KIND_DELTA).mean() > 0.5
    del a
    w.close(unlink=True)
    plain.close(unlink=True)


def test_writer_refusals(tmp_path):
    path = tmp_path / "r.lfr"
    with pytest.raises(ValueError, match="log_bytes must hold"):
        SharedReplay.create(path, capacity=8, frame_shape=(84, 84), compress=True, log_bytes=9)
    with pytest.raises(ValueError, match="codec"):
        SharedReplay.create(path, capacity=8, frame_shape=(84, 84), compress={"codec": "x"})
    w = SharedReplay.create(
        path, capacity=8, frame_shape=(84, 84), compress=True, log_bytes=4 * (FB + 32)
    )
    noise = np.random.default_rng(0).integers(0, 256, (5, 84, 84), np.uint8)
    with pytest.raises(ValueError, match="do not fit"):
        w.add_frames(noise)  # five incompressible frames: more than the log
    refused(ValueError, "prev must be", w.add_frames, noise[:2], prev=[0.5, 1.5])
    assert w.frames_written == 0
    w.add_frames(noise[:4])
    w.add_frames(noise[:1])  # the log wraps: frame 0's bytes are reused
    with pytest.raises(ValueError, match="already replaced"):
        w.add([[0, 1, 2, 3]], [0], [0.0], [[1, 2, 3, 4]], [False], [False])
    w.close(unlink=True)


def _compressed_file(path, rows=40):
    """A compressed file of self-checking frames (test_shared's) and its geometry."""
    log = 128 * (FB + 32)
    w = SharedReplay.create(
        path, capacity=64, frame_shape=(84, 84), stack_size=K, compress=True, log_bytes=log
    )
    write_rows(w, 0, rows)
    w.close()
    return _layout(K, 64, 128, FB, log)


def _poke(path, offset, value):
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(value)


@pytest.mark.parametrize(
    "forged,match",
    [
        ({"len": 0}, "corrupt frame record"), ({"len": FB + 33}, "corrupt frame record"),
        ({"len": 2**32 - 1}, "corrupt frame record"), ({"kind": 7}, "corrupt frame record"),
        ({"kind": _core.KIND_RAW, "len": 100}, "corrupt frame record"),  # raw: one frame long
        ({"kind": _core.KIND_DELTA, "back": 0}, "corrupt frame record"),  # no reference
        ({"pos": 1 << 40}, "corrupt frame record"),  # beyond the log's head
        ({"pos": -(1 << 40)}, None),  # long gone from the log: the row is never read
    ],
)  # fmt: skip
def test_forged_records_raise_on_read(tmp_path, forged, match):
    path = tmp_path / "r.lfr"
    lay = _compressed_file(path)
    r = SharedReplay.attach(path)
    rec = r._blobs.copy()
    r.close()
    for field, value in forged.items():
        rec[field][0:44:3] = value  # frames across every row's chain
    _poke(path, lay["blobs"], rec.tobytes())
    r = SharedReplay.attach(path)
    if match is None:
        refused(RuntimeError, "no consistent batch", r.sample, 64, rng=np.random.default_rng(0))
    else:
        refused(ValueError, match, r.sample, 64, rng=np.random.default_rng(0))
    r.close()


def test_forged_chains_and_blobs_raise_on_read(tmp_path):
    path = tmp_path / "r.lfr"
    lay = _compressed_file(path)
    r = SharedReplay.attach(path)
    rec = r._blobs.copy()
    log = np.array(r._log[:4096])
    r.close()
    loop = rec.copy()
    loop["kind"][:44] = _core.KIND_DELTA  # every frame a delta against the one before...
    loop["back"][1:44] = 1
    loop["back"][0] = 1  # ... and frame 0 against frame -1: never consistent
    _poke(path, lay["blobs"], loop.tobytes())
    refused(ValueError, "chain", SharedReplay.attach(path).sample, 64, rng=np.random.default_rng(0))
    _poke(path, lay["blobs"], rec.tobytes())
    _poke(path, lay["log"], (log ^ 0x5A).tobytes())  # the first blobs' bytes, scrambled
    assert not (rec["kind"] == _core.KIND_RAW).any()  # compressed blobs: checksums to fail
    with pytest.raises(ValueError, match="corrupt blob"):
        SharedReplay.attach(path).sample(64, rng=np.random.default_rng(0))
    _poke(path, lay["log"], log.tobytes())
    check(SharedReplay.attach(path).sample(64, rng=np.random.default_rng(0)))


@pytest.mark.parametrize("word,value,match", [
    (_LOG_BYTES, 10, "corrupt header"),  # the log's size below 4 frames
    (_LOG_BYTES, 1 << 40, "corrupt header"),  # larger than the file
    (_LOG_BYTES, 0, "corrupt header"),  # no log, but a group
    (_GROUP, 0, "corrupt header"),  # group 0
    (_GROUP, 65, "corrupt header"),
    (_LOG_BYTES, 128 * (FB + 32) + 8, "does not match"),  # the file is short of it
])  # fmt: skip
def test_attach_checks_the_compressed_header(tmp_path, word, value, match):
    path = tmp_path / "r.lfr"
    lay = _compressed_file(path, rows=10)
    assert word * 8 < HEADER_WORDS * 8 and lay["size"] == path.stat().st_size
    assert BLOB_RECORD.itemsize == 24
    _poke(path, 8 * word, np.int64(value).tobytes())
    refused(ValueError, match, SharedReplay.attach, path)


def test_a_reader_samples_while_the_writer_laps_a_small_log(tmp_path):
    path = tmp_path / "r.lfr"
    # frames compress to ~50-100 bytes: the 30 KB log, not the frame ring, binds the rows
    log = 30000
    opts = {"frame_capacity": 2000, "compress": {"group": 4}, "log_bytes": log}
    w = SharedReplay.create(path, capacity=1000, frame_shape=(84, 84), stack_size=K, **opts)
    write_rows(w, 0, 100)
    race_two_readers(w, path, 100, rows=1000)  # ~83 bytes a row: the writer laps the log
    assert int(w._head[_LOG_HEAD]) // log >= 2  # twice at least,
    assert len(w) < 1000  # which bound what was held
    w.close(unlink=True)


def test_ingest_refuses_a_message_the_log_cannot_hold(tmp_path):
    opts = {"compress": True, "log_bytes": 4 * (SHAPE[0] * SHAPE[1] + 32)}
    w = SharedReplay.create(
        tmp_path / "r.lfr", capacity=100, frame_shape=SHAPE, stack_size=K, **opts
    )
    sender = Sender(num_envs=2, stream=w.open(2), compress=True)
    for obs, act, rew, nxt, term, trunc, extras in vector_run(30, 2, 6):
        sender.add(obs, act, rew, nxt, term, trunc, **extras)
    with pytest.raises(ValueError, match=r"do not fit|too small"):
        w.ingest(sender.flush())  # 60 new frames' blobs cannot share a 4-blob log
    assert (w.frames_written, w.rows_written, int(w._head[_LOG_HEAD])) == (0, 0, 0)
    w.close(unlink=True)
