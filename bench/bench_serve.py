"""Learner processes served by the buffer's owner: the wait a learner process sees for a batch.

The owner process holds a full buffer (bench_sampler's: raw random 84x84 frames, or a
compressing buffer of recorded Pong) and a :class:`lazyframes.serve.BatchServer`; it loops
``add`` one transition, ``server.pump()``, as an ingest loop does. A spawned learner
process loops ``client.next()`` then a learner step as long as one ``sample`` in the
owner (bench_sampler's single-threaded torch matmul, calibrated in the learner), and
times each ``next()``. Per row, in the same run:

- **sample**: ``rb.sample(B, dtype=, scale=)`` in the owner, alone (median);
- **next**: the learner's median wait in ``next()``, and its 90th percentile;
- **next/sample**: what the learner process waits per batch against fetching it itself;
- **batches/s**: batches the learner took per second with no learner step (the server's
  throughput, bounded by the owner's loop and the copies on the cores left).

On 2 cores the owner's loop, its copying threads and the learner share them.
Run: ``python -m bench.bench_serve [--transitions N] [--steps N] [--quick]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

import numpy as np

from lazyframes import set_num_threads
from lazyframes.serve import BatchClient, BatchServer

from ._util import format_table, header, round_robin_us
from .bench_replay import _die_with_parent
from .bench_sampler import PREFETCH, B, learner, pong_buffer, raw_buffer

COLUMNS = [
    ("row", "observations", "{}"),
    ("sample_us", "sample", "{:.0f}"),
    ("next_us", "next", "{:.1f}"),
    ("next_p90_us", "next p90", "{:.1f}"),
    ("visible", "next/sample", "{:.1%}"),
    ("learn", "learner step", "{}"),
    ("rate", "batches/s (no step)", "{:,.0f}"),
]


def _learn(path: str, seconds: float, steps: int, out) -> None:
    """The learner process: ``steps`` of next() + a step of ``seconds``, then a free run."""
    _die_with_parent()
    step, what = learner(seconds) if seconds else ((lambda: None), "none")
    client = BatchClient(path)
    waits = []
    for i in range(steps + 20):  # 20 warm-up batches
        t0 = time.perf_counter()
        client.next(timeout=60)
        if i >= 20:
            waits.append(time.perf_counter() - t0)
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        client.next(timeout=60)
    rate = steps / (time.perf_counter() - t0)
    client.close()
    out.send((waits, what, rate))


def run_row(name: str, rb, add, dtype, scale, steps: int) -> dict:
    """One row: the owner's sample alone, then a learner process served while adding."""
    sample_us = round_robin_us({"s": lambda: rb.sample(B, dtype=dtype, scale=scale)}, 200, 20)["s"]
    ctx = mp.get_context("spawn")
    with BatchServer(rb, B, prefetch=PREFETCH, dtype=dtype, scale=scale) as server:
        mine, theirs = ctx.Pipe()
        child = ctx.Process(target=_learn, args=(server.path, sample_us / 1e6, steps, theirs))
        child.start()
        t = 0
        while not mine.poll():  # the ingest loop: one add, one pump
            add(t)
            server.pump()
            t += 1
        waits, what, rate = mine.recv()
        child.join(30)
    us = sorted(w * 1e6 for w in waits)
    nxt, p90 = statistics.median(us), us[int(0.9 * len(us))]
    return {"row": name, "sample_us": sample_us, "next_us": nxt, "next_p90_us": p90,
            "visible": nxt / sample_us, "learn": what, "rate": rate}  # fmt: skip


def main(argv=None) -> list[dict]:
    """Run the serving benchmark and print one table; return the rows."""
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_serve",
        description="The wait of a learner process for a batch served by the buffer's owner "
        "(lazyframes.serve) against a sample in the owner.",
    )
    p.add_argument("--quick", action="store_true", help="a small, fast smoke run")
    p.add_argument("--transitions", type=int, default=None, help="default 100000 (5000 quick)")
    p.add_argument("--steps", type=int, default=None, help="timed batches (400, 30 quick)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    n = args.transitions or (5_000 if args.quick else 100_000)
    steps = args.steps or (30 if args.quick else 400)
    set_num_threads(1)  # the owner's copies leave a core to the learner process
    print(header("bench_serve", f"B={B}, prefetch={PREFETCH}, one learner process"))
    print(f"84x84 uint8 frames, k=4, {n:,} transitions; {steps} timed batches per row (us)")
    rows = []
    for name, make in (("raw", raw_buffer), ("pong compressed", pong_buffer)):
        rb, add = make(n, args.seed)
        for dtype, scale, label in ((None, None, "uint8"), (np.float32, 1 / 255, "float32/255")):
            rows.append(run_row(f"{name} {label}", rb, add, dtype, scale, steps))
        del rb, add
    print(format_table(rows, COLUMNS))
    print(
        "sample: rb.sample(B) in the owner, alone; next: the learner process's wait in "
        "BatchClient.next() while the owner adds and pumps, its step as long as one sample; "
        f"batches/s: the learner taking batches with no step. load average "
        f"{os.getloadavg()[0]:.1f}."
    )
    return rows


if __name__ == "__main__":
    main()
