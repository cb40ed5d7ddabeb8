"""ReplayBuffer checkpoints: the ``.npz`` file format, :meth:`save` and :meth:`load`.

An archive (zip, stored uncompressed) of ``.npy`` entries, no pickled objects:

- ``meta``: a JSON string (``format``, ``version``, the constructor arguments, the
  geometry, the write position and the sampling RNG state);
- ``frames``: ``(F, *frame_shape)``, every frame the stored transitions refer to, once;
- ``obs_index``, ``next_index``: int32 ``(n, k)``, each transition's frames as indices
  into ``frames``;
- ``actions``, ``rewards``, ``flags``: the first ``n`` entries of the buffer's arrays.

Frames are streamed in chunks both ways, so neither needs a second copy of the buffer.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import zipfile
from typing import TYPE_CHECKING

import numpy as np

from .. import _common as C
from ._ingest import SKIP, TERM, TRUNC, check_pool, check_pool_geometry, core_of, own_pool

if TYPE_CHECKING:
    from . import ReplayBuffer

_FORMAT = "lazyframes.ReplayBuffer"
#: Version of the file format written by :meth:`Checkpoint.save` (and the only one read).
_VERSION = 1
_CHUNK_BYTES = 64 << 20  # frames are written/read this many bytes at a time


def header(rb: ReplayBuffer) -> dict:
    """The ``meta`` entry: format, version, arguments, geometry, position, RNG state."""
    bg = rb._rng.bit_generator
    return {
        "format": _FORMAT,
        "version": _VERSION,
        "capacity": rb._capacity,
        "num_envs": rb._num_envs,
        "n_step": rb._n_step,
        "gamma": rb._gamma,
        "action_shape": list(rb._action_shape),
        "action_dtype": rb._action_dtype.str,
        "layout_opt": rb._layout_opt,
        "stack_size_opt": rb._k_opt,
        "layout": rb._layout,
        "stack_size": rb._k,
        "frame_shape": None if rb._frame_shape is None else list(rb._frame_shape),
        "frame_dtype": None if rb._dtype is None else rb._dtype.str,
        "row": rb._row,
        "full": rb._full,
        "n_skip": rb._n_skip,
        "rng": {"name": type(bg).__name__, "state": bg.state},
    }


def save(rb: ReplayBuffer, path) -> None:
    """ReplayBuffer.save: the archive into a temporary file, renamed over ``path``."""
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write_archive(rb, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_archive(rb: ReplayBuffer, fh) -> None:
    """Write the archive's entries to the open file ``fh``."""
    n = len(rb)
    arrays = {}
    frame_ids = None
    if rb._table is not None:
        ids = rb._table.ids(np.arange(n))
        frame_ids, inv = np.unique(ids, return_inverse=True)
        inv = inv.reshape(ids.shape).astype(np.int32)
        arrays["obs_index"] = inv[:, : rb._k]
        arrays["next_index"] = inv[:, rb._k :]
    arrays["actions"] = rb._actions[:n]
    arrays["rewards"] = rb._rewards[:n]
    arrays["flags"] = rb._flags[:n]
    arrays["meta"] = np.array(json.dumps(header(rb)))
    with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, arr in arrays.items():
            with zf.open(name + ".npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.require(arr, requirements="C"), allow_pickle=False)
        if frame_ids is not None:
            shape = (frame_ids.size,) + rb._frame_shape
            with zf.open("frames.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array_header_2_0(
                    f,
                    {
                        "descr": np.lib.format.dtype_to_descr(rb._dtype),
                        "fortran_order": False,
                        "shape": shape,
                    },
                )
                step = max(1, _CHUNK_BYTES // rb._pool.frame_bytes)
                for i in range(0, frame_ids.size, step):
                    part = frame_ids[i : i + step, None]
                    f.write(rb._pool.gather(part, layout="stack").data)


def load(cls: type[ReplayBuffer], path, *, pool=None) -> ReplayBuffer:
    """ReplayBuffer.load: open ``path`` and read it; every failure is a ValueError."""
    check_pool(pool)
    try:
        fh = open(os.fspath(path), "rb")  # noqa: SIM115 - closed by the with below
    except FileNotFoundError:
        raise
    except OSError as e:
        raise ValueError(f"{path}: not a ReplayBuffer checkpoint ({type(e).__name__}: {e})") from e
    # np.load is given the open file: given a path, it leaks the file on a bad zip
    try:
        with fh:
            try:
                npz = np.load(fh, allow_pickle=False)
            except Exception as e:
                raise ValueError(f"not a ReplayBuffer checkpoint ({type(e).__name__}: {e})") from e
            with npz:
                return read(cls, npz, pool)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
    except Exception as e:
        raise ValueError(
            f"{path}: corrupt ReplayBuffer checkpoint ({type(e).__name__}: {e})"
        ) from e


def read(cls: type[ReplayBuffer], npz, pool) -> ReplayBuffer:
    """A new buffer from the open archive ``npz``, every entry checked."""
    names = set(npz.files)
    if "meta" not in names:
        raise ValueError("not a ReplayBuffer checkpoint (no meta entry)")
    m = npz["meta"]
    if m.shape != () or m.dtype.kind != "U":
        raise ValueError("not a ReplayBuffer checkpoint (bad meta entry)")
    meta = json.loads(str(m[()]))
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        raise ValueError("not a ReplayBuffer checkpoint (wrong format tag)")
    if meta.get("version") != _VERSION:
        raise ValueError(f"checkpoint version {meta.get('version')} is not supported")
    rb = cls(
        meta["capacity"],
        num_envs=meta["num_envs"],
        n_step=meta["n_step"],
        gamma=meta["gamma"],
        action_shape=tuple(meta["action_shape"]),
        action_dtype=np.dtype(meta["action_dtype"]),
        layout=meta["layout_opt"],
        stack_size=meta["stack_size_opt"],
        pool=pool,
    )
    if rb._capacity != meta["capacity"]:
        raise ValueError("inconsistent capacity")
    row, full = int(meta["row"]), bool(meta["full"])
    if not 0 <= row < rb._rows:
        raise ValueError(f"row {row} out of range")
    n = (rb._rows if full else row) * rb._num_envs
    bg = getattr(np.random, meta["rng"]["name"], None)
    if bg is None or not isinstance(bg, type) or not issubclass(bg, np.random.BitGenerator):
        raise ValueError(f"unknown bit generator {meta['rng']['name']!r}")
    gen = bg()
    gen.state = meta["rng"]["state"]
    rng = np.random.Generator(gen)

    def get(name, shape, dtype):
        if name not in names:
            raise ValueError(f"missing entry {name!r}")
        a = npz[name]
        if a.shape != shape or a.dtype != np.dtype(dtype):
            raise ValueError(
                f"entry {name!r} has shape {a.shape} and dtype {a.dtype}, expected "
                f"{shape} and {np.dtype(dtype)}"
            )
        return a

    actions = get("actions", (n,) + rb._action_shape, rb._action_dtype)
    rewards = get("rewards", (n,), np.float32)
    flags = get("flags", (n,), np.uint8)
    if np.any(flags & ~np.uint8(TERM | TRUNC | SKIP)):
        raise ValueError("bad flags")
    n_skip = int(np.count_nonzero(flags & SKIP))
    if n_skip != meta["n_skip"]:
        raise ValueError("inconsistent autoreset count")
    if meta["layout"] is not None:
        k = int(meta["stack_size"])
        fs = C.frame_shape(meta["frame_shape"])
        dt = C.frame_dtype(meta["frame_dtype"])
        layout = meta["layout"]
        if layout not in C.LAYOUTS:
            raise ValueError(f"bad layout {layout!r}")
        C.check_layout(layout, fs)
        index = np.concatenate(
            [get("obs_index", (n, k), np.int32), get("next_index", (n, k), np.int32)], axis=1
        )
        if pool is None:
            pool = own_pool(fs, dt, rb._capacity)
        else:
            check_pool_geometry(pool, fs, dt)
        frames = read_frames(npz, pool)
        nf = 0 if frames is None else len(frames)
        if index.size and (index.min() < 0 or index.max() >= nf):
            raise ValueError("slot table refers to a frame that is not in the file")
        table = core_of(pool).SlotTable(pool, rb._capacity, 2 * k)
        if n:
            table.take(np.arange(n), frames, index.astype(np.int64))
        rb._layout, rb._k, rb._frame_shape, rb._dtype = layout, k, fs, dt
        rb._obs_shape = C.observation_shape(fs, k, layout)
        rb._pool, rb._table = pool, table
    elif n:
        raise ValueError("transitions without frames")
    rb._actions[:n] = actions
    rb._rewards[:n] = rewards
    rb._flags[:n] = flags
    rb._row, rb._full, rb._n_skip = row, full, n_skip
    rb._rng = rng
    return rb


def read_frames(npz, pool):
    """Stream the frames entry into ``pool``: a LazyBatch ``(F, 1)``, None if F is 0."""
    if "frames" not in npz.files:
        raise ValueError("missing entry 'frames'")
    fs, dt = tuple(pool.frame_shape), np.dtype(pool.dtype)
    fb = math.prod(fs) * dt.itemsize
    with npz.zip.open("frames.npy") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, fdt = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, fdt = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"unsupported .npy version {version}")
        if fortran or fdt != dt or tuple(shape[1:]) != fs or len(shape) != len(fs) + 1:
            raise ValueError(
                f"frames entry has shape {shape} and dtype {fdt}, expected (n, *{fs}) {dt}"
            )
        nf = shape[0]
        step = max(1, _CHUNK_BYTES // fb)
        parts = []
        for i in range(0, nf, step):
            m = min(step, nf - i)
            buf = f.read(m * fb)
            if len(buf) != m * fb:
                raise ValueError("frames entry is truncated")
            parts.append(pool.push_batch(np.frombuffer(buf, dt).reshape((m,) + fs), k=1))
        if f.read(1):
            raise ValueError("frames entry has trailing bytes")
    if len(parts) <= 1:
        return parts[0] if parts else None
    # one source for SlotTable.take; the parts hold the frames until it has them
    return pool.lazy_batch(np.concatenate([p.slots for p in parts]))
