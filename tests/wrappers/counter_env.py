"""The counter env of the wrapper tests (plain Gymnasium API: 0.29.1 too), and ``mk``."""

import gymnasium as gym
import numpy as np

from lazyframes import _core as core


def mk(cls, env, *args, **kwargs):
    """``cls(env, *args, **kwargs)`` with a new pool (none without a Box space: cls refuses)."""
    space = getattr(env, "single_observation_space", None) or getattr(
        env, "observation_space", None
    )
    pool = core.FramePool(space.shape, space.dtype) if isinstance(space, gym.spaces.Box) else None
    return cls(env, *args, pool=pool, **kwargs)


class CounterEnv(gym.Env):
    """Frames of value ``base * episode + t``; odd episodes terminate, even ones truncate.

    Episodes last ``length`` steps, or [1, max_len] drawn from ``rng_seed``; ``reuse_buffer``
    returns one array rewritten (C11), ``view`` a read-only, non-contiguous one.
    """

    metadata = {"render_modes": []}  # noqa: RUF012 - Gymnasium's class attribute

    def __init__(
        self,
        shape=(84, 84, 1),
        dtype=np.uint8,
        *,
        base=10,
        length=3,
        rng_seed=None,
        max_len=5,
        low=0,
        high=255,
        reuse_buffer=False,
        view=False,
        out_dtype=None,
    ):
        self.shape, self.dtype, self.base = tuple(shape), np.dtype(dtype), base
        self.observation_space = gym.spaces.Box(low, high, self.shape, self.dtype)
        self.action_space = gym.spaces.Discrete(2)
        self.length = length
        self.rng = None if rng_seed is None else np.random.default_rng(rng_seed)
        self.max_len = max_len
        self.reuse_buffer, self.view = reuse_buffer, view
        self.out_dtype = self.dtype if out_dtype is None else np.dtype(out_dtype)
        self.buf = np.zeros(self.shape, self.out_dtype)
        self.episode, self.t, self.bad_next, self.len = 0, 0, False, length

    def _frame(self):
        v = self.base * self.episode + self.t
        if self.bad_next:
            self.bad_next = False
            return np.zeros(self.shape + (2,), self.out_dtype)
        if self.reuse_buffer:
            self.buf[...] = v
            return self.buf
        if self.view:
            big = np.full(tuple(2 * d for d in self.shape), v, self.out_dtype)
            fr = big[tuple(slice(None, None, 2) for _ in self.shape)]
            fr.flags.writeable = False
            return fr
        return np.full(self.shape, v, self.out_dtype)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        self.len = self.length if self.rng is None else int(self.rng.integers(1, self.max_len + 1))
        return self._frame(), {"v": self.base * self.episode}

    def step(self, action):
        self.t += 1
        done = self.t >= self.len
        term, trunc = (done, False) if self.episode % 2 else (False, done)
        return self._frame(), float(self.t), term, trunc, {"v": self.base * self.episode + self.t}


def values(obs):
    """One number per frame: of a LazyFrames (any layout) or a stacked ndarray ("stack")."""
    if hasattr(obs, "get_frame"):
        return [int(obs.get_frame(i).flat[0]) for i in range(obs.stack_size)]
    a = np.asarray(obs)
    return [int(x) for x in a.reshape(a.shape[0], -1)[:, 0]]
