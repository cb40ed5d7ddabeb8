"""CleanRL drop-ins: its buffers, each frame stored once, with torch alone.

CleanRL's single-file agents build their replay buffers in two ways, and each has its
one-line switch (docs/SB3.md, "CleanRL"):

- ``dqn_atari.py`` and its kin import SB3's buffer API (``from cleanrl_utils.buffers
  import ReplayBuffer``): import :class:`ReplayBuffer` from here instead. It is
  :class:`lazyframes.sb3.ReplayBuffer`, which needs PyTorch and not Stable-Baselines3;
  CleanRL's ``optimize_memory_usage=True`` stores the frames compressed.
- ``rainbow_atari.py`` defines its own prioritized n-step ``PrioritizedReplayBuffer``
  (two ``(capacity, 4, 84, 84)`` arrays: 56 GB at its 1M default). Add
  ``from lazyframes.cleanrl import PrioritizedReplayBuffer`` after that class (or in
  place of it): the same constructor, ``add``, ``sample``, ``update_priorities`` and
  ``beta``, on :class:`lazyframes.PrioritizedReplayBuffer`.
"""

from __future__ import annotations

import operator
from typing import Any, NamedTuple

import numpy as np

from . import replay as _replay
from .sb3 import ReplayBuffer, th

__all__ = ["PrioritizedBatch", "PrioritizedReplayBuffer", "ReplayBuffer"]


class PrioritizedBatch(NamedTuple):
    """CleanRL's ``PrioritizedBatch``: torch tensors, ``(B, 1)`` for the scalar fields.

    ``discounts`` (``gamma ** m`` of each window's ``m`` steps) is added at the end: it is
    ``gamma ** n_step`` unless a window ended early by a truncation given to ``add``.
    """

    observations: Any
    actions: Any
    rewards: Any
    next_observations: Any
    dones: Any
    indices: np.ndarray
    weights: Any
    discounts: Any


class PrioritizedReplayBuffer:
    """CleanRL's ``rainbow_atari.py`` buffer: prioritized n-step replay of frame stacks.

    The constructor, ``add``, ``sample``, ``update_priorities`` and the ``beta`` attribute
    (annealed by the training loop) are CleanRL's, and so are the values: a transition's
    priority is ``(|td| + eps) ** alpha``, a new one gets the largest so far, draws are
    stratified over ``batch_size`` segments, and weights are ``(N P(i)) ** -beta``
    divided by the batch's largest. Each frame is stored once (the stacks of consecutive
    steps share ``k - 1`` frames), compressed unless ``compress=False``: about 0.2 KB per
    Atari transition instead of 56 KB.

    Two things differ, both fixes of CleanRL's buffer: the last ``n_step - 1``
    transitions of an episode are stored too (with their shorter windows, ``done``
    set), where CleanRL drops them; and ``add`` takes an optional ``truncated``, which
    ends a window at a time limit (CleanRL's loop does not report truncations, so its
    windows run into the next episode, and so do ours unless it is given). ``indices``
    are the buffer's transition numbers, not ring positions: give them back to
    :meth:`update_priorities` as they are.

    Args:
        capacity: the most transitions held; the oldest are evicted first.
        obs_shape: one observation's shape, ``(k, H, W)`` (CleanRL's ``FrameStack``).
        device: torch device of the sampled tensors.
        n_step: steps of the return, ``>= 1``.
        gamma: discount, in ``[0, 1]``.
        alpha: priority exponent, ``>= 0``.
        beta: importance-sampling exponent, read by every :meth:`sample`.
        eps: added to ``|td|`` by :meth:`update_priorities`: finite, ``> 0`` (a priority
            of 0 could never be drawn again).
        compress: as :class:`lazyframes.ReplayBuffer`'s (default True).
        seed: seed of the draws (default: fresh entropy).

    Raises:
        ValueError: ``obs_shape`` not 3 sizes >= 1, ``eps`` not finite and positive; as
            :class:`lazyframes.PrioritizedReplayBuffer`.
        TypeError: a size of ``obs_shape`` not an integer.

    Example:
        >>> import numpy as np
        >>> from lazyframes.cleanrl import PrioritizedReplayBuffer
        >>> rb = PrioritizedReplayBuffer(1000, (4, 84, 84), "cpu", 3, 0.99, seed=0)
        >>> obs = np.zeros((1, 4, 84, 84), np.uint8)
        >>> for t in range(8):
        ...     rb.add(obs, np.array([1]), np.array([1.0]), obs, np.array([t == 7]))
        >>> batch = rb.sample(4)
        >>> [round(r, 4) for r in batch.rewards[:, 0].tolist()], batch.dones[:, 0].tolist()
        ([2.9701, 2.9701, 2.9701, 1.99], [False, False, False, True])
        >>> rb.update_priorities(batch.indices, np.array([0.5, 0.5, 2.0, 0.1]))
    """

    def __init__(self, capacity, obs_shape, device, n_step, gamma, alpha=0.6, beta=0.4,
                 eps=1e-6, *, compress=True, seed=None):  # fmt: skip
        obs_shape = tuple(operator.index(d) for d in obs_shape)
        if len(obs_shape) != 3 or min(obs_shape) < 1:
            raise ValueError(f"obs_shape must be a stack (k, H, W) of sizes >= 1, got {obs_shape}")
        eps = float(eps)
        if not 0.0 < eps < float("inf"):  # (|td| + eps is a priority: positive and finite)
            raise ValueError(f"eps must be a finite number > 0, got {eps!r}")
        self._rb = _replay.PrioritizedReplayBuffer(
            capacity, alpha=alpha, n_step=n_step, gamma=gamma, seed=seed, layout="stack",
            stack_size=obs_shape[0], action_dtype=np.int64, compress=compress,
        )  # fmt: skip
        self.obs_shape = obs_shape
        self.device = th.device(device)
        self.beta = beta
        self.eps = eps

    capacity = property(lambda self: self._rb.capacity, doc="The most transitions held.")
    n_step = property(lambda self: self._rb.n_step, doc="Steps of the return.")
    gamma = property(lambda self: self._rb.gamma, doc="The discount.")
    alpha = property(lambda self: self._rb.alpha, doc="The priority exponent.")

    @property
    def size(self) -> int:
        """Transitions held."""
        return len(self._rb)

    @property
    def max_priority(self) -> float:
        """The largest ``|td| + eps`` given so far (1.0 before any)."""
        return self._rb.max_priority

    def memory(self) -> dict:
        """Memory held: :meth:`lazyframes.ReplayBuffer.memory`."""
        return self._rb.memory()

    def add(self, obs, action, reward, next_obs, done, truncated=False) -> None:
        """Store one transition (CleanRL's arguments, with its env axis of 1 or without).

        Args:
            obs: ``(1, *obs_shape)`` or ``obs_shape`` uint8.
            action: an int (``(1,)``).
            reward: a number (``(1,)``).
            next_obs: as ``obs``: the episode's final observation when it ended.
            done: terminated (``(1,)``): the window ends without bootstrapping.
            truncated: optional, a time limit (``(1,)``): the window ends, bootstrapped.

        Raises:
            ValueError: an observation of another shape than ``obs_shape``; as
                :meth:`lazyframes.ReplayBuffer.add`.
            TypeError: an observation not uint8, a flag that is None; as
                :meth:`lazyframes.ReplayBuffer.add`.
            Nothing is stored then.
        """
        for name, o in (("obs", obs), ("next_obs", next_obs)):
            a = np.asarray(o)
            if a.shape not in (self.obs_shape, (1, *self.obs_shape)):
                raise ValueError(f"{name} must be of shape {self.obs_shape} or "
                                 f"{(1, *self.obs_shape)}, got {a.shape}")  # fmt: skip
            if a.dtype != np.uint8:
                raise TypeError(f"{name} must be uint8 frames, got {a.dtype}")
        if done is None or truncated is None:
            raise TypeError("done and truncated must be bools (or arrays of one), not None")
        self._rb.add(obs, action, reward, next_obs, done, truncated)

    def sample(self, batch_size: int) -> PrioritizedBatch:
        """A batch drawn by priority, with weights normalised by the batch's largest."""
        B = operator.index(batch_size)
        if B < 1:
            raise ValueError(f"batch_size must be at least 1, got {B}")
        shape = (B, *self.obs_shape)
        obs, next_obs = th.empty(shape, dtype=th.uint8), th.empty(shape, dtype=th.uint8)
        s = self._rb.sample(B, beta=self.beta, out=(obs.numpy(), next_obs.numpy()))
        weights = s.weights / s.weights.max()

        def column(a, dtype=None):
            return th.from_numpy(np.asarray(a, dtype).reshape(-1, 1)).to(self.device)

        return PrioritizedBatch(
            observations=obs.to(self.device),
            actions=column(s.actions),
            rewards=column(s.rewards),
            next_observations=next_obs.to(self.device),
            dones=column(s.dones > 0),
            indices=s.indices,
            weights=column(weights),
            discounts=column(s.discounts),
        )

    def update_priorities(self, indices, priorities) -> None:
        """Set the priorities of sampled transitions to ``|priorities| + eps``.

        Transitions evicted since they were sampled are skipped.
        """
        p = np.abs(np.asarray(priorities, dtype=np.float64)).reshape(-1) + self.eps
        self._rb.update_priorities(indices, p, skip_evicted=True)
