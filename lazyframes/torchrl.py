"""A TorchRL storage that stores each frame once: ``ReplayBuffer(storage=FrameStorage(n))``.

:class:`FrameStorage` holds TensorDicts of transitions in TorchRL's layout (``"pixels"``,
``"action"``, ``("next", "pixels")``, ``("next", "reward")``, ``("next", "terminated")``,
...): the pixels are split into frames kept in a :class:`lazyframes.ReplayBuffer`,
de-duplicated against the stream's previous observation, so a step of 4-frame stacks
costs one new frame, not the 8 of ``LazyTensorStorage`` (``compress=True`` compresses
them too); the other entries are kept as given. TorchRL's writer, samplers,
``state_dict`` and ``dumps`` work as with its own storages.

>>> import torch
>>> from tensordict import TensorDict
>>> from torchrl.data import ReplayBuffer
>>> from lazyframes.torchrl import FrameStorage
>>> frames = torch.randint(0, 256, (11, 84, 84), dtype=torch.uint8)  # an episode's frames
>>> stacks = torch.stack([frames[t : t + 4] for t in range(8)])  # its 4-frame observations
>>> flags = torch.zeros(7, 1, dtype=torch.bool)
>>> steps = TensorDict(
...     pixels=stacks[:-1],
...     action=torch.zeros(7, dtype=torch.int64),
...     next=TensorDict(pixels=stacks[1:], reward=torch.ones(7, 1), done=flags, terminated=flags),
...     batch_size=[7],
... )
>>> rb = ReplayBuffer(storage=FrameStorage(100_000), batch_size=32)
>>> rb.extend(steps)
tensor([0, 1, 2, 3, 4, 5, 6])
>>> rb.sample()["next", "pixels"].shape
torch.Size([32, 4, 84, 84])
>>> rb.storage.memory()["unique_frames"]  # the episode's 11 frames, not 7 * 8 = 56
11
>>> rb2 = ReplayBuffer(storage=FrameStorage(100_000), batch_size=32)
>>> rb2.load_state_dict(rb.state_dict())
>>> bool((rb2.storage[:] == rb.storage[:]).all())
True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

try:
    import torch
    from tensordict import TensorDictBase
    from tensordict.utils import unravel_key
    from torchrl.data import LazyTensorStorage, TensorStorage
    from torchrl.data.replay_buffers.checkpointers import StorageCheckpointerBase
except ImportError as _e:  # pragma: no cover - only without TorchRL
    raise ImportError(
        f"lazyframes.torchrl is a TorchRL storage and needs TorchRL ({_e}): "
        "python -m pip install torchrl"
    ) from _e

from .replay import ReplayBuffer
from .replay._buffer import _from_bytes

__all__ = ["FrameStorage"]


class _Checkpointer(StorageCheckpointerBase):
    """``rb.dumps(path)``: the frames in lazyframes' checkpoint (streamed), the rest by torch."""

    def dumps(self, storage: FrameStorage, path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        frames = path / "frames.npz"
        if storage._rb is None:
            frames.unlink(missing_ok=True)
        else:
            storage._rb.save(frames)
        torch.save(storage._rest.state_dict(), path / "rest.pt")

    def loads(self, storage: FrameStorage, path) -> None:
        frames = Path(path) / "frames.npz"
        rb = ReplayBuffer.load(frames) if frames.exists() else None
        storage._restore(rb, torch.load(Path(path) / "rest.pt"))


class FrameStorage(TensorStorage):  # (TorchRL's ReplayBuffer takes its samples as they are)
    """A TorchRL storage of transitions whose pixels share frames.

    TorchRL's default ``RoundRobinWriter`` writes it in order: index ``i`` is position
    ``i`` of a :class:`lazyframes.ReplayBuffer` ring of ``max_size`` transitions (one
    stream, oldest evicted first), so any sampler drawing indices in ``[0, len)`` works.
    A batch is checked before the writer moves its cursor: a refused batch leaves the
    replay buffer as it was. Samples are CPU TensorDicts of the entries written.

    Args:
        max_size: maximum number of transitions.
        key: the observation stored as frames, with ``("next", *key)``: stacks of
            ``k`` frames on the first axis (``CatFrames(dim=-3)`` of grayscale), of any
            dtype (uint8 is 4x smaller than float32), or as ``layout`` says.
        layout: :class:`lazyframes.ReplayBuffer`'s: ``"stack"`` (default) ``(k, *S)``,
            ``"first"`` ``(k*C, H, W)`` (``CatFrames`` of RGB), ``"last"`` ``(H, W, k*C)``.
        stack_size: ``k``, needed with ``"first"`` and ``"last"``.
        compress: compress the stored frames (True, or lazyframes' options mapping).

    A batch holds ``key``, ``("next", *key)``, ``"action"`` (numbers or bools),
    ``("next", "reward")`` and bool ``("next", "terminated")`` (or ``"done"``), and
    ``("next", "truncated")`` may be given; the action, reward and flags are kept in
    lazyframes' buffer (:attr:`buffer`) too, the other entries in a ``LazyTensorStorage``.

    Raises:
        TypeError: data other than a TensorDict, a complex action, non-bool flags,
            indices other than integers.
        KeyError: a batch without an entry above.
        ValueError: batch dims other than one (``data.reshape(-1)``), entries, shapes or
            dtypes other than the first batch's, pixels and next pixels that differ, a
            non-finite action or reward, a reward beyond float32, frames lazyframes
            refuses (``layout``), indices other than the next positions (another writer,
            ``rb[i] = ...``), a state of another ``max_size``.
    """

    _default_checkpointer = _Checkpointer  # rb.dumps(path), rb.loads(path)
    supports_conditional_update = False

    def __init__(self, max_size: int, *, key: Any = "pixels", layout=None, stack_size=None,
                 compress=False):  # fmt: skip
        super().__init__(None, max_size)
        self.key, self.next_key = unravel_key(key), unravel_key(("next", key))
        self._options = {"layout": layout, "stack_size": stack_size, "compress": compress}
        ReplayBuffer(self.max_size, **self._options)  # checks the options
        self._rb: ReplayBuffer | None = None  # made by the first write, for its actions
        self._rest = LazyTensorStorage(self.max_size)  # the entries but the pixels
        self._spec: dict | None = None  # the first batch's, {key: (shape, dtype)}

    @property
    def buffer(self) -> ReplayBuffer | None:
        """The :class:`lazyframes.ReplayBuffer` of the transitions (None before a write)."""
        return self._rb

    def memory(self) -> dict:
        """Memory held by the frames: :meth:`lazyframes.ReplayBuffer.memory`."""
        return (self._rb if self._rb is not None else self._new(1, np.zeros(1))).memory()

    def __len__(self) -> int:
        return 0 if self._rb is None else len(self._rb)

    @property
    def shape(self) -> torch.Size:
        """``(len(self),)``, as a TensorStorage's."""
        return torch.Size([len(self)])

    def __repr__(self) -> str:
        return f"FrameStorage(max_size={self.max_size}, key={self.key!r}, buffer={self._rb!r})"

    def _new(self, capacity: int, action: np.ndarray) -> ReplayBuffer:
        """A lazyframes buffer of these options for actions like ``action`` (a batch)."""
        return ReplayBuffer(capacity, action_shape=action.shape[1:], action_dtype=action.dtype,
                            **self._options)  # fmt: skip

    def _fields(self, data) -> tuple:
        """``(batch, action, reward, terminated, truncated)`` of ``data``, checked."""
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"FrameStorage stores TensorDicts, got {type(data).__name__}")
        batch = data.unsqueeze(0) if data.batch_dims == 0 else data
        if batch.batch_dims != 1:
            raise ValueError(f"FrameStorage stores a flat batch of transitions, got batch_size "
                             f"{tuple(data.batch_size)}: extend with data.reshape(-1)")  # fmt: skip
        spec = _spec(batch)
        if bad := {k: dt for k, (_, dt) in spec.items() if dt in _UNSTORABLE}:
            raise TypeError(f"entries of dtypes TorchRL's storages cannot hold: {bad}")
        done = ("next", "terminated") if ("next", "terminated") in spec else ("next", "done")
        needed = (self.key, self.next_key, "action", ("next", "reward"), done)
        if missing := [k for k in needed if k not in spec]:
            raise KeyError(f"FrameStorage needs the entries {missing}")
        _same(spec, self._spec)
        if spec[self.key] != spec[self.next_key]:
            raise ValueError(f"{self.key} and {self.next_key} differ: {spec[self.key]}, "
                             f"{spec[self.next_key]}")  # fmt: skip
        B, action = batch.shape[0], batch.get("action")
        action = action.to(torch.uint8) if action.dtype == torch.bool else action  # one-hot
        for name, t in (("pixels", batch.get(self.key)), ("action", action)):
            if t.is_complex() or t.dtype == torch.bfloat16:
                raise TypeError(f"{name} must be real numbers of a NumPy dtype, got {t.dtype}")

        def one(key, default=None):  # a value per transition
            t = batch.get(key, default)
            if t.numel() != B:
                raise ValueError(f"{key} must hold one value per transition: {tuple(t.shape)}")
            return t.reshape(B)

        reward = one(("next", "reward"))
        if reward.dtype in (torch.bool, torch.bfloat16) or reward.is_complex():
            raise TypeError(f"('next', 'reward') must be real numbers of a NumPy dtype, got "
                            f"{reward.dtype}")  # fmt: skip
        flags = one(done), one(("next", "truncated"), torch.zeros(B, dtype=torch.bool))
        if any(f.dtype != torch.bool for f in flags):
            raise TypeError(f"{done} and ('next', 'truncated') must be bool")
        if action.is_floating_point() and not torch.isfinite(action).all():
            raise ValueError("an action is not finite")
        if not (torch.isfinite(reward) & (reward.abs() <= np.finfo(np.float32).max)).all():
            raise ValueError("a reward is not finite or beyond float32's range")
        arrays = tuple(_numpy(a) for a in (action, reward, *flags))
        if self._rb is None:  # what a first add refuses (the frames' geometry), on a scratch
            obs, nxt = (_numpy(batch.get(k)[:1]) for k in (self.key, self.next_key))
            _add(self._new(1, arrays[0]), obs, nxt, *(a[:1] for a in arrays))
        return batch, *arrays

    def _max_size_along_dim0(self, *, single_data=None, batched_data=None):
        # TorchRL's writers ask this before they move their cursor: checking the data
        # here refuses a bad batch with the replay buffer left as it was
        for data in (single_data, batched_data):
            if data is not None:
                self._fields(data)
        return self.max_size

    def set(self, cursor, data, *, set_cursor: bool = True) -> None:
        """Store the transitions ``data`` at ``cursor``, which must be the next positions."""
        batch, action, *values = self._fields(data)
        _same(_spec(batch, index=True), self._spec, index=True)  # the writer's "index" too
        B, M = batch.shape[0], self.max_size
        index = _positions(cursor, M).reshape(-1)
        start = 0 if self._rb is None else self._rb.position
        if not set_cursor or not torch.equal(index, (start + torch.arange(B)) % M):
            raise ValueError(
                f"FrameStorage is written in order, at its next position {start} (by "
                f"TorchRL's RoundRobinWriter, in step as a whole ReplayBuffer's state_dict "
                f"restores it), got indices {index.tolist()[:4]}... set_cursor={set_cursor}"
            )
        rb = self._new(M, action) if self._rb is None else self._rb
        obs, nxt = _numpy(batch.get(self.key)), _numpy(batch.get(self.next_key))
        _add(rb, obs, nxt, action, *values)  # checked: cannot refuse
        self._rb, self._spec = rb, self._spec or _spec(batch, index=True)
        self._set_last_cursor(cursor)
        rest = batch.exclude(self.key, self.next_key)
        self._rest.set(index[-M:], rest[-M:])  # (of more than max_size, the last stay)
        self._bump_mutation_revision()

    def get(self, index) -> TensorDictBase:
        """The transitions at ``index``: an int, a slice, ints (negatives count back)."""
        if self._rb is None or not len(self._rb):
            raise RuntimeError("Cannot get elements out of an empty FrameStorage")
        pos = _positions(index, len(self._rb))
        flat = pos.reshape(-1)
        out = self._rest.get(flat)
        dtype = torch.from_numpy(np.empty(0, self._rb.pool.dtype)).dtype
        obs = torch.empty((len(flat), *self._rb.observation_shape), dtype=dtype)
        nxt = torch.empty_like(obs)
        self._rb.gather(flat.numpy(), out=(obs.numpy(), nxt.numpy()))
        out.set(self.key, obs)
        out.set(self.next_key, nxt)
        return out.reshape(pos.shape)

    def state_dict(self) -> dict[str, Any]:
        """The frames as the bytes of a lazyframes checkpoint, the rest as TorchRL's."""
        frames = None
        if self._rb is not None:  # (the bytes its pickle holds)
            _, (_, data) = self._rb.__reduce__()
            frames = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return {"frames": frames, "rest": self._rest.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the frames checked as ``ReplayBuffer.load`` checks)."""
        frames = state_dict["frames"]
        rb = None if frames is None else _from_bytes(ReplayBuffer, frames.numpy().tobytes())
        self._restore(rb, state_dict["rest"])

    def _restore(self, rb: ReplayBuffer | None, rest_state: dict) -> None:
        rest = LazyTensorStorage(self.max_size)
        rest.load_state_dict(rest_state)
        capacity, n = (self.max_size, 0) if rb is None else (rb.capacity, len(rb))
        streams = 1 if rb is None else rb.num_envs
        if capacity != self.max_size or len(rest) != n or streams != 1:
            raise ValueError(f"not a state of a FrameStorage({self.max_size}): frames of {n} "
                             f"transitions in {capacity} ({streams} streams), {len(rest)} "
                             f"other entries")  # fmt: skip
        self._rb, self._rest, self._spec = rb, rest, None
        if n:  # the first batch's spec is the stored transitions'
            self._spec = _spec(self.get(torch.zeros(1, dtype=torch.long)), index=True)
        self._bump_mutation_revision()

    def _empty(self) -> None:
        if self._rb is not None:
            self._rb.clear()
        self._rest._empty()
        self._bump_mutation_revision()


# dtypes a LazyTensorStorage cannot write (torch has no index_put for them)
_UNSTORABLE = (torch.uint16, torch.uint32, torch.uint64)


def _spec(batch, index: bool = False) -> dict:
    """``{key: (shape, dtype)}`` of a batch's entries, batch axis left out.

    Without ``"index"`` unless ``index``: TensorDictReplayBuffer's writer sets it between
    its check and the write (and stores it, as in TorchRL's storages).
    """
    return {k: (v.shape[1:], v.dtype) for k, v in batch.items(True, True) if index or k != "index"}


def _same(spec: dict, first: dict | None, index: bool = False) -> None:
    """Refuse a batch whose ``spec`` is not the first batch's (``first``; None: none yet)."""
    if first is None:
        return
    if not index:
        first = {k: v for k, v in first.items() if k != "index"}
    if diff := {k for k in spec.keys() | first.keys() if spec.get(k) != first.get(k)}:
        raise ValueError(f"entries, shapes or dtypes other than the first batch's: {diff}")


def _positions(index, n: int) -> torch.Tensor:
    """``index`` (an int, a slice, ints) as positions in ``[0, n)``, negatives counted back."""
    if isinstance(index, tuple) and len(index) == 1:  # coordinates of one dim (SliceSampler)
        (index,) = index
    if isinstance(index, slice):
        return torch.arange(*index.indices(n))
    pos = torch.as_tensor(index).cpu()
    if pos.dtype.is_floating_point or pos.dtype.is_complex or pos.dtype == torch.bool:
        raise TypeError(f"FrameStorage indices are integers, got {pos.dtype}")
    return torch.where(pos < 0, pos + n, pos)


def _add(rb: ReplayBuffer, obs, nxt, action, reward, terminated, truncated) -> None:
    """Add these transitions to ``rb`` one at a time, in order (one stream)."""
    for i in range(len(obs)):
        rb.add(obs[i], action[i], reward[i], nxt[i], terminated[i], truncated[i])


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()
