"""The two cores have one API: names, signatures, first doc lines, layout codes, errors.

Documentation is written once, in the compiled core; the twin carries the first line
of each docstring. These tests keep the two from drifting apart: the same public names,
the same ``inspect.signature`` (parameter names, kinds and defaults) and the same first
docstring line for every public class, method, property and function; the layout enum
of ``csrc/layout.h`` in the order of ``lazyframes.LAYOUTS``; and the same exception type
and message for a sample of misuses.
"""

import inspect
import pathlib
import re

import numpy as np
import pytest
from conftest import IMPLS, ROOT, core, f, needs_both

import lazyframes

PUBLIC = {
    "FramePool",
    "FrameRef",
    "LazyFrames",
    "LazyBatch",
    "SlotTable",
    "SumTree",
    "stack",
    "default_pool",
    "encode_frames",
    "decode_frames",
}
CONSTANTS = {"KIND_KEY", "KIND_DELTA", "KIND_RAW"}  # the kinds of blob of encode_frames
PICKLING = {"_restore_frame", "_restore_lazyframes", "_restore_lazybatch"}
# dunders that are part of the API (their protocol is their documentation)
DUNDERS = {
    "__array__",
    "__dlpack__",
    "__dlpack_device__",
    "__len__",
    "__getitem__",
    "__iter__",
    "__copy__",
    "__deepcopy__",
    "__reduce__",
    "__eq__",
    "__ne__",
    "__repr__",
}
# dunders a compiled type implements as C slots: their signature is the protocol's
SLOTS = {"__len__", "__getitem__", "__iter__", "__eq__", "__ne__", "__repr__"}
CONSTRUCTIBLE = ("FramePool", "LazyFrames", "SlotTable")


def _defined(mod):
    """Names defined by the module itself (not imported into it)."""
    return {n for n in dir(mod) if getattr(getattr(mod, n), "__module__", None) == mod.__name__}


def _members(cls):
    """Public methods and properties of a class, plus its documented dunders."""
    return sorted(n for n in dir(cls) if not n.startswith("_") or n in DUNDERS)


def _first_line(obj):
    doc = inspect.getdoc(obj) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _signature(fn):
    """Parameter names, kinds and defaults (annotations are free to differ)."""
    try:
        sig = inspect.signature(fn)
    except (ValueError, TypeError) as e:
        return f"no signature: {type(e).__name__}"
    return [(p.name, p.kind.name, repr(p.default)) for p in sig.parameters.values()]


@pytest.mark.parametrize("name", IMPLS)
def test_public_names(name):
    mod = core(name)
    defined = _defined(mod)
    assert {n for n in defined if not n.startswith("_")} == PUBLIC
    assert set(getattr(mod, "__all__", PUBLIC)) == PUBLIC | CONSTANTS
    assert [getattr(mod, n) for n in sorted(CONSTANTS)] == [1, 0, 2]
    assert defined >= PICKLING
    if name == "compiled":
        assert "_memcpy_gather" in defined  # the bench floor


def _api(mod):
    """Every documented callable or property of a core: qualified name -> object."""
    out = {}
    for name in sorted(PUBLIC):
        obj = getattr(mod, name)
        out[name] = obj
        if inspect.isclass(obj):
            for member in _members(obj):
                out[f"{name}.{member}"] = inspect.getattr_static(obj, member)
    return out


@needs_both
def test_same_members():
    a, b = (_api(core(n)) for n in ("compiled", "reference"))
    assert sorted(a) == sorted(b)


def _callable_of(obj):
    if isinstance(obj, (staticmethod, classmethod)):
        return obj.__func__
    return obj


@needs_both
def test_signatures_agree():
    a, b = (_api(core(n)) for n in ("compiled", "reference"))
    diffs = []
    for qual in sorted(set(a) & set(b)):
        x, y = _callable_of(a[qual]), _callable_of(b[qual])
        if isinstance(x, property) or isinstance(y, property) or inspect.isclass(x):
            continue
        if not callable(x) or not callable(y) or qual.rsplit(".", 1)[-1] in SLOTS:
            continue
        sx, sy = _signature(x), _signature(y)
        if sx != sy:
            diffs.append(f"{qual}:\n  compiled  {sx}\n  reference {sy}")
    assert not diffs, "\n".join(diffs)


@needs_both
@pytest.mark.parametrize("name", CONSTRUCTIBLE)
def test_constructor_signatures_agree(name):
    a, b = (_signature(getattr(core(n), name)) for n in ("compiled", "reference"))
    assert a == b
    assert a[0][0] != "self"  # the class's signature, not the slot's


@needs_both
def test_first_doc_lines_agree():
    a, b = (_api(core(n)) for n in ("compiled", "reference"))
    diffs = []
    for qual in sorted(set(a) & set(b)):
        if qual.rsplit(".", 1)[-1] in DUNDERS:
            continue  # protocol methods: their protocol is their documentation
        x, y = _first_line(a[qual]), _first_line(b[qual])
        if x != y or not x:
            diffs.append(f"{qual}:\n  compiled  {x!r}\n  reference {y!r}")
    assert not diffs, "\n".join(diffs)


@pytest.mark.parametrize("name", IMPLS)
def test_every_public_item_is_documented(name):
    missing = [
        q
        for q, obj in _api(core(name)).items()
        if q.rsplit(".", 1)[-1] not in DUNDERS and not _first_line(obj)
    ]
    assert not missing


def test_layout_enum_matches_python():
    text = (pathlib.Path(ROOT) / "csrc" / "layout.h").read_text()
    m = re.search(r"typedef\s+enum\s*\{([^}]*)\}\s*lf_layout\s*;", text)
    assert m, "no `typedef enum { ... } lf_layout;` in csrc/layout.h"
    codes = {}
    for item in m.group(1).split(","):
        name, _, value = (s.strip() for s in item.partition("="))
        assert name.startswith("LF_") and value.isdigit(), item
        codes[int(value)] = name[3:].lower()
    assert sorted(codes) == list(range(len(codes)))
    assert tuple(codes[i] for i in range(len(codes))) == lazyframes.LAYOUTS
    assert lazyframes.LAYOUTS == ("last", "first", "stack")


# -- the same error for the same misuse ------------------------------------------------------


def _world(mod):
    """A small pool with owners of every kind, made the same way in each core."""
    pool = mod.FramePool((84, 84, 1), np.uint8)
    refs = [pool.push(f(v)) for v in range(4)]
    batch = pool.lazy_batch([refs[:2], refs[2:]])
    table = mod.SlotTable(pool, 3, 2)
    table.set([0, 1], (batch,))
    other = mod.FramePool((84, 84, 1), np.uint8)
    return {
        "mod": mod,
        "pool": pool,
        "refs": refs,
        "lz": pool.lazy(refs),
        "batch": batch,
        "table": table,
        "other": other,
        "oref": other.push(f(9)),
        "free": _free_slot(pool, refs),
    }


def _aliased(nbytes):
    """Slot ids ``[[0]]`` and an ``out`` of ``nbytes`` uint8 in the same memory."""
    buf = np.zeros(max(nbytes // 8, 1), np.int64)
    out = buf.view(np.uint8)[:nbytes]
    return buf[:1].reshape(1, 1), out.reshape((1, 84, 84, 1) if nbytes == 84 * 84 else (1, -1))


def _readonly(shape):
    a = np.zeros(shape, np.uint8)
    a.flags.writeable = False
    return a


def _free_slot(pool, refs):
    gone = pool.push(f(99))
    s = gone.slot
    del gone
    return s


MISUSES = {
    "FramePool bad dtype": lambda w: w["mod"].FramePool((2,), object),
    "FramePool bad shape": lambda w: w["mod"].FramePool((2, 0), np.uint8),
    "FramePool chunk_bytes": lambda w: w["mod"].FramePool((2,), np.uint8, chunk_bytes=0),
    "FrameRef()": lambda w: w["mod"].FrameRef(),
    "LazyBatch()": lambda w: w["mod"].LazyBatch(),
    "push shape": lambda w: w["pool"].push(np.zeros((84, 84), np.uint8)),
    "push dtype": lambda w: w["pool"].push(np.zeros((84, 84, 1), np.int16)),
    "push_batch empty": lambda w: w["pool"].push_batch(np.zeros((0, 84, 84, 1), np.uint8)),
    "push_batch k": lambda w: w["pool"].push_batch(np.stack([f(1)]), k=0),
    "push_batch pad int": lambda w: w["pool"].push_batch(np.stack([f(1)]), k=2, pad=0),
    "push_batch pad pool": lambda w: w["pool"].push_batch(np.stack([f(1)]), k=2, pad=w["oref"]),
    "get free": lambda w: w["pool"].get(w["free"]),
    "get range": lambda w: w["pool"].get(2**40),
    "get negative": lambda w: w["pool"].get(-1),
    "get float": lambda w: w["pool"].get(1.5),
    "get other pool": lambda w: w["pool"].get(w["oref"]),
    "refcount range": lambda w: w["pool"].refcount(-1),
    "lazy empty": lambda w: w["pool"].lazy([]),
    "lazy free": lambda w: w["pool"].lazy([0, w["free"]]),
    "lazy layout": lambda w: w["pool"].lazy([0], layout="middle"),
    "lazy_batch 1-D": lambda w: w["pool"].lazy_batch([0, 1]),
    "gather out overlaps": lambda w: w["pool"].gather(*_aliased(84 * 84)),
    "gather out overlaps, wrong shape": lambda w: w["pool"].gather(*_aliased(8)),
    "gather out shape": lambda w: w["pool"].gather([[0, 1]], np.zeros((1, 84, 84, 3), np.uint8)),
    "gather out readonly": lambda w: w["pool"].gather([[0, 1]], _readonly((1, 84, 84, 2))),
    "gather scale int": lambda w: w["pool"].gather([[0, 1]], scale=0.5),
    "gather cast": lambda w: w["pool"].gather([[0, 1]], dtype=np.bool_),
    "stack empty": lambda w: w["mod"].stack([]),
    "stack ndarray": lambda w: w["mod"].stack([np.zeros(3)]),
    "shift shape": lambda w: w["lz"].shift(np.zeros((84, 84), np.uint8)),
    "frame index": lambda w: w["lz"].frame(99),
    "copy False": lambda w: w["lz"].__array__(None, False),
    "batch index": lambda w: w["batch"][5],
    "batch index type": lambda w: w["batch"][1.5],
    "batch shift restart": lambda w: w["batch"].shift(np.stack([f(1), f(2)]), [True]),
    "batch replace rows": lambda w: w["batch"].replace([0, 0], w["batch"]),
    "batch replace geometry": lambda w: w["batch"].replace([0], w["pool"].lazy_batch([[0]])),
    "table shape": lambda w: w["mod"].SlotTable(w["pool"], 2, 0),
    "table set duplicate": lambda w: w["table"].set([1, 1], (w["batch"],)),
    "table set range": lambda w: w["table"].set([0, 2**63 - 1], (w["batch"],)),
    "table set width": lambda w: w["table"].set([0, 1], (w["batch"], w["batch"])),
    "table set pool": lambda w: w["mod"].SlotTable(w["other"], 2, 2).set([0, 1], (w["batch"],)),
    "table batch empty": lambda w: w["table"].batch([2], 0, 2),
    "table batch cols": lambda w: w["table"].batch([0], 1, 1),
    "table pairs widths": lambda w: w["table"].gather_pairs([0], (0, 2), [1], (0, 1)),
    "table pairs lengths": lambda w: w["table"].gather_pairs([0], (0, 1), [1, 0], (0, 1)),
    "table take index": lambda w: w["table"].take([2], w["batch"], np.array([[0, 4]])),
    "table take shape": lambda w: w["table"].take([2], w["batch"], np.array([[0]])),
    "table step range": lambda w: w["table"].step_fields(
        [3], np.zeros(3, np.uint8), np.zeros(3, np.float32), 0.9
    ),
    "table step arrays": lambda w: w["table"].step_fields(
        [0], np.zeros(2, np.uint8), np.zeros(3, np.float32), 0.9
    ),
    "table pickle": lambda w: w["table"].__reduce__(),
    "pool pickle": lambda w: w["pool"].__reduce__(),
    "uninit LazyFrames": lambda w: w["mod"].LazyFrames.__new__(w["mod"].LazyFrames).shape,
    "uninit SlotTable": lambda w: w["mod"].SlotTable.__new__(w["mod"].SlotTable).ids(),
    "restore ints": lambda w: w["mod"]._restore_lazyframes((0, 1), "last"),
    "restore frame": lambda w: w["mod"]._restore_frame(3),
}


@needs_both
@pytest.mark.parametrize("case", sorted(MISUSES))
def test_errors_agree(case):
    got = []
    for name in ("compiled", "reference"):
        world = _world(core(name))
        try:
            MISUSES[case](world)
        except Exception as e:
            got.append((type(e).__name__, str(e)))
        else:
            got.append(None)
    assert got[0] is not None, f"{case}: the compiled core raised nothing"
    assert got[0] == got[1]
