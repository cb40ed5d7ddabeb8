"""A SharedReplay's readers: they map the file read-only and sample it without a lock.

A reader copies rows and frames between two reads of their sequence words and keeps only
what did not change (docs/SHARED.md); compressed chains are decoded once read whole.
"""

from __future__ import annotations

import operator
import os
from typing import TypeVar

import numpy as np

from .. import _checks as C
from .. import _core, transport
from ..replay import Samples
from ._file import _LOG_HEAD, BLOB_OVERHEAD, _Mapping

#: Attempts of a sample to draw rows it reads consistently before it gives up.
MAX_ATTEMPTS = 100

_R = TypeVar("_R", bound="_Reader")


class _Reader(_Mapping):
    """The readers' side of a SharedReplay: :meth:`attach`, then :meth:`sample`."""

    @classmethod
    def attach(cls: type[_R], path) -> _R:
        """Map the file at ``path`` read-only, to sample from it.

        The file is checked (magic, version, geometry, size) before any array is made.

        Raises:
            FileNotFoundError: no such file (e.g. the writer removed it).
            ValueError: not a SharedReplay file, or one whose header and size disagree.
        """
        self = object.__new__(cls)
        self._open(os.fspath(path), writable=False)
        self._path = os.fspath(path)
        return self

    def sample(self, batch_size, *, rng=None, dtype=None, scale=None) -> Samples:
        """``batch_size`` transitions drawn uniformly (with replacement) from the rows held.

        Each frame (compressed: each blob, then decoded) is copied once, from the mapping
        into the batch. A row the writer is rewriting, or whose frames it replaced, is
        drawn again.

        Args:
            batch_size: ``B >= 1``.
            rng: a ``numpy.random.Generator`` (default: a fresh one).
            dtype: the observations' dtype, as ``ReplayBuffer.sample`` (default: the frames').
            scale: a factor (float dtypes), e.g. ``dtype=np.float32, scale=1 / 255``.

        Returns:
            :class:`~lazyframes.replay.Samples` of fresh arrays: ``indices`` the rows'
            numbers, ``weights`` all 1.0 (uniform draws) and ``discounts`` all 1.0: the
            file stores no ``gamma``, so a one-step target is ``rewards + gamma *
            discounts * (1 - dones) * V(next_observations)`` with the learner's ``gamma``.

        Raises:
            ValueError: no row written yet, ``batch_size < 1``, a compressed file whose
                frame records or blobs are corrupt.
            TypeError: an unsupported dtype or scale.
            RuntimeError: no consistent batch after many draws (the writer overwrites
                rows faster than they are read: give the file more capacity).
        """
        self._live()
        B = operator.index(batch_size)
        if B < 1:
            raise ValueError(f"batch_size must be at least 1, got {B}")
        dst = C.output_dtype(self._dtype, dtype, scale)
        rng = np.random.default_rng() if rng is None else rng
        obs, nxt = (np.empty((B, self._k, *self._frame_shape), self._dtype) for _ in range(2))
        actions, numbers = np.empty(B, np.int64), np.empty(B, np.int64)
        rewards, flags = np.empty(B, np.float32), np.empty(B, np.uint8)
        todo = np.arange(B)
        for _ in range(MAX_ATTEMPTS):
            got = self._read(todo.size, rng, obs, nxt, actions, rewards, flags, numbers, todo)
            todo = todo[~got]
            if not todo.size:
                break
        else:
            raise RuntimeError(
                f"no consistent batch after {MAX_ATTEMPTS} draws: the writer replaces rows "
                f"or frames faster than they are read"
            )
        if dst != self._dtype or scale is not None:
            f = dst.type(1 if scale is None else scale)
            obs, nxt = np.multiply(obs, f, dtype=dst), np.multiply(nxt, f, dtype=dst)
        ones = np.ones(B, np.float32)
        dones = (flags & transport.TERM).astype(np.float32)
        truncs = ((flags & transport.TRUNC) != 0).astype(np.float32)
        return Samples(obs, actions, nxt, dones, rewards, truncs, numbers, ones, ones.copy())

    def _read(self, n, rng, obs, nxt, actions, rewards, flags, numbers, todo) -> np.ndarray:
        """Draw ``n`` rows and copy them into the outputs at ``todo``; which ones are valid."""
        lo, written = self._held()
        if written == 0:
            raise ValueError("the replay holds no transition yet")
        if written < 0:
            raise ValueError(f"{self._path}: a corrupt header ({written} rows written)")
        t = rng.integers(min(lo, written - 1), written, n)
        rows = t % self._rows
        before = self._row_seq[rows]  # fancy indexing: copies
        refs = self._refs[rows]
        a, r, f = self._actions[rows], self._rewards[rows], self._flags[rows]
        ok = (before == t) & (self._row_seq[rows] == t)
        k, fb = self._k, self._fb
        direct = todo.size == obs.shape[0]  # the first pass copies straight into the batch
        o = obs if direct else np.empty((n, k, *self._frame_shape), self._dtype)
        x = nxt if direct else np.empty_like(o)
        o8 = o.reshape(n, k, -1).view(np.uint8).reshape(n, k, fb)
        x8 = x.reshape(n, k, -1).view(np.uint8).reshape(n, k, fb)
        if self._log_bytes:
            frames, where, got = self._decode(refs)
            np.take(frames, where[:, :k], axis=0, out=o8, mode="wrap")
            np.take(frames, where[:, k:], axis=0, out=x8, mode="wrap")
            ok &= got
        else:
            slots = refs % self._slots  # in range whatever the row holds
            seen = self._frame_seq[slots]
            # mode="wrap": the slots are in range, and "raise" would copy through a buffer
            np.take(self._frames, slots[:, :k], axis=0, out=o8, mode="wrap")
            np.take(self._frames, slots[:, k:], axis=0, out=x8, mode="wrap")
            ok &= ((seen == refs) & (self._frame_seq[slots] == refs)).all(axis=1)
        if not direct:
            obs[todo[ok]], nxt[todo[ok]] = o[ok], x[ok]
        actions[todo[ok]], rewards[todo[ok]] = a[ok], r[ok]
        flags[todo[ok]], numbers[todo[ok]] = f[ok], t[ok]
        return ok

    def _decode(self, refs: np.ndarray) -> tuple:
        """The frames ``refs`` ``(n, 2k)`` from the log, under the seqlock.

        Walks the chain of deltas of each row's newest frame (then of any wanted frame
        outside those chains) back to its keyframe, reading each slot's sequence word,
        then its record; copies the chains' blobs; reads the log head and the words
        again; decodes the chains read consistently, one container per batch.

        Returns:
            ``(frames, where, ok)``: decoded frames ``(N, frame bytes)``, the index of each
            wanted frame in them ``(n, 2k)`` (0 where not read), the rows read whole.

        Raises:
            ValueError: a record or blob that was read consistently and is corrupt.
        """
        F, L, fb = self._slots, self._log_bytes, self._fb
        top = fb + BLOB_OVERHEAD
        u, inv = np.unique(refs, return_inverse=True)
        walked, start = [], refs.max(axis=1)
        for _ in range(refs.shape[1]):  # each round walks one chain more per row at most
            walked.append(self._walk(np.unique(start)))
            members = np.sort(np.concatenate([w[0][w[1]] for w in walked]))
            missing = ~_find(members, refs)[1]  # a wanted frame before a keyframe
            if not missing.any():
                break
            start = np.where(missing, refs, -1).max(axis=1)
            start = start[start >= 0]
        num, has, seq0, words, deep = (np.concatenate(x) for x in zip(*walked, strict=True))
        depth = has.sum(axis=1) - 1
        runs = depth + 1  # each chain, keyframe first
        which = np.repeat(np.arange(num.shape[0]), runs)
        col = depth[which] - (np.arange(which.size) - np.repeat(np.cumsum(runs) - runs, runs))
        m_num, m_w = num[which, col], words[which, col]
        m_len = np.minimum(np.maximum(m_w[:, 1] & 0xFFFFFFFF, 1), top)
        m_at = np.minimum(m_w[:, 0] % L, L - m_len)  # in the log whatever it holds
        log, spans = self._log.data, zip(m_at.tolist(), m_len.tolist(), strict=True)
        payload = b"".join([log[i : i + n] for i, n in spans])
        head = int(self._head[_LOG_HEAD])
        seq1 = self._frame_seq[num % F]
        pos, ln, back = words[..., 0], words[..., 1] & 0xFFFFFFFF, words[..., 1] >> 32
        kind = (words[..., 2] >> 32) & 0xFF
        good = (num >= 0) & (seq0 == num) & (seq1 == num) & (pos >= head - L)
        delta = kind == _core.KIND_DELTA
        raw = kind == _core.KIND_RAW
        bad = (kind > _core.KIND_RAW) | (ln < 1) | (ln > top) | (raw & (ln != fb))
        bad |= (pos % L + ln > L) | (pos + ln > head) | (delta != (back > 0))
        whole = (good | ~has).all(axis=1)  # every blob of the chain read consistently
        if (good & has & bad).any() or (deep & whole).any():
            raise ValueError(f"{self._path}: a corrupt frame record (length, kind or chain)")
        m_kind = ((m_w[:, 2] >> 32) & 0xFF).astype(np.uint8)
        if not whole.all():  # only the chains read whole are decoded
            keep = np.repeat(whole, runs)
            data = np.frombuffer(payload, np.uint8)[np.repeat(keep, m_len)]
            payload, m_num, m_kind, m_len = data, m_num[keep], m_kind[keep], m_len[keep]
        offsets = np.zeros(m_len.size + 1, np.int64)
        np.cumsum(m_len, out=offsets[1:])
        try:
            frames = _core.decode_frames(payload, offsets, m_kind, (fb,), np.uint8)
        except ValueError as e:
            raise ValueError(f"{self._path}: a corrupt blob ({e})") from None
        if not m_num.size:  # no chain read whole
            none = np.zeros(refs.shape, np.int64)
            return np.zeros((1, fb), np.uint8), none, none[:, 0] != 0
        order = np.argsort(m_num, kind="stable")
        at, found = _find(m_num[order], u)
        inv = inv.reshape(refs.shape)
        return frames, order[at][inv], found[inv].all(axis=1)

    def _walk(self, start: np.ndarray) -> tuple:
        """The chains of frames ``start`` ``(S,)``, each up to the file's ``group`` long.

        Returns:
            ``(num, has, seq0, words, deep)``: per chain and position ``(S, group)``, the
            frame's number, whether the chain reaches it, its slot's sequence word and
            its record's three words ``(S, group, 3)``, read after the word; per chain,
            whether it goes on beyond ``group`` (corrupt, when read consistently).
        """
        F, G, S = self._slots, self._group, start.size
        at, nums, seqs, recs = [], [], [], []
        idx, cur = np.arange(S), start
        for g in range(G):
            sl = cur % F
            seqs.append(self._frame_seq[sl])
            rec = self._words[sl]
            at.append(idx * G + g)
            nums.append(cur)
            recs.append(rec)
            more = ((rec[:, 2] >> 32) & 0xFF) == _core.KIND_DELTA
            idx, cur = idx[more], (cur - (rec[:, 1] >> 32))[more]
            if not idx.size:
                break
        flat = np.concatenate(at)

        def spread(parts: list, dtype=np.int64) -> np.ndarray:  # (S, G, ...), 0 off a chain
            out = np.zeros((S * G, *parts[0].shape[1:]), dtype)
            out[flat] = np.concatenate(parts)
            return out.reshape(S, G, *parts[0].shape[1:])

        deep = np.zeros(S, bool)
        deep[idx] = True
        has = spread([np.ones(flat.size, bool)], bool)
        return spread(nums), has, spread(seqs), spread(recs), deep


def _find(sorted_: np.ndarray, x: np.ndarray) -> tuple:
    """``(at, found)``: where each of ``x`` is in the sorted array ``sorted_``, and if it is."""
    if not sorted_.size:
        return np.zeros(x.shape, np.int64), np.zeros(x.shape, bool)
    at = np.minimum(np.searchsorted(sorted_, x), sorted_.size - 1)
    return at, sorted_[at] == x
