"""PrioritizedReplayBuffer beyond the values the model checks; a refused call changes nothing."""

import numpy as np
import pytest
from conftest import buffer_state, refused
from test_checkpoint import assert_refused, craft, entries, npy, with_meta

import lazyframes
from lazyframes import FramePool, PrioritizedReplayBuffer, ReplayBuffer

FS = (2, 3)


def filled(capacity=8, steps=6, **kw):
    """A buffer whose ``t``-th transition has action ``t`` and frames ``t``, ``t + 1``."""
    rb = PrioritizedReplayBuffer(capacity, pool=FramePool(FS, np.uint8), **{"seed": 0, **kw})
    for t in range(steps):
        add(rb, t)
    return rb


def add(rb, t, **kw):
    rb.add(np.full((4, *FS), t % 200, np.uint8), t, float(t), np.full((4, *FS), (t + 1) % 200,
           np.uint8), False, False, **kw)  # fmt: skip


def test_exported_and_alpha_checked():
    assert lazyframes.PrioritizedReplayBuffer is PrioritizedReplayBuffer
    rb = PrioritizedReplayBuffer(10, alpha=0.5)
    assert rb.alpha == 0.5 and rb.max_priority == 1.0
    assert repr(rb).startswith("PrioritizedReplayBuffer(") and "alpha=0.5" in repr(rb)
    bad = [(-0.1, ValueError), (np.nan, ValueError), ("0.5", TypeError), (False, TypeError)]
    for alpha, exc in bad:
        refused(exc, "alpha", PrioritizedReplayBuffer, 8, alpha=alpha)


@pytest.mark.parametrize(
    "call, exc, match",
    [
        *[(("update", [0, 1], [1.0, p]), ValueError, "positive and finite")
          for p in (-1.0, 0.0, np.nan, np.inf)],
        (("update", [0, 1], [1.0]), ValueError, "differ in size"),
        (("update", [0.0, 1.0], [1.0, 1.0]), TypeError, "integers"),
        (("update", [0, 1], ["a", "b"]), TypeError, "real numbers"),
        (("update", [0, 6], [1.0, 1.0]), ValueError, "never written"),
        (("update", [0, 2**63 - 1], [1.0, 1.0]), ValueError, "never written"),
        (("update", np.array([0, 2**64 - 1], np.uint64), [1.0, 1.0]), ValueError, "never written"),
        (("update", [0], [1e200]), ValueError, r"priority \*\* alpha"),  # overflows ** 2
        (("update", [0], [1e-200]), ValueError, r"priority \*\* alpha"),  # underflows to 0
        *[(("sample", 4, b), TypeError, "beta must be a real number") for b in ("0.5", True, None)],
        *[(("sample", 4, b), ValueError, "beta") for b in (-0.1, 1.5, float("nan"))],
        (("sample", 0, 0.4), ValueError, "batch_size"),
        (("priorities", [7]), ValueError, "never written"),
        (("priorities", [0.5]), TypeError, "integers"),
    ],
)  # fmt: skip
def test_a_refused_call_changes_nothing(call, exc, match):
    rb = filled(alpha=2.0)
    rb.update_priorities([1, 3], [0.5, 3.0])
    before = buffer_state(rb)
    name, *args = call
    fn = {"update": rb.update_priorities, "sample": lambda b, beta: rb.sample(b, beta=beta),
          "priorities": rb.priorities}[name]  # fmt: skip
    refused(exc, match, fn, *args)
    assert buffer_state(rb) == before


def test_priorities_take_any_shape_of_the_right_size():
    rb = filled()
    rb.update_priorities(np.array([[1], [2]]), np.array([[2.0], [3.0]]))
    assert rb.priorities(np.array([[1, 2]])).tolist() == [[2.0, 3.0]]
    assert rb.max_priority == 3.0  # (a new transition's priority: test_model's prioritized test)


def test_numbers_outlive_eviction_and_clear_as_stale():
    rb = filled(capacity=8, steps=20)  # wrapped twice: numbers 12..19 are stored
    batch = rb.sample(32)
    assert set(batch.indices.tolist()) <= set(range(12, 20))
    np.testing.assert_array_equal(batch.actions, batch.indices)  # the t-th add's action is t
    before = buffer_state(rb)
    for bad, msg in [(3, "evicted"), (11, "evicted"), (20, "never written"), (-1, "evicted")]:
        refused(ValueError, msg, rb.update_priorities, [12, bad], [1.0, 1.0])
        assert buffer_state(rb) == before
    rb.update_priorities([12, 19], [0.25, 2.0])  # still stored after the wrap
    assert rb.priorities([12, 19]).tolist() == [0.25, 2.0]
    rb.clear()
    refused(ValueError, "holds no transition", rb.update_priorities, [19], [1.0])
    add(rb, 0)  # numbers go on from the next multiple of the capacity
    assert rb.sample(1).indices.tolist() == [24] and rb.max_priority == 2.0


def test_no_sampleable_transition_yet():
    rb = filled(n_step=3, steps=1)
    before = buffer_state(rb)
    refused(ValueError, "still open", rb.sample, 4)
    assert buffer_state(rb) == before
    add(rb, 1)
    add(rb, 2)
    assert rb.sample(4).indices.tolist() == [0, 0, 0, 0]


def test_update_callback_that_moves_the_window():
    """An __array__ that adds or clears runs before the stored numbers are read."""
    rb = filled(capacity=4, steps=4)

    class Calls:
        def __init__(self, value, call):
            self.value, self.call = value, call

        def __array__(self, dtype=None, copy=None):
            self.call()
            return np.asarray(self.value)

    # number 0 is stored when the call starts; the add evicts it (number 4 takes its place)
    refused(ValueError, "evicted", rb.update_priorities, Calls([0], lambda: add(rb, 4)), [50.0])
    assert rb.priorities([4]).tolist() == [1.0] and rb.max_priority == 1.0
    with pytest.raises(ValueError, match="holds no transition"):
        rb.update_priorities([1, 2], Calls([5.0, 5.0], rb.clear))
    assert rb.max_priority == 1.0


def test_checkpoints_of_either_buffer_load_as_the_other(tmp_path):
    rb = filled(capacity=16, steps=30, alpha=0.8, n_step=2)
    rb.update_priorities(np.arange(14, 30), np.arange(16) + 0.5)
    rb.save(tmp_path / "per.npz")
    plain = ReplayBuffer.load(tmp_path / "per.npz")  # a plain buffer ignores the priorities
    assert len(plain) == len(rb) and type(plain) is ReplayBuffer
    plain.save(tmp_path / "plain.npz")
    per = PrioritizedReplayBuffer.load(tmp_path / "plain.npz")  # every priority 1
    assert per.max_priority == 1.0 and per.priorities(np.arange(14, 30)).tolist() == [1.0] * 16
    back = PrioritizedReplayBuffer.load(tmp_path / "per.npz")
    assert back.alpha == 0.8 and back.max_priority == 15.5
    assert back.priorities(np.arange(14, 30)).tolist() == list(np.arange(16) + 0.5)


@pytest.mark.parametrize("change, match", [
    ({"priorities": -1.0}, "bad priorities"),
    ({"priorities": 100.0}, "bad priorities"),  # above max_priority
    ({"added": 2**62 + 14}, "bad transition count"),  # beyond int64 once drawn
    ({"added": 15}, "bad transition count"),  # not at the write position
    ({"alpha": "0.8"}, "bad alpha"),  # a number as a JSON string
    ({"alpha": True}, "bad alpha"),
    ({"max_priority": 0.5}, "bad max_priority"),
])  # fmt: skip
def test_crafted_priorities_are_refused(tmp_path, change, match):
    rb = filled(capacity=16, steps=30, alpha=0.8)
    rb.save(tmp_path / "per.npz")
    members = entries(tmp_path / "per.npz")
    ((key, value),) = change.items()
    if key == "priorities":
        prio = np.load(tmp_path / "per.npz")["priorities"].copy()
        prio[3] = value
        members["priorities.npy"] = npy(prio)
    else:
        members = with_meta(members, lambda m: m["prioritized"].update(change))
    path = craft(tmp_path / "bad.npz", members)
    assert_refused(path, match, cls=PrioritizedReplayBuffer)
    ReplayBuffer.load(path)  # a plain buffer reads the rest


def test_dict_observations():
    """Image + vector observations: the sampled leaves are those of the drawn transitions."""
    pool = FramePool((6, 5), np.uint8)
    rb = PrioritizedReplayBuffer(32, n_step=2, seed=5, pool={"image": pool}, compress=True)
    frames = np.arange(60 * 30, dtype=np.uint8).reshape(60, 6, 5)
    for t in range(40):
        obs = {"image": frames[t : t + 4], "vec": np.full(3, t, np.float32)}
        nxt = {"image": frames[t + 1 : t + 5], "vec": np.full(3, t + 1, np.float32)}
        rb.add(obs, t, 0.0, nxt, t % 9 == 8, False)
    b = rb.sample(16, beta=0.5)
    t = b.indices  # transition numbers: the t of each add above
    np.testing.assert_array_equal(b.actions, t)
    np.testing.assert_array_equal(b.observations["vec"][:, 0], t)
    np.testing.assert_array_equal(b.observations["image"], frames[t[:, None] + np.arange(4)])
    m = np.where(t % 9 == 8, 1, 2)  # a window stops at its episode's end
    np.testing.assert_array_equal(b.next_observations["vec"][:, 0], t + m)
    rb.update_priorities(b.indices, np.arange(16) + 1.0)
    given = dict(zip(b.indices.tolist(), np.arange(16) + 1.0, strict=True))  # the last one wins
    assert rb.priorities(np.array(list(given))).tolist() == list(given.values())
