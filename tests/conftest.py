"""Shared fixtures: every core test runs against the compiled core and its NumPy twin.

The cores are injected explicitly: a test takes the ``impl`` fixture (the core module)
and builds its pools from it; nothing switches a process-global implementation. When
``lazyframes.IMPLEMENTATION == "reference"`` (``LAZYFRAMES_NO_EXTENSIONS=1``, or the
extension is not built) only the twin runs, and tests that compare the two cores skip.
"""

import gc
import importlib
import os

import numpy as np
import pytest
from hypothesis import settings

import lazyframes

#: Core module names by implementation name.
MODULES = {"compiled": "lazyframes._core", "reference": "lazyframes._reference"}
#: The implementations this run tests: both, or only the twin in the pure cell.
IMPLS = ["reference"] if lazyframes.IMPLEMENTATION == "reference" else ["compiled", "reference"]
#: Marks tests that compare the two cores (skipped when only the twin is in use).
needs_both = pytest.mark.skipif(len(IMPLS) < 2, reason="only the NumPy twin is in use")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Long property runs behind an environment variable; a small default keeps CI fast.
settings.register_profile(
    "default",
    max_examples=int(os.environ.get("LAZYFRAMES_HYPOTHESIS_EXAMPLES", "60")),
    deadline=None,
)
settings.load_profile("default")


def core(name):
    """The core module of implementation ``name`` ("compiled" or "reference")."""
    return importlib.import_module(MODULES[name])


@pytest.fixture(params=IMPLS)
def impl(request):
    """The core module under test (``lazyframes._core`` or ``lazyframes._reference``)."""
    yield core(request.param)
    gc.collect()


def f(v, shape=(84, 84, 1), dtype=np.uint8):
    """A frame of the given shape and dtype filled with the value v."""
    return np.full(shape, v, dtype)


def restate(frames, layout):
    """One observation restated with NumPy: baselines' concatenate / Gymnasium's stack."""
    if layout == "last":
        return np.concatenate(frames, axis=-1)
    if layout == "first":
        return np.concatenate(frames, axis=0)
    return np.stack(frames, axis=0)


def make_pool(impl, shape=(84, 84, 1), dtype=np.uint8, *, chunk_bytes=1 << 20):
    """A fresh ``FramePool`` of core ``impl``."""
    return impl.FramePool(shape, dtype, chunk_bytes=chunk_bytes)


def push_all(pool, frames):
    """Push every frame; the list of ``FrameRef`` owners, one per frame."""
    return [pool.push(fr) for fr in frames]


def snapshot(pool, slots=()):
    """Everything a failed call must leave as it was: stats and the given refcounts.

    Collects garbage first: a caught exception's traceback may keep a call's temporary
    owners alive in a reference cycle until then.
    """
    gc.collect()
    return pool.stats(), [pool.refcount(s) for s in slots]


def impl_name(impl):
    """The implementation name of a core module: "compiled" or "reference"."""
    return "compiled" if impl.__name__ == MODULES["compiled"] else "reference"
