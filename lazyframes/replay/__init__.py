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

The package has one concern a module (``_args``, ``_ring``, ``_store``, ``_buffer``,
``_samples``, ``_sampler``, ``_prioritized``, ``_archive``): docs/DESIGN.md, "The replay
engine".
"""

from ._buffer import ReplayBuffer
from ._prioritized import PrioritizedReplayBuffer, sequence_priority
from ._sampler import Sampler
from ._samples import Samples, Sequences

#: The samples of a uniform draw (the name of 0.2): :class:`Samples`.
ReplaySamples = Samples
#: The samples of a prioritized draw (the name of 0.2): :class:`Samples`.
PrioritizedSamples = Samples

__all__ = [
    "PrioritizedReplayBuffer", "PrioritizedSamples", "ReplayBuffer", "ReplaySamples", "Sampler",
    "Samples", "Sequences", "sequence_priority",
]  # fmt: skip
