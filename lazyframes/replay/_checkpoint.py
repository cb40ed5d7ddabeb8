"""ReplayBuffer checkpoints: the ``.npz`` file format, :meth:`save` and :meth:`load`.

An archive (zip, stored uncompressed) of ``.npy`` entries, no pickled objects:

- ``meta``: a JSON string (``format``, ``version``, the constructor arguments, the
  geometry, the write position and the sampling RNG state);
- ``frames``: ``(F, *frame_shape)``, every frame the stored transitions refer to, once;
- ``obs_index``, ``next_index``: int32 ``(n, k)``, each transition's frames as indices
  into ``frames``;
- ``actions``, ``rewards``, ``flags``: the first ``n`` entries of the buffer's arrays;
- ``env_ids`` (version 2): int32 ``(n,)``, each transition's env stream. The links of
  each stream (its transitions in ring order) are rebuilt from them.
- Dict observations (version 2): ``meta["leaves"]`` lists the leaves (key, and the
  geometry of a frame leaf or the shape and dtype of a vector leaf), and leaf ``i`` has
  the entries ``frames_i``, ``obs_index_i``, ``next_index_i`` (a frame leaf, as above)
  or ``obs_i``, ``next_obs_i`` (a vector leaf, ``(n, *shape)``) in place of ``frames``,
  ``obs_index`` and ``next_index`` (:mod:`._dict`). Readers before them refuse such a
  file as having unexpected entries.

Version 1 (one transition per env per row) has ``row`` in place of ``pos`` and no
``env_ids``: position ``i`` holds env ``i % num_envs``. Both versions are read.

A checkpoint is untrusted input: before anything is allocated, every entry's declared
size is checked against the bytes the file really holds (stored, not deflated, zip
members inside the file; ``.npy`` headers whose shape and dtype are the expected ones
and whose data is exactly the member's size), and the sizes declared in ``meta`` are
bounded by the file's size (:func:`check_capacity`); the tables are sized by the
transitions the file holds, not by its declared capacity. So ``load`` costs time and
memory of a small multiple of the file. Frames are streamed in chunks both ways
(:func:`write_frames`, :func:`read_frames`, the one place frame bytes are encoded and
decoded), so neither needs a second copy of the buffer.
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
from . import _dict
from ._ingest import (
    SKIP,
    TERM,
    TRUNC,
    check_pool_geometry,
    core_of,
    grow,
    own_pool,
)

if TYPE_CHECKING:
    from . import ReplayBuffer

_FORMAT = "lazyframes.ReplayBuffer"
#: Version of the file format written by :func:`save`; :func:`read` also reads version 1.
_VERSION = 2
_CHUNK_BYTES = 64 << 20  # frames are written/read this many bytes at a time
#: The per-env table ``load`` allocates (8 bytes per env) is bounded by this many envs,
#: or the file's size in bytes if larger. The per-transition tables are sized by the
#: transitions the file holds, not by the declared capacity (:func:`check_capacity`).
_ENV_FLOOR = 1 << 20
#: A transition's table bytes (slot ids, action, ...) are bounded by this many bytes,
#: or the file's size if larger.
_ROW_FLOOR = 1 << 20
#: Entries of the archive, by version.
_ENTRIES = {
    1: {"meta", "frames", "obs_index", "next_index", "actions", "rewards", "flags"},
    2: {"meta", "frames", "obs_index", "next_index", "actions", "rewards", "flags", "env_ids"},
}


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
        "pos": rb._pos,
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
    arrays["env_ids"] = rb._env[:n]
    meta = header(rb)
    frame_sets = []  # (entry, pool, frame ids, frame shape, dtype)
    if frame_ids is not None:
        frame_sets.append(("frames", rb._pool, frame_ids, rb._frame_shape, rb._dtype))
    if rb._leaves is not None:  # Dict observations: entries by leaf (see _dict)
        meta["leaves"], more, sets = _dict.archive(rb, n)
        arrays.update(more)
        frame_sets += sets
    arrays["meta"] = np.array(json.dumps(meta))
    with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, arr in arrays.items():
            with zf.open(name + ".npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.require(arr, requirements="C"), allow_pickle=False)
        for name, pool, ids, fs, dt in frame_sets:
            with zf.open(name + ".npy", "w", force_zip64=True) as f:
                write_frames(f, pool, ids, fs, dt)


def write_frames(f, pool, frame_ids: np.ndarray, frame_shape: tuple, dtype: np.dtype) -> None:
    """Encode the frames ``frame_ids`` of ``pool`` into the ``frames`` entry ``f``.

    The entry is an ``.npy`` array ``(F, *frame_shape)`` of raw frame bytes, written in
    chunks of ``_CHUNK_BYTES``; :func:`read_frames` decodes it.
    """
    header = {
        "descr": np.lib.format.dtype_to_descr(dtype),
        "fortran_order": False,
        "shape": (frame_ids.size,) + frame_shape,
    }
    np.lib.format.write_array_header_2_0(f, header)
    step = max(1, _CHUNK_BYTES // pool.frame_bytes)
    for i in range(0, frame_ids.size, step):
        f.write(pool.gather(frame_ids[i : i + step, None], layout="stack").data)


def load(cls: type[ReplayBuffer], path, *, pool=None) -> ReplayBuffer:
    """ReplayBuffer.load: open ``path`` and read it; every failure is a ValueError."""
    _dict.check_pools(pool)
    try:
        fh = open(os.fspath(path), "rb")  # noqa: SIM115 - closed by the with below
    except FileNotFoundError:
        raise
    except OSError as e:
        raise ValueError(f"{path}: not a ReplayBuffer checkpoint ({type(e).__name__}: {e})") from e
    try:
        with fh:
            size = os.fstat(fh.fileno()).st_size
            try:
                zf = zipfile.ZipFile(fh)
            except Exception as e:
                raise ValueError(f"not a ReplayBuffer checkpoint ({type(e).__name__}: {e})") from e
            with zf:
                return read(cls, Archive(zf, size), pool)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
    except Exception as e:
        raise ValueError(
            f"{path}: corrupt ReplayBuffer checkpoint ({type(e).__name__}: {e})"
        ) from e


class Archive:
    """The entries of an open checkpoint, each checked against the file before it is read.

    Args:
        zf: the open ``zipfile.ZipFile``.
        size: the file's size in bytes.

    Raises:
        ValueError: a member that is compressed, whose stored size differs from its
            declared size, that lies outside the file, or whose name is not
            ``<entry>.npy``; members that add up to more than the file.
    """

    def __init__(self, zf: zipfile.ZipFile, size: int):
        self.zf, self.size = zf, size
        self.members: dict[str, zipfile.ZipInfo] = {}
        total = 0
        for info in zf.infolist():
            name = info.filename
            if not name.endswith(".npy") or name[:-4] in self.members:
                raise ValueError(f"unexpected member {name!r}")
            if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
                raise ValueError(f"member {name!r} is compressed (checkpoints are stored)")
            total += info.file_size
            if info.header_offset + info.compress_size > size or total > size:
                raise ValueError(f"member {name!r} declares more bytes than the file holds")
            self.members[name[:-4]] = info

    def names(self) -> set:
        """The entry names (without ``.npy``)."""
        return set(self.members)

    def open(self, name: str, shape: tuple | None, dtype) -> tuple:
        """Open entry ``name``: ``(file, shape, dtype)`` after checking its ``.npy`` header.

        ``shape`` (``dtype``) None accepts any shape (dtype); the data must fill the
        member exactly, in C order.

        Raises:
            ValueError: a missing entry, another shape or dtype, a data size other than
                the member's.
        """
        if name not in self.members:
            raise ValueError(f"missing entry {name!r}")
        f = self.zf.open(self.members[name])
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                got, fortran, dt = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                got, fortran, dt = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"entry {name!r}: unsupported .npy version {version}")
            got = tuple(got)
            if (
                fortran
                or (dtype is not None and dt != np.dtype(dtype))
                or (shape is not None and got != shape)
            ):
                raise ValueError(
                    f"entry {name!r} has shape {got} and dtype {dt}"
                    f"{' (Fortran order)' if fortran else ''}, expected shape "
                    f"{'(any)' if shape is None else shape} and dtype "
                    f"{'(any)' if dtype is None else np.dtype(dtype)}"
                )
            if f.tell() + math.prod(got) * dt.itemsize != self.members[name].file_size:
                raise ValueError(f"entry {name!r}: its data is not the size its header declares")
        except BaseException:
            f.close()
            raise
        return f, got, dt

    def array(self, name: str, shape: tuple, dtype) -> np.ndarray:
        """Entry ``name`` as an array of ``shape`` and ``dtype`` (checked before read)."""
        f, _, dt = self.open(name, shape, dtype)
        with f:
            return np.frombuffer(f.read(math.prod(shape) * dt.itemsize), dt).reshape(shape)

    def meta(self) -> dict:
        """The ``meta`` entry, a JSON object of the right format tag."""
        if "meta" not in self.members:
            raise ValueError("not a ReplayBuffer checkpoint (no meta entry)")
        f, shape, dt = self.open("meta", None, None)
        with f:
            if shape != () or dt.kind != "U":
                raise ValueError("not a ReplayBuffer checkpoint (bad meta entry)")
            text = np.frombuffer(f.read(dt.itemsize), dt)[0]
        meta = json.loads(str(text))
        if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
            raise ValueError("not a ReplayBuffer checkpoint (wrong format tag)")
        return meta


def bounded_int(meta: dict, key: str, lo: int, hi: int) -> int:
    """``meta[key]``, an int in ``[lo, hi]`` (bools refused).

    Raises:
        ValueError: missing, not an int, or out of range.
    """
    v = meta.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"meta {key!r} must be an int in [{lo}, {hi}], got {v!r}")
    return v


def check_capacity(meta: dict, file_size: int) -> None:
    """Refuse declared sizes that would make ``load`` or the next add cost more than the file.

    ``load`` sizes the per-transition tables by the transitions the file holds (whose
    entries are checked against the file, :class:`Archive`), not by the declared
    capacity: a large capacity costs memory only as transitions are added. What it
    allocates from declared numbers alone is bounded here: the per-env table
    (``num_envs`` up to ``max(_ENV_FLOOR, file_size)``) and a transition's table bytes
    (up to ``max(_ROW_FLOOR, file_size)``, the rows the next add grows by).

    Raises:
        ValueError: a capacity, number of envs, stack size or action shape out of
            those bounds.
    """
    bounded_int(meta, "capacity", 1, np.iinfo(np.int64).max)
    bounded_int(meta, "num_envs", 1, max(_ENV_FLOOR, file_size))
    limit = max(_ROW_FLOOR, file_size)
    k = meta.get("stack_size")
    k = 1 if k is None else bounded_int(meta, "stack_size", 1, limit)
    shape = meta.get("action_shape")
    if not isinstance(shape, list) or len(shape) > 32:
        raise ValueError(f"meta 'action_shape' must be a short list, got {shape!r}")
    itemsize = np.dtype(meta.get("action_dtype")).itemsize
    per_action = math.prod(bounded_int({"d": d}, "d", 0, limit) for d in shape) * itemsize
    per_transition = 2 * k * 4 + per_action + 4 + 1 + 4 + 8
    if per_transition > limit:
        raise ValueError(
            f"a transition needs {per_transition} bytes of tables, more than {limit} for "
            f"a file of {file_size} bytes (stack_size or action_shape)"
        )


def rng_of(state) -> np.random.Generator:
    """A Generator restored from the ``rng`` entry of ``meta``."""
    if not isinstance(state, dict) or not isinstance(state.get("name"), str):
        raise ValueError("bad RNG state")
    bg = getattr(np.random, state["name"], None)
    if bg is None or not isinstance(bg, type) or not issubclass(bg, np.random.BitGenerator):
        raise ValueError(f"unknown bit generator {state['name']!r}")
    gen = bg()
    gen.state = state["state"]
    return np.random.Generator(gen)


def read(cls: type[ReplayBuffer], ar: Archive, pool) -> ReplayBuffer:
    """A new buffer from the checked archive ``ar``, every entry checked."""
    meta = ar.meta()
    version = meta.get("version")
    if version not in _ENTRIES:
        raise ValueError(
            f"checkpoint version {version!r} is not supported (this lazyframes reads "
            f"versions {sorted(_ENTRIES)})"
        )
    allowed = _ENTRIES[version] | _dict.entry_names(meta.get("leaves"))
    if not ar.names() <= allowed:
        raise ValueError(f"unexpected entries {sorted(ar.names() - allowed)}")
    check_capacity(meta, ar.size)
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
    full = meta.get("full")
    if not isinstance(full, bool):
        raise ValueError(f"meta 'full' must be a bool, got {full!r}")
    if version == 1:
        pos = bounded_int(meta, "row", 0, rb._capacity // rb._num_envs - 1) * rb._num_envs
    else:
        pos = bounded_int(meta, "pos", 0, rb._capacity - 1)
    n = rb._capacity if full else pos
    rng = rng_of(meta.get("rng"))
    actions = ar.array("actions", (n,) + rb._action_shape, rb._action_dtype)
    rewards = ar.array("rewards", (n,), np.float32)
    flags = ar.array("flags", (n,), np.uint8)
    if version == 1:
        envs = np.arange(n, dtype=np.int32) % rb._num_envs
    else:
        envs = ar.array("env_ids", (n,), np.int32)
        if n and (envs.min() < 0 or envs.max() >= rb._num_envs):
            raise ValueError("env_ids out of range")
    if np.any(flags & ~np.uint8(TERM | TRUNC | SKIP)):
        raise ValueError("bad flags")
    if not np.all(np.isfinite(rewards)):
        raise ValueError("non-finite rewards")
    n_skip = int(np.count_nonzero(flags & SKIP))
    if n_skip != meta.get("n_skip"):
        raise ValueError("inconsistent autoreset count")
    if meta.get("leaves") is not None:
        _dict.read_leaves(rb, ar, meta["leaves"], n, pool)
    elif meta.get("layout") is not None:
        k = bounded_int(meta, "stack_size", 1, 2**31 - 1)
        fs = C.frame_shape(meta["frame_shape"])
        dt = C.frame_dtype(meta["frame_dtype"])
        layout = meta["layout"]
        if layout not in C.LAYOUTS:
            raise ValueError(f"bad layout {layout!r}")
        C.check_layout(layout, fs)
        index = np.concatenate(
            [ar.array("obs_index", (n, k), np.int32), ar.array("next_index", (n, k), np.int32)],
            axis=1,
        )
        if isinstance(pool, dict):
            raise ValueError("pool is a dict, but the file holds single observations")
        if pool is None:
            pool = own_pool(fs, dt, rb._capacity)
        else:
            check_pool_geometry(pool, fs, dt)
        frames = read_frames(ar, pool, index.size)
        nf = 0 if frames is None else len(frames)
        if index.size and (index.min() < 0 or index.max() >= nf):
            raise ValueError("slot table refers to a frame that is not in the file")
        table = core_of(pool).SlotTable(pool, n, 2 * k)  # grown as transitions arrive
        if n:
            table.take(np.arange(n), frames, index.astype(np.int64))
        rb._layout, rb._k, rb._frame_shape, rb._dtype = layout, k, fs, dt
        rb._obs_shape = C.observation_shape(fs, k, layout)
        rb._pool, rb._table = pool, table
    elif n:
        raise ValueError("transitions without frames")
    grow(rb, n)
    rb._actions[:n] = actions
    rb._rewards[:n] = rewards
    rb._flags[:n] = flags
    rb._env[:n] = envs
    rb._pos, rb._full, rb._n_skip = pos, full, n_skip
    relink(rb)
    rb._rng = rng
    return rb


def relink(rb: ReplayBuffer) -> None:
    """Rebuild each stream's links from ``_env``: its transitions in ring order."""
    n = len(rb)
    rb._next[:] = -1
    rb._last[:] = -1
    if n == 0:
        return
    order = np.roll(np.arange(n), -rb._pos) if rb._full else np.arange(n)  # oldest first
    by_env = order[np.argsort(rb._env[order], kind="stable")]
    envs = rb._env[by_env]
    same = envs[1:] == envs[:-1]
    rb._next[by_env[:-1][same]] = by_env[1:][same]
    ends = np.flatnonzero(np.append(~same, True))
    rb._last[envs[ends]] = by_env[ends]


def read_frames(ar: Archive, pool, references: int, name: str = "frames"):
    """Decode the ``frames`` entry into ``pool``: a LazyBatch ``(F, 1)``, None if F is 0.

    The entry's size was checked against its header (:meth:`Archive.open`), and ``F``
    against the ``references`` the slot table makes (a saved frame is referenced at
    least once), before any frame is pushed; frames are read ``_CHUNK_BYTES`` at a time.
    """
    fs, dt = tuple(pool.frame_shape), np.dtype(pool.dtype)
    fb = math.prod(fs) * dt.itemsize
    f, shape, _ = ar.open(name, None, dt)
    with f:
        if len(shape) != len(fs) + 1 or tuple(shape[1:]) != fs:
            raise ValueError(f"{name} entry has shape {shape}, expected (F, *{fs})")
        nf = shape[0]
        if nf > references:
            raise ValueError(f"{nf} frames for {references} frame references")
        step = max(1, _CHUNK_BYTES // fb)
        parts = []
        for i in range(0, nf, step):
            m = min(step, nf - i)
            buf = f.read(m * fb)
            if len(buf) != m * fb:
                raise ValueError(f"{name} entry is truncated")
            parts.append(pool.push_batch(np.frombuffer(buf, dt).reshape((m,) + fs), k=1))
    if len(parts) <= 1:
        return parts[0] if parts else None
    # one source for SlotTable.take; the parts hold the frames until it has them
    return pool.lazy_batch(np.concatenate([p.slots for p in parts]))
