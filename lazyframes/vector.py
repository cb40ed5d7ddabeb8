"""A frame stacker for Gymnasium vector environments: ``FrameStackObservation`` and ``LazyBatch``.

One :class:`~lazyframes.FramePool` for all sub-environments; the rings of the last k
frames are one :class:`LazyBatch` (``num_envs`` rows of k frames), which is also the
observation returned. Each step is one ``LazyBatch.shift`` call (push the batch of new
frames, shift every ring, restart the rings of new episodes); ``np.asarray`` materialises
the batch as ``(num_envs, *observation_shape)`` in one copy.

Episode boundaries follow the vector env's autoreset mode
(``envs.metadata["autoreset_mode"]``, Gymnasium's ``AutoresetMode``), so an observation
never mixes frames of two episodes (case C14 of docs/CASES.md).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper
from gymnasium.vector.utils import batch_space

from . import _common as C
from .wrappers import _box_of, as_frames, check_padding, check_stack_size, pool_for, stacked_space

__all__ = ["FrameStackObservation", "LazyBatch"]


class _LazyBatchType(type):
    """``isinstance(x, LazyBatch)`` is true for the LazyBatch of either core."""

    def __instancecheck__(cls, obj):
        return C.is_lazybatch(obj)


class LazyBatch(metaclass=_LazyBatchType):
    """A batch of observations, one per sub-environment, holding references to frames of one pool.

    The type of the vector stacker's observations. The class lives in the core
    (``FramePool.lazy_batch``); this name constructs one and answers ``isinstance`` for
    both cores. ``LazyBatch(pool, slots, layout="stack")`` takes a reference on each of
    the ``(num_envs, k)`` slots (ints or FrameRefs of ``pool``), so the batch stays valid
    however far the envs move on; no frame bytes are copied until it is materialised.

    ``len(batch)`` is ``num_envs``; ``batch[i]`` is env i's observation as a
    :class:`~lazyframes.LazyFrames` (no frame copied); ``batch[a:b]`` is a LazyBatch.
    ``np.asarray(batch)`` (shape ``(num_envs, *observation_shape)``), ``batch.numpy(out=None,
    *, dtype=None, scale=None)`` and DLPack (``torch.as_tensor(batch)``, ``np.from_dlpack``)
    each copy the batch out once, in one C call. (``torch.tensor(batch)`` walks the
    sequence protocol instead, ~100x slower: use ``torch.as_tensor``.) Batches are
    immutable: ``batch.shift(frames, restart, pad=...)`` and ``batch.replace(rows, other)``
    return new ones (the stacker's step and partial reset). Also ``shape``,
    ``dtype``, ``ndim``, ``nbytes``, ``slots`` (an int64 copy), ``pool``, ``layout``,
    ``stack_size``.

    Raises:
        IndexError, ValueError: slot ids out of range or free, a bad shape or layout.

    Example:
        >>> import lazyframes
        >>> pool = lazyframes.FramePool((84, 84), np.uint8)
        >>> obs = pool.push_batch(np.zeros((8, 84, 84), np.uint8), k=4)  # 8 envs' resets
        >>> isinstance(obs, LazyBatch)
        True
        >>> obs.numpy(dtype=np.float32, scale=1 / 255).shape  # floats in [0, 1]
        (8, 4, 84, 84)
    """

    def __new__(cls, pool, slots, *, layout: str = "stack"):
        """``pool.lazy_batch(slots, layout=layout)``."""
        return pool.lazy_batch(slots, layout=layout)


class FrameStackObservation(VectorWrapper):
    """Stacks the last ``stack_size`` frames of each sub-environment of a Gymnasium VectorEnv.

    The vector counterpart of :class:`lazyframes.wrappers.FrameStackObservation` (itself a
    drop-in for Gymnasium's single-env wrapper; Gymnasium has no vector version), and a
    replacement for SB3's ``VecFrameStack``. Observations equal stacking each
    sub-environment alone: an episode's observations hold only its own frames, padded at
    its start as ``padding_type`` says, whatever the autoreset mode:

    - ``AutoresetMode.NEXT_STEP`` (Gymnasium's default): the step after an episode ends
      returns the reset frame; the stacker starts that env's ring from it.
    - ``AutoresetMode.SAME_STEP``: the step that ends an episode returns the reset frame;
      ``info["final_obs"]`` (object array, ``info["_final_obs"]`` mask, as Gymnasium) is
      replaced by the final stacked observations (LazyFrames, or ndarrays with
      ``lazy=False``).
    - ``AutoresetMode.DISABLED`` and partial resets: ``reset(options={"reset_mask": m})``
      restarts the rings of the envs in ``m`` only.

    Works with ``SyncVectorEnv``, ``AsyncVectorEnv`` and ale-py's ``AtariVectorEnv``
    (with ``stack_num=1``, frames ``(1, 84, 84)``: use ``layout="first"`` for
    ``(k, 84, 84)``).

    Args:
        envs: a ``gymnasium.vector.VectorEnv`` whose ``single_observation_space`` is a Box.
        stack_size: frames per observation k (an integer > 0).
        padding_type: ``"reset"`` (default), ``"zero"`` or a custom frame, as Gymnasium's
            FrameStackObservation.
        layout: ``"stack"`` (``(k, *S)``, default), ``"last"`` (SB3's channels-last
            VecFrameStack) or ``"first"`` (SB3's channels-first).
        lazy: return :class:`LazyBatch` (default) or a new ndarray
            ``(num_envs, *observation_shape)`` each step.
        pool: the :class:`~lazyframes.FramePool` (of either core) to store the frames
            in; default: a new pool of ``lazyframes.FramePool``.

    Raises:
        TypeError: ``envs`` not a VectorEnv, a non-Box single observation space, a bad
            ``stack_size`` type (Gymnasium's message), or ``pool`` not a FramePool.
        ValueError: ``stack_size < 1``, an unknown ``padding_type``, a layout that does not
            fit the frames, an ``AtariVectorEnv`` with ``batch_size != num_envs``, or a
            ``pool`` of another frame shape or dtype.
        gymnasium.error.ResetNeeded: ``step`` (or a partial reset) before a full reset.

    Example:
        >>> envs = gym.make_vec("CartPole-v1", num_envs=8)
        >>> envs = FrameStackObservation(envs, 4)
        >>> obs, info = envs.reset(seed=0)
        >>> np.asarray(obs).shape
        (8, 4, 4)
    """

    def __init__(
        self,
        envs: VectorEnv,
        stack_size: int,
        *,
        padding_type: str | Any = "reset",
        layout: str = "stack",
        lazy: bool = True,
        pool=None,
    ):
        super().__init__(envs)
        who = "lazyframes.vector.FrameStackObservation"
        k = check_stack_size(stack_size)
        space = _box_of(envs.single_observation_space, who)
        padding_type, padding_value = check_padding(padding_type, space)
        C.check_layout(layout, tuple(space.shape))
        batch_size = getattr(envs.unwrapped, "batch_size", envs.num_envs)
        if batch_size != envs.num_envs:
            raise ValueError(
                f"the vector env returns batches of {batch_size} of its {envs.num_envs} envs "
                f"(asynchronous batch_size); use batch_size=num_envs"
            )
        self._pool = pool_for(space, pool, who)
        self.autoreset_mode = AutoresetMode(
            envs.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        )
        self.stack_size = k
        self.padding_type = padding_type
        self.padding_value = padding_value
        self.layout = layout
        self.lazy = bool(lazy)
        self._k = k
        self._n = envs.num_envs
        self._dtype = C.frame_dtype(space.dtype)
        self._pad: Any = None  # FrameRef of the zero/custom padding frame; None: reset padding
        if padding_type != "reset":
            self._pad = self._pool.push(np.asarray(padding_value).astype(self._dtype, copy=False))
        self._ring: Any = None  # LazyBatch (num_envs, k): the current observations
        self._autoreset = np.zeros(self._n, np.bool_)  # NEXT_STEP: reset frame comes next
        self._next_step = self.autoreset_mode == AutoresetMode.NEXT_STEP
        self._same_step = self.autoreset_mode == AutoresetMode.SAME_STEP
        self.single_observation_space = stacked_space(space, k, layout)
        self.observation_space = batch_space(self.single_observation_space, self._n)

    @property
    def pool(self):
        """The :class:`~lazyframes.FramePool` holding the frames of all sub-environments."""
        return self._pool

    def _restarted(self, frames: np.ndarray):
        """New rings (a LazyBatch) starting episodes at ``frames`` ``(n, *S)``, padded."""
        return self._pool.push_batch(frames, k=self._k, pad=self._pad, layout=self.layout)

    def _observe(self, obs):
        """``obs`` (a LazyBatch or LazyFrames) as returned: itself, or an ndarray."""
        return obs if self.lazy else np.asarray(obs)

    # -- Gymnasium API -----------------------------------------------------------------
    def reset(self, *, seed=None, options: dict[str, Any] | None = None):
        """Reset all sub-envs, or those in ``options["reset_mask"]``; returns (obs, info)."""
        mask = None
        if options is not None and "reset_mask" in options:
            mask = np.array(options["reset_mask"], dtype=np.bool_, copy=True)
            if mask.shape != (self._n,):
                raise ValueError(
                    f"`options['reset_mask']` must have shape ({self._n},), got {mask.shape}"
                )
            if self._ring is None and not mask.all():
                raise gym.error.ResetNeeded(
                    "a partial reset (reset_mask) needs a full reset first: the other "
                    "sub-environments have no frames yet"
                )
        obs, info = self.env.reset(seed=seed, options=options)
        frames = as_frames(obs, self._dtype)
        if mask is None or self._ring is None:
            self._ring = self._restarted(frames)
            self._autoreset[:] = False
        else:
            idx = np.flatnonzero(mask)
            if idx.size:
                self._ring = self._ring.replace(idx, self._restarted(frames[idx]))
                self._autoreset[idx] = False
        return self._observe(self._ring), info

    def step(self, actions):
        """Step all sub-envs; returns (obs, rewards, terminations, truncations, info)."""
        ring = self._ring
        if ring is None:
            raise gym.error.ResetNeeded(
                "lazyframes.vector.FrameStackObservation: call reset() before step()"
            )
        obs, rewards, terminations, truncations, info = self.env.step(actions)
        if type(obs) is not np.ndarray or obs.dtype != self._dtype:
            obs = as_frames(obs, self._dtype)
        done = np.logical_or(terminations, truncations)
        if self._next_step:
            restart = self._autoreset  # the reset frames of the envs that ended last step
        elif self._same_step:
            restart = done
            if done.any():
                info = self._final_obs(info, np.flatnonzero(done))
        else:
            restart = None
        # one core call: push the frames, shift the rings, restart the new episodes' rings
        self._ring = ring.shift(obs, restart, pad=self._pad)
        if self._next_step:
            self._autoreset = done  # only once the step has been taken
        return self._observe(self._ring), rewards, terminations, truncations, info

    def _final_obs(self, info: dict, idx: np.ndarray) -> dict:
        """SAME_STEP: stack each ending env's final frame onto its ring, in info["final_obs"]."""
        final = info.get("final_obs")
        if final is None:
            raise KeyError(
                "the vector env ended an episode in SAME_STEP autoreset mode without "
                "info['final_obs']"
            )
        out = np.full(self._n, None, dtype=object)
        for i in idx:
            out[i] = self._observe(self._ring[i].shift(as_frames(final[i], self._dtype)))
        info = dict(info)
        info["final_obs"] = out
        mask = np.zeros(self._n, np.bool_)
        mask[idx] = True
        info["_final_obs"] = mask
        return info

    def close(self, **kwargs):
        """Drop the rings' frames and close the vector env."""
        self._ring = self._pad = None
        return self.env.close(**kwargs)
