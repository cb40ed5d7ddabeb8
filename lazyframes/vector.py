"""A frame stacker for Gymnasium vector environments: ``FrameStackObservation`` and ``LazyBatch``.

One :class:`~lazyframes.FramePool` for all sub-environments; the rings of the last k
frames are one :class:`LazyBatch` (``num_envs`` rows of k frames), which is also the
observation returned. Each step is one ``LazyBatch.shift`` call (push the batch of new
frames, shift every ring, restart the rings of new episodes, following the vector env's
autoreset mode: case C14 of docs/CASES.md). Asynchronous vector envs, which return some
envs per step keyed by ``info["env_id"]``, shift those envs' rings only (case C16).

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
        f"Gymnasium {gym.__version__} is installed: python -m pip install 'gymnasium>=1.1' "
        f"(from a clone: python -m pip install -e '.[vector]'). lazyframes.wrappers and "
        f"lazyframes.ReplayBuffer work with Gymnasium 0.29.1"
    ) from None
from gymnasium.vector.utils import batch_space

from . import _core
from .wrappers import (
    LeafStacks,
    _LazyLeaf,
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
        return self.view(self.pool.push_batch(
            self.frames(frames), k=self.k, pad=self.pad_ref(), layout=self.layout
        ))  # fmt: skip

    def shift_batch(self, ring, frames, restart):
        """One core call: push the frames, shift every ring, restart the rings in ``restart``."""
        if type(frames) is not np.ndarray or frames.dtype != self.dtype or self.divisor:
            frames = self.frames(frames)
        return self.view(self.owner(ring).shift(frames, restart, pad=self.pad_ref()))

    def replace(self, ring, idx: np.ndarray, new):
        """``ring`` with the rows ``idx`` replaced by ``new`` (a new LazyBatch)."""
        return self.view(self.owner(ring).replace(idx, self.owner(new)))

    def take(self, ring, idx: np.ndarray):
        """The rows ``idx`` of ``ring``, in that order (a new LazyBatch; no frame copied)."""
        return self.view(self.pool.lazy_batch(self.owner(ring).slots[idx], layout=self.layout))

    def final(self, ring, i: int, frame, lazy: bool):
        """Env ``i``'s final observation: its ring with the episode's last frame."""
        obs = self.view(self.owner(ring)[i].shift(self.frames(frame)))
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
        ring = np.repeat(self._values(values)[:, None], self.k, axis=1)
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

    def take(self, ring: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """The rows ``idx`` of ``ring``, in that order (a copy)."""
        return ring[idx]

    def final(self, ring: np.ndarray, i: int, value, lazy: bool) -> np.ndarray:
        """Env ``i``'s final observation: its ring with the episode's last value."""
        return np.concatenate([ring[i, 1:], self._values(value)[None]])

    def observe(self, ring: np.ndarray, lazy: bool) -> np.ndarray:
        """A copy of the rings (they are the stacker's state)."""
        return ring.copy()

    def release(self) -> None:
        """Nothing to drop."""


def _divisor(envs: VectorEnv, space: gym.Space):
    """The sub-envs' :class:`~lazyframes.ScaledFloatFrame` divisor (all the same), or None."""
    if not (isinstance(space, gym.spaces.Box) and space.dtype == np.float32):
        return None
    get_attr = getattr(envs, "get_attr", None)  # (Sync and Async vector envs have it)
    try:
        found = set(get_attr("lazyframes_divisor")) if get_attr is not None else set()
    except Exception:  # (AttributeError, or a sub-env process's error): not scaled
        return None
    return found.pop() if len(found) == 1 else None  # (None: not uint8 frames)


def _leaf_stackers(space: gym.Space, k: int, layout: str, pool, pad, who: str,
                   divisor=None) -> list:  # fmt: skip
    """A stacker per leaf of ``space``; ``pad`` is the padding value, None for reset padding.

    Raises:
        TypeError: a leaf space other than Box, Discrete, MultiDiscrete and MultiBinary,
            or a pool given for a leaf that is not a Box.
    """
    eager = (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
    stackers: list = []
    for path, leaf in leaves(space):
        leaf_pad = None if pad is None else at(pad, path)
        if isinstance(leaf, gym.spaces.Box):
            box_pool = leaf_pool(pool, path, who)
            stackers.append(_LazyBatchLeaf(leaf, k, layout, box_pool, leaf_pad, who, divisor))
        elif isinstance(leaf, eager):
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
    ``(k, 84, 84)``). ``copy.deepcopy`` copies the vector env and the rings, and shares
    the pools (frames never change).

    **Asynchronous vector envs** (ale-py's ``AtariVectorEnv`` with ``batch_size <
    num_envs``, EnvPool's asynchronous mode) return a batch of some of their envs, each
    row's env in ``info["env_id"]``, and ``step(actions)`` takes one action per row of the
    batch returned last. The stacker (``asynchronous`` True) keeps one ring per env id,
    shifts only the rings of the envs returned and returns their observations in the order
    of ``info["env_id"]``; each step's ``info`` also holds, per row, ``prev_obs`` (the env's
    observation before this step), ``prev_action`` (the action it was last sent) and
    ``autoreset`` (True where the row is no transition), so the batch is stored in one
    ``rb.add`` (the example below; ``SAME_STEP``: with ``final_obs=info["final_obs"],
    final_mask=info["_final_obs"]``). ``reset`` restarts the envs it returns and the
    others when they next appear; :meth:`observations` returns any envs' current
    observations. The protocol in full: case C16 of docs/CASES.md.

    Args:
        envs: a ``gymnasium.vector.VectorEnv``.
        stack_size: frames per observation k (an integer > 0).
        padding_type: ``"reset"`` (default), ``"zero"`` or a custom observation, as
            Gymnasium's FrameStackObservation.
        layout: ``"stack"`` (``(k, *S)``, default), ``"last"`` (SB3's channels-last
            VecFrameStack) or ``"first"`` (SB3's channels-first).
        lazy: return :class:`LazyBatch` (default) or a new ndarray
            ``(num_envs, *observation_shape)`` each step.
        pool: the :class:`~lazyframes.FramePool` (or dict/tuple of pools) to store the
            frames in, as :class:`lazyframes.wrappers.FrameStackObservation`'s.

    Raises:
        TypeError: ``envs`` not a VectorEnv, a leaf space other than those above, a bad
            ``stack_size`` type (Gymnasium's message), or ``pool`` not a FramePool.
        ValueError: ``stack_size < 1``, an unknown ``padding_type``, a layout that does not
            fit the frames, a ``pool`` of another frame shape or dtype; a batch of some of
            the envs without ``info["env_id"]``, or whose env ids are not integers, one per
            row, distinct and in ``[0, num_envs)`` (raised before any ring changes).
        gymnasium.error.ResetNeeded: ``step`` (or a partial reset) before a full reset.

    Example:
        >>> envs = gym.make_vec("CartPole-v1", num_envs=8)
        >>> envs = FrameStackObservation(envs, 4)
        >>> obs, info = envs.reset(seed=0)
        >>> np.asarray(obs).shape
        (8, 4, 4)

        Asynchronously, 4 of ale-py's 8 envs per step, into a replay buffer:

        >>> import lazyframes
        >>> from ale_py.vector_env import AtariVectorEnv
        >>> atari = AtariVectorEnv("pong", num_envs=8, batch_size=4, stack_num=1, num_threads=1)
        >>> envs = FrameStackObservation(atari, 4, layout="first")
        >>> rb = lazyframes.ReplayBuffer(10_000, num_envs=8)
        >>> obs, info = envs.reset(seed=0)
        >>> for _ in range(10):
        ...     actions = np.zeros(len(obs), np.int64)  # your policy(obs): one per row
        ...     obs, rew, term, trunc, info = envs.step(actions)
        ...     prev, acts, ids = info["prev_obs"], info["prev_action"], info["env_id"]
        ...     rb.add(prev, acts, rew, obs, term, trunc, env_ids=ids, autoreset=info["autoreset"])
        >>> obs.shape, len(rb), envs.observations([5, 0]).shape
        ((4, 4, 84, 84), 40, (2, 4, 84, 84))
        >>> envs.close()
    """

    def __init__(self, envs: VectorEnv, stack_size: int, *, padding_type: str | Any = "reset",
                 layout: str = "stack", lazy: bool = True, pool=None):  # fmt: skip
        who = "lazyframes.vector.FrameStackObservation"
        # everything is checked before the wrapper is initialised: a half-made wrapper
        # would be closed by VectorEnv.__del__
        if not isinstance(envs, VectorEnv):
            raise TypeError(f"{who} wraps a gymnasium.vector.VectorEnv, got {type(envs).__name__}")
        k = check_stack_size(stack_size)
        space = envs.single_observation_space
        padding_type, padding_value = check_padding(padding_type, space)
        batch_size = _batch_size(envs)
        stackers = _leaf_stackers(
            space,
            k,
            layout,
            pool,
            None if padding_type == "reset" else padding_value,
            who,
            _divisor(envs, space),
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
        #: whether batches are keyed by ``info["env_id"]`` (some envs per step)
        self.asynchronous = batch_size != envs.num_envs
        self._n = envs.num_envs
        self._ring: list | None = None  # each leaf's rings (num_envs, k): the current observations
        self._autoreset = np.zeros(self._n, np.bool_)  # NEXT_STEP: reset frame comes next
        self._next_step = self.autoreset_mode == AutoresetMode.NEXT_STEP
        self._same_step = self.autoreset_mode == AutoresetMode.SAME_STEP
        # asynchronous: envs reset whose reset frame has not come yet (their rows are
        # stale), the envs of the batch returned last (step's actions are theirs, None:
        # every env in order) and each env's latest action (None until one is recorded)
        self._pending = np.zeros(self._n, np.bool_)
        self._last_ids: np.ndarray | None = None
        self._actions: np.ndarray | None = None
        self.single_observation_space = stacked_space(space, k, layout)
        rows = batch_size if self.asynchronous else self._n
        self.observation_space = batch_space(self.single_observation_space, rows)

    def _observe(self, rings: list):
        """The observation of ``rings`` (one per leaf) as returned."""
        return self._assembled(
            leaf.observe(ring, self.lazy) for leaf, ring in zip(self._leaves, rings, strict=True)
        )

    def _in_order(self, info: dict, rows: int) -> bool:
        """Whether a batch of ``rows`` observations is every env in order (synchronous)."""
        ids = info.get("env_id")
        return rows == self._n and (ids is None or np.array_equal(ids, np.arange(self._n)))

    def _env_ids(self, ids, rows: int | None, what: str = "info['env_id']") -> np.ndarray:
        """``ids`` as checked env ids (intp): integers in ``[0, num_envs)``, distinct.

        ``rows``: how many a batch has (None: any number).

        Raises:
            ValueError: no ids, ids that are not a 1-D integer array of ``rows`` ids, an
                id out of range or given twice.
        """
        if ids is None:
            raise ValueError(
                f"the vector env returned a batch of {rows} observations, not one for each of "
                f"its {self._n} envs in order, without info['env_id']: the stacker keys "
                f"each row's ring by its env id"
            )
        arr = np.asarray(ids)
        if arr.ndim != 1 or arr.dtype.kind not in "iu" or (rows is not None and arr.size != rows):
            raise ValueError(
                f"{what} must be a 1-D integer array of {'the' if rows is None else rows} env "
                f"ids of the batch's rows, got {arr.dtype} of shape {arr.shape}"
            )
        bad = (arr < 0) | (arr >= self._n)
        if bad.any():
            raise ValueError(
                f"{what} {arr.tolist()}: env id {arr[bad][0]} is out of range "
                f"[0, num_envs={self._n})"
            )
        uniq, counts = np.unique(arr, return_counts=True)
        if uniq.size != arr.size:
            raise ValueError(
                f"{what} {arr.tolist()}: env id {uniq[counts > 1][0]} appears more than once "
                f"(one row per env)"
            )
        return arr.astype(np.intp)

    def _recorded(self, actions) -> np.ndarray | None:
        """Each env's latest action once ``actions`` went to the batch returned last.

        None when ``actions`` is not a numeric array with one row per env of that batch
        (then no action is recorded). A new array: the caller commits it.
        """
        try:
            a = np.asarray(actions)
        except (TypeError, ValueError):  # a ragged tuple, say
            return None
        rows = np.arange(self._n) if self._last_ids is None else self._last_ids
        if a.ndim == 0 or a.shape[0] != rows.size or a.dtype.kind not in "biuf":
            return None
        cur = self._actions
        if cur is None or cur.shape[1:] != a.shape[1:]:
            cur = np.zeros((self._n,) + a.shape[1:], a.dtype)
        else:
            cur = cur.astype(np.result_type(cur.dtype, a.dtype), copy=True)
        cur[rows] = a
        return cur

    def observations(self, env_ids=None):
        """The current stacked observations of the envs ``env_ids`` (default: all, in order).

        A :class:`LazyBatch` (an ndarray with ``lazy=False``; dicts or tuples of them for
        ``Dict``/``Tuple`` spaces) with one row per id, in the order given; no frame is
        copied. Without ``env_ids`` and synchronously, the observation ``step`` returned.

        Raises:
            gymnasium.error.ResetNeeded: before the first reset.
            ValueError: ids that are not integers in ``[0, num_envs)``, or of an env that
                has returned no frame since it was reset (asynchronous envs).
        """
        if self._ring is None:
            raise gym.error.ResetNeeded(
                "lazyframes.vector.FrameStackObservation: call reset() before observations()"
            )
        if env_ids is None:
            if not self._pending.any():
                return self._observe(self._ring)
            ids = np.arange(self._n)
        else:
            ids = np.asarray(env_ids)
            ids = self._env_ids(ids.reshape(-1) if ids.ndim == 0 else ids, None, "env_ids")
        if self._pending[ids].any():
            raise ValueError(
                f"env {ids[self._pending[ids]][0]} has returned no observation since it was "
                f"reset (asynchronous envs return reset frames as they come)"
            )
        return self._observe(
            [leaf.take(ring, ids) for leaf, ring in zip(self._leaves, self._ring, strict=True)]
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
        parts = [at(obs, path) for path in self._paths]
        if self.asynchronous or not self._in_order(info, len(parts[0])):
            return self._reset_async(parts, info, mask)
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

    def _reset_async(self, parts: list, info: dict, mask: np.ndarray | None):
        """A reset that returned some envs: restart theirs; the others restart when they come."""
        ids = self._env_ids(info.get("env_id"), len(parts[0]))
        starts = [leaf.start_batch(p) for leaf, p in zip(self._leaves, parts, strict=True)]
        if self._ring is None:  # every row needs frames: the others hold a returned env's
            fill = np.zeros(self._n, np.intp)
            fill[ids] = np.arange(ids.size)
            rings = [leaf.take(s, fill) for leaf, s in zip(self._leaves, starts, strict=True)]
        else:
            rings = [
                leaf.replace(ring, ids, s)
                for leaf, ring, s in zip(self._leaves, self._ring, starts, strict=True)
            ]
        self.asynchronous = True
        reset = slice(None) if mask is None else mask
        self._pending[reset] = True
        self._autoreset[reset] = False
        self._pending[ids] = False
        self._autoreset[ids] = False
        self._ring = rings
        self._last_ids = ids
        return self._observe(starts), info

    def step(self, actions):
        """Step all sub-envs; returns (obs, rewards, terminations, truncations, info)."""
        rings = self._ring
        if rings is None:
            raise gym.error.ResetNeeded(
                "lazyframes.vector.FrameStackObservation: call reset() before step()"
            )
        obs, rewards, terminations, truncations, info = self.env.step(actions)
        parts = [at(obs, path) for path in self._paths]
        if self.asynchronous or not self._in_order(info, len(parts[0])):
            return self._step_async(actions, parts, rewards, terminations, truncations, info)
        done = np.logical_or(terminations, truncations)
        if self._next_step:
            restart = self._autoreset  # the reset frames of the envs that ended last step
        elif self._same_step:
            restart = done
            if done.any():
                info = self._final_obs(info, np.flatnonzero(done), rings, self._n)
        else:
            restart = None
        # per Box leaf, one core call: push the frames, shift the rings, restart new episodes
        self._ring = [
            leaf.shift_batch(ring, part, restart)
            for leaf, ring, part in zip(self._leaves, rings, parts, strict=True)
        ]
        if self._next_step:
            self._autoreset = done  # only once the step has been taken
        return self._observe(self._ring), rewards, terminations, truncations, info

    def _step_async(self, actions, parts, rewards, terminations, truncations, info):
        """A step that returned some envs: shift their rings only, keyed by ``info["env_id"]``.

        Everything is computed (and checked) before the stacker's state changes.
        """
        assert self._ring is not None
        rows = len(parts[0])
        ids = self._env_ids(info.get("env_id"), rows)
        done = np.logical_or(terminations, truncations)
        if done.shape != (rows,):
            raise ValueError(
                f"terminations and truncations have shape {done.shape}, expected ({rows},): "
                f"one per row of the batch"
            )
        fresh = self._pending[ids]  # first frames since a reset: restart, no transition
        skip = fresh | self._autoreset[ids] if self._next_step else fresh
        restart = fresh | done if self._same_step else skip
        leaves_ = self._leaves
        prev = [leaf.take(ring, ids) for leaf, ring in zip(leaves_, self._ring, strict=True)]
        new = [
            leaf.shift_batch(p, part, restart)
            for leaf, p, part in zip(leaves_, prev, parts, strict=True)
        ]
        if self._same_step and done.any():
            info = self._final_obs(info, np.flatnonzero(done), prev, rows)
        rings = [
            leaf.replace(ring, ids, nw)
            for leaf, ring, nw in zip(leaves_, self._ring, new, strict=True)
        ]
        idx = np.flatnonzero(fresh)
        if idx.size:  # a first frame's transition is a placeholder from the frame to itself
            prev = [
                leaf.replace(p, idx, leaf.take(nw, idx))
                for leaf, p, nw in zip(leaves_, prev, new, strict=True)
            ]
        acts = self._recorded(actions)
        # commit
        self.asynchronous = True
        self._ring = rings
        self._pending[ids] = False
        if self._next_step:
            self._autoreset[ids] = done
        self._last_ids = ids
        info = dict(info)
        info["prev_obs"] = self._observe(prev)
        if acts is not None:
            self._actions = acts
            info["prev_action"] = acts[ids]
        info["autoreset"] = skip
        return self._observe(new), rewards, terminations, truncations, info

    def _final_obs(self, info: dict, idx: np.ndarray, rings: list, rows: int) -> dict:
        """SAME_STEP: stack each ending row's final frame onto its ring, in info["final_obs"].

        ``rings``: each leaf's rings before the step, one row per row of the batch.
        """
        final = info.get("final_obs")
        if final is None:
            raise KeyError(
                "the vector env ended an episode in SAME_STEP autoreset mode without "
                "info['final_obs']"
            )
        out = np.full(rows, None, dtype=object)
        for i in idx:
            parts = (
                leaf.final(ring, i, at(final[i], path), self.lazy)
                for leaf, ring, path in zip(self._leaves, rings, self._paths, strict=True)
            )
            out[i] = self._assembled(parts)
        mask = np.zeros(rows, np.bool_)
        mask[idx] = True
        return {**info, "final_obs": out, "_final_obs": mask}

    def close(self, **kwargs):
        """Drop the rings' frames and close the vector env.

        A later ``reset`` starts again with the same padding.
        """
        self._ring = self._last_ids = self._actions = None
        self._pending[:] = False
        self._release()
        return self.env.close(**kwargs)
