"""Shared helpers of the tests; the core under test is the compiled ``lazyframes._core``."""

import gc
import os
import pickle
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import settings

from lazyframes import _core as core

# The replay engine's modules are compiled from their .py sources (setup.py): pytest's
# doctest collection of those .py files then imports the compiled module, which it would
# otherwise refuse as another file than the one collected.
os.environ.setdefault("PY_IGNORE_IMPORTMISMATCH", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")

# Long property runs behind an environment variable; a small default keeps CI fast.
EXAMPLES = int(os.environ.get("LAZYFRAMES_HYPOTHESIS_EXAMPLES", "60"))
settings.register_profile("default", max_examples=EXAMPLES, deadline=None)
settings.load_profile("default")


def pytest_collection_finish(session):
    """Freeze collection's objects (torch, Ray, SB3): the per-test ``gc.collect()`` skips them."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _collect_garbage():
    """Collect after each test, so no test's cycles hold frames into the next."""
    yield
    gc.collect()


def f(v, shape=(84, 84, 1), dtype=np.uint8):
    """A frame of the given shape and dtype filled with the value v."""
    return np.full(shape, v, dtype)


def recorded(name):
    """Recorded Atari frames of tests/data, ``(n, 84, 84)`` uint8, and their episode starts."""
    with np.load(os.path.join(DATA, f"{name}.npz")) as d:
        return d["frames"], d["starts"]


def raised(exc, fn, *args, **kw):
    """The message of the ``exc`` that ``fn(*args, **kw)`` raises, or None if it returns."""
    try:
        fn(*args, **kw)
    except exc as e:  # not kept: its traceback would keep the call's arguments alive
        return str(e)
    return None


def refused(exc, pattern, fn, *args, **kw):
    """``fn(*args, **kw)`` raises ``exc`` with a message matching ``pattern``."""
    message = raised(exc, fn, *args, **kw)
    assert message is not None, f"{getattr(fn, '__name__', fn)} did not raise {exc.__name__}"
    assert re.search(pattern, message), f"{exc.__name__}: {message} (wanted /{pattern}/)"


def make_pool(shape=(84, 84, 1), dtype=np.uint8, *, chunk_bytes=1 << 20):
    """A fresh ``FramePool``."""
    return core.FramePool(shape, dtype, chunk_bytes=chunk_bytes)


def snapshot(pool, slots=()):
    """What a failed call must leave as it was: stats and refcounts (after collecting cycles)."""
    gc.collect()
    return pool.stats(), [pool.refcount(s) for s in slots]


def assert_same_samples(a, b, what=""):
    """Two ``Samples`` equal field by field, dtypes too (dict observations key by key)."""
    for name, x, y in zip(a._fields, a, b, strict=True):
        xs, ys = (x, y) if isinstance(x, dict) else ({"": x}, {"": y})
        assert xs.keys() == ys.keys(), f"{what} {name}"
        for key in xs:
            np.testing.assert_array_equal(xs[key], ys[key], f"{what} {name}[{key}]", strict=True)


def buffer_state(rb):
    """What a refused call must leave: the buffer's pickle (its checkpoint) and its pools' stats."""
    gc.collect()
    data = pickle.dumps(rb)
    pools = rb.pool.values() if isinstance(rb.pool, dict) else [rb.pool]
    return data, [p.stats() for p in pools if p is not None]


# -- the checkout's scripts (tests/scripts/) -------------------------------------------
def run(*args, cwd=None, timeout=300):
    """``python *args`` with this checkout importable, from the root (or ``cwd``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    kw = {"cwd": cwd or ROOT, "env": env, "capture_output": True, "text": True}
    return subprocess.run([sys.executable, *args], timeout=timeout, **kw)


def run_ok(script, *args, cwd):
    """Run ``script`` (a path) from ``cwd``; its stdout, after checking it exited with 0."""
    r = run(str(script), *args, cwd=cwd)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


#: Runs the script argv[2] as ``python <script>`` would (``sys.argv``, ``__main__``), with
#: the modules named in argv[1] made unimportable, and any env made (or Ray started)
#: ending the process with status 1: a check that passes where it should refuse, or that
#: comes after the work has begun, fails the test at once instead of running the script.
GUARDED = textwrap.dedent("""
    import os, runpy, sys
    import gymnasium

    def started(*args, **kwargs):
        sys.exit(f"{sys.argv[0]} started its work before refusing its options")

    for name in filter(None, sys.argv[1].split(",")):
        sys.modules[name] = None  # import fails, importlib.util.find_spec says None
    gymnasium.make = started
    if sys.argv[2].endswith("apex_ray.py") and sys.modules.get("ray", 0) is not None:
        import ray

        ray.init = started
    sys.argv = sys.argv[2:]
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))  # as python <script> sets it
    runpy.run_path(sys.argv[0], run_name="__main__")
""")


def run_guarded(script, *args, block=()):
    """``python <script> args`` from the root, guarded (see ``GUARDED``)."""
    return run("-c", GUARDED, ",".join(block), script, *args, timeout=120)


def assert_one_line_error(r, message):
    """``r`` exited with argparse's status 2 and one line ``<script>: error: ...message...``."""
    assert r.returncode == 2, r.stdout + r.stderr
    prog = os.path.basename(r.args[4] if r.args[1] == "-c" else r.args[1])
    assert r.stderr.startswith(f"{prog}: error: ") and message in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
