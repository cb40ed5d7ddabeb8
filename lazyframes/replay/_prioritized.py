"""Prioritized replay (Schaul et al., 2016, proportional variant) over deduplicated frames.

A :class:`ReplayBuffer` plus a core ``SumTree`` (one leaf per ring position, ``p ** alpha``
while sampleable, else empty) and transition numbers as sampled indices, so a stale index
never updates the transition that took its position (docs/DESIGN.md, "Prioritized replay").
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .. import _core
from ._buffer import ReplayBuffer
from ._ring import NOT_SAMPLEABLE, SKIP
from ._sampler import Sampler
from ._samples import Samples, Sequences, fill, outputs

__all__ = ["PrioritizedReplayBuffer", "PrioritizedSamples"]

#: The samples of a prioritized draw: :class:`Samples`, whose ``indices`` are
#: transition numbers and ``weights`` the importance-sampling weights.
PrioritizedSamples = Samples


def _real(x, name: str) -> float:
    """``x`` as a float: a real number, not a string or a bool (``float`` takes both)."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (float, numbers.Real)):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    return float(x)


def _beta(beta) -> float:
    b = _real(beta, "beta")
    if not 0.0 <= b <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta!r}")
    return b


def _alpha(alpha) -> float:
    a = _real(alpha, "alpha")
    if not (math.isfinite(a) and a >= 0.0):
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
    return a


class PrioritizedReplayBuffer(ReplayBuffer):
    """A :class:`ReplayBuffer` that samples in proportion to priorities (Rainbow, Ape-X).

    Transition ``i`` is drawn with probability ``P(i) = p_i**alpha / sum_k p_k**alpha``
    over the sampleable transitions (closed n-step windows, no autoreset placeholder),
    stratified as OpenAI baselines and Dopamine draw: draw ``j`` of a batch of ``B``
    falls in the ``j``-th of ``B`` equal segments of the total. A new transition gets
    the largest priority given so far (1.0 before any update), so it is likely to be
    replayed once. Importance weights are baselines': ``w_i = (N P(i))**-beta / (N
    P_min)**-beta`` with ``N`` the sampleable transitions and ``P_min`` the smallest
    probability among them (``N`` cancels: ``w_i = (p_i**alpha / min_k p_k**alpha)**-beta``).

    The priorities are a sum-tree and a min-tree in plain C (``SumTree`` of the core),
    updated in batches and sampled a whole batch per call without the GIL. Everything
    else (frames stored once, ``compress=True``, n-step windows, several env streams,
    checkpoints) is :class:`ReplayBuffer`'s; a checkpoint keeps the priorities.

    Args:
        capacity: as :class:`ReplayBuffer`.
        alpha: priority exponent, ``>= 0`` (0 is uniform sampling).
        **options: every keyword option of :class:`ReplayBuffer` (``num_envs``,
            ``n_step``, ``gamma``, ``seed``, ``action_shape``, ``action_dtype``,
            ``layout``, ``stack_size``, ``pool``, ``compress``, ``frame_keys``).

    Raises:
        ValueError: ``alpha`` negative or not finite; as :class:`ReplayBuffer`.

    Example:
        >>> import numpy as np, lazyframes
        >>> rb = lazyframes.PrioritizedReplayBuffer(100, alpha=0.6, seed=0)
        >>> frame = np.zeros((4, 84, 84), np.uint8)
        >>> for t in range(3):
        ...     rb.add(frame, t, 1.0, frame, False, False)
        >>> batch = rb.sample(4, beta=0.4)
        >>> batch.weights.dtype, batch.indices.tolist()
        (dtype('float32'), [0, 0, 1, 2])
        >>> rb.update_priorities(batch.indices, [0.1, 0.1, 3.0, 0.5])
        >>> rb.priorities([0, 1, 2]).tolist(), rb.max_priority
        ([0.1, 3.0, 0.5], 3.0)
    """

    #: Bytes per transition of the trees and raw priorities, for load's size bound.
    _EXTRA_BYTES_PER_TRANSITION = 72

    def __init__(self, capacity, *, alpha=0.6, **options):
        alpha = _alpha(alpha)
        super().__init__(capacity, **options)
        self._alpha = alpha
        self._max_p = 1.0
        self._prio = np.zeros(self.capacity, np.float64)  # raw priority of each position
        self._open = np.empty(0, np.int64)  # positions whose n-step window is open
        self._tree = _core.SumTree(self.capacity)

    @property
    def alpha(self) -> float:
        """The priority exponent."""
        return self._alpha

    @property
    def max_priority(self) -> float:
        """The largest priority given so far (1.0 before any): new transitions get it."""
        return self._max_p

    def __repr__(self):
        return f"{super().__repr__()[:-1]}, alpha={self._alpha})"

    # -- the trees --------------------------------------------------------------------
    def _on_add(self, first: int, count: int) -> None:
        """``count`` positions from ``first`` on were written: they leave the trees.

        They enter when sampleable.
        """
        pos = (first + np.arange(count)) % self.capacity
        self._prio[pos] = self._max_p
        keep = (self._ring.flags[pos] & SKIP) == 0
        if self.n_step == 1:
            self._tree.set(pos, np.where(keep, self._max_p**self._alpha, 0.0))
            return
        still = self._open[~np.isin(self._open, pos)]
        cand = np.concatenate([still, pos[keep]])
        ok = self._ring.sampleable(cand)
        self._open = cand[~ok]
        enter = cand[ok]
        self._tree.set(
            np.concatenate([pos, enter]),
            np.concatenate([np.zeros(pos.size), self._prio[enter] ** self._alpha]),
        )

    def _window(self) -> tuple:
        """``(lo, hi)``: the numbers of the stored transitions are ``lo <= t < hi``.

        A transition's number is its row's in the ring (``RowRing.appended``).
        """
        hi = self._ring.appended
        return hi - len(self), hi

    def _stale(self, j: int, v: int) -> str:
        lo, hi = self._window()
        if hi == lo:
            return f"indices[{j}] = {v}: the buffer holds no transition"
        what = "was evicted (or cleared)" if v < lo else "was never written"
        return f"indices[{j}] = {v} {what}: the stored transitions are numbers {lo} to {hi - 1}"

    def _positions(self, indices, stored=None) -> np.ndarray:
        """The ring positions of transition numbers ``indices`` (flat), each checked stored.

        ``stored``: None, or an array that receives, per index, whether its transition is
        stored; those evicted are then not refused (their positions are meaningless).

        Raises:
            ValueError: a transition that was evicted (unless ``stored`` is given) or never
                written.
            TypeError: non-integer indices.
        """
        t = np.asarray(indices)
        if t.dtype.kind not in "iu":
            raise TypeError(f"indices must be integers, got dtype {t.dtype}")
        pos, bad = self._ring.positions(t)
        if bad < 0:
            if stored is not None:
                stored[...] = True
            return pos
        flat = t.reshape(-1)
        if stored is not None:  # evicted transitions are marked, never-written ones refused
            lo, hi = self._window()
            beyond = np.flatnonzero(flat >= hi)
            if beyond.size:
                raise ValueError(self._stale(int(beyond[0]), int(flat[beyond[0]])))
            stored[...] = flat >= lo
            return (flat % self._ring.capacity).astype(np.int64, copy=False)
        raise ValueError(self._stale(bad, int(flat[bad])))

    def priorities(self, indices) -> np.ndarray:
        """The priorities (float64) of stored transitions, by number (as ``indices``).

        Raises:
            ValueError: a transition that was evicted or never written.
            TypeError: non-integer indices.
        """
        return self._prio[self._positions(indices)].reshape(np.shape(indices))

    # -- sampling and updates ---------------------------------------------------------
    def sample(self, batch_size, *, beta=0.4, out=None, dtype=None, scale=None) -> Samples:
        """Sample ``batch_size`` transitions in proportion to ``priority ** alpha``.

        Draws are with replacement and stratified (one per equal segment of the total
        priority); the uniforms come from the buffer's RNG, so seeded buffers holding
        the same transitions and priorities draw the same batches.

        Args:
            batch_size: number of transitions ``B``, at least 1.
            beta: importance-sampling exponent, in ``[0, 1]`` (0: every weight is 1).
            out: as :meth:`ReplayBuffer.sample`.
            dtype: as :meth:`ReplayBuffer.sample`.
            scale: as :meth:`ReplayBuffer.sample`.

        Returns:
            :class:`Samples`: ``indices`` the transition numbers, and float32 ``weights``.
            The observation arrays are reused as in :meth:`ReplayBuffer.sample`.

        Raises:
            ValueError: as :meth:`ReplayBuffer.sample`, or ``beta`` outside ``[0, 1]``.
            TypeError: as :meth:`ReplayBuffer.sample`.
            The buffer and its RNG are unchanged when an error is raised.
        """
        if self._draws.owed:  # a sampler's draw asked for before
            self._draws.wait()
        B = self._batch_size(batch_size)
        b = _beta(beta)
        outs = outputs(self._stores, self._frames, self._keys, B, out, dtype, scale)
        return fill(self._drawn(B, {"beta": b}), self._keys, outs)

    def sampler(
        self, batch_size, *, beta=0.4, prefetch=2, dtype=None, scale=None, out=None
    ) -> Sampler:
        """An iterator of prioritized batches, gathered in a thread: :meth:`ReplayBuffer.sampler`.

        The batches are :meth:`sample`'s (``beta`` as there): with no add and no update
        in between, the batches successive ``sample(batch_size, beta=beta, dtype=dtype,
        scale=scale)`` calls would return. ``out``: as there.

        **Priorities are those at the draw.** When ``next()`` returns batch ``j`` it asks
        for batch ``j + prefetch``, drawn with the priorities of that moment (an
        :meth:`update_priorities` waits for it), so the ``prefetch`` batches drawn ahead do
        not see the priorities the caller then updates from the batch it got: an update
        after ``next()`` returned batch ``j`` changes the draws of batch ``j + prefetch +
        1`` on, and a batch's ``weights`` are those of its draw. Ape-X's learner samples
        with priorities as stale. By the time a batch's priorities are updated,
        ``prefetch`` learner steps of adds may have evicted some of its transitions: pass
        ``skip_evicted=True`` to :meth:`update_priorities` to leave those out instead of
        refusing the update.

        Raises:
            ValueError: as :meth:`ReplayBuffer.sampler`, or ``beta`` outside ``[0, 1]``.
            TypeError: as :meth:`ReplayBuffer.sampler`.

        Example:
            >>> rb = PrioritizedReplayBuffer(60, alpha=0.6, seed=0)
            >>> frame = np.zeros((4, 84, 84), np.uint8)
            >>> for t in range(50):
            ...     rb.add(frame, t, 1.0, frame, False, False)
            >>> with rb.sampler(8, beta=0.4, prefetch=1) as batches:
            ...     for t, batch in zip(range(50, 90), batches):
            ...         td_error = np.where(batch.actions % 10 == 0, 10.0, 0.01)  # the learner
            ...         rb.update_priorities(batch.indices, td_error, skip_evicted=True)
            ...         rb.add(frame, t, 1.0, frame, False, False)  # evicts from t = 60 on
            >>> batch.actions.tolist(), len(rb)  # mostly multiples of 10
            ([60, 70, 80, 85, 87, 30, 40, 50], 60)
        """
        return self._sampler(batch_size, prefetch, dtype, scale, {"beta": _beta(beta)}, out)

    def _pick(self, batch_size: int, options: dict) -> tuple:
        """``(positions, numbers, weights)`` of one prioritized draw (``options["beta"]``).

        Raises:
            ValueError: no transition is sampleable yet.
        """
        if not self._tree.total() > 0.0:
            raise ValueError(NOT_SAMPLEABLE)
        return self._draw(batch_size, options["beta"])

    def _draw(self, batch_size: int, beta: float) -> tuple:
        """``(positions, numbers, weights)`` of ``batch_size`` prioritized draws (checked args).

        The priority machinery of :meth:`sample` without the copy of the frames (the
        benchmark times it alone).
        """
        pos, weights = self._tree.sample_weighted(self._rng.random(batch_size), beta)
        return pos, self._ring.numbers(pos), weights

    def sample_sequences(self, batch_size, length, *, beta=0.4, burn_in=0, within_episode=False,
                         frames=False, out=None, dtype=None, scale=None) -> Sequences:  # fmt: skip
        """Windows of :meth:`ReplayBuffer.sample_sequences`, drawn by their first step's priority.

        A window's priority is its first transition's: window ``i`` is drawn with
        probability ``p_i**alpha / sum_k p_k**alpha`` over the valid windows (whose first
        step is also sampleable as a transition). ``indices`` are the first steps'
        transition numbers, the window ids :meth:`update_priorities` takes (see
        :func:`sequence_priority`, R2D2's mix of a window's per-step priorities);
        ``weights`` are :meth:`sample`'s, ``(p_i / p_min)**(-alpha * beta)``, ``p_min``
        the smallest priority of a sampleable transition. A window whose first step was
        evicted is never drawn; checkpoints keep the priorities.

        Raises:
            ValueError, TypeError: as :meth:`ReplayBuffer.sample_sequences`, or ``beta``
                outside ``[0, 1]``.
        """
        return self._sequences(batch_size, length, burn_in, within_episode, frames, out, dtype,
                               scale, {"beta": _beta(beta)})  # fmt: skip

    def sequence_sampler(self, batch_size, length, *, beta=0.4, burn_in=0, within_episode=False,
                         frames=False, prefetch=2, dtype=None, scale=None,
                         out=None) -> Sampler:  # fmt: skip
        """:meth:`ReplayBuffer.sequence_sampler` of :meth:`sample_sequences`' windows.

        Drawn by priority; the priorities are those at each draw, as :meth:`sampler`'s.
        """
        options = {"beta": _beta(beta)}
        return self._sequence_sampler(batch_size, length, burn_in, within_episode, frames,
                                      prefetch, dtype, scale, out, options)  # fmt: skip

    def _pick_windows(self, B: int, T: int, within: bool, starts, options: dict) -> tuple:
        """``(positions, weights)`` of ``B`` windows drawn by priority.

        ``starts``: None (any position), or the positions a window may start at, drawn
        among by their priorities. Windows that are not valid are redrawn; after 32
        rounds, they are drawn among the valid ones enumerated (few are valid).
        """
        if not self._tree.total() > 0.0:
            raise ValueError(NOT_SAMPLEABLE)
        beta, ring, tree = options["beta"], self._ring, self._tree
        cand = starts
        if cand is not None:  # only the marked starts: drawn by their leaves
            cand = cand[tree.get(cand) > 0.0]
            if cand.size == 0:
                raise ValueError("no window start is stored at a sampleable transition yet")
        first, weights = self._draw_among(cand, B, beta)
        pos, ok = ring.valid_windows(first, T, within)
        for _ in range(32):
            bad = np.flatnonzero(~ok)
            if bad.size == 0:
                return pos, weights
            first, weights[bad] = self._draw_among(cand, bad.size, beta)
            pos[bad], ok[bad] = ring.valid_windows(first, T, within)
        good = ring.valid_starts(T, within, cand)
        good = good[tree.get(good) > 0.0]
        if good.size == 0:
            raise ValueError(f"no window of {T} steps starts at a sampleable transition yet")
        bad = np.flatnonzero(~ok)
        first, weights[bad] = self._draw_among(good, bad.size, beta)
        pos[bad] = ring.walk(first, T)
        return pos, weights

    def _draw_among(self, cand, m: int, beta: float) -> tuple:
        """``(positions, weights)``: ``m`` draws by priority, among ``cand`` (None: all)."""
        if cand is None:
            first, w = self._tree.sample_weighted(self._rng.random(m), beta)
            return first, np.asarray(w)  # (float32: beta is given)
        leaves = self._tree.get(cand)
        cum = np.cumsum(leaves)
        pick = np.minimum(np.searchsorted(cum, self._rng.random(m) * cum[-1], "right"),
                          cand.size - 1)  # fmt: skip
        return cand[pick], ((leaves[pick] / self._tree.min()) ** -beta).astype(np.float32)

    def _step_ids(self, pos: np.ndarray) -> np.ndarray:
        """The ids of the steps at ring positions ``pos``: their transition numbers."""
        return self._ring.numbers(pos).reshape(pos.shape)

    def _step_positions(self, indices) -> np.ndarray:
        return self._positions(indices)

    def update_priorities(self, indices, priorities, *, skip_evicted=False) -> None:
        """Set the priorities of the transitions ``indices`` (from :meth:`sample`).

        Typically ``|TD error| + eps``. Any number of transitions in one call; a
        repeated index keeps its last priority. A transition whose n-step window is
        still open keeps its priority until it becomes sampleable.

        Args:
            indices: integers, transition numbers (``Samples.indices``).
            priorities: real numbers, as many as ``indices`` (any shape of that size,
                e.g. ``(B, 1)``): positive and finite, and ``priority ** alpha`` must be
                a positive float64 no larger than ``float64 max / capacity`` (so the
                total stays finite).
            skip_evicted: leave out the transitions evicted since they were sampled
                instead of refusing the call (a :meth:`sampler`'s batches are drawn
                ahead, and adds go on meanwhile); their priorities are checked all the
                same, and do not count towards :attr:`max_priority`.

        Raises:
            ValueError: a transition that was evicted (unless ``skip_evicted``) or never
                written, a priority that is not positive and finite (or overflows /
                underflows ``** alpha``), sizes that differ.
            TypeError: non-integer indices, non-numeric priorities.
            Nothing changes when an error is raised.
        """
        self._draws.wait()  # a sampler's draw asked for before: with the old priorities
        # converted first: an __array__ callback may add or clear, which moves the window
        indices, priorities = np.asarray(indices), np.asarray(priorities)
        if priorities.dtype.kind not in "biuf":
            raise TypeError(f"priorities must be real numbers, got dtype {priorities.dtype}")
        stored = np.empty(indices.size, bool) if skip_evicted else None
        pos = self._positions(indices, stored)
        p = priorities.reshape(-1)
        if p.size != pos.size:
            raise ValueError(f"indices and priorities differ in size: {pos.size} and {p.size}")
        # only the sampleable leaves; those of evicted transitions checked, not written
        most = self._tree.update(pos, p, self._alpha, stored)
        if stored is not None:
            pos, p = pos[stored], p[stored]
        self._prio.put(pos, p)  # in order: a repeated index keeps its last
        self._max_p = max(self._max_p, most)

    def clear(self) -> None:
        """Drop every transition and its priority; keeps ``max_priority`` and the RNG.

        Transition numbers issued before are stale afterwards (the count moves on to
        the next multiple of ``capacity``).
        """
        super().clear()
        self._tree.clear()
        self._open = np.empty(0, np.int64)

    # -- checkpoints ------------------------------------------------------------------
    def _extra_state(self) -> tuple[dict, dict]:
        pm = {"alpha": self._alpha, "max_priority": self._max_p, "added": self._ring.appended}
        return {"prioritized": pm}, {"priorities": self._prio[: len(self)]}

    def _restore_extra(self, meta: dict, archive) -> None:
        """The priorities of a checkpoint (1.0 each for a plain ReplayBuffer's)."""
        n = len(self)
        pm = meta.get("prioritized")
        max_p: object
        added: object
        if pm is None:  # a uniform buffer's checkpoint: every priority 1.0
            prio = np.ones(n)
            max_p = 1.0
            added = self._ring.appended  # as the ring numbered its rows at load
        else:
            if not isinstance(pm, dict):
                raise ValueError("meta 'prioritized' must be an object")
            alpha = pm.get("alpha")
            if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
                raise ValueError(f"bad alpha {alpha!r}")
            self._alpha = _alpha(alpha)
            max_p = pm.get("max_priority")
            added = pm.get("added")
            if not (isinstance(max_p, float) and math.isfinite(max_p) and max_p >= 1.0):
                raise ValueError(f"bad max_priority {max_p!r}")
            if (
                isinstance(added, bool)
                or not isinstance(added, int)
                or added < n
                or added >= 2**62  # numbers are int64 in the trees' calls
                or added % self.capacity != self._ring.pos
            ):
                raise ValueError(f"bad transition count {added!r}")
            prio = archive.array("priorities", (n,), np.float64)
            with np.errstate(all="ignore"):
                powered = prio**self._alpha
            top = np.finfo(np.float64).max / self.capacity
            if n and not (
                np.all((prio > 0) & np.isfinite(prio))
                and np.all((powered > 0) & (powered <= top))
                and prio.max() <= max_p
            ):
                raise ValueError("bad priorities")
            if not max_p**self._alpha <= top:
                raise ValueError(f"bad max_priority {max_p!r}")
        self._tree = _core.SumTree(self.capacity)
        self._prio[:n] = prio
        self._max_p = float(max_p)
        self._ring.renumber(added)
        pos = np.arange(n)
        ok = self._ring.sampleable(pos) if n else np.zeros(0, bool)
        self._tree.set(pos, np.where(ok, prio**self._alpha, 0.0))
        self._open = pos[~ok & ((self._ring.flags[:n] & SKIP) == 0)]


def sequence_priority(priorities, mask=None, *, eta=0.9) -> np.ndarray:
    """R2D2's priority of windows from their steps': ``eta * max + (1 - eta) * mean``.

    Kapturowski et al. (2019), eta = 0.9, over each window's absolute per-step priorities
    (e.g. TD errors), the steps where ``mask`` is 0 left out (a window of no such step
    gets 0).

    Args:
        priorities: ``(B, T)`` per-step priorities (their absolute values are taken).
        mask: None, or ``(B, T)``: the steps that count (``Sequences.mask``).
        eta: the weight of the max, in ``[0, 1]``.

    Returns:
        float64 ``(B,)``, for ``update_priorities(batch.indices, ...)``.

    Example:
        >>> sequence_priority([[1.0, -3.0, 2.0]], eta=0.5).tolist()
        [2.5]
    """
    p = np.abs(np.asarray(priorities, np.float64))
    if p.ndim != 2:
        raise ValueError(f"priorities must have shape (B, T), got {p.shape}")
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"eta must be in [0, 1], got {eta!r}")
    m = np.ones(p.shape, bool) if mask is None else np.asarray(mask) != 0
    if m.shape != p.shape:
        raise ValueError(f"mask has shape {m.shape}, priorities {p.shape}")
    n = m.sum(axis=1)
    mean = np.where(m, p, 0.0).sum(axis=1) / np.maximum(n, 1)
    return eta * np.where(m, p, 0.0).max(axis=1, initial=0.0) + (1 - eta) * mean
