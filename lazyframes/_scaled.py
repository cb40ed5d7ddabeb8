"""Scaled observations: uint8 frames shown as baselines' ``ScaledFloatFrame`` floats.

A stacker over :class:`lazyframes.ScaledFloatFrame` stores each frame's bytes once, as it
would without scaling, and returns :class:`ScaledLazyFrames` (one env) or
:class:`ScaledLazyBatch` (the vector stacker): views whose values are
``float32(byte) / 255``, exactly what ``np.array(frame).astype(np.float32) / 255.0``
gives, bit for bit (the copy kernels divide; a multiply by ``float32(1 / 255)`` differs in
the last bit for 126 byte values). ``np.asarray(obs)`` is the one copy out, converted in
it. A replay buffer fed them stores the bytes and samples the same float32 values.
"""

from __future__ import annotations

import numpy as np

from . import _checks as C
from . import _core

_F32 = np.dtype(np.float32)


class _Scaled:
    """What both views share: ``frames`` (the uint8 owner) and the exact conversion."""

    __slots__ = ("divisor", "frames")

    def __init__(self, frames, divisor: float = 255.0):
        self.frames = frames
        self.divisor = C.Divisor(divisor)

    @property
    def shape(self) -> tuple:
        return self.frames.shape

    @property
    def dtype(self) -> np.dtype:
        """float32: the dtype of the values (the frames are stored as uint8)."""
        return _F32

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the materialised float32 array (not of the memory held)."""
        return 4 * int(np.prod(self.shape))

    @property
    def layout(self) -> str:
        return self.frames.layout

    @property
    def stack_size(self) -> int:
        return self.frames.stack_size

    @property
    def pool(self):
        return self.frames.pool

    def numpy(self, out=None, *, dtype=None, scale=None) -> np.ndarray:
        """The float32 values copied out (into ``out``), converted in the copy.

        ``dtype`` other than float32 (or ``scale``) converts the float32 values after the
        copy: ``float32_values.astype(dtype) * scale``.
        """
        exact = (dtype is None or np.dtype(dtype) == _F32) and scale is None
        f = self.frames
        if exact and out is not None and isinstance(f, _core.LazyBatch):
            return f.numpy(out=out, dtype=_F32, scale=self.divisor)  # straight into out
        if isinstance(f, _core.LazyBatch):
            values = f.numpy(dtype=_F32, scale=self.divisor)
        else:
            values = f.astype(_F32, scale=self.divisor)
        if not exact:
            values = values.astype(dtype or _F32)
            if scale is not None:
                values *= values.dtype.type(scale)
        if out is None:
            return values
        np.copyto(out, values, casting="no")
        return out

    def astype(self, dtype, *, scale=None) -> np.ndarray:
        """A new array of ``dtype`` (of the float32 values), optionally times ``scale``."""
        return self.numpy(dtype=dtype, scale=scale)

    def __array__(self, dtype=None, copy=None):
        if copy is False:
            raise ValueError("a copy cannot be avoided: the frames are not one array")
        return self.numpy(dtype=dtype)

    def __len__(self) -> int:
        return self.shape[0]

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self.divisor == other.divisor and self.frames == other.frames

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self):
        return type(self), (self.frames, float(self.divisor))

    def __repr__(self):
        return f"{type(self).__name__}({self.frames!r}, divisor={float(self.divisor):g})"


class ScaledLazyFrames(_Scaled):
    """A :class:`~lazyframes.LazyFrames` of uint8 frames shown as float32 ``byte / 255``.

    ``len``, ``[i]``, ``count()`` and ``frame(i)`` behave as baselines' LazyFrames over
    ``ScaledFloatFrame``'s float frames (on the materialised array). ``frames`` is the
    uint8 :class:`~lazyframes.LazyFrames`; ``shift(frame)`` takes the next float frame.

    Example:
        >>> import numpy as np, lazyframes
        >>> pool = lazyframes.FramePool((2,), np.uint8)
        >>> obs = ScaledLazyFrames(pool.lazy([pool.push(np.array([0, 255], np.uint8))] * 2))
        >>> np.asarray(obs).tolist(), obs.dtype  # ("last" layout: the frames interleaved)
        ([0.0, 1.0, 0.0, 1.0], dtype('float32'))
    """

    __slots__ = ()

    def __getitem__(self, key):
        return np.asarray(self)[key]

    def count(self) -> int:
        """Size of the last axis of the materialised array, as baselines' ``count()``."""
        return self.shape[-1]

    def frame(self, i) -> np.ndarray:
        """``np.asarray(self)[..., i]``, as baselines' ``frame(i)``."""
        return np.asarray(self)[..., i]

    def shift(self, frame) -> ScaledLazyFrames:
        """The next observation: these frames' last k-1, then ``frame`` (its float values)."""
        return ScaledLazyFrames(self.frames.shift(unscaled(frame, self.divisor)), self.divisor)


class ScaledLazyBatch(_Scaled):
    """A :class:`~lazyframes.LazyBatch` of uint8 frames shown as float32 ``byte / 255``.

    The vector stacker's observations over ``ScaledFloatFrame`` sub-envs. Row ``i`` is a
    :class:`ScaledLazyFrames`; ``frames`` is the uint8 LazyBatch.
    """

    __slots__ = ()

    def __getitem__(self, i):
        row = self.frames[i]
        return (ScaledLazyFrames if isinstance(row, _core.LazyFrames) else ScaledLazyBatch)(
            row, self.divisor
        )

    def __iter__(self):
        return (ScaledLazyFrames(row, self.divisor) for row in self.frames)


def unscaled(frames, divisor: float) -> np.ndarray:
    """The uint8 frames whose ``float32(byte) / divisor`` are ``frames`` exactly.

    Raises:
        ValueError: a value that is no such quotient (the observations were changed after
            ``ScaledFloatFrame``, or come from elsewhere).
    """
    a = np.ascontiguousarray(frames, dtype=_F32)
    return _core.unscale_u8(a, divisor, np.empty(a.shape, np.uint8))
