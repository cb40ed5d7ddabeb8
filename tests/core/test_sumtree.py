"""The core's SumTree: API, update, no drift (its draws and weights against the oracle: fuzzer)."""

import math

import numpy as np
from conftest import refused

from lazyframes import _core as core


def test_sumtree_api():
    t = core.SumTree(5)
    assert t.capacity == 5 and t.total() == 0.0 and t.min() == math.inf
    t.set([0, 2, 4, 2], [1.0, 9.0, 4.0, 3.0])  # a repeated index keeps its last value
    assert t.get([0, 1, 2, 3, 4]).tolist() == [1.0, 0.0, 3.0, 0.0, 4.0]
    assert t.total() == 8.0 and t.min() == 1.0
    assert t.sample([0.5] * 8).tolist() == [0, 2, 2, 2, 4, 4, 4, 4]  # one per segment
    idx, w = t.sample_weighted([0.5, 0.5], 0.5)
    assert idx.tolist() == [2, 4] and w.dtype == np.float32
    np.testing.assert_allclose(w, [3**-0.5, 4**-0.5], rtol=1e-7)
    assert t.sample_weighted([0.5], None)[1] is None
    before = t.get(np.arange(5)).tolist()
    for bad_i, bad_v, exc, msg in [
        ([5], [1.0], ValueError, "out of range"), ([-1], [1.0], ValueError, "out of range"),
        ([1], [-1.0], ValueError, ">= 0"), ([1], [np.nan], ValueError, ">= 0"),
        ([1], [np.inf], ValueError, ">= 0"), ([1, 2], [1.0], ValueError, "differ in size"),
        ([1.0], [1.0], TypeError, "integers"), ([1], ["a"], TypeError, "real numbers"),
    ]:  # fmt: skip
        refused(exc, msg, t.set, bad_i, bad_v)
    assert t.get(np.arange(5)).tolist() == before and t.total() == 8.0
    for exc, match, call in [  # (an uninitialised tree: test_misuse)
        (ValueError, r"\[0, 1\)", lambda: t.sample([1.0])),
        (IndexError, "", lambda: t.get([5])),
        (ValueError, "empty", lambda: (t.clear(), t.sample([0.5]))),
        (ValueError, "float64 max", lambda: (t.set([0, 1], [1e308] * 2), t.sample([0.5]))),  # sum
        (RuntimeError, "", lambda: t.__init__(3)),
        (TypeError, "pickled", t.__reduce__),
        (ValueError, ">= 0", lambda: core.SumTree(-1)),
        (MemoryError, "no memory", lambda: core.SumTree(2**62)),
    ]:
        refused(exc, match, call)


def test_update_sets_the_non_empty_leaves_to_values_powered():
    t = core.SumTree(4)
    t.set([0, 1, 3], [1.0, 1.0, 1.0])  # leaf 2 is empty: an update leaves it so
    assert t.update([1, 2, 3, 1], [4.0, 9.0, 0.25, 16.0], 0.5) == 16.0  # the largest value
    assert t.get(np.arange(4)).tolist() == [1.0, 4.0, 0.0, 0.5]  # a repeated index: its last
    assert t.update(np.zeros(0, np.int64), [], 2.0) == 0.0 and t.update([0], [3.0]) == 3.0
    before = t.get(np.arange(4)).tolist()
    for idx, values, exponent, exc, match in [
        ([0, 4], [1.0, 1.0], 1.0, ValueError, "out of range|indices"),
        ([0, 1], [1.0, 0.0], 1.0, ValueError, r"priorities\[1\]"),
        ([0, 1], [1.0, -1.0], 1.0, ValueError, r"priorities\[1\]"),
        ([0, 1], [1.0, np.nan], 1.0, ValueError, r"priorities\[1\]"),
        ([0, 1], [1.0, 1e200], 2.0, ValueError, r"priorities\[1\]"),  # ** exponent overflows
        ([0, 1], [1.0, 1e-200], 2.0, ValueError, r"priorities\[1\]"),  # or underflows to 0
        ([0, 1], [1.0], 1.0, ValueError, "differ in size"),
        ([0.0], [1.0], 1.0, TypeError, "integers"),
        ([0], ["a"], 1.0, TypeError, "real numbers"),
    ]:
        refused(exc, match, t.update, idx, values, exponent)
        assert t.get(np.arange(4)).tolist() == before, (idx, values)


def test_update_where_checks_every_value_and_writes_those_marked():
    t = core.SumTree(4)
    t.set([0, 1, 2, 3], [1.0, 1.0, 1.0, 1.0])
    assert t.update([0, 1, 2], [4.0, 9.0, 16.0], 0.5, np.array([True, False, True])) == 16.0
    assert t.get(np.arange(4)).tolist() == [2.0, 1.0, 4.0, 1.0]
    assert t.update([1, 3], [25.0, 36.0], 1.0, [False, False]) == 0.0  # nothing written
    before = t.get(np.arange(4)).tolist()
    for where, values, exc, match in [
        ([True, False], [1.0, np.nan], ValueError, r"priorities\[1\]"),  # unwritten: checked
        ([False, True], [-1.0, 1.0], ValueError, r"priorities\[0\]"),
        ([True], [1.0, 1.0], ValueError, "where differ in size"),
        ([1, 0], [1.0, 1.0], TypeError, "bools"),
    ]:
        refused(exc, match, t.update, [0, 1], values, 1.0, where)
        assert t.get(np.arange(4)).tolist() == before, (where, values)


def test_sumtree_no_drift():
    """The drift guard: after many updates the tree equals one built from its leaves."""
    rng = np.random.default_rng(7)
    n = 300
    t = core.SumTree(n)
    for i in range(400):
        idx = rng.integers(0, n, rng.integers(1, 40))
        values = 10.0 ** rng.uniform(-6, 6, idx.size)
        if i % 2:
            t.set(idx, values * (rng.random(idx.size) > 0.1))
        else:
            t.update(idx, values, 0.7)
    leaves = t.get(np.arange(n))
    fresh = core.SumTree(n)
    fresh.set(np.arange(n), leaves)
    assert t.total() == fresh.total() and t.min() == fresh.min()
    assert abs(t.total() - math.fsum(leaves)) <= 16 * np.finfo(float).eps * math.fsum(leaves)
    u = rng.random(500)
    assert t.sample(u).tolist() == fresh.sample(u).tolist()
