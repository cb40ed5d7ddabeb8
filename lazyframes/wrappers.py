"""Gymnasium wrappers that stack frames without copying them.

``FrameStack`` (baselines' API) and ``FrameStackObservation`` (Gymnasium's).

Each new frame is copied once into a :class:`~lazyframes.FramePool` (``wrapper.pool``:
the one given as ``pool=``, or a new one); every observation is a
:class:`~lazyframes.LazyFrames` owning references to its k frames (no frame bytes
copied), and each step is ``obs.shift(frame)``. ``np.asarray(obs)`` is the one copy out.
``FrameStackObservation`` also stacks ``Dict``/``Tuple`` spaces, as Gymnasium's does.

These wrappers work with Gymnasium 0.29.1 and 1.x; ``lazyframes.vector`` needs 1.1.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from . import _checks as C
from . import _core
from ._scaled import ScaledLazyBatch, ScaledLazyFrames, unscaled

__all__ = ["FrameStack", "FrameStackObservation", "ScaledFloatFrame"]


# -- spaces: helpers shared with lazyframes.vector ---------------------------------------
def leaves(space: gym.Space, path: tuple = ()) -> Iterator[tuple[tuple, gym.Space]]:
    """``(path, leaf)`` of every leaf of ``space``, in the order Gymnasium visits them.

    A path is the keys (``Dict``) and indices (``Tuple``) leading to the leaf: ``()`` for
    a space that is not a ``Dict`` or ``Tuple``.
    """
    if isinstance(space, gym.spaces.Dict):
        for key, sub in space.spaces.items():
            yield from leaves(sub, path + (key,))
    elif isinstance(space, gym.spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            yield from leaves(sub, path + (i,))
    else:
        yield path, space


def at(value, path: tuple):
    """The part of a ``Dict``/``Tuple``-structured ``value`` at ``path``."""
    for p in path:
        value = value[p]
    return value


def assemble(space: gym.Space, values: Iterator):
    """A value structured like ``space`` (dicts and tuples) from its leaves' values in order."""
    if isinstance(space, gym.spaces.Dict):
        return {key: assemble(sub, values) for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(assemble(sub, values) for sub in space.spaces)
    return next(values)


def zero_value(space: gym.Space):
    """Gymnasium's "zero" padding: the element of ``space`` closest to zero.

    ``gymnasium.wrappers.utils.create_zero_array`` of Gymnasium 1.x; restated here for
    ``Box`` leaves, so that Box observations (alone or in a ``Dict``/``Tuple``) also pad on
    Gymnasium 0.29, which lacks it.

    Raises:
        TypeError: a non-Box leaf on Gymnasium 0.29.
    """
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        return assemble(space, (zero_value(leaf) for _, leaf in leaves(space)))
    if isinstance(space, gym.spaces.Box):
        zero = np.zeros(space.shape, dtype=space.dtype)
        zero = np.where(space.low > 0, space.low, zero)
        return np.where(space.high < 0, space.high, zero)
    try:
        from gymnasium.wrappers.utils import create_zero_array
    except ImportError:  # Gymnasium 0.29
        raise TypeError(
            f"stacking {space} needs Gymnasium >= 1.0 (Gymnasium {gym.__version__} stacks "
            f"only Box observations, alone or in a Dict or Tuple)"
        ) from None
    return create_zero_array(space)


def leaf_pool(pool, path: tuple, who: str):
    """The pool given for the leaf at ``path``: ``pool`` mirrors the space, None is a new pool.

    Raises:
        TypeError: a single FramePool for a ``Dict``/``Tuple`` space.
    """
    if not path or pool is None:
        return pool
    if not isinstance(pool, (dict, tuple, list)):
        raise TypeError(
            f"{who}: the observation space is a Dict or Tuple; pool must be a dict or tuple of "
            f"FramePools mirroring it (None or a missing key: a new pool), got "
            f"{type(pool).__name__}"
        )
    for p in path:
        try:
            pool = pool[p]
        except (KeyError, IndexError):
            return None
        if pool is None:
            return None
    return pool


def pool_for(space: gym.spaces.Box, pool, who: str):
    """The pool a wrapper stores frames of ``space`` in: ``pool``, checked, or a new one.

    Raises:
        TypeError: ``pool`` is not a FramePool.
        ValueError: ``pool`` stores frames of another shape or dtype than ``space``.
    """
    shape, dtype = tuple(space.shape), C.frame_dtype(space.dtype)
    if pool is None:
        return _core.FramePool(shape, dtype)
    if not isinstance(pool, _core.FramePool):
        raise TypeError(f"{who}: pool must be a lazyframes FramePool, got {type(pool).__name__}")
    if tuple(pool.frame_shape) != shape or np.dtype(pool.dtype) != dtype:
        raise ValueError(
            f"{who}: the pool stores frames of shape {tuple(pool.frame_shape)} and dtype "
            f"{np.dtype(pool.dtype)}, the observation space has frames of shape {shape} "
            f"and dtype {dtype}"
        )
    return pool


def stacked_space(space: gym.Space, k: int, layout: str) -> gym.spaces.Space:
    """The observation space of k stacked observations of ``space`` in ``layout``.

    ``"stack"`` is ``gymnasium.vector.utils.batch_space(space, k)`` (as Gymnasium's
    FrameStackObservation); ``"last"``/``"first"`` concatenate the bounds of each ``Box``
    leaf on that axis (dtype kept), and stack the other leaves as ``batch_space``.
    """
    if layout == "stack":
        return batch_space(space, n=k)
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict([(key, stacked_space(s, k, layout)) for key, s in space.items()])
    if isinstance(space, gym.spaces.Tuple):
        return gym.spaces.Tuple([stacked_space(s, k, layout) for s in space.spaces])
    if not isinstance(space, gym.spaces.Box):
        return batch_space(space, n=k)
    axis = -1 if layout == "last" else 0
    return gym.spaces.Box(
        low=np.concatenate([space.low] * k, axis=axis),
        high=np.concatenate([space.high] * k, axis=axis),
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

    ``padding_type`` becomes ``"reset"``, ``"zero"`` or ``"_custom"``; the value is
    :func:`zero_value` for "reset"/"zero" (used only before the first reset) or the
    custom observation.
    """
    if isinstance(padding_type, str) and (padding_type == "reset" or padding_type == "zero"):
        return padding_type, zero_value(space)
    if padding_type in space:
        return "_custom", padding_type
    why = "" if isinstance(padding_type, str) else f" not an instance of env observation ({space})"
    raise ValueError(
        "Unexpected `padding_type`, expected 'reset', 'zero' or a custom observation space, "
        f"actual value: {padding_type!r}{why}"
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


class LeafStacks:
    """What the single-env and vector stackers share: one stacker per leaf of the space.

    Holds ``_space`` (the env's, or single env's, observation space), ``_leaves`` (a
    stacker per leaf) and ``_paths`` (each leaf's path in ``_space``).
    """

    _space: gym.Space
    _leaves: list
    _paths: list

    @property
    def pool(self):
        """The :class:`~lazyframes.FramePool` holding this wrapper's frames.

        For a ``Dict`` or ``Tuple`` observation space: a dict or tuple like it, with the pool
        of each ``Box`` leaf (None for the other leaves, stacked without a pool).
        """
        if not self._paths[0]:
            return self._leaves[0].pool
        return assemble(self._space, (leaf.pool for leaf in self._leaves))

    def _assembled(self, parts: Iterator):
        """One observation from its leaves' parts, in leaf order."""
        return next(parts) if not self._paths[0] else assemble(self._space, parts)

    def __deepcopy__(self, memo):
        """A deep copy that goes on from the same state, sharing the pools and padding frames.

        Frames never change (and a FramePool cannot be copied); everything else (the env,
        the spaces, the rings) is deep-copied as Gymnasium's wrappers are.
        """
        for leaf in self._leaves:
            for shared in (leaf.pool, leaf.pad):
                if shared is not None:
                    memo[id(shared)] = shared
        new = object.__new__(type(self))
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new

    def _release(self) -> None:
        """Drop the padding frames (each leaf pushes its own again when next needed)."""
        for leaf in self._leaves:
            leaf.release()


class _LazyLeaf:
    """A Box leaf: frames copied once into a pool; its ring is a LazyFrames.

    Args:
        space: the leaf's Box space.
        k: stack size.
        layout: one of ``lazyframes.LAYOUTS``, checked against the frame shape.
        pool: a FramePool for the leaf's frames, or None for a new one.
        pad: the padding frame ("zero" or custom padding), or None to repeat the first
            frame of an episode ("reset" padding).
        who: the wrapper's name, for error messages.
        divisor: None, or :class:`ScaledFloatFrame`'s divisor when the frames are its
            floats: their bytes are stored (a uint8 pool), and the ring is a
            :class:`~lazyframes.ScaledLazyFrames` showing them as the floats.
    """

    def __init__(self, space: gym.spaces.Box, k: int, layout: str, pool, pad, who: str,
                 divisor=None):  # fmt: skip
        C.check_layout(layout, tuple(space.shape))
        self.divisor = divisor
        if divisor is not None:
            space = gym.spaces.Box(0, 255, space.shape, np.uint8)
        self.pool = pool_for(space, pool, who)
        self.k = k
        self.layout = layout
        self.dtype = C.frame_dtype(space.dtype)
        # a copy: the padding frame is pushed on first use, and again after a release
        self.pad_value = None if pad is None else np.array(self.frames(pad))
        self.pad: Any = None  # FrameRef of pad_value, or None

    def frames(self, frames):
        """``frames`` as the pool stores them: its dtype, or the bytes of scaled floats."""
        if self.divisor is None:
            return as_frames(frames, self.dtype)
        return unscaled(frames, self.divisor)

    def owner(self, ring):
        """The LazyFrames or LazyBatch of the pool under ``ring`` (a :meth:`view`)."""
        return ring if self.divisor is None else ring.frames

    def view(self, owner):
        """What the stacker returns of ``owner`` (a LazyFrames or LazyBatch of the pool)."""
        if self.divisor is None:
            return owner
        scaled = ScaledLazyFrames if isinstance(owner, _core.LazyFrames) else ScaledLazyBatch
        return scaled(owner, self.divisor)

    def pad_ref(self):
        """The FrameRef of the padding frame (None for reset padding)."""
        if self.pad is None and self.pad_value is not None:
            self.pad = self.pool.push(self.pad_value)
        return self.pad

    def start(self, frame, padded: bool = True):
        """A ring of k-1 padding frames (or, without padding, copies of ``frame``), then it."""
        new = self.pool.push(self.frames(frame))
        pad = self.pad_ref() if padded else None
        pad = new if pad is None else pad
        return self.view(self.pool.lazy([pad] * (self.k - 1) + [new], layout=self.layout))

    def shift(self, ring, frame):
        """The next ring, with ``frame`` (checked before anything changes)."""
        try:  # one core call: push the frame, share the k-1 newer ones (scaled: unscaled)
            return ring.shift(frame)
        except TypeError:  # another dtype: cast as Gymnasium does, or raise its error
            return ring.shift(as_frames(frame, self.dtype))

    def release(self) -> None:
        """Drop the padding frame (pushed again if needed)."""
        self.pad = None


class _EagerLeaf:
    """Any other leaf (``Discrete``, ``MultiDiscrete``, ``Text``, ...), stacked as Gymnasium does.

    The ring is a tuple of the last k values (each deep-copied when it arrives); an
    observation is ``gymnasium.vector.utils.concatenate`` of them, a new value each time.
    """

    pool = None
    pad = None

    def __init__(self, space: gym.Space, k: int, pad):
        self.space = space
        self.k = k
        self.pad_value = copy.deepcopy(pad)
        self.out: Any = create_empty_array(space, n=k)

    def start(self, value, padded: bool = True):
        """A ring of k-1 padding values (or copies of ``value``), then ``value``."""
        value = copy.deepcopy(value)
        pad = value if self.pad_value is None or not padded else self.pad_value
        return (pad,) * (self.k - 1) + (value,)

    def shift(self, ring: tuple, value) -> tuple:
        """The next ring, with ``value``."""
        return ring[1:] + (copy.deepcopy(value),)

    def observe(self, ring: tuple):
        """The stacked observation: as Gymnasium's ``concatenate``, a fresh copy."""
        return copy.deepcopy(concatenate(self.space, ring, self.out))

    def release(self) -> None:
        """Nothing to drop."""


def make_leaf(space: gym.Space, path: tuple, k: int, layout: str, pool, padding, who: str,
              divisor=None):  # fmt: skip
    """The stacker of the leaf ``space`` at ``path``: lazy for a Box, else eager (as Gymnasium).

    ``pool`` and ``padding`` are the whole space's (:func:`leaf_pool`; None: reset padding);
    ``divisor``: a Box space's :class:`ScaledFloatFrame` divisor (:func:`scaled_divisor`).

    Raises:
        TypeError: a pool given for a leaf that is not a Box.
    """
    pool = leaf_pool(pool, path, who)
    pad = None if padding is None else at(padding, path)
    if isinstance(space, gym.spaces.Box):
        return _LazyLeaf(space, k, layout, pool, pad, who, divisor)
    if pool is not None:
        raise TypeError(f"{who}: a pool was given for {space}, which is not a Box (no frames)")
    return _EagerLeaf(space, k, pad)


class _RingWrapper(LeafStacks, gym.Wrapper):
    """Holds one stacker per leaf of the observation space and the current ring.

    For a Box space (the hot path) the ring is the current observation, a LazyFrames, and
    a step is one ``LazyFrames.shift(frame)``; otherwise it is a list of each leaf's ring.
    """

    def _setup(
        self, space: gym.Space, k: int, layout: str, who: str, pool, padding=None, lazy=True
    ):
        """Make the leaves' stackers; ``padding`` is the padding value, None for reset padding."""
        self._space = space
        self._k = k
        self._layout = layout
        self._lazy = lazy
        divisor = scaled_divisor(self.env, space)
        self._leaves = [
            make_leaf(leaf, path, k, layout, pool, padding, who, divisor)
            for path, leaf in leaves(space)
        ]
        self._paths = [path for path, _ in leaves(space)]
        self._box = isinstance(space, gym.spaces.Box)
        self._ring: Any = None  # LazyFrames (Box space) or a list per leaf; None before reset

    @property
    def layout(self) -> str:
        """``"last"``, ``"first"`` or ``"stack"``."""
        return self._layout

    def _started(self, obs, padded: bool):
        """The ring of a new episode starting at ``obs``, padded (or repeating ``obs``)."""
        if self._box:
            return self._leaves[0].start(obs, padded)
        return [
            leaf.start(at(obs, path), padded)
            for leaf, path in zip(self._leaves, self._paths, strict=True)
        ]

    def _shifted(self, ring, obs):
        """The ring after ``obs``: a new one, so a failure leaves ``ring`` as it was."""
        if self._box:
            return self._leaves[0].shift(ring, obs)
        return [
            leaf.shift(r, at(obs, path))
            for leaf, r, path in zip(self._leaves, ring, self._paths, strict=True)
        ]

    def _observe(self):
        """The current observation: LazyFrames per Box leaf (ndarrays if not lazy)."""
        ring = self._ring
        if self._box:
            return ring if self._lazy else np.asarray(ring)
        return self._assembled(
            (r if self._lazy else np.asarray(r)) if isinstance(leaf, _LazyLeaf) else leaf.observe(r)
            for leaf, r in zip(self._leaves, ring, strict=True)
        )

    def close(self):
        """Drop the wrapper's frames and close the environment.

        A later ``reset`` starts again with the same padding.
        """
        self._ring = None
        self._release()
        super().close()


class ScaledFloatFrame(gym.ObservationWrapper):
    """Baselines' ``ScaledFloatFrame``: observations as float32 in ``[0, 1]``, without its cost.

    Alone over an env, it is baselines' wrapper: each observation becomes a new float32
    array, ``np.array(obs).astype(np.float32) / 255.0``, and the observation space
    ``Box(0, 1, shape, float32)``. Under lazyframes' stackers (``FrameStack``,
    ``FrameStackObservation``, ``lazyframes.vector.FrameStackObservation``, with any
    wrappers between that leave observations as they are, e.g. baselines' order
    ``FrameStack(ClipRewardEnv(ScaledFloatFrame(env)), 4)``), the stacker stores each
    frame's bytes once, as without scaling (the float values are exact quotients, so no
    value is lost; one that is not raises ``ValueError``), and returns
    :class:`~lazyframes.ScaledLazyFrames` (:class:`~lazyframes.ScaledLazyBatch`) whose
    ``np.asarray`` is the float32 values, bit for bit baselines'. A ``ReplayBuffer`` fed
    them stores the bytes and samples the same float32 values. Baselines warns that this
    wrapper "will undo the memory optimization of LazyFrames": here it does not.

    The stack's ``observation_space`` is this wrapper's space stacked, ``Box(0, 1, ...,
    float32)``: the values the observations hold. (Baselines' ``FrameStack`` reports
    ``Box(0, 255, ..., uint8)`` over float frames: bounds and dtype of the frames it does
    not return.)

    Over observations that are not uint8 it is baselines' wrapper under the stackers too
    (the floats are stacked as floats).

    Example:
        >>> import ale_py
        >>> gym.register_envs(ale_py)
        >>> env = FrameStackObservation(
        ...     ScaledFloatFrame(gym.make("ALE/Pong-v5", obs_type="grayscale")), 4
        ... )
        >>> obs, _ = env.reset(seed=0)
        >>> type(obs).__name__, obs.dtype, obs.pool.dtype, env.observation_space.high.max()
        ('ScaledLazyFrames', dtype('float32'), dtype('uint8'), np.float32(1.0))
    """

    def __init__(self, env: gym.Env):
        gym.ObservationWrapper.__init__(self, env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box):
            raise TypeError(f"ScaledFloatFrame scales Box observations, got {space!r}")
        self.observation_space = gym.spaces.Box(0.0, 1.0, space.shape, np.float32)
        #: The divisor the stackers store the bytes of the floats by (uint8 frames only).
        self.lazyframes_divisor = 255.0 if space.dtype == np.uint8 else None

    def observation(self, observation):
        """Baselines': ``np.array(observation).astype(np.float32) / 255.0``."""
        return np.array(observation).astype(np.float32) / 255.0


def scaled_divisor(env, space: gym.Space):
    """:class:`ScaledFloatFrame`'s divisor, or None.

    When ``env`` is one or wraps one and ``space`` holds its floats (a float32 Box).
    """
    if not (isinstance(space, gym.spaces.Box) and space.dtype == np.float32):
        return None
    while isinstance(env, gym.Wrapper):
        if isinstance(env, ScaledFloatFrame):
            return env.lazyframes_divisor
        env = env.env
    return None


class FrameStack(_RingWrapper):
    """Baselines' ``atari_wrappers.FrameStack`` on Gymnasium 0.29.1 and 1.x, returning LazyFrames.

    Stacks the last ``k`` frames, as baselines: after ``reset`` the reset frame fills all
    k places; each ``step`` pushes its frame and drops the oldest. Each frame is copied
    once into :attr:`pool`; a repeated frame is one slot, not k copies.

    Args:
        env: environment with a ``Box`` observation space of frame shape ``S``.
        k: stack size (positive int).
        layout: ``"last"`` (baselines: ``(..., C) -> (..., k*C)``, default), ``"first"``
            (``(C, H, W) -> (k*C, H, W)``) or ``"stack"`` (``(k, *S)``); see
            ``lazyframes.LAYOUTS``.
        pool: the :class:`~lazyframes.FramePool` to store the frames
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
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box):
            raise TypeError(
                f"FrameStack stacks Box observations (ndarray frames); the environment's "
                f"observation space is {space!r}. Use lazyframes.wrappers.FrameStackObservation "
                f"for other spaces"
            )
        self.k = int(k)
        self._setup(space, self.k, layout, "FrameStack", pool)
        self.observation_space = stacked_space(space, self.k, layout)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset the env; the observation repeats the reset frame k times."""
        obs, info = self.env.reset(seed=seed, options=options)
        self._ring = self._started(obs, padded=False)
        return self._ring, info

    def step(self, action):
        """Step the env; returns the next observation (a LazyFrames) and the env's rest."""
        if self._ring is None:
            raise gym.error.ResetNeeded("FrameStack: call reset() before step()")
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._ring = self._shifted(self._ring, obs)
        return self._ring, reward, terminated, truncated, info


class FrameStackObservation(_RingWrapper, gym.utils.RecordConstructorArgs):
    """Gymnasium's ``FrameStackObservation`` that stores each frame once.

    A drop-in for ``gymnasium.wrappers.FrameStackObservation``: the same
    ``observation_space`` (``batch_space(env.observation_space, stack_size)``), the same
    values after ``np.asarray`` at every step, the same padding options and the same
    errors for a bad ``stack_size`` or ``padding_type``. Observations are
    :class:`~lazyframes.LazyFrames` (``lazy=True``) over slots of :attr:`pool`: each frame
    is copied in once, and padding costs no memory ("reset" repeats the reset frame's
    slot; "zero" and a custom frame are one slot pushed once).

    Any observation space Gymnasium's wrapper takes: a ``Dict`` or ``Tuple`` space gives a
    dict or tuple like it, each ``Box`` leaf stacked lazily in a pool of its own (a
    LazyFrames per leaf), each other leaf stacked eagerly as Gymnasium does (e.g. a
    ``Discrete`` leaf becomes an int64 array of k values, as ``batch_space`` says: a
    ``MultiDiscrete`` space).

    Unlike Gymnasium's, an env that rewrites the array it returned (case C11) is stacked
    correctly, since each frame is copied when it arrives. ``copy.deepcopy`` copies the
    env and the stacking state, and shares the pools (frames never change).

    Args:
        env: environment with any observation space Gymnasium's FrameStackObservation
            takes (a ``Box`` of frames of shape ``S``, a ``Dict``, ``Discrete``, ...).
        stack_size: number of frames k (an integer > 0).
        padding_type: ``"reset"`` (repeat the reset observation, default), ``"zero"``
            (the element of the space closest to zero, as Gymnasium's
            ``create_zero_array``), or a custom observation (an element of
            ``env.observation_space``), as Gymnasium.
        layout: ``"stack"`` (``(k, *S)``, Gymnasium's, default), ``"last"`` or
            ``"first"`` (concatenate each Box leaf on its channel axis; the bounds are
            concatenated).
        lazy: return LazyFrames (default) or, with False, a new ndarray each step (one
            copy out per step) for consumers that insist on ``np.ndarray`` (e.g.
            SB3's ``check_env``).
        pool: the :class:`~lazyframes.FramePool` to store the frames
            in; for a ``Dict``/``Tuple`` space, a dict/tuple like it of pools for its Box
            leaves (None or a missing key: a new pool); default: new pools of
            ``lazyframes.FramePool``.

    Raises:
        TypeError: ``stack_size`` not an integer (Gymnasium's message); ``pool`` not a
            FramePool (or one given for a leaf that is not a Box).
        ValueError: ``stack_size < 1`` or an unknown ``padding_type`` (Gymnasium's
            messages); a layout that does not fit the frames (case C06); a ``pool`` of
            another frame shape or dtype.

    Example:
        >>> env = FrameStackObservation(gym.make("CartPole-v1"), 3, padding_type="zero")
        >>> obs, _ = env.reset(seed=123)
        >>> obs.shape, np.asarray(obs)[0].tolist()
        ((3, 4), [0.0, 0.0, 0.0, 0.0])
    """

    def __init__(self, env: gym.Env, stack_size: int, *, padding_type: str | Any = "reset",
                 layout: str = "stack", lazy: bool = True, pool=None):  # fmt: skip
        # the pool is not recorded: the spec is deep-copied, and a pool cannot be copied
        gym.utils.RecordConstructorArgs.__init__(
            self, stack_size=stack_size, padding_type=padding_type, layout=layout, lazy=lazy
        )
        gym.Wrapper.__init__(self, env)
        k = check_stack_size(stack_size)
        space = env.observation_space
        padding_type, padding_value = check_padding(padding_type, space)
        self.stack_size = k
        self.padding_type = padding_type
        self.padding_value = padding_value
        self.lazy = bool(lazy)
        # "zero" and custom padding: one slot pushed once per Box leaf; "reset" needs none.
        pad = None if padding_type == "reset" else padding_value
        self._setup(space, k, layout, "FrameStackObservation", pool, pad, self.lazy)
        self.observation_space = stacked_space(space, k, layout)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset the env; the observation is padded as ``padding_type`` says."""
        obs, info = self.env.reset(seed=seed, options=options)
        self._ring = self._started(obs, padded=True)
        return self._observe(), info

    def step(self, action):
        """Step the env; returns the next stacked observation and the env's rest."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        ring = self._ring
        if ring is None:
            # step before reset: Gymnasium's queue starts full of padding (zeros for
            # "reset"/"zero"), so the first observation comes after k-1 padding ones
            ring = self._started(self.padding_value, padded=False)
        self._ring = self._shifted(ring, obs)
        return self._observe(), reward, terminated, truncated, info
