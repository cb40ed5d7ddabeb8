"""lazyframes.torchrl.FrameStorage against TorchRL's own LazyTensorStorage: same transitions."""

import io

import numpy as np
import pytest
from conftest import refused

pytest.importorskip("torchrl")
import torch
from tensordict import TensorDict
from torchrl.data import (
    LazyTensorStorage,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorDictReplayBuffer,
)

from lazyframes.torchrl import FrameStorage

K, SHAPE = 4, (8, 8)


def transitions(n, seed=0, *, p_end=0.1, dtype=torch.uint8):
    """``n`` transitions in TorchRL's layout: 4-frame stacks of 8x8 frames, episodes ending.

    An episode that ends (terminated or truncated) restarts from a fresh stack, so the
    next observation of its last step is not the observation of the step after it. Besides
    the pixels: a vector observation, an int action, TorchRL's done flags (both levels),
    a collector's episode ids.
    """
    rng = np.random.default_rng(seed)
    stack = rng.integers(0, 256, (K, *SHAPE), np.uint8)
    obs, nxt, term, trunc, episodes = [], [], [], [], []
    for _ in range(n):
        episodes.append(sum(term) + sum(trunc))  # the episode's number
        new = np.concatenate([stack[1:], rng.integers(0, 256, (1, *SHAPE), np.uint8)])
        end = rng.random() < p_end
        te = bool(end and rng.random() < 0.5)
        obs.append(stack)
        nxt.append(new)
        term.append(te)
        trunc.append(end and not te)
        stack = rng.integers(0, 256, (K, *SHAPE), np.uint8) if end else new
    te, tr = torch.tensor(term).reshape(n, 1), torch.tensor(trunc).reshape(n, 1)
    return TensorDict(
        {
            "pixels": torch.from_numpy(np.stack(obs)).to(dtype),
            "observation": torch.from_numpy(rng.standard_normal((n, 3), np.float32)),
            "action": torch.from_numpy(rng.integers(0, 6, n)),
            "done": torch.zeros(n, 1, dtype=torch.bool),
            "collector": {"traj_ids": torch.tensor(episodes)},
            "next": {
                "pixels": torch.from_numpy(np.stack(nxt)).to(dtype),
                "observation": torch.from_numpy(rng.standard_normal((n, 3), np.float32)),
                "reward": torch.from_numpy(rng.standard_normal((n, 1), np.float32)),
                "done": te | tr,
                "terminated": te,
                "truncated": tr,
            },
        },
        batch_size=[n],
    )


def assert_same(a, b):
    """Two TensorDicts hold the same entries: keys, shapes, dtypes and values."""
    assert a.batch_size == b.batch_size
    keys = set(a.keys(True, True))
    assert keys == set(b.keys(True, True))
    for key in keys:
        x, y = a.get(key), b.get(key)
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert torch.equal(x, y), key


def pair(capacity, **kw):
    """A replay buffer on a FrameStorage (``kw``) and one on TorchRL's LazyTensorStorage."""
    ours = ReplayBuffer(storage=FrameStorage(capacity, **kw), batch_size=16)
    theirs = ReplayBuffer(storage=LazyTensorStorage(capacity), batch_size=16)
    return ours, theirs


def assert_buffers_same(ours, theirs, seed=0):
    """Same length, the same transitions at every index, the same seeded samples."""
    assert len(ours) == len(theirs)
    everything = torch.arange(len(theirs))
    assert_same(ours.storage.get(everything), theirs.storage.get(everything))
    for s in range(seed, seed + 3):
        torch.manual_seed(s)
        a = ours.sample()
        torch.manual_seed(s)
        assert_same(a, theirs.sample())


@pytest.mark.parametrize("compress", [False, True])
def test_same_transitions_as_lazy_tensor_storage(compress):
    ours, theirs = pair(50, compress=compress)
    data = transitions(171)
    start = 0
    for size in (7, 30, 1, 25, 49, 50, 8):  # wraps around capacity three times
        batch = data[start : start + size]
        assert torch.equal(ours.extend(batch), theirs.extend(batch))
        assert_buffers_same(ours, theirs, seed=start)
        start += size
    assert ours.add(data[start]) == theirs.add(data[start])  # one transition, no batch axis
    assert_buffers_same(ours, theirs)
    assert (ours.storage.memory()["compression"] is not None) == compress
    # the storage's own index forms: an int, a negative one, a slice, a 2-D tensor
    for index in (3, -1, slice(5, 40, 3), torch.tensor([[0, 49], [7, 7]])):
        assert_same(ours.storage[index], theirs.storage[index])


def test_tensordict_replay_buffer_and_its_index_entry():
    ours = TensorDictReplayBuffer(storage=FrameStorage(30), batch_size=16)
    theirs = TensorDictReplayBuffer(storage=LazyTensorStorage(30), batch_size=16)
    data = transitions(75, seed=9)
    for batch in data.split(20):  # its writer adds "index" to each batch it writes
        assert torch.equal(ours.extend(batch.clone()), theirs.extend(batch.clone()))
    ours.add(data[0].clone())
    theirs.add(data[0].clone())
    assert_buffers_same(ours, theirs)


def test_float_pixels_and_a_nested_key():
    data = transitions(40, dtype=torch.float32).rename_key_("pixels", ("obs", "px"))
    data.rename_key_(("next", "pixels"), ("next", "obs", "px"))
    ours, theirs = pair(30, key=("obs", "px"))
    for batch in data.split(9):
        ours.extend(batch)
        theirs.extend(batch)
    assert_buffers_same(ours, theirs)
    assert ours.storage.memory()["frame_bytes"] == 8 * 8 * 4


@pytest.mark.parametrize(
    "make_sampler",
    [
        pytest.param(lambda: SamplerWithoutReplacement(), id="without_replacement"),
        pytest.param(
            lambda: SliceSampler(num_slices=4, traj_key=("collector", "traj_ids")), id="slice"
        ),
    ],
)
def test_samplers_draw_the_same_transitions(make_sampler):
    def flat(index):  # SliceSampler's is a tuple of coordinates
        return torch.stack(index, -1) if isinstance(index, tuple) else index

    def make(storage):
        return ReplayBuffer(storage=storage, sampler=make_sampler(), batch_size=16)

    ours, theirs = make(FrameStorage(40)), make(LazyTensorStorage(40))
    data = transitions(100, seed=1)
    for s, batch in enumerate(data.split(23)):
        assert torch.equal(ours.extend(batch), theirs.extend(batch))
        torch.manual_seed(s)
        a, info = ours.sample(return_info=True)
        torch.manual_seed(s)
        b, info_b = theirs.sample(return_info=True)
        assert torch.equal(flat(info["index"]), flat(info_b["index"]))
        assert_same(a, b)


def test_more_transitions_than_capacity_in_one_extend():
    ours, _ = pair(10)
    data = transitions(25, seed=2)
    ours.extend(data[:3])
    index = ours.extend(data)
    assert index.tolist() == [(3 + i) % 10 for i in range(25)]
    assert len(ours) == 10
    assert_same(ours.storage.get(index[-10:]), data[-10:])
    assert_same(ours.storage[:], data[-10:][index[-10:].argsort()])


@pytest.mark.parametrize("compress", [False, True])
def test_state_dict_round_trip(compress):
    ours, theirs = pair(50, compress=compress)
    data = transitions(140, seed=3)
    ours.extend(data[:80])  # wrapped: the writer's cursor and the ring's are at 30
    theirs.extend(data[:80])
    saved = io.BytesIO()
    torch.save(ours.state_dict(), saved)  # torch.load's weights_only reads it back
    saved.seek(0)
    again = ReplayBuffer(storage=FrameStorage(50, compress=compress), batch_size=16)
    again.load_state_dict(torch.load(saved))
    assert_buffers_same(again, ours)
    assert again.storage.memory()["unique_frames"] == ours.storage.memory()["unique_frames"]
    for start in (80, 110):  # writing goes on where it stopped, in step with the writer
        batch = data[start : start + 30]
        assert torch.equal(again.extend(batch), theirs.extend(batch))
        ours.extend(batch)
    assert_buffers_same(again, theirs)
    assert_buffers_same(ours, theirs)
    again.empty()
    assert len(again) == 0 and again.extend(data[:5]).tolist() == [0, 1, 2, 3, 4]


def test_dumps_and_loads(tmp_path):
    ours, _ = pair(20, compress=True)
    ours.extend(transitions(33, seed=4))
    ours.dumps(tmp_path)
    again = ReplayBuffer(storage=FrameStorage(20, compress=True), batch_size=16)
    again.loads(tmp_path)
    assert_buffers_same(again, ours)
    empty = ReplayBuffer(storage=FrameStorage(20), batch_size=16)
    empty.dumps(tmp_path)  # an empty storage leaves no frames behind
    again.loads(tmp_path)
    assert len(again) == 0


def test_a_state_of_another_size_is_refused():
    ours, _ = pair(20)
    ours.extend(transitions(5))
    other = ReplayBuffer(storage=FrameStorage(30), batch_size=16)
    refused(ValueError, r"not a state of a FrameStorage\(30\)", other.load_state_dict,
            ours.state_dict())  # fmt: skip
    assert len(other) == 0


def bad_batches(good):
    """Batches that must be refused, each a variant of ``good``."""

    def variant(key, value):
        return good.clone().set(key, value)

    nan = good["next", "reward"].clone()
    nan[2] = float("nan")
    yield TypeError, "stores TensorDicts", good["pixels"]
    yield ValueError, r"flat batch.*reshape\(-1\)", good.reshape(2, 3)
    yield KeyError, r"\('next', 'pixels'\)", good.exclude(("next", "pixels"))
    yield KeyError, "action", good.exclude("action")
    yield ValueError, "first batch.*'pixels'", variant("pixels", good["pixels"].float())
    cut = good["next", "pixels"][:, :3]
    yield ValueError, r"first batch.*\('next', 'pixels'\)", variant(("next", "pixels"), cut)
    yield ValueError, "first batch.*'extra'", variant("extra", torch.zeros(6))
    yield ValueError, "reward is not finite", variant(("next", "reward"), nan)


def test_bad_batches_are_refused_before_anything_is_written():
    ours, theirs = pair(10)
    data = transitions(20, seed=5)
    ours.extend(data[:8])
    theirs.extend(data[:8])
    for exc, pattern, bad in bad_batches(data[8:14]):
        refused(exc, pattern, ours.extend, bad)
        assert len(ours) == 8
    # the writer did not move: the next good batch goes where it would have
    assert torch.equal(ours.extend(data[8:14]), theirs.extend(data[8:14]))
    assert_buffers_same(ours, theirs)


def test_a_bad_first_batch_is_refused_before_anything_is_written():
    data = transitions(6, seed=8)
    data["action"] = torch.rand(6, 2)  # continuous actions
    data["next", "reward"] = data["next", "reward"].double()

    def variant(key, value):
        return data.clone().set(key, value)

    inf = data["action"].clone()
    inf[3, 1] = float("inf")
    big = data["next", "reward"].clone()
    big[0] = 1e300
    rb = ReplayBuffer(storage=FrameStorage(10), batch_size=4)
    for exc, pattern, bad in [
        (ValueError, "action is not finite", variant("action", inf)),
        (ValueError, "float32", variant(("next", "reward"), big)),
        (TypeError, "must be bool", variant(("next", "terminated"), data["next", "done"].long())),
        (TypeError, "cannot hold.*uint32", variant("ids", torch.zeros(6, dtype=torch.uint32))),
        (
            TypeError,
            "reward.*real",
            variant(("next", "reward"), torch.ones(6, 1, dtype=torch.bool)),
        ),
        (TypeError, "action.*bfloat16", variant("action", data["action"].bfloat16())),
    ]:
        refused(exc, pattern, rb.extend, bad)
        assert len(rb) == 0 and rb.storage.buffer is None
    assert rb.extend(data).tolist() == list(range(6))
    assert_same(rb.storage[:], data)


def test_frames_lazyframes_refuses_are_refused_before_anything_is_written():
    rb = ReplayBuffer(storage=FrameStorage(10, layout="first", stack_size=3), batch_size=4)
    data = transitions(6, seed=8)
    refused(ValueError, "cannot hold 3 frames", rb.extend, data)  # 4 channels in 3 frames
    assert len(rb) == 0 and rb.storage.buffer is None
    for key in ("pixels", ("next", "pixels")):  # 6 channels: 3 frames of 2
        data[key] = torch.cat([data[key], data[key][:, :2]], dim=1)
    assert rb.extend(data).tolist() == list(range(6))  # the writer did not move
    assert_same(rb.storage[:], data)
    assert rb.storage.memory()["frame_bytes"] == 2 * 8 * 8


def test_writes_out_of_order_are_refused():
    ours, _ = pair(10)
    data = transitions(6, seed=6)
    ours.extend(data[:3])
    refused(ValueError, "written in order", ours.storage.set, torch.tensor([5, 6]), data[3:5])
    refused(ValueError, "set_cursor=False", ours.storage.__setitem__, 0, data[3])
    refused(IndexError, "out of", ours.storage.get, torch.tensor([3]))
    refused(TypeError, "integers", ours.storage.get, torch.tensor([0.0]))
    assert len(ours) == 3
    assert_same(ours.storage[:], data[:3])


def test_a_4_stack_costs_about_one_frame_per_step():
    n = 300
    data = transitions(n, seed=7, p_end=0.0)  # one episode: every step brings one new frame
    ours, theirs = pair(1000)
    ours.extend(data)
    theirs.extend(data)
    m = ours.storage.memory()
    frame = np.prod(SHAPE)
    assert m["frame_bytes"] == frame
    assert m["unique_frames"] == n + K
    assert m["bytes_held"] <= 1.05 * (n + K) * frame
    pixels = theirs.storage[:].select("pixels", ("next", "pixels"))
    assert pixels.bytes() == 2 * K * n * frame  # TorchRL's storage: 8 frames per step
