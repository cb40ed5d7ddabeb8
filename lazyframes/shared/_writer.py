"""A SharedReplay's writer: it creates the file, then writes frames and rows under seqlocks.

Sequence words -1, the data, the numbers, then the counters (docs/SHARED.md); compressed
frames are coded and placed in the byte log (:meth:`_Writer._plan`) before any write.
"""

from __future__ import annotations

import math
import operator
import os
from typing import Any, NamedTuple, TypeVar

import numpy as np

from .. import _checks as C
from .. import _core, transport
from ..replay._args import Parser, _bits, flags_array
from ._file import (
    _DTYPES,
    _FRAMES_WRITTEN,
    _LOG_HEAD,
    _ROWS_FROM,
    _ROWS_WRITTEN,
    BLOB_OVERHEAD,
    BLOB_RECORD,
    MAX_NDIM,
    _header,
    _layout,
    _Mapping,
)

#: The writer keeps the raw bytes of its last frames (at most this many bytes) to code
#: new frames as deltas against them.
RAW_CACHE_BYTES = 32 << 20

_W = TypeVar("_W", bound="_Writer")


class _Plan(NamedTuple):
    """Compressed frames ready to write: their numbers, records, blobs and the log's head."""

    nums: np.ndarray
    records: np.ndarray  # BLOB_RECORD (m,)
    blobs: list
    head: int


class _Writer(_Mapping):
    """The writer's side of a SharedReplay: :meth:`create`, then frames and rows."""

    # transport streams; the codec's options ({}: raw frames); a compressed file's last
    # frames, raw, by frame number (slot ``number % len``)
    _streams: list
    _max_frames: int
    _codec: dict
    _raw: Any
    _raw_num: Any

    @classmethod
    def create(
        cls: type[_W],
        path,
        *,
        capacity,
        frame_shape,
        dtype=np.uint8,
        stack_size=4,
        frame_capacity=None,
        max_frames=1 << 16,
        compress=False,
        log_bytes=None,
    ) -> _W:
        """Create the file at ``path`` (replacing any) and return its writer.

        Args:
            path: on ``/dev/shm`` the file lives in memory; on a disk it is a replay larger
                than memory (the page cache holds what is hot).
            capacity: rows (transitions) kept, oldest replaced first.
            frame_shape: shape of one frame.
            dtype: the frames' (numeric) dtype.
            stack_size: ``k``, frames per observation.
            frame_capacity: frame slots (default ``2 * capacity``).
            max_frames: as ``transport.Receiver``'s, for :meth:`ingest`.
            compress: False (frames raw), True or ``{codec, level, group}`` as
                ``FramePool(compress=...)`` (here lz4 and group 4 by default): each frame
                a keyframe or the XOR delta against its previous frame, in a byte log.
            log_bytes: the circular log's size (default ``frame_capacity * frame_bytes //
                8``). Frames leave in the order written, when their slot or their log
                bytes are reused, whichever comes first.

        Raises:
            ValueError, TypeError: a bad size, shape, dtype or compression option.
        """
        rows = operator.index(capacity)
        slots = 2 * rows if frame_capacity is None else operator.index(frame_capacity)
        k, fs, dt = C.stack_size(stack_size), C.frame_shape(frame_shape), C.frame_dtype(dtype)
        if rows < 1 or slots < 1:
            raise ValueError(f"capacity and frame_capacity must be positive, got {rows}, {slots}")
        if len(fs) > MAX_NDIM or dt.str not in _DTYPES:
            raise ValueError(f"frames of shape {fs} and dtype {dt} cannot be shared")
        fb = math.prod(fs) * dt.itemsize
        opts = C.compression({"group": 4} if compress is True else compress)
        lb = 0
        if opts is not None:
            lb = slots * fb // 8 if log_bytes is None else operator.index(log_bytes)
            if lb < 4 * (fb + BLOB_OVERHEAD):
                raise ValueError(f"log_bytes must hold 4 frames' blobs, {4 * (fb + BLOB_OVERHEAD)}")
            if slots >= 1 << 31:
                raise ValueError("a compressed file holds fewer than 2**31 frame slots")
        size = _layout(k, rows, slots, fb, lb)["size"]
        tmp = f"{os.fspath(path)}.tmp-{os.getpid()}"
        with open(tmp, "wb") as fh:
            fh.truncate(size)
            fh.write(_header(k, rows, slots, fs, dt, lb, opts["group"] if opts else 0))
        self = object.__new__(cls)
        self._open(tmp, writable=True)
        self._frame_seq[:] = self._row_seq[:] = -1
        os.replace(tmp, path)  # published complete: a reader never sees a partial header
        self._path = os.fspath(path)
        self._streams, self._codec = [], opts or {}
        self._max_frames = operator.index(max_frames)
        if opts is not None:  # the raw bytes of the last frames written, by frame number
            n = max(16, min(slots, RAW_CACHE_BYTES // fb))
            self._raw = np.empty((n, fb), np.uint8)
            self._raw_num = np.full(n, -1, np.int64)
        return self

    def _writer(self) -> None:
        """Raises ValueError unless this is the (open) writer."""
        self._live()
        if not self._writable:
            raise ValueError("a reader cannot write: only the process that created the file")

    def add_frames(self, frames, *, prev=None) -> np.ndarray:
        """Write ``frames`` ``(m, *frame_shape)``; returns their numbers (int64 ``(m,)``).

        Args:
            frames: the new frames.
            prev: compressed files: the number of the frame each new frame is coded
                against (its env's previous frame; an earlier frame of this call, or a
                frame written before that is still held), negative for none. Default:
                the frame written just before it (right for one env). A frame whose
                ``prev`` is not at hand, or whose chain is ``group`` long, is a keyframe.

        Raises:
            ValueError: a reader, a wrong shape, more frames than ``frame_capacity``.
            TypeError: another dtype.
        """
        self._writer()
        a = np.asarray(frames)
        if a.dtype != self._dtype:
            raise TypeError(f"frames have dtype {a.dtype}, the file stores {self._dtype}")
        if a.shape[1:] != self._frame_shape or a.ndim != 1 + len(self._frame_shape):
            raise ValueError(f"frames have shape {a.shape}, expected (m, *{self._frame_shape})")
        m = a.shape[0]
        if m > self._slots:
            raise ValueError(f"{m} frames do not fit {self._slots} frame slots")
        a8 = np.ascontiguousarray(a).reshape(m, -1).view(np.uint8)
        if self._log_bytes:
            return self._write_plan(self._plan(a8, prev, f"{m} frames'"), a8)
        n0 = self.frames_written
        nums = np.arange(n0, n0 + m, dtype=np.int64)
        slots = nums % self._slots
        self._frame_seq[slots] = -1  # readers of these slots see a rewrite from now on
        self._frames[slots] = a8
        self._frame_seq[slots] = nums
        self._head[_FRAMES_WRITTEN] = n0 + m
        self._advance_rows_from()
        return nums

    def _plan(self, a8: np.ndarray, prev, whose: str) -> _Plan:
        """Compress frames ``a8`` ``(m, frame bytes)`` and place their blobs; writes nothing.

        Raises:
            ValueError: ``prev`` is not ``m`` frame numbers; the blobs (``whose``) do not
                fit the log.
        """
        m, fb, F, L, G = a8.shape[0], self._fb, self._slots, self._log_bytes, self._group
        n0 = self.frames_written
        nums = np.arange(n0, n0 + m, dtype=np.int64)
        prev = np.asarray(nums - 1 if prev is None else prev)
        if prev.shape != (m,) or prev.dtype.kind not in "iu":
            raise ValueError(f"prev must be {m} frame numbers (integers), got {prev.shape}")
        prev = prev.astype(np.int64)
        head0 = int(self._head[_LOG_HEAD])
        # a reference must outlive this call: its chain's keyframe above the lowest frame
        # and log position still held once the blobs are written (a bound: each blob at
        # most fb + BLOB_OVERHEAD bytes, and the log's tail skipped at most twice)
        frame_lo = n0 + m - F
        log_lo = head0 + (m + 2) * (fb + BLOB_OVERHEAD) - L
        depth, base, delta = np.zeros(m, np.int64), nums.copy(), np.zeros(m, bool)
        C_ = self._raw_num.size
        for i in range(m):
            p = int(prev[i])
            if p < 0 or p >= n0 + i:
                continue
            if p >= n0:
                d, b = int(depth[p - n0]) + 1, int(base[p - n0])
            elif self._raw_num[p % C_] == p and p >= n0 - F and self._frame_seq[p % F] == p:
                rec = self._blobs[p % F]
                d, b = int(rec["depth"]) + 1, p - int(rec["base"])
            else:
                continue
            if d < G and b >= frame_lo and (b >= n0 or self._blobs[b % F]["pos"] >= log_lo):
                delta[i], depth[i], base[i] = True, d, b
        rec = np.zeros(m, BLOB_RECORD)
        blobs: list = [None] * m
        kinds = rec["kind"]

        def encode(frames: np.ndarray, group: int, at: np.ndarray) -> None:
            """The blob and kind of the last frame of each group of ``frames``, for ``at``."""
            pl, off, kd = _core.encode_frames(frames, group=group, **opts)
            for j, f in enumerate(at.tolist()):
                i = group * j + group - 1
                blobs[f], kinds[f] = pl[off[i] : off[i + 1]], kd[i]

        opts = {key: self._codec[key] for key in ("codec", "level")}
        if not delta.all():
            encode(a8[~delta], 1, np.flatnonzero(~delta))
        dl = np.flatnonzero(delta)
        if dl.size:  # each new frame after its reference, raw: the delta against it
            pairs = np.empty((2 * dl.size, fb), np.uint8)
            p = prev[dl]
            new = p >= n0
            pairs[0::2][new] = a8[p[new] - n0]
            pairs[0::2][~new] = self._raw[p[~new] % C_]
            pairs[1::2] = a8[dl]
            encode(pairs, 2, dl)
        plain = kinds != _core.KIND_DELTA  # a frame that does not compress is stored raw
        depth[plain], base[plain] = 0, nums[plain]
        rec["back"], rec["base"], rec["depth"] = np.where(plain, 0, nums - prev), nums - base, depth
        rec["len"] = [len(x) for x in blobs]
        h = head0
        for i, n in enumerate(rec["len"].tolist()):  # a blob never wraps: the tail is skipped
            if h % L + n > L:
                h += L - h % L
            rec["pos"][i] = h
            h += n
        if m and h - int(rec["pos"][0]) > L:
            raise ValueError(f"{whose} blobs do not fit the {L}-byte log")
        return _Plan(nums, rec, blobs, h)

    def _write_plan(self, plan: _Plan, a8: np.ndarray) -> np.ndarray:
        """Publish the planned blobs: the log head first, each slot under its seqlock."""
        F, L = self._slots, self._log_bytes
        nums = plan.nums
        if not nums.size:
            return nums
        self._head[_LOG_HEAD] = plan.head  # bytes below head - L are gone from now on
        slots, rec = nums % F, plan.records
        self._frame_seq[slots] = -1
        self._blobs[slots] = rec
        for p, n, blob in zip(rec["pos"] % L, rec["len"], plan.blobs, strict=True):
            self._log[p : p + n] = np.frombuffer(blob, np.uint8)
        self._frame_seq[slots] = nums
        self._head[_FRAMES_WRITTEN] = nums[-1] + 1
        C_ = self._raw_num.size
        keep = slice(max(0, nums.size - C_), None)
        self._raw[nums[keep] % C_] = a8[keep]
        self._raw_num[nums[keep] % C_] = nums[keep]
        self._advance_rows_from()
        return nums

    def _readable(self, refs: np.ndarray, written=None, head=None) -> np.ndarray:
        """Which frames ``refs`` a reader can read (by the writer: it trusts the file).

        ``written`` and ``head``: the frames written and the log head to judge by
        (default: now; the state after a planned write for :meth:`ingest`).
        """
        F = self._slots
        fw = self.frames_written if written is None else written
        ok = (refs >= fw - F) & (refs < fw)
        ok &= self._frame_seq[refs % F] == refs
        if self._log_bytes:
            hd = int(self._head[_LOG_HEAD]) if head is None else head
            base = refs - self._blobs["base"][refs % F]
            ok &= (base >= fw - F) & (self._blobs["pos"][base % F] >= hd - self._log_bytes)
        return ok

    def _advance_rows_from(self) -> None:
        """Publish the oldest row a reader should draw: the rows before it lost frames."""
        t, written = self._held()
        while t < written:
            n = min(256, written - t)
            ok = self._readable(self._refs[np.arange(t, t + n) % self._rows]).all(axis=1)
            if ok.any():
                t += int(ok.argmax())
                break
            t += n
        self._head[_ROWS_FROM] = t

    def add(self, obs, action, reward, next_obs, terminated, truncated) -> int:
        """Write ``T`` transitions whose observations are frame numbers ``(T, k)``; returns T.

        Raises:
            ValueError: a reader, wrong shapes, frame numbers not yet written, or gone
                (their slots or log bytes reused), more rows than ``capacity``, an action
                or reward the buffer refuses.
            TypeError: non-integer frame numbers or actions, non-boolean flags.
        """
        self._writer()
        o, n = np.asarray(obs), np.asarray(next_obs)
        for name, x in (("obs", o), ("next_obs", n)):
            if x.dtype.kind not in "iu":
                raise TypeError(f"{name} must be frame numbers (integers), got dtype {x.dtype}")
            if x.ndim != 2 or x.shape[1] != self._k:
                raise ValueError(f"{name} has shape {x.shape}, expected (T, {self._k})")
            if x.size and (x.min() < 0 or x.max() >= self.frames_written):
                raise ValueError(f"{name} refers to frames not written yet")
            if x.size and not self._readable(x.astype(np.int64)).all():
                raise ValueError(f"{name} refers to frames already replaced (frame_capacity)")
        T = o.shape[0]
        if n.shape[0] != T or self._rows < T:
            raise ValueError(f"{T} and {n.shape[0]} rows: expected as many, at most capacity")
        a, r = Parser(max(T, 1), (), np.dtype(np.int64)).values(action, reward, T)
        term = flags_array(terminated, "terminated", (T,))
        flags = _bits((term, flags_array(truncated, "truncated", (T,))), T)  # the file's bits
        self._write_rows(np.concatenate([o, n], axis=1).astype(np.int64), a, r, flags)
        return T

    def _write_rows(self, refs, actions, rewards, flags) -> None:
        """The rows, after every check: sequence words first and last (the seqlock)."""
        T = refs.shape[0]
        t0 = self.rows_written
        nums = np.arange(t0, t0 + T, dtype=np.int64)
        rows = nums % self._rows
        self._row_seq[rows] = -1
        self._refs[rows] = refs
        self._actions[rows] = actions
        self._rewards[rows] = rewards
        self._flags[rows] = flags
        self._row_seq[rows] = nums
        self._head[_ROWS_WRITTEN] = t0 + T
        self._advance_rows_from()

    def open(self, num_envs=1) -> int:
        """Open a stream for one :class:`~lazyframes.transport.Sender`; returns its id."""
        self._writer()
        num_envs = operator.index(num_envs)
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        self._streams.append(transport._Stream(0, num_envs, False))  # env ids are not stored
        return len(self._streams) - 1

    def ingest(self, msg) -> int:
        """Check a :mod:`lazyframes.transport` message and write it; returns its transitions.

        Its new frames are written once, its transitions as rows of frame numbers;
        autoreset placeholders are dropped. Checked as ``transport.Receiver.ingest``
        checks, before anything is written.

        Raises:
            ValueError, TypeError: as :meth:`transport.Receiver.ingest
                <lazyframes.transport.Receiver.ingest>`; frames of another geometry than
                the file's; more rows than ``capacity`` or frames than ``frame_capacity``.
        """
        self._writer()
        geometry = (self._frame_shape, self._dtype)  # the file's, never the message's
        p = transport.parse(msg, self._streams, geometry, max_frames=self._max_frames)
        if (p.frame_shape, p.dtype, p.k) != (self._frame_shape, self._dtype, self._k):
            raise ValueError(
                f"the message has {p.k} frames of shape {p.frame_shape} and dtype {p.dtype}; "
                f"the file stores {self._k} of shape {self._frame_shape} and dtype {self._dtype}"
            )
        actions, rewards = p.checked_values((), np.dtype(np.int64))
        frames = p.frames()
        keep = ~p.flag_masks()[2]  # autoreset placeholders are not stored
        if int(keep.sum()) > self._rows or len(frames) > self._slots:
            raise ValueError("the message holds more rows or frames than the file")
        st = p.stream
        carry = st.carry if p.carry else np.empty(0, np.int64)  # (a resync drops it)
        m, n0 = len(frames), self.frames_written
        a8 = np.ascontiguousarray(frames).reshape(m, -1).view(np.uint8)
        plan, head = None, None
        if self._log_bytes and m:
            plan = self._plan(a8, _previous_frames(p, carry, n0, m), "the message's")
            head = plan.head
        if carry.size and not self._readable(carry, n0 + m, head).all():
            raise ValueError(
                f"the message refers to kept frames its own new frames would replace: "
                f"frame_capacity ({self._slots}) or log_bytes is too small for this traffic"
            )
        if plan is not None:
            new = self._write_plan(plan, a8)
        else:
            new = self.add_frames(frames) if m else np.empty(0, np.int64)
        table = np.concatenate([carry, new])
        refs = np.concatenate([table[p.obs], table[p.next_obs]], axis=1)[keep]
        flags = p.flags[keep] & (transport.TERM | transport.TRUNC)  # the file's bits
        self._write_rows(refs, actions[keep], rewards[keep], flags)
        st.carry = table[p.retain] if p.retain.size else None
        p.advance()
        return p.transitions


def _previous_frames(p: transport.Parsed, carry: np.ndarray, n0: int, m: int) -> np.ndarray:
    """Each new frame of a message's previous frame (in a stack before it), or -1.

    The frames a message's observations and next observations hold in a row, oldest
    first: the frame before a new frame there is its env's previous frame.
    """
    nc = carry.size
    o, x = p.obs.astype(np.int64), p.next_obs.astype(np.int64)
    left = np.concatenate([o[:, :-1].ravel(), x[:, :-1].ravel()])
    right = np.concatenate([o[:, 1:].ravel(), x[:, 1:].ravel()])
    sel = (right >= nc) & (left != right)
    prev = np.full(m, -1, np.int64)
    prev[(right[sel] - nc)[::-1]] = left[sel][::-1]  # the first pair seen wins
    old = (prev >= 0) & (prev < nc)
    out = np.where(prev >= nc, n0 + prev - nc, -1)
    out[old] = carry[prev[old]]
    return out
