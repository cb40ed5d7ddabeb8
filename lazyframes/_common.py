"""Validation and geometry shared by the compiled core and its pure-NumPy twin.

Everything here runs on cold paths (pool creation, first use of a layout, errors),
so both implementations raise the very same exceptions with the very same messages.
"""

from __future__ import annotations

import importlib
import math
import operator

import numpy as np

#: The three ways to lay out k frames of shape ``S`` (see DESIGN.md, "Layouts").
#:
#: - ``"last"``: concatenate on the last (channel) axis, ``(..., C) -> (..., k*C)``,
#:   as baselines' ``LazyFrames``/``FrameStack`` (the default, so it is a drop-in);
#: - ``"first"``: concatenate on the first (channel) axis, ``(C, H, W) -> (k*C, H, W)``,
#:   as SB3's ``VecFrameStack(channels_order="first")`` and EnvPool;
#: - ``"stack"``: stack on a new leading axis, ``S -> (k, *S)``, as Gymnasium's
#:   ``FrameStackObservation`` and PyTorch's ``(k, H, W)``.
LAYOUTS = ("last", "first", "stack")

#: Default size of one arena chunk of a FramePool, in bytes (148 Atari frames of 84x84).
DEFAULT_CHUNK_BYTES = 1 << 20

# dtypes the fused conversion kernels know (kind, itemsize); any other numeric dtype
# can still be stored and copied out unconverted.
_CONVERTIBLE = frozenset(
    np.dtype(t) for t in (
        np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
        np.int64, np.uint64, np.float32, np.float64,
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
        ValueError: if any dimension is not positive.
    """
    try:
        shape = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise TypeError(f"frame shape must be a tuple of ints, got {shape!r}") from None
    if any(d <= 0 for d in shape):
        raise ValueError(f"frame shape {shape} has a dimension that is not positive")
    return shape


def check_layout(layout: str, shape: tuple) -> None:
    """Reject a layout that does not fit frames of ``shape`` (case C06 of CASES.md).

    ``"last"`` concatenates on the channel axis, so that axis must be last: it must be
    (one of) the smallest, as SB3's ``is_image_space_channels_first`` decides; 1-D frames
    (feature vectors) are fine. ``"first"`` is the mirror image. 2-D frames such as
    ``(84, 84)`` have no channel axis: concatenating would glue them along a spatial axis.

    Raises:
        ValueError: naming the frame shape and the layout to use instead.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "stack" or len(shape) == 1:
        return
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


def observation_shape(shape: tuple, k: int, layout: str) -> tuple:
    """Shape of one observation of ``k`` frames of ``shape`` in ``layout``."""
    if layout == "last":
        return shape[:-1] + (k * shape[-1],)
    if layout == "first":
        return (k * shape[0],) + shape[1:]
    return (k,) + shape


def geometry(shape: tuple, layout: str) -> tuple:
    """``(outer, inner)`` element counts of the copy kernel for one frame.

    Frame j of an observation lands, for each ``p < outer``, in the ``inner`` elements
    starting at ``(p * k + j) * inner``. ``"first"`` and ``"stack"`` have the same bytes
    (a frame is one contiguous block); ``"last"`` interleaves channels.
    """
    n = math.prod(shape)
    if layout == "last" and shape:
        return n // shape[-1], shape[-1]
    return 1, n


def requested_dtype(dtype, out):
    """The output dtype a copy out is asked for: ``dtype``, else ``out``'s, else None.

    Raises:
        TypeError: if ``out`` is given but is not an ndarray.
    """
    if out is not None and not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
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
                f"scale needs a float32 or float64 output dtype, got {dst}; "
                f"pass dtype=np.float32"
            )
        if not isinstance(scale, (int, float, np.integer, np.floating)) or isinstance(scale, bool):
            raise TypeError(f"scale must be a real number, got {type(scale).__name__}")
    return dst


def check_out(out, shape: tuple, dtype: np.dtype) -> None:
    """Check a caller's output array before anything is written to it.

    Raises:
        TypeError: if ``out`` is not an ndarray or has the wrong dtype.
        ValueError: if it has the wrong shape, is not C-contiguous, or is read-only.
    """
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
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
    if (o.stack_size, o.frame_shape, o.layout) != (first.stack_size, first.frame_shape, first.layout):
        raise ValueError(
            f"observations differ: {first.stack_size} frames of {first.frame_shape} "
            f"({first.layout!r}) and {o.stack_size} frames of {o.frame_shape} ({o.layout!r})"
        )
    if o.dtype != first.dtype:
        raise TypeError(f"observations have different dtypes: {first.dtype} and {o.dtype}")


COPY_FALSE_MESSAGE = (
    "a LazyFrames observation is not stored as one array, so it cannot be converted "
    "without a copy (copy=False). Use np.asarray(obs) (copies once, as NumPy 2 expects), "
    "or lazyframes.stack(observations, out=...) to fill a preallocated batch; the old "
    "idiom np.array(obs, copy=False) meant 'copy only if needed', which is "
    "np.asarray(obs) in NumPy 2"
)


class FrameRef:
    """One reference on one slot: the unit of sharing when observations are pickled.

    Within one ``pickle.dumps``, every observation that holds a slot gets the same
    ``FrameRef`` (the pool caches them weakly in ``pool._refs``; the pickler's memo keeps
    them alive), so each frame is written once (case C10). Unpickling pushes the frame
    into the ``default_pool`` of the core that pickled it.
    """

    __slots__ = ("pool", "slot", "__weakref__")

    def __init__(self, pool, slot):
        self.pool = pool
        self.slot = slot  # this object owns one reference

    @staticmethod
    def of(pool, slot):
        ref = pool._refs.get(slot)
        if ref is None:
            pool.retain(slot)
            ref = FrameRef(pool, slot)
            pool._refs[slot] = ref
        return ref

    def __del__(self):
        try:
            self.pool.release(self.slot)
        except Exception:  # interpreter shutdown
            pass

    def __reduce__(self):
        core = importlib.import_module(type(self.pool).__module__)
        return core._restore_frame, (self.pool.get(self.slot),)


def restore_frame(default_pool, frame):
    """Unpickle one frame into ``default_pool(shape, dtype)``; returns its FrameRef."""
    frame = np.asarray(frame)
    pool = default_pool(frame.shape, frame.dtype)
    return FrameRef(pool, pool.push(frame))


def reduce_lazybatch(batch):
    """``__reduce__`` of a LazyBatch of either core: its rows, sharing frames as LazyFrames do."""
    core = importlib.import_module(type(batch.pool).__module__)
    return core._restore_lazybatch, (tuple(batch), batch.layout)


def restore_lazybatch(rows, layout):
    """Unpickle a LazyBatch from its rows (LazyFrames of one pool)."""
    return rows[0].pool.lazy_batch([r.slots for r in rows], layout=layout)


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


def reduce_lazyframes(lz):
    """``__reduce__`` of a LazyFrames of either core: frames as shared FrameRefs."""
    core = importlib.import_module(type(lz.pool).__module__)
    refs = tuple(FrameRef.of(lz.pool, s) for s in lz.slots)
    return core._restore_lazyframes, (refs, lz.layout)


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
