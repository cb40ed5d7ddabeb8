"""Fuzzer of the public core API: random calls on ``lazyframes._core``, checked by the oracle.

After each call every value, refcount (a compressing pool may count more: delta bases) and
refused call is checked against ``tests/oracle/core.py``; at the end no pool holds a frame::

    PYTHONPATH=.:tests python tests/hardening/fuzz_worker.py --steps 200 0 1 2
"""

import argparse
import copy
import gc
import pickle
import random

import numpy as np
from oracle import core as ref
from oracle.core import assert_same as same

from lazyframes import _core as core

#: Frame shape and dtype of pool ``p`` (``SPECS[p % 2]``); ``(2, 3, 1)`` refuses "first".
SPECS = [((4,), np.uint8), ((2, 3, 1), np.float32)]
#: The world's own pools (then the two default pools): two compress, in short groups.
COMPRESS = [False, False, {"group": 3}, {"codec": "zstd", "level": 1, "group": 2}]
CONVERSIONS = [(None, None)] * 3 + [(np.float32, None), (np.float32, 1 / 255), (np.float64, 3)]
COPIES = [copy.copy, copy.deepcopy, lambda o: o.copy()]
LEAVES = 13  # of the SumTree
REFUSED = (TypeError, ValueError, IndexError, OverflowError)


class World:
    """The pools and their models, and the owners made so far with the ids they hold."""

    def __init__(self, seed):
        self.r, self.g = random.Random(seed), np.random.default_rng(seed)
        self.pools = [core.FramePool(*SPECS[i % 2], chunk_bytes=64, compress=z) for i, z in
                      enumerate(COMPRESS)] + [core.default_pool(*s) for s in SPECS]  # fmt: skip
        self.stores = [ref.Store(p.frame_shape, p.dtype) for p in self.pools]
        self.owners = []  # [pool, FrameRef / LazyFrames / LazyBatch, the ids it holds]
        self.tables = []  # [pool, SlotTable, its oracle Table]
        self.tree, self.leaves = core.SumTree(LEAVES), np.zeros(LEAVES)

    def frames(self, p, n):
        """``n`` frames of pool ``p``, about a third of them equal to the first."""
        shape, dtype = SPECS[p % 2]
        a = self.g.normal(0, 99, (n, *shape)) if p % 2 else self.g.integers(0, 256, (n, *shape))
        a[self.g.random(n) < 0.3] = a[0] if n else 0
        return a.astype(dtype)

    def layout(self, p):
        return self.r.choice(("last", "stack") if p % 2 else ref.LAYOUTS)

    def live(self, p, shape):
        ids = self.r.choices(list(self.stores[p].refs), k=int(np.prod(shape)))
        return np.array(ids, np.int64).reshape(shape)

    def pick(self, p=None, kind=None, k=None):
        """An owner (of pool ``p``, type ``kind``, ``k`` frames per row), or None."""
        ok = [o for o in self.owners if p in (None, o[0]) and kind in (None, type(o[1]))
              and k in (None, o[2].shape[-1])]  # fmt: skip
        return self.r.choice(ok) if ok else None

    def own(self, p, obj, slots, new=()):
        self.stores[p].hold(slots, new)
        self.owners.append([p, obj, np.asarray(slots, np.int64)])

    def check(self):
        for p, obj, slots in self.owners:
            is_ref = isinstance(obj, core.FrameRef)
            assert np.array_equal([obj.slot] if is_ref else obj.slots, slots), (obj, slots)
            assert obj.pool is self.pools[p]
            if not is_ref:
                same(np.asarray(obj), self.stores[p].gather(slots, obj.layout))
        for pool, st in zip(self.pools, self.stores, strict=True):
            more = pool.compression is not None  # delta bases stay live
            n = pool.live_frames
            assert n == st.live_frames or (more and n > st.live_frames), (n, st.live_frames)
            for s, n in st.refs.items():
                rc = pool.refcount(s)
                assert rc == n or (more and rc > n), f"slot {s}: refcount {rc}, model {n}"
                same(pool.get(s), st.frames[s])
        for _, table, model in self.tables:
            same(table.ids(), model.ids)

    def state(self):
        return [(p.live_frames, [p.refcount(x) for x in st.refs])
                for p, st in zip(self.pools, self.stores, strict=True)]  # fmt: skip

    def refused(self, fn, *args):
        before = self.state()
        try:
            fn(*args)
            raise AssertionError(f"{fn} accepted {args}")
        except REFUSED:
            gc.collect()  # the traceback's cycles held the call's temporaries
        assert self.state() == before, "a refused call changed the pools"


def op_push(w):
    p, k = w.r.randrange(len(COMPRESS)), w.r.randint(0, 4)
    frames, pad = w.frames(p, w.r.randint(1, 3)), w.pick(p, core.FrameRef)
    if k == 0:  # one frame, one FrameRef
        r = w.pools[p].push(frames[0])
        return w.own(p, r, [r.slot], {r.slot: frames[0]})
    padref = pad and pad[1]
    b = w.pools[p].push_batch(frames, k=k, pad=padref, layout=w.layout(p))
    new = b.slots[:, -1]
    fill = new[:, None] if pad is None else np.full((len(new), 1), padref.slot)
    ids = np.concatenate([np.repeat(fill, k - 1, axis=1), new[:, None]], axis=1)
    w.own(p, b, ids, dict(zip(new.tolist(), frames, strict=True)))


def op_lazy(w):
    """A LazyFrames or LazyBatch of live slots (ints or FrameRefs), or the constructor."""
    p = w.r.randrange(len(w.pools))
    if not w.stores[p].refs or w.r.random() < 0.2:  # into a default pool
        p = w.r.randrange(len(COMPRESS))
        arrays = list(w.frames(p, w.r.randint(1, 3)))
        picks = [w.r.randrange(len(arrays)) for _ in range(w.r.randint(1, 4))]
        lz = core.LazyFrames([arrays[j] for j in picks], layout=w.layout(p))
        new = {}
        for s, j in zip(lz.slots, picks, strict=True):  # the same array twice: stored once
            same(new.setdefault(s, arrays[j]), arrays[j])
        return w.own(len(COMPRESS) + p % 2, lz, lz.slots, new)
    pool, k = w.pools[p], w.r.randint(1, 4)
    if w.r.random() < 0.5:
        ids = w.live(p, (w.r.randint(0, 3), k))
        return w.own(p, pool.lazy_batch(ids, layout=w.layout(p)), ids)
    refs = {o.slot: o for q, o, _ in w.owners if q == p and isinstance(o, core.FrameRef)}
    ids = w.live(p, (k,)).tolist()
    args = [refs[s] if s in refs and w.r.random() < 0.5 else s for s in ids]
    w.own(p, pool.lazy(args, layout=w.layout(p)), ids)


def op_gather(w):
    p = w.r.randrange(len(w.pools))
    (dtype, scale), layout, pool = w.r.choice(CONVERSIONS), w.layout(p), w.pools[p]
    if not w.stores[p].refs:
        return w.refused(pool.gather, [[10**6]])
    ids = w.live(p, (w.r.randint(0, 3), w.r.randint(1, 3)))
    want = w.stores[p].gather(ids, layout, dtype, scale)
    out = np.full_like(want, 7) if w.r.random() < 0.4 else None
    got = pool.gather(ids, out, layout=layout, dtype=dtype, scale=scale)
    same(got, want)
    assert out is None or got is out


def op_observation(w):
    o = w.pick(kind=core.LazyFrames)
    if o is None:
        return w.refused(core.stack, [])
    p, lz, slots = o
    want, st = w.stores[p].gather(slots, lz.layout), w.stores[p]
    j, (dtype, scale) = w.r.randrange(-len(slots), len(slots)), w.r.choice(CONVERSIONS)
    how = w.r.choice(["stack", "astype", "index", "index", "shift", "copy", "pickle"])
    if how == "stack":  # with others of its pool and geometry
        rows = [x for x in w.owners if x[0] == p and isinstance(x[1], core.LazyFrames)
                and x[1].layout == lz.layout and x[2].shape == slots.shape]  # fmt: skip
        rows = [w.r.choice(rows) for _ in range(w.r.randint(1, 3))]
        got = core.stack([x[1] for x in rows], dtype=dtype, scale=scale)
        same(got, st.gather(np.stack([x[2] for x in rows]), lz.layout, dtype, scale))
    elif how == "astype":
        same(lz.astype(dtype or np.float32, scale=scale), ref.convert(want, dtype or "f4", scale))
    elif how == "index":
        same(lz.frame(j % lz.count()), want[..., j % lz.count()])
        same(lz.get_frame(j), st.frames[int(slots[j])])
        same(lz[j % len(lz)], want[j % len(lz)])
    elif how == "shift":
        frame = w.frames(p, 1)[0]
        nxt = lz.shift(frame)
        assert nxt.slots[:-1] == lz.slots[1:]
        w.own(p, nxt, nxt.slots, {nxt.slots[-1]: frame})
    elif how == "copy":
        w.own(p, w.r.choice(COPIES)(lz), slots)
    else:  # into the default pool, each frame once per dump
        back = pickle.loads(pickle.dumps(lz))
        new = {b: st.frames[a] for a, b in zip(lz.slots, back.slots, strict=True)}
        w.own(len(COMPRESS) + p % 2, back, back.slots, new)


def op_batch(w):
    o = w.pick(kind=core.LazyBatch)
    if o is None:
        return op_push(w)
    p, b, slots = o
    (n, k), st = slots.shape, w.stores[p]
    how = w.r.choice(["numpy", "index", "shift", "replace", "copy"])
    if how == "numpy" and n:
        dtype, scale = w.r.choice(CONVERSIONS)
        same(b.numpy(dtype=dtype, scale=scale), st.gather(slots, b.layout, dtype, scale))
        same(np.asarray(pickle.loads(pickle.dumps(b))), np.asarray(b))
    elif how == "index":
        lo, hi = w.r.randint(-3, 3), w.r.randint(-3, 4)
        w.own(p, b[lo:hi], slots[lo:hi])
        if n:
            j = w.r.randrange(-n, n)
            w.own(p, b[j], slots[j])
    elif how == "shift":
        frames, restart = w.frames(p, n), w.g.random(n) < 0.4
        pad = w.pick(p, core.FrameRef) if w.r.random() < 0.5 else None
        nxt = b.shift(frames, restart, pad=pad and pad[1])
        new = nxt.slots[:, -1:]
        fill = np.where(restart[:, None], new if pad is None else pad[1].slot, slots[:, 1:])
        w.own(p, nxt, np.hstack([fill, new]), dict(zip(new[:, 0].tolist(), frames, strict=True)))
    elif how == "replace" and (src := w.pick(p, core.LazyBatch, k)) is not None:
        m = min(n, len(src[2]))
        rows = np.array(w.r.sample(range(n), m), np.int64)
        if src[1].layout != b.layout:
            return w.refused(b.replace, rows, src[1][:m])
        want = slots.copy()
        want[rows] = src[2][:m]
        w.own(p, b.replace(rows, src[1][:m]), want)
    elif how == "copy":
        w.own(p, w.r.choice(COPIES)(b), slots)


def op_table(w):
    if not w.tables or w.r.random() < 0.1:
        p, n, width = w.r.randrange(len(COMPRESS)), w.r.randint(1, 5), w.r.randint(1, 4)
        table = core.SlotTable(w.pools[p], n, width)
        return w.tables.append([p, table, ref.Table(w.stores[p], n, width)])
    p, table, model = w.r.choice(w.tables)
    (n, width), st, pool = model.ids.shape, w.stores[p], w.pools[p]
    rows = np.array(w.r.sample(range(n), w.r.randint(1, n)), np.int64)
    start = w.r.randrange(width)
    stop, layout = w.r.randint(start + 1, width), w.layout(p)
    ids = model.ids[rows, start:stop]
    how = w.r.choice(["set", "set", "clear", "batch", "gather", "pairs", "take"])
    if how == "set":  # live frames, or new ones only the table will hold (then compressed)
        fresh = w.frames(p, len(rows) * width) if w.r.random() < 0.5 or not st.refs else None
        batch = None if fresh is None else pool.push_batch(fresh)
        new = w.live(p, (len(rows), width)) if batch is None else batch.slots.reshape(len(rows), -1)
        st.hold(new, {} if batch is None else zip(new.ravel().tolist(), fresh, strict=True))
        cut = w.r.randint(1, width)
        table.set(rows, tuple(pool.lazy_batch(x) for x in np.hsplit(new, [cut]) if x.size))
        model.put(rows, new)
        del batch
        st.decref(new)
    elif how == "clear":
        table.clear(rows)
        model.put(rows, -1)
    elif how in ("batch", "gather", "pairs") and (ids < 0).any():
        w.refused(table.batch if how == "batch" else table.gather, rows, start, stop)
    elif how == "batch":
        w.own(p, table.batch(rows, start, stop, layout=layout), ids)
    elif how == "gather":
        dtype, scale = w.r.choice(CONVERSIONS)
        got = table.gather(rows, start, stop, layout=layout, dtype=dtype, scale=scale)
        same(got, st.gather(ids, layout, dtype, scale))
    elif how == "pairs":
        a, b = table.gather_pairs(rows, (start, stop), rows[::-1], (start, stop), layout=layout)
        same(a, st.gather(ids, layout))
        same(b, st.gather(ids[::-1], layout))
    elif how == "take" and (src := w.pick(p, core.LazyBatch)) is not None and src[2].size:
        index = w.g.integers(-1, src[2].size, (len(rows), width))
        table.take(rows, src[1], index)
        model.put(rows, np.where(index >= 0, src[2].ravel()[index], -1))


def op_sumtree(w):
    t, m = w.tree, w.r.randint(1, 8)
    idx = w.g.integers(0, LEAVES, m)
    if w.r.random() < 0.5:
        values = w.g.random(m) * (w.g.random(m) < 0.8) * 10.0 ** w.g.integers(-3, 4, m)
        t.set(idx, values)
        for i, v in zip(idx, values, strict=True):  # a repeated index keeps its last value
            w.leaves[i] = v
    elif w.r.random() < 0.1:
        return w.refused(t.set, idx, -w.g.random(m) - 0.5)
    same(t.get(np.arange(LEAVES)), w.leaves)
    positive = w.leaves[w.leaves > 0]
    assert t.min() == (positive.min() if positive.size else np.inf)
    assert abs(t.total() - w.leaves.sum()) <= 1e-12 * w.leaves.sum()
    u, beta = w.g.random(m), w.r.choice([0.0, 0.4, 1.0])
    if not positive.size:
        return w.refused(t.sample, u)
    got, weights = t.sample_weighted(u, beta)
    want, near = ref.draws(w.leaves, u)
    assert ((got == want) | near).all() and (w.leaves[got] > 0).all(), (got, want, w.leaves)
    same(weights, ref.weights(w.leaves, got, beta))


def op_codec(w):
    p, opts = w.r.randrange(2), w.r.choice([{}, {"group": 1}, {"codec": "zstd", "group": 4}])
    frames = w.frames(p, w.r.randint(0, 6))
    same(core.decode_frames(*core.encode_frames(frames, **opts), *SPECS[p]), frames)


def op_drop(w):
    if w.r.random() < 0.8 and w.owners:
        p, obj, slots = w.owners.pop(w.r.randrange(len(w.owners)))
        del obj  # the last reference: the owner drops its references now
        w.stores[p].decref(slots)
    elif w.tables:
        _, table, model = w.tables.pop(w.r.randrange(len(w.tables)))
        del table
        model.put(np.arange(len(model.ids)), -1)


def op_misuse(w):
    p = w.r.randrange(len(COMPRESS))
    pool, frame = w.pools[p], w.frames(p + 1, 1)[0]  # the other spec's shape and dtype
    bad = w.r.choice([-1, 10**6, 2**63 - 1, -(2**63)])
    calls = [(pool.push, frame), (pool.get, bad), (pool.lazy, [bad]), (pool.gather, [[bad]]),
             (pool.lazy_batch, [[bad]]), (pool.push_batch, frame[None]), (core.FrameRef,),
             (core.SlotTable, pool, 2**62, 2**62),
             (core.decode_frames, b"x", [0, 1], [0], (4,), np.uint8)]  # fmt: skip
    w.refused(*w.r.choice(calls))


OPS = {op_push: 8, op_lazy: 8, op_gather: 4, op_observation: 7, op_batch: 5, op_table: 7,
       op_sumtree: 3, op_codec: 1, op_drop: 6, op_misuse: 1}  # fmt: skip


def run_seed(seed, steps):
    w = World(seed)
    for step in range(steps):
        op = w.r.choices(list(OPS), list(OPS.values()))[0]
        try:
            op(w)
            w.check()
        except Exception as e:
            raise AssertionError(f"seed {seed} step {step} {op.__name__}: {e!r}") from e
    del w.owners[:], w.tables[:]
    gc.collect()
    live = [p.live_frames for p in w.pools]
    assert not any(live), f"seed {seed}: {live} frames live once every owner is dropped"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("seeds", type=int, nargs="+")
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    for seed in args.seeds:
        print(f"seed {seed}", flush=True)  # the last one printed is the one that crashed
        run_seed(seed, args.steps)
    print(f"ok {len(args.seeds)} seeds", flush=True)
