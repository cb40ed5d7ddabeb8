"""A replay buffer that stores each frame once: transitions hold frame references, not frames.

``ReplayBuffer`` keeps, per transition, references to the ``k`` frames of the observation
and the ``k`` frames of the next observation (one row of a core ``SlotTable``), the
action, the reward and the episode flags. The frames themselves live once in a
:class:`~lazyframes.FramePool`, refcounted: a frame's memory is reused once no stored
transition and no live observation refers to it. Sampling copies the frames out with one
``SlotTable.gather_pairs`` call per batch, with the dtype conversion and scaling fused
into that copy.

It plays the role of SB3's ``ReplayBuffer(optimize_memory_usage=True)``, Dopamine's
circular replay buffer and cpprb's ``stack_compress``, with exact episode boundaries and
the real next observation of truncated transitions (case C15).

The package is split by concern: ``_ingest`` (input normalisation, geometry, add),
``_sampling`` (draws, n-step windows, output arrays) and ``_checkpoint`` (file format).
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from .. import _common as C
from . import _checkpoint, _dict, _ingest, _sampling
from ._sampling import ReplaySamples

__all__ = ["PrioritizedReplayBuffer", "PrioritizedSamples", "ReplayBuffer", "ReplaySamples"]


class ReplayBuffer:
    """A FIFO replay buffer of transitions whose observations share frames.

    Each transition ``(obs, action, reward, next_obs, terminated, truncated)`` stores
    ``2 k`` slot references (a row of a ``SlotTable``) instead of ``2 k`` frames; a frame
    is stored once however many observations (of however many transitions) contain it.
    At 84x84 uint8 frames and ``k = 4`` a transition costs the frame floor (7,056 bytes)
    plus 53 bytes of tables (SB3's ``optimize_memory_usage=True`` stores one whole
    observation, 28,224 bytes).

    Observations can be given as:

    - :class:`~lazyframes.LazyFrames` (from ``lazyframes.FrameStack`` /
      ``FrameStackObservation``) or a ``lazyframes.vector`` ``LazyBatch``: stored as slot
      references; no frame byte is copied. Unless ``pool`` is given, the buffer uses
      the pool of the first observation it sees (the wrapper's pool).
    - ndarrays of the stacked observation (EnvPool, ale-py, SB3 ``VecFrameStack``):
      split into ``k`` frames according to ``layout`` and pushed into the buffer's pool,
      de-duplicated against the previous observation of the same env (so consecutive
      stacks cost one new frame per step) and against repeated frames within an
      observation (reset padding). LazyFrames of another pool are copied in the same way.

    Dict observations (a Gymnasium ``Dict`` space of image and vector leaves) are dicts
    of such values by key: the frame leaves (``frame_keys``) are stored as above, each in
    a pool of its own, the other leaves as given, one row per transition; :meth:`sample`
    returns dicts with the same keys.

    With ``num_envs > 1`` every argument of :meth:`add` has a leading ``num_envs`` axis
    and each call stores one transition per env, or, with ``env_ids``, one per listed
    env (EnvPool async mode, ale-py ``batch_size < num_envs``, several actors). The
    storage is a ring of ``capacity`` transitions over all env streams, oldest evicted
    first, whatever the interleaving; each transition is linked to the next one of its
    stream, so episode boundaries and n-step windows follow each stream exactly. When
    every env adds at each step, position ``row * num_envs + env`` holds env ``env``'s
    transition of that row (SB3's layout).

    Args:
        capacity: maximum number of transitions stored, over all env streams (rounded
            down to a multiple of ``num_envs``, as SB3's ``buffer_size // n_envs``). The
            tables grow as transitions arrive (doubling, up to ``capacity``), so a large
            capacity costs memory only once it is used.
        num_envs: number of env streams (vector env size, or total envs of several
            actors); :meth:`add`'s ``env_ids`` are in ``[0, num_envs)``.
        n_step: length of the n-step return window (1 = plain one-step transitions).
        gamma: discount factor of the n-step return, in ``[0, 1]``.
        seed: seed of the sampling ``np.random.default_rng(seed)``. Two buffers with
            the same seed that hold the same transitions at the same ring positions
            (the same transitions added in the same order, however they were batched,
            whether as LazyFrames or ndarrays, or restored by :meth:`load`) draw the same
            samples from the same sequence of :meth:`sample` calls.
        action_shape: shape of one action, ``()`` for a discrete action.
        action_dtype: dtype the actions are stored and returned in.
        layout: layout of sampled observations and of ndarray observations given to
            :meth:`add`: ``"stack"`` ``(k, *S)`` (default for ndarrays: Gymnasium,
            EnvPool), ``"first"`` ``(k*C, H, W)`` or ``"last"`` ``(H, W, k*C)`` (SB3
            ``VecFrameStack``, baselines). Default: the layout of the first LazyFrames
            added, or ``"stack"`` for ndarrays.
        stack_size: ``k``; needed for ndarray observations in the ``"first"``/``"last"``
            layouts (in ``"stack"`` it is the leading axis). Checked against LazyFrames.
        pool: the :class:`~lazyframes.FramePool` (of either core) to store the frames
            in; LazyFrames of other pools are copied in. Default: the pool of the first
            LazyFrames/LazyBatch added, or (for ndarrays) a new pool of
            ``lazyframes.FramePool`` owned by the buffer. For Dict observations, a dict
            of pools by frame key (keys left out get the default).
        compress: compress the stored frames (docs/COMPRESSION.md): True (the default
            codec), or a mapping of some of ``codec``, ``level``, ``group`` as
            ``FramePool(..., compress=)`` takes. The buffer makes the pool it uses
            compress (``pool.enable_compression``): the one given, else the wrapper's
            pool it adopts, else its own, whatever the input. A frame is compressed
            once, when only stored transitions refer to it: the frames of the live
            observations (a wrapper's ring) stay uncompressed. Sampled values are the
            same bit for bit. False (default): the pool is left as it is.
        frame_keys: for Dict observations, the keys of the leaves stored as frames
            (de-duplicated, converted by ``sample``'s ``dtype`` and ``scale``); the other
            leaves are stored as given (numeric arrays, e.g. float32 feature vectors) and
            returned as stored. Default: every uint8 leaf with at least 3 dimensions per
            observation (a stack of images, in any layout), decided by the first add.
            ``layout`` and ``stack_size`` apply to every frame leaf.

    Raises:
        ValueError: ``capacity < num_envs``, a non-positive ``num_envs``, ``n_step``
            outside ``[1, capacity]``, ``gamma`` outside ``[0, 1]``, an unknown
            ``layout``, bad ``compress`` options or options other than those ``pool``
            compresses with already.
        TypeError: a non-numeric ``action_dtype``, ``pool`` not a FramePool (or a dict
            of them), a ``compress`` of another type, ``frame_keys`` not strings.

    Example:
        >>> import numpy as np, lazyframes
        >>> pool = lazyframes.FramePool((84, 84), np.uint8)
        >>> s = [pool.push(np.full((84, 84), v, np.uint8)) for v in range(5)]
        >>> rb = ReplayBuffer(1000, seed=0)
        >>> obs, next_obs = pool.lazy(s[:4], layout="stack"), pool.lazy(s[1:], layout="stack")
        >>> rb.add(obs, 1, 0.5, next_obs, False, False)
        >>> batch = rb.sample(1, dtype=np.float32, scale=1 / 255)
        >>> batch.observations.shape, float(batch.next_observations[0, -1, 0, 0] * 255)
        ((1, 4, 84, 84), 4.0)
    """

    def __init__(
        self,
        capacity,
        *,
        num_envs=1,
        n_step=1,
        gamma=0.99,
        seed=None,
        action_shape=(),
        action_dtype=np.int64,
        layout=None,
        stack_size=None,
        pool=None,
        compress=False,
        frame_keys=None,
    ):
        capacity = operator.index(capacity)
        num_envs = operator.index(num_envs)
        n_step = operator.index(n_step)
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        if capacity < num_envs:
            raise ValueError(
                f"capacity ({capacity}) must be at least num_envs ({num_envs}): the buffer "
                f"holds capacity // num_envs rows of one transition per env"
            )
        capacity = capacity // num_envs * num_envs
        if not 1 <= n_step <= capacity:
            raise ValueError(f"n_step must be in [1, capacity={capacity}], got {n_step}")
        gamma = float(gamma)
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        if isinstance(action_shape, (int, np.integer)):
            action_shape = (action_shape,)
        action_shape = tuple(operator.index(d) for d in action_shape)
        if any(d < 0 for d in action_shape):
            raise ValueError(f"action_shape {action_shape} has a negative dimension")
        action_dtype = np.dtype(action_dtype)
        if action_dtype.kind not in "biuf":
            raise TypeError(f"action_dtype must be a numeric dtype, got {action_dtype}")
        if layout is not None and layout not in C.LAYOUTS:
            raise ValueError(f"layout must be one of {C.LAYOUTS}, got {layout!r}")
        if stack_size is not None:
            stack_size = operator.index(stack_size)
            if stack_size < 1:
                raise ValueError(f"stack_size must be at least 1, got {stack_size}")
        _dict.check_pools(pool)
        if frame_keys is not None:
            if isinstance(frame_keys, str):
                frame_keys = (frame_keys,)
            frame_keys = tuple(frame_keys)
            if not frame_keys or not all(isinstance(key, str) for key in frame_keys):
                raise TypeError(f"frame_keys must be a non-empty list of str, got {frame_keys!r}")
        compress = C.compression(compress)
        if compress is not None and pool is not None:
            for p in pool.values() if isinstance(pool, dict) else [pool]:
                p.enable_compression(compress)
        self._compress = compress  # the options the pool is made to compress with, or None
        self._num_envs = num_envs
        self._capacity = capacity
        self._n_step = n_step
        self._gamma = gamma
        self._action_shape = action_shape
        self._action_dtype = action_dtype
        self._layout_opt = layout
        self._k_opt = stack_size
        self._rng = np.random.default_rng(seed)
        # per-transition tables of _rows rows, grown as transitions arrive (_ingest.grow)
        # up to the capacity: a large capacity costs memory only once it is used
        self._rows = 0
        self._actions = np.zeros((0,) + action_shape, action_dtype)
        self._rewards = np.zeros(0, np.float32)
        self._flags = np.zeros(0, np.uint8)
        # the stream of each transition, the next transition of its stream (or -1) and
        # each stream's newest transition (or -1): ring positions
        pos_dtype = np.int32 if self._capacity <= np.iinfo(np.int32).max else np.int64
        self._env = np.zeros(0, np.int32)
        self._next = np.full(0, -1, pos_dtype)
        self._last = np.full(num_envs, -1, pos_dtype)
        self._pos = 0  # next ring position to write
        self._full = False
        self._n_skip = 0  # autoreset placeholders stored
        self._pool: Any = pool  # the pool given, else decided by the first add
        # Dict observations (_dict): None, or key -> FrameLeaf / VectorLeaf from the first add
        self._frame_keys = frame_keys
        self._leaves: Any = None
        # set by the first add: the geometry, and the SlotTable (_rows, 2k) of frame
        # references, obs then next obs, so a row's frames are one block
        self._layout: Any = None
        self._k: Any = None
        self._frame_shape: Any = None
        self._dtype: Any = None
        self._obs_shape: Any = None
        self._table: Any = None
        self._out_cache: dict = {}
        self._fast: Any = None  # _ingest.FastState of the add fast path, cached

    # -- properties -------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Maximum number of transitions stored (a multiple of ``num_envs``)."""
        return self._capacity

    @property
    def num_envs(self) -> int:
        """Number of env streams; an add stores one transition per env (or per env id)."""
        return self._num_envs

    @property
    def n_step(self) -> int:
        """Length of the n-step return window."""
        return self._n_step

    @property
    def gamma(self) -> float:
        """Discount factor of the n-step return."""
        return self._gamma

    @property
    def pool(self):
        """The :class:`~lazyframes.FramePool` holding the frames.

        None before the first add, unless one was given to the constructor. For Dict
        observations, a dict of the frame leaves' pools by key.
        """
        if self._leaves is not None:
            return {key: leaf._pool for key, leaf in _dict.frame_leaves(self).items()}
        return self._pool

    @property
    def layout(self):
        """Layout of sampled observations (None before the first add).

        For Dict observations, a dict of the frame leaves' layouts by key.
        """
        if self._leaves is not None:
            return {key: leaf._layout for key, leaf in _dict.frame_leaves(self).items()}
        return self._layout

    @property
    def observation_shape(self):
        """Shape of one observation, e.g. ``(4, 84, 84)`` (None before the first add).

        For Dict observations, a dict of every leaf's shape by key.
        """
        if self._leaves is not None:
            return {
                key: leaf._obs_shape if isinstance(leaf, _dict.FrameLeaf) else leaf.shape
                for key, leaf in self._leaves.items()
            }
        return self._obs_shape

    @property
    def full(self) -> bool:
        """True once the buffer has wrapped around (every position holds a transition)."""
        return self._full

    def __len__(self) -> int:
        """Transitions stored (autoreset placeholders included, see :meth:`add`)."""
        return self._capacity if self._full else self._pos

    def __repr__(self):
        return (
            f"ReplayBuffer(capacity={self._capacity}, num_envs={self._num_envs}, "
            f"n_step={self._n_step}, len={len(self)}, observation_shape={self.observation_shape}, "
            f"layout={self.layout!r})"
        )

    def memory(self) -> dict:
        """Memory held, for comparing with other buffers.

        Returns:
            dict with ``bytes_held`` (frame memory held by the pool: whole chunks, or in
            a compressing pool the compressed frames, the uncompressed ones and the
            per-frame state; when the buffer shares the wrapper's pool this includes
            the frames of the live observations), ``unique_frames`` (distinct frames
            the stored transitions refer to), ``transitions`` (``len(self)``),
            ``table_bytes`` (the buffer's own arrays: frame references, actions,
            rewards, flags), ``bytes_per_transition`` (``(bytes_held + table_bytes) /
            transitions``; 0.0 when empty), ``frame_bytes`` (bytes of one frame),
            ``compression`` (the pool's options, None when it does not compress),
            ``hot_frames`` and ``cold_frames`` (the pool's frames held uncompressed and
            compressed), ``cold_bytes`` (the compressed frames' bytes) and ``ratio``
            (the uncompressed size of the pool's frames over ``bytes_held``; 0.0 when
            it holds none).
        """
        n = len(self)
        table = sum(
            a.nbytes
            for a in (self._actions, self._rewards, self._flags, self._env, self._next, self._last)
        )
        if self._leaves is not None:
            return _dict.memory(self, table)
        if self._table is None:
            pool = self._pool
            return {
                "bytes_held": 0,
                "unique_frames": 0,
                "transitions": 0,
                "table_bytes": table,
                "bytes_per_transition": 0.0,
                "frame_bytes": 0,
                "compression": self._compress if pool is None else pool.compression,
                "hot_frames": 0,
                "cold_frames": 0,
                "cold_bytes": 0,
                "ratio": 0.0,
            }
        table += self._table.memory()
        uniq = int(np.unique(self._table.ids(np.arange(n))).size) if n else 0
        stats = self._pool.stats()
        held = int(stats["bytes_held"])
        return {
            "bytes_held": held,
            "unique_frames": uniq,
            "transitions": n,
            "table_bytes": table,
            "bytes_per_transition": (held + table) / n if n else 0.0,
            "frame_bytes": int(stats["frame_bytes"]),
            "compression": self._pool.compression,
            "hot_frames": int(stats["hot_frames"]),
            "cold_frames": int(stats["cold_frames"]),
            "cold_bytes": int(stats["cold_bytes"]),
            "ratio": stats["live_bytes"] / held if held else 0.0,
        }

    def add(
        self,
        obs,
        action,
        reward,
        next_obs,
        terminated,
        truncated,
        *,
        autoreset=None,
        env_ids=None,
        final_obs=None,
        final_mask=None,
    ) -> None:
        """Store one transition per env (or per id of ``env_ids``).

        Batched arguments have a leading axis of ``E``: ``num_envs``, or ``len(env_ids)``.
        With ``num_envs == 1`` and no ``env_ids``, arguments without that axis are one
        transition, and a leading axis of 1 is accepted too (``reward`` of shape ``(1,)``,
        a LazyBatch or a list).

        Args:
            obs: the observation the action was taken in: a LazyFrames or an ndarray of
                the observation shape; batched, a ``LazyBatch``, a list of ``E``
                LazyFrames or an ndarray ``(E, *observation_shape)``. Dict observations:
                a dict of such values by key (string keys, fixed by the first add), or
                batched a list of ``E`` dicts.
            action: ``action_shape`` (``(E, *action_shape)``), stored as
                ``action_dtype``: integers into an integer dtype that holds their values
                (never wrapped), any finite number into a float dtype.
            reward: a real number (``(E,)``), stored as float32: finite and within
                float32's range.
            next_obs: the observation after the step, as ``obs``. For an episode that
                ended, the final observation of the episode (Gymnasium's
                ``info["final_obs"]`` under same-step autoreset), never the reset one.
            terminated: bool (``(num_envs,)``): the MDP ended, don't bootstrap.
            truncated: bool (``(num_envs,)``): cut by a time limit; ``next_obs`` is kept
                for bootstrapping.
            autoreset: optional bool (``(num_envs,)``) marking the extra step a
                Gymnasium 1.x vector env takes to reset a finished env under its default
                next-step autoreset: that "transition" joins two episodes, so it is
                stored as a placeholder (it keeps the row layout) that is never sampled
                and ends every n-step window.
            env_ids: optional env streams of these transitions, in ``[0, num_envs)``,
                distinct: a 1-D array (EnvPool's ``info["env_id"]``) for batched
                arguments of ``len(env_ids)`` transitions, or an int for one transition
                given without a leading axis. Default: every env, in order.
            final_obs: optional final observations of the envs whose episode ended,
                stored as ``next_obs`` of the rows ``final_mask`` marks instead of
                ``next_obs``'s, which are stored as they are (no copy of the batch):
                Gymnasium's ``infos["final_obs"]`` under same-step autoreset (a
                ``num_envs`` object array, None for the other envs; of dicts for Dict
                observations), or anything ``next_obs`` takes. Only the marked entries
                are read.
            final_mask: bool (``(num_envs,)``): the rows to take from ``final_obs``
                (``infos["_final_obs"]``, or ``truncations`` to bootstrap only those);
                needed with ``final_obs``. When it marks no env, ``final_obs`` is not
                read (it may be None).

        Raises:
            ValueError: a wrong shape or number of envs, frames of another shape or
                stack size than the buffer's (or than the ``pool`` given to the
                constructor), ndarray observations in the ``"first"`` / ``"last"``
                layout without ``stack_size``, an action out of ``action_dtype``'s
                range, a non-finite action or reward, a reward beyond float32's range,
                ``env_ids`` out of range or repeated, ``final_obs`` without
                ``final_mask`` or without an observation where ``final_mask`` marks;
                for Dict observations, other keys than the first add's, no frame leaf.
            TypeError: a wrong dtype (observations are never cast), non-numeric input,
                a float action for an integer ``action_dtype``, non-boolean flags,
                non-integer ``env_ids``.
            OverflowError: a frame of a pool with more than ``2**31`` slots (the
                buffer's SlotTable stores slot ids as int32).
            Nothing is stored when an error is raised.
        """
        idx = _ingest.add(
            self,
            obs,
            action,
            reward,
            next_obs,
            terminated,
            truncated,
            autoreset=autoreset,
            env_ids=env_ids,
            final_obs=final_obs,
            final_mask=final_mask,
        )
        self._on_add(idx)

    def sample(self, batch_size, *, out=None, dtype=None, scale=None) -> ReplaySamples:
        """Sample ``batch_size`` transitions uniformly, with replacement.

        Only transitions whose n-step window is complete (``n_step`` steps of its env
        stream written) or ended (terminated or truncated) are drawn; autoreset
        placeholders never are. Any ``batch_size`` works once one transition is
        sampleable (as SB3 and baselines: a ``learning_starts`` below the batch size
        is fine); it may exceed ``len(rb)``.

        Args:
            batch_size: number of transitions ``B``, at least 1.
            out: optional pair ``(obs_out, next_obs_out)`` of C-contiguous writeable
                arrays ``(B, *observation_shape)`` (for Dict observations, of dicts of
                them by frame key) to fill (e.g. pinned memory as
                ``torch.empty(..., pin_memory=True).numpy()``); their dtype is the
                output dtype when ``dtype`` is None.
            dtype: output dtype of the observations (default: the frames', e.g. uint8).
            scale: multiply by this after converting (float dtypes only), fused into the
                copy: ``dtype=np.float32, scale=1/255`` gives ``[0, 1]`` floats.

        Returns:
            :class:`ReplaySamples`; for Dict observations ``observations`` and
            ``next_observations`` are dicts ``key -> (B, *shape)`` (the other leaves'
            arrays are fresh copies). Without ``out``, ``observations`` and
            ``next_observations`` are arrays allocated once per ``(B, dtype)`` and
            **overwritten by the next call** with the same ``B`` and dtype; copy them to
            keep them.

        Raises:
            ValueError: an empty buffer, ``batch_size`` < 1, no
                sampleable transition yet, a bad ``out`` (shape, contiguity, read-only,
                overlapping).
            TypeError: an unsupported conversion or ``out`` of the wrong dtype.
        """
        return _sampling.sample(self, batch_size, out=out, dtype=dtype, scale=scale)

    def save(self, path) -> None:
        """Write the buffer to ``path`` (an ``.npz`` archive), atomically.

        The archive holds every live frame once, the slot tables as indices into those
        frames, the actions, rewards, flags, the compression options and the sampling
        RNG state; no pickled objects. A compressing buffer's frames are stored
        compressed with its options (XOR deltas, ``encode_frames``): the file is about
        as large as the buffer's memory. It is written to a temporary file in the same
        directory and renamed over ``path`` (``os.replace``), so a failed or interrupted
        save leaves an existing checkpoint intact. Frames are streamed in chunks: saving needs no
        second copy of the buffer in memory.

        Raises:
            OSError: the directory is not writable.
        """
        _checkpoint.save(self, path)

    @classmethod
    def load(cls, path, *, pool=None) -> ReplayBuffer:
        """Restore a buffer written by :meth:`save`: same transitions, same RNG state.

        The same ``sample`` calls give the same samples as the saved buffer would have,
        and the buffer compresses with the same options (its pool, or ``pool``, is made
        to compress as the constructor's ``compress`` does).

        Args:
            path: the ``.npz`` file.
            pool: the :class:`~lazyframes.FramePool` (of either core) to load the frames
                into (a dict of them by frame key for Dict observations); default: a new
                pool owned by the buffer, of ``lazyframes.FramePool`` (LazyFrames of the
                wrapper's pool added later are then copied in, de-duplicated, see the
                class docs).

        The file is untrusted input: every declared size is checked against the bytes
        it really holds before anything is allocated, and the tables are sized by the
        transitions the file holds (they grow as transitions are added, up to the
        declared capacity), so a load costs time and memory of a small multiple of the
        file; compressed frames are decoded in chunks, which a compressing pool
        compresses again as the load goes, and may decode to at most ``max(1 GiB, 1024 x
        the file's size)``, of which at most ``max(1 GiB, 16 x the file's size)`` is held
        uncompressed at once. Files of format versions 1, 2 and 3 are read.

        Raises:
            TypeError: ``pool`` is not a FramePool.
            ValueError: a missing, truncated, corrupt, crafted or foreign file, one whose
                contents are inconsistent or whose declared sizes exceed its content
                (the message says which), a ``pool`` of another frame shape or dtype, or
                one that compresses with other options than the file's.
        """
        return _checkpoint.load(cls, path, pool=pool)

    def clear(self) -> None:
        """Drop every transition (releasing their frames); keeps geometry, pool and RNG."""
        if self._table is not None:
            self._table.clear()
        for leaf in _dict.frame_leaves(self).values() if self._leaves is not None else ():
            leaf._table.clear()
        self._pos = 0
        self._full = False
        self._n_skip = 0
        self._flags[:] = 0
        self._last[:] = -1

    def __reduce__(self):
        """Pickle as the bytes of a checkpoint (:meth:`save`), restored as :meth:`load` does.

        The copy holds the same transitions and RNG state, compresses with the same
        options (its pickle holds the compressed frames) and owns its pool. Unpickling
        checks the bytes as ``load`` checks a file.

        Example:
            >>> import pickle
            >>> rb = ReplayBuffer(10, seed=0, compress=True)
            >>> frames = np.arange(5 * 84 * 84, dtype=np.uint8).reshape(5, 84, 84)
            >>> rb.add(frames[:4], 1, 0.5, frames[1:], False, False)
            >>> copy = pickle.loads(pickle.dumps(rb))
            >>> copy.memory()["compression"] == rb.memory()["compression"]
            True
            >>> bool((copy.sample(2).observations == rb.sample(2).observations).all())
            True
        """
        return _checkpoint.from_bytes, (type(self), _checkpoint.to_bytes(self))

    # -- hooks for subclasses (PrioritizedReplayBuffer) -----------------------------
    def _on_add(self, idx: np.ndarray) -> None:
        """Called at the end of :meth:`add` with the ring positions written (cannot fail)."""

    def _extra_state(self) -> tuple[dict, dict]:
        """``(meta, arrays)`` a checkpoint adds: meta keys and optional entries."""
        return {}, {}

    def _restore_extra(self, meta: dict, archive) -> None:
        """Called last by :meth:`load` to read what :meth:`_extra_state` wrote."""


from ._prioritized import PrioritizedReplayBuffer, PrioritizedSamples  # noqa: E402
