"""A frame stacker for Gymnasium vector environments: ``FrameStackObservation`` and ``LazyBatch``.

One :class:`~lazyframes.FramePool` for all sub-environments; the rings of the last k
frames are one :class:`LazyBatch` (``num_envs`` rows of k frames), which is also the
observation returned. Each step is one ``LazyBatch.shift`` call (push the batch of new
frames, shift every ring, restart the rings of new episodes); ``np.asarray`` materialises
the batch as ``(num_envs, *observation_shape)`` in one copy.

Episode boundaries follow the vector env's autoreset mode
(``envs.metadata["autoreset_mode"]``, Gymnasium's ``AutoresetMode``), so an observation
never mixes frames of two episodes (case C14 of docs/CASES.md).

Needs Gymnasium >= 1.1 (``AutoresetMode``); the rest of lazyframes works with 0.29.1.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

try:
    from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper
except ImportError:  # pragma: no cover - only with Gymnasium < 1.1
    raise ImportError(
        f"lazyframes.vector needs Gymnasium >= 1.1 (its vector API, AutoresetMode); "
        f"Gymnasium {gym.__version__} is installed: pip install 'lazyframes[vector]' or "
        f"'gymnasium>=1.1'. lazyframes.wrappers and lazyframes.ReplayBuffer work with "
        f"Gymnasium 0.29.1"
    ) from None
from gymnasium.vector.utils import batch_space

from . import _core
from .wrappers import (
    LeafStacks,
    _LazyLeaf,
    as_frames,
    at,
    check_padding,
    check_stack_size,
    leaf_pool,
    leaves,
    stacked_space,
)

__all__ = ["FrameStackObservation", "LazyBatch"]


class _LazyBatchType(type):
    """``isinstance(x, LazyBatch)`` is true for the core's LazyBatch."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, _core.LazyBatch)


class LazyBatch(metaclass=_LazyBatchType):
    """A batch of observations, one per sub-environment, holding references to frames of one pool.

    The type of the vector stacker's observations. The class lives in the core
    (``FramePool.lazy_batch``); this name constructs one and answers ``isinstance``.
    ``LazyBatch(pool, slots, layout="stack")`` takes a reference on each of the
    ``(num_envs, k)`` slots (ints or FrameRefs of ``pool``), so the batch stays valid
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


class _LazyBatchLeaf(_LazyLeaf):
    """A Box leaf of every sub-env: frames in one pool; the rings are one LazyBatch."""

    def start_batch(self, frames):
        """New rings (a LazyBatch) starting episodes at ``frames`` ``(m, *S)``, padded."""
        return self.pool.push_batch(
            as_frames(frames, self.dtype), k=self.k, pad=self.pad_ref(), layout=self.layout
        )

    def shift_batch(self, ring, frames, restart):
        """One core call: push the frames, shift every ring, restart the rings in ``restart``."""
        if type(frames) is not np.ndarray or frames.dtype != self.dtype:
            frames = as_frames(frames, self.dtype)
        return ring.shift(frames, restart, pad=self.pad_ref())

    def replace(self, ring, idx: np.ndarray, new):
        """``ring`` with the rows ``idx`` replaced by ``new`` (a new LazyBatch)."""
        return ring.replace(idx, new)

    def final(self, ring, i: int, frame, lazy: bool):
        """Env ``i``'s final observation: its ring with the episode's last frame."""
        obs = ring[i].shift(as_frames(frame, self.dtype))
        return obs if lazy else np.asarray(obs)

    def observe(self, ring, lazy: bool):
        """The batch as returned: the LazyBatch itself, or an ndarray."""
        return ring if lazy else np.asarray(ring)


class _ArrayBatchLeaf:
    """A ``Discrete``/``MultiDiscrete``/``MultiBinary`` leaf, stacked eagerly as Gymnasium does.

    The rings are an ndarray ``(num_envs, k, *shape)`` of the space's dtype (the value of
    ``batch_space(batch_space(space, k), num_envs)``); each step makes a new one.
    """

    pool = None
    pad = None

    def __init__(self, space: gym.Space, k: int, pad):
        self.k = k
        self.dtype = np.dtype(space.dtype)
        self.pad_value = None if pad is None else np.array(pad, self.dtype)  # a copy

    def _values(self, values) -> np.ndarray:
        return np.asarray(values).astype(self.dtype, casting="same_kind", copy=False)

    def start_batch(self, values) -> np.ndarray:
        """New rings ``(m, k, *shape)`` starting episodes at ``values``, padded."""
        values = self._values(values)
        ring = np.repeat(values[:, None], self.k, axis=1)
        if self.pad_value is not None:
            ring[:, :-1] = self.pad_value
        return ring

    def shift_batch(self, ring: np.ndarray, values, restart) -> np.ndarray:
        """The rings after ``values``; those in ``restart`` start a new episode."""
        values = self._values(values)
        new = np.concatenate([ring[:, 1:], values[:, None]], axis=1)
        if restart is not None and restart.any():
            new[restart] = self.start_batch(values[restart])
        return new

    def replace(self, ring: np.ndarray, idx: np.ndarray, new: np.ndarray) -> np.ndarray:
        """A copy of ``ring`` with the rows ``idx`` replaced by ``new``."""
        ring = ring.copy()
        ring[idx] = new
        return ring

    def final(self, ring: np.ndarray, i: int, value, lazy: bool) -> np.ndarray:
        """Env ``i``'s final observation: its ring with the episode's last value."""
        return np.concatenate([ring[i, 1:], self._values(value)[None]])

    def observe(self, ring: np.ndarray, lazy: bool) -> np.ndarray:
        """A copy of the rings (they are the stacker's state)."""
        return ring.copy()

    def release(self) -> None:
        """Nothing to drop."""


def _leaf_stackers(space: gym.Space, k: int, layout: str, pool, pad, who: str) -> list:
    """A stacker per leaf of ``space``; ``pad`` is the padding value, None for reset padding.

    Raises:
        TypeError: a leaf space other than Box, Discrete, MultiDiscrete and MultiBinary,
            or a pool given for a leaf that is not a Box.
    """
    stackers: list = []
    for path, leaf in leaves(space):
        leaf_pad = None if pad is None else at(pad, path)
        if isinstance(leaf, gym.spaces.Box):
            stackers.append(
                _LazyBatchLeaf(leaf, k, layout, leaf_pool(pool, path, who), leaf_pad, who)
            )
        elif isinstance(
            leaf, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
        ):
            if leaf_pool(pool, path, who) is not None:
                raise TypeError(f"{who}: a pool was given for {leaf}, which is not a Box")
            stackers.append(_ArrayBatchLeaf(leaf, k, leaf_pad))
        else:
            raise TypeError(
                f"{who} stacks Box, Discrete, MultiDiscrete and MultiBinary observations "
                f"(alone or in a Dict or Tuple), not {leaf}; stack each sub-env with "
                f"lazyframes.wrappers.FrameStackObservation before vectorising"
            )
    return stackers


def _batch_size(envs: VectorEnv) -> int:
    """How many sub-envs one step returns: ale-py's ``batch_size``, EnvPool's config's."""
    env = envs.unwrapped
    size = getattr(env, "batch_size", None)
    if size is None:
        config = getattr(env, "config", None)
        size = config.get("batch_size") if isinstance(config, dict) else None
    return int(size) if size else envs.num_envs  # EnvPool: 0 means num_envs


class FrameStackObservation(LeafStacks, VectorWrapper):
    """Stacks the last ``stack_size`` observations of each sub-environment of a Gymnasium VectorEnv.

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

    Observation spaces: a ``Box`` (frames), or a ``Dict``/``Tuple`` whose leaves are
    ``Box`` (stacked lazily, one pool and one :class:`LazyBatch` per leaf) or
    ``Discrete``/``MultiDiscrete``/``MultiBinary`` (stacked eagerly into an ndarray
    ``(num_envs, k, ...)``, as Gymnasium's wrapper per sub-env, then batched).

    Works with ``SyncVectorEnv``, ``AsyncVectorEnv`` and ale-py's ``AtariVectorEnv``
    (with ``stack_num=1``, frames ``(1, 84, 84)``: use ``layout="first"`` for
    ``(k, 84, 84)``). Vector envs that return a batch of some of their envs at each step
    (ale-py's ``batch_size < num_envs``, EnvPool's asynchronous mode) are refused:
    their rings would follow batch positions instead of envs. ``copy.deepcopy`` copies
    the vector env and the rings, and shares the pools (frames never change).

    Args:
        envs: a ``gymnasium.vector.VectorEnv``.
        stack_size: frames per observation k (an integer > 0).
        padding_type: ``"reset"`` (default), ``"zero"`` or a custom observation, as
            Gymnasium's FrameStackObservation.
        layout: ``"stack"`` (``(k, *S)``, default), ``"last"`` (SB3's channels-last
            VecFrameStack) or ``"first"`` (SB3's channels-first).
        lazy: return :class:`LazyBatch` (default) or a new ndarray
            ``(num_envs, *observation_shape)`` each step.
        pool: the :class:`~lazyframes.FramePool` to store the frames
            in; for a ``Dict``/``Tuple`` space, a dict/tuple like it of pools for its Box
            leaves (None or a missing key: a new pool); default: new pools of
            ``lazyframes.FramePool``.

    Raises:
        TypeError: ``envs`` not a VectorEnv, a leaf space other than those above, a bad
            ``stack_size`` type (Gymnasium's message), or ``pool`` not a FramePool.
        ValueError: ``stack_size < 1``, an unknown ``padding_type``, a layout that does not
            fit the frames, a vector env that returns batches of some of its envs
            (``batch_size < num_envs``, or a step whose ``info["env_id"]`` is not every
            env in order), or a ``pool`` of another frame shape or dtype.
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
        who = "lazyframes.vector.FrameStackObservation"
        # everything is checked before the wrapper is initialised: a half-made wrapper
        # would be closed by VectorEnv.__del__
        if not isinstance(envs, VectorEnv):
            raise TypeError(f"{who} wraps a gymnasium.vector.VectorEnv, got {type(envs).__name__}")
        k = check_stack_size(stack_size)
        space = envs.single_observation_space
        padding_type, padding_value = check_padding(padding_type, space)
        batch_size = _batch_size(envs)
        if batch_size != envs.num_envs:
            raise ValueError(
                f"the vector env returns batches of {batch_size} of its {envs.num_envs} envs "
                f"(asynchronous batch_size): stacks would follow batch positions, not envs; "
                f"use batch_size=num_envs"
            )
        stackers = _leaf_stackers(
            space, k, layout, pool, None if padding_type == "reset" else padding_value, who
        )
        mode = AutoresetMode(envs.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP))
        super().__init__(envs)
        self._leaves = stackers
        self._paths = [path for path, _ in leaves(space)]
        self._space = space
        self.autoreset_mode = mode
        self.stack_size = k
        self.padding_type = padding_type
        self.padding_value = padding_value
        self.layout = layout
        self.lazy = bool(lazy)
        self._n = envs.num_envs
        self._ring: list | None = None  # each leaf's rings (num_envs, k): the current observations
        self._autoreset = np.zeros(self._n, np.bool_)  # NEXT_STEP: reset frame comes next
        self._next_step = self.autoreset_mode == AutoresetMode.NEXT_STEP
        self._same_step = self.autoreset_mode == AutoresetMode.SAME_STEP
        self.single_observation_space = stacked_space(space, k, layout)
        self.observation_space = batch_space(self.single_observation_space, self._n)

    def _observe(self, rings: list):
        """The observation of ``rings`` (one per leaf) as returned."""
        parts = (
            leaf.observe(ring, self.lazy) for leaf, ring in zip(self._leaves, rings, strict=True)
        )
        return self._assembled(parts)

    def _check_batch(self, obs, info: dict) -> None:
        """Refuse a step that returned some of the envs (an asynchronous vector env)."""
        ids = info.get("env_id")
        rows = len(at(obs, self._paths[0]))
        if rows != self._n or (ids is not None and not np.array_equal(ids, np.arange(self._n))):
            raise ValueError(
                f"the vector env returned a batch of {rows} observations (env ids "
                f"{'not given' if ids is None else np.asarray(ids).tolist()}), not one for each of "
                f"its {self._n} envs in order: asynchronous vector envs are not supported"
            )

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
        self._check_batch(obs, info)
        parts = [at(obs, path) for path in self._paths]
        if mask is None or self._ring is None:
            self._ring = [leaf.start_batch(p) for leaf, p in zip(self._leaves, parts, strict=True)]
            self._autoreset[:] = False
        else:
            idx = np.flatnonzero(mask)
            if idx.size:
                self._ring = [
                    leaf.replace(ring, idx, leaf.start_batch(np.asarray(p)[idx]))
                    for leaf, ring, p in zip(self._leaves, self._ring, parts, strict=True)
                ]
                self._autoreset[idx] = False
        return self._observe(self._ring), info

    def step(self, actions):
        """Step all sub-envs; returns (obs, rewards, terminations, truncations, info)."""
        rings = self._ring
        if rings is None:
            raise gym.error.ResetNeeded(
                "lazyframes.vector.FrameStackObservation: call reset() before step()"
            )
        obs, rewards, terminations, truncations, info = self.env.step(actions)
        self._check_batch(obs, info)
        done = np.logical_or(terminations, truncations)
        if self._next_step:
            restart = self._autoreset  # the reset frames of the envs that ended last step
        elif self._same_step:
            restart = done
            if done.any():
                info = self._final_obs(info, np.flatnonzero(done))
        else:
            restart = None
        # per Box leaf, one core call: push the frames, shift the rings, restart new episodes
        self._ring = [
            leaf.shift_batch(ring, at(obs, path), restart)
            for leaf, ring, path in zip(self._leaves, rings, self._paths, strict=True)
        ]
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
        assert self._ring is not None
        out = np.full(self._n, None, dtype=object)
        for i in idx:
            parts = (
                leaf.final(ring, i, at(final[i], path), self.lazy)
                for leaf, ring, path in zip(self._leaves, self._ring, self._paths, strict=True)
            )
            out[i] = self._assembled(parts)
        info = dict(info)
        info["final_obs"] = out
        mask = np.zeros(self._n, np.bool_)
        mask[idx] = True
        info["_final_obs"] = mask
        return info

    def close(self, **kwargs):
        """Drop the rings' frames and close the vector env.

        A later ``reset`` starts again with the same padding.
        """
        self._ring = None
        self._release()
        return self.env.close(**kwargs)
