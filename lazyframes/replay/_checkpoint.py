"""ReplayBuffer checkpoints: the ``.npz`` file format, :meth:`save` and :meth:`load`.

An archive (zip, stored uncompressed) of ``.npy`` entries, no pickled objects:

- ``meta``: a JSON string (``format``, ``version``, the constructor arguments, the
  geometry, the compression options, the write position and the sampling RNG state);
- ``frames``: ``(F, *frame_shape)``, every frame the stored transitions refer to, once,
  when the buffer does not compress; when it does (``meta["compression"]``), the same
  frames as an ``encode_frames`` container of those options: ``frame_blobs`` (uint8, the
  payload), ``frame_offsets`` (int64 ``(F + 1,)``), ``frame_kinds`` (uint8 ``(F,)``).
  Frames are numbered in the order each stream's transitions first show them, so the
  XOR deltas of the container are mostly against the previous frame in time;
- ``obs_index``, ``next_index``: int32 ``(n, k)``, each transition's frames as indices
  into ``frames``;
- ``actions``, ``rewards``, ``flags``: the first ``n`` entries of the buffer's arrays;
- ``env_ids`` (version 2): int32 ``(n,)``, each transition's env stream. The links of
  each stream (its transitions in ring order) are rebuilt from them;
- optional entries of subclasses (``_OPTIONAL``), with their meta keys
  (``ReplayBuffer._extra_state``): ``priorities``, float64 ``(n,)``, and meta
  ``prioritized`` of a ``PrioritizedReplayBuffer``. A plain ``ReplayBuffer`` loads
  such a file and ignores them.
- Dict observations (version 2 and later): ``meta["leaves"]`` lists the leaves (key, and the
  geometry of a frame leaf or the shape and dtype of a vector leaf), and leaf ``i`` has
  the entries ``frames_i``, ``obs_index_i``, ``next_index_i`` (a frame leaf, as above; raw,
  also when the buffer compresses)
  or ``obs_i``, ``next_obs_i`` (a vector leaf, ``(n, *shape)``) in place of ``frames``,
  ``obs_index`` and ``next_index`` (:mod:`._dict`). Readers before them refuse such a
  file as having unexpected entries.

Version 3 added the compression options and the container (a version-2 file holds raw
frames and loads as a buffer that does not compress). Version 1 (one transition per env
per row) has ``row`` in place of ``pos`` and no ``env_ids``: position ``i`` holds env
``i % num_envs``. Every version is read.

A checkpoint is untrusted input: before anything is allocated, every entry's declared
size is checked against the bytes the file really holds (stored, not deflated, zip
members inside the file; ``.npy`` headers whose shape and dtype are the expected ones
and whose data is exactly the member's size), and the sizes declared in ``meta`` are
bounded by the file's size (:func:`check_capacity`); the tables are sized by the
transitions the file holds, not by its declared capacity. So ``load`` costs time and
memory of a small multiple of the file. Frames are streamed in chunks both ways
(:func:`write_frames` and :func:`read_frames`, :func:`write_blobs` and :func:`read_blobs`,
the places frame bytes are encoded and decoded), so neither needs a second copy of the
buffer; a compressed container also bounds the bytes it decodes to, in all and at once,
by the file's size.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import stat
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
#: Version of the file format written by :func:`save`; :func:`read` also reads 1 and 2.
_VERSION = 3
_CHUNK_BYTES = 64 << 20  # frames are written/read this many bytes at a time
_PIECE = 256  # frames a compressed container is encoded this many at a time
_DECODE_BYTES = 8 << 20  # and decoded (and spooled, copied) this many bytes at a time
#: The per-env table ``load`` allocates (8 bytes per env) is bounded by this many envs,
#: or the file's size in bytes if larger. The per-transition tables are sized by the
#: transitions the file holds, not by the declared capacity (:func:`check_capacity`).
_ENV_FLOOR = 1 << 20
#: A transition's table bytes (slot ids, action, ...) are bounded by this many bytes,
#: or the file's size if larger.
_ROW_FLOOR = 1 << 20
#: What ``load`` may allocate from declared numbers at once: a subclass's tables of the
#: whole declared capacity (the priority trees of a ``PrioritizedReplayBuffer``) and the
#: frames of a compressed container held uncompressed at once are bounded by this many
#: bytes, or ``_TABLE_FACTOR`` times the file's size if larger.
_TABLE_FLOOR = 1 << 30
_TABLE_FACTOR = 16
#: Entries of the archive, by version.
_ENTRIES = {
    1: {"meta", "frames", "obs_index", "next_index", "actions", "rewards", "flags"},
    2: {"meta", "frames", "obs_index", "next_index", "actions", "rewards", "flags", "env_ids"},
}
#: Version 3: the frames of a compressing buffer as a compressed container, else as in 2.
_BLOBS = {"frame_blobs", "frame_offsets", "frame_kinds"}
_ENTRIES[3] = _ENTRIES[2] | _BLOBS
#: Frames a compressed container may make ``load`` decode: ``_TABLE_FLOOR`` bytes, or
#: this many times the file's size if larger (Atari frames compress ~15-50x), and
#: hold uncompressed at once: ``max(_TABLE_FLOOR, _TABLE_FACTOR * file_size)`` bytes.
_INFLATE_FACTOR = 1024
#: Entries a subclass may add to any version (read by its ``_restore_extra``).
_OPTIONAL = {"priorities"}


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
        "compression": (
            rb._compress if rb._pool is None or isinstance(rb._pool, dict) else rb._pool.compression
        ),
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


def stream_order(rb: ReplayBuffer) -> np.ndarray:
    """The positions of the stored transitions, stream by stream, each oldest first."""
    n = len(rb)
    order = np.roll(np.arange(n), -rb._pos) if rb._full else np.arange(n)  # oldest first
    return order[np.argsort(rb._env[order], kind="stable")]


def write_archive(rb: ReplayBuffer, fh) -> None:
    """Write the archive's entries to the open file ``fh``.

    Frames are numbered in the order the transitions of each stream first show them
    (each stream's frames in time order), so a frame's neighbour in the file is
    usually its previous frame: what the XOR deltas of a compressed container need.
    """
    n = len(rb)
    arrays = {}
    frame_ids = None
    if rb._table is not None:
        ids = rb._table.ids(np.arange(n))
        uniq, first = np.unique(ids[stream_order(rb)], return_index=True)
        by_time = np.argsort(first, kind="stable")
        frame_ids = uniq[by_time]
        number = np.empty(uniq.size, np.int32)
        number[by_time] = np.arange(uniq.size, dtype=np.int32)
        index = number[np.searchsorted(uniq, ids)]
        arrays["obs_index"] = index[:, : rb._k]
        arrays["next_index"] = index[:, rb._k :]
    arrays["actions"] = rb._actions[:n]
    arrays["rewards"] = rb._rewards[:n]
    arrays["flags"] = rb._flags[:n]
    arrays["env_ids"] = rb._env[:n]
    extra_meta, extra_arrays = rb._extra_state()
    arrays.update(extra_arrays)
    meta = {**header(rb), **extra_meta}
    frame_sets = []  # (entry, pool, frame ids, frame shape, dtype): raw frames
    if rb._leaves is not None:  # Dict observations: entries by leaf (see _dict)
        meta["leaves"], more, frame_sets = _dict.archive(rb, n)
        arrays.update(more)
    elif frame_ids is not None and meta["compression"] is None:
        frame_sets.append(("frames", rb._pool, frame_ids, rb._frame_shape, rb._dtype))
    arrays["meta"] = np.array(json.dumps(meta))
    with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, arr in arrays.items():
            write_entry(zf, name, arr)
        if frame_ids is not None and meta["compression"] is not None:
            write_blobs(zf, rb._pool, frame_ids, meta["compression"])
        for name, pool, ids, fs, dt in frame_sets:
            with zf.open(name + ".npy", "w", force_zip64=True) as f:
                write_frames(f, pool, ids, fs, dt)


def write_entry(zf: zipfile.ZipFile, name: str, arr: np.ndarray) -> None:
    """Write ``arr`` as the entry ``name`` (``name.npy``) of the open archive."""
    with zf.open(name + ".npy", "w", force_zip64=True) as f:
        np.lib.format.write_array(f, np.require(arr, requirements="C"), allow_pickle=False)


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


def write_blobs(zf: zipfile.ZipFile, pool, frame_ids: np.ndarray, opts: dict) -> None:
    """The frames ``frame_ids`` of ``pool`` as a compressed container: three entries.

    ``frame_blobs`` (uint8, the payload), ``frame_offsets`` (int64 ``(F + 1,)``) and
    ``frame_kinds`` (uint8 ``(F,)``), as ``encode_frames(frames, **opts)`` returns them
    for all ``F`` frames: each piece of ``_PIECE`` frames (a multiple of the group) is
    gathered, encoded and spooled, so no second copy of the buffer is made (and the
    gather's scratch stays small: the pool keeps it as its spare).
    :func:`read_blobs` decodes it.
    """
    encode = core_of(pool).encode_frames
    fb, group = pool.frame_bytes, opts["group"]
    step = max(1, min(_PIECE, _CHUNK_BYTES // fb) // group) * group
    offsets, kinds = [np.zeros(1, np.int64)], [np.zeros(0, np.uint8)]
    with tempfile.SpooledTemporaryFile(max_size=_DECODE_BYTES) as spool:
        for i in range(0, frame_ids.size, step):
            frames = pool.gather(frame_ids[i : i + step, None], layout="stack")
            payload, offs, kds = encode(frames[:, 0], **opts)
            offsets.append(offs[1:] + offsets[-1][-1])
            kinds.append(kds)
            spool.write(payload)
        write_entry(zf, "frame_offsets", np.concatenate(offsets))
        write_entry(zf, "frame_kinds", np.concatenate(kinds))
        size = int(offsets[-1][-1])
        spool.seek(0)
        with zf.open("frame_blobs.npy", "w", force_zip64=True) as f:
            header = {"descr": "|u1", "fortran_order": False, "shape": (size,)}
            np.lib.format.write_array_header_2_0(f, header)
            shutil.copyfileobj(spool, f, _DECODE_BYTES)


def load(cls: type[ReplayBuffer], path, *, pool=None) -> ReplayBuffer:
    """ReplayBuffer.load: open ``path`` and read it; every failure is a ValueError."""
    _dict.check_pools(pool)
    try:
        # O_NONBLOCK: opening a FIFO would block until a writer came
        fh = os.fdopen(os.open(os.fspath(path), os.O_RDONLY | os.O_NONBLOCK), "rb")
    except FileNotFoundError:
        raise
    except OSError as e:
        raise ValueError(f"{path}: not a ReplayBuffer checkpoint ({type(e).__name__}: {e})") from e
    if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
        fh.close()
        raise ValueError(f"{path}: not a ReplayBuffer checkpoint (not a regular file)")
    with fh:
        return read_file(cls, fh, os.fstat(fh.fileno()).st_size, pool, f"{path}: ")


def read_file(cls: type[ReplayBuffer], fh, size: int, pool, where: str = "") -> ReplayBuffer:
    """A buffer from the open checkpoint ``fh`` of ``size`` bytes; every failure a ValueError.

    ``where`` prefixes the messages (the path).
    """
    try:
        try:
            zf = zipfile.ZipFile(fh)
        except Exception as e:
            raise ValueError(f"not a ReplayBuffer checkpoint ({type(e).__name__}: {e})") from e
        with zf:
            return read(cls, Archive(zf, size), pool)
    except ValueError as e:
        raise ValueError(f"{where}{e}") from e
    except Exception as e:
        raise ValueError(f"{where}corrupt ReplayBuffer checkpoint ({type(e).__name__}: {e})") from e


def to_bytes(rb: ReplayBuffer) -> bytes:
    """The checkpoint of ``rb`` as bytes (what :func:`save` writes): its pickle."""
    fh = io.BytesIO()
    write_archive(rb, fh)
    return fh.getvalue()


def from_bytes(cls: type[ReplayBuffer], data) -> ReplayBuffer:
    """A buffer from the bytes of a checkpoint, checked as :func:`load` checks a file.

    Raises:
        TypeError: ``cls`` is not a ReplayBuffer class, ``data`` not bytes.
        ValueError: as :func:`load`.
    """
    from . import ReplayBuffer

    if not (isinstance(cls, type) and issubclass(cls, ReplayBuffer)):
        raise TypeError(f"cannot restore a ReplayBuffer as {cls!r}")
    if not isinstance(data, bytes):
        raise TypeError(f"a ReplayBuffer restores from bytes, got {type(data).__name__}")
    return read_file(cls, io.BytesIO(data), len(data), None)


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


def check_capacity(meta: dict, file_size: int, extra: int = 0) -> None:
    """Refuse declared sizes that would make ``load`` or the next add cost more than the file.

    ``load`` sizes the per-transition tables by the transitions the file holds (whose
    entries are checked against the file, :class:`Archive`), not by the declared
    capacity: a large capacity costs memory only as transitions are added. What it
    allocates from declared numbers alone is bounded here: the per-env table
    (``num_envs`` up to ``max(_ENV_FLOOR, file_size)``), a transition's table bytes
    (up to ``max(_ROW_FLOOR, file_size)``, the rows the next add grows by) and
    ``extra`` bytes per transition of the whole capacity that a subclass allocates at
    once (a ``PrioritizedReplayBuffer``'s trees: up to ``max(_TABLE_FLOOR,
    _TABLE_FACTOR * file_size)``).

    Raises:
        ValueError: a capacity, number of envs, stack size or action shape out of
            those bounds.
    """
    capacity = bounded_int(meta, "capacity", 1, np.iinfo(np.int64).max)
    if capacity * extra > max(_TABLE_FLOOR, _TABLE_FACTOR * file_size):
        raise ValueError(
            f"declared capacity {capacity} needs {capacity * extra} bytes of priority "
            f"trees, more than {max(_TABLE_FLOOR, _TABLE_FACTOR * file_size)} for a file "
            f"of {file_size} bytes"
        )
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
    allowed = _ENTRIES[version] | _OPTIONAL | _dict.entry_names(meta.get("leaves"))
    if not ar.names() <= allowed:
        raise ValueError(f"unexpected entries {sorted(ar.names() - allowed)}")
    check_capacity(meta, ar.size, getattr(cls, "_EXTRA_BYTES_PER_TRANSITION", 0))
    try:
        compression = C.compression(meta.get("compression"))
    except TypeError as e:
        raise ValueError(f"bad meta 'compression': {e}") from None
    other = ar.names() & (_BLOBS if compression is None else {"frames"})
    if other:
        raise ValueError(
            f"unexpected entries {sorted(other)}: the meta says the frames are "
            f"{'not ' if compression is None else ''}compressed"
        )
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
        compress=compression,
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
            pool = own_pool(fs, dt, rb._capacity, compression)
        else:
            check_pool_geometry(pool, fs, dt)
        table = core_of(pool).SlotTable(pool, n, 2 * k)  # grown as transitions arrive
        if compression is None:
            frames = read_frames(ar, pool, index.size)
            nf = 0 if frames is None else len(frames)
            if index.size and (index.min() < 0 or index.max() >= nf):
                raise ValueError("slot table refers to a frame that is not in the file")
            if n:
                table.take(np.arange(n), frames, index.astype(np.int64))
        else:
            read_blobs(ar, table, index)
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
    rb._restore_extra(meta, ar)
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


def read_blobs(ar: Archive, table, index: np.ndarray) -> None:
    """Decode the compressed container into ``table``'s pool, and fill the table.

    ``index`` ``(n, 2k)`` numbers each transition's frames in the container. The rows
    are filled in chunks, in the order of the newest frame they need, the frames
    decoded as they are first needed and dropped once every row that refers to them
    is filled: a compressing pool compresses them while loading, so the frames held
    uncompressed at once are about one chunk's. Before any frame is decoded:
    ``F`` is checked against the references, every frame must be referred to, and the
    bytes decoded in all and held at once against the file's size.
    """
    pool = table.pool
    fs, dt = tuple(pool.frame_shape), np.dtype(pool.dtype)
    fb = math.prod(fs) * dt.itemsize
    n, width = index.shape
    f, shape, _ = ar.open("frame_offsets", None, np.int64)
    with f:
        if len(shape) != 1 or not 1 <= shape[0] <= index.size + 1:
            raise ValueError(f"frame_offsets entry has shape {shape} for {index.size} references")
        offsets = np.frombuffer(f.read(shape[0] * 8), np.int64)
    nf = offsets.size - 1
    kinds = ar.array("frame_kinds", (nf,), np.uint8)
    blobs, shape, _ = ar.open("frame_blobs", None, np.uint8)
    with blobs:
        if len(shape) != 1 or offsets[0] != 0 or offsets[-1] != shape[0]:
            raise ValueError("frame_offsets do not span the frame_blobs entry")
        if (np.diff(offsets) <= 0).any():
            raise ValueError("frame_offsets must increase")
        if index.size and (index.min() < 0 or index.max() >= nf):
            raise ValueError("slot table refers to a frame that is not in the file")
        if nf * fb > max(_TABLE_FLOOR, _INFLATE_FACTOR * ar.size):
            raise ValueError(f"{nf} frames of {fb} bytes: a decompression bomb")
        if n == 0:
            return
        # rows by their newest frame, in chunks; the chunk that last needs each frame
        newest = index.max(axis=1)
        rows = np.argsort(newest, kind="stable")
        per = max(1, _DECODE_BYTES // fb)
        chunk = np.empty(n, np.int64)
        chunk[rows] = np.arange(n) // per
        last = np.full(nf, -1, np.int64)
        np.maximum.at(last, index.ravel(), np.repeat(chunk, width))
        if (last < 0).any():
            raise ValueError("a frame of the file is in no transition")
        ends = np.minimum(np.arange(1, -(-n // per) + 1) * per, n) - 1
        need = newest[rows[ends]].astype(np.int64) + 1  # frames decoded by each chunk
        first = np.searchsorted(need, np.arange(nf), side="right")  # chunk decoding f
        live = np.cumsum(
            np.bincount(first, minlength=need.size + 1)
            - np.bincount(last + 1, minlength=need.size + 1)
        )
        if live.max() * fb > max(_TABLE_FLOOR, _TABLE_FACTOR * ar.size):
            raise ValueError(f"{live.max()} frames of {fb} bytes would be held at once")
        decode = core_of(pool).decode_frames
        slots = np.full(nf, -1, np.int64)
        holders: dict = {}  # chunk -> LazyBatches holding the frames it is the last to need
        prev = None  # the last frame decoded, for a delta that starts a piece
        done = 0
        for c in range(need.size):
            while done < need[c]:  # decode frames [done, stop) in pieces of <= per frames
                stop = min(int(need[c]), done + per)
                lo, hi = int(offsets[done]), int(offsets[stop])
                payload = blobs.read(hi - lo)
                if len(payload) != hi - lo:
                    raise ValueError("frame_blobs entry is truncated")
                offs, kds = offsets[done : stop + 1] - lo, kinds[done:stop]
                if kds[0] == C.KIND_DELTA and prev is not None:  # the previous frame, raw
                    payload, offs = prev.tobytes() + payload, np.append(0, offs + fb)
                    kds = np.append(np.uint8(C.KIND_RAW), kds)
                frames = decode(payload, offs, kds, fs, dt)[-(stop - done) :]
                part = pool.push_batch(frames, k=1)
                slots[done:stop] = part.slots[:, 0]
                for h in np.unique(last[done:stop]).tolist():
                    mine = slots[done:stop][last[done:stop] == h]
                    holders.setdefault(h, []).append(pool.lazy_batch(mine[:, None]))
                prev, part = frames[-1], None
                done = stop
            mine = rows[c * per : (c + 1) * per]
            used, at = np.unique(index[mine], return_inverse=True)
            source = pool.lazy_batch(slots[used][:, None])
            table.take(mine, source, at.reshape(mine.size, width))
            source = None
            holders.pop(c, None)
        # compress what the last chunk left hot: it happens at the end of a take
        none = np.zeros((0, width), np.int64)
        table.take(none[:, 0], pool.lazy_batch(slots[:1, None]), none)
