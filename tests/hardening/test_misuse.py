"""Misuse of the public core (M12-M19 of docs/CASES.md): refused, no change; each in a child."""

import contextlib
import functools
import gc
import inspect
import os
import pickle
import re
import textwrap
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import ROOT, f, make_pool, raised, refused, run

from lazyframes import _core as core

TESTS = os.path.dirname(os.path.abspath(__file__))
#: Iterations of each thread of the races (a bounded count, not a time).
RACE_ROUNDS = 2000


def _isolated(attack):
    """Run ``attack()`` in a child interpreter: a signal or a failed assert there fails here."""
    code = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{TESTS!r}, {os.path.dirname(TESTS)!r}, {ROOT!r}]
        from test_misuse import {attack.__name__} as attack
        getattr(attack, "__wrapped__", attack)()
        print("attack done")
    """)
    r = run("-X", "faulthandler", "-c", code)
    message = f"{attack.__name__} exited with {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.returncode == 0 and "attack done" in r.stdout, message


def isolated(attack):
    """The test that runs ``attack()`` (of the same name) in a child interpreter."""

    @functools.wraps(attack)
    def test():
        _isolated(attack)

    return test


class Witness:
    """What an attack must leave as it was: live frames, refcounts and frame values."""

    def __init__(self, pool, slots):
        self.pool = pool
        self.slots = [int(s) for s in np.ravel(slots)]
        self.before = self._state()

    def _state(self):
        p = self.pool
        return (p.live_frames, [p.refcount(s) for s in self.slots],
                [p.get(s).tobytes() if p.refcount(s) else None for s in self.slots])  # fmt: skip

    def check(self, freed=0):
        """Assert the state is as before, except ``freed`` frames the attack dropped itself."""
        gc.collect()
        after = self._state()
        want = (self.before[0] - freed,) + self.before[1:]
        assert after == want, f"state changed: {want[:2]} -> {after[:2]}"


def _setup(n=4, k=2):
    """A pool, a batch of ``n`` rows of ``k`` distinct frames f(1)..., and a witness."""
    pool = make_pool()
    batch = pool.lazy_batch([[pool.push(f(10 * i + j)) for j in range(k)] for i in range(n)])
    return pool, batch, Witness(pool, batch.slots)


@isolated
def test_out_aliasing_an_input_is_refused():
    pool = make_pool((1,), np.int64)
    refs = [pool.push(np.array([7 + i], np.int64)) for i in range(3)]
    ids = np.array([[r.slot] for r in refs], np.int64)  # (3, 1)
    keep = ids.copy()
    w = Witness(pool, ids)
    out = ids.reshape(3, 1, 1)  # the id array itself, as the output of a k=1 "stack" gather
    assert np.shares_memory(out, ids)
    refused(ValueError, "out overlaps", pool.gather, ids, out, layout="stack")
    half = np.zeros(6, np.int64)  # out overlapping half of the ids
    half[:3] = ids[:, 0]
    refused(ValueError, "out overlaps", pool.gather,
             half[:3].reshape(3, 1), half[1:4].reshape(3, 1, 1), layout="stack")  # fmt: skip
    half[:3] = ids[::-1, 0]
    # ids read backwards (a negative stride), out sharing one of them
    refused(ValueError, "out overlaps", pool.gather,
             half[2::-1].reshape(3, 1), half[2:5].reshape(3, 1, 1), layout="stack")  # fmt: skip
    assert (ids == keep).all()
    table = core.SlotTable(pool, 3, 1)
    table.set([0, 1, 2], (pool.lazy_batch(ids),))
    rows = np.array([2, 1, 0], np.int64)
    w2 = Witness(pool, ids)
    refused(ValueError, "overlap", table.gather, rows, 0, 1, rows.reshape(3, 1, 1), layout="stack")
    other, alias = np.zeros((3, 1, 1), np.int64), rows.reshape(3, 1, 1)
    for outs in ((alias, other), (other, alias)):  # out aliasing the rows of either part
        a, b = (rows, [0, 0, 0]) if outs[0] is alias else ([0, 0, 0], rows)
        refused(ValueError, "overlap", table.gather_pairs, a, (0, 1), b, (0, 1), outs,
                 layout="stack")  # fmt: skip
    assert rows.tolist() == [2, 1, 0] and (other == 0).all()
    w2.check()
    table.clear()
    w.check()


# -- row indices near 2**63, negative, or wrapping ------------------------------------------
BAD_ROWS = [4, -1, -(2**63), 2**63 - 1, 2**62, -(2**62)]
ROW = "out of range|row"


@isolated
def test_row_indices_near_2_63_and_negative_are_refused():
    pool, batch, w = _setup(n=2, k=2)
    table = core.SlotTable(pool, 4, 2)
    table.set([0, 1], (batch,))
    before = table.ids().tolist()
    w = Witness(pool, batch.slots)
    for bad in BAD_ROWS:
        rows = [0, bad]
        refused(IndexError, ROW, table.set, rows, (batch,))
        refused(IndexError, ROW, table.set, np.array(rows, np.int64), (batch,))
        refused(IndexError, ROW, table.clear, rows)
        refused(IndexError, ROW, table.ids, rows)
        refused(IndexError, ROW, table.batch, rows, 0, 2)
        if -(2**31) <= bad < 2**31:  # int32 rows (a replay buffer's own) take a C path
            refused(IndexError, ROW, table.batch, np.array(rows, np.int32), 0, 2)
        refused(IndexError, ROW, table.gather, rows, 0, 2)
        refused(IndexError, ROW, table.gather_pairs, [0, 0], (0, 1), rows, (1, 2))
        refused(IndexError, ROW, table.take, rows, batch, np.zeros((2, 2), np.int64))
        refused(IndexError, ROW, batch.replace, rows, batch)
    for bad in (4, -2, -(2**63), 2**63 - 1, 2**62, -(2**62)):  # -1 is an empty entry
        refused(IndexError, "out of range", table.take, [2], batch, np.array([[0, bad]]))
    wrapping = np.array([0, 2**64 - 1], np.uint64)  # -1 if cast to int64 unchecked
    for call in (lambda: table.set(wrapping, (batch,)), lambda: table.clear(wrapping)):
        with pytest.raises((IndexError, OverflowError, TypeError)):
            call()
    for start, stop in ((0, 2**63 - 1), (-(2**63), 2), (2**63 - 1, 2**63 - 1), (1, 0)):
        for method in (table.batch, table.gather):
            with pytest.raises((IndexError, ValueError)):
                method([0], start, stop)
    assert table.ids().tolist() == before
    w.check()
    table.clear()


@isolated
def test_sizes_that_overflow_or_are_zero_are_refused():
    pool, small = make_pool(), make_pool((2, 2))
    for rows, width in ((2**62, 2**62), (2**63 - 1, 1), (1, 2**63 - 1), (-1, 4), (4, -1)):
        with pytest.raises((ValueError, OverflowError, MemoryError)):
            core.SlotTable(pool, rows, width)
    for k in (2**62, 2**63 - 1, -(2**63)):
        with pytest.raises((ValueError, OverflowError, MemoryError)):
            pool.push_batch(np.stack([f(1)]), k=k)
    refused(ValueError, "a batch of 1 x 9223372036854775808 frames is too large", pool.push_batch,
             np.stack([f(1)]), k=2**63)  # fmt: skip
    refused(ValueError, "chunk_bytes must be at most 2\\*\\*63 - 1", core.FramePool,
             (2,), np.uint8, chunk_bytes=2**70)  # fmt: skip
    for frames in (np.zeros((3, 0, 2, 2), np.uint8), np.zeros((64, 0, 2, 2), np.uint8)):
        refused(ValueError, "k must be at least 1, got 0", small._push_dedup, frames)
    refused(ValueError, "k must be at least 1, got 0", small.push_batch, f(1, (1, 2, 2)), k=0)
    assert pool.live_frames == small.live_frames == 0


# -- Python callbacks that free or change things mid-call -------------------------------------
class _DropsOnIndex:
    """An int-like whose ``__index__`` first drops the last owner of a slot."""

    def __init__(self, holder, slot, action=None):
        self.holder, self.slot, self.action = holder, slot, action

    def __index__(self):
        self.holder.clear()
        if self.action is not None:
            self.action()
        return self.slot


@isolated
def test_index_callback_that_frees_the_slot_is_refused():
    pool = make_pool()
    keep = pool.push(f(1))
    out = np.full((1, 84, 84, 2), 3, np.uint8)
    for call in (
        lambda evil: pool.get(evil),
        lambda evil: pool.lazy([keep.slot, evil]),
        lambda evil: pool.lazy_batch([[keep, evil]]),
        lambda evil: pool.gather([[keep.slot, evil]], out),
        lambda evil: pool.lazy([evil, keep]),  # a FrameRef after the int-like
    ):
        holder = [pool.push(f(9))]
        s = holder[0].slot
        w = Witness(pool, [keep.slot])
        refused(ValueError, f"slot {s} is free", call, _DropsOnIndex(holder, s))
        w.check(freed=1)  # the frame the callback dropped, and nothing else
    assert (out == 3).all()
    holder = [pool.push(f(9))]
    assert pool.refcount(_DropsOnIndex(holder, holder[0].slot)) == 0
    refs, more = [pool.push(f(21)), pool.push(f(22))], []

    class Swap:  # read after the FrameRefs: drops them and fills their slots again
        def __index__(self):
            refs.clear()
            more.extend(pool.push(f(v)) for v in (99, 98, 97))
            return more[-1].slot

    lz = pool.lazy([*refs, Swap()])  # the FrameRefs' owners outlive the callback
    assert np.asarray(lz)[0, 0].tolist() == [21, 22, 97]
    del lz
    more.clear()
    assert pool.live_frames == 1


@isolated
def test_index_callback_that_rewrites_the_table():
    pool, batch, w = _setup(n=2, k=2)
    table = core.SlotTable(pool, 3, 2)
    table.set([0, 1], (batch,))
    other = pool.push_batch(np.stack([f(70), f(71)]), k=2)
    # the caller rewrites and clears the table while the rows are read (or they are refused)
    evil = _DropsOnIndex([], 0, lambda: (table.set([0, 2], (other,)), table.clear([1])))
    before = table.ids().tolist()
    if _int_likes_refused(table.set, [evil, 1], (batch,)):
        assert table.ids().tolist() == before
    else:
        got = [[int(pool.get(int(s))[0, 0, 0]) for s in row] for row in table.ids()]
        assert got == [[0, 1], [10, 11], [71, 71]]
    # while the row ids are read, the table is cleared: the rows are empty when checked
    for method in (table.gather, table.batch):
        table.set([0, 1], (batch,))
        before = table.ids().tolist()
        rows = [0, _DropsOnIndex([], 1, table.clear)]
        if _int_likes_refused(method, rows, 0, 2, pattern="row 0 is empty"):
            assert table.ids().tolist() == before
    table.clear()
    other = None
    w.check()


def _int_likes_refused(fn, *args, pattern=None):
    """True if ``fn(*args)`` refused int-likes as rows; else it ran (or raised ``pattern``)."""
    error = None
    try:
        fn(*args)
    except (TypeError, ValueError) as e:
        error = (type(e), str(e))
    if error is None or error[0] is ValueError:
        assert pattern is None if error is None else re.search(pattern, error[1]), error
        return False
    assert "rows must be integers" in error[1], error
    return True


class _Frames:
    """An array-like whose ``__array__`` runs ``action`` first (then gives ``arr``)."""

    def __init__(self, arr, action):
        self.arr, self.action = arr, action

    def __array__(self, dtype=None, copy=None):
        self.action()
        return self.arr if dtype is None else self.arr.astype(dtype)


@isolated
def test_array_and_float_callbacks_that_free_owners():
    pool = make_pool()
    holder = {}
    holder["pad"] = pool.push(f(0))
    holder["batch"] = pool.lazy_batch(
        [[pool.push(f(1)), pool.push(f(2))], [pool.push(f(3)), pool.push(f(4))]]
    )
    shift = holder["batch"].shift  # a bound method: the batch lives while it runs

    def churn():
        holder.clear()  # the batch and the pad lose their other owners
        junk = [pool.push(f(99)) for _ in range(500)]  # the arena grows (new chunks) ...
        del junk  # ... and shrinks again
        gc.collect()

    got = shift(_Frames(np.stack([f(5), f(6)]), churn), [False, True])
    del shift
    gc.collect()
    rows = [[int(pool.get(int(s))[0, 0, 0]) for s in row] for row in got.slots]
    assert rows == [[2, 5], [6, 6]], rows
    assert pool.live_frames == 3  # 2, 5 and 6: the old batch and the pad are gone
    del got
    assert pool.live_frames == 0
    target = [pool.push(f(7))]
    s = target[0].slot
    keep = pool.push(f(8))

    def drop():
        target.clear()
        gc.collect()

    # frames whose __array__ drops the last owner of a slot the call is to read or write
    lz = pool.lazy([keep, s])
    r = pool.push(_Frames(f(1), drop))
    got = lz.shift(_Frames(f(2), lambda: None))
    assert [int(got.get_frame(j)[0, 0, 0]) for j in range(2)] == [7, 2]
    del r, got, lz
    target.append(pool.push(f(7)))
    s = target[0].slot
    cands = pool.lazy_batch([[target[0], s]])
    dedup = pool._push_dedup(_Frames(np.stack([f(7), f(9)])[None], drop), cands)
    assert [int(pool.get(int(x))[0, 0, 0]) for x in dedup.slots[0]] == [7, 9]
    del dedup, cands
    batch = pool.push_batch(_Frames(np.stack([f(3)]), drop), k=2, pad=keep)
    assert [int(pool.get(int(x))[0, 0, 0]) for x in batch.slots[0]] == [8, 3]
    del batch
    # scale whose __float__ drops the frames being gathered by id
    target.append(pool.push(f(7)))
    s = target[0].slot

    class Scale(float):
        def __float__(self):
            drop()
            return 0.5

    out = np.zeros((1, 84, 84, 2), np.float32)
    message = raised(ValueError, pool.gather, [[keep.slot, s]], out, dtype=np.float32,
                      scale=Scale(0.5))  # fmt: skip
    if message is None:  # the core read the float value without calling __float__
        assert out[0, 0, 0].tolist() == [4.0, 3.5]
    else:  # __float__ ran first: the id check after it found the slot free
        assert f"slot {s} is free" in message, message
        assert (out == 0).all()
    drop()
    assert pool.live_frames == 1 and pool.refcount(keep) == 1
    np.testing.assert_array_equal(pool.get(keep), f(8))


@isolated
def test_pad_is_an_owner_and_outlives_the_rows_that_free_it():
    pool = make_pool()
    pad = pool.push(f(0))
    # the batch's rows are the pad's only other owners: row 0 is all pad
    batch = pool.lazy_batch([[pad, pad], [pool.push(f(1)), pool.push(f(2))]])
    w = Witness(pool, batch.slots)
    for bad in (pad.slot, np.int64(pad.slot), _DropsOnIndex([], pad.slot), [pad]):
        refused(TypeError, "FrameRef", batch.shift, np.stack([f(5), f(6)]), [True, True], pad=bad)
        refused(TypeError, "FrameRef", pool.push_batch, np.stack([f(5)]), k=2, pad=bad)
    del bad
    w.check()
    got = batch.shift(np.stack([f(5), f(6)]), [False, True], pad=pad)
    del batch, pad  # row 0 of the old batch held the pad twice: dropped before it is read
    gc.collect()
    assert [[int(pool.get(int(s))[0, 0, 0]) for s in row] for row in got.slots] == [[0, 5], [0, 6]]
    np.testing.assert_array_equal(np.asarray(got)[1, 0], f(0))
    del got
    assert pool.live_frames == 0


@isolated
def test_overlapping_parts_are_read_before_anything_is_written():
    pool, batch, w = _setup(n=3, k=2)
    table = core.SlotTable(pool, 3, 4)
    table.set([0, 1, 2], (batch, pool.lazy_batch(batch.slots[::-1])))
    want = table.ids()
    # rows rewritten from parts read out of the very rows being overwritten
    table.set([0, 1], (table.batch([1, 0], 2, 4), table.batch([1, 0], 0, 2)))
    got = table.ids()
    assert got[0].tolist() == want[1, 2:].tolist() + want[1, :2].tolist()
    assert got[1].tolist() == want[0, 2:].tolist() + want[0, :2].tolist()
    assert got[2].tolist() == want[2].tolist()
    table.take([2, 0], table.batch([0, 2], 0, 4), np.array([[0, 1, 2, 3], [4, 5, 6, 7]]))
    assert table.ids()[2].tolist() == got[0].tolist() and table.ids()[0].tolist() == got[2].tolist()
    replaced = batch.replace([0, 1, 2], pool.lazy_batch(batch.slots[::-1]))
    assert replaced.slots.tolist() == batch.slots[::-1].tolist()
    del replaced
    table.clear()
    w.check()


# -- uninitialised objects ----------------------------------------------------------------------
#: The dunders of the API (their protocol is their documentation) and the private methods
#: the Python layer calls.
_CALLED = {"__array__", "__dlpack__", "__dlpack_device__", "__len__", "__getitem__",
           "__iter__", "__copy__", "__deepcopy__", "__reduce__", "__eq__", "_push_known",
           "_push_dedup"}  # fmt: skip
_CLASSES = ("FramePool", "FrameRef", "LazyFrames", "LazyBatch", "SlotTable", "SumTree", "RowRing")
# An uninitialised pool may describe itself as empty; what would store or read a frame raises.
MAY_READ_EMPTY = {("FramePool", name) for name in ["frame_shape", "dtype", "frame_bytes",
    "slots_per_chunk", "live_frames", "live_bytes", "capacity", "bytes_held", "peak_bytes",
    "stats"]}  # fmt: skip


def _members(obj):
    """(name, call) of each public method and property of ``obj``'s class; arguments all 0."""
    cls = type(obj)
    for name in dir(cls):
        own_eq = name != "__eq__" or "__eq__" in vars(cls)  # not object's
        if not own_eq or (name.startswith("_") and name not in _CALLED):
            continue
        if not callable(inspect.getattr_static(cls, name)):  # a property
            yield name, lambda o, name=name: getattr(o, name)
        elif name == "__iter__":
            yield name, list
        else:
            params = inspect.signature(getattr(obj, name)).parameters.values()
            n = sum(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                    for p in params)  # fmt: skip
            yield name, lambda o, name=name, n=n: getattr(o, name)(*[0] * n)


def _as_argument(pool, lz, batch):
    """For each class: (name, call) pairs that take an uninitialised object as an argument."""
    frames = np.stack([f(1)])
    z = np.zeros((1, 1), np.int64)
    return {
        "FrameRef": [("pool.get", pool.get), ("pool.lazy", lambda o: pool.lazy([o])),
                     ("push_batch(pad=)", lambda o: pool.push_batch(frames, k=2, pad=o))],
        "LazyFrames": [("stack", lambda o: core.stack([lz, o])),
                       ("table.set(E=1)", lambda o: core.SlotTable(pool, 1, 3).set([0], (o, lz)))],
        "LazyBatch": [("batch.replace", lambda o: batch.replace([0], o)),
                      ("table.set", lambda o: core.SlotTable(pool, 1, 2).set([0], (o,))),
                      ("table.take", lambda o: core.SlotTable(pool, 1, 1).take([0], o, z)),
                      ("_push_dedup", lambda o: pool._push_dedup(frames[None], o))],
    }  # fmt: skip


@isolated
def test_uninitialised_objects_raise_everywhere():
    pool = make_pool()
    ref = pool.push(f(1))
    lz = pool.lazy([ref, ref])
    batch = pool.lazy_batch([[ref, ref]])
    w = Witness(pool, [ref.slot])
    failures = []
    for cls_name in _CLASSES:
        cls = getattr(core, cls_name)
        obj = cls.__new__(cls)
        for name, call in [*_members(obj), *_as_argument(pool, lz, batch).get(cls_name, [])]:
            try:
                call(obj)
            except TypeError as e:
                if not re.search("not initiali[sz]ed|uninitiali[sz]ed|cannot be pickled", str(e)):
                    failures.append(f"{cls_name}.{name}: TypeError {e!r}")
            except Exception as e:
                failures.append(f"{cls_name}.{name}: {type(e).__name__} {e!r}")
            else:
                if (cls_name, name) not in MAY_READ_EMPTY:
                    failures.append(f"{cls_name}.{name}: no exception")
        try:  # repr may describe it or raise; it must not crash
            assert isinstance(repr(obj), str)
        except TypeError as e:
            if not re.search("not initiali[sz]ed", str(e)):
                failures.append(f"{cls_name}.__repr__: TypeError {e!r}")
        del obj
        gc.collect()
    assert not failures, "\n".join(failures)
    w.check()


@isolated
def test_owners_of_another_pool_are_refused():
    pool, batch, w = _setup(n=2, k=2)
    other = make_pool()
    oref = other.push(f(200))
    obatch = other.push_batch(np.stack([f(201), f(202)]), k=2)
    # oref's slot id most likely names a live frame of `pool` too: using it there is the bug
    table = core.SlotTable(pool, 2, 2)
    wo = Witness(other, np.concatenate([[oref.slot], obatch.slots.ravel()]))
    for fn, args, kw in [
        (pool.get, (oref,), {}),
        (pool.refcount, (oref,), {}),
        (pool.lazy, ([batch.slots[0, 0], oref],), {}),
        (pool.lazy_batch, ([[oref, oref]],), {}),
        (pool.push_batch, (np.stack([f(1)]),), {"k": 2, "pad": oref}),
        (batch.shift, (np.stack([f(1), f(2)]), [True, True]), {"pad": oref}),
        (batch.replace, ([0, 1], obatch), {}),
        (table.set, ([0, 1], (obatch,)), {}),
        (table.set, ([0], (obatch[0],)), {}),
        (table.take, ([0], obatch, np.zeros((1, 2), np.int64)), {}),
        (pool._push_dedup, (np.stack([f(1), f(2)])[None],), {"candidates": obatch[:1]}),
        (core.SlotTable(other, 2, 2).set, ([0, 1], (batch,)), {}),
    ]:
        refused(ValueError, "another pool", fn, *args, **kw)
    assert (table.ids() == -1).all()
    w.check()
    wo.check()


# -- crafted pickles -----------------------------------------------------------------------------
def _craft(fn_name, args):
    """Pickle bytes that call ``core.<fn_name>(*args)`` on load (a copyreg-style reducer)."""

    class Call:
        def __reduce__(self):
            return getattr(core, fn_name), args

    return pickle.dumps(Call(), protocol=2)


class _Call:
    """A call written into a pickle stream: ``module.name(*args)`` (GLOBAL, args, REDUCE)."""

    def __init__(self, module, name, args):
        self.module, self.name, self.args = module, name, args


def _ops(value):
    """Pickle opcodes (protocol 2) that push ``value``, written by hand."""
    if value is None:
        return b"N"
    if isinstance(value, int):
        return b"\x8a" + bytes([8]) + int(value).to_bytes(8, "little", signed=True)  # LONG1
    if isinstance(value, str):
        data = value.encode()
        return b"X" + len(data).to_bytes(4, "little") + data  # BINUNICODE
    if isinstance(value, tuple):
        return b"(" + b"".join(_ops(v) for v in value) + b"t"  # MARK ... TUPLE
    if isinstance(value, dict):
        items = b"".join(_ops(k) + _ops(v) for k, v in value.items())
        return b"}(" + items + b"u"  # EMPTY_DICT MARK ... SETITEMS
    assert isinstance(value, _Call)
    head = b"c" + value.module.encode() + b"\n" + value.name.encode() + b"\n"  # GLOBAL
    return head + _ops(value.args) + b"R"  # REDUCE


def _forged(cls_name, state):
    """Pickle bytes: ``cls.__new__(cls)`` (NEWOBJ), then BUILD with ``state``."""
    head = b"\x80\x02c" + core.__name__.encode() + b"\n" + cls_name.encode() + b"\n)\x81"
    return head + _ops(state) + b"b."


def _forged_states(victim):
    """States naming the victim's pool (fetched by a call in the stream) and its slot ids."""
    pool = _Call(core.__name__, "default_pool", ((84, 84, 1), "uint8"))
    slot, slots = victim.slots[0], tuple(victim.slots)
    ref = {"pool": pool, "slot": slot, "_pool": pool, "_slot": slot}
    lazy = {"pool": pool, "slots": slots, "layout": "last", "_pool": pool,
            "_slots": slots, "_layout": "last", "_k": 2}  # fmt: skip
    for name, state in (("FrameRef", ref), ("LazyFrames", lazy)):
        public = {k: v for k, v in state.items() if not k.startswith("_")}
        private = {k: v for k, v in state.items() if k.startswith("_")}
        for st in (state, private, (None, private), (None, public), (private, private)):
            yield name, st


PICKLE_ERRORS = (TypeError, ValueError, AttributeError, pickle.UnpicklingError)


@isolated
def test_crafted_pickles_are_refused():
    shape = (84, 84, 1)
    pool = core.default_pool(shape, np.uint8)
    victim = core.LazyFrames([f(41), f(42)])  # another observation's frames, default pool
    w = Witness(pool, victim.slots)
    frames, batch = "pickled LazyFrames is malformed", "pickled LazyBatch is malformed"
    st = "stack"
    restore = core._restore_frame
    mixed = (restore(f(1)), restore(f(1, dtype=np.int16)))  # two dtypes: two default pools
    two, three = core.LazyFrames([f(1)] * 2), core.LazyFrames([f(1)] * 3)
    other = core.LazyFrames([f(1, dtype=np.int16)] * 2)
    for exc, pattern, data in [
        # ints where FrameRefs belong (a stream of raw opcodes would load the same ints)
        (TypeError, frames, _craft("_restore_lazyframes", (victim.slots, "last"))),
        (TypeError, frames, _craft("_restore_lazyframes", (list(victim.slots), "last"))),
        (TypeError, frames, _craft("_restore_lazyframes", ((), "last"))),  # empty
        (TypeError, frames, _craft("_restore_lazyframes", ([restore(f(1))], "last"))),  # a list
        (TypeError, "pickled frame is malformed", _craft("_restore_frame", (victim.slots[0],))),
        (TypeError, "numeric dtype", _craft("_restore_frame", (np.empty(shape, object),))),
        (TypeError, batch, _craft("_restore_lazybatch", ((victim.slots,), st))),
        (TypeError, batch, _craft("_restore_lazybatch", ((), st))),
        (ValueError, "belongs to another pool", _craft("_restore_lazyframes", (mixed, "last"))),
        (ValueError, "different stack sizes", _craft("_restore_lazybatch", ((two, three), st))),
        (ValueError, "belongs to another pool", _craft("_restore_lazybatch", ((two, other), st))),
    ]:  # fmt: skip
        refused(exc, pattern, pickle.loads, data)
    del mixed, two, three, other, data
    # FrameRefs and LazyFrames forged from the class and a state naming the victim's slots
    for cls_name, state in _forged_states(victim):
        data = _forged(cls_name, state)
        with pytest.raises(PICKLE_ERRORS):
            pickle.loads(data)
        gc.collect()
    # the same, by hand without pickle: __new__ then __setstate__ or attribute writes
    forged = core.FrameRef.__new__(core.FrameRef)
    for attack in (
        lambda o=forged: o.__setstate__((pool, victim.slots[0])),
        lambda o=forged: setattr(o, "slot", victim.slots[0]),
        lambda o=forged: setattr(o, "pool", pool),
    ):
        with pytest.raises((TypeError, AttributeError)):
            attack()
    del forged
    gc.collect()
    np.testing.assert_array_equal(np.asarray(victim), np.concatenate([f(41), f(42)], -1))
    w.check()


# -- the v2 review: out=, phases, layouts, k, reentrant __init__, ABA, ids -----------------
def _lies(name, value):
    """An ndarray subclass ``_Lies<name>`` whose property ``name`` answers ``value``."""
    return type(f"_Lies{name.capitalize()}", (np.ndarray,), {name: property(lambda _: value)})


@isolated
def test_out_subclasses_are_refused():
    pool, batch, _ = _setup(n=2, k=2)
    table = core.SlotTable(pool, 2, 2)
    table.set([0, 1], (batch,))
    pairs = table.batch_pairs([0, 1], (0, 2), [0, 1], (0, 2))
    w = Witness(pool, batch.slots)
    frozen = b"\x07" * (2 * 84 * 84 * 2)  # the bytes of an immutable object
    flags = type("Flags", (), {"c_contiguous": True, "writeable": True, "aligned": True})()
    outs = [
        np.zeros(16, np.uint8).view(_lies("shape", (64, 84, 84, 2))),  # 16 bytes
        np.zeros((2, 84, 84, 2), np.uint8).view(_lies("dtype", np.dtype(np.float64))),  # uint8
        np.frombuffer(frozen, np.uint8).reshape(2, 84, 84, 2).view(_lies("flags", flags)),  # r-o
    ]
    calls = [
        lambda o: pool.gather(batch.slots, o),
        lambda o: batch.numpy(o),
        lambda o: core.stack(list(pool.lazy_batch(batch.slots, layout="last")), o),
        lambda o: table.gather([0, 1], 0, 2, o),
        lambda o: table.gather_pairs([0, 1], (0, 2), [0, 1], (0, 2), out=(o, np.empty_like(o))),
        lambda o: pairs.numpy_pairs(out=(np.empty_like(o), o)),
    ]
    calls.append(lambda o: core._memcpy_gather(pool, batch.slots, o))
    for out in outs:
        before = out.view(np.ndarray).tobytes()
        for call in calls:
            refused(TypeError, r"out must be a numpy\.ndarray, got _Lies.*out\.view", call, out)
        assert out.view(np.ndarray).tobytes() == before
    assert frozen == b"\x07" * (2 * 84 * 84 * 2)
    w.check()


@isolated
def test_out_or_frames_resized_by_a_callback_are_refused():
    pool, batch, _ = _setup(n=16, k=2)
    table = core.SlotTable(pool, 16, 2)
    table.set(list(range(16)), (batch,))
    pairs = table.batch_pairs(np.arange(16), (0, 2), np.arange(16), (0, 2))
    w = Witness(pool, batch.slots)
    o1, o2 = (np.zeros((16, 84, 84, 2), np.float32) for _ in range(2))

    class Shrinks:  # a dtype-like whose np.dtype() conversion shrinks o1
        @property
        def dtype(self):
            o1.resize((1,), refcheck=False)
            return np.dtype(np.float32)

    class Scale(float):  # a scale whose float() shrinks o1 (the compiled core calls it)
        def __float__(self):
            o1.resize((1,), refcheck=False)
            return 1.0

    class Slots(np.ndarray):  # slot ids whose overlap check shrinks o1
        def __array_function__(self, func, types, args, kwargs):
            o1.resize((1,), refcheck=False)
            return False

    slots = batch.slots.view(Slots)
    rows = np.arange(16)
    attacks = [
        lambda: pool.gather(batch.slots, o1, dtype=Shrinks()),
        lambda: pool.gather(batch.slots, o1, dtype=np.float32, scale=Scale(1.0)),
        lambda: pool.gather(slots, o1, dtype=np.float32),
        lambda: batch.numpy(o1, dtype=np.float32, scale=Scale(1.0)),
        lambda: table.gather(rows, 0, 2, o1, dtype=np.float32, scale=Scale(1.0)),
        lambda: table.gather_pairs(rows, (0, 2), rows, (0, 2), (o2, o1), dtype=Shrinks()),
        lambda: table.gather_pairs(rows, (0, 2), rows, (0, 2), (o1, o2), dtype=Shrinks()),
        lambda: pairs.numpy_pairs((o2, o1), dtype=Shrinks()),
        lambda: pairs.numpy_pairs((o1, o2), dtype=np.float32, scale=Scale(1.0)),
    ]
    for attack in attacks:
        o1.resize((16, 84, 84, 2), refcheck=False)
        o1[...] = 0
        # refused: "out has shape", "out changed"
        message = raised((ValueError, RuntimeError), attack)
        if message is None:  # a core that never ran the callback, or ran it before checking out
            assert o1.shape == (16, 84, 84, 2)
        else:
            assert re.search("out has shape|out changed", message), message
    w.check()
    small = make_pool((2, 2))
    restarted = small.push_batch(np.zeros((2, 2, 2), np.uint8), k=4)
    frames = np.ones((2, 2, 2), np.uint8)

    class Restart:  # restart flags whose conversion resizes the frames
        def __array__(self, dtype=None, copy=None):
            frames.resize((5000, 2, 2), refcheck=False)
            return np.zeros(2, bool)

    refused(ValueError, r"frames have shape \(5000, 2, 2\)", restarted.shift, frames, Restart())
    assert small.live_frames == 2
    del restarted
    assert small.live_frames == 0


@isolated
def test_reentrant_init_is_refused_without_leak_or_reset():
    pool = core.FramePool.__new__(core.FramePool)
    keep = []

    class Chunk:
        def __index__(self):
            pool.__init__((4,), np.uint8)
            keep.append(pool.push(np.zeros(4, np.uint8)))
            return 1 << 20

    refused(RuntimeError, "FramePool.__init__ called twice", pool.__init__,
             (4,), np.uint8, chunk_bytes=Chunk())  # fmt: skip
    assert pool.live_frames == 1 and pool.get(keep[0]).tolist() == [0] * 4
    keep.clear()
    assert pool.live_frames == 0

    pool = core.FramePool.__new__(core.FramePool)

    class Options(Mapping):  # compress= is converted before the pool commits
        def __iter__(self):
            if not keep:
                pool.__init__((4,), np.uint8)
                keep.append(pool.push(np.ones(4, np.uint8)))
            return iter(())

        def __getitem__(self, key):
            raise KeyError(key)

        def __len__(self):
            return 0

    refused(RuntimeError, "FramePool.__init__ called twice", pool.__init__,
             (4,), np.uint8, compress=Options())  # fmt: skip
    assert pool.compression is None and pool.get(keep[0]).tolist() == [1] * 4
    keep.clear()
    assert pool.live_frames == 0

    shared = core.default_pool((3,), np.uint8)
    before = shared.live_frames
    box = [core.LazyFrames.__new__(core.LazyFrames)]

    class Frame:
        def __array__(self, dtype=None, copy=None):
            box[0].__init__([np.full(3, 7, np.uint8)] * 2)
            return np.zeros(3, np.uint8)

    refused(RuntimeError, "LazyFrames.__init__ called twice", box[0].__init__, [Frame()])
    assert np.asarray(box[0]).tolist() == [7] * 6  # the inner __init__ stands
    box.clear()
    gc.collect()
    assert shared.live_frames == before

    pool = make_pool((2,))
    box = [core.SlotTable.__new__(core.SlotTable)]

    class Rows:
        def __index__(self):
            box[0].__init__(pool, 4, 1)
            box[0].set([0], (pool.lazy([pool.push(np.ones(2, np.uint8))]),))
            return 3

    refused(RuntimeError, "SlotTable.__init__ called twice", box[0].__init__, pool, Rows(), 1)
    assert box[0].shape == (4, 1) and pool.live_frames == 1
    box.clear()
    gc.collect()
    assert pool.live_frames == 0


class _Layout(str):
    """A layout whose ``==`` always answers True, and that runs ``hook`` when compared."""

    hook = None

    def __eq__(self, other):
        if _Layout.hook is not None:
            hook, _Layout.hook = _Layout.hook, None
            hook()
        return True

    __hash__ = str.__hash__


@isolated
def test_layouts_are_compared_as_plain_strings():
    pool = make_pool(())  # scalar frames: only "stack" fits
    r = pool.push(np.uint8(5))
    refused(ValueError, "layout must be one of", pool.gather, [[r] * 1000], layout=_Layout("x"))
    refused(ValueError, "scalar frames cannot be concatenated", pool.gather,
             [[r] * 1000], layout=_Layout("last"))  # fmt: skip
    assert pool.gather([[r] * 3], layout=_Layout("stack")).tolist() == [[5, 5, 5]]
    lz = pool.lazy([r], layout=_Layout("stack"))
    assert type(lz.layout) is str and lz.layout == "stack"
    assert _Layout.hook is None


@isolated
def test_table_reads_racing_writes_in_threads():
    pool = make_pool()
    table = core.SlotTable(pool, 16, 3)
    errors = []

    def writer():
        rng = np.random.default_rng(0)
        for _ in range(RACE_ROUNDS):
            v = int(rng.integers(256))
            b = pool.push_batch(np.stack([f(v)] * 4), k=3)  # every row holds value v
            table.set(rng.choice(16, 4, replace=False), (b,))
            table.clear(rng.choice(16, 2, replace=False))

    def reader():
        out = np.empty((8, 84, 84, 3), np.uint8)
        for _ in range(RACE_ROUNDS):
            try:
                got = table.gather(np.arange(8), 0, 3, out)
            except ValueError as e:  # an empty row: fine
                if "empty" not in str(e):
                    errors.append(str(e))
                continue
            for row in got:  # the three frames of a row were stored together
                if not (row == row[0, 0, 0]).all():
                    errors.append("torn read")

    with ThreadPoolExecutor(3) as pool_of_threads:
        list(pool_of_threads.map(lambda fn: fn(), (writer, reader, reader)))
    assert not errors, errors[:3]
    table.clear()
    assert pool.live_frames == 0


@isolated
def test_sumtree_indices_written_by_another_thread_mid_call():
    """``set`` and ``update`` check private copies: a racing writer cannot slip an index past."""
    import threading

    n, m = 1 << 10, 1 << 18
    tree = core.SumTree(n)
    good, bad = np.full(m, 5, np.int64), np.full(m, -(1 << 40), np.int64)
    idx, ones = good.copy(), np.ones(m)
    done = threading.Event()

    def flip():  # another thread writes the caller's indices while the tree uses them
        while not done.is_set():
            np.copyto(idx, bad)
            np.copyto(idx, good)

    th = threading.Thread(target=flip)
    th.start()
    try:
        for _ in range(RACE_ROUNDS // 10):
            for call in (lambda: tree.set(idx, ones), lambda: tree.update(idx, ones, 1.0)):
                with contextlib.suppress(ValueError):  # the check saw the bad indices
                    call()
    finally:
        done.set()
        th.join()
    leaves = tree.get(np.arange(n))  # 5, or 0: an index read torn between 5 and -(1 << 40)
    assert set(np.flatnonzero(leaves)) <= {0, 5} and set(leaves[leaves > 0]) <= {1.0}


@isolated
def test_small_disagreements_of_the_review():
    pool, batch, w = _setup()
    refused(TypeError, "unhashable", hash, batch)  # (a LazyFrames: test_cases_core C03)
    big = np.uint64(2**64 - 1)
    for bad in (big, np.array([[big]]), [[2**64]], [[-(2**64)]], [[2**63]]):
        v = int(np.ravel(np.asarray(bad, dtype=object))[0])
        pattern = rf"slot {v} is out of range"
        refused(IndexError, pattern, pool.gather, bad if np.ndim(bad) else [[bad]])
    refused(IndexError, rf"slot {2**64 - 1} is out of range", pool.get, big)
    for x in (True, False):  # bools are not slot ids
        refused(TypeError, "a slot id must be an int or a FrameRef, got bool", pool.get, x)
        refused(TypeError, "got bool", pool.refcount, x)
        refused(TypeError, "", pool.lazy, [x])
    never = pool.capacity - 1  # in a chunk the arena made, never handed out
    assert pool.refcount(never) == 0
    refused(ValueError, f"slot {never} is free", pool.get, never)
    refused(IndexError, "out of range", pool.get, pool.capacity)
    # the weakref callback of _push_known, on a bare pool
    core.FramePool.__new__(core.FramePool)._forget(0, None)
    w.check()


def test_pool_internals_cannot_change_what_pickles():
    pool = make_pool((2,))
    a, b = pool.push(np.ones(2, np.uint8)), pool.push(np.full(2, 2, np.uint8))
    assert gc.get_referents(pool) == []  # _refs and _by_id are not reachable from the pool
    lz = pool.lazy([a, a])
    for o in gc.get_objects():  # tamper with the pickling map itself
        if type(o).__name__ == "WeakValueDictionary" and a.slot in o.data:
            o[a.slot] = b
    assert np.asarray(pickle.loads(pickle.dumps(lz))).tolist() == [1, 1, 1, 1]


def test_removed_api_is_gone():
    gone = {core.FramePool: ["retain", "release", "push_many", "shift_rings", "write_slots",
                             "push_dedup", "gather_pairs"], core: ["_write_transitions"],
            core.LazyFrames: ["from_slots"], core.FrameRef: ["__index__", "__int__"]}  # fmt: skip
    assert not [(o, n) for o, names in gone.items() for n in names if hasattr(o, n)]  # no int
    refused(ImportError, "", __import__, "lazyframes._backend")


def _attack_that_crashes():
    import ctypes

    ctypes.string_at(0)  # a NULL read: the child dies of SIGSEGV


def test_a_crash_in_an_attack_fails_the_test_not_the_session():
    refused(AssertionError, "_attack_that_crashes exited with -11", _isolated, _attack_that_crashes)
