"""Spill benchmark: a compressed SharedReplay file on disk, sampled warm and cold.

Frames: recorded ALE Pong (bench/bench_compress.py's recording: 84x84 grayscale,
frame_skip 4, random policy), replayed ``--transitions`` times over (each pass a new
stream of frames; nothing de-duplicates across passes), one env, ``k = 4``.

Rows, all filled in this run with the same stream:

- **spill (disk)**: ``SharedReplay.create(path, compress=True)`` with ``path`` on
  ``--dir`` (default: the system's temporary folder, a disk here); ``sample(32)`` with
  the file's pages warm (in the page cache) and cold: before each cold call the reader's
  mapping is dropped (``madvise(MADV_DONTNEED)``) and the file's pages are evicted
  (``fsync``, then ``posix_fadvise(POSIX_FADV_DONTNEED)`` on the whole file; the global
  page cache is left alone); ``fincore`` (util-linux), when present, reports what stayed;
- **SharedReplay /dev/shm**: the uncompressed file in memory (filled with
  ``--peer-transitions``, default ``min(N, 50000)``: its sample cost hardly depends on
  the count, its size does, ~7 KB per transition);
- **ReplayBuffer compressed**: the in-process compressed ``ReplayBuffer`` (default codec).

Columns: bytes per transition (the file's size / transitions, for the files; the
buffer's own count, ``memory()``), ``sample(32)`` uint8 and float32/255 medians, ratios
against the in-RAM compressed ReplayBuffer. Then the 10M-transition extrapolation of
the spill file. Run: ``python -m bench.bench_spill [--transitions N] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from lazyframes.replay import ReplayBuffer
from lazyframes.shared import _LOG_HEAD, SharedReplay

from ._util import format_table, header
from .bench_compress import Stream, record

K = 4
BATCH = 32
CHUNK = 2048  # frames written per call


class Recording:
    """One env's recorded frames and transitions, as frame indices (a pass's numbering)."""

    def __init__(self, path: Path):
        s = Stream(path, None)
        self.frames, self.n = s.frames, s.n_rec
        self.obs, self.next = s.obs_idx, s.next_idx
        self.actions, self.rewards = s.actions, s.rewards
        self.term, self.trunc = s.term, s.trunc
        with np.load(path) as d:
            starts = d["starts"]
        self.prev = np.arange(-1, len(self.frames) - 1)
        self.prev[starts] = -1  # a reset frame starts a chain


def fill_shared(w: SharedReplay, rec: Recording, n: int) -> None:
    """``n`` transitions into ``w``: each pass's frames, then the rows they complete."""
    done, base = 0, 0
    while done < n:
        F = len(rec.frames)
        for lo in range(0, F, CHUNK):
            hi = min(F, lo + CHUNK)
            prev = np.where(rec.prev[lo:hi] >= 0, rec.prev[lo:hi] + base, -1)
            w.add_frames(rec.frames[lo:hi], prev=prev)
            rows = np.flatnonzero((rec.next.max(axis=1) < hi) & (rec.next.max(axis=1) >= lo))
            rows = rows[: n - done]
            if rows.size:
                w.add(
                    rec.obs[rows] + base,
                    rec.actions[rows],
                    rec.rewards[rows],
                    rec.next[rows] + base,
                    rec.term[rows],
                    rec.trunc[rows],
                )
                done += rows.size
            if done >= n:
                return
        base += F


def fill_buffer(rec: Recording, n: int) -> ReplayBuffer:
    rb = ReplayBuffer(n, compress=True)
    f = rec.frames
    for j in range(n):
        i = j % rec.n
        rb.add(
            f[rec.obs[i]], rec.actions[i], rec.rewards[i], f[rec.next[i]], rec.term[i], rec.trunc[i]
        )
    return rb


def median_us(fn, repeats: int, before=None) -> float:
    ts = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def resident(path: str) -> str:
    """``fincore``'s count of the file's resident pages, or '?' without it."""
    if shutil.which("fincore") is None:
        return "?"
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", path],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or "?"


def sample_costs(r, repeats: int, rng, cold=None) -> tuple[float, float]:
    u8 = median_us(lambda: r.sample(BATCH, rng=rng), repeats, cold)
    f32 = median_us(
        lambda: r.sample(BATCH, rng=rng, dtype=np.float32, scale=1 / 255), repeats, cold
    )
    return u8, f32


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_spill",
        description="A compressed SharedReplay file on disk (recorded Pong), sampled with "
        "its pages warm and dropped, against /dev/shm and an in-RAM compressed ReplayBuffer.",
    )
    p.add_argument("--transitions", type=int, default=200_000, help="transitions in the file")
    p.add_argument("--peer-transitions", type=int, default=None, help="in the peers")
    p.add_argument("--steps", type=int, default=10_000, help="recorded Pong steps")
    p.add_argument("--dir", default=tempfile.gettempdir(), help="folder of the spill file")
    p.add_argument("--repeats", type=int, default=200, help="warm sample calls (cold: 1/4)")
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "lazyframes")
    p.add_argument("--group", type=int, default=4, help="keyframe at least every N frames")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    n = args.transitions
    n_peer = args.peer_transitions or min(n, 50_000)
    rec = Recording(record("Pong", args.steps, args.seed, args.cache))
    print(header("bench_spill"))
    print(
        f"recorded Pong ({rec.n:,} steps, replayed), k = {K}; spill file: {n:,} transitions "
        f"in {args.dir}; peers: {n_peer:,}"
    )
    rng = np.random.default_rng(args.seed)
    rows = []

    # -- the spill file --------------------------------------------------------------------
    path = os.path.join(args.dir, f"bench_spill-{os.getpid()}.lfr")
    frames_per_tr = len(rec.frames) / rec.n
    slots = int(n * frames_per_tr) + 4 * CHUNK
    free = shutil.disk_usage(args.dir).free
    log = slots * 400  # ample for Pong (the figures below count only the bytes used)
    if log > free // 2:
        sys.exit(f"{args.dir} has {free / 2**30:.1f} GiB free; the file needs ~{log / 2**30:.1f}")
    w = SharedReplay.create(
        path,
        capacity=n,
        frame_shape=(84, 84),
        stack_size=K,
        frame_capacity=slots,
        compress={"group": args.group},
        log_bytes=log,
    )
    t0 = time.perf_counter()
    fill_shared(w, rec, n)
    fill_s = time.perf_counter() - t0
    assert len(w) == n, (len(w), n)
    used_log = int(w._head[_LOG_HEAD])  # bytes written to the log (it did not wrap)
    blob_b = used_log / w.frames_written
    size = os.path.getsize(path)
    fixed = size - log  # header, frame slots, rows
    bpt = (fixed + used_log) / n  # a file sized to what it holds
    w._mm.flush()
    r = SharedReplay.attach(path)
    fd = os.open(path, os.O_RDONLY)

    def drop():
        r._mm.madvise(mmap.MADV_DONTNEED)
        w._mm.madvise(mmap.MADV_DONTNEED)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

    warm = sample_costs(r, args.repeats, rng)
    drop()
    left = resident(path)
    cold = sample_costs(r, max(10, args.repeats // 4), rng, drop)
    rows.append({"name": "spill, warm", "bpt": bpt, "u8": warm[0], "f32": warm[1]})
    rows.append({"name": "spill, pages dropped", "bpt": bpt, "u8": cold[0], "f32": cold[1]})
    os.close(fd)
    r.close()
    frames_written, fw_rows = w.frames_written, w.rows_written
    w.close(unlink=True)

    # -- peers ------------------------------------------------------------------------------
    shm = f"/dev/shm/bench_spill-{os.getpid()}.lfr"
    u = SharedReplay.create(
        shm,
        capacity=n_peer,
        frame_shape=(84, 84),
        stack_size=K,
        frame_capacity=int(n_peer * frames_per_tr) + 4 * CHUNK,
    )
    fill_shared(u, rec, n_peer)
    u8, f32 = sample_costs(u, args.repeats, rng)
    rows.append(
        {
            "name": "SharedReplay /dev/shm",
            "bpt": os.path.getsize(shm) / n_peer,
            "u8": u8,
            "f32": f32,
        }
    )
    u.close(unlink=True)
    rb = fill_buffer(rec, n_peer)
    u8 = median_us(lambda: rb.sample(BATCH), args.repeats)
    f32 = median_us(lambda: rb.sample(BATCH, dtype=np.float32, scale=1 / 255), args.repeats)
    bpt_rb = rb.memory()["bytes_per_transition"]
    rows.append({"name": "ReplayBuffer compressed", "bpt": bpt_rb, "u8": u8, "f32": f32})
    ref = rows[-1]
    for row in rows:
        row["vs_u8"], row["vs_f32"] = row["u8"] / ref["u8"], row["f32"] / ref["f32"]
    print(format_table(rows, COLUMNS))
    per_frame = 32 + blob_b  # the slot's sequence word and record, and its blob
    per_row = (fixed - 256 - slots * 32) / n
    tr10 = 10_000_000
    size10 = tr10 * (per_row + frames_per_tr * per_frame)
    print(
        f"spill file: {frames_written:,} frames for {fw_rows:,} transitions filled in "
        f"{fill_s:.1f} s ({1e6 * fill_s / n:.1f} us/transition); blob {blob_b:.0f} B/frame, "
        f"+32 B per frame slot, +{per_row:.0f} B per row: {bpt:.0f} B/transition; "
        f"after the drop, resident: {left}"
    )
    print(
        f"10M transitions (1 env, {frames_per_tr:.3f} frames per transition): a "
        f"{size10 / 1e9:.1f} GB file (create(capacity=10_000_000, "
        f"compress={{'group': {args.group}}}, "
        f"frame_capacity={int(tr10 * frames_per_tr * 1.01):_}, "
        f"log_bytes={int(tr10 * frames_per_tr * blob_b * 1.05):_}))"
    )
    return rows


COLUMNS = [
    ("name", "store", "{}"),
    ("bpt", "B/transition", "{:,.0f}"),
    ("u8", "sample(32) uint8 us", "{:,.0f}"),
    ("f32", "float32/255 us", "{:,.0f}"),
    ("vs_u8", "uint8 vs RB", "{:.2f}x"),
    ("vs_f32", "f32 vs RB", "{:.2f}x"),
]


if __name__ == "__main__":
    main(sys.argv[1:])
