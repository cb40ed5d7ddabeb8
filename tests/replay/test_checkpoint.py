"""Checkpoints: golden files load as their recipes build; crafted files are refused, in bounds."""

import io
import json
import os
import pickle
import tracemalloc
import zipfile

import numpy as np
import pytest
from conftest import DATA, assert_same_samples, recorded, refused, run

from lazyframes import FramePool, ReplayBuffer, _core


def golden(name):
    return os.path.join(DATA, name)


def v1_wrapped():
    """Two envs, n_step 3, wrapped; flags of every kind; ndarray observations."""
    rb = ReplayBuffer(8, num_envs=2, n_step=3, gamma=0.5, seed=7, action_dtype=np.int16)

    def ob(t, e):  # 3 frames of (2, 3) uint8: frame value t + i + 10 e
        return np.stack([np.full((2, 3), t + i + 10 * e, np.uint8) for i in range(3)])

    for t in range(6):
        rb.add(np.stack([ob(t, 0), ob(t, 1)]), [t, -t], [t + 0.5, -t - 0.25],
               np.stack([ob(t + 1, 0), ob(t + 1, 1)]), [t == 2, False], [False, t == 4],
               autoreset=[False, t == 5])  # fmt: skip
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
    frames = recorded("pong")[0]
    lz4 = {"codec": "lz4", "level": 9, "group": 4}  # the default codec of its version
    rb = ReplayBuffer(24, num_envs=2, n_step=2, gamma=0.5, seed=5, compress=lz4)
    for t in range(15):
        obs = np.stack([frames[80 * e + t : 80 * e + t + 4] for e in range(2)])
        nxt = np.stack([frames[80 * e + t + 1 : 80 * e + t + 5] for e in range(2)])
        rb.add(obs, [t % 6, 5 - t % 6], [t, -t], nxt, [t == 9, False], [False, t == 12])
    rb.sample(4)
    return rb


LZ4_8 = {"codec": "lz4", "level": 9, "group": 8}  # the default of versions 4 and 5


def v4_xor():
    """Frames that change everywhere by one XOR: version 4's coder made KIND_XOR blobs."""
    base = np.random.default_rng(7).integers(0, 256, (24, 24), dtype=np.uint8)
    frames = np.stack([base ^ np.uint8(37 * t % 256) for t in range(20)])
    rb = ReplayBuffer(16, seed=7, compress=LZ4_8)
    for t in range(14):
        rb.add(frames[t : t + 2], t % 3, 0.5 * t, frames[t + 1 : t + 3], t == 9, False)
    rb.sample(3)
    return rb


def v5_packed():
    """Frames whose patches LZ4 halves: version 5's coder packed them as Blosc2 chunks."""
    frames = np.zeros((20, 32, 32), np.uint8)
    for t in range(20):  # rows of a few gray levels that change each step
        frames[t, : 8 + t % 9] = np.tile(np.arange(32, dtype=np.uint8) // 4 + t, (8 + t % 9, 1))
    rb = ReplayBuffer(16, seed=9, compress=LZ4_8)
    for t in range(14):
        rb.add(frames[t : t + 2], t % 3, 0.25 * t, frames[t + 1 : t + 3], t == 11, False)
    rb.sample(3)
    return rb


def checkpoint(rb):
    """The buffer's checkpoint (its pickle holds one): entry name -> array, meta parsed."""
    _, (_, data) = rb.__reduce__()
    with np.load(io.BytesIO(data)) as z:
        out = {name: z[name] for name in z.files}
    out["meta"] = json.loads(str(out["meta"][()]))
    return out


def assert_same_buffers(a, b, draws=(5,)):
    """The same checkpoint, the same samples at every position, the same draws."""
    ca, cb = checkpoint(a), checkpoint(b)
    assert ca["meta"] == cb["meta"] and ca.keys() == cb.keys()
    for name in ca.keys() - {"meta"}:
        np.testing.assert_array_equal(ca[name], cb[name], err_msg=name)
    if len(a):
        assert_same_samples(a.gather(np.arange(len(a))), b.gather(np.arange(len(a))), "gather")
        for B in draws:
            assert_same_samples(a.sample(B), b.sample(B), f"sample({B})")


@pytest.mark.parametrize(
    "name, recipe",
    [
        ("replay_v1_wrapped.npz", v1_wrapped), ("replay_v1_partial.npz", v1_partial),
        ("replay_v1_empty.npz", lambda: ReplayBuffer(4, seed=1)),
        ("replay_v2_streams.npz", v2_streams), ("replay_v3_compressed.npz", v3_compressed),
        ("replay_v4_xor.npz", v4_xor), ("replay_v5_packed.npz", v5_packed),
    ],
)  # fmt: skip
def test_golden_files_load_to_what_their_recipe_builds(name, recipe):
    rb = ReplayBuffer.load(golden(name))
    want = recipe()
    if rb.pool is not None:  # into a given pool too
        pool = FramePool(rb.pool.frame_shape, rb.pool.dtype)
        rb = ReplayBuffer.load(golden(name), pool=pool)
        assert rb.pool is pool
    assert rb.memory()["compression"] == want.memory()["compression"]
    assert_same_buffers(rb, want)


def test_golden_v4_holds_xor_blobs_which_load_as_they_are():
    """Version 4's XOR deltas: adopted as they are, read back exactly; saved again as patches."""
    members = entries(golden("replay_v4_xor.npz"))
    assert set(member(members, "frame_kinds").tolist()) == {_core.KIND_KEY, _core.KIND_XOR}
    rb = ReplayBuffer.load(golden("replay_v4_xor.npz"))
    assert rb.memory()["cold_frames"] == 16  # adopted, not decoded and compressed again
    assert_same_samples(rb.gather(np.arange(len(rb))), v4_xor().gather(np.arange(len(rb))), "all")
    assert _core.KIND_XOR not in checkpoint(rb)["frame_kinds"].tolist()


def test_golden_v5_holds_blosc2_packed_patches_which_load_as_lz4_blocks():
    """Version 5's packed patches (Blosc2 chunks) are packed again as LZ4 blocks on load."""
    members = entries(golden("replay_v5_packed.npz"))
    assert _core.KIND_PACKED_BLOSC in member(members, "frame_kinds").tolist()
    rb = ReplayBuffer.load(golden("replay_v5_packed.npz"))
    assert rb.memory()["cold_frames"] == 16  # adopted, not decoded and compressed again
    every = np.arange(len(rb))
    assert_same_samples(rb.gather(every), v5_packed().gather(every), "all")
    kinds = checkpoint(rb)["frame_kinds"].tolist()
    assert _core.KIND_PACKED in kinds and _core.KIND_PACKED_BLOSC not in kinds


def test_golden_v1_exact_values():
    """The v1 ring: position ``row * 2 + env`` holds env's transition of step t = row+4k."""
    rb = ReplayBuffer.load(golden("replay_v1_wrapped.npz"))
    assert (len(rb), rb.full, rb.n_step, rb.gamma) == (8, True, 3, 0.5)
    ck = checkpoint(rb)
    assert ck["meta"]["pos"] == 4 and ck["meta"]["version"] == 6
    assert ck["actions"].tolist() == [4, -4, 5, -5, 2, -2, 3, -3]
    assert ck["rewards"].tolist() == [4.5, -4.25, 5.5, -5.25, 2.5, -2.25, 3.5, -3.25]
    assert ck["flags"].tolist() == [0, 2, 0, 4, 1, 0, 0, 0] and ck["env_ids"].tolist() == [0, 1] * 4
    s = rb.gather(np.arange(8))
    assert s.observations[:, 0, 0, 0].tolist() == [4, 14, 5, 15, 2, 12, 3, 13]
    # position 6 (env 0, t=3): rewards 3.5 + 0.5 * 4.5 + 0.25 * 5.5, window complete
    assert (s.rewards[6], s.discounts[6], s.dones[6]) == (3.5 + 2.25 + 1.375, 0.125, 0.0)
    # env 0's two newest windows (positions 0, 2) are open; 3 is an autoreset placeholder
    assert set(rb.sample(64).indices.tolist()) == {1, 4, 5, 6, 7}


def test_round_trip_keeps_everything_and_writes_version_6(tmp_path):
    path = tmp_path / "rb.npz"
    for rb in (v2_streams(), v3_compressed(), ReplayBuffer(10, num_envs=2, seed=3)):
        rb.save(path)
        back = ReplayBuffer.load(path, pool=None if rb.pool is None else FramePool(
            rb.pool.frame_shape, rb.pool.dtype))  # fmt: skip
        assert back.pool is not rb.pool or rb.pool is None
        assert checkpoint(back)["meta"]["version"] == 6
        assert_same_buffers(back, rb)
        assert_same_buffers(pickle.loads(pickle.dumps(rb)), rb)
        if rb.pool is not None:  # each frame stored once, in memory and in the file
            assert back.pool.live_frames == rb.memory()["unique_frames"]
        assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_bad_files_are_refused(tmp_path):
    path = tmp_path / "rb.npz"
    v2_streams().save(path)
    good = path.read_bytes()
    (tmp_path / "trunc.npz").write_bytes(good[: len(good) // 2])
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF  # a flipped byte: the CRC check fails
    (tmp_path / "corrupt.npz").write_bytes(bytes(bad))
    np.savez(tmp_path / "other.npz", a=np.arange(3))
    (tmp_path / "text.npz").write_text("hello")  # (indices beyond the frames: bad entries)
    for name, match in [
        ("trunc.npz", r"trunc\.npz"),
        ("corrupt.npz", "corrupt"),
        ("other.npz", "not a ReplayBuffer checkpoint"),
        ("text.npz", "not a ReplayBuffer checkpoint"),
    ]:
        refused(ValueError, match, ReplayBuffer.load, tmp_path / name)
    refused(FileNotFoundError, "", ReplayBuffer.load, tmp_path / "missing.npz")
    with pytest.raises(ValueError, match="shape"):  # a pool of other frames
        ReplayBuffer.load(path, pool=FramePool((4, 3), np.uint8))
    refused(TypeError, "FramePool", ReplayBuffer.load, path, pool="pool")


def test_a_failed_save_leaves_the_old_checkpoint_and_no_temporary_file(tmp_path, monkeypatch):
    rb = v2_streams()
    path = tmp_path / "rb.npz"
    rb.save(path)
    good = path.read_bytes()
    with pytest.raises(FileNotFoundError):  # refused before anything is written
        rb.save(tmp_path / "no" / "rb.npz")

    def failing_write(f, *args, **kwargs):  # the disk fills half-way through an entry
        f.write(b"partial")
        raise OSError("ENOSPC")

    monkeypatch.setattr(np.lib.format, "write_array", failing_write)
    refused(OSError, "ENOSPC", rb.save, path)
    monkeypatch.undo()
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError("EIO")))
    refused(OSError, "EIO", rb.save, path)
    monkeypatch.undo()
    assert path.read_bytes() == good and os.listdir(tmp_path) == ["rb.npz"]
    assert_same_buffers(ReplayBuffer.load(path), rb)


def test_a_save_killed_mid_write_leaves_a_temporary_file_the_next_save_removes(tmp_path):
    script = f"""if True:
        import os, signal, numpy as np
        from lazyframes import ReplayBuffer
        rb = ReplayBuffer(4)
        rb.add(np.zeros((4, 8, 8), np.uint8), 0, 0.0, np.ones((4, 8, 8), np.uint8), False, False)
        def killed(f, *args, **kwargs):  # kill -9 half-way through an entry
            f.write(b"partial"); f.flush(); os.kill(os.getpid(), signal.SIGKILL)
        np.lib.format.write_array = killed
        rb.save({str(tmp_path / "rb.npz")!r})
    """
    assert run("-c", script).returncode == -9
    (left,) = os.listdir(tmp_path)  # rb.npz.<dead pid>.<random>.tmp
    live = tmp_path / f"rb.npz.{os.getppid()}.x1.tmp"  # a live process's save in progress
    live.write_bytes(b"")
    v2_streams().save(tmp_path / "rb.npz")
    assert left.startswith("rb.npz.") and sorted(os.listdir(tmp_path)) == ["rb.npz", live.name]


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


def meta_of(members):
    return json.loads(str(np.load(io.BytesIO(members["meta.npy"]))[()]))


def with_meta(members, edit=lambda meta: None, **changes):
    """``members`` with ``changes`` to its meta, then ``edit(meta)`` (say of a nested dict)."""
    meta = {**meta_of(members), **changes}
    edit(meta)
    return {**members, "meta.npy": npy(np.array(json.dumps(meta)))}


def declared_pool(path):
    """A pool of the frames a plain checkpoint declares (None if it declares none)."""
    try:
        m = meta_of(entries(path))
        return FramePool(tuple(m["frame_shape"]), m["frame_dtype"])
    except Exception:
        return None


def traced(fn, *args, **kw):
    """``fn(*args, **kw)`` and the peak of the Python allocations traced while it ran."""
    tracemalloc.start()
    try:
        return fn(*args, **kw), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def assert_refused(path, match, cls=ReplayBuffer):
    """``load`` raises ValueError(match) having held < 16x the file + 4 MiB (traced + pool peak)."""
    size, pool = os.path.getsize(path), declared_pool(path)
    _, peak = traced(refused, ValueError, match, cls.load, path, pool=pool)
    held = 0 if pool is None else pool.peak_bytes
    assert peak + held < 16 * size + (4 << 20), (peak, held)
    assert pool is None or pool.compression is None  # the pool given left as it was


@pytest.fixture
def valid(tmp_path):
    """The members of a valid checkpoint of 6 transitions of (2, 4, 4) uint8."""
    v2_streams().save(tmp_path / "valid.npz")
    return entries(tmp_path / "valid.npz")


def test_deflated_and_missing_members_are_refused(valid, tmp_path):
    n = 1 << 22  # 67M frames of zeros deflate to a few MB: a deflated member is refused unread
    bomb = npy_header((n, 4, 4), np.uint8) + bytes(16 * n)
    path = craft(tmp_path / "bomb.npz", {**valid, "frames.npy": bomb}, zipfile.ZIP_DEFLATED)
    assert os.path.getsize(path) < 1 << 20
    assert_refused(path, "compressed")
    members = dict(valid)
    del members["env_ids.npy"]
    assert_refused(craft(tmp_path / "a.npz", members), "missing entry 'env_ids'")


@pytest.mark.parametrize(
    "base, changes, match",
    [("valid", c, m) for c, m in [
        ({"capacity": 2**64}, "capacity"),
        ({"capacity": 2**25 * 3}, r"'actions' has shape \(6,\) .* expected shape \(100663296,\)"),
        ({"capacity": 10**9, "num_envs": 10**9}, "num_envs"),
        ({"action_shape": [10**6, 10**6]}, "bytes of tables.*action_shape"),
        ({"stack_size": 2**40}, "stack_size"), ({"n_step": 10**6}, "n_step"),
        ({"capacity": "6"}, "capacity"), ({"pos": 10**9}, "pos"), ({"full": 1}, "full"),
        ({"version": 7}, "version 7 is not supported"), ({"format": "other"}, "wrong format tag"),
        ({"rng": {"name": "os", "state": {}}}, "bit generator"), ({"n_skip": 5}, "autoreset count"),
    ]] + [("packed", c, m) for c, m in [  # a compressed container's (formats 3 and 4)
        ({"compression": {"codec": "nope"}}, "codec"),
        ({"compression": 5}, "bad meta 'compression'"),
        ({"compression": None}, "the meta says the frames are not compressed"),
        # 32 frames of 64 MiB from a 13 KB file: refused before any is decoded
        ({"frame_shape": [8192, 8192]}, "decompression bomb"),
    ]],
)  # fmt: skip
def test_bad_meta_is_refused(request, tmp_path, base, changes, match):
    members = with_meta(request.getfixturevalue(base), **changes)
    assert_refused(craft(tmp_path / "bad.npz", members), match)


@pytest.mark.parametrize(
    "base, name, data, match",
    [("valid", *row) for row in [
        ("actions.npy", npy(np.zeros(6, np.float64)), "dtype float64"),
        ("actions.npy", npy(np.zeros((6, 1), np.int64)), r"shape \(6, 1\)"),
        ("actions.npy", npy_header((10**9,), np.int64) + bytes(48), r"shape \(1000000000,\)"),
        ("actions.npy", npy_header((6,), np.int64) + bytes(8), "size its header"),
        ("rewards.npy", npy(np.full(6, np.inf, np.float32)), "reward must be finite"),
        ("flags.npy", npy(np.full(6, 8, np.uint8)), "bad flags"),
        ("env_ids.npy", npy(np.full(6, 3, np.int32)), r"stream id outside \[0, 3\)"),
        ("obs_index.npy", npy(np.full((6, 2), 99, np.int32)), "not in the file"),
        ("frames.npy", npy_header((10**9, 4, 4), np.uint8) + bytes(64), "size its header"),
        ("frames.npy", npy(np.zeros((3, 4, 5), np.uint8)), "frames entry has shape"),
        ("frames.npy", npy(np.zeros((10**5, 4, 4), np.uint8)), "100000 frames for 24 frame"),
        ("frames.npy", npy(np.zeros((3, 4, 4), np.int16)), "dtype int16"),
        ("extra.npy", npy(np.zeros(1)), "unexpected entries"),
        ("meta.npy", npy(np.zeros(1)), "bad meta entry"),
        ("notes.txt", b"hi", "unexpected member"),
    ]] + [("packed", *row) for row in [  # a compressed container's (formats 3 and 4)
        ("frame_blobs.npy", npy_header((10**9,), np.uint8) + bytes(64), "size its header"),
        ("frame_offsets.npy", npy_header((10**9,), np.int64) + bytes(64), "size its header"),
        ("frame_offsets.npy", npy(np.arange(200, dtype=np.int64)), r"\(200,\) for 192 ref"),
        ("frame_offsets.npy", npy(np.zeros((33, 1), np.int64)), "frame_offsets entry has shape"),
        ("frame_offsets.npy", npy(np.arange(33, dtype=np.int64)), "do not span"),
        ("frame_kinds.npy", npy(np.zeros(31, np.uint8)), r"shape \(31,\)"),
        ("frame_kinds.npy", npy(np.full(32, 7, np.uint8)), "kinds one of KIND_"),
        ("frame_kinds.npy", npy(np.ones(32, np.uint8)), "no frame to apply to"),
        ("frame_kinds.npy", npy(np.full(32, 2, np.uint8)), "raw blob is not 7056 bytes"),
        ("frame_kinds.npy", npy(np.zeros(32, np.float32)), "dtype float32"),
        ("frames.npy", npy(np.zeros((32, 84, 84), np.uint8)), "frames are compressed"),
        ("obs_index.npy", npy(np.full((24, 4), 32, np.int32)), "not in the file"),
    ]],
)  # fmt: skip
def test_bad_entries_are_refused(request, tmp_path, base, name, data, match):
    members = {**request.getfixturevalue(base), name: data}
    assert_refused(craft(tmp_path / "bad.npz", members), match)


# -- crafted compressed containers (formats 3 and 4) ------------------------------------
@pytest.fixture
def packed():
    """The members of the v3 golden file: 32 frames of 7,056 B as a compressed container."""
    return entries(golden("replay_v3_compressed.npz"))


def member(members, name):
    return np.load(io.BytesIO(members[name + ".npy"]))


def test_forged_offsets_payloads_and_unreferenced_frames_are_refused(packed, tmp_path):
    assert member(packed, "frame_kinds").tolist() == [0, 1, 1, 1] * 8  # a key, 3 XOR deltas
    assert member(packed, "frame_blobs").size < 32 * 7056 / 10 and "frames.npy" not in packed
    offsets, blobs = member(packed, "frame_offsets"), member(packed, "frame_blobs")
    swapped = offsets.copy()
    swapped[[3, 4]] = swapped[[4, 3]]
    moved = offsets.copy()
    moved[5] += 3  # blobs 4 and 5 cut in the wrong place: neither decodes
    cut = np.minimum(offsets, blobs.size - 100)
    cut[-1] = blobs.size - 100  # the last blob loses its tail
    short = npy(blobs[:-100])
    index = member(packed, "next_index").copy()
    index[index == 31] = 30  # frame 31 in no transition (32 frames, 33 offsets)
    for i, (changes, match) in enumerate([
        ({"frame_offsets.npy": npy(swapped)}, "must not decrease"),
        ({"frame_offsets.npy": npy(moved)}, "does not decode"),
        ({"frame_blobs.npy": short}, "do not span"),
        ({"frame_blobs.npy": short, "frame_offsets.npy": npy(cut)}, "does not decode"),
        ({"next_index.npy": npy(index)}, "in no transition"),
    ]):  # fmt: skip
        assert_refused(craft(tmp_path / f"{i}.npz", {**packed, **changes}), match)


@pytest.mark.parametrize("at, value", [(4, 1 << 30), (4, 7055), (12, 1 << 30)])
def test_blob_headers_declaring_other_sizes_are_refused(packed, tmp_path, at, value):
    """A decompression bomb: a blob declaring 1 GiB (or another size) of frame or blob."""
    blobs = member(packed, "frame_blobs").copy()
    blobs[at : at + 4] = np.frombuffer(np.uint32(value).tobytes(), np.uint8)
    path = craft(tmp_path / "bomb.npz", {**packed, "frame_blobs.npy": npy(blobs)})
    assert_refused(path, "blob 0 of the container does not decode")


def test_frames_held_at_once_are_bounded(packed, tmp_path):
    """64 MiB frames in a 3 MiB file, every row needing every frame: all would be held at once."""
    blobs, offsets = member(packed, "frame_blobs"), member(packed, "frame_offsets").copy()
    padded = np.concatenate([blobs, np.zeros(3 << 20, np.uint8)])
    offsets[-1] = padded.size
    index = member(packed, "obs_index").copy()
    index[:, 1] = 31  # (it is next_index[:, 0] too) every row needs the newest frame
    members = {**with_meta(packed, frame_shape=[8192, 8192]), "obs_index.npy": npy(index),
               "frame_blobs.npy": npy(padded), "frame_offsets.npy": npy(offsets)}  # fmt: skip
    assert_refused(craft(tmp_path / "pin.npz", members), "would be held at once")


def _add_steps(rb, steps, start):
    """Add ``steps`` transitions of one env: frames (2, 4, 4) valued t, t + 1."""
    for t in range(start, start + steps):
        obs = np.stack([np.full((4, 4), (t + i) % 256, np.uint8) for i in range(2)])
        nxt = np.stack([np.full((4, 4), (t + 1 + i) % 256, np.uint8) for i in range(2)])
        rb.add(obs, t % 7, 0.5 * t, nxt, t % 11 == 10, False)


def test_a_tiny_file_declaring_a_huge_capacity_loads_with_small_tables(tmp_path):
    """Tables are sized by the file's transitions, then grow with the adds, not by capacity."""
    rb = ReplayBuffer(2**40, seed=4)
    fixed = rb.memory()["table_bytes"]  # before any add: the per-env table
    _add_steps(rb, 3, 0)
    per_row = (rb.memory()["table_bytes"] - fixed) / 64  # the first add allocates 64 rows
    assert per_row < 64
    rb.save(tmp_path / "huge.npz")
    size = os.path.getsize(tmp_path / "huge.npz")
    pool = FramePool((4, 4), np.uint8)
    back, peak = traced(ReplayBuffer.load, tmp_path / "huge.npz", pool=pool)
    assert peak + pool.peak_bytes < 16 * size + (1 << 20), peak
    assert back.capacity == 2**40 and len(back) == 3
    assert back.memory()["table_bytes"] == fixed + 3 * per_row  # 3 rows, not 2**40
    assert_same_buffers(back, rb)
    ReplayBuffer(1_000_000).save(tmp_path / "big.npz")  # the bounds leave room for real buffers
    assert ReplayBuffer.load(tmp_path / "big.npz").capacity == 1_000_000  # (1M transitions)
    _add_steps(back, 70, 3)
    _add_steps(rb, 70, 3)
    assert back.memory()["table_bytes"] == fixed + 128 * per_row  # doubled: 3 -> 64 -> 128
    assert_same_buffers(back, rb)


def test_loaded_tables_grow_up_to_the_capacity_then_evict(tmp_path):
    """A loaded file of 5 of 50 transitions: adds grow its tables to 50, then wrap."""
    ref = ReplayBuffer(50, n_step=3, gamma=0.5, seed=2)
    fixed = ref.memory()["table_bytes"]
    _add_steps(ref, 5, 0)
    ref.save(tmp_path / "part.npz")
    back = ReplayBuffer.load(tmp_path / "part.npz", pool=FramePool((4, 4), np.uint8))
    per_row = (back.memory()["table_bytes"] - fixed) / 5  # 5 rows
    for start in range(5, 130, 25):
        _add_steps(back, 25, start)
        _add_steps(ref, 25, start)
        assert_same_buffers(back, ref)
    assert back.full and back.memory()["table_bytes"] == fixed + 50 * per_row
    assert checkpoint(back)["meta"]["pos"] == 130 % 50


# -- pickles: a buffer pickles as its checkpoint -------------------------------------------
def test_pickles_of_0_2_load_and_sample_as_they_did():
    """``{"uniform": ReplayBuffer, "prioritized": PrioritizedReplayBuffer}`` pickled by 0.2."""
    with open(golden("replay_0.2_pickle.pkl"), "rb") as fh:
        buffers = pickle.load(fh)
    u, p = buffers["uniform"].sample(5), buffers["prioritized"].sample(5, beta=0.4)
    with np.load(golden("replay_0.2_pickle_samples.npz")) as want:
        for got, name in [
            (u.observations, "u_obs"), (u.next_observations, "u_next"), (u.indices, "u_idx"),
            (u.rewards, "u_rew"), (u.discounts, "u_disc"), (p.observations, "p_obs"),
            (p.indices, "p_idx"), (p.weights, "p_w"),
        ]:  # fmt: skip
            np.testing.assert_array_equal(got, want[name], err_msg=name, strict=True)


def test_unpickling_checks_what_it_is_given():
    """Crafted pickle streams naming the restore function (as 0.2's do) are refused."""
    restore = ReplayBuffer(1).__reduce__()[0]

    class Call:
        def __init__(self, *args):
            self.args = args

        def __reduce__(self):
            return restore, self.args

    for args, exc, match in [
        ((dict, b""), TypeError, "restore a ReplayBuffer as"),
        ((ReplayBuffer, "x"), TypeError, "from bytes"),
        ((ReplayBuffer, b"PK\x03\x04 not a zip"), ValueError, "not a ReplayBuffer checkpoint"),
    ]:
        data = pickle.dumps(Call(*args), protocol=0)
        shim = data.replace(b"_buffer\n_from_bytes\n", b"_checkpoint\nfrom_bytes\n")
        assert shim != data
        for stream in (data, shim):
            refused(exc, match, pickle.loads, stream)
