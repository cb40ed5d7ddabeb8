"""Validation and geometry shared by the compiled core and its pure-NumPy twin.

Everything here runs on cold paths (pool creation, first use of a layout, errors),
so both implementations raise the very same exceptions with the very same messages.
"""

from __future__ import annotations

import functools
import numbers
import operator
from collections.abc import Mapping

import numpy as np

#: The three ways to lay out k frames of shape ``S`` (see docs/DESIGN.md, "Layouts").
#:
#: - ``"last"``: concatenate on the last (channel) axis, ``(..., C) -> (..., k*C)``,
#:   as baselines' ``LazyFrames``/``FrameStack`` (the default, so it is a drop-in);
#: - ``"first"``: concatenate on the first (channel) axis, ``(C, H, W) -> (k*C, H, W)``,
#:   as SB3's ``VecFrameStack(channels_order="first")`` and EnvPool;
#: - ``"stack"``: stack on a new leading axis, ``S -> (k, *S)``, as Gymnasium's
#:   ``FrameStackObservation`` and PyTorch's ``(k, H, W)``.
LAYOUTS = ("last", "first", "stack")

#: Most axes a frame may have (an observation batch adds two; NumPy allows 64).
MAX_NDIM = 32

#: Largest slot id, row count or byte count (int64).
INT64_MAX = 2**63 - 1

#: Default size of one arena chunk of a FramePool, in bytes (148 Atari frames of 84x84).
DEFAULT_CHUNK_BYTES = 1 << 20

# Frame compression (docs/COMPRESSION.md): codec names, and the default chosen by measurement.
CODECS = ("lz4", "lz4hc", "zstd")
DEFAULT_COMPRESSION = {"codec": "lz4", "level": 9, "group": 16}
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
            wrong_type("compress", "a bool or a mapping of codec, level, group", compress)
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
            raise TypeError(wrong_type(key, "an int", opts[key]))
        v = int(opts[key])
        if not 1 <= v <= top:
            raise ValueError(f"{key} must be in [1, {top}], got {v}")
        opts[key] = v
    return opts


#: Kinds of blob in an :func:`encode_frames` container: a compressed frame, a compressed
#: XOR delta against the previous frame, or the frame's raw bytes.
KIND_KEY, KIND_DELTA, KIND_RAW = 0, 1, 2


def frames_to_encode(frames) -> np.ndarray:
    """``frames`` as a numeric ndarray with a leading axis (TypeError/ValueError otherwise)."""
    arr = np.asarray(frames)
    if arr.ndim < 1:
        raise ValueError(f"frames must have a leading axis, got shape {arr.shape}")
    frame_dtype(arr.dtype)
    return arr


def check_container(payload, offsets, kinds, frame_bytes: int) -> tuple:
    """Check an :func:`encode_frames` container's sizes and offsets, before any allocation.

    Returns:
        ``(payload, offsets, kinds)`` as a uint8 array, an int64 array and a uint8 array.

    Raises:
        TypeError: a payload that is not bytes-like, non-integer offsets or kinds.
        ValueError: shapes that disagree, offsets that are not 0 then increasing up to
            the payload's end, an unknown kind, a delta first, or a raw blob whose size
            is not the frame's.
    """
    try:
        data = np.frombuffer(memoryview(payload).cast("B"), np.uint8)
    except TypeError:
        raise TypeError(wrong_type("payload", "bytes-like", payload)) from None
    offs, kds = as_ints(offsets, "offsets"), as_ints(kinds, "kinds")
    if offs.ndim != 1 or kds.ndim != 1 or offs.shape[0] != kds.shape[0] + 1:
        raise ValueError(f"offsets {offs.shape} and kinds {kds.shape} must be (n + 1,) and (n,)")
    # compared in their own dtype first: no value wraps when converted
    if ((offs < 0) | (offs > data.size)).any() or ((kds < KIND_KEY) | (kds > KIND_RAW)).any():
        raise ValueError("offsets must be in [0, len(payload)], kinds KIND_KEY/DELTA/RAW")
    offs, kds = offs.astype(np.int64), kds.astype(np.uint8)
    sizes = np.diff(offs)
    if offs[0] != 0 or offs[-1] != data.size or (sizes <= 0).any():
        raise ValueError("offsets must start at 0 and increase up to the payload's length")
    if kds.size and kds[0] == KIND_DELTA:
        raise ValueError("the first blob is a delta: it has no previous frame")
    if (sizes[kds == KIND_RAW] != frame_bytes).any():
        raise ValueError(f"a raw blob is not {frame_bytes} bytes, one frame")
    return data, offs, kds


def bad_blob(i: int) -> str:
    return f"blob {i} of the container does not decode to one frame"


def compression_differs(have: dict, want: dict) -> str:
    return f"the pool already compresses with {have}; cannot switch to {want}"


# dtypes the fused conversion kernels know (kind, itemsize); any other numeric dtype
# can still be stored and copied out unconverted.
_CONVERTIBLE = frozenset(
    np.dtype(t)
    for t in (
        np.bool_,
        np.int8,
        np.uint8,
        np.int16,
        np.uint16,
        np.int32,
        np.uint32,
        np.int64,
        np.uint64,
        np.float32,
        np.float64,
    )
)


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
    raise ValueError(bad_layout(layout))


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
        raise ValueError(scalar_layout(layout))
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


def chunk_bytes(n) -> int:
    """``chunk_bytes`` of a FramePool as an int in ``[1, 2**63 - 1]``.

    Raises:
        TypeError: not an integer. ValueError: out of range.
    """
    n = operator.index(n)
    if n <= 0:
        raise ValueError(chunk_bytes_not_positive(n))
    if n > INT64_MAX:
        raise ValueError(f"chunk_bytes must be at most 2**63 - 1, got {n}")
    return n


def stack_size(k) -> int:
    """``k``, the frames per observation, as an int in ``[1, (2**63 - 1) // 8]``.

    Raises:
        TypeError: not an integer. ValueError: out of range.
    """
    k = operator.index(k)
    if k < 1:
        raise ValueError(stack_size_not_positive(k))
    check_batch_size(1, k)
    return k


def check_batch_size(n: int, k: int) -> None:
    """Refuse ``n`` observations of ``k`` frames whose ids would need over 2**63 - 1 bytes.

    Compared, not multiplied, so nothing can overflow.

    Raises:
        ValueError: too large.
    """
    if k > INT64_MAX // 8 // max(1, n):
        raise ValueError(batch_too_large(n, k))


def observation_shape(shape: tuple, k: int, layout: str) -> tuple:
    """Shape of one observation of ``k`` frames of ``shape`` in ``layout``."""
    if layout == "last":
        return shape[:-1] + (k * shape[-1],)
    if layout == "first":
        return (k * shape[0],) + shape[1:]
    return (k,) + shape


def requested_dtype(dtype, out):
    """The output dtype a copy out is asked for: ``dtype``, else ``out``'s, else None.

    Raises:
        TypeError: if ``out`` is given but is not an ndarray (subclasses are refused).
    """
    if out is not None and type(out) is not np.ndarray:
        raise TypeError(out_not_ndarray(out))
    return dtype if dtype is not None or out is None else out.dtype


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
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous (use np.ascontiguousarray or a fresh np.empty)")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    if not out.flags.aligned:
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


def as_slots(slots, k=None) -> np.ndarray:
    """Slot ids as an int64 array; ``k`` checks the last axis (the stack size).

    Raises:
        TypeError: non-integer slot ids.
        ValueError: an empty stack or a wrong number of slots per observation.
    """
    arr = np.asarray(slots)
    if arr.dtype.kind not in "iu":
        if arr.size == 0 and arr.dtype.kind == "f":
            arr = arr.astype(np.int64)
        else:
            raise TypeError(f"slot ids must be integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and arr.max() > INT64_MAX:  # would wrap to < 0
        raise IndexError(slot_out_of_range(int(arr.max())))
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    if k is not None and (arr.ndim == 0 or arr.shape[-1] != k):
        raise ValueError(f"expected {k} slot ids per observation, got shape {arr.shape}")
    return arr


def index_frame(i, count: int, what: str = "frames") -> int:
    """Normalise a frame/channel (or env) index like a sequence index.

    Raises:
        IndexError: out of range.
    """
    i = operator.index(i)
    if i < 0:
        i += count
    if not 0 <= i < count:
        raise IndexError(f"index {i} is out of range for {count} {what}")
    return i


def check_same_geometry(first, o) -> None:
    """Observations stacked into one batch must have one geometry (``stack``).

    Raises:
        ValueError: different stack sizes, frame shapes or layouts.
        TypeError: different dtypes.
    """
    geometry = (first.stack_size, first.frame_shape, first.layout)
    if (o.stack_size, o.frame_shape, o.layout) != geometry:
        raise ValueError(
            f"observations differ: {first.stack_size} frames of {first.frame_shape} "
            f"({first.layout!r}) and {o.stack_size} frames of {o.frame_shape} ({o.layout!r})"
        )
    if o.dtype != first.dtype:
        raise TypeError(f"observations have different dtypes: {first.dtype} and {o.dtype}")


def array_protocol(lz, dtype, copy, fused):
    """``__array__(dtype, copy)`` of an observation or batch (NumPy 2 protocol).

    ``fused(dtype)`` is the one copy out with the conversion fused; a conversion the
    kernels do not fuse (e.g. float16 frames, or a cast NumPy calls unsafe) is done as
    NumPy would, on the copied-out array.
    """
    if copy is False:
        raise ValueError(COPY_FALSE_MESSAGE)
    if dtype is None:
        return fused(None)
    try:
        return fused(dtype)
    except TypeError:
        return fused(None).astype(dtype)


def dlpack(lz, stream=None, max_version=None, dl_device=None, copy=None):
    """``lz.__dlpack__(...)``: a DLPack capsule of a fresh materialised array.

    This is what makes ``torch.as_tensor(obs)`` / ``torch.tensor(obs)`` and
    ``np.from_dlpack(obs)`` take one copy out instead of walking the sequence protocol
    (row by row, ~1000x slower; case C05). ``copy=False`` raises BufferError: a copy
    cannot be avoided.
    """
    if copy is False:
        raise BufferError(COPY_FALSE_MESSAGE)
    kwargs = {"stream": stream, "dl_device": dl_device, "copy": copy}
    if max_version is not None:
        kwargs["max_version"] = max_version
    return np.asarray(lz).__dlpack__(**kwargs)


#: ``__dlpack_device__()`` of every observation: (kDLCPU, 0).
DLPACK_DEVICE = (1, 0)


def lazyframes_eq(lz, other):
    """``lz == other``: one bool, as ``np.array_equal`` on the materialised arrays."""
    if hasattr(other, "__array__"):
        o = np.asarray(other)
        return lz.shape == o.shape and bool(np.array_equal(np.asarray(lz), o))
    return NotImplemented


# -- the types of both cores ------------------------------------------------------
# Recognised by class name and module, so this module never imports the compiled core.
_CORE_MODULES = ("lazyframes._core", "lazyframes._reference")


@functools.lru_cache(maxsize=256)
def _core_type_names(cls: type) -> frozenset:
    """Names of the core classes ``cls`` is or derives from (cached: a hot-path check)."""
    return frozenset(c.__name__ for c in cls.__mro__ if c.__module__ in _CORE_MODULES)


def _is_core_type(x: object, name: str) -> bool:
    return name in _core_type_names(type(x))  # type: ignore[arg-type]  # types hash


def is_framepool(x) -> bool:
    """Whether ``x`` is a ``FramePool`` of either core."""
    return _is_core_type(x, "FramePool")


def is_frameref(x) -> bool:
    """Whether ``x`` is a ``FrameRef`` of either core."""
    return _is_core_type(x, "FrameRef")


def is_lazyframes(x) -> bool:
    """Whether ``x`` is a ``LazyFrames`` of either core."""
    return _is_core_type(x, "LazyFrames")


def is_lazybatch(x) -> bool:
    """Whether ``x`` is a ``LazyBatch`` of either core."""
    return _is_core_type(x, "LazyBatch")


def check_pool(x, pool, what: str) -> None:
    """Refuse an owner (``FrameRef``, ``LazyFrames``, ...) of another pool than ``pool``.

    Raises:
        ValueError: ``x.pool is not pool``.
    """
    if x.pool is not pool:
        raise ValueError(other_pool(what))


# -- rows, frames and outputs -------------------------------------------------------
def as_ints(x, what: str) -> np.ndarray:
    """``x`` as an ndarray of an integer dtype (an empty list is fine), not yet converted.

    Raises:
        TypeError: non-integer values.
    """
    arr = np.asarray(x)
    if arr.dtype.kind in "iu":
        return arr
    if arr.size == 0 and arr.dtype.kind == "f":
        return arr.astype(np.int64)
    raise TypeError(f"{what} must be integers, got dtype {arr.dtype}")


def as_rows(rows, n: int, *, distinct: bool = False) -> np.ndarray:
    """Row indices as a fresh int64 array, each in ``[0, n)`` (no negative indexing).

    The range is checked on the caller's values before any conversion, so no value
    (e.g. ``2**63 - 1`` or a huge uint64) can wrap or overflow.

    Raises:
        TypeError: non-integer rows.
        ValueError: not 1-D, or (``distinct``) a row given twice.
        IndexError: a row out of range.
    """
    arr = as_ints(rows, "rows")
    if arr.ndim != 1:
        raise ValueError(f"rows must be a 1-D array, got shape {arr.shape}")
    bad = np.flatnonzero((arr < 0) | (arr >= n))
    if bad.size:
        raise IndexError(row_out_of_range(int(arr[bad[0]]), n))
    arr = arr.astype(np.int64)
    if distinct:
        uniq, counts = np.unique(arr, return_counts=True)
        if uniq.size != arr.size:
            raise ValueError(f"row {int(uniq[counts > 1][0])} appears more than once in rows")
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
        raise ValueError(frames_shape(arr.shape, lead, shape))
    return as_frame(arr, arr.shape[:nlead] + shape, dtype)


def check_no_overlap(out, inputs: dict) -> None:
    """``out`` (an array, or a pair of arrays) may not share memory with any input array.

    Runs before the other output checks; an ``out`` that is not an ndarray is left to them.

    Raises:
        ValueError: the two arrays of a pair overlap, or ``out`` overlaps the named input.
    """
    outs = [
        o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, np.ndarray)
    ]
    if len(outs) == 2 and np.may_share_memory(outs[0], outs[1]):
        raise ValueError(OUT_PAIR_OVERLAP)
    for o in outs:
        for name, x in inputs.items():
            if isinstance(x, np.ndarray) and np.may_share_memory(o, x):
                raise ValueError(out_overlaps(name))


# -- messages -----------------------------------------------------------------------
# Every error message both cores raise that is not written in a check above.
COPY_FALSE_MESSAGE = (
    "a LazyFrames observation is not stored as one array, so it cannot be converted "
    "without a copy (copy=False). Use np.asarray(obs) (copies once, as NumPy 2 expects), "
    "or lazyframes.stack(observations, out=...) to fill a preallocated batch; the old "
    "idiom np.array(obs, copy=False) meant 'copy only if needed', which is "
    "np.asarray(obs) in NumPy 2"
)
POOL_NOT_PICKLABLE = (
    "a FramePool cannot be pickled; pickle the observations (LazyFrames) or use ReplayBuffer.save"
)
TABLE_NOT_PICKLABLE = "a SlotTable cannot be pickled; use ReplayBuffer.save"
FRAMEREF_NO_CONSTRUCTOR = "FrameRef has no public constructor; FramePool.push returns one"
LAZYBATCH_NO_CONSTRUCTOR = "use FramePool.lazy_batch(slots, layout=...) to make a LazyBatch"
OBJECT_FRAME = "frame is an object array; frames must be numeric ndarrays"
NO_FRAMES = "LazyFrames needs at least one frame"
NO_OBSERVATIONS = "stack needs at least one observation"
PUSH_BATCH_EMPTY = "push_batch needs at least one frame"
OUT_PAIR = "out must be a pair of ndarrays"
OUT_PAIR_OVERLAP = "the two arrays of out overlap"
OUT_CHANGED = "out changed while the call was checking its other arguments"
ID_OVER_INT32 = "a SlotTable stores slot ids as int32: this id is above 2**31 - 1"
ENABLE_COMPRESSION_OFF = "enable_compression needs compress=True or a mapping of options"
POOL_BUSY = "a copy out of this pool is running in another thread; enable compression first"
BLOB_CORRUPT = "a compressed frame does not decode: the pool's memory is corrupted"


def scalar_layout(layout: str) -> str:
    return f"scalar frames cannot be concatenated (layout={layout!r}); use layout='stack'"


def out_not_ndarray(out) -> str:
    hint = "; pass out.view(np.ndarray)" if isinstance(out, np.ndarray) else ""
    return f"out must be a numpy.ndarray, got {type(out).__name__}{hint}"


def already_initialised(name: str) -> str:
    return f"{name}.__init__ called twice"


def bad_layout(layout) -> str:
    return f"layout must be one of {LAYOUTS}, got {layout!r}"


def batch_too_large(n: int, k: int) -> str:
    return f"a batch of {n} x {k} frames is too large"


def frames_shape(shape: tuple, lead: str, frame_shape: tuple) -> str:
    return f"frames have shape {shape}, expected ({lead}, *{frame_shape})"


def slot_out_of_range(s: int) -> str:
    return f"slot {s} is out of range for this pool"


def slot_free(s: int) -> str:
    return f"slot {s} is free (its frame was released)"


def not_initialised(name: str) -> str:
    return f"this {name} was not initialised"


def not_restorable(name: str) -> str:
    return f"a {name} cannot be restored from pickled state"


def other_pool(what: str) -> str:
    return f"this {what} belongs to another pool"


def out_overlaps(what: str) -> str:
    return f"out overlaps {what}"


def wrong_type(what: str, expected: str, x) -> str:
    return f"{what} must be {expected}, got {type(x).__name__}"


def bad_slots_shape(shape: tuple, dims: str = "(n, k)") -> str:
    if dims == "k":
        return f"slots must be a non-empty 1-D sequence, got shape {shape}"
    return f"slots must have shape {dims} with k >= 1, got {shape}"


def chunk_bytes_not_positive(n: int) -> str:
    return f"chunk_bytes must be positive, got {n}"


def frames_differ(what: str, a, b) -> str:
    return f"frames have different {what}: {a} and {b}"


def stack_not_lazyframes(x) -> str:
    return f"stack takes LazyFrames, got {type(x).__name__}; use np.stack for ndarrays"


def lazybatch_index(x) -> str:
    return (
        f"LazyBatch indices must be an int (one env's LazyFrames) or a slice, got "
        f"{type(x).__name__}; use np.asarray(batch)[...] for array indexing"
    )


def stack_size_not_positive(k: int) -> str:
    return f"k must be at least 1, got {k}"


def restart_shape(shape: tuple, n: int) -> str:
    return f"restart has shape {shape}, expected ({n},)"


def rows_count(what: str, got: int, expected: int) -> str:
    return f"{what} has {got} rows, expected {expected}"


def batch_geometry(k: int, layout: str, k2: int, layout2: str) -> str:
    return f"other has {k2} frames per row in layout {layout2!r}, expected {k} in layout {layout!r}"


def row_out_of_range(r: int, n: int) -> str:
    return f"row {r} is out of range for {n} rows"


def row_empty(r: int) -> str:
    return f"row {r} is empty"


def table_shape(rows: int, width: int) -> str:
    return f"a SlotTable needs rows >= 0 and width >= 1, got ({rows}, {width})"


def table_shrink(rows: int, current: int) -> str:
    """ValueError of ``SlotTable.grow`` to fewer rows than it has."""
    return f"a SlotTable grows only: {rows} rows requested, it has {current}"


def table_too_large(rows: int, width: int) -> str:
    """ValueError when ``rows * width * 8`` bytes exceed 2**63 - 1 (MemoryError if malloc fails)."""
    return f"a SlotTable of ({rows}, {width}) slot ids is too large"


def parts_width(got: int, width: int) -> str:
    return f"parts have {got} frames per row, the table {width}"


def bad_columns(cols, width: int) -> str:
    return f"columns {cols!r} must be (start, stop) with 0 <= start < stop <= {width}"


def pair_widths(k1: int, k2: int) -> str:
    return f"cols1 and cols2 have different widths: {k1} and {k2}"


def step_arrays(n: int) -> str:
    return (
        f"flags and rewards must be C-contiguous 1-D ndarrays of uint8 and float32 of at "
        f"least {n} entries"
    )


def pair_lengths(n1: int, n2: int) -> str:
    return f"rows1 and rows2 have different lengths: {n1} and {n2}"


def pair_dtypes(d1, d2) -> str:
    return f"the two arrays of out have different dtypes: {d1} and {d2}"


def index_shape(shape: tuple, n: int, width: int) -> str:
    return f"index has shape {shape}, expected ({n}, {width})"


def index_out_of_range(v: int, m: int) -> str:
    return f"index {v} is out of range for a source of {m} frames"


def restore_needs(what: str, x) -> str:
    got = type(x).__name__
    if isinstance(x, tuple):
        got = f"a tuple of {', '.join(sorted({type(i).__name__ for i in x}))}" if x else "()"
    return f"a pickled {what} is malformed: got {got}"


def rows_stack_sizes(a: int, b: int) -> str:
    return f"rows have different stack sizes: {a} and {b}"


# -- SumTree (prioritized replay) messages, shared by both cores ---------------------
def prio_dtype(name: str, dt) -> str:
    return f"{name} must be real numbers, got dtype {dt}"


def prio_int_dtype(name: str, dt) -> str:
    return f"{name} must be integers, got dtype {dt}"


def prio_index(j: int, v: int, n: int) -> str:
    return f"indices[{j}] = {v} is out of range for a SumTree of {n} leaves"


def prio_lengths(a: int, b: int, what: str = "values") -> str:
    return f"indices and {what} differ in size: {a} and {b}"


def prio_value(j: int, v: float) -> str:
    return f"values[{j}] = {v!r}: leaves must be finite and >= 0"


def prio_empty() -> str:
    return "no transition can be sampled: every leaf of the SumTree is empty"


def prio_infinite() -> str:
    return "cannot sample: the leaves of the SumTree sum to more than float64 max"
