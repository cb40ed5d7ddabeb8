"""CI cells run from the test suite, each in a subprocess that must exit cleanly.

- lint and format (``ruff``), Cython lint (``cython-lint``), types (``mypy``), with the
  versions pinned in the ``test`` extra and the configuration in ``pyproject.toml``;
- the examples in the compiled core's docstrings (``--doctest-modules`` sees only ``.py``);
- the stub ``lazyframes/_core.pyi`` against both cores (names and parameters);
- the pure cell: the whole suite again with ``LAZYFRAMES_NO_EXTENSIONS=1``;
- the sanitizer cell: the extension built with AddressSanitizer and UBSan in a scratch copy of
  the repository, running the core tests and the differential fuzzer against it.

A missing tool fails its cell with a message; nothing is skipped. A cell's subprocess sets
``LAZYFRAMES_CI_CELL`` and deselects the ``guardrail`` marker, so cells never nest.
"""

import ast
import doctest
import functools
import importlib
import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CELL_ENV = "LAZYFRAMES_CI_CELL"
# the pure cell passes ~280 tests (the compiled-only ones skip); far fewer means it collected
# the wrong thing or stopped early
MIN_PURE_TESTS = 200
SANITIZER_TESTS = [
    "tests/test_core.py",
    "tests/test_misuse.py",
    "tests/test_fuzz.py",
    "tests/test_compress.py",
]
SANITIZER_REPORT = re.compile(r"ERROR: AddressSanitizer|runtime error:|ERROR: LeakSanitizer")

pytestmark = pytest.mark.guardrail


@pytest.fixture(autouse=True)
def _not_inside_a_cell():
    """A cell's subprocess deselects this module; the guard stops a nested run regardless."""
    if os.environ.get(CELL_ENV):
        pytest.skip(f"already inside the {os.environ[CELL_ENV]!r} CI cell")


def _run(cmd, *, cwd=ROOT, env=None, timeout=600):
    """Run ``cmd``; fail the test with its output unless it exits 0. Returns the output."""
    try:
        r = subprocess.run(
            cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError as e:
        pytest.fail(f"{cmd[0]} is not installed: pip install -e '.[test]' ({e})")
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(map(str, cmd))} ran over {timeout} s\n{e.stdout}\n{e.stderr}")
    out = r.stdout + r.stderr
    if r.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{out}", pytrace=False)
    return out


def _tool(name):
    """The console script ``name`` next to this interpreter, or on PATH; fails if absent."""
    local = Path(sys.executable).with_name(name)
    found = str(local) if local.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return found


def _cell_env(cell, **extra):
    """The environment of a cell's subprocess: this one's, marked, with the core not forced."""
    env = {k: v for k, v in os.environ.items() if k != "LAZYFRAMES_NO_EXTENSIONS"}
    env.update({CELL_ENV: cell, "PYTHONDONTWRITEBYTECODE": "1"}, **extra)
    return env


def _passed(out):
    """The count of the closing ``N passed`` line of a pytest run."""
    m = re.search(r"(\d+) passed", out.splitlines()[-1] if out.strip() else "")
    assert m, f"no pytest summary line:\n{out}"
    return int(m.group(1))


# -- lint, format, types ------------------------------------------------------------------


def test_ruff_check():
    _run([_tool("ruff"), "check", "--no-cache", "--output-format", "concise", "."])


def test_ruff_format():
    _run([_tool("ruff"), "format", "--check", "--no-cache", "."])


def test_cython_lint():
    _run([_tool("cython-lint"), "csrc/"])


def test_mypy():
    # /dev/null: no incremental cache in the checkout (and none that a concurrent edit can stale)
    _run([_tool("mypy"), "--cache-dir", os.devnull], timeout=900)


# -- the compiled core's docstring examples -------------------------------------------------


def test_compiled_core_docstring_examples():
    from lazyframes import _core

    tests = [t for t in doctest.DocTestFinder().find(_core) if t.examples]
    assert tests, "the compiled core's docstrings have no examples"
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    failures = []
    for t in tests:
        runner = doctest.DocTestRunner(optionflags=flags)
        runner.run(t, out=failures.append)
    assert not failures, "".join(failures)


# -- the stub of the compiled core ---------------------------------------------------------


def _parameters(fn):
    """Names of a stub function's parameters: (positional, keyword-only)."""
    a = fn.args
    return [p.arg for p in a.posonlyargs + a.args], [p.arg for p in a.kwonlyargs]


def _runtime_parameters(obj):
    params = inspect.signature(obj).parameters.values()
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return (
        [p.name for p in params if p.kind in positional],
        [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY],
    )


def _stub_entries():
    """(qualified name, stub function node) for every function and method in the stub."""
    tree = ast.parse((ROOT / "lazyframes" / "_core.pyi").read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef):
                    yield f"{node.name}.{fn.name}", fn


@pytest.mark.parametrize("module", ["lazyframes._core", "lazyframes._reference"])
def test_stub_matches_the_core(module):
    """Every function, class and method of ``_core.pyi`` exists with the same parameter names."""
    core = importlib.import_module(module)
    problems = []
    for name, fn in _stub_entries():
        if name == "_memcpy_gather" and module.endswith("_reference"):
            continue  # the bench floor is compiled only
        try:
            obj = functools.reduce(getattr, name.split("."), core)
        except AttributeError:
            problems.append(f"{name}: in the stub, not in {module}")
            continue
        is_property = any(getattr(d, "id", None) == "property" for d in fn.decorator_list)
        if is_property or name.rpartition(".")[2].startswith("__"):
            continue  # a property has no signature; a special method's is the protocol's
        stub, runtime = _parameters(fn), _runtime_parameters(obj)
        if stub != runtime:
            problems.append(f"{name}: stub {stub}, {module} {runtime}")
    assert not problems, "\n".join(problems)


# -- the pure cell ---------------------------------------------------------------------------


def test_suite_passes_without_the_extension():
    env = _cell_env("pure", LAZYFRAMES_NO_EXTENSIONS="1")
    probe = "import lazyframes; print(lazyframes.IMPLEMENTATION)"
    assert _run([sys.executable, "-c", probe], env=env).split() == ["reference"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
    out = _run([*cmd, "-m", "not guardrail and not fuzz"], env=env, timeout=1200)
    assert _passed(out) > MIN_PURE_TESTS, out


# -- the sanitizer cell ----------------------------------------------------------------------


def _runtime(name):
    """Absolute path of gcc's sanitizer runtime ``name`` (gcc prints the bare name if absent)."""
    if shutil.which("gcc") is None:
        pytest.fail("the sanitizer cell needs gcc (and its libasan, libubsan)")
    path = _run(["gcc", f"-print-file-name={name}"]).strip()
    if not os.path.isabs(path):
        pytest.fail(f"gcc has no {name}: install gcc's sanitizer runtimes (libasan, libubsan)")
    return path


def _sanitized_copy(dst):
    """Copy the sources to ``dst`` and build the extension there with ASan and UBSan."""
    skip = shutil.ignore_patterns(
        ".git", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", "*.so", "_core.c"
    )
    shutil.copytree(ROOT, dst, ignore=skip)
    flags = "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
    env = _cell_env("asan", CFLAGS=f"{flags} -g", LDFLAGS="-fsanitize=address,undefined")
    build = [sys.executable, "setup.py", "-q", "build_ext", "--inplace"]
    _run(build, cwd=dst, env=env, timeout=900)


def test_core_under_address_sanitizer(tmp_path):
    libasan = _runtime("libasan.so")
    dst = tmp_path / "lazyframes-asan"
    _sanitized_copy(dst)
    env = _cell_env(
        "asan",
        LD_PRELOAD=libasan,
        # CPython frees little at exit by design: the cell looks for memory errors, not leaks.
        # handle_segv=0: a segfault stays a signal, as the tests that provoke one expect
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:handle_segv=0",
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
    )
    probe = "import lazyframes._core as c; print(c.__file__)"
    where = _run([sys.executable, "-c", probe], cwd=dst, env=env).strip().splitlines()[-1]
    assert Path(where).is_relative_to(dst), f"the tests would import {where}, not the ASan build"
    assert b"__asan_init" in Path(where).read_bytes(), f"{where} is not instrumented"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not guardrail"]
    out = _run([*cmd, *SANITIZER_TESTS], cwd=dst, env=env, timeout=1500)
    assert not SANITIZER_REPORT.search(out), out
    assert _passed(out) > 0, out
