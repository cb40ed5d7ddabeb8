"""Parallel copy out: ``sample(B)`` with one thread against the default thread count.

A batch's copy out (gather, conversion and the decoding of compressed frames) splits its
rows across ``lazyframes.get_num_threads()`` threads when its output is large enough
(``_part_bytes`` in csrc/_copyout.pxi). Each row of the table times ``rb.sample(B)`` of a
full buffer with ``lazyframes.set_num_threads(1)`` and with the default (the CPUs this
process may run on, or ``--threads``), in the same run and round-robin (blocks of calls
in turn, so the host's drift hits both columns alike); medians.

Buffers (as bench_sampler's): raw 84x84 uint8 frames (``--transitions`` transitions over a
pool of 16,384 distinct random frames: a batch reads frames from 110 MB in random order),
and a compressing buffer of recorded Pong frames (tests/data/pong.npz, looped: every
frame of a batch is decoded). ``threads/1`` is the time with the default threads over the
time with one; the target (``--check``) is <= 0.6 for ``sample(256)`` and ``sample(512)``
uint8, on 2 or more CPUs. Batches below the split size (``sample(32)`` of raw frames, one
part) show that the split costs nothing where it does not happen. The ``floor of
sample(B)`` rows time a plain C ``memcpy`` of the same frames (``_core._memcpy_gather``), split
the same way: how far the host's memory bandwidth lets two threads go.
``--split`` prints a second table, where splitting starts to pay: ``gather`` of 4 to 128
rows with the part size lowered to 64 KiB (every batch of 128 KiB and more splits), one
thread against the default, by output size; the core splits from ``2 * _PART_BYTES`` of
work (the output's bytes, plus twice each compressed frame's for its decoding).
Run: ``python -m bench.bench_parallel [--quick] [--check] [--split] [--threads N]
[--transitions N]``.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import numpy as np

import lazyframes

from ._util import format_table, header, report_checks, round_robin_us, target
from .bench_sampler import pong_buffer, raw_buffer

BATCHES = (32, 64, 128, 256, 512)
DRAWS = 16  # the floor rows cycle over this many draws (a 512 one reads 18 MB of frames)
TARGET_RATIO = 0.6  # sample(256) / sample(512) uint8: default threads over one thread
TARGET_BATCHES = (256, 512)

COLUMNS = [
    ("buffer", "buffer", "{}"),
    ("case", "case", "{}"),
    ("tasks", "tasks", "{}"),
    ("one", "1 thread us", "{:,.0f}"),
    ("many", "N threads us", "{:,.0f}"),
    ("ratio", "threads/1", "{:.2f}"),
]


def _tasks_of(call) -> int:
    """How many tasks one call's copies ran (the core's counter; no other thread copies)."""
    before = lazyframes._core._parallel_tasks()[0]
    call()
    return lazyframes._core._parallel_tasks()[0] - before


def rows_of(name: str, rb, threads: int, *, repeats: int, warmup: int, block: int) -> list[dict]:
    """The rows of one buffer: each batch size, uint8 (and float32/255 at 256)."""
    cases = [(f"sample({b})", b, None, None) for b in BATCHES]
    cases.append(("sample(256) f32/255", 256, np.float32, 1 / 255))
    fns = {}
    for label, b, dtype, scale in cases:
        for n in (1, threads):

            def call(b=b, dtype=dtype, scale=scale, n=n):
                lazyframes.set_num_threads(n)
                rb.sample(b, dtype=dtype, scale=scale)

            fns[(label, n)] = call
    tasks = {label: _tasks_of(fns[(label, threads)]) for label, *_ in cases}
    us = round_robin_us(fns, repeats, warmup, block)
    lazyframes.set_num_threads(threads)
    return [
        {
            "buffer": name,
            "case": label,
            "tasks": tasks[label],
            "one": us[(label, 1)],
            "many": us[(label, threads)],
            "ratio": us[(label, threads)] / us[(label, 1)],
        }
        for label, *_ in cases
    ]


def floor_rows(rb, threads: int, *, repeats: int, warmup: int, block: int) -> list[dict]:
    """The host's own scaling: the gather floor of ``sample(B)``'s bytes, one thread against N.

    ``_core._memcpy_gather`` (a plain ``memcpy`` per frame, no conversion, split into parts
    as a copy out is) of the ``2k`` frames of ``B`` drawn transitions into one array: where
    it does not reach the target either, memory bandwidth, not the split, decides.
    """
    ids = rb._stores[0].frame_ids(len(rb))  # (n, 2k): obs then next obs frames
    rng = np.random.default_rng(1)
    fns, outs, turn = {}, {}, itertools.count()
    for b in TARGET_BATCHES:
        # a new draw each call, as sample's: frames not left in the cache by the last call
        draws = [ids[rng.integers(0, len(ids), b)].reshape(2 * b, -1) for _ in range(DRAWS)]
        outs[b] = np.empty(draws[0].size * rb.pool.frame_bytes, np.uint8)
        for n in (1, threads):

            def call(b=b, n=n, draws=draws):
                lazyframes.set_num_threads(n)
                slots = draws[next(turn) % DRAWS]
                lazyframes._core._memcpy_gather(rb.pool, slots, outs[b])

            fns[(b, n)] = call
    tasks = {b: _tasks_of(fns[(b, threads)]) for b in TARGET_BATCHES}
    us = round_robin_us(fns, repeats, warmup, block)
    lazyframes.set_num_threads(threads)
    return [
        {
            "buffer": "raw",
            "case": f"floor of sample({b})",
            "tasks": tasks[b],
            "one": us[(b, 1)],
            "many": us[(b, threads)],
            "ratio": us[(b, threads)] / us[(b, 1)],
        }
        for b in TARGET_BATCHES
    ]


SPLIT_ROWS = (4, 8, 16, 24, 32, 48, 64, 128)


def split_rows(name: str, rb, threads: int, *, repeats: int, warmup: int, block: int):
    """``gather(rows)`` forced to split from 128 KiB: one thread against ``threads``."""
    rng = np.random.default_rng(0)
    idx = {b: rng.integers(0, len(rb), b) for b in SPLIT_ROWS}
    outs = {
        b: (np.empty((b, 4, 84, 84), np.uint8), np.empty((b, 4, 84, 84), np.uint8))
        for b in SPLIT_ROWS
    }
    fns = {}
    for b in SPLIT_ROWS:
        for n in (1, threads):

            def call(b=b, n=n):
                lazyframes.set_num_threads(n)
                rb.gather(idx[b], out=outs[b])

            fns[(b, n)] = call
    old = lazyframes._core._set_part_bytes(1 << 16)
    try:
        us = round_robin_us(fns, repeats, warmup, block)
    finally:
        lazyframes._core._set_part_bytes(old)
        lazyframes.set_num_threads(threads)
    return [
        {
            "buffer": name,
            "case": f"gather({b}), {b * 2 * 4 * 84 * 84 / 1e6:.2f} MB",
            "one": us[(b, 1)],
            "many": us[(b, threads)],
            "ratio": us[(b, threads)] / us[(b, 1)],
        }
        for b in SPLIT_ROWS
    ]


def check_targets(rows: list[dict], threads: int) -> list[tuple[str, bool]]:
    if threads < 2:
        return [("the targets need 2 or more threads (--threads)", False)]
    return [
        target(f"{r['buffer']} {r['case']}: {threads} threads / 1", r["ratio"], "<=", TARGET_RATIO)
        for r in rows
        if r["case"] in {f"sample({b})" for b in TARGET_BATCHES}
    ]


def main(argv=None) -> list[dict]:
    """Run the benchmark and print one table; return the rows."""
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_parallel",
        description="sample(B) with one thread against the default thread count.",
    )
    p.add_argument("--quick", action="store_true", help="a fast smoke run; noisier figures")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="the thread count compared with one (default: lazyframes.get_num_threads())",
    )
    p.add_argument(
        "--transitions",
        type=int,
        default=None,
        help="transitions in each buffer (default 50,000; 5,000 with --quick)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed calls per figure, the median is reported (default 200; 20 with --quick)",
    )
    p.add_argument(
        "--split",
        action="store_true",
        help="also measure where splitting starts to pay (gathers of 4 to 128 rows)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--check",
        action="store_true",
        help=f"print the target (threads/1 <= {TARGET_RATIO} at sample(256) and sample(512) "
        "uint8) and exit with status 1 if it is missed",
    )
    args = p.parse_args(argv)
    threads = args.threads or lazyframes.get_num_threads()
    n = args.transitions or (5_000 if args.quick else 50_000)
    repeats = args.repeats or (20 if args.quick else 200)
    warmup, block = (2, 2) if args.quick else (10, 5)
    print(header("bench_parallel", f"threads: 1 against {threads}"))
    print(f"{n:,} transitions per buffer, k=4, 84x84; median of {repeats} calls (microseconds)")
    rows, split = [], []
    for name, make in (("raw", raw_buffer), ("pong compressed", pong_buffer)):
        rb, _ = make(n, args.seed)
        rows += rows_of(name, rb, threads, repeats=repeats, warmup=warmup, block=block)
        if name == "raw":
            rows += floor_rows(rb, threads, repeats=repeats, warmup=warmup, block=block)
        if args.split:
            split += split_rows(name, rb, threads, repeats=repeats, warmup=warmup, block=block)
        del rb
    print(format_table(rows, COLUMNS))
    print(
        "tasks: the core's tasks one call ran with the default threads (1: not split; a "
        "split copy of compressed frames runs two a part, its chains resolved, then its rows "
        "decoded and copied); "
        "threads/1: the default's time over one thread's; floor: a plain C memcpy of the "
        "same frames, split as a copy out is (the host's own scaling)"
    )
    if split:
        print("\nwhere splitting pays: every gather split from 128 KiB (the part size lowered)")
        print(format_table(split, [c for c in COLUMNS if c[0] != "tasks"]))
    if args.check:
        report_checks(check_targets(rows, threads))
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
