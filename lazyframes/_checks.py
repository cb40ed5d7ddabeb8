"""Validation and geometry shared by the compiled core and the Python layer.

Everything here runs on cold paths (pool creation, first use of a layout, errors).
"""

from __future__ import annotations

import numbers
import operator
import os
from collections.abc import Mapping

import numpy as np

#: The layouts of k frames of shape ``S`` (docs/DESIGN.md, "Layouts"): ``"last"``,
#: ``(..., C) -> (..., k*C)`` (baselines, the default); ``"first"``, ``(C, H, W) ->
#: (k*C, H, W)`` (SB3, EnvPool); ``"stack"``, ``S -> (k, *S)`` (Gymnasium, PyTorch).
LAYOUTS = ("last", "first", "stack")

#: Most axes a frame may have (an observation batch adds two; NumPy allows 64).
MAX_NDIM = 32

#: Largest slot id, row count or byte count (int64).
INT64_MAX = 2**63 - 1

#: Default size of one arena chunk of a FramePool, in bytes (148 Atari frames of 84x84).
DEFAULT_CHUNK_BYTES = 1 << 20

# Frame compression (docs/COMPRESSION.md): codec names, and the default chosen by measurement.
CODECS = ("lz4", "lz4hc", "zstd")
DEFAULT_COMPRESSION = {"codec": "zstd", "level": 1, "group": 8}
MAX_GROUP = 64  # most frames per keyframe


def compression(compress) -> dict | None:
    """The compression options of ``compress``, checked: None (off) or ``{codec, level, group}``.

    Args:
        compress: False or None (off), True (the default options), or a mapping with
            some of the keys ``codec`` (one of :data:`CODECS`), ``level`` (1 to 9) and
            ``group`` (1 to :data:`MAX_GROUP`: at most one keyframe in ``group`` frames
            of a chain of XOR deltas); missing keys take the defaults.

    Raises:
        TypeError: another type, or a non-integer level or group. ValueError: an unknown
            key or codec, or a level or group out of range.
    """
    if compress is None or compress is False:
        return None
    if compress is True:
        return dict(DEFAULT_COMPRESSION)
    if not isinstance(compress, Mapping):
        raise TypeError(
            f"compress must be a bool or a mapping of codec, level, group, got "
            f"{type(compress).__name__}"
        )
    unknown = set(compress) - set(DEFAULT_COMPRESSION)
    if unknown:
        raise ValueError(
            f"unknown compression options {sorted(map(str, unknown))}; "
            f"expected some of {sorted(DEFAULT_COMPRESSION)}"
        )
    opts = {**DEFAULT_COMPRESSION, **compress}
    if opts["codec"] not in CODECS:
        raise ValueError(f"codec must be one of {CODECS}, got {opts['codec']!r}")
    for key, top in (("level", 9), ("group", MAX_GROUP)):
        if isinstance(opts[key], bool) or not isinstance(opts[key], numbers.Integral):
            raise TypeError(f"{key} must be an int, got {type(opts[key]).__name__}")
        v = int(opts[key])
        if not 1 <= v <= top:
            raise ValueError(f"{key} must be in [1, {top}], got {v}")
        opts[key] = v
    return opts


# dtypes the fused conversion kernels know (kind, itemsize); any other numeric dtype
# can still be stored and copied out unconverted.
_CONVERTIBLE = frozenset(map(np.dtype, "?bBhHiIqQfd"))  # bool, (u)int8-64, float32, float64


def frame_dtype(dtype) -> np.dtype:
    """Normalise and check the dtype of stored frames.

    Raises:
        TypeError: for object, string, void/structured or datetime dtypes.
    """
    dt = np.dtype(dtype)
    if dt.kind not in "biufc" or dt.fields is not None or dt.subdtype is not None:
        raise TypeError(
            f"frames must have a fixed numeric dtype (bool, int, uint, float, complex), got {dt}"
        )
    return np.dtype(dt.type)  # native byte order, NumPy's canonical instance


def frame_shape(shape) -> tuple:
    """Normalise and check a frame shape: a tuple of positive ints.

    Raises:
        TypeError: if ``shape`` is not a sequence of integers.
        ValueError: if any dimension is not positive, or there are more than
            :data:`MAX_NDIM` of them.
    """
    try:
        shape = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise TypeError(f"frame shape must be a tuple of ints, got {shape!r}") from None
    if any(d <= 0 for d in shape):
        raise ValueError(f"frame shape {shape} has a dimension that is not positive")
    if len(shape) > MAX_NDIM:
        raise ValueError(f"frames have more than {MAX_NDIM} dimensions: {shape}")
    return shape


def layout_name(layout) -> str:
    """``layout`` as a plain ``str``, one of :data:`LAYOUTS`.

    A ``str`` subclass is compared by its characters: none of its methods (``__eq__``,
    ``__hash__``, ``__str__``) runs, so it cannot answer differently on a second look.

    Raises:
        ValueError: anything else.
    """
    if isinstance(layout, str):
        name = str.__str__(layout)  # a plain copy of the characters
        if name in LAYOUTS:
            return name
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def check_layout(layout: str, shape: tuple) -> str:
    """Reject a layout that does not fit frames of ``shape`` (case C06 in docs/CASES.md).

    ``"last"`` concatenates on the channel axis, so that axis must be last: it must be
    (one of) the smallest, as SB3's ``is_image_space_channels_first`` decides; 1-D frames
    (feature vectors) are fine. ``"first"`` is the mirror image. 2-D frames such as
    ``(84, 84)`` have no channel axis: concatenating would glue them along a spatial axis.

    Returns:
        The layout as a plain ``str`` (:func:`layout_name`).

    Raises:
        ValueError: naming the frame shape and the layout to use instead.
    """
    layout = layout_name(layout)
    if layout == "stack" or len(shape) == 1:
        return layout
    if len(shape) == 0:
        raise ValueError(
            f"scalar frames cannot be concatenated (layout={layout!r}); use layout='stack'"
        )
    if len(shape) == 2:
        raise ValueError(
            f"frames of shape {shape} have no channel axis: layout={layout!r} would glue "
            f"them along a spatial axis; use layout='stack' for {(4,) + shape}-style "
            f"observations, or give the frames a channel axis, e.g. {shape + (1,)}"
        )
    axis = -1 if layout == "last" else 0
    if shape[axis] > min(shape):
        other = "first" if layout == "last" else "last"
        raise ValueError(
            f"frames of shape {shape} look channels-{other} (the smallest axis is not the "
            f"{layout} one): layout={layout!r} would glue them along a spatial axis; "
            f"use layout={other!r} or layout='stack'"
        )
    return layout


def stack_size(k) -> int:
    """``k``, the frames per observation, as an int in ``[1, (2**63 - 1) // 8]``.

    Raises:
        TypeError: not an integer. ValueError: out of range.
    """
    k = operator.index(k)
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if k > INT64_MAX // 8:  # its slot ids would need over 2**63 - 1 bytes
        raise ValueError(f"a batch of 1 x {k} frames is too large")
    return k


def observation_shape(shape: tuple, k: int, layout: str) -> tuple:
    """Shape of one observation of ``k`` frames of ``shape`` in ``layout``."""
    if layout == "last":
        return shape[:-1] + (k * shape[-1],)
    if layout == "first":
        return (k * shape[0],) + shape[1:]
    return (k,) + shape


class Divisor(float):
    """A ``scale`` that divides: ``dtype(frame) / dtype(divisor)``, never a multiply.

    ``np.asarray(frame).astype(np.float32) / 255.0`` (baselines' ``ScaledFloatFrame``)
    differs from a multiply by ``float32(1 / 255)`` in the last bit for 126 of the 256
    byte values; the copy kernels divide for a scale of this type (``LF_DIVIDE``).
    Internal: the scaled observations of ``lazyframes.ScaledFloatFrame`` use it.
    """

    __slots__ = ()


#: The divisor of baselines' ScaledFloatFrame.
BY_255 = Divisor(255.0)


def output_dtype(src: np.dtype, dtype, scale) -> np.dtype:
    """The dtype a copy out produces, checking the fused conversion is supported.

    Conversions follow NumPy's ``casting="same_kind"`` (so no float to int, and no
    signed to unsigned), computed as ``out = dtype(frame) * dtype(scale)``, exactly as
    ``np.asarray(obs).astype(dtype) * dtype.type(scale)``.

    Raises:
        TypeError: for an unsupported conversion, or ``scale`` with a non-float dtype.
    """
    dst = src if dtype is None else np.dtype(dtype)
    if dst != src:
        if not np.can_cast(src, dst, casting="same_kind"):
            raise TypeError(
                f"cannot convert frames of dtype {src} to {dst} (only 'same_kind' casts, "
                f"e.g. uint8 -> float32, are fused into the copy)"
            )
        if src not in _CONVERTIBLE or dst not in _CONVERTIBLE:
            raise TypeError(f"no fused conversion from {src} to {dst}")
    if scale is not None:
        if dst.kind != "f" or dst not in _CONVERTIBLE:
            raise TypeError(
                f"scale needs a float32 or float64 output dtype, got {dst}; pass dtype=np.float32"
            )
        if not isinstance(scale, (int, float, np.integer, np.floating)) or isinstance(scale, bool):
            raise TypeError(f"scale must be a real number, got {type(scale).__name__}")
    return dst


def check_out(out, shape: tuple, dtype: np.dtype) -> None:
    """Check a caller's output array before anything is written to it.

    Only a plain ``numpy.ndarray`` is accepted: a subclass can answer ``shape``,
    ``dtype`` and ``flags`` with anything (view it with ``out.view(np.ndarray)``).

    Raises:
        TypeError: if ``out`` is not an ndarray or has the wrong dtype.
        ValueError: if it has the wrong shape, is not C-contiguous, or is read-only.
    """
    if type(out) is not np.ndarray:
        raise TypeError(out_not_ndarray(out))
    if out.shape != shape:
        raise ValueError(f"out has shape {out.shape}, expected {shape}")
    if out.dtype != dtype:
        raise TypeError(f"out has dtype {out.dtype}, expected {dtype}")
    flags = out.flags  # a new flags object at each read: read once
    if not flags.c_contiguous:
        raise ValueError("out must be C-contiguous (use np.ascontiguousarray or a fresh np.empty)")
    if not flags.writeable:
        raise ValueError("out is read-only")
    if not flags.aligned:
        raise ValueError("out is not aligned")


def as_frame(frame, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """View any array-like as one frame of ``shape`` and ``dtype``, without copying if possible.

    Accepts views, read-only and non-contiguous arrays; a frame in the other byte order is
    converted. Any other dtype mismatch is rejected rather than silently cast.

    Raises:
        TypeError: object arrays, or a dtype that differs from the pool's.
        ValueError: a shape that differs from the pool's.
    """
    arr = np.asarray(frame)
    if arr.dtype.kind == "O":
        raise TypeError("frame is an object array; frames must be numeric ndarrays")
    if arr.dtype != dtype:
        if arr.dtype.newbyteorder("=") == dtype:
            arr = arr.astype(dtype)
        else:
            raise TypeError(f"frame has dtype {arr.dtype}, the pool stores {dtype}")
    if arr.shape != shape:
        raise ValueError(f"frame has shape {arr.shape}, the pool stores {shape}")
    return arr


def as_frames(frames, shape: tuple, dtype: np.dtype, lead: str = "n") -> np.ndarray:
    """View frames ``(*lead, *shape)`` (``lead``: ``"n"`` or ``"E, k"``) as :func:`as_frame` does.

    Raises:
        TypeError: object arrays, or a dtype that differs from the pool's.
        ValueError: a shape other than ``(*lead, *shape)``.
    """
    arr = np.asarray(frames)
    nlead = lead.count(",") + 1
    if arr.ndim != len(shape) + nlead:
        raise ValueError(f"frames have shape {arr.shape}, expected ({lead}, *{shape})")
    return as_frame(arr, arr.shape[:nlead] + shape, dtype)


def out_not_ndarray(out) -> str:
    """The TypeError of an ``out`` that is not a plain ndarray (a subclass: how to pass it)."""
    hint = "; pass out.view(np.ndarray)" if isinstance(out, np.ndarray) else ""
    return f"out must be a numpy.ndarray, got {type(out).__name__}{hint}"


def process_exists(pid: int) -> bool:
    """False only for a pid no process has, or a zombie's (another user's process: True)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True
    try:  # the state after the command's ")": Z, exited but not reaped
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[:1] != [b"Z"]
    except OSError:
        return True
