"""ReplayBuffer checkpoints: golden files of every format version, and untrusted input.

``tests/data/replay_v1_*.npz`` were written by lazyframes before format version 2 (by
the recipes :func:`v1_wrapped` and :func:`v1_partial` below, and an empty
``ReplayBuffer(4, seed=1)``); ``replay_v2_streams.npz`` by :func:`v2_streams`;
``replay_v3_compressed.npz`` (frames as a compressed container) by the compiled core
from :func:`v3_compressed`. Each must load to the buffer its recipe builds today.
Crafted files (deflate bombs, decompression bombs, huge declared sizes, forged offsets
and kinds, wrong dtypes and shapes) must be refused with a ValueError, quickly and
without allocating more than a small multiple of the file.
"""

import io
import json
import os
import time
import tracemalloc
import zipfile

import numpy as np
import pytest
from conftest import IMPLS, ROOT, core

from lazyframes.replay import ReplayBuffer

DATA = os.path.join(ROOT, "tests", "data")


def golden(name):
    return os.path.join(DATA, name)


def v1_wrapped():
    """Two envs, n_step 3, wrapped; flags of every kind; ndarray observations."""
    rb = ReplayBuffer(8, num_envs=2, n_step=3, gamma=0.5, seed=7, action_dtype=np.int16)

    def ob(t, e):  # 3 frames of (2, 3) uint8: frame value t + i + 10 e
        return np.stack([np.full((2, 3), t + i + 10 * e, np.uint8) for i in range(3)])

    for t in range(6):
        rb.add(
            np.stack([ob(t, 0), ob(t, 1)]),
            [t, -t],
            [t + 0.5, -t - 0.25],
            np.stack([ob(t + 1, 0), ob(t + 1, 1)]),
            [t == 2, False],
            [False, t == 4],
            autoreset=[False, t == 5],
        )
    rb.sample(2)  # the saved RNG state is not the seed's
    return rb


def v1_partial():
    """One env, not full, float actions of shape (2,), layout "last"."""
    rb = ReplayBuffer(
        6, seed=3, action_shape=(2,), action_dtype=np.float32, layout="last", stack_size=2
    )
    for t in range(3):
        obs = np.concatenate([np.full((2, 2, 1), t + i, np.uint8) for i in range(2)], axis=-1)
        nxt = np.concatenate([np.full((2, 2, 1), t + 1 + i, np.uint8) for i in range(2)], -1)
        rb.add(obs, [t, 0.5 * t], 1.0, nxt, t == 2, False)
    return rb


def v2_streams():
    """Three streams added asynchronously (env_ids), n_step 2, wrapped."""
    rb = ReplayBuffer(6, num_envs=3, n_step=2, gamma=0.5, seed=9)
    order = [[2], [0, 1], [1], [2, 0], [0], [1, 2], [1]]
    t = [0, 0, 0]
    for ids in order:
        obs = np.stack([np.full((2, 4, 4), 16 * e + t[e], np.uint8) for e in ids])
        for e in ids:
            t[e] += 1
        nxt = np.stack([np.full((2, 4, 4), 16 * e + t[e], np.uint8) for e in ids])
        rb.add(obs, ids, [e + 0.25 * t[e] for e in ids], nxt, [t[e] == 3 for e in ids],
               [False] * len(ids), env_ids=ids)  # fmt: skip
    rb.sample(3)
    return rb


def v3_compressed():
    """Two envs of recorded Pong frames, compressed in groups of 4, n_step 2, wrapped."""
    with np.load(golden("pong.npz")) as d:
        frames = d["frames"]
    rb = ReplayBuffer(24, num_envs=2, n_step=2, gamma=0.5, seed=5, compress={"group": 4})
    for t in range(15):
        obs = np.stack([frames[80 * e + t : 80 * e + t + 4] for e in range(2)])
        nxt = np.stack([frames[80 * e + t + 1 : 80 * e + t + 5] for e in range(2)])
        rb.add(obs, [t % 6, 5 - t % 6], [t, -t], nxt, [t == 9, False], [False, t == 12])
    rb.sample(4)
    return rb


def contents(rb):
    """Everything a checkpoint restores, as plain values."""
    n = len(rb)
    st = {
        "repr": repr(rb),
        "pos": rb._pos,
        "full": rb._full,
        "n_skip": rb._n_skip,
        "actions": rb._actions[:n].tolist(),
        "rewards": rb._rewards[:n].tolist(),
        "flags": rb._flags[:n].tolist(),
        "env": rb._env[:n].tolist(),
        "next": rb._next[:n].tolist(),
        "last": rb._last.tolist(),
        "rng": rb._rng.bit_generator.state,
    }
    if n:
        k = rb._k
        st["obs"] = rb._table.gather(np.arange(n), 0, k, layout="stack").tolist()
        st["next_obs"] = rb._table.gather(np.arange(n), k, 2 * k, layout="stack").tolist()
    return st


@pytest.mark.parametrize(
    "name,recipe",
    [
        ("replay_v1_wrapped.npz", v1_wrapped),
        ("replay_v1_partial.npz", v1_partial),
        ("replay_v1_empty.npz", lambda: ReplayBuffer(4, seed=1)),
        ("replay_v2_streams.npz", v2_streams),
        ("replay_v3_compressed.npz", v3_compressed),
    ],
)
def test_golden_files_load_to_what_their_recipe_builds(impl, name, recipe):
    pool = None
    rb = ReplayBuffer.load(golden(name))
    want = recipe()
    if rb.pool is not None:
        pool = impl.FramePool(rb.pool.frame_shape, rb.pool.dtype)
        rb = ReplayBuffer.load(golden(name), pool=pool)
        assert rb.pool is pool
    assert contents(rb) == contents(want)
    assert rb.memory()["compression"] == want.memory()["compression"]
    if len(rb):
        for x, y in zip(rb.sample(5), want.sample(5), strict=True):
            np.testing.assert_array_equal(x, y)


def test_golden_v1_exact_values():
    """The v1 ring: position ``row * 2 + env`` holds env's transition of step t = row+4k."""
    rb = ReplayBuffer.load(golden("replay_v1_wrapped.npz"))
    assert (rb._pos, rb._full, len(rb), rb.n_step, rb.gamma) == (4, True, 8, 3, 0.5)
    assert rb._actions.tolist() == [4, -4, 5, -5, 2, -2, 3, -3]
    assert rb._rewards.tolist() == [4.5, -4.25, 5.5, -5.25, 2.5, -2.25, 3.5, -3.25]
    assert rb._flags.tolist() == [0, 2, 0, 4, 1, 0, 0, 0]
    assert rb._env.tolist() == [0, 1] * 4
    assert rb._next.tolist() == [2, 3, -1, -1, 6, 7, 0, 1] and rb._last.tolist() == [2, 3]
    frames = rb._table.gather(np.arange(8), 0, 3, layout="stack")[:, :, 0, 0]
    assert frames[:, 0].tolist() == [4, 14, 5, 15, 2, 12, 3, 13]
    s = rb.sample(64)
    # position 6 (env 0, t=3): rewards 3.5 + 0.5 * 4.5 + 0.25 * 5.5, window complete
    i = s.indices.tolist().index(6)
    assert (s.rewards[i], s.discounts[i], s.dones[i]) == (3.5 + 2.25 + 1.375, 0.125, 0.0)
    # env 0's two newest windows (positions 0, 2) are open; 3 is an autoreset placeholder
    assert set(s.indices.tolist()) == {1, 4, 5, 6, 7}


def test_v2_round_trip_of_interleaved_streams(impl, tmp_path):
    rb = v2_streams()
    rb.save(tmp_path / "rb.npz")
    back = ReplayBuffer.load(tmp_path / "rb.npz")
    assert contents(back) == contents(rb)
    with zipfile.ZipFile(tmp_path / "rb.npz") as zf:
        meta = json.loads(str(np.load(io.BytesIO(zf.read("meta.npy")))[()]))
    assert meta["version"] == 3


# -- crafted files ----------------------------------------------------------------------


def entries(path):
    """The members of a checkpoint: name -> bytes."""
    with zipfile.ZipFile(path) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist()}


def npy(arr):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asarray(arr), allow_pickle=False)
    return buf.getvalue()


def npy_header(shape, dtype):
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
              "shape": shape})  # fmt: skip
    return buf.getvalue()


def craft(path, members, compression=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def with_meta(members, **changes):
    meta = json.loads(str(np.load(io.BytesIO(members["meta.npy"]))[()]))
    meta.update(changes)
    return {**members, "meta.npy": npy(np.array(json.dumps(meta)))}


def assert_refused_quickly(path, match):
    """``load`` raises ValueError(match) in under 2 s, allocating < 16x the file + 4 MiB."""
    size = os.path.getsize(path)
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(ValueError, match=match):
            ReplayBuffer.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - t0 < 2.0
    assert peak < 16 * size + (4 << 20), peak


@pytest.fixture
def valid(tmp_path):
    """The members of a valid version-2 checkpoint of 6 transitions of (2, 4, 4) uint8."""
    rb = v2_streams()
    rb.save(tmp_path / "valid.npz")
    return entries(tmp_path / "valid.npz")


def test_deflate_bomb_is_refused(valid, tmp_path):
    """67M frames of zeros deflate to a few MB: a deflated member is refused unread."""
    n = 1 << 22
    bomb = npy_header((n, 4, 4), np.uint8) + bytes(16 * n)
    members = {**valid, "frames.npy": bomb}
    path = craft(tmp_path / "bomb.npz", members, zipfile.ZIP_DEFLATED)
    assert os.path.getsize(path) < 1 << 20
    assert_refused_quickly(path, "compressed")


@pytest.mark.parametrize(
    "changes,match",
    [
        ({"capacity": 2**64}, "capacity"),
        ({"capacity": 2**25 * 3}, r"'actions' has shape \(6,\) .* expected shape \(100663296,\)"),
        ({"capacity": 10**9, "num_envs": 10**9}, "num_envs"),
        ({"action_shape": [10**6, 10**6]}, "bytes of tables.*action_shape"),
        ({"stack_size": 2**40}, "stack_size"),
        ({"n_step": 10**6}, "n_step"),
        ({"capacity": "6"}, "capacity"),
        ({"pos": 10**9}, "pos"),
        ({"full": 1}, "full"),
        ({"version": 4}, "version 4 is not supported"),
        ({"format": "other"}, "wrong format tag"),
        ({"rng": {"name": "os", "state": {}}}, "bit generator"),
        ({"n_skip": 5}, "autoreset count"),
    ],
)
def test_bad_meta_is_refused(valid, tmp_path, changes, match):
    path = craft(tmp_path / "bad.npz", with_meta(valid, **changes))
    assert_refused_quickly(path, match)


@pytest.mark.parametrize(
    "name,data,match",
    [
        ("actions.npy", npy(np.zeros(6, np.float64)), "dtype float64"),
        ("actions.npy", npy(np.zeros((6, 1), np.int64)), r"shape \(6, 1\)"),
        ("actions.npy", npy_header((10**9,), np.int64) + bytes(48), r"shape \(1000000000,\)"),
        ("actions.npy", npy_header((6,), np.int64) + bytes(8), "size its header"),
        ("rewards.npy", npy(np.full(6, np.inf, np.float32)), "non-finite"),
        ("flags.npy", npy(np.full(6, 8, np.uint8)), "bad flags"),
        ("env_ids.npy", npy(np.full(6, 3, np.int32)), "env_ids out of range"),
        ("obs_index.npy", npy(np.full((6, 2), 99, np.int32)), "not in the file"),
        ("frames.npy", npy_header((10**9, 4, 4), np.uint8) + bytes(64), "size its header"),
        ("frames.npy", npy(np.zeros((3, 4, 5), np.uint8)), "frames entry has shape"),
        ("frames.npy", npy(np.zeros((10**5, 4, 4), np.uint8)), "100000 frames for 24 frame"),
        ("frames.npy", npy(np.zeros((3, 4, 4), np.int16)), "dtype int16"),
        ("extra.npy", npy(np.zeros(1)), "unexpected entries"),
        ("meta.npy", npy(np.zeros(1)), "bad meta entry"),
    ],
)
def test_bad_entries_are_refused(valid, tmp_path, name, data, match):
    path = craft(tmp_path / "bad.npz", {**valid, name: data})
    assert_refused_quickly(path, match)


def test_missing_entry_and_foreign_members_are_refused(valid, tmp_path):
    members = dict(valid)
    del members["env_ids.npy"]
    assert_refused_quickly(craft(tmp_path / "a.npz", members), "missing entry 'env_ids'")
    members = {**valid, "notes.txt": b"hi"}
    assert_refused_quickly(craft(tmp_path / "b.npz", members), "unexpected member")


def test_empty_legitimate_checkpoint_of_a_large_capacity_loads(tmp_path):
    """The capacity bound leaves room for real buffers: 1M Atari transitions, empty."""
    ReplayBuffer(1_000_000, seed=0).save(tmp_path / "big.npz")
    assert ReplayBuffer.load(tmp_path / "big.npz").capacity == 1_000_000


# -- crafted compressed containers (format 3) -------------------------------------------


@pytest.fixture
def packed():
    """The members of the v3 golden file: 32 frames of 7,056 B as a compressed container."""
    return entries(golden("replay_v3_compressed.npz"))


def member(members, name):
    return np.load(io.BytesIO(members[name + ".npy"]))


def with_blob_header(members, at, value):
    """The first blob's 4-byte header field at byte ``at`` set to ``value``."""
    blobs = member(members, "frame_blobs").copy()
    blobs[at : at + 4] = np.frombuffer(np.uint32(value).tobytes(), np.uint8)
    return {**members, "frame_blobs.npy": npy(blobs)}


def test_golden_v3_holds_compressed_frames(packed):
    kinds = member(packed, "frame_kinds")
    assert kinds.tolist() == [0, 1, 1, 1] * 8  # a keyframe, then 3 XOR deltas, per group
    assert member(packed, "frame_blobs").size < 32 * 7056 / 10
    assert "frames.npy" not in packed


@pytest.mark.parametrize(
    "name,data,match",
    [
        ("frame_blobs.npy", npy_header((10**9,), np.uint8) + bytes(64), "size its header"),
        ("frame_offsets.npy", npy_header((10**9,), np.int64) + bytes(64), "size its header"),
        ("frame_offsets.npy", npy(np.arange(200, dtype=np.int64)), r"\(200,\) for 192 ref"),
        ("frame_offsets.npy", npy(np.zeros((33, 1), np.int64)), "frame_offsets entry has shape"),
        ("frame_offsets.npy", npy(np.arange(33, dtype=np.int64)), "do not span"),
        ("frame_kinds.npy", npy(np.zeros(31, np.uint8)), r"shape \(31,\)"),
        ("frame_kinds.npy", npy(np.full(32, 7, np.uint8)), "kinds KIND_KEY/DELTA/RAW"),
        ("frame_kinds.npy", npy(np.ones(32, np.uint8)), "first blob is a delta"),
        ("frame_kinds.npy", npy(np.full(32, 2, np.uint8)), "raw blob is not 7056 bytes"),
        ("frame_kinds.npy", npy(np.zeros(32, np.float32)), "dtype float32"),
        ("frames.npy", npy(np.zeros((32, 84, 84), np.uint8)), "frames are compressed"),
        ("obs_index.npy", npy(np.full((24, 4), 32, np.int32)), "not in the file"),
    ],
)
def test_bad_containers_are_refused(packed, tmp_path, name, data, match):
    path = craft(tmp_path / "bad.npz", {**packed, name: data})
    assert_refused_quickly(path, match)


def test_forged_offsets_are_refused(packed, tmp_path):
    offsets = member(packed, "frame_offsets")
    swapped = offsets.copy()
    swapped[[3, 4]] = swapped[[4, 3]]
    path = craft(tmp_path / "a.npz", {**packed, "frame_offsets.npy": npy(swapped)})
    assert_refused_quickly(path, "must increase")
    moved = offsets.copy()
    moved[5] += 3  # blobs 4 and 5 cut in the wrong place: neither decodes
    path = craft(tmp_path / "b.npz", {**packed, "frame_offsets.npy": npy(moved)})
    assert_refused_quickly(path, "does not decode")


def test_truncated_payload_is_refused(packed, tmp_path):
    blobs = member(packed, "frame_blobs")
    offsets = member(packed, "frame_offsets")
    members = {**packed, "frame_blobs.npy": npy(blobs[:-100])}
    assert_refused_quickly(craft(tmp_path / "a.npz", members), "do not span")
    cut = np.minimum(offsets, blobs.size - 100)
    cut[-1] = blobs.size - 100  # the last blob loses its tail
    members["frame_offsets.npy"] = npy(cut)
    assert_refused_quickly(craft(tmp_path / "b.npz", members), "does not decode")


def test_unreferenced_frames_are_refused(packed, tmp_path):
    """A frame no transition refers to: 32 frames, 33 offsets, the index avoids frame 31."""
    index = member(packed, "next_index").copy()
    index[index == 31] = 30
    path = craft(tmp_path / "a.npz", {**packed, "next_index.npy": npy(index)})
    assert_refused_quickly(path, "in no transition")


@pytest.mark.parametrize("at,value", [(4, 1 << 30), (4, 7055), (12, 1 << 30)])
def test_blob_headers_declaring_other_sizes_are_refused(packed, tmp_path, at, value):
    """A decompression bomb: a blob declaring 1 GiB (or another size) of frame or blob."""
    path = craft(tmp_path / "bomb.npz", with_blob_header(packed, at, value))
    assert_refused_quickly(path, "blob 0 of the container does not decode")


def test_frames_declared_larger_than_the_file_allows_are_refused(packed, tmp_path):
    """32 frames of 64 MiB from a 13 KB file: refused before any is decoded."""
    members = with_meta(packed, frame_shape=[8192, 8192])
    assert_refused_quickly(craft(tmp_path / "bomb.npz", members), "decompression bomb")


@pytest.mark.parametrize("impl_name", IMPLS)
def test_frames_held_at_once_are_bounded(packed, tmp_path, monkeypatch, impl_name):
    """Rows load in chunks (here of 2); an index that pins every frame until the end is refused.

    The bounds are lowered to 16x the file (13 KB: 28 frames): the golden file loads in
    16 chunks, its pieces starting with deltas, and samples as before.
    """
    from lazyframes.replay import _checkpoint

    monkeypatch.setattr(_checkpoint, "_TABLE_FLOOR", 0)
    monkeypatch.setattr(_checkpoint, "_DECODE_BYTES", 2 * 7056)
    pool = core(impl_name).FramePool((84, 84), np.uint8)
    rb = ReplayBuffer.load(golden("replay_v3_compressed.npz"), pool=pool)
    want = v3_compressed()
    assert contents(rb) == contents(want)
    for x, y in zip(rb.sample(8), want.sample(8), strict=True):
        np.testing.assert_array_equal(x, y)
    index = member(packed, "obs_index").copy()
    index[:, 1] = 31  # (it is next_index[:, 0] too) every row needs the newest frame
    path = craft(tmp_path / "pin.npz", {**packed, "obs_index.npy": npy(index)})
    assert_refused_quickly(path, "would be held at once")


@pytest.mark.parametrize(
    "changes,match",
    [
        ({"compression": {"codec": "nope"}}, "codec"),
        ({"compression": 5}, "bad meta 'compression'"),
        ({"compression": None}, "the meta says the frames are not compressed"),
    ],
)
def test_bad_compression_meta_is_refused(packed, tmp_path, changes, match):
    assert_refused_quickly(craft(tmp_path / "bad.npz", with_meta(packed, **changes)), match)


def _add_steps(rb, steps, start):
    """Add ``steps`` transitions of one env: frames (2, 4, 4) valued t, t + 1."""
    for t in range(start, start + steps):
        obs = np.stack([np.full((4, 4), (t + i) % 256, np.uint8) for i in range(2)])
        nxt = np.stack([np.full((4, 4), (t + 1 + i) % 256, np.uint8) for i in range(2)])
        rb.add(obs, t % 7, 0.5 * t, nxt, t % 11 == 10, False)


def test_tiny_file_declaring_a_huge_capacity_loads_with_small_tables(impl, tmp_path):
    """Tables are sized by the file's transitions, then grow with the adds, not by capacity."""
    rb = ReplayBuffer(2**40, seed=4)
    _add_steps(rb, 3, 0)
    assert rb.memory()["table_bytes"] < 8 << 10  # 64 rows, not 2**40
    rb.save(tmp_path / "huge.npz")
    size = os.path.getsize(tmp_path / "huge.npz")
    tracemalloc.start()
    try:
        back = ReplayBuffer.load(tmp_path / "huge.npz", pool=impl.FramePool((4, 4), np.uint8))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * size + (1 << 20), peak
    assert back.capacity == 2**40 and len(back) == 3
    assert back._rows == 3 and back._table.shape == (3, 4)
    assert contents(back) == contents(rb)
    _add_steps(back, 70, 3)
    _add_steps(rb, 70, 3)
    assert back._rows == 128 and back._table.shape == (128, 4)  # doubled: 3 -> 64 -> 128
    assert back.memory()["table_bytes"] < 8 << 10
    assert contents(back) == contents(rb)
    assert back.sample(5).indices.tolist() == rb.sample(5).indices.tolist()


def test_loaded_tables_grow_up_to_the_capacity_then_evict(impl, tmp_path):
    """A loaded file of 5 of 50 transitions: adds grow its tables to 50, then wrap."""
    ref = ReplayBuffer(50, n_step=3, gamma=0.5, seed=2)
    _add_steps(ref, 5, 0)
    ref.save(tmp_path / "part.npz")
    back = ReplayBuffer.load(tmp_path / "part.npz", pool=impl.FramePool((4, 4), np.uint8))
    assert back._rows == 5
    for start in range(5, 130, 25):
        _add_steps(back, 25, start)
        _add_steps(ref, 25, start)
        assert contents(back) == contents(ref)
    assert back._rows == 50 and back.full and back._table.shape == (50, 4)
    assert back._pos == 130 % 50
    a, b = back.sample(64), ref.sample(64)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_large_capacity_costs_nothing_until_used(impl):
    rb = ReplayBuffer(10**9, num_envs=2, seed=0, pool=impl.FramePool((4, 4), np.uint8))
    assert rb.memory()["table_bytes"] < 1024
    obs = np.zeros((2, 2, 4, 4), np.uint8)
    rb.add(obs, [0, 1], [1.0, 2.0], obs + 1, [False, False], [False, False])
    assert rb._rows == 64 and rb.memory()["table_bytes"] < 8 << 10
    assert set(rb.sample(16).rewards.tolist()) == {1.0, 2.0}
