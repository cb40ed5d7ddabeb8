"""A plain-Python model of ``lazyframes.ReplayBuffer`` and ``PrioritizedReplayBuffer``.

A FIFO of every stored transition and a list per env stream, from the documented behaviour
only (no code of ``lazyframes.replay``): slow and obviously correct.

- The ring holds ``capacity // num_envs * num_envs`` transitions over all streams; the
  oldest is evicted first, whatever the interleaving of the streams.
- The ``t``-th transition added has number ``t`` and sits at ring position ``t %
  capacity``; ``clear`` moves the count on to the next multiple of ``capacity`` (so a
  uniform buffer writes from position 0 again).
- An autoreset placeholder is stored, never sampled, and ends every n-step window.
- The n-step window of a transition is its first ``m <= n_step`` steps along its stream,
  stopping after a terminated or truncated step or before a placeholder; a window that
  has neither ended nor reached ``n_step`` steps (it is open at the stream's newest
  transition) is not sampleable.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


def copy(obs):
    """An observation as a fresh array, or for Dict observations a dict of them by key."""
    return {key: np.array(v) for key, v in obs.items()} if isinstance(obs, dict) else np.array(obs)


class Transition:
    """One stored transition, with the observations copied (:func:`copy`)."""

    __slots__ = ("action", "env", "next_obs", "number", "obs", "priority", "reward", "skip",
                 "terminated", "truncated")  # fmt: skip

    def __init__(self, **fields):
        for name, value in fields.items():
            setattr(self, name, value)


class Expected(NamedTuple):
    """What ``sample`` must return for one drawn transition (``ReplaySamples``' fields)."""

    observations: np.ndarray
    actions: np.ndarray
    next_observations: np.ndarray
    dones: np.float32
    rewards: np.float32
    truncations: np.float32
    discounts: np.float32


class ReplayModel:
    """The model of a ``ReplayBuffer(capacity, num_envs=, n_step=, gamma=, action_dtype=)``.

    ``add`` takes every argument batched (one entry per env of ``env_ids``, or of every env).
    """

    def __init__(self, capacity, *, num_envs=1, n_step=1, gamma=0.99, action_dtype=np.int64):
        self.capacity = capacity // num_envs * num_envs
        self.num_envs = num_envs
        self.n_step = n_step
        self.gamma = float(gamma)
        self.action_dtype = np.dtype(action_dtype)
        self.fifo = []  # the stored transitions, oldest first
        self.streams = [[] for _ in range(num_envs)]  # the same, per env stream
        self.number = 0  # the number of the next transition added
        self.since_clear = 0  # transitions added since the last clear (or ever)
        self.max_priority = 1.0  # the priority of a new transition (PrioritizedModel)

    def __len__(self):
        return len(self.fifo)

    @property
    def full(self):
        """True once the ring has wrapped around since the last clear."""
        return self.since_clear >= self.capacity

    def add(self, obs, action, reward, next_obs, terminated, truncated, *, autoreset=None,
            env_ids=None, final_obs=None, final_mask=None):  # fmt: skip
        """Store one transition per env of ``env_ids`` (default: every env, in order)."""
        envs = list(range(self.num_envs)) if env_ids is None else [int(e) for e in env_ids]
        for i, env in enumerate(envs):
            nxt = final_obs[i] if final_mask is not None and final_mask[i] else next_obs[i]
            t = Transition(
                number=self.number,
                env=env,
                obs=copy(obs[i]),
                action=np.asarray(action[i]).astype(self.action_dtype),
                reward=np.float32(reward[i]),
                next_obs=copy(nxt),
                terminated=bool(terminated[i]),
                truncated=bool(truncated[i]),
                skip=autoreset is not None and bool(autoreset[i]),
                priority=self.max_priority,
            )
            if len(self.fifo) == self.capacity:  # evict the oldest, of whichever stream
                old = self.fifo.pop(0)
                assert self.streams[old.env][0] is old  # it is also its stream's oldest
                self.streams[old.env].pop(0)
            self.fifo.append(t)
            self.streams[env].append(t)
            self.number += 1
            self.since_clear += 1

    def clear(self):
        """Drop every transition; numbering restarts at the next multiple of capacity."""
        self.fifo = []
        self.streams = [[] for _ in range(self.num_envs)]
        self.number = -(-self.number // self.capacity) * self.capacity
        self.since_clear = 0

    # -- positions and windows ---------------------------------------------------------
    def position(self, t):
        """The ring position of stored transition ``t``."""
        return t.number % self.capacity

    def at(self, pos):
        """The transition stored at ring position ``pos``, or None."""
        for t in self.fifo:
            if self.position(t) == pos:
                return t
        return None

    def window(self, t, open_ok=False):
        """The steps of ``t``'s n-step window (``t`` first), or None if it is not sampleable.

        ``open_ok``: a window open at the stream's newest transition ends there (a step of
        a sequence: its fields are computed whatever it is).
        """
        if t.skip:
            return [t] if open_ok else None
        stream = self.streams[t.env]
        steps = []
        for u in stream[stream.index(t) : stream.index(t) + self.n_step]:
            if u.skip:  # a placeholder ends the window before it
                return steps
            steps.append(u)
            if u.terminated or u.truncated:
                return steps
        return steps if len(steps) == self.n_step or open_ok else None  # else: still open

    def sampleable(self):
        """The stored transitions that ``sample`` may draw, oldest first."""
        return [t for t in self.fifo if self.window(t) is not None]

    def positions(self):
        """The ring positions that ``sample`` may draw, sorted."""
        return sorted(self.position(t) for t in self.sampleable())

    def expected(self, pos, open_ok=False):
        """The sample fields of the transition at ring position ``pos``, or None if not drawable."""
        t = self.at(pos)
        steps = None if t is None else self.window(t, open_ok)
        if steps is None:
            return None
        ret = sum(self.gamma**i * float(u.reward) for i, u in enumerate(steps))
        last = steps[-1]
        return Expected(
            observations=t.obs,
            actions=t.action,
            next_observations=last.next_obs,
            dones=np.float32(last.terminated),
            rewards=np.float32(ret),
            truncations=np.float32(last.truncated),
            discounts=np.float32(self.gamma ** len(steps)),
        )

    # -- windows of consecutive steps (sample_sequences) -------------------------------
    def sequence(self, t, steps):
        """``t`` and the next ``steps - 1`` steps of its stream, or None if it has fewer."""
        stream = self.streams[t.env]
        i = stream.index(t)
        return stream[i : i + steps] if i + steps <= len(stream) else None

    @staticmethod
    def mask(seq):
        """Whether each step of ``seq`` is of its first step's episode (sample_sequences)."""
        out, alive = [], True
        for j, u in enumerate(seq):
            prev = seq[j - 1] if j else None
            alive = alive and not u.skip and not (prev and (prev.terminated or prev.truncated))
            out.append(alive)
        return out

    def starts(self, steps, within):
        """The ring positions ``sample_sequences`` may start a window of ``steps`` at, sorted."""
        ok = []
        for t in self.fifo:
            seq = self.sequence(t, steps)
            if seq is not None and not t.skip and (not within or all(self.mask(seq))):
                ok.append(self.position(t))
        return sorted(ok)


class PrioritizedModel(ReplayModel):
    """The model of a ``PrioritizedReplayBuffer(capacity, alpha=, ...)``.

    Transitions are named by number. ``P(i) = p_i**alpha / sum_k p_k**alpha`` over the
    sampleable transitions; ``w_i = (p_i**alpha / min_k p_k**alpha)**-beta``.
    """

    def __init__(self, capacity, *, alpha=0.6, **options):
        super().__init__(capacity, **options)
        self.alpha = float(alpha)

    def by_number(self, number):
        """The stored transition of that number; ValueError if evicted or never written."""
        for t in self.fifo:
            if t.number == number:
                return t
        raise ValueError(f"transition {number} is not stored")

    def priorities(self, numbers):
        """The priorities of the transitions ``numbers``."""
        return [self.by_number(int(n)).priority for n in numbers]

    def update_priorities(self, numbers, priorities):
        """Set priorities (the last of a repeated number wins); raises the max priority."""
        ts = [self.by_number(int(n)) for n in numbers]  # every number checked first
        for t, p in zip(ts, priorities, strict=True):
            t.priority = float(p)
            self.max_priority = max(self.max_priority, float(p))

    def probabilities(self):
        """``{number: P(number)}`` over the sampleable transitions."""
        powered = {t.number: t.priority**self.alpha for t in self.sampleable()}
        total = sum(powered.values())
        return {n: v / total for n, v in powered.items()}

    def weight(self, number, beta):
        """The importance weight of sampleable transition ``number``, float32."""
        low = min(t.priority**self.alpha for t in self.sampleable())
        return np.float32((self.by_number(number).priority ** self.alpha / low) ** -beta)
