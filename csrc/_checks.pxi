# Checks of the core's own arguments, raised before C trusts anything (cold paths): an
# encode_frames container, row and id arrays, outputs that overlap inputs.

def _check_container(payload, offsets, kinds, frame_bytes: int) -> tuple:
    """Check an :func:`encode_frames` container's sizes and offsets, before any allocation.

    Returns:
        ``(payload, offsets, kinds)`` as a uint8 array, an int64 array and a uint8 array.

    Raises:
        TypeError: a payload that is not bytes-like, non-integer offsets or kinds.
        ValueError: shapes that disagree, offsets that are not 0 then non-decreasing up
            to the payload's end, an unknown kind, or a raw blob whose size is not the
            frame's.
    """
    try:
        data = np.frombuffer(memoryview(payload).cast("B"), np.uint8)
    except TypeError:
        raise TypeError(f"payload must be bytes-like, got {type(payload).__name__}") from None
    offs, kds = _as_ints(offsets, "offsets"), _as_ints(kinds, "kinds")
    if offs.ndim != 1 or kds.ndim != 1 or offs.shape[0] != kds.shape[0] + 1:
        raise ValueError(f"offsets {offs.shape} and kinds {kds.shape} must be (n + 1,) and (n,)")
    # compared in their own dtype first: no value wraps when converted
    if ((offs < 0) | (offs > data.size)).any() or ((kds < KIND_KEY) | (kds > KIND_PACKED)).any():
        raise ValueError("offsets must be in [0, len(payload)], kinds one of KIND_*")
    offs, kds = offs.astype(np.int64), kds.astype(np.uint8)
    sizes = np.diff(offs)
    if offs[0] != 0 or offs[-1] != data.size or (sizes < 0).any():  # a patch may be empty
        raise ValueError("offsets must start at 0 and not decrease up to the payload's length")
    if (sizes[kds == KIND_RAW] != frame_bytes).any():
        raise ValueError(f"a raw blob is not {frame_bytes} bytes, one frame")
    if (sizes > frame_bytes + LF_BLOB_OVERHEAD).any():  # no coder makes one
        raise ValueError(f"a blob is larger than any of a {frame_bytes}-byte frame")
    return data, offs, kds


def _as_ints(x, what: str) -> np.ndarray:
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


def _as_rows(rows, n: int, *, distinct: bool = False) -> np.ndarray:
    """Row indices as a fresh int64 array, each in ``[0, n)`` (no negative indexing).

    The range is checked on the caller's values before any conversion, so no value
    (e.g. ``2**63 - 1`` or a huge uint64) can wrap or overflow.

    Raises:
        TypeError: non-integer rows.
        ValueError: not 1-D, or (``distinct``) a row given twice.
        IndexError: a row out of range.
    """
    arr = _as_ints(rows, "rows")
    if arr.ndim != 1:
        raise ValueError(f"rows must be a 1-D array, got shape {arr.shape}")
    bad = np.flatnonzero((arr < 0) | (arr >= n))
    if bad.size:
        raise IndexError(f"row {int(arr[bad[0]])} is out of range for {n} rows")
    arr = arr.astype(np.int64)
    if distinct:
        uniq, counts = np.unique(arr, return_counts=True)
        if uniq.size != arr.size:
            raise ValueError(f"row {int(uniq[counts > 1][0])} appears more than once in rows")
    return arr


def _check_no_overlap(out, inputs: dict) -> None:
    """``out`` (an array, or a pair of arrays) may not share memory with any input array.

    Runs before the other output checks; an ``out`` that is not an ndarray is left to them.

    Raises:
        ValueError: the two arrays of a pair overlap, or ``out`` overlaps the named input.
    """
    outs = [
        o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, np.ndarray)
    ]
    if len(outs) == 2 and np.may_share_memory(outs[0], outs[1]):
        raise ValueError("the two arrays of out overlap")
    for o in outs:
        for name, x in inputs.items():
            if isinstance(x, np.ndarray) and np.may_share_memory(o, x):
                raise ValueError(f"out overlaps {name}")
