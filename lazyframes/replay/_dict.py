"""ReplayBuffer of Dict observations: frame leaves de-duplicated, the others as arrays.

A Dict observation (a Gymnasium ``Dict`` space: ``lazyframes.FrameStackObservation``
gives a dict of LazyFrames, Gymnasium's ``FrameStackObservation`` and SB3's
``VecFrameStack`` a dict of ndarrays) is split by key at the first add:

- frame leaves (``frame_keys``; by default the uint8 leaves of at least 3 dimensions
  per observation, i.e. stacks of images) are stored as a plain buffer stores its
  observations (:mod:`._ingest`): slot references into a pool of the leaf's own (the
  one given in ``pool=``, else the wrapper's pool of that leaf, else one the buffer
  owns), de-duplicated, one ``SlotTable`` (a :class:`FrameLeaf`) per leaf;
- the other leaves (small vectors) are stored as they are given: two arrays, obs and
  next obs, of one row per transition (a :class:`VectorLeaf`).

The episode bookkeeping (actions, rewards, flags, streams, n-step windows) is the
buffer's, shared by every leaf. Keys are fixed by the first add, in its order, and are
strings (checkpoints store them in JSON).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _common as C
from . import _ingest as ingest
from . import _sampling as sampling

if TYPE_CHECKING:
    from . import ReplayBuffer


class FrameLeaf:
    """A frame leaf: its options, geometry, pool and SlotTable (as a plain buffer's)."""

    ROW_ARRAYS = ()  # its table grows with SlotTable.grow
    __slots__ = (
        "_dtype",
        "_frame_shape",
        "_k",
        "_k_opt",
        "_layout",
        "_layout_opt",
        "_obs_shape",
        "_pool",
        "_table",
    )

    def __init__(self, layout_opt, k_opt, pool):
        self._layout_opt, self._k_opt, self._pool = layout_opt, k_opt, pool
        self._layout: Any = None
        self._k: Any = None
        self._frame_shape: Any = None
        self._dtype: Any = None
        self._obs_shape: Any = None
        self._table: Any = None


class VectorLeaf:
    """A leaf stored as given: ``obs`` and ``next`` arrays ``(rows, *shape)`` of one dtype."""

    ROW_ARRAYS = ("obs", "next")  # grown by _ingest.grow
    __slots__ = ("dtype", "next", "obs", "shape")

    def __init__(self, shape: tuple, dtype: np.dtype, rows: int):
        self.shape, self.dtype = shape, dtype
        self.obs = np.zeros((rows,) + shape, dtype)
        self.next = np.zeros((rows,) + shape, dtype)


def check_pools(pool) -> None:
    """Raises TypeError unless ``pool`` is None, a FramePool or a dict of FramePools."""
    if isinstance(pool, dict):
        for p in pool.values():
            ingest.check_pool(p)
    else:
        ingest.check_pool(pool)


def split(x, name: str, batched: bool, keys) -> dict:
    """A Dict argument as ``key -> leaf argument`` (a list of E dicts: dict of lists).

    Raises:
        TypeError: not a dict (nor a list of dicts). ValueError: keys other than ``keys``
            (None: any), dicts of a list with different keys.
    """
    if isinstance(x, dict):
        d = x
    elif batched and isinstance(x, (list, tuple)) and x and all(isinstance(v, dict) for v in x):
        if any(v.keys() != x[0].keys() for v in x):
            raise ValueError(f"the dicts of {name} have different keys")
        d = {key: [v[key] for v in x] for key in x[0]}
    else:
        raise TypeError(
            f"{name} must be a dict of observations (the buffer stores Dict observations), "
            f"got {type(x).__name__}"
        )
    if keys is not None and d.keys() != set(keys):
        raise ValueError(f"{name} has keys {sorted(map(str, d))}, the buffer stores {list(keys)}")
    return d


def is_frame_leaf(o: ingest.Obs) -> bool:
    """The default ``frame_keys`` rule: uint8 observations of at least 3 dimensions."""
    if o.kind == "lazy":
        return o.dtype == np.uint8 and len(o.frame_shape) >= 2
    return o.arr.dtype == np.uint8 and o.arr.ndim >= 4  # (E, *observation) with E first


def as_rows(o: ingest.Obs) -> np.ndarray:
    """A described vector leaf as an array ``(E, *shape)`` (LazyFrames copied out)."""
    if o.kind == "array":
        return o.arr
    a = np.asarray(o.owner)
    return a if C.is_lazybatch(o.owner) else a[None]


def check_vector(a: np.ndarray, name: str, leaf: VectorLeaf) -> None:
    """Raises ValueError (shape) or TypeError (dtype) unless ``a`` rows fit ``leaf``."""
    if a.shape[1:] != leaf.shape:
        raise ValueError(f"{name} has shape {a.shape[1:]} per observation, expected {leaf.shape}")
    if a.dtype != leaf.dtype:
        raise TypeError(f"{name} has dtype {a.dtype}, the buffer stores {leaf.dtype}")


def final_leaves(final_obs, final_mask, E: int, batched: bool, lead: tuple, keys):
    """``(rows, key -> described final observations of those rows)``, or None.

    ``final_obs``: for one transition a dict; batched, ``E`` entries each a dict or None
    (Gymnasium's ``infos["final_obs"]``), or a dict of batched leaves. Only the rows
    ``final_mask`` marks are read.
    """
    if final_mask is None:
        if final_obs is not None:
            raise ValueError(
                "final_obs needs final_mask (e.g. Gymnasium's infos['_final_obs']): the envs "
                "whose next_obs it replaces"
            )
        return None
    rows = np.flatnonzero(ingest.flags_arg(final_mask, "final_mask", lead))
    if rows.size == 0:
        return None
    if final_obs is None:
        raise ValueError(f"final_mask marks env(s) {rows.tolist()} but final_obs is None")
    if not batched:
        d = split(final_obs, "final_obs", False, keys)
        return rows, {key: ingest.describe(d[key], f"final_obs[{key!r}]", 1, False) for key in keys}
    if isinstance(final_obs, dict):  # batched leaves: pick the marked rows of each
        d = split(final_obs, "final_obs", True, keys)
        for key, v in d.items():
            if not hasattr(v, "__len__") or len(v) != E:
                raise ValueError(f"final_obs[{key!r}] must hold one entry per env ({E})")
        picked = {key: [d[key][i] for i in rows.tolist()] for key in keys}
    else:
        if not hasattr(final_obs, "__len__") or len(final_obs) != E:
            raise ValueError(f"final_obs must hold one entry per env ({E})")
        entries = [final_obs[i] for i in rows.tolist()]
        missing = [int(i) for i, o in zip(rows, entries, strict=True) if o is None]
        if missing:
            raise ValueError(f"final_obs has no observation (None) for env(s) {missing}")
        picked = split(entries, "final_obs", True, keys)
    return rows, {
        key: ingest.describe(picked[key], f"final_obs[{key!r}]", rows.size, True) for key in keys
    }


def new_leaves(rb: ReplayBuffer, described: dict) -> dict:
    """The leaves of the first add: frame leaves by ``frame_keys`` (or the default rule).

    Raises:
        TypeError: a key that is not a string. ValueError: ``frame_keys`` or ``pool``
            keys that are not frame keys of the observation, no frame leaf at all.
    """
    keys = list(described)
    bad = [key for key in keys if not isinstance(key, str)]
    if bad:
        raise TypeError(f"Dict observation keys must be strings, got {bad!r}")
    if rb._frame_keys is None:
        frames = [key for key in keys if is_frame_leaf(described[key])]
    else:
        missing = [key for key in rb._frame_keys if key not in described]
        if missing:
            raise ValueError(f"frame_keys {missing} are not keys of obs {keys}")
        frames = list(rb._frame_keys)
    if not frames:
        raise ValueError(
            f"obs has no frame leaf (keys {keys}; by default the uint8 leaves of at least 3 "
            f"dimensions per observation): name them with frame_keys="
        )
    pools = rb._pool if isinstance(rb._pool, dict) else {}
    if rb._pool is not None and not isinstance(rb._pool, dict):
        raise TypeError("for Dict observations, pool must be a dict of FramePools by frame key")
    stray = [key for key in pools if key not in frames]
    if stray:
        raise ValueError(f"pool has keys {stray} that are not frame keys {frames}")
    return {
        key: FrameLeaf(rb._layout_opt, rb._k_opt, pools.get(key)) if key in frames else None
        for key in keys
    }


def add(
    rb: ReplayBuffer,
    obs,
    action,
    reward,
    next_obs,
    terminated,
    truncated,
    *,
    autoreset=None,
    env_ids=None,
    final_obs=None,
    final_mask=None,
) -> np.ndarray:
    """ReplayBuffer.add of Dict observations: every leaf checked, then all stored."""
    if rb._table is not None:
        raise TypeError("this buffer stores single observations; obs is a dict")
    if not ingest.is_dict_obs(obs):
        raise TypeError(
            f"obs must be a dict: the buffer stores Dict observations, got {type(obs).__name__}"
        )
    first = obs if not isinstance(obs, dict) else next(iter(obs.values()), None)
    envs, batched = ingest.env_streams(rb._num_envs, env_ids, first, reward)
    E = envs.size
    lead = (E,) if batched else ()
    keys = None if rb._leaves is None else list(rb._leaves)
    od = split(obs, "obs", batched, keys)
    keys = list(od) if keys is None else keys
    nd = split(next_obs, "next_obs", batched, keys)
    o = {key: ingest.describe(od[key], f"obs[{key!r}]", E, batched) for key in keys}
    n = {key: ingest.describe(nd[key], f"next_obs[{key!r}]", E, batched) for key in keys}
    actions, rewards, flags, n_skip = ingest.transition_args(
        action, reward, terminated, truncated, autoreset, lead, rb._action_shape, rb._action_dtype
    )
    fin = final_leaves(final_obs, final_mask, E, batched, lead, keys)
    leaves: dict = rb._leaves if rb._leaves is not None else new_leaves(rb, o)
    frames = {}  # key -> (geom, pool, obs_part, next_part)
    vectors = {}  # key -> (VectorLeaf, obs rows, next rows)
    for key in keys:
        names = (f"obs[{key!r}]", f"next_obs[{key!r}]", f"final_obs[{key!r}]")
        f = None if fin is None else (fin[0], fin[1][key])
        leaf = leaves[key]
        if isinstance(leaf, FrameLeaf):
            frames[key] = ingest.prepare_frames(leaf, rb, o[key], n[key], f, envs, E, names)
            continue
        a, b = as_rows(o[key]), as_rows(n[key])
        if leaf is None:  # the first add: this leaf's shape and dtype
            if a.dtype.kind not in "biuf":
                raise TypeError(f"{names[0]} must be numeric, got dtype {a.dtype}")
            leaf = VectorLeaf(a.shape[1:], a.dtype, 0)
        check_vector(a, names[0], leaf)
        check_vector(b, names[1], leaf)
        if f is not None:
            c = as_rows(f[1])
            check_vector(c, names[2], leaf)
            b = b.copy()
            b[f[0]] = c
        vectors[key] = (leaf, a, b)
    rows = ingest.rows_for(rb, E)
    tables = {
        key: ingest.table_for(leaves[key], pool, rows, geom[1])
        for key, (geom, pool, _, _) in frames.items()
    }
    new = rb._leaves is None
    if new:  # vector leaves of the first add: their arrays of the grown size
        for key, (leaf, _, _) in vectors.items():
            vectors[key] = (VectorLeaf(leaf.shape, leaf.dtype, rows),) + vectors[key][1:]
    if rb._rows < rows:
        ingest.grow(rb, rows)
    idx = ingest.ring_slots(rb, E)
    if len(frames) > 1:  # the one error a table's set can raise after its checks
        for _, _, op, np_ in frames.values():
            if max(int(op.slots.max()), int(np_.slots.max())) > np.iinfo(np.int32).max:
                raise OverflowError(C.ID_OVER_INT32)
    for key, (_, _, op, np_) in frames.items():
        tables[key].set(idx, (op, np_))
    # nothing below can fail
    if new:
        rb._leaves = {key: leaves[key] if key in frames else vectors[key][0] for key in keys}
    for key, (geom, pool, _, _) in frames.items():
        ingest.adopt(leaves[key], geom, pool, tables[key])
    for leaf, a, b in vectors.values():
        leaf.obs[idx] = a
        leaf.next[idx] = b
    ingest.commit(rb, idx, envs, n_skip, actions, rewards, flags)
    return idx


def frame_leaves(rb: ReplayBuffer) -> dict:
    """``key -> FrameLeaf`` of a Dict buffer."""
    return frame_leaves_of(rb._leaves)


def outputs(rb: ReplayBuffer, B: int, out, dtype, scale) -> tuple:
    """``(obs_out, next_out, dst)``: dicts by frame key of the arrays to fill and dtypes."""
    fl = frame_leaves(rb)
    if out is None:
        dst = {key: C.output_dtype(leaf._dtype, dtype, scale) for key, leaf in fl.items()}
        cache_key = ("dict", B, tuple(dst.values()))
        pair = rb._out_cache.get(cache_key)
        if pair is None:
            pair = tuple(
                {key: np.empty((B,) + leaf._obs_shape, dst[key]) for key, leaf in fl.items()}
                for _ in range(2)
            )
            rb._out_cache[cache_key] = pair
        return pair[0], pair[1], dst
    if (
        not isinstance(out, (tuple, list))
        or len(out) != 2
        or not all(isinstance(d, dict) and d.keys() == fl.keys() for d in out)
    ):
        raise TypeError(
            f"out must be a pair (obs_out, next_obs_out) of dicts of ndarrays by frame key "
            f"{list(fl)}"
        )
    dst = {}
    arrays: list = []
    for key, leaf in fl.items():
        o0, o1 = out[0][key], out[1][key]
        if not isinstance(o0, np.ndarray) or not isinstance(o1, np.ndarray):
            raise TypeError(f"out[...][{key!r}] must be ndarrays")
        dst[key] = C.output_dtype(leaf._dtype, dtype if dtype is not None else o0.dtype, scale)
        for a in (o0, o1):
            C.check_out(a, (B,) + leaf._obs_shape, dst[key])
            if any(np.may_share_memory(a, b) for b in arrays):
                raise ValueError("the arrays of out overlap")
            arrays.append(a)
    return out[0], out[1], dst


def sample(rb: ReplayBuffer, B: int, out, dtype, scale) -> sampling.ReplaySamples:
    """ReplayBuffer.sample of a Dict buffer: dicts of observations, same keys."""
    obs_out, next_out, dst = outputs(rb, B, out, dtype, scale)
    return at(rb, sampling.draw(rb, B), obs_out, next_out, dst, scale)


def at(rb: ReplayBuffer, idx: np.ndarray, obs_out, next_out, dst, scale) -> sampling.ReplaySamples:
    """The samples of transitions ``idx`` into the checked dicts of :func:`outputs`."""
    last, rest = sampling.fields(rb, idx)
    obs, nxt = {}, {}
    for key, leaf in rb._leaves.items():
        if isinstance(leaf, FrameLeaf):
            k = leaf._k
            obs[key], nxt[key] = leaf._table.gather_pairs(
                idx,
                (0, k),
                last,
                (k, 2 * k),
                out=(obs_out[key], next_out[key]),
                layout=leaf._layout,
                dtype=dst[key],
                scale=scale,
            )
        else:
            obs[key], nxt[key] = leaf.obs[idx], leaf.next[last]
    obs_any: Any = obs  # ReplaySamples types its observations as arrays (plain buffers)
    nxt_any: Any = nxt
    return sampling.ReplaySamples(obs_any, rb._actions[idx], nxt_any, *rest)


def memory(rb: ReplayBuffer, table_bytes: int) -> dict:
    """ReplayBuffer.memory of a Dict buffer: figures summed over the frame leaves' pools.

    ``table_bytes`` (the buffer's bookkeeping arrays) gains the slot tables and the
    vector leaves' arrays; ``frame_bytes`` is the bytes of one frame of each frame leaf,
    summed; ``compression`` the options of the first frame leaf's pool.
    """
    n = len(rb)
    fl = frame_leaves(rb)
    table_bytes += sum(leaf._table.memory() for leaf in fl.values())
    table_bytes += sum(
        leaf.obs.nbytes + leaf.next.nbytes
        for leaf in rb._leaves.values()
        if isinstance(leaf, VectorLeaf)
    )
    stats = [leaf._pool.stats() for leaf in fl.values()]
    held = sum(int(st["bytes_held"]) for st in stats)
    live = sum(st["live_bytes"] for st in stats)
    uniq = 0
    if n:
        uniq = sum(int(np.unique(leaf._table.ids(np.arange(n))).size) for leaf in fl.values())
    return {
        "bytes_held": held,
        "unique_frames": uniq,
        "transitions": n,
        "table_bytes": table_bytes,
        "bytes_per_transition": (held + table_bytes) / n if n else 0.0,
        "frame_bytes": sum(int(st["frame_bytes"]) for st in stats),
        "compression": next(iter(fl.values()))._pool.compression,
        "hot_frames": sum(int(st["hot_frames"]) for st in stats),
        "cold_frames": sum(int(st["cold_frames"]) for st in stats),
        "cold_bytes": sum(int(st["cold_bytes"]) for st in stats),
        "ratio": live / held if held else 0.0,
    }


#: At most this many leaves in a checkpoint's ``meta["leaves"]``.
MAX_LEAVES = 1024


def archive(rb: ReplayBuffer, n: int) -> tuple:
    """The checkpoint of a Dict buffer's leaves: ``(meta leaves, arrays, frame sets)``.

    Leaf ``i`` of ``meta["leaves"]`` is ``{"key", "kind": "frames", "layout",
    "stack_size", "frame_shape", "frame_dtype"}`` with the entries ``obs_index_i``,
    ``next_index_i`` and ``frames_i`` (each frame the leaf's transitions refer to, once),
    or ``{"key", "kind": "vector", "shape", "dtype"}`` with ``obs_i`` and ``next_obs_i``.
    """
    metas, arrays, sets = [], {}, []
    for i, (key, leaf) in enumerate(rb._leaves.items()):
        if isinstance(leaf, FrameLeaf):
            k = leaf._k
            metas.append(
                {
                    "key": key,
                    "kind": "frames",
                    "layout": leaf._layout,
                    "stack_size": k,
                    "frame_shape": list(leaf._frame_shape),
                    "frame_dtype": leaf._dtype.str,
                }
            )
            ids = leaf._table.ids(np.arange(n))
            frame_ids, inv = np.unique(ids, return_inverse=True)
            inv = inv.reshape(ids.shape).astype(np.int32)
            arrays[f"obs_index_{i}"], arrays[f"next_index_{i}"] = inv[:, :k], inv[:, k:]
            sets.append((f"frames_{i}", leaf._pool, frame_ids, leaf._frame_shape, leaf._dtype))
        else:
            metas.append(
                {"key": key, "kind": "vector", "shape": list(leaf.shape), "dtype": leaf.dtype.str}
            )
            arrays[f"obs_{i}"], arrays[f"next_obs_{i}"] = leaf.obs[:n], leaf.next[:n]
    return metas, arrays, sets


def entry_names(leaves) -> set:
    """The entries a checkpoint's ``meta["leaves"]`` adds (none when it is not a list)."""
    if not isinstance(leaves, list) or len(leaves) > MAX_LEAVES:
        return set()
    names = set()
    for i, leaf in enumerate(leaves):
        kind = leaf.get("kind") if isinstance(leaf, dict) else None
        if kind == "frames":
            names |= {f"frames_{i}", f"obs_index_{i}", f"next_index_{i}"}
        elif kind == "vector":
            names |= {f"obs_{i}", f"next_obs_{i}"}
    return names


def read_leaves(rb: ReplayBuffer, ar, leaves, n: int, pool) -> None:
    """Restore a Dict buffer's leaves from the checked archive ``ar`` (``n`` transitions).

    Every leaf's description is checked, its entries against the file (their shapes
    follow from ``n``), and a vector leaf's row size is bounded as a transition's
    table bytes are (:func:`_checkpoint.check_capacity`) before anything is allocated.

    Raises:
        ValueError: a bad leaf list, key, geometry, dtype or entry; a ``pool`` that is
            not a dict of pools of the file's frame keys.
    """
    from ._checkpoint import _ROW_FLOOR, bounded_int, read_frames

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
            k = bounded_int(m, "stack_size", 1, limit)
            fs = C.frame_shape(m.get("frame_shape"))
            dt = C.frame_dtype(m.get("frame_dtype"))
            layout = m.get("layout")
            if layout not in C.LAYOUTS:
                raise ValueError(f"leaf {key!r}: bad layout {layout!r}")
            C.check_layout(layout, fs)
            index = np.concatenate(
                [
                    ar.array(f"obs_index_{i}", (n, k), np.int32),
                    ar.array(f"next_index_{i}", (n, k), np.int32),
                ],
                axis=1,
            )
            p = pools.get(key)
            if p is None:
                p = ingest.own_pool(fs, dt, rb._capacity)
            else:
                ingest.check_pool_geometry(p, fs, dt)
            frames = read_frames(ar, p, index.size, f"frames_{i}")
            nf = 0 if frames is None else len(frames)
            if index.size and (index.min() < 0 or index.max() >= nf):
                raise ValueError(f"leaf {key!r}: a slot refers to a frame not in the file")
            table = ingest.core_of(p).SlotTable(p, n, 2 * k)
            if n:
                table.take(np.arange(n), frames, index.astype(np.int64))
            leaf = FrameLeaf(rb._layout_opt, rb._k_opt, p)
            geom = (layout, k, fs, dt, C.observation_shape(fs, k, layout))
            ingest.adopt(leaf, geom, p, table)
            out[key] = leaf
        elif m.get("kind") == "vector":
            shape = m.get("shape")
            if not isinstance(shape, list) or len(shape) > 32:
                raise ValueError(f"leaf {key!r}: shape must be a short list, got {shape!r}")
            name = f"leaf {key!r} shape"
            shape = tuple(bounded_int({name: d}, name, 0, limit) for d in shape)
            dt = np.dtype(m.get("dtype"))
            if dt.kind not in "biuf" or 2 * math.prod(shape) * dt.itemsize > limit:
                raise ValueError(f"leaf {key!r}: bad dtype {dt} or shape {shape}")
            vec = VectorLeaf(shape, dt, 0)
            vec.obs = ar.array(f"obs_{i}", (n,) + shape, dt).copy()
            vec.next = ar.array(f"next_obs_{i}", (n,) + shape, dt).copy()
            out[key] = vec
        else:
            raise ValueError(f"leaf {key!r}: unknown kind {m.get('kind')!r}")
    stray = [key for key in pools if not isinstance(out.get(key), FrameLeaf)]
    if stray:
        raise ValueError(f"pool has keys {stray} that are not frame keys of the file")
    if not frame_leaves_of(out):
        raise ValueError("meta 'leaves' has no frame leaf")
    rb._leaves = out


def frame_leaves_of(leaves: dict) -> dict:
    """``key -> FrameLeaf`` of ``leaves``."""
    return {k: v for k, v in leaves.items() if isinstance(v, FrameLeaf)}
