"""A replay of transitions in a memory-mapped file: one ingest process writes, learners sample.

:class:`SharedReplay` keeps frames once, in a ring of frame slots, and transitions as
frame numbers, in a ring of rows, both in one file mapped by every process that uses it
(on ``/dev/shm`` to keep it in memory, or on a disk). One process, the *writer*, creates
the file and adds transitions: :mod:`lazyframes.transport` messages
(:meth:`~SharedReplay.ingest`), or frames and rows. Any number of *reader* processes
attach it read-only and :meth:`~SharedReplay.sample` batches, copying each frame once,
from the mapping into the batch. Transitions are one-step: ``next_observations`` is each
transition's own next observation (an episode's final one); autoreset placeholders are
not stored.

The one writer owns the file; readers map it read-only and take no lock: a seqlock per
frame slot and row keeps a torn or evicted read from ever being returned (x86-64). The
file, ownership, locking and failure: docs/SHARED.md.

The modules: ``_file`` the header, the layout and the mapping; ``_writer``; ``_reader``.

Example:
    >>> import numpy as np, os, tempfile
    >>> from lazyframes.shared import SharedReplay
    >>> path = os.path.join(tempfile.mkdtemp(), "replay.lfr")
    >>> writer = SharedReplay.create(path, capacity=100, frame_shape=(84, 84), stack_size=4)
    >>> nums = writer.add_frames(np.stack([np.full((84, 84), v, np.uint8) for v in range(5)]))
    >>> writer.add(nums[None, :4], [1], [0.5], nums[None, 1:], [False], [False])
    1
    >>> reader = SharedReplay.attach(path)  # in a learner process
    >>> batch = reader.sample(2, rng=np.random.default_rng(0))
    >>> batch.observations.shape, batch.next_observations[:, -1, 0, 0].tolist()
    ((2, 4, 84, 84), [4, 4])
    >>> reader.close()
    >>> writer.close(unlink=True)
"""

from ..replay import Samples
from ._file import (  # noqa: F401  (the single module's names; tests and benchmarks use them)
    _GROUP,
    _LOG_BYTES,
    _LOG_HEAD,
    _ROWS_WRITTEN,
    BLOB_OVERHEAD,
    BLOB_RECORD,
    HEADER_WORDS,
    MAGIC,
    MAX_NDIM,
    VERSION,
    _layout,
)
from ._reader import MAX_ATTEMPTS, _Reader  # noqa: F401
from ._writer import RAW_CACHE_BYTES, _Writer  # noqa: F401

__all__ = ["SharedReplay", "SharedSamples"]

#: The former name of :meth:`SharedReplay.sample`'s batch, :class:`lazyframes.replay.Samples`.
SharedSamples = Samples


class SharedReplay(_Writer, _Reader):
    """Transitions in a memory-mapped file, written by one process and sampled by many.

    Made by :meth:`create` (the writer) or :meth:`attach` (a reader), never directly. A
    row whose frames were replaced is skipped by :meth:`sample`, so ``frame_capacity``
    (default ``2 * capacity``) should hold the frames of ``capacity`` transitions
    (docs/SHARED.md, "The file").
    """
