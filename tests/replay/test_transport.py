"""lazyframes.transport: frames cross once, messages checked before writing, buffers equal local."""

import copy
import gc
import itertools
import multiprocessing
import pickle
import zlib

import numpy as np
import pytest
from conftest import assert_same_samples, make_pool, refused

import lazyframes
from lazyframes import ReplayBuffer
from lazyframes import _core as core
from lazyframes.transport import Receiver, Sender, wire_bytes

SHAPE = (12, 10)
K = 4
#: The buffers a Receiver fills.
BUFFERS = [ReplayBuffer, lazyframes.PrioritizedReplayBuffer]


def vector_run(steps, num_envs, seed, *, same_step=False, shape=SHAPE):
    """A vector stacker's ``(obs, action, reward, next, term, trunc, extras)``, either autoreset."""
    rng = np.random.default_rng(seed)
    pool = core.FramePool(shape, np.uint8)
    counter = iter(range(1, 1 << 30))

    def frames(n):
        return np.stack([np.full(shape, next(counter) % 251, np.uint8) for _ in range(n)])

    obs = pool.push_batch(frames(num_envs), k=K)
    ended = np.zeros(num_envs, np.bool_)
    out = []
    for _ in range(steps):
        term = rng.random(num_envs) < 0.08
        trunc = ~term & (rng.random(num_envs) < 0.05)
        done = term | trunc
        act = rng.integers(0, 6, num_envs)
        rew = rng.normal(size=num_envs).astype(np.float32)
        if same_step:
            final = obs.shift(frames(num_envs))
            nxt = final.shift(frames(num_envs), done) if done.any() else final
            extras = {"final_obs": list(final), "final_mask": done} if done.any() else {}
        else:
            nxt = obs.shift(frames(num_envs), ended)
            extras = {"autoreset": ended.copy()}
            term, trunc = term & ~ended, trunc & ~ended
            ended = (term | trunc).copy()
        out.append((obs, act, rew, nxt, term, trunc, extras))
        obs = nxt
    return out


def feed(run, rb_local, sender, receiver, rng):
    """Add ``run`` to ``rb_local`` directly and through ``sender`` -> ``receiver``; the messages."""
    msgs = []
    for t, (obs, act, rew, nxt, term, trunc, extras) in enumerate(run, 1):
        rb_local.add(obs, act, rew, nxt, term, trunc, **extras)
        sender.add(obs, act, rew, nxt, term, trunc, **extras)
        if rng.random() < 0.2 or t == len(run):
            msgs.append(sender.flush())
            receiver.ingest(copy.deepcopy(msgs[-1]))  # nothing shared with the sender
    return msgs


def linked(capacity, num_envs, buffer=ReplayBuffer, sender_compress=True, **kw):
    """Two like buffers: one for local adds, one a Receiver fills; and a Sender to it."""
    local = buffer(capacity, num_envs=num_envs, **kw)
    remote = buffer(capacity, num_envs=num_envs, pool=core.FramePool(SHAPE, np.uint8), **kw)
    receiver = Receiver(remote)
    sender = Sender(num_envs=num_envs, stream=receiver.open(num_envs), compress=sender_compress)
    return local, remote, receiver, sender


def assert_same_buffers(a, b):
    assert len(a) == len(b) and a.memory()["unique_frames"] == b.memory()["unique_frames"]
    for _ in range(3):
        assert_same_samples(a.sample(64), b.sample(64))


@pytest.mark.parametrize("buffer", BUFFERS)
@pytest.mark.parametrize("same_step", [False, True])
@pytest.mark.parametrize("compress", [False, True])
def test_sender_receiver_equal_local_adds(compress, same_step, buffer, monkeypatch):
    decoded = []  # frames per decode: 3 at a time, none where a compressing pool adopts them
    monkeypatch.setattr(lazyframes.transport, "PIECE", 3)
    decode = core.decode_frames
    monkeypatch.setattr(core, "decode_frames", lambda p, o, k, *a, **kw: [decoded.append(len(k))]
                        and decode(p, o, k, *a, **kw))  # fmt: skip
    num_envs, n_step = 3, 3
    run = vector_run(60, num_envs, 1, same_step=same_step)
    kw = {"n_step": n_step, "seed": 5, "compress": compress}
    local, remote, receiver, sender = linked(120, num_envs, buffer, compress, **kw)
    msgs = feed(run, local, sender, receiver, np.random.default_rng(2))
    assert_same_buffers(local, remote)
    # each frame crossed once: the new frames of all messages are the distinct frames
    distinct = {s for step in run for o in (step[0], step[3]) for s in o.slots.ravel().tolist()}
    for step in run:
        for fo in step[6].get("final_obs", []) or []:
            distinct.update(fo.slots)
    assert sum(len(m["sizes"]) for m in msgs) == len(distinct)
    assert decoded == [] if compress else max(decoded) == 3


@pytest.mark.parametrize("subsets", [False, True])
def test_ndarrays_or_env_id_subsets_as_envpool_gives(subsets):
    """Stacked ndarray observations send one new frame a step; async subsets stay exact."""
    run, rng = vector_run(30, 3, 12), np.random.default_rng(0)
    local, remote, receiver, sender = linked(200, 3, sender_compress=subsets, n_step=2, seed=4)
    for obs, act, rew, nxt, term, trunc, extras in run:
        ids = np.flatnonzero(rng.random(3) < 0.7) if subsets else np.arange(3)
        o, n = ([x[i] for i in ids] for x in (obs, nxt)) if subsets else map(np.asarray, (obs, nxt))
        auto = {"autoreset": extras["autoreset"][ids], "env_ids": ids if subsets else None}
        for rb in (local, sender) if ids.size else ():  # LazyFrames lists or stacked arrays
            rb.add(o, act[ids], rew[ids], n, term[ids], trunc[ids], **auto)
    msg = sender.flush()
    assert receiver.ingest(msg) == len(local)
    assert_same_buffers(local, remote)
    if not subsets:  # (E, k, *S) stacked: one new frame a step
        assert len(msg["sizes"]) == local.memory()["unique_frames"] < 3 * 30 + 3 * K


def test_two_senders_share_one_buffer_in_their_own_env_streams():
    rb = ReplayBuffer(200, num_envs=3, n_step=3, seed=0, pool=core.FramePool(SHAPE, np.uint8))
    receiver = Receiver(rb)
    a = Sender(num_envs=2, stream=receiver.open(2))
    b = Sender(num_envs=1, stream=receiver.open(1))
    refused(ValueError, "no room", receiver.open, 1)
    # the same transitions added locally, each sender's in the env streams it was given
    local = ReplayBuffer(200, num_envs=3, n_step=3, seed=0)
    ra, rb_run = vector_run(10, 2, 4), vector_run(10, 1, 5)
    for (o, x, r, n, t, u, e), (o1, x1, r1, n1, t1, u1, e1) in zip(ra, rb_run, strict=True):
        a.add(o, x, r, n, t, u, **e)
        b.add(o1, x1, r1, n1, t1, u1, **e1)
    for run, ids in ((rb_run, [2]), (ra, [0, 1])):  # ingested b first, then a
        for o, x, r, n, t, u, e in run:
            local.add(o, x, r, n, t, u, env_ids=ids, **e)
    assert receiver.ingest(b.flush()) == 10 and receiver.ingest(a.flush()) == 20
    assert len(rb) == 30
    assert_same_buffers(local, rb)


def test_messages_are_much_smaller_than_stacked_observations():
    run = vector_run(64, 1, 6, shape=(84, 84))
    sender = Sender(compress=True)
    for *step, extras in run:
        sender.add(*step, **extras)
    msg = sender.flush()
    naive = wire_bytes([(np.asarray(s[0]), s[1], s[2], np.asarray(s[3])) for s in run])
    assert wire_bytes(msg) * 6 < naive


def _message(steps=12, num_envs=2, **kw):
    """A buffer (``kw``: its options), a Receiver to it, a compressing Sender and a message."""
    _, rb, receiver, sender = linked(100, num_envs, seed=0, **kw)
    for *step, extras in vector_run(steps, num_envs, 7):
        sender.add(*step, **extras)
    return rb, receiver, sender, sender.flush()


def _forge(msg, key, value):
    bad = copy.deepcopy(msg)
    bad[key] = value
    return bad


FORGERIES = [("format", "other", ValueError, "not a lazyframes.transport message"),
             ("version", 3, ValueError, "of version 3; .* reads version 4.* same lazyframes"),
             ("nonce", 1 << 64, ValueError, "nonce must be below 2..64"),
             ("nonce", -1, ValueError, "non-negative"),
             ("seq", 7, ValueError, "message 7 refers to 8 kept frames"),
             ("stream", 5, ValueError, "unknown stream"),
             ("stream", -1, ValueError, "non-negative"),
             ("stream", 0.0, TypeError, "must be an integer"),
             ("carry", 4, ValueError, "out of order"),
             ("frame_shape", (10, 12), ValueError, "frames are of shape .10, 12. .*receiver's"),
             ("frame_shape", [12, 10], TypeError, "tuple"),
             ("dtype", "<u2", ValueError, "dtype '<u2', the receiver's"),
             ("dtype", np.uint8, ValueError, "dtype <class"),  # the string, byte order too
             ("stream", type("Int", (int,), {})(0), TypeError, "must be an integer"),
             ("stack_size", 3, ValueError, "changed its observations to k=3"),
             ("stack_size", 0, ValueError, "stack_size|positive|at least"),
             ("layout", "diagonal", ValueError, "layout"),
             ("transitions", 13, ValueError, "shape"),
             ("obs", "ids", TypeError, "unsigned integers"),
             ("payload", b"\x00" * 10, ValueError, "offsets|raw blob"),
             ("payload", 17, TypeError, "bytes-like")]  # fmt: skip


def _forged_arrays(msg):
    """Array fields tampered with: ids out of range, wrong dtypes and shapes."""
    m, T, c = len(msg["sizes"]), msg["transitions"], msg["carry"]

    def changed(key, i, value):
        """``key`` and a copy of ``msg[key]`` with entry ``i`` set to ``value``."""
        a = msg[key].copy()
        a[i] = value
        return key, a

    out = []
    for key in ("obs", "next_obs"):
        # c + m: one past the frames of the message
        out.append((*changed(key, (T // 2, 1), c + m), ValueError, "out of range"))
        out.append((key, msg[key].astype(np.int64), TypeError, "unsigned"))
        out.append((key, msg[key][:, :2].copy(), ValueError, "shape"))
    out += [
        (*changed("env", 0, 2), ValueError, "out of range"),
        (*changed("retain", 0, c + m + 3), ValueError, "out of range"),
        ("retain", np.zeros(100, np.uint16), ValueError, "more than k x num_envs"),
        (*changed("flags", 1, 8), ValueError, "out of range"),
        (*changed("sizes", 0, msg["sizes"][0] + 1), ValueError, "offsets"),
        ("sizes", np.ones(10**6, np.uint32), ValueError, "new frames"),
        ("sizes", msg["sizes"].astype(np.uint64), TypeError, "uint32"),
        (*changed("kinds", 0, 1), ValueError, "KIND_DELTA"),  # old checkpoints' only
        (*changed("crcs", m - 1, msg["crcs"][m - 1] ^ 1), ValueError, f"frame {m - 1} .*CRC-32"),
        ("crcs", msg["crcs"][1:].copy(), ValueError, "crcs has shape"),
        ("action", msg["action"].astype(np.float64), TypeError, "action"),
        (*changed("reward", 3, np.inf), ValueError, "reward"),
        ("reward", msg["reward"][:-1].copy(), ValueError, "reward"),
    ]
    return out


def test_forged_fields_and_arrays_raise_before_writing():
    rb, receiver, sender, first = _message()
    receiver.ingest(first)  # then the next message, forged
    refused(ValueError, "message 0 comes after message 0: a duplicate", receiver.ingest, first)
    for *step, extras in vector_run(14, 2, 7)[12:]:
        sender.add(*step, **extras)
    msg, live = sender.flush(), rb.pool.live_frames
    for key, value, exc, match in [*FORGERIES, *_forged_arrays(msg)]:
        refused(exc, match, receiver.ingest, _forge(msg, key, value))
        gc.collect()
        assert (len(rb), rb.pool.live_frames) == (24, live), key
    refused(TypeError, "a dict", receiver.ingest, [msg])
    extra = dict(msg, extra=1)
    refused(ValueError, "keys", receiver.ingest, extra)
    refused(TypeError, "str keys", receiver.ingest, {**msg, 1: 0})
    assert receiver.ingest(msg) == 4
    rb, receiver, _, msg = _message(steps=51)  # 102 transitions, capacity 100
    refused(ValueError, "more than the buffer holds .100.", receiver.ingest, msg)


@pytest.mark.parametrize("adopted", [False, True])  # decoded, or adopted as it is
def test_a_blob_that_does_not_decode_is_refused(adopted):
    rb, receiver, _, msg = _message(compress=adopted)
    payload = bytearray(msg["payload"])
    payload[:40] = b"\xff" * 40  # not a Blosc2 chunk (say KEY)
    bad = _forge(msg, "payload", bytes(payload))
    bad["kinds"] = np.zeros_like(msg["kinds"])
    o = np.cumsum([0, *msg["sizes"].tolist()]).tolist()
    bad["crcs"] = np.array([zlib.crc32(payload[a:b]) for a, b in itertools.pairwise(o)], np.uint32)
    refused(ValueError, "blob 0 of the container does not decode", receiver.ingest, bad)
    assert len(rb) == 0
    assert receiver.ingest(msg) == 24


def test_the_receiver_not_a_message_fixes_the_frames():
    """A message of other frames (all-zero blobs of any size are tiny) is refused."""
    refused(ValueError, "no pool yet.*frame_shape=", Receiver, ReplayBuffer(10))
    refused(ValueError, "pool stores frames of shape", Receiver, _message()[0], frame_shape=(4, 4))
    rb = ReplayBuffer(10, compress=True)
    receiver = Receiver(rb, frame_shape=SHAPE)
    sender = Sender(stream=receiver.open())
    pool = core.FramePool((512, 512), np.uint8)
    held = pool.push_batch(np.zeros((5, 512, 512), np.uint8), k=1)
    big = [pool.lazy(held.slots.ravel()[i : i + 4], layout="stack") for i in (0, 1)]
    sender.add(big[0], 0, 0.0, big[1], False, False)
    bomb = sender.flush()
    assert wire_bytes(bomb) < 2000
    refused(ValueError, r"frames are of shape \(512, 512\).*receiver's of shape \(12, 10\)",
            receiver.ingest, bomb)  # fmt: skip
    assert rb.pool is None and len(rb) == 0
    assert receiver.ingest(_message(steps=1, num_envs=1)[3]) == 1  # then a pool of SHAPE
    assert rb.pool.frame_shape == SHAPE


def test_one_sender_per_stream_until_the_stream_is_reopened():
    rb, receiver, a, msg = _message(steps=4)  # a's first message: steps 0-3
    b = Sender(num_envs=2, stream=a.stream)  # another sender on the same stream
    run = vector_run(10, 2, 7)

    def step(senders, lo, n=2):
        for *st, extras in run[lo : lo + n]:
            for x in senders:
                x.add(*st, **extras)
        return [x.flush() for x in senders]

    step([b], 0, 4)
    assert receiver.ingest(msg) == 8
    ma, mb = step([a, b], 4)
    assert (mb["seq"], mb["carry"]) == (ma["seq"], ma["carry"]) == (1, 8)  # in sequence
    refused(ValueError, r"stream 0 belongs to another sender.*reopen\(0\)", receiver.ingest, mb)
    assert receiver.ingest(ma) == 4
    refused(ValueError, "unknown stream 1", receiver.reopen, 1)
    receiver.reopen(0)  # a restarted actor takes over: each env starts fresh
    ma, mb = step([a, b], 6)
    refused(ValueError, "messages lost", receiver.ingest, mb)  # no frames kept
    assert receiver.ingest(step([Sender(num_envs=2, stream=0)], 8)[0]) == 4  # its message 0
    assert len(rb) == 8 + 4 + 4 + 2  # an autoreset placeholder per env breaks its links
    rx = Receiver(rb)  # a stream opened on a buffer holding transitions (a restored one)
    assert rx.ingest(step([Sender(num_envs=2, stream=rx.open(2))], 8)[0]) == 4
    assert len(rb) == 18 + 2 + 4  # its envs start fresh too
    for m in (ma, mb):
        refused(ValueError, "stream 0 belongs to another sender", receiver.ingest, m)


def test_a_corrupted_blob_is_refused_by_its_checksum_naming_the_frame():
    rb, receiver, _, msg = _message()
    o = np.cumsum([0, *msg["sizes"].tolist()])
    live = rb.pool.live_frames
    for j in (0, 7, len(o) - 2):
        payload = bytearray(msg["payload"])
        payload[(o[j] + o[j + 1]) // 2] ^= 0x10
        bad = _forge(msg, "payload", bytes(payload))
        refused(ValueError, f"frame {j} of the message.*CRC-32", receiver.ingest, bad)
        assert (len(rb), rb.pool.live_frames) == (0, live)
    assert receiver.ingest(msg) == 24


@pytest.mark.parametrize("buffer", BUFFERS)
def test_a_lost_message_breaks_each_envs_links_not_the_stream(buffer):
    """Loss at every position: resynced messages go on; no n-step window spans a gap."""
    msgs, per, envs = 6, 2, 2
    pool = core.FramePool(SHAPE, np.uint8)
    values = np.add.outer(100 * np.arange(envs), np.arange(msgs * per + K)).astype(np.uint8)
    held = pool.push_batch(np.ones((values.size, *SHAPE), np.uint8) * values.reshape(-1, 1, 1), k=1)
    frames = held.slots.reshape(envs, -1)  # env e's frame t has value 100 e + t

    def stacks(t):  # each env's observation at step t
        return pool.lazy_batch(frames[:, t : t + K], layout="stack")

    for lost in range(msgs):
        rb = buffer(100, num_envs=envs, n_step=3, gamma=1.0, seed=lost, pool=make_pool(SHAPE))
        receiver = Receiver(rb)
        sender = Sender(num_envs=envs, stream=receiver.open(envs))
        kept: list = []
        for i in range(msgs):
            for t in range(i * per, (i + 1) * per):
                no = [False] * envs
                sender.add(stacks(t), [0] * envs, [2.0**t] * envs, stacks(t + 1), no, no)
            msg = sender.flush()
            if i == lost:
                continue
            if msg["carry"] and i == lost + 1:  # refused, so lost too: resync
                refused(ValueError, "messages lost", receiver.ingest, msg)
                sender.resync()
                continue
            assert receiver.ingest(msg) == per * envs
            kept += range(i * per, (i + 1) * per)
        s = rb.sample(512)
        first = s.observations[:, -1, 0, 0].astype(int) % 100 - (K - 1)
        last = s.next_observations[:, -1, 0, 0].astype(int) % 100 - K
        for t0, t1, ret in zip(first.tolist(), last.tolist(), s.rewards.tolist(), strict=True):
            window = range(t0, t1 + 1)
            assert 1 <= len(window) <= 3 and set(window) <= set(kept), (lost, t0, t1)
            assert ret == sum(2.0**t for t in window)
        assert set(first.tolist()) == set(kept[:-2])  # every closed window drawn


def test_a_message_without_new_frames():
    pool = core.FramePool(SHAPE, np.uint8)
    refs = [pool.push(np.full(SHAPE, v, np.uint8)) for v in range(5)]
    obs, nxt = pool.lazy(refs[:4], layout="stack"), pool.lazy(refs[1:], layout="stack")
    rb = ReplayBuffer(10, seed=0)
    receiver = Receiver(rb, frame_shape=SHAPE)
    sender = Sender(stream=receiver.open(), compress=True)
    sender.add(obs, 0, 1.0, nxt, False, False)
    assert receiver.ingest(sender.flush()) == 1
    sender.add(nxt, 1, 0.0, nxt, True, False)  # a no-op step: every frame already kept
    msg = sender.flush()
    assert (msg["carry"], len(msg["sizes"])) == (4, 0)
    assert receiver.ingest(msg) == 1
    s = rb.sample(8)
    ended = s.next_observations[s.dones == 1]
    assert len(ended) > 0
    np.testing.assert_array_equal(ended, np.broadcast_to(np.asarray(nxt), ended.shape))


def _child_sender(queue, steps, num_envs, seed, stream, flush, stop_after):
    """A sender in another process; after ``stop_after`` messages it stalls (to be killed)."""
    sender = Sender(num_envs=num_envs, stream=stream, compress=True)
    sent = 0
    for t, (*step, extras) in enumerate(vector_run(steps, num_envs, seed), 1):
        sender.add(*step, **extras)
        if t % flush == 0 or t == steps:
            queue.put(sender.flush())
            sent += 1
            if sent == stop_after:
                queue.put("stalled")
                multiprocessing.Event().wait()  # never set
    queue.put(None)


@pytest.mark.parametrize("stop_after", [None, 2])
def test_a_sender_in_another_process(stop_after):
    """Messages cross a process boundary; a sender killed mid-stream leaves whole messages."""
    steps, num_envs, flush = 40, 2, 10
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    remote = ReplayBuffer(200, num_envs=num_envs, seed=3, pool=core.FramePool(SHAPE, np.uint8))
    receiver = Receiver(remote)
    stream = receiver.open(num_envs)
    args = (queue, steps, num_envs, 9, stream, flush, stop_after)
    child = ctx.Process(target=_child_sender, args=args, daemon=True)
    child.start()
    try:
        while (msg := queue.get(timeout=120)) not in (None, "stalled"):
            receiver.ingest(msg)
        if msg == "stalled":
            child.kill()  # a dead sender: its stream just stops
    finally:
        child.join(timeout=60)
    done = steps if stop_after is None else stop_after * flush
    local = ReplayBuffer(200, num_envs=num_envs, seed=3)
    for *step, extras in vector_run(steps, num_envs, 9)[:done]:
        local.add(*step, **extras)
    assert len(remote) == done * num_envs
    assert_same_buffers(local, remote)


def test_pickle_protocol_5_keeps_shared_frames_shared():
    pool = core.FramePool((84, 84), np.uint8)
    refs = [pool.push(np.full((84, 84), v, np.uint8)) for v in range(35)]
    obs = [pool.lazy(refs[i : i + 4], layout="stack") for i in range(32)]
    batch = pool.lazy_batch([o.slots for o in obs])
    frame = 84 * 84
    for x in (obs, batch):
        inband = pickle.dumps(x, protocol=5)
        assert 35 * frame < len(inband) < 36 * frame  # 35 frames, not 128
        buffers = []
        head = pickle.dumps(x, protocol=5, buffer_callback=buffers.append)
        assert len(buffers) == 35  # one out-of-band buffer per frame
        assert len(head) < frame // 2  # the frames are not in the stream
        back = pickle.loads(head, buffers=buffers)
        np.testing.assert_array_equal(np.asarray(back if x is batch else back[31]),
                                      np.asarray(batch if x is batch else obs[31]))  # fmt: skip
        slots = np.asarray([o.slots for o in back]) if x is obs else back.slots
        assert np.unique(slots).size == 35
