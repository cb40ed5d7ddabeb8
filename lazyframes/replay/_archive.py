"""ReplayBuffer checkpoints: the ``.npz`` file format (docs/CHECKPOINTS.md), written and read.

An archive of ``.npy`` entries, no pickled objects. A checkpoint is untrusted input: every
declared size is checked against the bytes the file really holds, and bounded by the file's
size, before anything is allocated; frames are streamed in chunks both ways.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import shutil
import stat
import tempfile
import zipfile
from typing import Any, NamedTuple

import numpy as np

from .. import _checks as C
from .. import _core
from . import _extras
from ._npz import FORMAT, Archive, write_entry
from ._ring import SKIP, TERM, TRUNC
from ._store import (
    FrameStore,
    Geometry,
    VectorStore,
    check_pool,
    check_pool_geometry,
    leaf_names,
    own_pool,
)

#: Version of the file format written; versions 1 to 5 are read too.
_VERSION = 6
_CHUNK_BYTES = 64 << 20  # frames are written/read this many bytes at a time
_PIECE = 256  # frames a compressed container is encoded this many at a time
_DECODE_BYTES = 8 << 20  # and decoded (and spooled, copied) this many bytes at a time
#: What ``load`` allocates from declared numbers (docs/CHECKPOINTS.md, "Bounds"): at most
#: a floor, or a multiple of the file's size if larger.
_ENV_FLOOR = 1 << 20  # envs of the per-env table (8 bytes each), or the file's bytes
_ROW_FLOOR = 1 << 20  # bytes of a transition's tables, or the file's bytes
_TABLE_FLOOR = 1 << 30  # bytes of whole-capacity tables and of frames held decoded at once,
_TABLE_FACTOR = 16  # or this many times the file's bytes
_INFLATE_FACTOR = 1024  # frames decoded in all: _TABLE_FLOOR, or this many times the file's bytes
#: Entries of the archive (a plain buffer's), by version; version 3 adds the compressed
#: container of a compressing buffer's frames (version 5: which may hold KIND_PACKED_BLOSC
#: blobs; version 6: KIND_PACKED ones instead).
_BLOBS = ("frame_blobs", "frame_offsets", "frame_kinds")
_ENTRIES = {1: {"meta", "frames", "obs_index", "next_index", "actions", "rewards", "flags"}}
_ENTRIES[2] = _ENTRIES[1] | {"env_ids"}
_ENTRIES[3] = _ENTRIES[4] = _ENTRIES[5] = _ENTRIES[6] = _ENTRIES[2] | set(_BLOBS)
#: Entries a subclass may add to any version (read by its ``_restore_extra``).
_OPTIONAL = {"priorities"}
#: At most this many leaves in a checkpoint's ``meta["leaves"]``.
MAX_LEAVES = 1024


class State(NamedTuple):
    """What a buffer hands to the writer: its meta, ring, stores and extra entries."""

    meta: dict
    ring: Any
    keys: tuple | None
    stores: tuple
    compression: dict | None
    extra: dict


class Restored(NamedTuple):
    """A read checkpoint, every part checked: what a buffer restores itself from.

    ``pool_opt``: the constructor's ``pool`` (the pool, or dict of pools, the frames
    were loaded into); ``stores``: the restored stores (empty before a first add);
    ``ring``: ``(pos, full, env, columns)``, the columns actions, rewards, flags and the
    per-step extras; ``extras``: the declarations ``(per step, per start)`` as the
    constructor takes them and the stored starts ``(positions, arrays)`` (or None);
    ``archive``: the open :class:`Archive`, for a subclass's entries.
    """

    meta: dict
    compression: dict | None
    pool_opt: Any
    keys: tuple | None
    stores: tuple
    ring: tuple
    rng: np.random.Generator
    extras: tuple
    archive: Any

    def fill(self, ring) -> None:
        """Restore ``ring``'s transitions."""
        pos, full, env, columns = self.ring
        ring.load(pos, full, env, columns)


# -- writing --------------------------------------------------------------------------
def save(state: State, path) -> None:
    """The archive into a temporary file of ``path``'s directory, renamed over ``path``.

    The temporary file is ``<name>.<pid>.<random>.tmp``: a save killed before its rename
    leaves one, which the next save to ``path`` removes once that pid is not running (a
    live process's save, this one's included, is never touched).
    """
    path = os.fspath(path)
    d, base = os.path.split(os.path.abspath(path))
    _remove_dead_temporaries(d, base)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=f"{base}.{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write_archive(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _remove_dead_temporaries(d: str, base: str) -> None:
    """Remove the temporary files of saves to ``d/base`` whose writing process is gone."""
    pattern = re.compile(re.escape(base) + r"\.(\d+)\.[a-z0-9_]+\.tmp")
    with contextlib.suppress(OSError):
        for name in os.listdir(d):
            m = pattern.fullmatch(name)
            if m is not None and not C.process_exists(int(m.group(1))):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(d, name))


def decode_piece(payload, offsets, kinds, before, frame_shape, dtype) -> tuple:
    """``(frames, group)``: consecutive blobs' frames, and the group the next blobs continue.

    The blobs are a container's (``offsets`` from 0 in ``payload``). ``before``: None for
    the container's first piece, else the ``group`` the previous piece returned: a
    container decoded piece by piece, never whole (checkpoints, messages), holds at most
    a group (64 frames) beside the piece.
    """
    frames = _core.decode_frames(payload, offsets, kinds, frame_shape, dtype, before=before)
    if not len(kinds):
        return frames, before
    keys = np.flatnonzero((kinds == _core.KIND_KEY) | (kinds == _core.KIND_RAW))
    group = frames[keys[-1] :] if keys.size else np.concatenate([before, frames])
    return frames, group[-C.MAX_GROUP :].copy()  # a DELTA refers to the frame before only


def to_bytes(state: State) -> bytes:
    """The checkpoint as bytes (what :func:`save` writes): a buffer's pickle."""
    fh = io.BytesIO()
    write_archive(state, fh)
    return fh.getvalue()


def write_archive(state: State, fh) -> None:
    """Write the archive's entries to the open file ``fh``."""
    ring = state.ring
    n = len(ring)
    order = ring.order()
    stream_order = order[np.argsort(ring.env[order], kind="stable")]  # each stream, oldest first
    meta = {"format": FORMAT, "version": _VERSION, **state.meta}
    meta.update(
        compression=state.compression, pos=ring.pos, full=ring.full, n_skip=ring.n_skip,
        layout=None, stack_size=None, frame_shape=None, frame_dtype=None,
    )  # fmt: skip
    arrays = {
        "actions": ring.actions[:n],
        "rewards": ring.rewards[:n],
        "flags": ring.flags[:n],
        "env_ids": ring.env[:n].astype(np.int32),  # the file keeps int32
    }
    for j, column in enumerate(ring.columns[3:]):  # per-step extras (declared in meta)
        arrays[f"extra_{j}"] = column[:n]
    frame_sets = []  # (suffix, store)
    if state.keys is None:
        if state.stores:
            meta.update(state.stores[0].geometry.meta())
            frame_sets.append(("", state.stores[0]))
    else:
        meta["leaves"] = []
        for i, (key, s) in enumerate(zip(state.keys, state.stores, strict=True)):
            if isinstance(s, FrameStore):
                meta["leaves"].append({"key": key, "kind": "frames", **s.geometry.meta()})
                frame_sets.append((f"_{i}", s))
            else:
                meta["leaves"].append(
                    {"key": key, "kind": "vector", "shape": list(s.shape), "dtype": s.dtype.str}
                )
                arrays[f"obs_{i}"], arrays[f"next_obs_{i}"] = s.arrays(n)
    framed = []
    for sfx, s in frame_sets:
        ids = s.frame_ids(n)
        uniq, first = np.unique(ids[stream_order], return_index=True)
        by_time = np.argsort(first, kind="stable")
        number = np.empty(uniq.size, np.int32)
        number[by_time] = np.arange(uniq.size, dtype=np.int32)
        index = number[np.searchsorted(uniq, ids)]
        k = s.geometry.k
        arrays[f"obs_index{sfx}"], arrays[f"next_index{sfx}"] = index[:, :k], index[:, k:]
        framed.append((sfx, s, uniq[by_time]))
    arrays.update(state.extra)
    arrays["meta"] = np.array(json.dumps(meta))
    with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, arr in arrays.items():
            write_entry(zf, name, arr)
        for sfx, s, frame_ids in framed:
            if state.compression is not None:
                write_blobs(zf, s.pool, frame_ids, state.compression, sfx)
            else:
                g = s.geometry
                with zf.open(f"frames{sfx}.npy", "w", force_zip64=True) as f:
                    write_frames(f, s.pool, frame_ids, g.frame_shape, g.dtype)


# -- reading --------------------------------------------------------------------------
def load(path, cls, pool) -> Any:
    """``cls.load(path, pool=pool)``: open ``path`` and read it; every failure a ValueError.

    ``cls`` is a ReplayBuffer class: ``cls._restore(restored)`` makes the buffer, and
    ``cls._EXTRA_BYTES_PER_TRANSITION`` bounds what it allocates for the capacity.
    """
    for p in pool.values() if isinstance(pool, dict) else [pool]:
        check_pool(p)  # TypeError unless None or a FramePool
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


def from_bytes(cls, data: bytes) -> Any:
    """A buffer of class ``cls`` from the bytes of a checkpoint, checked as :func:`load`."""
    return read_file(cls, io.BytesIO(data), len(data), None)


def read_file(cls, fh, size: int, pool, where: str = "") -> Any:
    """A buffer from the open checkpoint ``fh`` of ``size`` bytes; every failure a ValueError.

    ``where`` prefixes the messages (the path).
    """
    try:
        try:
            zf = zipfile.ZipFile(fh)
        except Exception as e:
            raise ValueError(f"not a ReplayBuffer checkpoint ({type(e).__name__}: {e})") from e
        with zf:
            return cls._restore(read(Archive(zf, size), pool, cls._EXTRA_BYTES_PER_TRANSITION))
    except ValueError as e:
        raise ValueError(f"{where}{e}") from e
    except Exception as e:
        raise ValueError(f"{where}corrupt ReplayBuffer checkpoint ({type(e).__name__}: {e})") from e


def read(ar: Archive, pool, extra_bytes: int) -> Restored:
    """The checked contents of the archive ``ar``; frames loaded into ``pool`` (or new ones)."""
    meta = ar.meta()
    version = meta.get("version")
    if version not in _ENTRIES:
        raise ValueError(
            f"checkpoint version {version!r} is not supported (this lazyframes reads "
            f"versions {sorted(_ENTRIES)})"
        )
    leaves = meta.get("leaves")
    try:
        step_spec = _extras.declared(_declaration(meta, "extras"), "extras")
        start_spec = _extras.declared(_declaration(meta, "start_extras"), "start_extras")
    except (TypeError, ValueError) as e:
        raise ValueError(f"bad meta extras: {e}") from None
    allowed = _ENTRIES[version] | _OPTIONAL | _leaf_entries(leaves, version)
    allowed |= {f"extra_{j}" for j in range(len(step_spec))}
    has_starts = meta.get("start_extras") is not None
    if has_starts:
        allowed |= {"start_positions"} | {f"start_extra_{j}" for j in range(len(start_spec))}
    if not ar.names() <= allowed:
        raise ValueError(f"unexpected entries {sorted(ar.names() - allowed)}")
    check_capacity(meta, ar.size, extra_bytes + 8 * has_starts)
    try:
        compression = C.compression(meta.get("compression"))
    except TypeError as e:
        raise ValueError(f"bad meta 'compression': {e}") from None
    capacity = bounded_int(meta, "capacity", 1, 2**59)
    num_envs = bounded_int(meta, "num_envs", 1, capacity)
    capacity = capacity // num_envs * num_envs
    full = meta.get("full")
    if not isinstance(full, bool):
        raise ValueError(f"meta 'full' must be a bool, got {full!r}")
    if version == 1:
        pos = bounded_int(meta, "row", 0, capacity // num_envs - 1) * num_envs
    else:
        pos = bounded_int(meta, "pos", 0, capacity - 1)
    n = capacity if full else pos
    shape = tuple(meta["action_shape"])
    actions = ar.array("actions", (n,) + shape, np.dtype(meta["action_dtype"]))
    rewards = ar.array("rewards", (n,), np.float32)
    flags = ar.array("flags", (n,), np.uint8)
    if version == 1:
        envs = np.arange(n, dtype=np.int32) % num_envs
    else:
        envs = ar.array("env_ids", (n,), np.int32)
    if np.any(flags & ~np.uint8(TERM | TRUNC | SKIP)):
        raise ValueError("bad flags")
    if int(np.count_nonzero(flags & SKIP)) != meta.get("n_skip"):
        raise ValueError("inconsistent autoreset count")
    rng = rng_of(meta.get("rng"))
    opts = {"layout": meta.get("layout_opt"), "stack_size": meta.get("stack_size_opt")}
    stores: tuple = ()
    keys, pool_opt = None, pool
    if leaves is not None:
        keys, stores = _read_leaves(ar, leaves, n, pool, capacity, compression, version, opts)
        pool_opt = {
            key: s.pool for key, s in zip(keys, stores, strict=True) if isinstance(s, FrameStore)
        }
    elif meta.get("layout") is not None:
        if isinstance(pool, dict):
            raise ValueError("pool is a dict, but the file holds single observations")
        store = _read_frames(
            ar, meta, "", n, pool, capacity, compression, compression is not None, opts
        )
        stores, pool_opt = (store,), store.pool
    elif n:
        raise ValueError("transitions without frames")
    columns = [actions, rewards, flags]
    columns += [ar.array(f"extra_{j}", (n, *sh), dt) for j, (_, sh, dt) in enumerate(step_spec)]
    starts = None
    if has_starts:
        f, shape, _ = ar.open("start_positions", None, np.int64)
        f.close()
        if len(shape) != 1 or shape[0] > n:
            raise ValueError(f"entry 'start_positions' has shape {shape}, expected at most ({n},)")
        m = shape[0]
        sp = ar.array("start_positions", (m,), np.int64)
        if m and (sp.min() < 0 or sp.max() >= n or np.unique(sp).size != m):
            raise ValueError("start_positions must be distinct stored positions")
        starts = (sp, [ar.array(f"start_extra_{j}", (m, *sh), dt)
                       for j, (_, sh, dt) in enumerate(start_spec)])  # fmt: skip
    declared = (
        {name: (sh, dt) for name, sh, dt in step_spec} or None,
        {name: (sh, dt) for name, sh, dt in start_spec} if has_starts else None,
    )
    ring = (pos, full, envs, tuple(columns))
    return Restored(meta, compression, pool_opt, keys, stores, ring, rng, (*declared, starts), ar)


def _declaration(meta: dict, key: str):
    """``meta[key]`` (``[[name, shape, dtype], ...]``, or missing) as ``{name: (shape, dtype)}``."""
    decl = meta.get(key)
    if decl is None:
        return None
    if not isinstance(decl, list) or not all(isinstance(d, list) and len(d) == 3 for d in decl):
        raise ValueError(f"meta {key!r} must be a list of [name, shape, dtype]")
    out = {d[0]: (d[1], d[2]) for d in decl}
    if len(out) != len(decl):
        raise ValueError(f"meta {key!r} repeats a name")
    return out


def _read_frames(ar: Archive, m: dict, sfx: str, n: int, pool, capacity: int, compression,
                 blobs: bool, opts, names=("obs", "next_obs", "final_obs")):  # fmt: skip
    """A frame store from its entries (suffix ``sfx``) and description ``m``.

    The pool compresses (``compression``) before any frame is pushed, so the frames are
    compressed as the table takes them; ``blobs``: the frames are a compressed container
    (else raw frames).
    """
    wrong = {f"frames{sfx}"} if blobs else {f"{b}{sfx}" for b in _BLOBS}
    if ar.names() & wrong:
        raise ValueError(
            f"unexpected entries {sorted(ar.names() & wrong)}: the meta says the frames are "
            f"{'' if blobs else 'not '}compressed"
        )
    k = bounded_int(m, "stack_size", 1, max(_ROW_FLOOR, ar.size))
    fs = C.frame_shape(m.get("frame_shape"))
    dt = C.frame_dtype(m.get("frame_dtype"))
    layout = C.layout_name(m.get("layout"))  # ValueError unless one of C.LAYOUTS
    C.check_layout(layout, fs)
    index = np.concatenate(
        [ar.array(f"{e}_index{sfx}", (n, k), np.int32) for e in ("obs", "next")], axis=1
    )
    divisor = m.get("divisor")  # ScaledFloatFrame's observations (absent: plain frames)
    if divisor is not None and not (isinstance(divisor, float) and 0 < divisor < math.inf):
        raise ValueError(f"bad meta 'divisor': {divisor!r}")
    if pool is None:
        pool = own_pool(fs, dt, capacity, compression)
    else:
        check_pool_geometry(pool, fs, dt)
        if compression is not None:  # before any frame is pushed: they are compressed as loaded
            if blobs and pool.compression is None:  # a refused file leaves the caller's pool
                read_blobs(ar, pool, None, index, sfx)  # as it was: the container checked first
            pool.enable_compression(compression)
    table = _core.SlotTable(pool, n, 2 * k)  # grown as transitions arrive
    if blobs:
        read_blobs(ar, pool, table, index, sfx)
    else:
        frames = read_frames(ar, pool, index.size, f"frames{sfx}")
        nf = 0 if frames is None else len(frames)
        if index.size and (index.min() < 0 or index.max() >= nf):
            raise ValueError("slot table refers to a frame that is not in the file")
        if n:
            table.take(np.arange(n), frames, index.astype(np.int64))
        del frames
        pool.flush()  # the frames only the table holds now: compressed
    store = FrameStore(capacity, pool=pool, compress=compression, names=names, **opts)
    store.restore(Geometry(layout, k, fs, dt, divisor), pool, table)
    return store


def _leaf_entries(leaves, version: int) -> set:
    """The entries a checkpoint's ``meta["leaves"]`` adds (none when it is not a list)."""
    if not isinstance(leaves, list) or len(leaves) > MAX_LEAVES:
        return set()
    names = set()
    for i, leaf in enumerate(leaves):
        kind = leaf.get("kind") if isinstance(leaf, dict) else None
        if kind == "frames":
            names |= {f"frames_{i}", f"obs_index_{i}", f"next_index_{i}"}
            if version >= 4:
                names |= {f"{b}_{i}" for b in _BLOBS}
        elif kind == "vector":
            names |= {f"obs_{i}", f"next_obs_{i}"}
    return names


def _read_leaves(ar: Archive, leaves, n: int, pool, capacity: int, compression, version, opts):
    """``(keys, stores)`` of a Dict buffer from the checked archive (``n`` transitions).

    Every leaf's description is checked, its entries against the file (their shapes
    follow from ``n``), and a vector leaf's row size is bounded as a transition's table
    bytes are (:func:`check_capacity`) before anything is allocated. Frame leaves of
    versions 2 and 3 hold raw frames whatever the compression options.

    Raises:
        ValueError: a bad leaf list, key, geometry, dtype or entry; a ``pool`` that is
            not a dict of pools of the file's frame keys.
    """
    if not isinstance(leaves, list) or not 0 < len(leaves) <= MAX_LEAVES:
        raise ValueError(f"meta 'leaves' must be a list of 1 to {MAX_LEAVES} leaves")
    if pool is not None and not isinstance(pool, dict):
        raise ValueError("the file holds Dict observations: pool must be a dict of FramePools")
    pools = pool or {}
    limit = max(_ROW_FLOOR, ar.size)
    out: dict = {}
    for i, m in enumerate(leaves):
        key = m.get("key") if isinstance(m, dict) else None
        if not isinstance(key, str) or key in out:
            raise ValueError(f"leaf {i}: bad or repeated key {key!r}")
        if m.get("kind") == "frames":
            blobs = compression is not None and version >= 4
            out[key] = _read_frames(
                ar, m, f"_{i}", n, pools.get(key), capacity, compression, blobs, opts,
                leaf_names(key),
            )  # fmt: skip
        elif m.get("kind") == "vector":
            shape = m.get("shape")
            if not isinstance(shape, list) or len(shape) > 32:
                raise ValueError(f"leaf {key!r}: shape must be a short list, got {shape!r}")
            name = f"leaf {key!r} shape"
            shape = tuple(bounded_int({name: d}, name, 0, limit) for d in shape)
            dt = np.dtype(m.get("dtype"))
            if dt.kind not in "biuf" or 2 * math.prod(shape) * dt.itemsize > limit:
                raise ValueError(f"leaf {key!r}: bad dtype {dt} or shape {shape}")
            vec = VectorStore(leaf_names(key))
            vec.restore(
                ar.array(f"obs_{i}", (n,) + shape, dt), ar.array(f"next_obs_{i}", (n,) + shape, dt)
            )
            out[key] = vec
        else:
            raise ValueError(f"leaf {key!r}: unknown kind {m.get('kind')!r}")
    stray = [key for key in pools if not isinstance(out.get(key), FrameStore)]
    if stray:
        raise ValueError(f"pool has keys {stray} that are not frame keys of the file")
    if not any(isinstance(s, FrameStore) for s in out.values()):
        raise ValueError("meta 'leaves' has no frame leaf")
    return tuple(out), tuple(out.values())


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

    The bounds (docs/CHECKPOINTS.md, "Bounds"): ``num_envs``, a transition's table bytes
    and the ``extra`` bytes per transition of the whole capacity that a subclass
    allocates at once (a ``PrioritizedReplayBuffer``'s trees).

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


def write_frames(f, pool, frame_ids: np.ndarray, frame_shape: tuple, dtype: np.dtype) -> None:
    """Encode the frames ``frame_ids`` of ``pool`` into the ``frames`` entry ``f``.

    The entry is an ``.npy`` array ``(F, *frame_shape)`` of raw frame bytes, written in
    chunks of ``_CHUNK_BYTES``; :func:`read_frames` decodes it.
    """
    shape = (frame_ids.size,) + frame_shape
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_2_0(f, header)
    step = max(1, _CHUNK_BYTES // pool.frame_bytes)
    for i in range(0, frame_ids.size, step):
        f.write(pool.gather(frame_ids[i : i + step, None], layout="stack").data)


def write_blobs(zf: zipfile.ZipFile, pool, frame_ids: np.ndarray, opts: dict, sfx: str) -> None:
    """The frames ``frame_ids`` of ``pool`` as a compressed container: three entries.

    ``frame_blobs``, ``frame_offsets`` and ``frame_kinds``, as ``encode_frames(frames,
    **opts)`` returns them for all the frames, encoded ``_PIECE`` frames at a time (the
    gather's scratch stays small: the pool keeps it as its spare).
    """
    encode = _core.encode_frames
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
        write_entry(zf, f"frame_offsets{sfx}", np.concatenate(offsets))
        write_entry(zf, f"frame_kinds{sfx}", np.concatenate(kinds))
        size = int(offsets[-1][-1])
        spool.seek(0)
        with zf.open(f"frame_blobs{sfx}.npy", "w", force_zip64=True) as f:
            header = {"descr": "|u1", "fortran_order": False, "shape": (size,)}
            np.lib.format.write_array_header_2_0(f, header)
            shutil.copyfileobj(spool, f, _DECODE_BYTES)


def read_frames(ar: Archive, pool, references: int, name: str):
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


def read_blobs(ar: Archive, pool, table, index: np.ndarray, sfx: str) -> None:
    """Decode the compressed container into ``pool``, and fill ``table`` (None: only check).

    ``index`` ``(n, 2k)`` numbers each transition's frames in the container. The rows
    are filled in chunks, in the order of the newest frame they need, each frame decoded
    when first needed and dropped once the last row that needs it is filled
    (docs/CHECKPOINTS.md, "Bounds", checked before any frame is decoded). With ``table``
    None the container is decoded piece by piece and every check made, nothing stored.
    """
    fs, dt = tuple(pool.frame_shape), np.dtype(pool.dtype)
    fb = math.prod(fs) * dt.itemsize
    n, width = index.shape
    f, shape, _ = ar.open(f"frame_offsets{sfx}", None, np.int64)
    with f:
        if len(shape) != 1 or not 1 <= shape[0] <= index.size + 1:
            raise ValueError(f"frame_offsets entry has shape {shape} for {index.size} references")
        offsets = np.frombuffer(f.read(shape[0] * 8), np.int64)
    nf = offsets.size - 1
    kinds = ar.array(f"frame_kinds{sfx}", (nf,), np.uint8)
    blobs, shape, _ = ar.open(f"frame_blobs{sfx}", None, np.uint8)
    with blobs:
        if len(shape) != 1 or offsets[0] != 0 or offsets[-1] != shape[0]:
            raise ValueError("frame_offsets do not span the frame_blobs entry")
        if (np.diff(offsets) < 0).any():  # a blob (a patch) may be empty
            raise ValueError("frame_offsets must not decrease")
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
        slots = np.full(nf, -1, np.int64)
        holders: dict = {}  # chunk -> LazyBatches holding the frames it is the last to need
        group = None  # the frames of the group the next piece continues
        done = 0
        for c in range(need.size):
            while done < need[c]:  # decode frames [done, stop) in pieces of <= per frames
                stop = min(int(need[c]), done + per)
                lo, hi = int(offsets[done]), int(offsets[stop])
                payload = blobs.read(hi - lo)
                if len(payload) != hi - lo:
                    raise ValueError("frame_blobs entry is truncated")
                offs, kds = offsets[done : stop + 1] - lo, kinds[done:stop]
                frames, group = decode_piece(payload, offs, kds, group, fs, dt)
                if table is not None:
                    part = pool.push_batch(frames, k=1)
                    slots[done:stop] = part.slots[:, 0]
                    for h in np.unique(last[done:stop]).tolist():
                        mine = slots[done:stop][last[done:stop] == h]
                        holders.setdefault(h, []).append(pool.lazy_batch(mine[:, None]))
                    part = None
                done = stop
            if table is None:
                continue
            mine = rows[c * per : (c + 1) * per]
            used, at = np.unique(index[mine], return_inverse=True)
            source = pool.lazy_batch(slots[used][:, None])
            table.take(mine, source, at.reshape(mine.size, width))
            source = None
            holders.pop(c, None)
        pool.flush()  # what the last chunk left hot
