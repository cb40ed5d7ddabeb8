"""The ring of a replay buffer: where each transition is, and which ones can be drawn.

A :class:`Ring` is the core's ``RowRing`` (positions over all env streams, each stream's
transitions linked, the action, reward and flags columns) plus the replay's reading of
it: n-step windows along a stream's links, sampleability (not an autoreset placeholder,
n-step window complete or ended), uniform draws and the fields of a sample.
"""

from __future__ import annotations

import operator

import numpy as np

from .. import _core
from ._samples import constant

#: Flag bits of a stored transition.
TERM = 1  # the episode terminated: don't bootstrap
TRUNC = 2  # the episode was cut by a time limit
SKIP = 4  # an autoreset placeholder: never sampled, ends every n-step window
ENDS = TERM | TRUNC  # the episode ended with this step
#: The error of a draw from a buffer that holds transitions but none sampleable.
NOT_SAMPLEABLE = (
    "no transition can be sampled yet: every stored n-step window is still open (add more "
    "steps) or an autoreset placeholder"
)


class Ring(_core.RowRing):
    """The positions, streams, actions, rewards and flags of a buffer's transitions.

    A compiled ``RowRing`` with three columns (action, reward, flags) that counts the
    autoreset placeholders it holds, and the replay's reading of it: windows and draws.

    Args:
        capacity: transitions held at most, over all streams (rounded down to a multiple
            of ``num_envs``).
        num_envs: env streams (checked by the caller).
        n_step: length of the n-step return window, in ``[1, capacity]``.
        gamma: discount of the n-step return, in ``[0, 1]``.
        action_shape: shape of one action.
        action_dtype: dtype of the actions.
        convert: what converts the values the ring does not take as they are
            (``_args.Parser.convert``).
        extras: the per-step extras declared (``_extras.declared``): columns after the
            flags, at most 13.

    Raises:
        ValueError: ``capacity < num_envs``, ``n_step`` or ``gamma`` out of range.
    """

    __slots__ = ("extra_names", "gamma", "n_step")  # (no instance dict: method lookups skip it)

    def __init__(self, capacity, num_envs, n_step, gamma, action_shape, action_dtype, convert,
                 extras=()):  # fmt: skip
        capacity, n_step, gamma = operator.index(capacity), operator.index(n_step), float(gamma)
        if capacity < num_envs:
            raise ValueError(
                f"capacity ({capacity}) must be at least num_envs ({num_envs}): the buffer "
                f"holds capacity // num_envs rows of one transition per env"
            )
        capacity = capacity // num_envs * num_envs
        if not 1 <= n_step <= capacity:
            raise ValueError(f"n_step must be in [1, capacity={capacity}], got {n_step}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        columns = (
            ("action", action_shape, action_dtype),
            ("reward", (), np.float32),
            ("flags", (), np.uint8, ("terminated", "truncated", "autoreset")),
            *extras,
        )
        if len(extras) > 13:
            raise ValueError(f"at most 13 extras per step, got {len(extras)}")
        super().__init__(capacity, num_envs, columns, counted=(2, SKIP), convert=convert)
        self.n_step = n_step
        self.gamma = gamma
        self.extra_names = tuple(name for name, _, _ in extras)

    @property
    def num_envs(self) -> int:
        return self.num_streams

    @property
    def n_skip(self) -> int:
        """Autoreset placeholders held."""
        return self.counted

    def __len__(self) -> int:
        return self.size

    @property
    def actions(self) -> np.ndarray:
        return self.column(0)

    @property
    def rewards(self) -> np.ndarray:
        """Every row's reward (computed when read while the column is a palette's codes)."""
        return self.column(1)

    @property
    def flags(self) -> np.ndarray:
        return self.column(2)

    def extras(self, idx: np.ndarray) -> dict:
        """``{name: (*idx.shape, *shape)}``: the per-step extras of positions ``idx``."""
        return {n: self.values(3 + j, idx) for j, n in enumerate(self.extra_names)}

    def order(self) -> np.ndarray:
        """The stored positions, oldest first."""
        n = len(self)
        return np.roll(np.arange(n), -self.pos) if self.full else np.arange(n)

    # -- windows and draws ------------------------------------------------------------
    def window(self, idx: np.ndarray) -> tuple:
        """n-step windows of transitions ``idx``: ``(valid, ret, last, term, trunc, m)``.

        ``valid``: sampleable; ``ret``: the discounted return (float64) over the ``m``
        steps of the window; ``last``: the position of its last step, whose next
        observation is the sample's; ``term``/``trunc``: how it ended.
        """
        n, g = self.n_step, self.gamma
        flags = self.flags
        fl0 = flags[idx]
        valid = (fl0 & SKIP) == 0
        ret = self.values(1, idx).astype(np.float64)
        last = idx.copy()
        m = np.ones(idx.shape, np.int64)
        alive = valid & ((fl0 & ENDS) == 0)
        for j in range(1, n):
            p = self.next_of(last)
            inr = p >= 0
            valid &= ~(alive & ~inr)
            p = np.where(inr, p, last)
            fl = flags[p]
            step = alive & inr & ((fl & SKIP) == 0)
            ret += np.where(step, g**j * self.values(1, p).astype(np.float64), 0.0)
            last = np.where(step, p, last)
            m += step
            alive = step & ((fl & ENDS) == 0)
            if not alive.any():
                break
        flast = flags[last]
        return valid, ret, last, (flast & TERM) != 0, (flast & TRUNC) != 0, m

    def sampleable(self, idx: np.ndarray) -> np.ndarray:
        """Whether each of ``idx`` can be drawn."""
        return self.window(idx)[0]

    def draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """``count`` positions drawn uniformly over the sampleable ones, with replacement.

        Raises:
            ValueError: the ring is empty, or nothing is sampleable yet.
        """
        total = self.size
        if total == 0:
            raise ValueError("cannot sample from an empty ReplayBuffer")
        n_skip = self.counted
        if self.n_step == 1 and n_skip == 0:
            return _core.draw_integers(rng, total, count)
        # transitions that can be invalid: placeholders and each stream's open windows
        lower = total - n_skip - (self.n_step - 1) * self.num_streams
        if lower * 16 < total:  # few sure ones: enumerate the valid ones
            ok = np.flatnonzero(self.sampleable(np.arange(total)))
            if ok.size == 0:
                raise ValueError(NOT_SAMPLEABLE)
            return ok[_core.draw_integers(rng, ok.size, count)]
        idx = _core.draw_integers(rng, total, count)
        bad = np.flatnonzero(~self.sampleable(idx))
        while bad.size:
            idx[bad] = _core.draw_integers(rng, total, bad.size)
            bad = bad[~self.sampleable(idx[bad])]
        return idx

    def fields(self, idx: np.ndarray) -> tuple:
        """``(last, actions, dones, rewards, truncations, discounts)`` of transitions ``idx``.

        ``last``: the position of each window's last step. The fields are float32;
        ``dones`` is 1.0 where the episode terminated within the window, never for a
        truncation. An n-step window still open at its stream's newest transition ends
        there (SB3's ``NStepReplayBuffer`` does the same).
        """
        if self.n_step == 1:
            actions, rewards, bits = self.take(idx)[:3]
            return idx, actions, bits[0], rewards, bits[1], constant(len(idx), self.gamma)
        _, ret, last, term, trunc, m = self.window(idx)
        return (
            last,
            self.actions[idx],
            term.astype(np.float32),
            ret.astype(np.float32),
            trunc.astype(np.float32),
            (self.gamma**m).astype(np.float32),
        )

    # -- windows of consecutive steps (sample_sequences; RowRing.walk follows the links) -
    def episode_mask(self, pos: np.ndarray) -> np.ndarray:
        """Whether each step of windows ``pos`` is of its first step's episode.

        A step is not once an earlier step of the window ended the episode (terminated or
        truncated) or once the window reached an autoreset placeholder (itself included).
        """
        fl = self.flags[pos]
        out = (fl & SKIP) != 0
        out[:, 1:] |= (fl[:, :-1] & ENDS) != 0
        return ~np.logical_or.accumulate(out, axis=1)

    def valid_windows(self, starts: np.ndarray, steps: int, within: bool) -> tuple:
        """``(pos, ok)``: the windows ``(len(starts), steps)`` and whether each is valid.

        A start is valid when its stream holds ``steps - 1`` steps after it and it is not
        an autoreset placeholder; with ``within``, when the whole window is one episode
        (:meth:`episode_mask`).
        """
        pos = self.walk(starts, steps)
        ok = pos[:, -1] >= 0
        if within:
            ok &= self.episode_mask(np.where(ok[:, None], pos, 0))[:, -1]
        else:
            ok &= (self.flags[starts] & SKIP) == 0
        return pos, ok

    def valid_starts(self, steps: int, within: bool, starts=None) -> np.ndarray:
        """Every valid start of a window of ``steps`` (:meth:`valid_windows`), sorted.

        ``starts``: None (any position), or the positions a window may start at.

        Raises:
            ValueError: there is none.
        """
        cand = np.arange(len(self)) if starts is None else starts
        chunks = np.array_split(cand, max(1, -(-cand.size // 65536)))
        good = np.concatenate([c[self.valid_windows(c, steps, within)[1]] for c in chunks])
        if good.size == 0:
            raise ValueError(
                f"no window of {steps} steps can be sampled yet: no stream holds {steps} "
                f"steps after a{' marked' if starts is not None else ''} start"
                f"{' within one episode' if within else ''} (add more steps)"
            )
        return good

    def windows(self, rng: np.random.Generator, count: int, steps: int, within: bool,
                starts=None) -> np.ndarray:  # fmt: skip
        """``count`` windows ``(count, steps)`` drawn uniformly over their valid starts.

        ``starts``: None (any position), or the positions a window may start at. Random
        starts are redrawn where invalid (:meth:`valid_windows`); after 32 rounds, the
        valid starts are enumerated (few are valid).

        Raises:
            ValueError: the ring is empty, or no window is valid.
        """
        total = len(self)
        if total == 0:
            raise ValueError("cannot sample from an empty ReplayBuffer")

        def draw(m):
            if starts is None:
                return _core.draw_integers(rng, total, m)
            if starts.size == 0:
                raise ValueError("no window start is stored yet (add with start_extras=)")
            return starts[_core.draw_integers(rng, starts.size, m)]

        pos, ok = self.valid_windows(draw(count), steps, within)
        for _ in range(32):
            bad = np.flatnonzero(~ok)
            if bad.size == 0:
                return pos
            pos[bad], ok[bad] = self.valid_windows(draw(bad.size), steps, within)
        good, bad = self.valid_starts(steps, within, starts), np.flatnonzero(~ok)
        pos[bad] = self.walk(good[_core.draw_integers(rng, good.size, bad.size)], steps)
        return pos
