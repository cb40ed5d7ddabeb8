"""``ReplayBuffer``: a ring of transitions and one store per observation leaf.

A buffer is a :class:`~._ring.Ring` (positions, env streams, actions, rewards, flags,
n-step windows, draws) and, per observation leaf, a store (:mod:`._store`): a plain
buffer has one frame store, a Dict buffer one per frame key and a vector store per other
key. An add is one path for every kind of buffer: the parser (:mod:`._args`) checks the
arguments, each store prepares its leaf (:meth:`FrameStore.prepare`), the ring and the
stores grow if they must, the ring appends the transitions (the last check: it refuses
values out of range before writing) and each store puts its leaf at the positions the
ring gave. Nothing is stored when an error is raised.
"""

from __future__ import annotations

import operator
import weakref

import numpy as np

from .. import _checks as C
from .. import _core
from . import _archive, _extras
from ._args import Parser, exact_cast, flags_array, numeric, options
from ._ring import Ring
from ._sampler import DrawGate, Sampler
from ._samples import Drawn, Samples, Sequences, constant, draw, fill, filler, outputs
from ._store import FrameStore, check_pool, hold_all, kinds, pool_memory, prepare_all, stores_for


class ReplayBuffer:
    """A FIFO replay buffer of transitions whose observations share frames.

    A transition ``(obs, action, reward, next_obs, terminated, truncated)`` stores frame
    references, and a frame is stored once however many observations contain it: at 84x84
    uint8 and ``k = 4``, the frame floor (7,056 bytes) plus 53 bytes of tables (SB3's
    ``optimize_memory_usage=True``: 28,224 bytes).

    Observations can be given as:

    - :class:`~lazyframes.LazyFrames` (``lazyframes.FrameStack`` /
      ``FrameStackObservation``) or a ``lazyframes.vector`` ``LazyBatch``: stored as slot
      references, no frame byte copied (unless ``pool`` is given, the buffer uses the
      first observation's pool, the wrapper's).
    - ndarrays of the stacked observation (EnvPool, ale-py, SB3 ``VecFrameStack``):
      split into ``k`` frames by ``layout`` and pushed into the buffer's pool,
      de-duplicated against the same env's previous observation (one new frame per step)
      and within an observation (reset padding). LazyFrames of another pool likewise.

    Dict observations (a Gymnasium ``Dict`` space of image and vector leaves) are dicts
    of such values by key: the frame leaves (``frame_keys``) are stored as above, each in
    a pool of its own, the other leaves as given, one row per transition; :meth:`sample`
    returns dicts with the same keys.

    With ``num_envs > 1`` every argument of :meth:`add` has a leading ``num_envs`` axis,
    one transition per env, or per listed env with ``env_ids`` (EnvPool async mode, ale-py
    ``batch_size < num_envs``, several actors). The storage is one ring of ``capacity``
    transitions over all streams, oldest evicted first; each transition is linked to the
    next of its stream, so episodes and n-step windows follow each stream exactly. When
    every env adds each step, position ``row * num_envs + env`` holds env ``env``'s
    transition (SB3's layout).

    Args:
        capacity: maximum number of transitions stored, over all env streams (rounded
            down to a multiple of ``num_envs``, as SB3's ``buffer_size // n_envs``). The
            tables grow as transitions arrive (doubling, up to ``capacity``), so a large
            capacity costs memory only once it is used.
        num_envs: number of env streams (vector env size, or total envs of several
            actors); :meth:`add`'s ``env_ids`` are in ``[0, num_envs)``.
        n_step: length of the n-step return window (1 = plain one-step transitions).
        gamma: discount factor of the n-step return, in ``[0, 1]``.
        seed: seed of the sampling ``np.random.default_rng(seed)``: buffers with the same
            seed and the same transitions at the same positions (however batched, lazy or
            ndarray, or restored by :meth:`load`) draw the same samples.
        action_shape: shape of one action, ``()`` for a discrete action.
        action_dtype: dtype the actions are stored and returned in.
        layout: layout of sampled observations and of ndarray observations given to
            :meth:`add`: ``"stack"`` ``(k, *S)`` (default for ndarrays: Gymnasium,
            EnvPool), ``"first"`` ``(k*C, H, W)`` or ``"last"`` ``(H, W, k*C)`` (SB3
            ``VecFrameStack``, baselines). Default: the layout of the first LazyFrames
            added, or ``"stack"`` for ndarrays.
        stack_size: ``k``; needed for ndarray observations in the ``"first"``/``"last"``
            layouts (in ``"stack"`` it is the leading axis). Checked against LazyFrames.
        pool: the :class:`~lazyframes.FramePool` to store the frames in; LazyFrames of
            other pools are copied in. Default: the pool of the first LazyFrames/LazyBatch
            added, or (for ndarrays) a new pool owned by the buffer. For Dict
            observations, a dict of pools by frame key (keys left out get the default).
        compress: compress the stored frames (docs/COMPRESSION.md): True (the default
            codec, or the options of a given or adopted pool that compresses already) or
            a mapping of some of ``codec``, ``level``, ``group``. The buffer makes the
            pool it uses compress (the one given, the wrapper's it adopts, or its own); a
            frame is compressed once only stored transitions refer to it (a
            wrapper's live frames stay uncompressed); samples are the same bit for bit.
            False (default): the pool is left as it is.
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

    def __init__(self, capacity, *, num_envs=1, n_step=1, gamma=0.99, seed=None, action_shape=(),
                 action_dtype=np.int64, layout=None, stack_size=None, pool=None, compress=False,
                 frame_keys=None, extras=None, start_extras=None):  # fmt: skip
        num_envs, action_shape, action_dtype, layout, stack_size = options(
            num_envs, action_shape, action_dtype, layout, stack_size
        )
        self._extras = _extras.declared(extras, "extras")
        starts = _extras.declared(start_extras, "start_extras")
        clash = {n for n, _, _ in self._extras} & {n for n, _, _ in starts}
        if clash:
            raise ValueError(f"extras and start_extras share the names {sorted(clash)}")
        self._parser = Parser(num_envs, action_shape, action_dtype)
        self._ring = Ring(
            capacity,
            num_envs,
            n_step,
            gamma,
            action_shape,
            action_dtype,
            self._parser.convert,
            self._extras,
        )  # checks capacity, n_step and gamma
        self._starts = None  # start_extras={}: marked starts without values (strided starts)
        if start_extras is not None:
            self._starts = _extras.StartExtras(starts, self._ring.capacity)
        for p in pool.values() if isinstance(pool, dict) else [pool]:
            check_pool(p)
        if frame_keys is not None:
            frame_keys = (frame_keys,) if isinstance(frame_keys, str) else tuple(frame_keys)
            if not frame_keys or not all(isinstance(key, str) for key in frame_keys):
                raise TypeError(f"frame_keys must be a non-empty list of str, got {frame_keys!r}")
        opts = C.compression(compress)  # checked
        # True stays True: a pool given or adopted that compresses already keeps its options
        compress = True if compress is True else opts
        if compress is not None and pool is not None:
            for p in pool.values() if isinstance(pool, dict) else [pool]:
                p.enable_compression(compress)
        self._rng = np.random.default_rng(seed)
        self._action_shape, self._action_dtype = action_shape, action_dtype
        self._layout_opt, self._k_opt, self._compress = layout, stack_size, compress
        self._pool_opt, self._frame_keys = pool, frame_keys
        self._stores: tuple = ()  # set by the first add (or load): one store per leaf
        self._keys: tuple | None = None  # and a Dict buffer's keys of the leaves
        self._frames: tuple = ()  # the indices of the frame stores among the stores
        self._vectors: tuple = ()  # and of the vector stores
        self._tables: tuple = ()  # the frame stores' SlotTables
        self._samplers: weakref.WeakSet = weakref.WeakSet()  # closed by clear()
        self._draws = DrawGate()  # what they owe: made before the buffer changes
        self._hooked = type(self)._on_add is not ReplayBuffer._on_add  # add calls it

    # -- properties -------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Maximum number of transitions stored (a multiple of ``num_envs``)."""
        return self._ring.capacity

    @property
    def num_envs(self) -> int:
        """Number of env streams; an add stores one transition per env (or per env id)."""
        return self._ring.num_envs

    @property
    def n_step(self) -> int:
        """Length of the n-step return window."""
        return self._ring.n_step

    @property
    def gamma(self) -> float:
        """Discount factor of the n-step return."""
        return self._ring.gamma

    @property
    def action_shape(self) -> tuple:
        """Shape of one action."""
        return self._action_shape

    @property
    def action_dtype(self) -> np.dtype:
        """The dtype actions are stored and returned in."""
        return self._action_dtype

    def _by_key(self, fn, frames_only=True):
        """``fn(store)`` of each store: one value for a plain buffer, a dict by key else."""
        if self._keys is None:
            return fn(self._stores[0]) if self._stores else None
        return {
            key: fn(s)
            for key, s in zip(self._keys, self._stores, strict=True)
            if not frames_only or isinstance(s, FrameStore)
        }

    @property
    def pool(self):
        """The frames' pool (a dict by key for Dict; before the first add, the one given)."""
        return self._by_key(lambda s: s.pool) if self._stores else self._pool_opt

    @property
    def layout(self):
        """Layout of sampled observations (None before the first add); by key for Dict."""
        return self._by_key(lambda s: s.geometry.layout)

    @property
    def stack_size(self):
        """``k``, the frames per observation (None before the first add); by key for Dict."""
        return self._by_key(lambda s: s.geometry.k)

    @property
    def observation_shape(self):
        """Shape of one observation, e.g. ``(4, 84, 84)`` (None before the first add); by key."""
        return self._by_key(
            lambda s: s.geometry.obs_shape if isinstance(s, FrameStore) else s.shape,
            frames_only=False,
        )

    @property
    def full(self) -> bool:
        """True once the buffer has wrapped around (every position holds a transition)."""
        return self._ring.full

    @property
    def position(self) -> int:
        """The ring position the next transition is written to (0 again after ``capacity``).

        Ring positions are what :meth:`gather` takes and a uniform buffer's
        ``Samples.indices`` hold: transitions land at ``position``, ``position + 1``, ...
        in the order :meth:`add` stores them.
        """
        return self._ring.pos

    def __len__(self) -> int:
        """Transitions stored (autoreset placeholders included, see :meth:`add`)."""
        return self._ring.size

    def __repr__(self):
        return (
            f"{type(self).__name__}(capacity={self.capacity}, num_envs={self.num_envs}, "
            f"n_step={self.n_step}, len={len(self)}, observation_shape={self.observation_shape}, "
            f"layout={self.layout!r})"
        )

    def memory(self) -> dict:
        """Memory held, for comparing with other buffers.

        Returns:
            dict with ``bytes_held`` (the pool's frame memory: whole chunks, or compressed
            frames, uncompressed ones and per-frame state; with the wrapper's pool, the
            live observations' frames too), ``unique_frames`` (distinct frames stored
            transitions refer to), ``transitions``, ``table_bytes`` (the buffer's own
            arrays), ``bytes_per_transition`` (``(bytes_held + table_bytes) /
            transitions``, 0.0 when empty), ``frame_bytes``, ``compression`` (the pool's
            options or None), ``hot_frames``/``cold_frames`` (uncompressed/compressed),
            ``pending_frames`` (hot frames waiting to be compressed, :meth:`flush`),
            ``cold_bytes``, ``slot_state_bytes`` (a compressing pool's per-slot state, in
            ``bytes_held``) and ``ratio`` (uncompressed size over ``bytes_held``, 0.0 when
            empty). Dict observations: summed over the frame leaves' pools.
        """
        self._draws.wait()
        n = len(self)
        table = self._ring.memory() + sum(s.table_bytes() for s in self._stores)
        m = pool_memory([s for s in self._stores if isinstance(s, FrameStore)], n)
        if m["compression"] is None and not self._stores:  # no add yet: the options
            p = self._pool_opt
            m["compression"] = (
                p.compression if isinstance(p, _core.FramePool) else C.compression(self._compress)
            )
        per = (m["bytes_held"] + table) / n if n else 0.0
        return {**m, "transitions": n, "table_bytes": table, "bytes_per_transition": per}

    # -- adding -----------------------------------------------------------------------
    def add(self, obs, action, reward, next_obs, terminated, truncated, *, autoreset=None,
            env_ids=None, final_obs=None, final_mask=None, extras=None, start_extras=None,
            starts=None) -> None:  # fmt: skip
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
            autoreset: optional bool (``(num_envs,)``) marking the reset step of a
                Gymnasium 1.x vector env under next-step autoreset: stored as a
                placeholder (keeping the row layout), never sampled, ending every n-step
                window.
            env_ids: optional env streams of these transitions, in ``[0, num_envs)``,
                distinct: a 1-D array (EnvPool's ``info["env_id"]``) for batched
                arguments of ``len(env_ids)`` transitions, or an int for one transition
                given without a leading axis. Default: every env, in order.
            final_obs: optional final observations, stored as the ``next_obs`` of the rows
                ``final_mask`` marks (the other rows' ``next_obs`` stored as given, no copy
                of the batch): Gymnasium's ``infos["final_obs"]`` under same-step
                autoreset (a ``num_envs`` object array, None for the other envs), or
                anything ``next_obs`` takes. Only the marked entries are read.
            final_mask: bool (``(num_envs,)``): the rows to take from ``final_obs``
                (``infos["_final_obs"]``, or ``truncations``); needed with ``final_obs``,
                which is not read (may be None) when it marks no env.
            extras: the per-step extras declared, ``{name: value}`` (``(E, *shape)``),
                cast exactly as actions are; a name left out is stored as zeros.
            start_extras: the per-start extras declared, ``{name: value}`` as ``extras``,
                stored for the transitions ``starts`` marks (windows start only there).
            starts: bool (``(E,)``): the transitions that are window starts (default:
                every one, when ``start_extras`` is given).

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
        if self._draws.owed:  # a sampler's draw asked for before this add
            self._draws.wait()
        envs, E, batched, values, obs, next_obs, final, keys = self._parser.parse(
            obs, action, reward, next_obs, terminated, truncated, autoreset, env_ids,
            final_obs, final_mask,
        )  # fmt: skip
        stores = self._stores or stores_for(
            keys, obs, batched, self.capacity, self._pool_opt, self._frame_keys,
            layout=self._layout_opt, stack_size=self._k_opt, compress=self._compress,
        )  # fmt: skip
        if self._extras or extras is not None:
            values += self._extra_values(extras, E, batched)
        marked = start = None
        if self._starts is not None or start_extras is not None or starts is not None:
            marked, start = self._start_values(start_extras, starts, E, batched)
        ring, frames, tables, vectors = self._ring, self._frames, self._tables, self._vectors
        parts = prepare_all(stores, obs, next_obs, final, E, batched, ring, envs, values)
        if not self._stores:  # the first add: the new frame stores' tables
            frames, vectors, tables = kinds(stores)
        if vectors:  # Dict observations: their plain arrays grow before the ring appends
            rows = ring.rows_for(E)
            for i in vectors:
                stores[i].grow(rows, parts[i])
            pos = ring.append(envs, values, tables, tuple([parts[i] for i in frames]))
            idx = [(pos + j) % ring.capacity for j in range(E)]
            for i in vectors:
                stores[i].put(idx, parts[i])
        else:
            pos = ring.append(envs, values, tables, parts)
        if self._starts is not None:  # (reserved by _start_values: cannot fail)
            self._starts.put((pos + np.arange(E)) % ring.capacity, start, marked)
        if not self._stores:  # the first add: the buffer keeps its stores
            self._keep(stores, keys)
        hold_all(stores, parts, next_obs, envs)
        if self._hooked:
            self._on_add(pos, E)

    def _extra_values(self, extras, E: int, batched: bool) -> tuple:
        if not self._extras:
            raise TypeError("extras: this buffer declares none (ReplayBuffer(..., extras=...))")
        return _extras.values(self._extras, extras, E, batched, "extras")

    def _start_values(self, start_extras, starts, E: int, batched: bool) -> tuple:
        """``(marked, arrays)`` of an add's window starts, room made for them (or None, None)."""
        if self._starts is None:
            raise TypeError(
                "start_extras, starts: this buffer declares no start_extras "
                "(ReplayBuffer(..., start_extras=...))"
            )
        if start_extras is None and starts is None:
            return None, None
        marked = np.ones(E, bool)
        if starts is not None:
            marked = flags_array(starts, "starts", (E,) if batched else ()).reshape(E)
        arrays = _extras.values(self._starts.spec, start_extras, E, batched, "start_extras")
        self._starts.reserve(int(marked.sum()))
        return marked, arrays

    # -- sampling ---------------------------------------------------------------------
    def sample(self, batch_size, *, out=None, dtype=None, scale=None) -> Samples:
        """Sample ``batch_size`` transitions uniformly, with replacement.

        Only transitions whose n-step window is complete or ended (terminated or
        truncated) are drawn, autoreset placeholders never. Any ``batch_size`` works once
        one transition is sampleable (it may exceed ``len(rb)``, as in SB3 and baselines).

        Args:
            batch_size: number of transitions ``B``, at least 1.
            out: optional pair ``(obs_out, next_obs_out)`` of C-contiguous writeable
                arrays ``(B, *observation_shape)`` (Dict: dicts of them by frame key) to
                fill, e.g. pinned memory; their dtype is the output dtype by default.
            dtype: output dtype of the observations (default: the frames', e.g. uint8).
            scale: multiply by this after converting (float dtypes only), fused into the
                copy: ``dtype=np.float32, scale=1/255`` gives ``[0, 1]`` floats.

        Returns:
            :class:`Samples` (Dict observations: dicts ``key -> (B, *shape)``, the other
            leaves' arrays fresh copies). Without ``out``, the observation arrays are
            allocated once per ``(B, dtype)`` and **overwritten by the next call** with
            the same ``B`` and dtype; copy them to keep them.

        Raises:
            ValueError: an empty buffer, ``batch_size`` < 1, no sampleable transition yet,
                a bad ``out`` (shape, contiguity, read-only, overlapping).
            TypeError: an unsupported conversion or ``out`` of the wrong dtype.
        """
        if self._draws.owed:  # a sampler's draw asked for before
            self._draws.wait()
        B = self._batch_size(batch_size)
        outs = outputs(self._stores, self._frames, self._keys, B, out, dtype, scale)
        return fill(self._drawn(B, {}), self._keys, outs)

    def sampler(self, batch_size, *, prefetch=2, dtype=None, scale=None, out=None) -> Sampler:
        """An iterator of batches drawn as :meth:`sample` draws them, gathered in a thread.

        The sampler's thread draws each batch and copies (or decodes) its frames into
        preallocated arrays with the GIL released while the caller learns. With no add in
        between, it yields the batches successive ``sample(batch_size, dtype=dtype,
        scale=scale)`` calls would, whatever the thread's timing.

        **A batch is the buffer at its draw.** ``next()`` asks for the batch it returns
        ``prefetch`` calls later; every call that changes the buffer or reads what a draw
        reads (:meth:`add`, :meth:`sample`, :meth:`gather`, :meth:`clear`, :meth:`flush`,
        :meth:`save`, :meth:`memory`, ``update_priorities``) first makes the draws asked
        for before it that the sampler's thread has not made yet (it never waits for a
        copy). A draw reads the fields and pins the frames: later adds do not change the
        batch.

        **Observations are valid until the** ``(prefetch + 1)``-th next ``next()`` (the
        ``2 * prefetch + 1`` sets of arrays are refilled in turn): copy what you keep
        longer. The other fields are fresh arrays.

        :meth:`Sampler.close`, ``with``, dropping it or :meth:`clear` stop it (then
        StopIteration). A draw that raises (nothing sampleable yet) is raised by the
        ``next()`` of its batch, and the sampler goes on; an error in the copy is raised
        by the next ``next()`` and stops it. Use it from the thread that adds.

        Args:
            batch_size: number of transitions ``B`` per batch, at least 1.
            prefetch: batches gathered ahead of the one returned, at least 0 (0: each is
                copied when asked for, while the caller waits).
            dtype: output dtype of the observations, as :meth:`sample`.
            scale: as :meth:`sample`.
            out: optional list of ``2 * prefetch + 1`` pairs like :meth:`sample`'s ``out``,
                all apart: batch ``j`` (from 0) is gathered into ``out[j % len(out)]`` from
                the ``next()`` call ``j - prefetch`` on (the first ``prefetch``: from the
                sampler's making) until the one that returns it (``lazyframes.serve``).

        Returns:
            A :class:`~lazyframes.replay.Sampler`, an iterator of :class:`Samples`.

        Raises:
            ValueError: an empty buffer, ``batch_size`` < 1, ``prefetch`` < 0, no
                sampleable transition yet (when ``prefetch`` > 0), a bad ``out``.
            TypeError: an unsupported conversion, non-integer ``batch_size`` or
                ``prefetch``, a bad ``out``. Nothing is drawn and no thread started then.

        Example:
            >>> rb = ReplayBuffer(1000, seed=0)
            >>> frames = np.repeat(np.arange(30, dtype=np.uint8), 84 * 84).reshape(30, 84, 84)
            >>> for t in range(20):  # frame t is filled with t; transition t's action is t
            ...     rb.add(frames[t : t + 4], t, 1.0, frames[t + 1 : t + 5], False, False)
            >>> with rb.sampler(32, prefetch=2) as batches:
            ...     for t, batch in zip(range(20, 25), batches):
            ...         assert (batch.observations[:, 0, 0, 0] == batch.actions).all()
            ...         rb.add(frames[t : t + 4], t, 1.0, frames[t + 1 : t + 5], False, False)
            >>> batch.observations.shape, len(rb), int(batch.actions.max()) < 22
            ((32, 4, 84, 84), 25, True)
        """
        return self._sampler(batch_size, prefetch, dtype, scale, {}, out)

    def _sampler(self, batch_size, prefetch, dtype, scale, options: dict, out=None) -> Sampler:
        """A sampler of ``_drawn(B, options)`` (the options checked by the caller)."""
        self._draws.wait()
        P, out = self._prefetch(prefetch, out)
        B, keys = self._batch_size(batch_size), self._keys
        sets = [
            outputs(self._stores, self._frames, keys, B, o, dtype, scale, fresh=True) for o in out
        ]
        _core.check_apart([a for outs in sets for o in outs for a in o[:2]])
        sampler = Sampler(
            lambda: self._drawn(B, options), self._draws,
            filler(keys), P, sets,
        )  # fmt: skip
        self._samplers.add(sampler)
        return sampler

    @staticmethod
    def _prefetch(prefetch, out) -> tuple:
        """``(prefetch, out)`` of a sampler, checked: ``out`` one entry per output set."""
        P = operator.index(prefetch)
        if P < 0:
            raise ValueError(f"prefetch must be at least 0, got {P}")
        if out is None:
            return P, [None] * (2 * P + 1)  # fresh arrays
        if not isinstance(out, (list, tuple)) or len(out) != 2 * P + 1:
            raise TypeError(f"out must be a list of 2 * prefetch + 1 = {2 * P + 1} output sets")
        return P, out

    def gather(self, indices, *, out=None, dtype=None, scale=None) -> Samples:
        """The samples of the stored transitions at ring positions ``indices``.

        What :meth:`sample` returns for positions the caller chose (SB3's buffers draw
        their own), unchecked for sampleability (an open n-step window ends at its
        stream's newest transition, as in SB3). ``out``, ``dtype``, ``scale``: as there.

        Raises:
            IndexError: a position outside ``[0, len(rb))``. TypeError, ValueError: as
                :meth:`sample`.
        """
        self._draws.wait()
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu" or idx.ndim != 1:
            raise TypeError(f"indices must be a 1-D array of integers, got {idx.dtype} {idx.shape}")
        self._batch_size(max(idx.size, 1))  # a buffer to read from
        B = idx.size
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"indices out of range [0, {len(self)})")
        idx = idx.astype(np.int64)
        outs = outputs(self._stores, self._frames, self._keys, B, out, dtype, scale)
        drawn = draw(self._ring, self._stores, idx, idx, constant(B, 1.0))
        return fill(drawn, self._keys, outs)

    def sample_sequences(self, batch_size, length, *, burn_in=0, within_episode=False,
                         frames=False, out=None, dtype=None, scale=None) -> Sequences:  # fmt: skip
        """Sample ``batch_size`` windows of consecutive steps of one env stream each.

        For recurrent (R2D2), self-predictive (SPR, BBF) and model-based agents: a window
        is ``burn_in + length`` steps, ``burn_in`` first, drawn uniformly (with
        replacement) over its valid first steps: a transition (not an autoreset
        placeholder) whose stream holds the window's other steps (a window never runs past
        the newest step) and, with ``within_episode``, whose whole window is one episode.
        Otherwise a window runs on into the next episode and ``mask`` marks where (see
        :class:`Sequences` and docs/SEQUENCES.md). One copy call writes the observations.

        Args:
            batch_size: windows ``B``, at least 1.
            length: steps after the burn-in, at least 1.
            burn_in: steps before them (returned too), at least 0.
            within_episode: draw only windows within one episode (every ``mask`` 1.0).
            frames: also return each window's ``T + k - 1`` frames, written once, and the
                observations as a view of them (needs ``within_episode``).
            out: an array to fill: the observations ``(B, T, *observation_shape)``, or
                with ``frames`` the frames ``(B, T + k - 1, *frame_shape)`` (Dict
                observations: a dict of them by frame key). Without it, an
                array made once per shape and dtype, **overwritten by the next call** of
                the same shape and dtype (as :meth:`sample`'s).
            dtype: output dtype of the observations, as :meth:`sample`.
            scale: as :meth:`sample`.

        Raises:
            ValueError: an empty buffer, bad sizes, no valid window yet, ``frames`` without
                ``within_episode`` or with stacks that share no frames, a bad ``out``.
            TypeError: non-integer sizes, a bad ``out`` or conversion.
        """
        return self._sequences(batch_size, length, burn_in, within_episode, frames, out, dtype,
                               scale, {})  # fmt: skip

    def _sequences(self, batch_size, length, burn_in, within_episode, frames, out, dtype, scale,
                   options: dict) -> Sequences:  # fmt: skip
        """:meth:`sample_sequences` with a subclass's ``options`` (``beta``) for its draw."""
        self._draws.wait()
        B, T, burn_in = self._window_args(batch_size, length, burn_in, within_episode, frames)
        outs = self._window_outputs(B, T, out, frames, dtype, scale)
        drawn = self._drawn_windows(B, T, burn_in, within_episode, frames, options)
        return self._fill_windows(drawn, outs)

    def _window_outputs(self, B: int, T: int, out, frames: bool, dtype, scale,
                        fresh: bool = False) -> list:  # fmt: skip
        """Per frame store, the checked ``(array, dtype)`` windows fill (``out``: by frame key)."""
        if self._keys is None:
            return [self._stores[0].window_output(B, T, out, frames, dtype, scale, fresh)]
        fkeys = [self._keys[i] for i in self._frames]
        if out is not None and not (isinstance(out, dict) and out.keys() == set(fkeys)):
            raise TypeError(f"out must be a dict of arrays by frame key {fkeys}")
        outs = [
            self._stores[i].window_output(
                B, T, None if out is None else out[self._keys[i]], frames, dtype, scale, fresh
            )
            for i in self._frames
        ]
        _core.check_apart([o[0] for o in outs])
        return outs

    def _window_args(self, batch_size, length, burn_in, within, frames) -> tuple:
        """``(B, T, burn_in)`` of a window draw's arguments, checked."""
        B = self._batch_size(batch_size)
        length, burn_in = operator.index(length), operator.index(burn_in)
        if length < 1 or burn_in < 0:
            raise ValueError(f"length must be >= 1 and burn_in >= 0, got {length} and {burn_in}")
        if frames and not within:
            raise ValueError(
                "frames=True needs within_episode=True: only an episode's stacks share frames"
            )
        return B, burn_in + length, burn_in

    def _drawn_windows(self, B: int, T: int, burn_in: int, within: bool, frames: bool,
                       options: dict) -> tuple:  # fmt: skip
        """``(owner, frames, batch)``: windows drawn now, their frames pinned (``owner``).

        ``batch`` is their :class:`Sequences` but its observations (and frames):
        :meth:`_fill_windows` copies them out, at once or in a sampler's thread.
        """
        ring, flat = self._ring, None
        starts = None if self._starts is None else self._starts.marked()
        with self._draws.drawing:
            pos, weights = self._pick_windows(B, T, within, starts, options)
            flat = pos.reshape(-1)
            owners = [  # frames pinned; a Dict's vector leaves copied
                s.pin_windows(pos, frames) if type(s) is FrameStore
                else s.gather(flat, flat)[0].reshape(B, T, *s.shape)
                for s in self._stores
            ]  # fmt: skip
        _, actions, dones, rewards, truncs, discounts = ring.fields(flat)
        rewards, dones, truncs, discounts = (
            a.reshape(B, T) for a in (rewards, dones, truncs, discounts)
        )
        extras = ring.extras(pos)
        if self._starts is not None:
            extras.update(self._starts.get(pos[:, 0]))
        steps = self._step_ids(pos)
        batch = Sequences(
            None, actions.reshape(B, T, *self._action_shape), rewards, dones, truncs, discounts,
            ring.episode_mask(pos).astype(np.float32), steps[:, 0].copy(), weights, steps,
            extras, None, burn_in,
        )  # fmt: skip
        return owners, frames, batch

    def _fill_windows(self, drawn: tuple, outs: list) -> Sequences:
        """The :class:`Sequences` of windows drawn (:meth:`_drawn_windows`), copied out.

        ``outs``: :meth:`_window_outputs`' ``(array, dtype, scale)`` per frame store.
        """
        owners, frames, batch = drawn
        obs, arrays = list(owners), []
        for i, (arr, dst, scale) in zip(self._frames, outs, strict=True):
            obs[i] = self._stores[i].fill_windows(owners[i], arr, frames, dst, scale)
            arrays.append(arr)
        if self._keys is None:
            return batch._replace(observations=obs[0], frames=arrays[0] if frames else None)
        fkeys = [self._keys[i] for i in self._frames]
        return batch._replace(
            observations=dict(zip(self._keys, obs, strict=True)),
            frames=dict(zip(fkeys, arrays, strict=True)) if frames else None,
        )

    def sequence_sampler(self, batch_size, length, *, burn_in=0, within_episode=False,
                         frames=False, prefetch=2, dtype=None, scale=None,
                         out=None) -> Sampler:  # fmt: skip
        """An iterator of :meth:`sample_sequences`' batches, gathered ahead in a thread.

        As :meth:`sampler` is to :meth:`sample`: with no add in between, the batches
        successive ``sample_sequences`` calls with these arguments would return; a batch
        is the buffer at its draw; its observations (and frames) are valid until the
        ``(prefetch + 1)``-th next ``next()``. ``out``: a list of ``2 * prefetch + 1``
        arrays as ``sample_sequences``' ``out``. Raises as :meth:`sampler` and
        :meth:`sample_sequences`.
        """
        return self._sequence_sampler(batch_size, length, burn_in, within_episode, frames,
                                      prefetch, dtype, scale, out, {})  # fmt: skip

    def _sequence_sampler(self, batch_size, length, burn_in, within, frames, prefetch, dtype,
                          scale, out, options: dict) -> Sampler:  # fmt: skip
        self._draws.wait()
        B, T, burn_in = self._window_args(batch_size, length, burn_in, within, frames)
        P, out = self._prefetch(prefetch, out)
        sets = [self._window_outputs(B, T, o, frames, dtype, scale, fresh=True) for o in out]
        _core.check_apart([o[0] for outs in sets for o in outs])
        sampler = Sampler(
            lambda: self._drawn_windows(B, T, burn_in, within, frames, options), self._draws,
            self._fill_windows, P, sets,
        )  # fmt: skip
        self._samplers.add(sampler)
        return sampler

    def _pick_windows(self, B: int, T: int, within: bool, starts, options: dict) -> tuple:
        """``(positions (B, T), weights)`` of one draw: uniform, every weight 1.

        ``starts``: None, or the positions windows may start at (start extras stored).
        """
        return self._ring.windows(self._rng, B, T, within, starts), constant(B, 1.0)

    def _step_ids(self, pos: np.ndarray) -> np.ndarray:
        """The ids of the steps at ring positions ``pos``: the positions."""
        return pos

    def update_extras(self, name: str, indices, values) -> None:
        """Rewrite the extras ``name`` of the steps ``indices`` (MuZero's reanalyse).

        Args:
            name: a declared per-step or per-start extra.
            indices: step ids, any shape (``Sequences.steps``, ``Sequences.indices``): ring
                positions, or a :class:`PrioritizedReplayBuffer`'s transition numbers; for
                a per-start extra, steps that are window starts.
            values: ``(*indices.shape, *shape)``, cast exactly as :meth:`add` casts them.

        Raises:
            KeyError: an undeclared name. ValueError: an index out of range (or evicted),
                not a window start for a per-start extra, a wrong shape, a value out of
                range or not finite. TypeError: a dtype the extra cannot hold. Nothing is
                written then.
        """
        self._draws.wait()
        st = self._starts
        decls = self._extras + (() if st is None else st.spec)
        names = [d[0] for d in decls]
        if name not in names:
            raise KeyError(f"no extra {name!r}: declared {names}")
        j = names.index(name)
        _, shape, dtype = decls[j]
        pos = self._step_positions(indices)
        v = exact_cast(numeric(values, name), dtype, name)
        if v.shape != np.shape(indices) + shape:
            raise ValueError(f"values has shape {v.shape}, expected {np.shape(indices) + shape}")
        v = np.ascontiguousarray(v.reshape((pos.size, *shape)))
        if st is not None and j >= len(self._extras):
            st.update(j - len(self._extras), pos, v)
        else:
            self._ring.put(3 + j, pos, v)

    def _step_positions(self, indices) -> np.ndarray:
        """The ring positions (flat int64) of step ids ``indices``, checked stored."""
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu":
            raise TypeError(f"indices must be integers, got dtype {idx.dtype}")
        flat = idx.reshape(-1).astype(np.int64)
        if flat.size and (flat.min() < 0 or flat.max() >= len(self)):
            raise ValueError(f"indices out of range [0, {len(self)})")
        return flat

    def _drawn(self, batch_size: int, options: dict) -> Drawn:
        """One batch drawn now (checked arguments): fields read, frames pinned.

        ``sample``'s draw and a sampler's; ``options`` are a subclass's (``beta``). Under
        the gate's drawing lock: a fork waits for it (the RNG's lock is free in the child).
        """
        with self._draws.drawing:
            pos, indices, weights = self._pick(batch_size, options)
            return draw(self._ring, self._stores, pos, indices, weights)

    def _pick(self, batch_size: int, options: dict) -> tuple:
        """``(positions, indices, weights)`` of one draw: uniform, every weight 1."""
        idx = self._ring.draw(self._rng, batch_size)
        return idx, idx, constant(batch_size, 1.0)

    def _batch_size(self, batch_size) -> int:
        B = operator.index(batch_size)
        if not self._ring.size:
            raise ValueError("cannot sample from an empty ReplayBuffer")
        if B < 1:
            raise ValueError(f"batch_size must be at least 1, got {B}")
        return B

    # -- whole-buffer operations ------------------------------------------------------
    def flush(self) -> None:
        """Compress now every frame of a compressing buffer that only the buffer holds.

        A frame is compressed at the next :meth:`add`, :meth:`sample`, :meth:`gather` or
        :meth:`save` once only stored transitions refer to it (``memory()["pending_frames"]``
        counts those waiting), except each stream's newest ndarray observation, kept for
        its next add to share frames with: this call compresses those too (the stream's
        next add then stores its frames anew). A buffer that does not compress only lets
        them go.

        Raises:
            MemoryError: no memory to compress (the frames wait, uncompressed).
        """
        self._draws.wait()
        for i in self._frames:
            self._stores[i].release()
            self._stores[i].pool.flush()

    def clear(self) -> None:
        """Drop every transition (and its frames), keep geometry, pool, RNG; close samplers."""
        self._draws.wait()
        for sampler in list(self._samplers):
            sampler.close()
        self._ring.clear()
        for s in self._stores:
            s.clear()
        if self._starts is not None:
            self._starts.clear()

    def save(self, path) -> None:
        """Write the buffer to ``path`` (an ``.npz`` archive), atomically.

        Every live frame is stored once (compressed with the buffer's options when it
        compresses), with the tables, the compression options and the sampling RNG state;
        no pickled objects (docs/CHECKPOINTS.md). Written to a temporary file in the same
        directory (``<name>.<pid>.<random>.tmp``) and renamed over ``path``, so a failed
        save leaves an existing checkpoint intact, and the temporary file of a save whose
        process was killed is removed by the next save to ``path``; frames are streamed,
        with no second copy of the buffer.

        Raises:
            OSError: the directory is not writable.
        """
        _archive.save(self._checkpoint(), path)

    @classmethod
    def load(cls, path, *, pool=None) -> ReplayBuffer:
        """Restore a buffer written by :meth:`save`: same transitions, same RNG state.

        The same ``sample`` calls give the same samples as the saved buffer would have,
        and it compresses with the same options.

        Args:
            path: the ``.npz`` file.
            pool: the :class:`~lazyframes.FramePool` to load the frames into (Dict: by
                frame key); default: a new pool the buffer owns (a wrapper's LazyFrames
                added later are copied in, de-duplicated).

        The file is untrusted input: every declared size is checked against the bytes it
        holds before anything is allocated, so a load costs time and memory of a small
        multiple of the file (docs/CHECKPOINTS.md gives the bounds). Files of format
        versions 1 to 6 are read.

        Raises:
            TypeError: ``pool`` is not a FramePool.
            ValueError: a missing, truncated, corrupt, crafted or foreign file, one whose
                contents are inconsistent or whose declared sizes exceed its content
                (the message says which), a ``pool`` of another frame shape or dtype, or
                one that compresses with other options than the file's.
        """
        return _archive.load(path, cls, pool)

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
        return _from_bytes, (type(self), _archive.to_bytes(self._checkpoint()))

    def _checkpoint(self) -> _archive.State:
        """What a checkpoint holds of this buffer (its waiting frames compressed first)."""
        self._draws.wait()
        for i in self._frames:
            self._stores[i].pool.flush()
        bg = self._rng.bit_generator
        meta = {
            "capacity": self.capacity, "num_envs": self.num_envs, "n_step": self.n_step,
            "gamma": self.gamma, "action_shape": list(self._action_shape),
            "action_dtype": self._action_dtype.str, "layout_opt": self._layout_opt,
            "stack_size_opt": self._k_opt, "rng": {"name": type(bg).__name__, "state": bg.state},
        }  # fmt: skip
        extra_meta, extra = self._extra_state()
        meta.update(extra_meta)
        if self._extras:
            meta["extras"] = _extras.meta(self._extras)
        if self._starts is not None:
            meta["start_extras"] = _extras.meta(self._starts.spec)
            extra = {**extra, **self._starts.state()}
        compression = (
            self.memory()["compression"] if self._stores else C.compression(self._compress)
        )
        return _archive.State(meta, self._ring, self._keys, self._stores, compression, extra)

    def _keep(self, stores: tuple, keys) -> None:
        """The stores of the first add (or a checkpoint), for good: one per leaf of ``keys``."""
        self._stores, self._keys = stores, keys
        self._frames, self._vectors, self._tables = kinds(stores)
        self._parser.keys, self._parser.decided = keys, True
        for i in self._frames:  # a first add's stores take what they staged
            stores[i].adopt()

    @classmethod
    def _restore(cls, ck: _archive.Restored) -> ReplayBuffer:
        """A buffer from a read checkpoint (``checkpoint.load`` checked every part)."""
        m = ck.meta
        rb = cls(
            m["capacity"], num_envs=m["num_envs"], n_step=m["n_step"], gamma=m["gamma"],
            action_shape=tuple(m["action_shape"]), action_dtype=np.dtype(m["action_dtype"]),
            layout=m["layout_opt"], stack_size=m["stack_size_opt"], pool=ck.pool_opt,
            compress=ck.compression, extras=ck.extras[0], start_extras=ck.extras[1],
        )  # fmt: skip
        if rb.capacity != m["capacity"]:
            raise ValueError("inconsistent capacity")
        ck.fill(rb._ring)
        if ck.extras[2] is not None and rb._starts is not None:  # (the one implies the other)
            rb._starts.restore(*ck.extras[2])
        if ck.stores:
            rb._keep(ck.stores, ck.keys)
        rb._rng = ck.rng
        rb._restore_extra(m, ck.archive)
        return rb

    # -- hooks for subclasses (PrioritizedReplayBuffer) -----------------------------
    #: Bytes per transition a subclass allocates for the whole capacity (load's bound).
    _EXTRA_BYTES_PER_TRANSITION = 0

    def _on_add(self, pos: int, count: int) -> None:
        """At the end of :meth:`add` (cannot fail): ``count`` rows written from ``pos`` on."""

    def _extra_state(self) -> tuple[dict, dict]:
        """``(meta, arrays)`` a checkpoint adds: meta keys and optional entries."""
        return {}, {}

    def _restore_extra(self, meta: dict, archive) -> None:
        """Called last by :meth:`load` to read what :meth:`_extra_state` wrote."""


def _from_bytes(cls, data) -> ReplayBuffer:
    """A buffer from the bytes of a checkpoint (unpickling), checked as ``load`` checks a file.

    Raises:
        TypeError: ``cls`` is not a ReplayBuffer class, ``data`` not bytes.
        ValueError: as :meth:`ReplayBuffer.load`.
    """
    if not (isinstance(cls, type) and issubclass(cls, ReplayBuffer)):
        raise TypeError(f"cannot restore a ReplayBuffer as {cls!r}")
    if not isinstance(data, bytes):
        raise TypeError(f"a ReplayBuffer restores from bytes, got {type(data).__name__}")
    return _archive.from_bytes(cls, data)
