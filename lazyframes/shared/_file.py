"""A SharedReplay's file (docs/SHARED.md): its header, its arrays, and their mapping.

:func:`_header` makes the header, :func:`_check_header` checks it in every process that
maps the file; :class:`_Mapping`, the base of the writer and the readers, maps it.
"""

from __future__ import annotations

import math
import mmap
import os
import stat
from typing import Any

import numpy as np

from .. import _checks as C

MAGIC = 0x314250524653464C  # b"LFSFRPB1" little-endian
VERSION = 1
MAX_NDIM = 8
#: Header words (int64): the geometry, then the two counters the writer publishes.
_MAGIC, _VERSION, _K, _ROWS, _SLOTS, _FRAME_BYTES, _NDIM = range(7)
_SHAPE = 7  # MAX_NDIM words
_DTYPE = _SHAPE + MAX_NDIM  # 2 words: the dtype string, 16 bytes
_FRAMES_WRITTEN = _DTYPE + 2
_ROWS_WRITTEN = _FRAMES_WRITTEN + 1
#: Compressed files (docs/SHARED.md): the byte log's size and chain bound (0 when frames
#: are stored raw), then the log's write head and the oldest row worth drawing.
_LOG_BYTES, _GROUP, _LOG_HEAD, _ROWS_FROM = range(_ROWS_WRITTEN + 1, _ROWS_WRITTEN + 5)
HEADER_WORDS = 32
#: Frame dtypes a file may declare (its dtype string is checked against these).
_DTYPES = frozenset(
    np.dtype(t).str for t in ("u1", "i1", "<u2", "<i2", "<u4", "<i4", "<f2", "<f4", "<f8")
)
#: Largest blob a frame of ``fb`` bytes compresses to: Blosc2's header on incompressible data.
BLOB_OVERHEAD = 32
#: A compressed file's record of each frame slot's blob: its position in the log (bytes
#: written before it), length, kind (``KIND_KEY``, ``KIND_DELTA``, ``KIND_RAW``), and
#: how many frames back its reference (``back``, deltas) and its chain's keyframe
#: (``base``) are; ``depth``: deltas between it and that keyframe.
BLOB_RECORD = np.dtype(
    {
        "names": ["pos", "len", "back", "base", "kind", "depth"],
        "formats": ["<i8", "<u4", "<u4", "<u4", "u1", "u1"],
        "offsets": [0, 8, 12, 16, 20, 21],
        "itemsize": 24,
    }
)


def _arrays(k: int, rows: int, slots: int, frame_bytes: int, log_bytes: int = 0) -> list:
    """``(name, dtype, count)`` of the file's arrays after the header, in order.

    ``log_bytes`` 0: the frames raw, one per slot; else each slot's blob record and the
    byte log of blobs.
    """
    out = [("frame_seq", "<i8", slots), ("row_seq", "<i8", rows), ("refs", "<i8", rows * 2 * k)]
    out += [("actions", "<i8", rows), ("rewards", "<f4", rows), ("flags", "u1", rows)]
    if log_bytes:
        return out + [("blobs", BLOB_RECORD, slots), ("log", "u1", log_bytes)]
    return out + [("frames", "u1", slots * frame_bytes)]


def _layout(k: int, rows: int, slots: int, frame_bytes: int, log_bytes: int = 0) -> dict:
    """Byte offsets of the file's arrays (:func:`_arrays`), and its size: 8-byte aligned."""
    off, out = HEADER_WORDS * 8, {}
    for name, dtype, count in _arrays(k, rows, slots, frame_bytes, log_bytes):
        out[name] = off
        off += -(-np.dtype(dtype).itemsize * count // 8) * 8
    out["size"] = off
    return out


def _header(k: int, rows: int, slots: int, shape: tuple, dtype, lb: int, group: int) -> bytes:
    """The header of a file of this geometry, as bytes (what :func:`_check_header` reads)."""
    head = np.zeros(HEADER_WORDS, "<i8")
    head[:_SHAPE] = MAGIC, VERSION, k, rows, slots, math.prod(shape) * dtype.itemsize, len(shape)
    head[_SHAPE : _SHAPE + len(shape)] = shape
    head[_DTYPE : _DTYPE + 2] = np.frombuffer(dtype.str.encode().ljust(16, b"\0"), "<i8")
    head[[_LOG_BYTES, _GROUP]] = lb, group
    return head.tobytes()


def _check_header(head: np.ndarray, size: int, path: str) -> tuple:
    """``(k, rows, slots, frame_shape, dtype, log_bytes, group)`` of a header, checked.

    Raises:
        ValueError: not a SharedReplay file, or a header that disagrees with the size.
    """
    if head[_MAGIC] != MAGIC or head[_VERSION] != VERSION:
        raise ValueError(f"{path} is not a SharedReplay file of version {VERSION}")
    k, rows, slots, fb, ndim = (int(head[i]) for i in (_K, _ROWS, _SLOTS, _FRAME_BYTES, _NDIM))
    dts = head[_DTYPE : _DTYPE + 2].tobytes().rstrip(b"\0").decode("ascii", "replace")
    if not (0 <= ndim <= MAX_NDIM) or dts not in _DTYPES or min(k, rows, slots) < 1:
        raise ValueError(f"{path}: a corrupt header")
    shape = tuple(int(d) for d in head[_SHAPE : _SHAPE + ndim])
    dt = np.dtype(dts)
    if any(d < 1 for d in shape) or math.prod(shape) * dt.itemsize != fb:
        raise ValueError(f"{path}: a corrupt header (frame shape {shape}, {fb} bytes)")
    lb, group = int(head[_LOG_BYTES]), int(head[_GROUP])
    if lb:
        bad = lb < 4 * (fb + BLOB_OVERHEAD) or lb > size or slots >= 1 << 31
        bad = bad or not 1 <= group <= C.MAX_GROUP
    else:
        bad = group != 0
    if bad:
        raise ValueError(f"{path}: a corrupt header (log of {lb} bytes, group {group})")
    if _layout(k, rows, slots, fb, lb)["size"] != size:
        raise ValueError(f"{path}: its size ({size} bytes) does not match its header")
    return k, rows, slots, shape, dt, lb, group


#: The attributes that view the mapping (dropped by close).
_VIEWS = "_head _words _frame_seq _row_seq _refs _actions _rewards _flags _frames _blobs _log"


class _Mapping:
    """The file mapped, its geometry and its counters: what the writer and readers share."""

    _path: str  # the file; _open maps it (_mm) and views its arrays (None once closed)
    _mm: Any

    def __init__(self, *_: Any, **__: Any):
        raise TypeError("use SharedReplay.create(path, ...) or SharedReplay.attach(path)")

    def _open(self, path: str, writable: bool) -> None:
        """Map ``path`` and make the array views, after checking its header and size."""
        flags = os.O_RDWR if writable else os.O_RDONLY
        fd = os.open(path, flags | os.O_NONBLOCK)  # a FIFO would block until a writer came
        try:
            st = os.fstat(fd)
            size = st.st_size
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{path} is not a SharedReplay file (not a regular file)")
            if size < HEADER_WORDS * 8:
                raise ValueError(f"{path} is not a SharedReplay file (too short)")
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
            mm = mmap.mmap(fd, size, access=access)
            if not writable and hasattr(mmap, "MADV_RANDOM"):
                # a reader's faults read one page, not the pages around it: samples are
                # random, and on a disk read-around doubles a cold batch's time
                mm.madvise(mmap.MADV_RANDOM)
        finally:
            os.close(fd)
        head = np.frombuffer(mm, "<i8", HEADER_WORDS).copy()
        try:
            geometry = _check_header(head, size, path)
        except ValueError:
            mm.close()
            raise
        self._mm, self._writable = mm, writable
        k, R, F, self._frame_shape, self._dtype, L, self._group = geometry
        self._k, self._rows, self._slots, self._log_bytes = k, R, F, L
        self._fb = fb = math.prod(self._frame_shape) * self._dtype.itemsize
        lay, buf = _layout(k, R, F, fb, L), memoryview(mm)
        self._head = np.frombuffer(buf, "<i8", HEADER_WORDS)
        v = {name: np.frombuffer(buf, dt, n, lay[name]) for name, dt, n in _arrays(k, R, F, fb, L)}
        self._frame_seq, self._row_seq, self._refs = v["frame_seq"], v["row_seq"], v["refs"]
        self._actions, self._rewards, self._flags = v["actions"], v["rewards"], v["flags"]
        self._refs = self._refs.reshape(R, 2 * k)
        if L:  # the records as 3 words: pos; len | back << 32; base | kind << 32 | depth << 40
            self._blobs, self._log = v["blobs"], v["log"]
            self._words = np.frombuffer(buf, "<i8", 3 * F, lay["blobs"]).reshape(F, 3)
        else:
            self._frames = v["frames"].reshape(F, fb)

    @property
    def path(self) -> str:
        """The file."""
        return self._path

    @property
    def capacity(self) -> int:
        """Rows (transitions) kept."""
        return self._rows

    @property
    def frame_capacity(self) -> int:
        """Frame slots."""
        return self._slots

    @property
    def stack_size(self) -> int:
        """``k``, frames per observation."""
        return self._k

    @property
    def frame_shape(self) -> tuple:
        """Shape of one frame."""
        return self._frame_shape

    @property
    def dtype(self) -> np.dtype:
        """The frames' dtype."""
        return self._dtype

    @property
    def frames_written(self) -> int:
        """Frames written since the file was made (the next frame's number)."""
        self._live()
        return int(self._head[_FRAMES_WRITTEN])

    @property
    def rows_written(self) -> int:
        """Rows written since the file was made (the next row's number)."""
        self._live()
        return int(self._head[_ROWS_WRITTEN])

    def __len__(self) -> int:
        """Rows held: the last ``capacity`` written, less the oldest ones whose frames left."""
        first, written = self._held()
        return written - first

    def _held(self) -> tuple:
        """``(first, written)``: the rows held are ``first .. written - 1``.

        The oldest row worth drawing is read before the count, so it is never above it.
        """
        self._live()
        first = int(self._head[_ROWS_FROM])
        written = self.rows_written
        return min(max(first, written - self._rows, 0), written), written

    def close(self, *, unlink=False) -> None:
        """Unmap the file; the writer may remove it (``unlink=True``).

        Readers that still map it keep reading what it holds (the OS keeps a removed
        file's memory until its last mapping goes).
        """
        if unlink and not self._writable:
            raise ValueError("only the writer removes the file")
        for name in _VIEWS.split():
            setattr(self, name, None)
        mm, self._mm = getattr(self, "_mm", None), None
        if mm is not None:
            mm.close()
        if unlink:
            os.unlink(self._path)

    def __reduce__(self):
        raise TypeError("a SharedReplay cannot be pickled; pass its path and attach it")

    def _live(self) -> None:
        """Raises ValueError once :meth:`close` was called."""
        if self._mm is None:
            raise ValueError(f"{self._path} is closed")
