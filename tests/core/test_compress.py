"""Compressed pools (docs/COMPRESSION.md): values bit-exact as uncompressed, hot/cold, container."""

import numpy as np
import pytest
from conftest import recorded, refused, run

from lazyframes import _core as core

LAYOUTS = ("last", "first", "stack")
K = 4


class Store:
    """A table fed as a wrapper feeds a buffer: row t holds obs t's K frames, then obs t+1's new."""

    def __init__(self, frames, starts, compress, shape=None):
        self.shape = frames.shape[1:] if shape is None else shape
        self.pool = core.FramePool(self.shape, frames.dtype, compress=compress)
        starts, n = {int(s) for s in starts} | {0}, len(frames)
        trans = [t for t in range(n - 1) if t + 1 not in starts]
        self.table = core.SlotTable(self.pool, len(trans), K + 1)
        self.obs, self.next = [], []
        ring, row, history = None, 0, []
        for t in range(n - 1):
            if t in starts:
                ring = [self.pool.push(frames[t].reshape(self.shape))] * K
                history = [t] * K
            if t + 1 in starts:
                continue
            ring = self._step(row, ring, frames[t + 1])
            self.obs.append(history[:])
            history = history[1:] + [t + 1]
            self.next.append(history[:])
            row += 1
        self.ring = ring  # the wrapper's frames: hot
        self.frames = frames
        self.rows = len(trans)
        self.pool.flush()  # what went cold: only the table holds it

    def _step(self, row, ring, frame):
        """Store row ``row`` (the ring's observation and ``frame``); the ring moves on."""
        new = self.pool.push(frame.reshape(self.shape))
        self.table.set([row], (self.pool.lazy_batch([ring]), self.pool.lazy_batch([[new]])))
        return ring[1:] + [new]

    def expected(self, rows, which, layout):
        idx = np.array([(self.obs if which == 0 else self.next)[r] for r in rows])
        fr = self.frames[idx].reshape(len(rows), K, *self.shape)  # (B, K, *S)
        if layout == "stack":
            return fr
        if layout == "first":
            return fr.reshape(len(rows), K * self.shape[0], *self.shape[1:])
        return np.concatenate([fr[:, j] for j in range(K)], axis=-1)

    def pairs(self, rows, **kw):
        return self.table.gather_pairs(rows, (0, K), rows, (1, K + 1), **kw)


def fitting_layouts(shape):
    """The layouts frames of ``shape`` allow: "stack", and the channel axis' concatenation."""
    if len(shape) < 3:
        return ("stack",)
    return ("last", "stack") if shape[-1] == min(shape) else ("first", "stack")


def check_values(store, rows, layouts=LAYOUTS):
    for layout in layouts:
        if layout not in fitting_layouts(store.shape):
            continue
        a, b = store.pairs(rows, layout=layout)
        assert np.array_equal(a, store.expected(rows, 0, layout))
        assert np.array_equal(b, store.expected(rows, 1, layout))
        pairs = store.table.batch_pairs(rows, (0, K), rows, (1, K + 1), layout=layout)
        a, b = pairs.numpy_pairs()
        assert np.array_equal(a, store.expected(rows, 0, layout))
        assert np.array_equal(b, store.expected(rows, 1, layout))
        g = store.table.gather(rows, 0, K, layout=layout, dtype=np.float32, scale=1 / 255)
        want = store.expected(rows, 0, layout).astype(np.float32) * np.float32(1 / 255)
        assert np.array_equal(g, want)
    batch = store.table.batch(rows, 1, K + 1)
    assert np.array_equal(np.asarray(batch), store.expected(rows, 1, "stack"))


@pytest.mark.parametrize("game", ["pong", "breakout"])
@pytest.mark.parametrize(
    "compress",
    [True, {"group": 1}, {"group": 4}, {"codec": "zstd", "level": 1}, {"codec": "lz4hc"}],
    ids=["default", "keyframes", "group4", "zstd1", "lz4hc"],
)
@pytest.mark.parametrize("channel", [-1, 0], ids=["channels_last", "channels_first"])
def test_recorded_frames_bit_exact(game, compress, channel):
    frames, starts = recorded(game)
    frames = np.expand_dims(frames, channel)[:, :] if channel < 0 else frames[:, None]
    store, plain = Store(frames, starts, compress), Store(frames, starts, False)
    # before any gather lends the pool decoding scratch
    assert store.pool.bytes_held < plain.pool.bytes_held / 4
    rng = np.random.default_rng(0)
    for _ in range(3):
        rows = rng.integers(0, store.rows, 32)
        check_values(store, rows)
        a, b = store.pairs(rows, layout="stack"), plain.pairs(rows, layout="stack")
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    check_values(store, np.arange(store.rows), ("stack",))
    # every frame but the wrapper's ring is compressed, once
    st = store.pool.stats()
    assert st["cold_frames"] == st["live_frames"] - K and st["hot_frames"] == K
    assert st["cold_bytes"] < st["cold_frames"] * store.pool.frame_bytes / 4
    if compress is True and game == "pong":  # the order of docs/COMPRESSION.md's table
        assert store.pool.compression == {"codec": "zstd", "level": 1, "group": 8}
        assert st["cold_bytes"] / st["cold_frames"] < 400


def noise(n, seed=0, shape=(16, 12)):
    return np.random.default_rng(seed).integers(0, 256, (n, *shape), dtype=np.uint8)


def one_pixel(n, shape=(16, 12)):
    base = np.full(shape, 7, np.uint8)
    out = np.repeat(base[None], n, axis=0)
    for i in range(n):
        out[i].flat[(i * 5) % base.size] = 200 + i % 50
    return out


def mixed(n, shape=(100, 100)):
    """Noise frames of 10 KB (blobs too large for the pool's slabs) between small deltas."""
    frames = one_pixel(n, shape)
    frames[::7] = noise(len(frames[::7]), shape=shape)
    return frames


@pytest.mark.parametrize(
    "kind", [noise, one_pixel, lambda n: np.zeros((n, 16, 12), np.uint8), mixed]
)
@pytest.mark.parametrize("group", [1, 3, 16])
def test_synthetic_frames(kind, group):
    store = Store(kind(60), [0, 17, 18, 40], {"group": group})
    check_values(store, np.arange(store.rows))
    assert store.pool.stats()["cold_frames"] == store.pool.live_frames - K


@pytest.mark.parametrize("group", [2, 4, 5])
def test_episode_boundaries_at_every_position_of_a_group(group):
    """Episodes of every length from 2 to 2 * group + 1: a boundary at each position."""
    lengths = list(range(2, 2 * group + 2))
    starts = np.cumsum([0] + lengths)[:-1]
    frames = noise(sum(lengths), seed=group, shape=(6, 5, 2))
    frames[1::3] = frames[0::3][: len(frames[1::3])]  # repeats: deltas of zeros
    store = Store(frames, starts, {"group": group})
    check_values(store, np.arange(store.rows))


def test_deep_chains_decode_within_a_group():
    """A long episode of one-pixel changes: chains of ``group`` frames and the root."""
    frames = one_pixel(200, shape=(9, 9))
    store = Store(frames, [0], {"group": 64})
    rows = np.arange(store.rows)[::-1]  # the newest first: no decode reuses an earlier one
    check_values(store, rows, ("stack",))
    for r in (0, 63, 64, 65, 127, 150):
        assert np.array_equal(store.table.batch([r], 0, K)[0].get_frame(K - 1), frames[r])
    chains = [len(store.pool._chain(s)) for s in store.table.ids().ravel()]
    assert max(chains) == 65  # position 63 of a group: 64 blobs, + the root


def test_a_frame_equal_to_the_one_before_is_an_empty_patch_on_it():
    """Static screens: a run of equal frames costs no blob bytes, adds one blob to a chain.

    Each repeat is an alias, an empty patch at the position of the frame it repeats, so
    the frames after the run keep their group and its chain lengths.
    """
    distinct = one_pixel(140, shape=(9, 9))
    runs = np.array([1 + 5 * (i % 3 == 1) for i in range(140)])  # every third frame 6 times
    runs[-K - 1 :] = 1  # the frames held hot at the end (the ring's) are the same
    frames = np.repeat(distinct, runs, axis=0)
    store = Store(frames, [0], {"group": 64})
    pool = store.pool
    check_values(store, np.arange(store.rows)[::-1], ("stack",))
    plain = Store(distinct, [0], {"group": 64})
    assert pool.stats()["cold_bytes"] == plain.pool.stats()["cold_bytes"]  # repeats: 0 bytes
    # row r's last entry is frame r + 1; which distinct frame, and whether a repeat
    of = np.repeat(np.arange(len(distinct)), runs)[1:]
    repeat = np.r_[False, of[1:] == of[:-1]]
    chain = [len(pool._chain(s)) for s in store.table.ids()[:, K]]
    plain_chain = [0] + [len(plain.pool._chain(s)) for s in plain.table.ids()[:, K]]
    assert [c for c, r in zip(chain, repeat, strict=True) if not r] == plain_chain[1:]
    assert all(c <= plain_chain[d] + 1 for c, d, r in zip(chain, of, repeat, strict=True) if r)
    keys = Store(frames, [0], {"group": 1})  # every frame its own keyframe: no alias either
    assert {len(keys.pool._chain(s)) for s in keys.table.ids()[: -K - 1, K]} == {1}
    check_values(keys, np.arange(keys.rows)[::7], ("stack",))


def test_a_frame_equal_to_one_shortly_before_is_an_alias_of_it():
    """Flicker: a frame equal to one of the 4 frames before it is an alias of that frame.

    It decodes as a copy of that frame (its chain is that frame's, plus itself) and the
    frame after it is coded against it; a frame repeated from further back is a patch
    against the frame before it, as any other.
    """
    distinct, frames, back = one_pixel(100, shape=(9, 9)), [], []
    for i in range(100):
        frames.append(distinct[i])
        back.append(0)
        if i % 6 == 5:  # a repeat from 2, 3, 4 or 5 frames back
            back.append(2 + (i // 6) % 4)
            frames.append(frames[-back[-1]])
    frames = np.array(frames)
    store = Store(frames, [0], {"group": 64})
    check_values(store, np.arange(store.rows)[::-1], ("stack",))
    ids = store.table.ids()
    pool, slot = store.pool, [ids[0, 0], *ids[:, K].tolist()]  # frame t's slot
    same = []  # the slot frame t decodes as
    for t, d in enumerate(back[: -K - 1]):
        chain = pool._chain(slot[t])
        if d in (2, 3, 4):
            assert chain[1:] == pool._chain(same[t - d]), t
        elif t:  # a patch on the frame before it, or a keyframe on the root (frame 0)
            assert chain[1] == same[t - 1] or chain[1:] == [slot[0]], t
        same.append(same[t - d] if d in (2, 3, 4) else slot[t])
    assert sum(d == 5 for d in back[: -K - 1]) > 2


def test_keyframes_are_coded_against_a_raw_root_renewed_every_8192_frames():
    """A pool's first keyframe is its root, stored raw; later keyframes are patches on it.

    8192 frames on (128 groups of 64), a keyframe becomes the next root.
    """
    n, fb = 8192 + 300, 9 * 9
    frames = one_pixel(n, shape=(9, 9))
    store = Store(frames, [0], {"group": 64})
    pool, ids = store.pool, store.table.ids()[: n - 2 * K, K - 1]  # frame r's slot: cold
    chains = [pool._chain(s) for s in ids]
    first, second = int(ids[0]), int(ids[8192])
    assert sorted({c[-1] for c in chains}) == sorted([first, second])
    assert pool._chain(first) == [first]
    assert all(c[-1] == first for c in chains[:8192]) and chains[8192] == [second]
    assert all(len(c) == 2 for c in chains[64:8192:64])  # a keyframe: a patch on the root
    # a root costs its frame's bytes; a patch of one pixel, a few bytes
    assert 2 * fb < pool.stats()["cold_bytes"] < 2 * fb + 10 * len(frames)
    check_values(store, np.arange(store.rows)[::97], ("stack",))


def test_frames_others_hold_stay_hot():
    pool = core.FramePool((8, 8), np.uint8, compress=True)
    table = core.SlotTable(pool, 5, 1)
    assert table.memory() == 5 * 1 * 4 and table.ids().dtype == np.int64  # int32 ids, as given
    frames = noise(4, shape=(8, 8))

    refs = [pool.push(f) for f in frames]
    held = pool.lazy([refs[0]], layout="stack")  # a policy's observation
    table.set([0, 1, 2, 3], (pool.lazy_batch([[r] for r in refs]),))
    st = pool.stats()
    assert (st["hot_frames"], st["cold_frames"]) == (4, 0)  # the FrameRefs hold them
    del refs
    assert pool.stats()["cold_frames"] == 0  # queued: compressed at the next set, or flush
    pool.flush()
    st = pool.stats()
    assert (st["hot_frames"], st["cold_frames"]) == (1, 3)  # frame 0: the LazyFrames holds it
    assert pool._chain(table.ids([0])[0, 0]) == []
    assert np.array_equal(np.asarray(held)[0], frames[0])
    del held
    table.set([4], (pool.push_batch(np.zeros((1, 8, 8), np.uint8)),))  # a set compresses too
    st = pool.stats()
    assert (st["hot_frames"], st["cold_frames"]) == (1, 4)  # the newest frame is hot
    assert np.array_equal(table.gather([0, 1, 2, 3], 0, 1, layout="stack")[:, 0], frames)
    assert np.array_equal(pool.get(table.ids([2])[0, 0]), frames[2])
    gathered = table.batch([0, 1, 2, 3], 0, 1)  # owners of cold frames: they stay cold
    pool.flush()
    assert pool.stats()["cold_frames"] == 5
    assert np.array_equal(np.asarray(gathered)[:, 0], frames)


def test_gathers_in_threads_while_the_table_changes():
    """Readers decode without the GIL while another thread writes, compresses and frees."""
    import threading

    frames, starts = recorded("pong")
    store = Store(frames, starts, True)
    half = store.rows // 2
    want, errors = store.pairs(np.arange(half), layout="stack"), []

    def read():
        rng = np.random.default_rng(threading.get_ident() % 1000)
        for _ in range(40):
            rows = rng.integers(0, half, 32)
            got = store.pairs(rows, layout="stack")
            if not all(np.array_equal(g, w[rows]) for g, w in zip(got, want, strict=True)):
                errors.append(rows)

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    pool, table = store.pool, store.table
    for i in range(120):  # rows of the second half: new frames, old ones dropped
        row = half + i % (store.rows - half)
        new = pool.push_batch(frames[(i * 7) % len(frames)][None], k=K + 1)
        table.set([row], (new,))
    for t in readers:
        t.join()
    assert not errors


def test_gathers_in_threads_while_the_pool_grows():
    """A copy of pinned cold rows decodes without the GIL while pushes grow the chunk table."""
    import threading

    frames = recorded("pong")[0]
    n, rows_per_round = len(frames), 600
    for rnd in range(8):  # one frame a chunk: the table is reallocated at each power of two
        pool = core.FramePool((84, 84), np.uint8, chunk_bytes=84 * 84, compress={"group": 4})
        table = core.SlotTable(pool, rows_per_round, K + 1)
        ring = [pool.push(frames[j]) for j in range(K)]
        written, stop = [0], threading.Event()
        errors = []

        def read(written=written, table=table, stop=stop, errors=errors, rnd=rnd):
            rng = np.random.default_rng(rnd)
            while not stop.is_set():
                if written[0] < 2:
                    continue
                rows = rng.integers(0, written[0], 32)
                pairs = table.batch_pairs(rows, (0, K), rows, (1, K + 1))  # pinned
                a, b = pairs.numpy_pairs()  # then copied, the GIL released
                want = frames[(rows[:, None] + np.arange(K + 1)) % n]
                if not (np.array_equal(a, want[:, :K]) and np.array_equal(b, want[:, 1:])):
                    errors.append(rows)

        reader = threading.Thread(target=read)
        reader.start()
        for i in range(rows_per_round):  # row i: frames i .. i + K (mod n)
            new = pool.push(frames[(i + K) % n])
            table.set([i], (pool.lazy_batch([[r.slot for r in ring] + [new.slot]]),))
            ring = ring[1:] + [new]
            written[0] = i + 1
        stop.set()
        reader.join()
        assert not errors and pool.stats()["cold_frames"] > rows_per_round // 2


def test_enable_compression():
    pool = core.FramePool((6, 4), np.uint8)
    assert pool.compression is None
    frames = noise(30, shape=(6, 4))
    refs = [pool.push(f) for f in frames]  # live frames: converted in place
    pool.enable_compression()
    pool.enable_compression(True)  # idempotent
    pool.enable_compression({"codec": "zstd"})  # the same options
    assert pool.compression == {"codec": "zstd", "level": 1, "group": 8}
    refused(ValueError, "already compresses", pool.enable_compression, {"group": 2})
    table = core.SlotTable(pool, 29, 2)
    table.set(np.arange(29), (pool.lazy_batch([[refs[i], refs[i + 1]] for i in range(29)]),))
    del refs
    pool.flush()
    got = table.gather(np.arange(29), 0, 2, layout="stack")
    assert np.array_equal(got[:, 0], frames[:29]) and np.array_equal(got[:, 1], frames[1:])
    assert pool.stats()["cold_frames"] == 30


def test_frames_over_a_mebibyte_compress_and_free():
    """Blobs of 1 MiB and more (their size kept beside them), a root of such a frame.

    Values exact, and the cold bytes counted back to zero when the frames go.
    """
    shape = (1100, 1000)  # 1.05 MiB: incompressible noise makes blobs larger than that
    pool = core.FramePool(shape, np.uint8, compress={"group": 4})
    frames = noise(6, shape=shape)
    frames[3] = frames[2]  # an identical frame: a delta of a few bytes
    table = core.SlotTable(pool, 6, 1)
    table.set(np.arange(6), (pool.push_batch(frames),))
    pool.flush()
    st = pool.stats()
    assert st["cold_frames"] == 6 and st["cold_bytes"] > 5 * frames[0].nbytes
    assert np.array_equal(table.gather(np.arange(6), 0, 1, layout="stack")[:, 0], frames)
    for s, f in zip(table.ids()[:, 0], frames, strict=True):
        assert np.array_equal(pool.get(s), f)
    table.clear()
    st = pool.stats()
    assert (pool.live_frames, st["cold_frames"], st["cold_bytes"]) == (0, 0, 0)


@pytest.mark.parametrize(
    "bad, error",
    [
        ("yes", TypeError), ({"codec": "brotli"}, ValueError), ({"level": 0}, ValueError),
        ({"level": 10}, ValueError), ({"group": 0}, ValueError), ({"group": 65}, ValueError),
        ({"group": 2.0}, TypeError), ({"level": True}, TypeError), ({"speed": 1}, ValueError),
    ],
)  # fmt: skip
def test_bad_options(bad, error):
    refused(error, "", core.FramePool, (4, 4), np.uint8, compress=bad)
    pool = core.FramePool((4, 4), np.uint8)
    refused(error, "", pool.enable_compression, bad)
    assert pool.compression is None
    refused(ValueError, "needs compress=True", pool.enable_compression, False)


def test_dedup_and_get_with_cold_frames():
    """get() decodes a cold frame; dedup compares hot candidates only, values stay exact."""
    pool = core.FramePool((5, 5), np.uint8, compress={"group": 3})
    table, frames = core.SlotTable(pool, 3, 1), noise(3, shape=(5, 5))
    table.set([0, 1, 2], (pool.push_batch(frames),))
    pool.flush()
    ids = table.ids()[:, 0]
    assert all(pool._chain(s) for s in ids)
    for s, frame in zip(ids, frames, strict=True):
        assert np.array_equal(pool.get(s), frame)
    cold = table.batch([0, 1, 2], 0, 1)
    live = pool.live_frames
    new = pool._push_dedup(frames[:, None], cold)
    assert np.array_equal(np.asarray(new)[:, 0], frames)
    assert pool.live_frames == live + 3
    again = pool._push_dedup(frames[:, None], new)  # hot candidates: deduplicated
    assert pool.live_frames == live + 3
    assert np.array_equal(np.asarray(again)[:, 0], frames)


@pytest.mark.parametrize("group", [1, 4, 16])
def test_take_loads_and_compresses(group):
    """A checkpoint's load: take() from one LazyBatch of frames, then the frames go cold."""
    frames = recorded("breakout")[0][:60]
    n = len(frames) - K
    pool = core.FramePool((84, 84), np.uint8, compress={"group": group})
    table = core.SlotTable(pool, n, K + 1)
    index = np.arange(n)[:, None] + np.arange(K + 1)  # row r: frames r .. r + K
    table.take(np.arange(n), pool.push_batch(frames), index)
    pool.flush()
    st = pool.stats()
    assert st["cold_frames"] == st["live_frames"] == len(frames)
    # groups of `group` frames, each a chain: position p decodes from p + 1 blobs, + the
    # root for the groups after the first (whose keyframe is the root)
    longest = max(len(pool._chain(s)) for s in table.ids().ravel())
    assert longest == min(group, len(frames)) + (len(frames) > group > 1)
    a, b = table.gather_pairs(np.arange(n), (0, K), np.arange(n), (1, K + 1), layout="stack")
    assert np.array_equal(a, frames[index[:, :K]]) and np.array_equal(b, frames[index[:, 1:]])


@pytest.mark.parametrize("group", [1, 5, 16])
def test_container_roundtrip(group):
    frames, _ = recorded("pong")
    payload, offsets, kinds = core.encode_frames(frames[:50], group=group)
    assert offsets.dtype == np.int64 and offsets.shape == (51,) and kinds.shape == (50,)
    assert offsets[-1] == len(payload)
    got = core.decode_frames(payload, offsets, kinds, (84, 84), np.uint8)
    assert np.array_equal(got, frames[:50])
    # a keyframe per group (Pong's deltas always pay), the others patches or XOR blobs
    assert (kinds == core.KIND_KEY).tolist() == [i % group == 0 for i in range(50)]
    assert set(kinds[kinds != core.KIND_KEY].tolist()) <= {core.KIND_PATCH, core.KIND_XOR}
    assert len(payload) < frames[:50].nbytes / 8
    empty = core.encode_frames(np.zeros((0, 3), np.uint8))
    assert core.decode_frames(*empty, (3,), np.uint8).shape == (0, 3)


def test_container_keyframes_take_zstd_only_where_it_saves_128_bytes():
    """With zstd, a container's keyframe is LZ4's blob unless zstd's is 128 bytes smaller.

    A container has no root, so its keyframes are codec blobs, and a pool adopts them as
    they are: LZ4 keeps them as fast to decode as a pool's own keyframes.
    """
    frames, _ = recorded("pong")
    noisy = frames[:64].copy()
    noisy[32:, :40] = np.random.default_rng(0).integers(0, 2, (32, 40, 84))  # random bits
    for fr in (frames[:64], noisy):
        lz4 = core.encode_frames(fr, codec="lz4", level=9, group=1)
        zstd = core.encode_frames(fr, codec="zstd", level=1, group=1)
        assert np.array_equal(core.decode_frames(*zstd, (84, 84), np.uint8), fr)
        a, b = np.diff(lz4[1]), np.diff(zstd[1])
        assert ((b == a) | (b + 128 <= a)).all() and (b[:32] == a[:32]).all()
    assert (b[32:] + 128 <= a[32:]).all()  # random bits: zstd's entropy coding pays


def test_a_container_decodes_piece_by_piece_from_the_group_before():
    frames, _ = recorded("pong")
    payload, offsets, kinds = core.encode_frames(frames[:50], group=16)
    for cut in (1, 16, 21, 37):  # a delta first: decoded from the frames of its group before
        key = cut // 16 * 16 if cut % 16 else cut - 16
        o = offsets[cut:] - offsets[cut]
        got = core.decode_frames(payload[offsets[cut] :], o, kinds[cut:], (84, 84), np.uint8,
                                 before=frames[key:cut])  # fmt: skip
        assert np.array_equal(got, frames[cut:50])
    piece = payload[offsets[21] :], offsets[21:] - offsets[21], kinds[21:], (84, 84), np.uint8
    refused(ValueError, "blob 0 .* no frame to apply to", core.decode_frames, *piece)
    refused(ValueError, "before must be 1 to 64 frames", core.decode_frames, payload, offsets,
            kinds, (84, 84), np.uint8, before=frames[:0])  # fmt: skip


def test_adopted_blobs_are_stored_as_they_came_and_bad_ones_change_nothing():
    frames, _ = recorded("pong")
    payload, offsets, kinds = core.encode_frames(frames[:80], group=16, keys=[40])
    assert np.flatnonzero(kinds == core.KIND_KEY).tolist() == [0, 16, 32, 40, 56, 72]
    pool = core.FramePool((84, 84), np.uint8, compress=True)
    batch = pool.adopt(payload, offsets, kinds)
    stats = pool.stats()
    assert (stats["cold_frames"], stats["hot_frames"], stats["pending_frames"]) == (80, 0, 0)
    assert stats["cold_bytes"] < len(payload)  # codec blobs stored lean
    assert np.array_equal(pool.gather(batch.slots, layout="stack")[:, 0], frames[:80])
    # as the pool codes its own: 1 + popcount(position in its group) blobs decode a frame
    pos = np.arange(80) - np.maximum.accumulate(np.where(kinds == core.KIND_KEY, np.arange(80), 0))
    assert [len(pool._chain(s)) for s in batch.slots[:, 0]] == [1 + bin(p).count("1") for p in pos]
    live = pool.live_frames
    for p, o, k in _corruptions(payload, offsets, kinds):
        try:
            pool.adopt(p, o, k)
        except (ValueError, TypeError):
            assert pool.live_frames == live  # refused before anything is stored
    delta = _with(kinds, 3, core.KIND_DELTA)  # read in old checkpoints only
    refused(ValueError, "blob 3 of the container does not", pool.adopt, payload, offsets, delta)
    raw = (frames[:3].tobytes(), np.arange(4) * frames[0].nbytes, np.full(3, core.KIND_RAW))
    refused(ValueError, "blob 0 of the container does not decode", pool.adopt, *raw)
    long = core.encode_frames(np.zeros((70, 84, 84), np.uint8))  # keyframes at 0 and 64
    refused(ValueError, "blob 64 ", pool.adopt, *long[:2], _with(long[2], 64, core.KIND_PATCH))
    assert pool.live_frames == live
    refused(ValueError, "needs a compressing pool", core.FramePool((84, 84), np.uint8).adopt,
            payload, offsets, kinds)  # fmt: skip


def _blob(frame, **kw):
    """The codec blob of one frame (a keyframe's), as bytes."""
    return core.encode_frames(frame[None], **kw)[0]


HOSTILE = """
import numpy as np, lazyframes._core as core
f = np.zeros((1, 8, 8), np.uint8); f[0, 0, 0] = 1
h = bytearray(core.encode_frames(f)[0])
uninit = bytes(h[:12]) + (32).to_bytes(4, "little") + bytes(15) + b"\\x40"  # writes nothing
h[2], h[22] = h[2] & 0x1F | 6 << 5, 36  # a plugin codec: Blosc2 would start python to find it
for blob in (uninit, bytes(h)):
    for call in (lambda o: core.FramePool((8, 8), np.uint8, compress=True).adopt(blob, o, [0]),
                 lambda o: core.decode_frames(blob, o, [0], (8, 8), np.uint8)):
        try:
            call([0, len(blob)])
        except ValueError:
            print("refused")
"""


def test_only_chunks_our_codec_makes_are_decoded(tmp_path, monkeypatch):
    """An UNINIT chunk (no bytes written) or one naming a plugin codec is refused, at once."""
    for name in ("python", "python3"):  # what Blosc2 would start, looking for a plugin
        (tmp_path / name).write_text(f"#!/bin/sh\ntouch {tmp_path}/started\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    r = run("-c", HOSTILE)
    assert r.stdout.split() == ["refused"] * 4, r.stderr
    assert not (tmp_path / "started").exists()


def test_legacy_deltas_take_group_positions_and_empty_patches_decode():
    frames = np.random.default_rng(0).integers(0, 4, (6, 8, 8)).astype(np.uint8)
    xor = [_blob(frames[i] ^ frames[i - 1]) for i in range(1, 5)]  # KIND_DELTA blobs
    patch = core.encode_frames(frames[4:6], group=2)[0][len(_blob(frames[4], group=2)) :]
    blobs = [_blob(frames[0]), *xor, patch]  # frame 5 at position 5: a patch of frame 4
    kinds = [core.KIND_KEY, *[core.KIND_DELTA] * 4, core.KIND_PATCH]
    offsets = np.cumsum([0, *map(len, blobs)])
    args, shape = (b"".join(blobs), offsets, kinds), ((8, 8), np.uint8)
    assert np.array_equal(core.decode_frames(*args, *shape), frames)
    cut = (args[0][offsets[5] :], offsets[5:] - offsets[5], kinds[5:])  # the last piece alone
    assert np.array_equal(core.decode_frames(*cut, *shape, before=frames[:5])[0], frames[5])
    same = core.decode_frames(b"", [0, 0], [core.KIND_PATCH], *shape, before=frames[:1])
    assert np.array_equal(same[0], frames[0])  # a piece of empty patches: an empty payload
    big = np.zeros(8 * 8 + 33, np.uint8)  # larger than any blob of a frame: refused by both
    refused(ValueError, "larger than any", core.decode_frames, big, [0, big.size], [3], *shape)
    # a delta first, no frames before: refused, no pointer formed
    for kind in (core.KIND_PATCH, core.KIND_PACKED, core.KIND_PACKED_BLOSC, core.KIND_XOR):
        refused(ValueError, "blob 0 .* does not decode",
                core.decode_frames, patch, [0, len(patch)], [kind], *shape)  # fmt: skip


def _with(a, i, value):
    """A copy of array ``a`` with ``a[i] = value``."""
    a = a.copy()
    a[i] = value
    return a


def _corruptions(payload, offsets, kinds):
    n = len(kinds)
    yield payload[:-1], offsets, kinds  # truncated
    yield payload, offsets[:-1], kinds  # offsets too short
    yield payload, offsets[::-1], kinds  # decreasing
    yield payload, _with(offsets, 1, offsets[2]), kinds  # an empty blob
    wraps = _with(offsets.astype(np.uint64), 1, np.uint64(2**64 - 1))
    yield payload, wraps, kinds  # wraps if converted carelessly
    yield payload, offsets, _with(kinds, 0, 1)  # a delta first
    yield payload, offsets, _with(kinds, 3, 7)  # an unknown kind
    yield payload, offsets, _with(kinds, 2, 2)  # raw, of the wrong size
    yield payload, offsets.astype(np.float64), kinds  # not integers
    yield "not bytes", offsets, kinds
    yield payload, _with(offsets, n // 2, offsets[n // 2] + 1), kinds  # blobs split wrongly
    for at in range(40):  # each header byte of the first blob, and some payload
        q = bytearray(payload)
        q[at] ^= 0xFF
        yield bytes(q), offsets, kinds


def test_corrupted_containers_and_bad_frames_raise():
    frames = noise(12, shape=(10, 10))
    frames[6:] = frames[5]  # deltas of zeros: the shortest blobs
    payload, offsets, kinds = core.encode_frames(frames, group=4)  # compressed blobs
    for p, o, k in _corruptions(payload, offsets, kinds):
        try:
            out = core.decode_frames(p, o, k, (10, 10), np.uint8)
        except (ValueError, TypeError):
            continue
        assert out.shape == frames.shape  # a payload byte flipped: other values, no crash
    refused(ValueError, "leading axis", core.encode_frames, np.uint8(3))  # and bad frames
    refused(TypeError, "", core.encode_frames, np.array([["a"]], object))
    refused(ValueError, "group must be in", core.encode_frames, np.zeros((2, 2), np.uint8), group=0)
