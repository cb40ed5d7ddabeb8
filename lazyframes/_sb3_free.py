"""What ``lazyframes.sb3``'s buffers take from Stable-Baselines3, for a process without it.

CleanRL dropped SB3 in 2025, yet its scripts call SB3's buffer API. Without SB3,
``lazyframes.sb3.ReplayBuffer`` builds on these restatements of SB3's definitions (SB3
2.x's ``BaseBuffer.sample``/``size``/``reset``, ``ReplayBuffer._maybe_cast_dtype``, the
``preprocessing`` helpers, ``get_device`` and ``ReplayBufferSamples``): the same draws from
NumPy's global generator, the same shapes and fields. With SB3 installed the module uses
SB3's own, so ``isinstance`` checks (``load_replay_buffer``) hold; pickles are the same
either way.
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import numpy as np
import torch as th
from gymnasium import spaces


class ReplayBufferSamples(NamedTuple):
    """SB3's ``ReplayBufferSamples``: torch tensors, ``(B, 1)`` for the scalar fields."""

    observations: th.Tensor
    actions: th.Tensor
    next_observations: th.Tensor
    dones: th.Tensor
    rewards: th.Tensor
    discounts: th.Tensor | None = None


def get_obs_shape(observation_space: spaces.Space) -> tuple:
    """SB3's ``get_obs_shape`` for the spaces a buffer of images meets."""
    space = observation_space
    if isinstance(space, (spaces.Box, spaces.MultiBinary)):
        return tuple(space.shape)
    if isinstance(space, spaces.Discrete):
        return (1,)
    if isinstance(space, spaces.MultiDiscrete):
        return (len(space.nvec),)
    raise NotImplementedError(f"{space} observation space is not supported")


def get_action_dim(action_space: spaces.Space) -> int:
    """SB3's ``get_action_dim``."""
    space = action_space
    if isinstance(space, spaces.Box):
        return int(np.prod(space.shape))
    if isinstance(space, spaces.Discrete):
        return 1
    if isinstance(space, spaces.MultiDiscrete):
        return len(space.nvec)
    if isinstance(space, spaces.MultiBinary) and isinstance(space.n, int):
        return int(space.n)
    raise NotImplementedError(f"{space} action space is not supported")


def get_device(device: Any = "auto") -> th.device:
    """SB3's ``get_device``: "auto" is CUDA when available; CUDA asked for but absent, CPU."""
    dev = th.device("cuda" if device == "auto" else device)
    if dev.type == "cuda" and not th.cuda.is_available():
        return th.device("cpu")
    return dev


def is_image_space_channels_first(observation_space: spaces.Box) -> bool:
    """SB3's guess: channels first when the first axis is the smallest."""
    smallest = int(np.argmin(observation_space.shape))
    if smallest == 1:
        warnings.warn(
            "Treating image space as channels-last, while second dimension was smallest of the "
            "three.",
            stacklevel=2,
        )
    return smallest == 0


class BufferBase:
    """SB3's ``ReplayBuffer`` methods the drop-in does not define itself."""

    buffer_size: int
    pos: int
    full: bool

    def size(self) -> int:
        return self.buffer_size if self.full else self.pos

    def reset(self) -> None:
        self.pos = 0
        self.full = False

    def sample(self, batch_size: int, env=None):
        """``batch_size`` rows drawn by NumPy's global generator, as SB3 draws them."""
        if env is not None:
            raise ValueError("sample(env=...) normalises with SB3's VecNormalize: needs SB3")
        upper_bound = self.buffer_size if self.full else self.pos
        batch_inds = np.random.randint(0, upper_bound, size=batch_size)  # noqa: NPY002
        return self._get_samples(batch_inds, env=env)  # type: ignore[attr-defined]

    @staticmethod
    def _maybe_cast_dtype(dtype):
        return np.float32 if dtype == np.float64 else dtype
