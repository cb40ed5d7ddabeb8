"""Gymnasium 1.x wrappers that stack frames without copying them: ``FrameStack`` and
``FrameStackObservation``.

Each new frame is copied once into a :class:`~lazyframes.FramePool` the wrapper owns
(``wrapper.pool``); the wrapper keeps a ring of the last k slot ids and every
observation is a :class:`~lazyframes.LazyFrames` over k slot ids (no frame bytes copied).
``np.asarray(obs)`` is the one copy out.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space

from . import _backend
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


def _stack_bounds(bound: np.ndarray, k: int, layout: str) -> np.ndarray:
    if layout == "last":
        return np.concatenate([bound] * k, axis=-1)
    if layout == "first":
        return np.concatenate([bound] * k, axis=0)
    return np.stack([bound] * k, axis=0)


def stacked_space(space: gym.spaces.Box, k: int, layout: str) -> gym.spaces.Box:
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
    if not 0 < stack_size:
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
            f"Unexpected `padding_type`, expected 'reset', 'zero' or a custom observation space, actual value: {padding_type!r}"
        )
    raise ValueError(
        f"Unexpected `padding_type`, expected 'reset', 'zero' or a custom observation space, actual value: {padding_type!r} not an instance of env observation ({space})"
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
    """Owns the pool and the current observation, a LazyFrames over the last k slots.

    The current observation is the ring: each step is one ``LazyFrames.shift(frame)``
    call (push the frame, share the k-1 newer frames), and dropping an observation
    releases its references.
    """

    def _setup(self, space: gym.spaces.Box, k: int, layout: str, pad_frame=None):
        C.check_layout(layout, tuple(space.shape))
        self._k = k
        self._layout = layout
        self._dtype = C.frame_dtype(space.dtype)
        self._frame_shape = tuple(space.shape)
        self._pool = _backend.core().FramePool(self._frame_shape, self._dtype)
        self._obs = None  # the current observation (LazyFrames), or None before reset
        self._pad = None  # slot of the padding frame (one reference) or None
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
        """Start a new episode at ``frame``: k-1 copies of ``pad`` (a slot id, or None to
        repeat the frame), then the frame."""
        pool = self._pool
        s = pool.push(as_frames(frame, self._dtype))
        try:
            ring = [s if pad is None else pad] * (self._k - 1) + [s]
            self._obs = pool.lazy(ring, layout=self._layout)
        finally:
            pool.release(s)

    def _shift(self, frame):
        """The next observation, with ``frame`` (checked before anything changes)."""
        try:
            self._obs = obs = self._obs.shift(frame)
        except TypeError:  # another dtype: cast as Gymnasium does, or raise its error
            self._obs = obs = self._obs.shift(as_frames(frame, self._dtype))
        return obs

    def _release_all(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is None:
            return
        self._obs = None
        pad, self._pad = self._pad, None
        if pad is not None:
            pool.release(pad)

    def close(self):
        """Release the frames and close the environment."""
        try:
            self._release_all()
        finally:
            super().close()

    def __del__(self):
        try:
            self._release_all()
        except Exception:  # interpreter shutdown
            pass


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

    Observation space: a ``Box`` of the stacked shape whose bounds are the env's bounds
    concatenated (stacked for ``"stack"``), dtype kept. (Baselines hard-codes 0..255.)

    Returns (from reset/step): :class:`~lazyframes.LazyFrames` of shape
    ``observation_space.shape``; ``np.asarray(obs)`` equals baselines'
    ``np.concatenate(frames, axis=-1)``.

    Raises:
        TypeError: a non-Box observation space, or ``k`` not an int.
        ValueError: ``k < 1``, or a layout that does not fit the frames (e.g. ``"last"``
            on ``(84, 84)`` or ``(1, 84, 84)`` frames, case C06).
        gymnasium.error.ResetNeeded: ``step`` before ``reset``.

    Example:
        >>> env = FrameStack(gym.make("ALE/Pong-v5"), 4)  # doctest: +SKIP
        >>> obs, info = env.reset(seed=0)  # frames (210, 160, 3) -> obs (210, 160, 12)
    """

    def __init__(self, env: gym.Env, k: int, *, layout: str = "last"):
        super().__init__(env)
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool):
            raise TypeError(f"k (the stack size) must be an int, got {type(k).__name__}")
        if k < 1:
            raise ValueError(f"k (the stack size) must be at least 1, got {k}")
        space = _box_of(env.observation_space, "FrameStack")
        self.k = int(k)
        self._setup(space, self.k, layout)
        self.observation_space = stacked_space(space, self.k, layout)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._restart(obs, None)
        return self._obs, info

    def step(self, action):
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

    Raises:
        TypeError: ``stack_size`` not an integer (Gymnasium's message); a non-Box
            observation space.
        ValueError: ``stack_size < 1`` or an unknown ``padding_type`` (Gymnasium's
            messages); a layout that does not fit the frames (case C06).

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
    ):
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
        self._setup(space, k, layout, None if padding_type == "reset" else padding_value)
        self.observation_space = stacked_space(space, k, layout)

    def _observe(self):
        return self._obs if self.lazy else np.asarray(self._obs)


    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._restart(obs, self._pad)
        return self._observe(), info

    def step(self, action):
        frame, reward, terminated, truncated, info = self.env.step(action)
        if self._obs is None:
            # step before reset: Gymnasium's queue starts full of padding (zeros for
            # "reset"/"zero"), so the first frame comes after k-1 padding frames
            frame = as_frames(frame, self._dtype)  # checked before the padding is pushed
            self._restart(self.padding_value, None)
        try:  # one core call: push the frame, share the k-1 newer ones
            self._obs = obs = self._obs.shift(frame)
        except TypeError:  # another dtype: cast as Gymnasium does, or raise its error
            self._obs = obs = self._obs.shift(as_frames(frame, self._dtype))
        return (obs if self.lazy else np.asarray(obs)), reward, terminated, truncated, info
