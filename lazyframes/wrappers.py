"""Gymnasium 1.x wrappers that stack frames without copying them.

``FrameStack`` (baselines' API) and ``FrameStackObservation`` (Gymnasium's).

Each new frame is copied once into a :class:`~lazyframes.FramePool` (``wrapper.pool``:
the one given as ``pool=``, or a new one); every observation is a
:class:`~lazyframes.LazyFrames` owning references to its k frames (no frame bytes
copied), and each step is ``obs.shift(frame)``. ``np.asarray(obs)`` is the one copy out.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space

from . import _common as C

__all__ = ["FrameStack", "FrameStackObservation"]


# -- helpers shared with lazyframes.vector ---------------------------------------------
def _box_of(space, who: str) -> gym.spaces.Box:
    """The frame space, which must be a Box (frames are ndarrays)."""
    if not isinstance(space, gym.spaces.Box):
        raise TypeError(
            f"{who} stacks Box observations (ndarray frames); the environment's observation "
            f"space is {space!r}. Use gymnasium.wrappers.FrameStackObservation for other spaces"
        )
    return space


def pool_for(space: gym.spaces.Box, pool, who: str):
    """The pool a wrapper stores frames of ``space`` in: ``pool``, checked, or a new one.

    A new pool belongs to the core ``lazyframes`` was imported with
    (``lazyframes.FramePool``); a given pool may belong to either core.

    Raises:
        TypeError: ``pool`` is not a FramePool.
        ValueError: ``pool`` stores frames of another shape or dtype than ``space``.
    """
    shape, dtype = tuple(space.shape), C.frame_dtype(space.dtype)
    if pool is None:
        from . import FramePool

        return FramePool(shape, dtype)
    if not C.is_framepool(pool):
        raise TypeError(f"{who}: pool must be a lazyframes FramePool, got {type(pool).__name__}")
    if tuple(pool.frame_shape) != shape or np.dtype(pool.dtype) != dtype:
        raise ValueError(
            f"{who}: the pool stores frames of shape {tuple(pool.frame_shape)} and dtype "
            f"{np.dtype(pool.dtype)}, the observation space has frames of shape {shape} "
            f"and dtype {dtype}"
        )
    return pool


def _stack_bounds(bound: np.ndarray, k: int, layout: str) -> np.ndarray:
    if layout == "last":
        return np.concatenate([bound] * k, axis=-1)
    if layout == "first":
        return np.concatenate([bound] * k, axis=0)
    return np.stack([bound] * k, axis=0)


def stacked_space(space: gym.spaces.Box, k: int, layout: str) -> gym.spaces.Space:
    """The observation space of k stacked frames of ``space`` in ``layout``.

    ``"stack"`` is ``gymnasium.vector.utils.batch_space(space, k)`` (as Gymnasium's
    FrameStackObservation); ``"last"``/``"first"`` concatenate the bounds on that axis.
    The dtype is kept.
    """
    if layout == "stack":
        return batch_space(space, n=k)
    return gym.spaces.Box(
        low=_stack_bounds(space.low, k, layout),
        high=_stack_bounds(space.high, k, layout),
        dtype=space.dtype,
    )


def check_stack_size(stack_size) -> int:
    """Gymnasium's FrameStackObservation checks, with its exception types and messages."""
    if not np.issubdtype(type(stack_size), np.integer):
        raise TypeError(
            f"The stack_size is expected to be an integer, actual type: {type(stack_size)}"
        )
    if not stack_size > 0:
        raise ValueError(
            f"The stack_size needs to be greater than zero, actual value: {stack_size}"
        )
    return int(stack_size)


def check_padding(padding_type, space) -> tuple:
    """``(padding_type, padding_value)`` as Gymnasium's FrameStackObservation decides them.

    ``padding_type`` becomes ``"reset"``, ``"zero"`` or ``"_custom"``; the value is a zero
    frame for "reset"/"zero" (used only before the first reset) or the custom frame.
    """
    if isinstance(padding_type, str) and (padding_type == "reset" or padding_type == "zero"):
        return padding_type, np.zeros(space.shape, space.dtype)
    if padding_type in space:
        return "_custom", padding_type
    if isinstance(padding_type, str):
        raise ValueError(
            "Unexpected `padding_type`, expected 'reset', 'zero' or a custom observation space, "
            f"actual value: {padding_type!r}"
        )
    raise ValueError(
        "Unexpected `padding_type`, expected 'reset', 'zero' or a custom observation space, "
        f"actual value: {padding_type!r} not an instance of env observation ({space})"
    )


def as_frames(obs, dtype: np.dtype):
    """The env's output as an ndarray of the pool's dtype.

    Frames of another dtype are cast as Gymnasium's ``concatenate`` does (NumPy
    "same_kind" casting); frames already right are passed on untouched (no copy).
    """
    if type(obs) is np.ndarray and obs.dtype == dtype:
        return obs
    arr = np.asarray(obs)
    if arr.dtype != dtype:
        if arr.dtype.kind == "O":
            raise TypeError("the environment returned an object array; frames must be numeric")
        if not np.can_cast(arr.dtype, dtype, casting="same_kind"):
            raise TypeError(
                f"the environment returned frames of dtype {arr.dtype}, which cannot be cast "
                f"to the observation space's {dtype}"
            )
        arr = arr.astype(dtype)
    return arr


class _RingWrapper(gym.Wrapper):
    """Holds the pool, the padding frame and the current observation.

    The current observation is the ring: each step is one ``LazyFrames.shift(frame)``
    call (push the frame, share the k-1 newer frames). Observations own their frames'
    references, so a frame lives exactly as long as some observation holds it.
    """

    def _setup(self, space: gym.spaces.Box, k: int, layout: str, who: str, pool, pad_frame=None):
        C.check_layout(layout, tuple(space.shape))
        self._pool = pool_for(space, pool, who)
        self._k = k
        self._layout = layout
        self._dtype = C.frame_dtype(space.dtype)
        self._obs: Any = None  # the current observation (LazyFrames), or None before reset
        self._pad: Any = None  # FrameRef of the padding frame, or None (reset padding)
        if pad_frame is not None:
            self._pad = self._pool.push(np.asarray(pad_frame).astype(self._dtype, copy=False))

    @property
    def pool(self):
        """The :class:`~lazyframes.FramePool` holding this wrapper's frames."""
        return self._pool

    @property
    def layout(self) -> str:
        """``"last"``, ``"first"`` or ``"stack"``."""
        return self._layout

    def _restart(self, frame, pad) -> None:
        """Start a new episode at ``frame``.

        The observation is k-1 copies of ``pad`` (a FrameRef, or None to repeat the
        frame), then the frame.
        """
        new = self._pool.push(as_frames(frame, self._dtype))
        pad = new if pad is None else pad
        self._obs = self._pool.lazy([pad] * (self._k - 1) + [new], layout=self._layout)

    def _shift(self, frame):
        """The next observation, with ``frame`` (checked before anything changes)."""
        try:  # one core call: push the frame, share the k-1 newer ones
            self._obs = obs = self._obs.shift(frame)
        except TypeError:  # another dtype: cast as Gymnasium does, or raise its error
            self._obs = obs = self._obs.shift(as_frames(frame, self._dtype))
        return obs

    def close(self):
        """Drop the wrapper's frames and close the environment."""
        self._obs = self._pad = None
        super().close()


class FrameStack(_RingWrapper):
    """Baselines' ``atari_wrappers.FrameStack`` on the Gymnasium 1.x API, returning LazyFrames.

    Stacks the last ``k`` frames, as baselines: after ``reset`` the reset frame fills all
    k places; each ``step`` pushes its frame and drops the oldest. Each frame is copied
    once into :attr:`pool`; a repeated frame is one slot, not k copies.

    Args:
        env: environment with a ``Box`` observation space of frame shape ``S``.
        k: stack size (positive int).
        layout: ``"last"`` (baselines: ``(..., C) -> (..., k*C)``, default), ``"first"``
            (``(C, H, W) -> (k*C, H, W)``) or ``"stack"`` (``(k, *S)``); see
            ``lazyframes.LAYOUTS``.
        pool: the :class:`~lazyframes.FramePool` (of either core) to store the frames
            in; default: a new pool of ``lazyframes.FramePool``.

    Observation space: a ``Box`` of the stacked shape whose bounds are the env's bounds
    concatenated (stacked for ``"stack"``), dtype kept. (Baselines hard-codes 0..255.)

    Returns (from reset/step): :class:`~lazyframes.LazyFrames` of shape
    ``observation_space.shape``; ``np.asarray(obs)`` equals baselines'
    ``np.concatenate(frames, axis=-1)``.

    Raises:
        TypeError: a non-Box observation space, ``k`` not an int, or ``pool`` not a
            FramePool.
        ValueError: ``k < 1``, a layout that does not fit the frames (e.g. ``"last"``
            on ``(84, 84)`` or ``(1, 84, 84)`` frames, case C06), or a ``pool`` of
            another frame shape or dtype.
        gymnasium.error.ResetNeeded: ``step`` before ``reset``.

    Example:
        >>> env = FrameStack(gym.make("CartPole-v1"), 4)  # (4,) frames -> (16,) observations
        >>> obs, info = env.reset(seed=0)
        >>> obs.shape, obs.stack_size
        ((16,), 4)
    """

    def __init__(self, env: gym.Env, k: int, *, layout: str = "last", pool=None):
        super().__init__(env)
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool):
            raise TypeError(f"k (the stack size) must be an int, got {type(k).__name__}")
        if k < 1:
            raise ValueError(f"k (the stack size) must be at least 1, got {k}")
        space = _box_of(env.observation_space, "FrameStack")
        self.k = int(k)
        self._setup(space, self.k, layout, "FrameStack", pool)
        self.observation_space = stacked_space(space, self.k, layout)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset the env; the observation repeats the reset frame k times."""
        obs, info = self.env.reset(seed=seed, options=options)
        self._restart(obs, None)
        return self._obs, info

    def step(self, action):
        """Step the env; returns the next observation (a LazyFrames) and the env's rest."""
        if self._obs is None:
            raise gym.error.ResetNeeded("FrameStack: call reset() before step()")
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._shift(obs), reward, terminated, truncated, info


class FrameStackObservation(_RingWrapper, gym.utils.RecordConstructorArgs):
    """Gymnasium 1.x ``FrameStackObservation`` that stores each frame once.

    A drop-in for ``gymnasium.wrappers.FrameStackObservation``: the same
    ``observation_space`` (``batch_space(env.observation_space, stack_size)``), the same
    values after ``np.asarray`` at every step, the same padding options and the same
    errors for a bad ``stack_size`` or ``padding_type``. Observations are
    :class:`~lazyframes.LazyFrames` (``lazy=True``) over slots of :attr:`pool`: each frame
    is copied in once, and padding costs no memory ("reset" repeats the reset frame's
    slot; "zero" and a custom frame are one slot pushed once).

    Unlike Gymnasium's, an env that rewrites the array it returned (case C11) is stacked
    correctly, since each frame is copied when it arrives.

    Args:
        env: environment with a ``Box`` observation space (frames are ndarrays of shape
            ``S``).
        stack_size: number of frames k (an integer > 0).
        padding_type: ``"reset"`` (repeat the reset frame, default), ``"zero"`` (zeros),
            or a custom frame (an element of ``env.observation_space``), as Gymnasium.
        layout: ``"stack"`` (``(k, *S)``, Gymnasium's, default), ``"last"`` or
            ``"first"`` (concatenate on the channel axis; the bounds are concatenated).
        lazy: return LazyFrames (default) or, with False, a new ndarray each step (one
            copy out per step) for consumers that insist on ``np.ndarray`` (e.g.
            SB3's ``check_env``).
        pool: the :class:`~lazyframes.FramePool` (of either core) to store the frames
            in; default: a new pool of ``lazyframes.FramePool``.

    Raises:
        TypeError: ``stack_size`` not an integer (Gymnasium's message); a non-Box
            observation space; ``pool`` not a FramePool.
        ValueError: ``stack_size < 1`` or an unknown ``padding_type`` (Gymnasium's
            messages); a layout that does not fit the frames (case C06); a ``pool`` of
            another frame shape or dtype.

    Example:
        >>> env = FrameStackObservation(gym.make("CartPole-v1"), 3, padding_type="zero")
        >>> obs, _ = env.reset(seed=123)
        >>> obs.shape, np.asarray(obs)[0].tolist()
        ((3, 4), [0.0, 0.0, 0.0, 0.0])
    """

    def __init__(
        self,
        env: gym.Env,
        stack_size: int,
        *,
        padding_type: str | Any = "reset",
        layout: str = "stack",
        lazy: bool = True,
        pool=None,
    ):
        # the pool is not recorded: the spec is deep-copied, and a pool cannot be copied
        gym.utils.RecordConstructorArgs.__init__(
            self, stack_size=stack_size, padding_type=padding_type, layout=layout, lazy=lazy
        )
        gym.Wrapper.__init__(self, env)
        k = check_stack_size(stack_size)
        space = _box_of(env.observation_space, "FrameStackObservation")
        padding_type, padding_value = check_padding(padding_type, space)
        C.check_layout(layout, tuple(space.shape))
        self.stack_size = k
        self.padding_type = padding_type
        self.padding_value = padding_value
        self.lazy = bool(lazy)
        # "zero" and custom padding: one slot pushed once; "reset" needs none.
        self._setup(
            space,
            k,
            layout,
            "FrameStackObservation",
            pool,
            None if padding_type == "reset" else padding_value,
        )
        self.observation_space = stacked_space(space, k, layout)

    def _observe(self):
        return self._obs if self.lazy else np.asarray(self._obs)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset the env; the observation is padded as ``padding_type`` says."""
        obs, info = self.env.reset(seed=seed, options=options)
        self._restart(obs, self._pad)
        return self._observe(), info

    def step(self, action):
        """Step the env; returns the next stacked observation and the env's rest."""
        frame, reward, terminated, truncated, info = self.env.step(action)
        if self._obs is None:
            # step before reset: Gymnasium's queue starts full of padding (zeros for
            # "reset"/"zero"), so the first frame comes after k-1 padding frames
            frame = as_frames(frame, self._dtype)  # checked before the padding is pushed
            self._restart(self.padding_value, None)
        self._shift(frame)
        return self._observe(), reward, terminated, truncated, info
