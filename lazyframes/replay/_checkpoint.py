"""Kept for the pickles of lazyframes 0.2, which name ``_checkpoint.from_bytes``."""

from ._buffer import _from_bytes as from_bytes

__all__ = ["from_bytes"]
