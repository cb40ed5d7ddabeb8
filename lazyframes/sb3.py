"""Stable-Baselines3 drop-ins: a replay buffer class and ``VecFrameStack``.

``ReplayBuffer`` (and ``NStepReplayBuffer``) are ``replay_buffer_class`` values for SB3's
``DQN`` and sb3-contrib's ``QRDQN``: one changed line,

.. code-block:: python

    model = DQN("CnnPolicy", env, replay_buffer_class=lazyframes.sb3.ReplayBuffer)

(rl-baselines3-zoo evaluates the string in its own module: ``replay_buffer_class:
"__import__('lazyframes.sb3').sb3.ReplayBuffer"``; examples/zoo/). They keep
SB3's constructor, ``add``, ``sample``, ``pos``/``full``/``size()``, torch
``ReplayBufferSamples`` with ``(B, 1)`` fields, pickling and random draws (a seeded run
samples the same transitions), and store each frame once, in a
:class:`lazyframes.ReplayBuffer`: nothing allocated up front, about 7 KB per 84x84
transition instead of 28 KB (``optimize_memory_usage=True``) or 56 KB.

``VecFrameStack`` is a drop-in for SB3's wrapper that stacks by frame reference and
returns one fresh ndarray per step (docs/DESIGN.md says why it does not hand its
references to the buffer).

**CleanRL, without SB3.** The buffers need PyTorch alone: without Stable-Baselines3
installed, ``from lazyframes.sb3 import ReplayBuffer`` is the same class on restatements of
SB3's buffer API (``lazyframes._sb3_free``), sampling ``lazyframes.sb3.ReplayBufferSamples``
(SB3's fields). CleanRL's ``dqn_atari.py`` switches with its import line alone: its
``optimize_memory_usage=True`` stores the frames compressed. With SB3 installed the class
is a subclass of SB3's ``ReplayBuffer`` (``replay_buffer_class``, ``load_replay_buffer``)
and the samples SB3's type; pickles load in either process. ``VecFrameStack`` needs SB3
(``python -m pip install "stable-baselines3>=2.7"``).
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import numpy as np

try:
    import torch as th
    from gymnasium import spaces
except ImportError as _e:  # pragma: no cover - only without torch
    raise ImportError(
        f"lazyframes' SB3 and CleanRL buffers return torch tensors and need PyTorch ({_e}). "
        "Its CPU build, without PyPI's multi-GB CUDA build: "
        "python -m pip install torch --index-url https://download.pytorch.org/whl/cpu"
    ) from None
try:
    from stable_baselines3.common import buffers as _buffers
    from stable_baselines3.common.preprocessing import (
        get_action_dim,
        get_obs_shape,
        is_image_space_channels_first,
    )
    from stable_baselines3.common.type_aliases import ReplayBufferSamples
    from stable_baselines3.common.utils import get_device
    from stable_baselines3.common.vec_env import VecEnvWrapper
    from stable_baselines3.common.vec_env.stacked_observations import StackedObservations

    _BufferBase: Any = _buffers.ReplayBuffer
    HAVE_SB3 = True
except ImportError:  # CleanRL without SB3: the buffers alone, on restatements of SB3's API
    from . import _sb3_free

    _BufferBase = _sb3_free.BufferBase
    ReplayBufferSamples = _sb3_free.ReplayBufferSamples  # type: ignore[misc,assignment]
    get_action_dim = _sb3_free.get_action_dim
    get_device = _sb3_free.get_device
    get_obs_shape = _sb3_free.get_obs_shape
    is_image_space_channels_first = _sb3_free.is_image_space_channels_first
    VecEnvWrapper = object  # type: ignore[assignment,misc]
    HAVE_SB3 = False

from . import FramePool
from . import replay as _replay
from ._checks import check_layout
from .replay._buffer import _from_bytes

__all__ = ["NStepReplayBuffer", "ReplayBuffer", "ReplayBufferSamples", "VecFrameStack"]


def _image_geometry(space) -> tuple:
    """``(layout, stack_size)`` that splits observations of ``space`` into 2-D planes.

    Every channel plane is a frame: consecutive stacks share all planes but the newest,
    whatever the channels per frame (grayscale or RGB), so each is stored once.

    Raises:
        ValueError: ``space`` is not a 3-D Box (an image, channels first or last).
    """
    if not isinstance(space, spaces.Box) or len(space.shape) != 3:
        raise ValueError(
            f"lazyframes.sb3.ReplayBuffer stores image observations (a 3-D Box such as "
            f"(4, 84, 84) or (84, 84, 4)), got {space}; use SB3's ReplayBuffer for it"
        )
    if is_image_space_channels_first(space):
        return "stack", space.shape[0]
    return "last", space.shape[-1]


class ReplayBuffer(_BufferBase):
    """SB3's ``ReplayBuffer``, storing each frame once.

    The arguments are SB3's. Observations are split into channel planes stored in a
    :class:`lazyframes.ReplayBuffer` (de-duplicated against the previous observation of
    the same env, so a step of a 4-frame stack costs one new frame), in the layout of
    the observation space SB3 gives the buffer (channels-first after the CNN policy's
    ``VecTransposeImage``, or channels-last). ``done`` with
    ``infos[i]["TimeLimit.truncated"]`` is a truncation (bootstrapped, SB3's
    ``handle_timeout_termination=True``), otherwise a termination.

    Args:
        buffer_size: maximum number of transitions (``buffer_size // n_envs`` rows).
        observation_space: a 3-D image ``Box``.
        action_space: the action space.
        device: torch device of the sampled tensors.
        n_envs: number of envs of the VecEnv.
        optimize_memory_usage: asks for the leaner store: without ``compress``, True
            stores the frames compressed (each frame is stored once either way; CleanRL's
            scripts pass True).
        handle_timeout_termination: read truncation from ``infos`` (SB3's default).
        pool: optional :class:`lazyframes.FramePool` to store the frames in, of one
            channel plane: ``(H, W)`` for channels-first spaces, ``(H, W, 1)`` for
            channels-last (default: one owned by the buffer).
        compress: compress the stored frames, as :class:`lazyframes.ReplayBuffer`'s
            ``compress`` (True, or a mapping of ``codec``, ``level``, ``group``; see
            docs/COMPRESSION.md): samples are the same bit for bit, :meth:`memory`
            reports the compressed bytes, and a pickled buffer (``save_replay_buffer``)
            loads compressing with the same options. None (default):
            ``optimize_memory_usage`` decides.

    Raises:
        ValueError: a non-image observation space, bad ``compress`` options.
        TypeError: ``compress`` of another type than bool or a mapping.
    """

    _n_step = 1  # NStepReplayBuffer sets its own before __init__
    _gamma = 0.99

    def __init__(self, buffer_size, observation_space, action_space, device="auto", n_envs=1,
                 optimize_memory_usage=False, handle_timeout_termination=True, *, pool=None,
                 compress=None):  # fmt: skip
        layout, k = _image_geometry(observation_space)
        if compress is None:
            compress = bool(optimize_memory_usage)
        # SB3's __init__ is not called: it allocates buffer_size observations up front
        self.buffer_size = max(buffer_size // n_envs, 1)
        self.observation_space = observation_space
        self.action_space = action_space
        self.obs_shape = get_obs_shape(observation_space)
        self.action_dim = get_action_dim(action_space)
        self.device = get_device(device)
        self.n_envs = n_envs
        self.pos = 0
        self.full = False
        self.optimize_memory_usage = False
        self.handle_timeout_termination = handle_timeout_termination
        self._rb = _replay.ReplayBuffer(
            self.buffer_size * n_envs,
            num_envs=n_envs,
            n_step=self._n_step,
            gamma=self._gamma,
            action_shape=(self.action_dim,),
            action_dtype=self._maybe_cast_dtype(action_space.dtype),
            layout=layout,
            stack_size=k,
            pool=pool,
            compress=compress,
        )

    def add(
        self, obs, next_obs, action, reward, done, infos, *, final_obs=None, final_mask=None
    ) -> None:
        """Store one transition per env (SB3's argument order).

        Args:
            obs: ``(n_envs, *obs_shape)`` observations.
            next_obs: ``(n_envs, *obs_shape)``: for an env that is done, its terminal
                observation (SB3's ``_store_transition`` puts it there), unless
                ``final_obs`` gives it.
            action: ``(n_envs, action_dim)`` or ``(n_envs,)`` actions.
            reward: ``(n_envs,)`` rewards.
            done: ``(n_envs,)`` episode ends, terminated or truncated.
            infos: one dict per env; ``"TimeLimit.truncated"`` marks a truncation (read
                only with ``handle_timeout_termination``), which ends an n-step window
                even when ``done`` is False, as in SB3.
            final_obs: optional final observations that replace the rows of
                ``next_obs`` that ``final_mask`` marks, without a copy of the batch
                (a Gymnasium 1.x vector env's ``infos["final_obs"]`` under same-step
                autoreset, as CleanRL's loop reads it); see
                :meth:`lazyframes.ReplayBuffer.add`.
            final_mask: ``(n_envs,)`` bools: which rows of ``final_obs`` to store
                (``infos["_final_obs"]``, or the truncations); needed with ``final_obs``.
        """
        E = self.n_envs
        done = np.asarray(done, dtype=bool).reshape(E)
        if self.handle_timeout_termination:
            timeout = np.array([bool(i.get("TimeLimit.truncated", False)) for i in infos])
        else:
            timeout = np.zeros(E, bool)
        args = (
            np.asarray(obs).reshape((E, *self.obs_shape)),
            np.asarray(action).reshape(E, self.action_dim),
            np.asarray(reward, dtype=np.float32).reshape(E),
            np.asarray(next_obs).reshape((E, *self.obs_shape)),
            done & ~timeout,
            timeout,  # as SB3: a timeout ends an n-step window even without done
        )
        if E == 1 and final_mask is None:  # lazyframes' one-env form has no env axis
            args = tuple(a[0] for a in args)
        self._rb.add(*args, final_obs=final_obs, final_mask=final_mask)
        self.pos += 1
        if self.pos == self.buffer_size:
            self.full = True
            self.pos = 0

    def reset(self) -> None:
        """Drop every transition."""
        self._rb.clear()
        super().reset()

    def memory(self) -> dict:
        """Memory held: :meth:`lazyframes.ReplayBuffer.memory`."""
        return self._rb.memory()

    def _get_samples(self, batch_inds, env=None) -> ReplayBufferSamples:
        # SB3's draw of the env of each sampled row, from the same global generator
        env_indices = np.random.randint(0, high=self.n_envs, size=(len(batch_inds),))  # noqa: NPY002
        idx = np.asarray(batch_inds, np.int64) * self.n_envs + env_indices
        shape = (len(idx),) + self._rb.observation_shape
        dtype = np.dtype(self.observation_space.dtype)
        # torch's allocator hands back warm pages; fresh NumPy arrays of this size are
        # page-faulted in on every call (about 20x the cost of the copy itself)
        tdtype = th.from_numpy(np.empty(0, dtype)).dtype
        obs: Any = th.empty(shape, dtype=tdtype)
        next_obs: Any = th.empty(shape, dtype=tdtype)
        s = self._rb.gather(idx, out=(obs.numpy(), next_obs.numpy()), dtype=dtype)
        rewards = s.rewards.reshape(-1, 1)
        if env is not None:  # VecNormalize: SB3 normalises on the way out
            obs = self._normalize_obs(obs.numpy(), env)
            next_obs = self._normalize_obs(next_obs.numpy(), env)
            rewards = self._normalize_reward(rewards, env)
        return ReplayBufferSamples(
            observations=self._tensor(obs),
            actions=self._tensor(s.actions),
            next_observations=self._tensor(next_obs),
            dones=self._tensor(s.dones.reshape(-1, 1)),
            rewards=self._tensor(rewards),
            discounts=self._tensor(s.discounts.reshape(-1, 1)) if self._n_step > 1 else None,
        )

    def _tensor(self, a) -> th.Tensor:
        # the arrays are fresh: the tensor takes them over (a copy only to another device)
        t = a if isinstance(a, th.Tensor) else th.from_numpy(np.ascontiguousarray(a))
        return t.to(self.device)

    def __setstate__(self, state):  # _rb pickles as its checkpoint (ReplayBuffer.__reduce__)
        state.pop("_compression", None)  # the options are in the checkpoint (0.2's pickles)
        if isinstance(state["_rb"], bytes):  # 0.2's pickles held the checkpoint's bytes
            state["_rb"] = _from_bytes(_replay.ReplayBuffer, state["_rb"])
        self.__dict__.update(state)


class NStepReplayBuffer(ReplayBuffer):
    """SB3's ``NStepReplayBuffer`` (n-step returns, ``discounts``), storing each frame once.

    Pass it with ``replay_buffer_kwargs={"n_steps": 3, "gamma": 0.99}``, as SB3 asks for
    a custom n-step buffer. A window stops at the first done or truncation and at the
    newest transition, as SB3's does.

    Args:
        n_steps: length of the n-step window.
        gamma: discount factor of the n-step return.
        **kwargs: see :class:`ReplayBuffer`.
    """

    def __init__(self, *args, n_steps=3, gamma=0.99, **kwargs):
        self.n_steps, self.gamma = n_steps, gamma
        self._n_step, self._gamma = n_steps, gamma
        super().__init__(*args, **kwargs)


def _fits(layout: str, shape: tuple) -> bool:
    """Whether the pool takes ``layout`` for frames of ``shape`` (``_checks.check_layout``)."""
    try:
        check_layout(layout, tuple(shape))
    except ValueError:
        return False
    return True


class _Stacker:
    """One Box of a ``VecFrameStack``: a LazyBatch of the last ``n_stack`` frames per env.

    SB3's stacks start as zeros (a ``step`` before ``reset`` shifts frames into them). A
    channel order SB3 is told (``channels_order``) is honoured even where the frames'
    shape suggests the other one: the frames are then stacked on a new axis and the
    output concatenated from that (a reshape for "first", a copy for "last").
    """

    def __init__(self, space, n_stack: int, channels_order, num_envs: int):
        if not isinstance(space, spaces.Box):
            raise TypeError(f"VecFrameStack stacks Box observations, got {space}")
        first, _, _, axis = StackedObservations.compute_stacking(n_stack, space, channels_order)
        self.space = spaces.Box(
            low=np.repeat(space.low, n_stack, axis=axis),
            high=np.repeat(space.high, n_stack, axis=axis),
            dtype=space.dtype,
        )
        self.dtype = np.dtype(space.dtype)
        self.pool = FramePool(space.shape, self.dtype)
        self.concat: Literal["first", "last"] = "first" if first else "last"
        self.layout = self.concat if _fits(self.concat, space.shape) else "stack"
        self.k = n_stack
        self.zero = self.pool.push(np.zeros(space.shape, self.dtype))  # SB3 pads with zeros
        zeros = np.zeros((num_envs, *space.shape), self.dtype)
        self.batch: Any = self.pool.push_batch(zeros, k=n_stack, pad=self.zero, layout=self.layout)

    def _out(self, lazy) -> np.ndarray:
        """``lazy`` (a LazyBatch or LazyFrames) materialised in SB3's concatenation."""
        a = np.asarray(lazy)
        if self.layout == self.concat:
            return a
        lead = a.shape[: a.ndim - 1 - len(self.space.shape)]  # (n_envs,) or ()
        if self.concat == "first":
            return a.reshape(lead + self.space.shape)
        return np.moveaxis(a, len(lead), -2).reshape(lead + self.space.shape)

    def reset(self, frames) -> np.ndarray:
        self.batch = self.pool.push_batch(
            np.asarray(frames, self.dtype), k=self.k, pad=self.zero, layout=self.layout
        )
        return self._out(self.batch)

    def update(self, frames, dones, terminal: dict) -> tuple:
        """The new stacks, and the terminal stacks of the envs in ``terminal``."""
        stacked = {
            i: self._out(self.batch[i].shift(np.asarray(f, self.dtype)))
            for i, f in terminal.items()
        }
        self.batch = self.batch.shift(np.asarray(frames, self.dtype), restart=dones, pad=self.zero)
        return self._out(self.batch), stacked


class VecFrameStack(VecEnvWrapper):
    """SB3's ``VecFrameStack``, stacking by frame reference.

    Same arguments, observation space, values (zero padding after a reset, and stacks of
    zeros a ``step`` before any ``reset`` shifts into), ``infos[i]["terminal_observation"]``
    and channel orders as ``stable_baselines3.common.vec_env.VecFrameStack`` (an order
    given is honoured even where the frames' shape suggests the other); each step returns
    a fresh ndarray (a dict of them for a Dict space) built by one gather of the frames.

    Args:
        venv: the VecEnv to wrap (Box or Dict observations).
        n_stack: frames per observation.
        channels_order: ``"first"``, ``"last"``, None (detected as SB3 does), or a dict
            of those per key of a Dict space.

    Raises:
        TypeError: an observation space other than Box or Dict of Boxes.
        ValueError: frames the stacking layout cannot concatenate (2-D non-image
            frames: SB3 would glue them along a spatial axis).
    """

    def __init__(self, venv, n_stack: int, channels_order=None):
        if not HAVE_SB3:
            raise ImportError(
                "lazyframes.sb3.VecFrameStack wraps SB3 VecEnvs: python -m pip install "
                '"stable-baselines3>=2.7"'
            )
        space = venv.observation_space
        self._stackers: dict[str | None, _Stacker]
        stacked: spaces.Space
        if isinstance(space, spaces.Dict):
            orders = channels_order if isinstance(channels_order, dict) else None
            self._stackers = {
                key: _Stacker(
                    sub, n_stack, channels_order if orders is None else orders[key], venv.num_envs
                )
                for key, sub in space.spaces.items()
            }
            stacked = spaces.Dict({key: self._stackers[key].space for key in space.spaces})
        else:
            if isinstance(channels_order, dict):
                raise TypeError(
                    "When the observation space is Box, channels_order can't be a dict."
                )
            self._stackers = {None: _Stacker(space, n_stack, channels_order, venv.num_envs)}
            stacked = self._stackers[None].space
        super().__init__(venv, observation_space=stacked)

    def _out(self, parts: dict):
        return parts.get(None, parts)

    def reset(self):
        """Reset every env; the stacks are zeros then the reset observation."""
        obs = self.venv.reset()
        return self._out({key: s.reset(_part(obs, key)) for key, s in self._stackers.items()})

    def step_wait(self):
        """Step, stack, and stack the terminal observations of the envs that are done."""
        observations, rewards, dones, infos = self.venv.step_wait()
        ended = np.flatnonzero(dones)
        terminal = [i for i in ended if "terminal_observation" in infos[i]]
        if len(terminal) < len(ended):
            warnings.warn(
                "VecFrameStack wrapping a VecEnv without terminal_observation info", stacklevel=2
            )
        out = {}
        for key, s in self._stackers.items():
            last = {i: _part(infos[i]["terminal_observation"], key) for i in terminal}
            out[key], stacked = s.update(_part(observations, key), dones, last)
            for i, t in stacked.items():
                if key is None:
                    infos[i]["terminal_observation"] = t
                else:
                    infos[i]["terminal_observation"][key] = t
        return self._out(out), rewards, dones, infos


def _part(obs, key):
    """The observation of ``key`` (None: the whole Box observation)."""
    return obs if key is None else obs[key]
