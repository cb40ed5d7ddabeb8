"""Differential fuzzer of the public core API: the compiled core and its twin in lockstep.

Each seed draws a sequence of operations (pushes, observations, batches, gathers, slot
tables, pickling, dropped owners and deliberate misuse) and applies every one to two
*worlds*, one per core. Every result (values, shape, dtype) or exception (type and
message) must agree, and so must ``live_frames`` and the refcount of every live
``FrameRef``; a call that raised must leave ``live_frames`` as it was, and once every owner
is dropped each pool must hold no frame. Half of a world's own pools compress (and an
operation makes the others compress, or refuses bad options alike): there the compiled
core stores cold frames as XOR deltas, so a frame a newer delta is coded against stays
live and counted (docs/COMPRESSION.md): its counts may exceed the twin's, never fall
below them, and the values must still agree. Slot ids are the arena's own and are never
compared (the twin need not allocate in the same order), so an int slot argument is taken
from an owner in each world, or is one that is invalid in both.

Run by ``tests/test_fuzz.py``, one subprocess per batch of seeds so that a crash fails the
test with its seed; by hand::

    python tests/fuzz_worker.py --steps 200 0 1 2
"""

import argparse
import copy
import gc
import importlib
import pickle
import random
import re
import sys
from pathlib import Path

import numpy as np

# the package of this checkout, whatever is installed (the sanitizer cell runs a copy of it)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: The two cores, by the names ``lazyframes.IMPLEMENTATION`` uses.
CORES = {"compiled": "lazyframes._core", "reference": "lazyframes._reference"}
#: Frame shape and dtype of each pool of a world: 1-D frames fit every layout, and
#: ``(2, 3, 1)`` refuses ``"first"`` (its channel axis is last). Then, as the pools of
#: the same index modulo 2, compressing ones: short groups so chains end often.
POOLS = [((4,), np.uint8), ((2, 3, 1), np.float32)]
COMPRESS = [False, False, {"group": 3}, {"codec": "zstd", "level": 1, "group": 2}]
#: ``enable_compression`` arguments an operation tries: good ones, and refused ones.
ENABLE = [True, {"group": 2}, {"codec": "lz4hc", "level": 3}, {"codec": "gzip"}, "lz4", False]
LAYOUTS = ("last", "first", "stack")
KINDS = ("ref", "obs", "batch", "table")
#: Slot ids that are invalid in every pool: negative, far out of range, int64 extremes.
BAD_IDS = (-1, -(2**63), 10**6, 2**31, 2**63 - 1)


def spec(p):
    """Frame shape and dtype of pool ``p`` of a world (its own pools, then the default ones)."""
    return POOLS[p % len(POOLS)]


class Mismatch(AssertionError):
    """The two cores disagreed."""


class World:
    """One core's pools and the owners made so far, listed in the same order in both worlds."""

    def __init__(self, name):
        self.core = core = importlib.import_module(CORES[name])
        # small chunks: the arena grows, and returns chunks, within a few dozen frames;
        # then the default pools, which unpickling pushes into
        self.pools = [
            core.FramePool(*spec(i), chunk_bytes=64, compress=z) for i, z in enumerate(COMPRESS)
        ]
        self.pools += [core.default_pool(s, d) for s, d in POOLS]
        self.owners = {kind: [] for kind in KINDS}

    def keep(self, kind, obj):
        self.owners[kind].append(obj)
        return obj


# -- what is compared ---------------------------------------------------------------------


def summary(x):
    """A core-independent description of a result: values, shapes and dtypes, never slot ids."""
    name = type(x).__name__
    if isinstance(x, np.ndarray):
        return ("ndarray", x.dtype.str, x.shape, x.tobytes())
    if name == "FrameRef":
        return ("FrameRef", summary(x.pool.get(x)))
    if name == "LazyFrames":
        return ("LazyFrames", x.layout, x.shape, summary(np.asarray(x)))
    if name == "LazyBatch":
        return ("LazyBatch", x.layout, x.shape, summary(x.numpy()))
    if name == "SlotTable":
        return ("SlotTable", x.shape, summary(x.ids() >= 0))
    if isinstance(x, (tuple, list)):
        return tuple(summary(v) for v in x)
    if isinstance(x, (np.generic, np.dtype)):
        return repr(x)
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return ("object", name)


def failure(e):
    """An exception as (type name, message) with per-core details normalised away."""
    msg = str(e).replace("lazyframes._core", "lazyframes.<core>")
    msg = msg.replace("lazyframes._reference", "lazyframes.<core>")
    msg = re.sub(r"0x[0-9a-fA-F]+", "0x?", msg)
    msg = re.sub(r"slot[ =]-?\d+", "slot <id>", msg)
    return ("raises", type(e).__name__, msg)


def outcome(world, apply):
    try:
        return summary(apply(world))
    except Exception as e:  # the exception itself is the result being compared
        return failure(e)


def state(world):
    """``live_frames`` of every pool and the refcount of every FrameRef's slot.

    Each count is a pair (count, whether its pool compresses): see :func:`counts_agree`.
    """
    live = [(p.live_frames, p.compression is not None) for p in world.pools]
    refs = [(r.pool.refcount(r), r.pool.compression is not None) for r in world.owners["ref"]]
    return live, refs


def counts_agree(a, b):
    """The states of two worlds (compiled first) agree.

    Counts are equal, except that in a compressing pool the compiled core's may exceed
    the twin's.
    """
    pairs = list(zip(a[0], b[0], strict=True)) + list(zip(a[1], b[1], strict=True))
    return all(x == y or (x[1] and y[1] and x[0] >= y[0]) for x, y in pairs)


# -- drawing arguments (one draw, applied to both worlds) -----------------------------------


class Draw:
    """Random choices of one step, made once from the seed and the sizes of the worlds."""

    def __init__(self, rng, world):
        self.r = rng
        self.g = np.random.default_rng(rng.getrandbits(32))
        self.n = {kind: len(world.owners[kind]) for kind in KINDS}
        self.world = world  # sizes and pool membership only: identical in both worlds

    def pool(self):
        return self.r.randrange(len(self.world.pools))

    def layout(self):
        return self.r.choices(LAYOUTS, [4, 1, 4])[0]

    def frames(self, p, lead=()):
        shape, dtype = spec(p)
        # few distinct values, so equal frames (dedupe, ==) are common
        return self.g.integers(0, 3, size=(*lead, *shape)).astype(dtype)

    def owner_of(self, kind, p, *, foreign=0.05):
        """Index of an owner of ``kind`` in pool ``p`` (with chance ``foreign``: of any pool)."""
        items = self.world.owners[kind]
        same = [i for i, o in enumerate(items) if o.pool is self.world.pools[p]]
        if same and self.r.random() >= foreign:
            return self.r.choice(same)
        return self.r.randrange(len(items)) if items and foreign else None

    def slot(self, p, *, refs=True):
        """A symbolic slot argument of pool ``p``, resolved in each world by :func:`resolve`.

        An int is taken only from an owner of pool ``p``: an id means nothing in another
        arena. A FrameRef may be of another pool (refused alike by both cores).
        """
        roll = self.r.random()
        if roll < 0.04:
            return ("int", self.r.choice(BAD_IDS))
        if roll < 0.07:
            return ("stale", p)
        if roll < 0.45 and refs and (i := self.owner_of("ref", p)) is not None:
            return ("ref", i)
        if roll < 0.7 and (i := self.owner_of("ref", p, foreign=0)) is not None:
            return ("refint", i)
        if (j := self.owner_of("obs", p, foreign=0)) is not None:
            return ("obsint", j, self.r.randrange(len(self.world.owners["obs"][j].slots)))
        return ("stale", p)

    def slots(self, p, shape, *, refs=True):
        specs = np.empty(int(np.prod(shape)), object)
        specs[:] = [self.slot(p, refs=refs) for _ in range(len(specs))]
        return specs.reshape(shape)

    def out(self):
        """How to pass ``out=``: not at all, fitting, a wrong shape, strided, or over an input."""
        return self.r.choices(["none", "fit", "shape", "strided", "alias"], [9, 7, 2, 1, 1])[0]

    def dtype_scale(self):
        dtype = self.r.choice([None, None, np.float32, np.float64, np.int16, "U3"])
        scale = self.r.choice([None, None, 0.5, 1 / 255]) if dtype is not None else None
        if self.r.random() < 0.05:
            scale = self.r.choice([2.0, "x"])
        return dtype, scale

    def rows(self, n, m=None):
        """Row indices into ``n`` rows: mostly distinct and in range, sometimes not."""
        m = self.r.randint(0, max(1, n)) if m is None else m
        roll = self.r.random()
        if n and roll < 0.8:
            return np.array(self.r.sample(range(n), min(m, n)), np.int64)
        if roll < 0.9 and n:
            return np.array([self.r.randrange(n)] * 2, np.int64)  # duplicates
        return np.array([self.r.choice([n, -1, 2**63 - 1, -(2**63)])], np.int64)


def resolve(world, spec):
    """The argument a symbolic slot stands for in ``world``."""
    kind = spec[0]
    if kind == "int":
        return spec[1]
    if kind == "ref":
        return world.owners["ref"][spec[1]]
    if kind == "refint":
        return world.owners["ref"][spec[1]].slot
    if kind == "obsint":
        return world.owners["obs"][spec[1]].slots[spec[2]]
    # a slot freed just now (nothing is pushed between its release and its use)
    pool = world.pools[spec[1]]
    ref = pool.push(np.zeros(pool.frame_shape, pool.dtype))
    s = ref.slot
    del ref
    return s


def resolve_all(world, specs, as_int=False):
    """Resolve an object array of symbolic slots; ``as_int``: an int64 array (no FrameRefs)."""
    out = np.empty(specs.size, np.int64 if as_int else object)
    out[:] = [resolve(world, s) for s in specs.ravel()]
    return out.reshape(specs.shape)


def make_out(how, shape, dtype):
    """An ``out=`` array for :meth:`Draw.out`'s ``how`` (``"alias"`` is the caller's business)."""
    if how == "fit":
        return np.full(shape, 7, dtype)
    if how == "shape":
        return np.zeros((*shape[:-1], shape[-1] + 1), dtype)
    if how == "strided":
        return np.zeros((*shape[:-1], 2 * shape[-1]), dtype)[..., ::2]
    return None


# -- operations: each draws its arguments and returns apply(world) -> result ---------------


def op_push(d):
    p = d.pool()
    frame = d.frames(p) if d.r.random() < 0.9 else d.frames(p + 1)
    return lambda w: w.keep("ref", w.pools[p].push(frame))


def op_get(d):
    p = d.pool()
    s = d.slot(p)
    if d.r.random() < 0.5:
        return lambda w: w.pools[p].get(resolve(w, s))
    return lambda w: w.pools[p].refcount(resolve(w, s))


def op_lazy(d):
    p, layout = d.pool(), d.layout()
    specs = d.slots(p, (d.r.randint(1 if d.r.random() < 0.95 else 0, 4),))
    return lambda w: w.keep("obs", w.pools[p].lazy(list(resolve_all(w, specs)), layout=layout))


def op_lazyframes(d):
    """The public constructor: arrays (one object repeated is stored once) and FrameRefs."""
    p, layout = d.pool(), d.layout()
    distinct = [d.frames(p) for _ in range(d.r.randint(1, 3))]
    picks = [d.r.randrange(len(distinct)) for _ in range(d.r.randint(1, 4))]
    with_refs = d.r.random() < 0.2
    refs = [d.owner_of("ref", p) if with_refs else None for _ in picks]

    def apply(w):
        arrays = [f.copy() for f in distinct]  # this world's own objects
        items = [
            arrays[j] if i is None else w.owners["ref"][i] for j, i in zip(picks, refs, strict=True)
        ]
        return w.keep("obs", w.core.LazyFrames(items, layout=layout))

    return apply


def op_lazy_batch(d):
    p, layout = d.pool(), d.layout()
    shape = (d.r.randint(0, 3), d.r.randint(1 if d.r.random() < 0.95 else 0, 3))
    as_int = d.r.random() < 0.5
    specs = d.slots(p, shape, refs=not as_int)
    return lambda w: w.keep(
        "batch", w.pools[p].lazy_batch(resolve_all(w, specs, as_int), layout=layout)
    )


def op_push_batch(d):
    p, layout = d.pool(), d.layout()
    n = d.r.randint(0 if d.r.random() < 0.05 else 1, 3)
    frames, k = d.frames(p, (n,)), d.r.randint(0 if d.r.random() < 0.05 else 1, 4)
    pad = d.owner_of("ref", p) if d.r.random() < 0.5 else None
    return lambda w: w.keep(
        "batch",
        w.pools[p].push_batch(
            frames, k=k, pad=None if pad is None else w.owners["ref"][pad], layout=layout
        ),
    )


def _obs_shape(p, k, layout):
    shape = spec(p)[0]
    if layout == "stack":
        return (k, *shape)
    if layout == "last":
        return (*shape[:-1], k * shape[-1])
    return (k * shape[0], *shape[1:])


def op_gather(d):
    p, layout = d.pool(), d.layout()
    b, k = d.r.randint(0, 3), d.r.randint(1, 3)
    specs = d.slots(p, (b, k), refs=False)
    dtype, scale = d.dtype_scale()
    shape = (b, *_obs_shape(p, k, layout))
    out_dtype = np.dtype(spec(p)[1] if dtype in (None, "U3") else dtype)
    how = d.out()

    def apply(w):
        ids = resolve_all(w, specs, as_int=True)
        out = make_out(how, shape, out_dtype)
        if how == "alias":  # out= laid over the very memory that holds the slot ids
            buf = np.zeros(max(ids.nbytes, int(np.prod(shape)) * out_dtype.itemsize), np.uint8)
            ids = buf[: ids.nbytes].view(np.int64).reshape(ids.shape)
            ids[...] = resolve_all(w, specs, as_int=True)
            out = buf[: int(np.prod(shape)) * out_dtype.itemsize].view(out_dtype).reshape(shape)
        return w.pools[p].gather(ids, out, layout=layout, dtype=dtype, scale=scale)

    return apply


def op_stack(d):
    n = d.r.randint(0 if d.r.random() < 0.05 else 1, 3)
    idx = [d.r.randrange(d.n["obs"]) for _ in range(n)] if d.n["obs"] else []
    dtype, scale = d.dtype_scale()
    how = d.out()

    def apply(w):
        obs = [w.owners["obs"][i] for i in idx]
        out = None
        if obs:
            out_dtype = obs[0].dtype if dtype in (None, "U3") else dtype
            out = make_out(how, (len(obs), *obs[0].shape), out_dtype)
        return w.core.stack(obs, out, dtype=dtype, scale=scale)

    return apply


def op_obs(d):
    """A method of one observation: conversion, indexing, shift, equality, copies."""
    if not d.n["obs"]:
        return op_push(d)
    i, j = d.r.randrange(d.n["obs"]), d.r.randrange(d.n["obs"])
    p = d.world.pools.index(d.world.owners["obs"][i].pool)
    frame = d.frames(p if d.r.random() < 0.9 else p + 1)
    ref = d.owner_of("ref", p)
    n = d.r.randint(-6, 6)
    dtype, scale = d.dtype_scale()

    def shift_ref(w, o):
        return w.keep("obs", o.shift(frame if ref is None else w.owners["ref"][ref]))

    calls = {
        "array": lambda w, o: np.asarray(o),
        "astype": lambda w, o: o.astype(dtype or np.float32, scale=scale),
        "float64": lambda w, o: np.array(o, dtype=np.float64, copy=None),
        "frame": lambda w, o: o.frame(n),
        "get_frame": lambda w, o: o.get_frame(n),
        "item": lambda w, o: o[n],
        "count": lambda w, o: o.count(),
        "info": lambda w, o: (len(o), o.ndim, o.size, o.nbytes, o.stack_size, o.frame_shape),
        "shift": lambda w, o: w.keep("obs", o.shift(frame)),
        "shift_ref": shift_ref,
        "eq": lambda w, o: (o == w.owners["obs"][j], o != w.owners["obs"][j]),
        "copy": lambda w, o: w.keep("obs", copy.copy(o)),
        "deepcopy": lambda w, o: w.keep("obs", copy.deepcopy(o)),
    }
    call = calls[d.r.choice(list(calls))]
    return lambda w: call(w, w.owners["obs"][i])


def op_batch(d):
    """A method of one batch: conversion, indexing, shift, replace, copies."""
    if not d.n["batch"]:
        return op_push_batch(d)
    i, j = d.r.randrange(d.n["batch"]), d.r.randrange(d.n["batch"])
    n_rows = len(d.world.owners["batch"][i])
    p = d.world.pools.index(d.world.owners["batch"][i].pool)
    frames = d.frames(p, (n_rows if d.r.random() < 0.9 else n_rows + 1,))
    restart = d.g.random(len(frames)) < 0.4 if d.r.random() < 0.6 else None
    pad = d.owner_of("ref", p) if d.r.random() < 0.4 else None
    rows = d.rows(n_rows)
    a, b = d.r.randint(-3, 3), d.r.randint(-3, 4)
    dtype, scale = d.dtype_scale()
    how = d.out()

    def numpy(w, x):
        out = make_out(how, x.shape, x.dtype if dtype in (None, "U3") else dtype)
        return x.numpy(out, dtype=dtype, scale=scale)

    def shift(w, x):
        padref = None if pad is None else w.owners["ref"][pad]
        return w.keep("batch", x.shift(frames, restart, pad=padref))

    calls = {
        "numpy": numpy,
        "array": lambda w, x: np.asarray(x),
        "item": lambda w, x: w.keep("obs", x[a]),
        "slice": lambda w, x: w.keep("batch", x[a:b]),
        "iter": lambda w, x: [w.keep("obs", o) for o in x],
        "shift": shift,
        "replace": lambda w, x: w.keep("batch", x.replace(rows, w.owners["batch"][j][: len(rows)])),
        "copy": lambda w, x: w.keep("batch", copy.copy(x)),
        "deepcopy": lambda w, x: w.keep("batch", copy.deepcopy(x)),
        "info": lambda w, x: (len(x), x.shape, x.ndim, x.nbytes, x.stack_size, x.layout),
    }
    call = calls[d.r.choice(list(calls))]
    return lambda w: call(w, w.owners["batch"][i])


def op_table(d):
    """Make a slot table, or call one of its methods."""
    p = d.pool()
    if not d.n["table"] or d.r.random() < 0.1:
        rows, width = d.r.randint(0 if d.r.random() < 0.05 else 1, 5), d.r.randint(1, 4)
        b = d.owner_of("batch", p)
        if b is not None and d.r.random() < 0.7:  # a width that this pool's batches fill
            width = d.world.owners["batch"][b].stack_size * d.r.randint(1, 2)
        if d.r.random() < 0.03:
            width = 0
        return lambda w: w.keep("table", w.core.SlotTable(w.pools[p], rows, width))
    t = d.r.randrange(d.n["table"])
    table = d.world.owners["table"][t]
    n_rows, width = table.shape
    p = d.world.pools.index(table.pool)
    rows, rows2 = d.rows(n_rows), d.rows(n_rows)
    start = d.r.randint(0, width)
    stop = start + d.r.randint(1, max(1, width - start)) if d.r.random() < 0.9 else width + 1
    layout = d.layout()
    dtype, scale = d.dtype_scale()
    parts = [d.owner_of("batch", p) for _ in range(d.r.choice([1, 1, 2]))]
    obs_part = d.owner_of("obs", p) if len(rows) == 1 and d.r.random() < 0.3 else None
    how, pair = d.out(), d.r.choice(["none", "fit", "same"])
    src = d.owner_of("batch", p)
    index_seed = d.r.getrandbits(32)
    out_dtype = table.pool.dtype if dtype in (None, "U3") else dtype

    def set_rows(w, x):
        # a prefix of each batch with as many rows as ``rows``: widths may or may not sum up
        items = [w.owners["batch"][b][: len(rows)] for b in parts if b is not None]
        if obs_part is not None:  # one row: an observation is a part too
            items.append(w.owners["obs"][obs_part])
        return x.set(rows, tuple(items))

    def gather(w, x):
        want = x.batch(rows, start, stop, layout=layout).shape if how != "none" else None
        out = make_out(how, want, out_dtype)
        return x.gather(rows, start, stop, out, layout=layout, dtype=dtype, scale=scale)

    def gather_pairs(w, x):
        out = None
        if pair != "none":  # two fitting arrays, or one array twice (they overlap)
            first = make_out("fit", x.batch(rows, start, stop, layout=layout).shape, out_dtype)
            out = (first, first if pair == "same" else first.copy())
        args = (rows, (start, stop), rows2[: len(rows)], (0, stop - start), out)
        return x.gather_pairs(*args, layout=layout, dtype=dtype, scale=scale)

    def take(w, x):
        if src is None:
            return x.take(rows, None, np.zeros((len(rows), width), np.int64))
        source = w.owners["batch"][src]
        g = np.random.default_rng(index_seed)
        flat = len(source) * source.stack_size + (g.random() < 0.1)  # sometimes one too far
        return x.take(rows, source, g.integers(-1, max(1, flat), (len(rows), width)))

    calls = {
        "set": set_rows,
        "clear": lambda w, x: x.clear(rows),
        "clear_all": lambda w, x: x.clear(),
        # which entries are filled; the ids themselves are the arena's own
        "ids": lambda w, x: x.ids(rows) >= 0,
        "batch": lambda w, x: w.keep("batch", x.batch(rows, start, stop, layout=layout)),
        "gather": gather,
        "pairs": gather_pairs,
        "take": take,
        "info": lambda w, x: (len(x), x.shape, x.memory()),
    }
    call = calls[d.r.choices(list(calls), [3, 1, 1, 1, 1, 1, 1, 1, 1])[0]]
    return lambda w: call(w, w.owners["table"][t])


def op_pickle(d):
    kind = d.r.choice(["ref", "obs", "batch", "table", "pool"])
    i = d.r.randrange(d.n[kind]) if kind != "pool" and d.n[kind] else None
    if kind != "pool" and i is None:
        return op_push(d)
    keep = kind if kind in ("ref", "obs", "batch") else None

    def apply(w):
        x = w.pools[0] if kind == "pool" else w.owners[kind][i]
        y = pickle.loads(pickle.dumps(x))
        return w.keep(keep, y) if keep else y

    return apply


def op_store(d):
    """Frames only a table holds, which a compressing pool compresses.

    Pushed, set as sliding windows into a table's rows, their owners dropped, then an
    empty set (where the compressing happens).
    """
    if not d.n["table"]:
        return op_table(d)
    t = d.r.randrange(d.n["table"])
    n_rows, width = d.world.owners["table"][t].shape
    p = d.world.pools.index(d.world.owners["table"][t].pool)
    rows = d.rows(n_rows)
    frames = d.frames(p, (len(rows) + max(width, 1) - 1,))

    def apply(w):
        x, pool = w.owners["table"][t], w.pools[p]
        refs = [pool.push(f) for f in frames]
        windows = [refs[i : i + width] for i in range(len(rows))]
        x.set(rows, (pool.lazy_batch(windows),))
        del refs, windows
        none = np.zeros(0, np.int64)
        return x.set(none, (x.batch(none, 0, width),))

    return apply


def op_compress(d):
    """``enable_compression`` on one of a world's own pools (the default pools live on)."""
    p = d.r.randrange(len(COMPRESS))
    opts = d.r.choice(ENABLE)
    return lambda w: (w.pools[p].enable_compression(opts), w.pools[p].compression)


def op_drop(d):
    kind = d.r.choice(KINDS)
    if not d.n[kind]:
        return lambda w: None
    i = d.r.randrange(d.n[kind])

    def apply(w):
        del w.owners[kind][i]  # the last owner of its references: they are dropped now

    return apply


def op_misuse(d):
    """Uninitialised objects, public constructors that do not exist, wrong argument types."""
    p = d.pool()
    frame = d.frames(p)
    calls = {
        "new_obs_shift": lambda c, pool: c.LazyFrames.__new__(c.LazyFrames).shift(frame),
        "new_obs_array": lambda c, pool: np.asarray(c.LazyFrames.__new__(c.LazyFrames)),
        "new_batch": lambda c, pool: c.LazyBatch.__new__(c.LazyBatch).numpy(),
        "new_table": lambda c, pool: c.SlotTable.__new__(c.SlotTable).ids(),
        "new_ref": lambda c, pool: c.FrameRef.__new__(c.FrameRef).slot,
        "ref_ctor": lambda c, pool: c.FrameRef(),
        "batch_ctor": lambda c, pool: c.LazyBatch(),
        "get_str": lambda c, pool: pool.get("0"),
        "lazy_float": lambda c, pool: pool.lazy([0.5]),
        "table_huge": lambda c, pool: c.SlotTable(pool, 2**63 - 1, 2**63 - 1),
    }
    call = calls[d.r.choice(list(calls))]
    return lambda w: call(w.core, w.pools[p])


OPS = [
    (op_push, 6), (op_get, 3), (op_lazy, 4), (op_lazyframes, 2), (op_lazy_batch, 3),
    (op_push_batch, 3), (op_gather, 3), (op_stack, 2), (op_obs, 5), (op_batch, 5),
    (op_table, 6), (op_pickle, 1), (op_drop, 5), (op_misuse, 1), (op_compress, 1),
    (op_store, 5),
]  # fmt: skip


def run_seed(seed, steps, cores):
    """Run one seed; raise :class:`Mismatch` at the first disagreement."""
    rng = random.Random(seed)
    worlds = [World(c) for c in cores]
    ops, weights = zip(*OPS, strict=True)
    for step in range(steps):
        op = rng.choices(ops, weights)[0]
        apply = op(Draw(rng, worlds[0]))
        before = [state(w)[0] for w in worlds]
        results = [outcome(w, apply) for w in worlds]
        after = [state(w) for w in worlds]
        where = f"seed {seed} step {step} {op.__name__}"
        if results[0] != results[1]:
            raise Mismatch(
                f"{where}: results differ\n  {cores[0]}: {results[0]!r:.2000}\n"
                f"  {cores[1]}: {results[1]!r:.2000}"
            )
        if not counts_agree(*(after if cores[0] == "compiled" else after[::-1])):
            raise Mismatch(f"{where}: live frames / refcounts differ: {after}")
        raised = isinstance(results[0], tuple) and results[0][:1] == ("raises",)
        if raised and [a[0] for a in after] != before:
            raise Mismatch(f"{where}: {results[0]} changed live frames {before} -> {after}")
    for w in worlds:
        for kind in KINDS:
            w.owners[kind].clear()
    gc.collect()
    for c, w in zip(cores, worlds, strict=True):
        live = [n for n, _ in state(w)[0]]
        if any(live):
            raise Mismatch(f"seed {seed}: {c} holds {live} frames once every owner is dropped")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("seeds", type=int, nargs="+")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--cores", nargs=2, default=["compiled", "reference"], choices=CORES)
    args = ap.parse_args(argv)
    for seed in args.seeds:
        print(f"seed {seed}", flush=True)  # the last one printed is the one that crashed
        try:
            run_seed(seed, args.steps, args.cores)
        except Mismatch as e:
            print(f"MISMATCH {e}", flush=True)
            return 1
    print(f"ok {len(args.seeds)} seeds", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
