"""A replay buffer that stores each frame once: transitions hold frame references, not frames.

:class:`ReplayBuffer` keeps, per transition, references to the ``k`` frames of the
observation and the ``k`` frames of the next observation, the action, the reward and
the episode flags. The frames themselves live once in a :class:`~lazyframes.FramePool`,
refcounted: a frame's memory is reused once no stored transition and no live
observation refers to it. Sampling copies the frames out with one core call per batch,
with the dtype conversion and scaling fused into that copy.

It plays the role of SB3's ``ReplayBuffer(optimize_memory_usage=True)``, Dopamine's
circular replay buffer and cpprb's ``stack_compress``, with exact episode boundaries and
the real next observation of truncated transitions (case C15).

The package, one concern a module:

- ``_args``: the one parser of ``add()`` arguments (used by ``transport.Sender`` too);
- ``_ring``: the ring of transitions (positions, env streams, actions, rewards, flags),
  n-step windows and draws;
- ``_store``: the stores of observation leaves (frames, or plain arrays);
- ``_buffer``: :class:`ReplayBuffer`, a ring and its stores;
- ``_samples``: :class:`Samples`, the one type of a sampled batch, drawn then filled;
- ``_sampler``: :class:`Sampler`, batches drawn ahead and filled in a background thread
  (``ReplayBuffer.sampler``);
- ``_prioritized``: :class:`PrioritizedReplayBuffer`, a subclass with sum-trees;
- ``_archive``: the checkpoint file format, written and read (every version), in
  ``_npz``'s archive of checked members.
"""

from ._buffer import ReplayBuffer
from ._prioritized import PrioritizedReplayBuffer
from ._sampler import Sampler
from ._samples import Samples

#: The samples of a uniform draw (the name of 0.2): :class:`Samples`.
ReplaySamples = Samples
#: The samples of a prioritized draw (the name of 0.2): :class:`Samples`.
PrioritizedSamples = Samples

__all__ = [
    "PrioritizedReplayBuffer",
    "PrioritizedSamples",
    "ReplayBuffer",
    "ReplaySamples",
    "Sampler",
    "Samples",
]
