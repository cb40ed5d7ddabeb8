"""The compiled module: names, docstrings and their doctests, its stub (mypy's), layout codes."""

import ast
import doctest
import functools
import inspect
import pathlib
import re
import shutil
import subprocess
import sys

from conftest import ROOT

import lazyframes
from lazyframes import _core as core

PUBLIC = {"FramePool", "FrameRef", "LazyFrames", "LazyBatch", "SlotTable", "RowRing", "SumTree",
          "stack", "default_pool", "encode_frames", "decode_frames", "set_num_threads",
          "get_num_threads", "draw_integers", "check_outs", "check_apart", "Handoff",
          "SharedWord", "unscale_u8"}  # fmt: skip
# encode_frames
CONSTANTS = {"KIND_KEY", "KIND_DELTA", "KIND_RAW", "KIND_PATCH", "KIND_XOR", "KIND_PACKED_BLOSC",
             "KIND_PACKED"}  # fmt: skip
PICKLING = {"_restore_frame", "_restore_lazyframes", "_restore_lazybatch"}
# dunders that are part of the API (their protocol is their documentation)
DUNDERS = {"__array__", "__dlpack__", "__dlpack_device__", "__len__", "__getitem__",
           "__iter__", "__copy__", "__deepcopy__", "__reduce__", "__eq__", "__ne__",
           "__repr__"}  # fmt: skip


def _defined(mod):
    """Names defined by the module itself (not imported into it)."""
    return {n for n in dir(mod) if getattr(getattr(mod, n), "__module__", None) == mod.__name__}


def _api(mod):
    """Every documented callable or property: qualified name -> object."""
    out = {}
    for name in sorted(PUBLIC):
        obj = getattr(mod, name)
        out[name] = obj
        if inspect.isclass(obj):
            for member in dir(obj):
                if not member.startswith("_") or member in DUNDERS:
                    out[f"{name}.{member}"] = inspect.getattr_static(obj, member)
    return out


def test_public_names():
    defined = _defined(core)
    assert {n for n in defined if not n.startswith("_")} == PUBLIC
    assert set(core.__all__) == PUBLIC | CONSTANTS
    assert [getattr(core, n) for n in sorted(CONSTANTS)] == [1, 0, 6, 5, 3, 2, 4]
    assert defined >= PICKLING | {"_memcpy_gather"}  # the bench floor
    for name in ("FramePool", "FrameRef", "LazyFrames", "LazyBatch", "stack", "default_pool"):
        assert getattr(lazyframes, name) is getattr(core, name)


def test_every_public_item_is_documented():
    missing = [
        q
        for q, obj in _api(core).items()
        if q.rsplit(".", 1)[-1] not in DUNDERS and not (inspect.getdoc(obj) or "").strip()
    ]
    assert not missing


def test_constructors_have_the_class_signature():
    for name in ("FramePool", "LazyFrames", "SlotTable", "SumTree"):
        params = list(inspect.signature(getattr(core, name)).parameters)
        assert params and params[0] != "self", name


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


def test_import_without_the_core_says_how_to_build_it(tmp_path):
    # a core that does not load: the import's own error is named
    code = "import sys; sys.modules['lazyframes._core'] = None; import lazyframes"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: lazyframes: the compiled core"), r.stderr
    assert "does not load (import of lazyframes._core halted" in last, last
    assert "pip install -e ." in last and "setup.py build_ext --inplace" in last
    assert r.stderr.count("Traceback") == 1  # one error, not a chain
    # an unbuilt clone (no site: no installed lazyframes): "not built", no circular import
    (tmp_path / "lazyframes").mkdir()
    shutil.copy(pathlib.Path(ROOT, "lazyframes", "__init__.py"), tmp_path / "lazyframes")
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import lazyframes"
    r = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True)
    last = r.stderr.strip().splitlines()[-1]
    assert "(lazyframes._core) is not built. Install" in last, r.stderr
    assert "circular" not in r.stderr and r.stderr.count("Traceback") == 1


def test_docstring_examples_run():
    tests = [t for t in doctest.DocTestFinder().find(core) if t.examples]
    assert len(tests) > 10, "the compiled core's docstrings have (almost) no examples"
    failures = []
    for t in tests:
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        runner.run(t, out=failures.append)
    assert not failures, "".join(failures)


def _stub():
    """Top-level nodes of the stub by name: functions, classes and annotated constants."""
    tree = ast.parse((pathlib.Path(ROOT) / "lazyframes" / "_core.pyi").read_text())
    nodes = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            nodes[node.name] = node
        elif isinstance(node, ast.AnnAssign):
            nodes[node.target.id] = node
    return tree, nodes


def _parameters(fn):
    """(positional, keyword-only) parameter names of a stub function."""
    a = fn.args
    return [p.arg for p in a.posonlyargs + a.args], [p.arg for p in a.kwonlyargs]


def _runtime_parameters(obj):
    params = inspect.signature(obj).parameters.values()
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return ([p.name for p in params if p.kind in positional],
            [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY])  # fmt: skip


def test_stub_matches_the_module():
    tree, nodes = _stub()
    problems = [
        f"{n}: in the module's __all__, not in the stub" for n in core.__all__ if n not in nodes
    ]
    entries = [(n, f) for n, f in nodes.items() if isinstance(f, ast.FunctionDef)]
    for cls in (f for f in nodes.values() if isinstance(f, ast.ClassDef)):
        members = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
        entries += [(f"{cls.name}.{m}", f) for m, f in members.items()]
        public = {m for m in dir(getattr(core, cls.name)) if not m.startswith("_")}
        problems += [
            f"{cls.name}.{m}: in the module, not in the stub" for m in public - set(members)
        ]
    for name, fn in entries:
        try:
            obj = functools.reduce(getattr, name.split("."), core)
        except AttributeError:
            problems.append(f"{name}: in the stub, not in the module")
            continue
        is_property = any(getattr(d, "id", None) == "property" for d in fn.decorator_list)
        if is_property or name.rpartition(".")[2].startswith("__"):
            continue  # a property has no signature; a special method's is the protocol's
        if _parameters(fn) != _runtime_parameters(obj):
            problems.append(f"{name}: stub {_parameters(fn)}, module {_runtime_parameters(obj)}")
    assert not problems, "\n".join(problems)
    docstrings = [n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef))]
    assert not [n.name for n in docstrings if ast.get_docstring(n)], "the docs live in csrc/"
    assert len((ast.get_docstring(tree) or "").splitlines()) == 1
