"""Shared fixtures: every core test runs against the compiled core and its NumPy twin."""

import gc
import os

import numpy as np
import pytest
from hypothesis import settings

from lazyframes import _backend

IMPLS = ["compiled", "reference"]

# Long property runs behind an environment variable; a small default keeps CI fast.
settings.register_profile("default", max_examples=int(os.environ.get("LAZYFRAMES_HYPOTHESIS_EXAMPLES", "60")), deadline=None)
settings.load_profile("default")


@pytest.fixture(params=IMPLS)
def impl(request):
    """The core module under test; also made the active backend for the Python layer."""
    prev = _backend.use(request.param)
    try:
        yield _backend.core()
    finally:
        gc.collect()
        _backend.use(prev)


def f(v, shape=(84, 84, 1), dtype=np.uint8):
    """CASES.md's f(v): a frame filled with v."""
    return np.full(shape, v, dtype)


def restate(frames, layout):
    """One observation restated with NumPy: baselines' concatenate / Gymnasium's stack."""
    if layout == "last":
        return np.concatenate(frames, axis=-1)
    if layout == "first":
        return np.concatenate(frames, axis=0)
    return np.stack(frames, axis=0)
