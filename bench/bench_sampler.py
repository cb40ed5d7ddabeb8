"""Sampler benchmark: the time a learner waits for a batch, ``sample`` against ``sampler``.

A DQN-style loop on one buffer: each step fetches a batch of ``B`` (32) transitions, runs
a learner step, then adds ``--adds`` (4) transitions (a full buffer: each add evicts).
The learner step is a single-threaded torch matmul (``torch.set_num_threads(1)``; it
releases the GIL, as a real step's kernels do), sized before the timed run to last as
long as one ``sample`` of that row; without torch, ``time.sleep`` of that length; the
sampler's copies split over the cores but one (docs/REPLAY.md's advice), ``sample``'s over all. Each
row times, in the same run and round-robin (blocks of steps in turn, so that the host's
drift hits every column alike; 100 steps a block, so that the sampler's thread is in its
steady state):

- **sample**: the time inside ``rb.sample(B, dtype=, scale=)``, the step's batch fetch;
- **next**: the time inside ``next(sampler)``, ``sampler = rb.sampler(B, prefetch=2,
  dtype=, scale=)``: waiting for the batch the thread gathered (when its copies are
  slower than the learner's steps), and asking for the one two steps ahead;
- **step sample** / **step sampler** / **learn**: a whole step (fetch, learn) with each,
  and the learner step alone;
- **adds sample** / **adds sampler** / adds alone: the step's adds, timed apart: with a
  sampler, the first add makes the draw ``next()`` asked for if the sampler's thread,
  busy with a copy, has not made it during the learner step.

``waited/sample`` is the learner-visible time per batch, ``next`` plus what the adds
took more than with no batch fetched at all, against a plain ``sample`` (target <= 10%);
``sample beside learn`` is a ``sample`` on the cores the learner leaves while it learns,
into ``2 * prefetch + 1`` output sets used in turn as the sampler's (float32 sets of a
batch of 32 are 36 MB: more than a 32 MiB last-level cache), and ``least wait`` what it
takes beyond the learner step: the least wait the cores allow a sampler;
``saved`` is the share of a whole step with its adds that the sampler saves. Rows:
uint8 and float32/255 observations of raw 84x84 frames (``N`` transitions over a pool of
16,384 distinct random frames, so a batch reads frames from 110 MB in random order), and
the same of a compressing buffer of recorded Pong frames (tests/data/pong.npz, looped:
the thread decodes too). On a 2-CPU machine the learner and the thread each get one.
Run: ``python -m bench.bench_sampler [--quick] [--check] [--transitions N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections.abc import Callable

import numpy as np

from lazyframes import FramePool, ReplayBuffer, get_num_threads, set_num_threads

from ._util import format_table, header, report_checks, target

B = 32
K = 4
PREFETCH = 2
DISTINCT = 16_384  # distinct frames of the raw rows' pool
TARGET_VISIBLE = 0.10  # the learner's wait for a batch over sample(B)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def raw_buffer(n: int, seed: int) -> tuple[ReplayBuffer, Callable[[int], None]]:
    """A full buffer of ``n`` transitions over a pool of distinct random frames, and its add."""
    rng = np.random.default_rng(seed)
    pool = FramePool((84, 84), np.uint8, chunk_bytes=1 << 22)
    refs = [pool.push(rng.integers(0, 256, (84, 84), dtype=np.uint8)) for _ in range(DISTINCT)]
    rb = ReplayBuffer(n, seed=seed, pool=pool)

    def add(t: int) -> None:
        window = [refs[(t + j) % DISTINCT] for j in range(K + 1)]
        rb.add(pool.lazy(window[:K], layout="stack"), t % 6, 1.0,
               pool.lazy(window[1:], layout="stack"), False, False)  # fmt: skip

    for t in range(n):
        add(t)
    return rb, add


def pong_buffer(n: int, seed: int) -> tuple[ReplayBuffer, Callable[[int], None]]:
    """A full compressing buffer of ``n`` transitions of recorded Pong frames, and its add."""
    with np.load(os.path.join(ROOT, "tests", "data", "pong.npz")) as d:
        frames = d["frames"]
    loop = np.concatenate([frames, frames[-2:0:-1]])  # there and back: no cut in the stream
    rb = ReplayBuffer(n, seed=seed, compress=True)

    def add(t: int) -> None:
        idx = (t + np.arange(K + 1)) % len(loop)
        stack = loop[idx]
        rb.add(stack[:K], t % 6, 1.0, stack[1:], False, False)

    for t in range(n):
        add(t)
    rb.flush()
    return rb, add


def learner(seconds: float) -> tuple[Callable[[], None], str]:
    """A learner step of about ``seconds`` that releases the GIL, and what it is."""
    try:
        import torch
    except ImportError:
        return (lambda: time.sleep(seconds)), f"time.sleep({seconds * 1e6:.0f} us)"
    torch.set_num_threads(1)

    def timed(n: int) -> float:
        a, b = torch.randn(n, n), torch.randn(n, n)
        ts = []
        for _ in range(30):
            t0 = time.perf_counter()
            torch.mm(a, b)
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    n = 16
    while n < 4096 and timed(n) < seconds:
        n *= 2
    lo, hi = n // 2, n
    while hi - lo > 1:  # the smallest size that takes at least `seconds`
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if timed(mid) < seconds else (lo, mid)
    a, b = torch.randn(hi, hi), torch.randn(hi, hi)
    return (lambda: torch.mm(a, b)), f"torch.mm {hi}x{hi}, 1 thread"


def run_row(name, rb, add, dtype, scale, steps: int, adds: int, block: int) -> dict:
    """One row: the loop with ``sample`` and with a sampler, round-robin, medians in us."""
    kw = {"dtype": dtype, "scale": scale}
    every = get_num_threads()
    for _ in range(50):  # warm up: the output arrays made, the frames' pages touched
        rb.sample(B, **kw)
    ts = []
    for _ in range(100):
        t0 = time.perf_counter()
        rb.sample(B, **kw)
        ts.append(time.perf_counter() - t0)
    learn, what = learner(statistics.median(ts))
    # a sample on the threads the learner leaves, while it learns, into output sets used in
    # turn as the sampler's are: what the sampler's copy takes at best (the two share the
    # memory bandwidth and the last-level cache, which a float32 batch's sets overflow)
    set_num_threads(max(1, every - 1))
    like = rb.sample(B, **kw).observations
    sets = [(np.empty_like(like), np.empty_like(like)) for _ in range(2 * PREFETCH + 1)]
    busy, t_left = threading.Event(), []
    thread = threading.Thread(target=lambda: [learn() for _ in iter(busy.is_set, True)])
    thread.start()
    for i in range(100 + len(sets)):  # (the first use of each set untimed: its page faults)
        t0 = time.perf_counter()
        rb.sample(B, out=sets[i % len(sets)], **kw)
        if i >= len(sets):
            t_left.append(time.perf_counter() - t0)
    busy.set()
    thread.join()
    set_num_threads(every)
    left = statistics.median(t_left) * 1e6
    sampler = rb.sampler(B, prefetch=PREFETCH, **kw)
    names = ("sample", "next", "step_sample", "step_sampler", "learn", "adds_sample",
             "adds_sampler", "adds_alone")  # fmt: skip
    times: dict = {k: [] for k in names}
    t_add = [len(rb)]  # the next transition's number (the buffer is full)

    def add_some(kind: str) -> None:
        t0 = time.perf_counter()
        for _ in range(adds):
            add(t_add[0])
            t_add[0] += 1
        times["adds_" + kind].append(time.perf_counter() - t0)

    def step_sample() -> None:
        t0 = time.perf_counter()
        rb.sample(B, **kw)
        t1 = time.perf_counter()
        learn()
        t2 = time.perf_counter()
        times["sample"].append(t1 - t0)
        times["step_sample"].append(t2 - t0)
        add_some("sample")

    def step_sampler() -> None:
        t0 = time.perf_counter()
        next(sampler)
        t1 = time.perf_counter()
        learn()
        t2 = time.perf_counter()
        times["next"].append(t1 - t0)
        times["step_sampler"].append(t2 - t0)
        add_some("sampler")  # after the draw the thread made during learn(): no wait

    def learn_alone() -> None:
        t0 = time.perf_counter()
        learn()
        times["learn"].append(time.perf_counter() - t0)
        add_some("alone")

    def blocks(count: int) -> None:
        for _ in range(count):
            for fn in (step_sample, step_sampler, learn_alone):
                # as docs/REPLAY.md advises: sample's copy on every core (the learner waits for
                # it), a sampler's on what the 1-thread learner leaves
                set_num_threads(max(1, every - 1) if fn is step_sampler else every)
                for _ in range(block):
                    fn()
                # untimed: the thread ends the copies of the batches drawn ahead, so that
                # it runs beside the sampler's steps only
                time.sleep(0.01)

    blocks(1)  # warm up each
    for k in times:
        times[k].clear()
    blocks(max(1, steps // block))
    sampler.close()
    set_num_threads(every)
    us = {k + "_us": statistics.median(v) * 1e6 for k, v in times.items()}
    with_sample = us["step_sample_us"] + us["adds_sample_us"]
    with_sampler = us["step_sampler_us"] + us["adds_sampler_us"]
    visible = us["next_us"] + max(0.0, us["adds_sampler_us"] - us["adds_alone_us"])
    return {
        "row": name,
        "learner": what,
        **us,
        "left_us": left,
        "visible": visible / us["sample_us"],
        # the least wait the cores allow: the sampler's copy on what the learner leaves
        # takes `left`, the learner's step `learn`; the learner waits for the difference
        "bound": max(0.0, left - us["learn_us"]) / us["sample_us"],
        "over": max(0.0, visible - max(0.0, left - us["learn_us"])) / us["sample_us"],
        "saved": 1 - with_sampler / with_sample,
    }


COLUMNS = [
    ("row", "observations", "{}"),
    ("sample_us", "sample", "{:.0f}"),
    ("next_us", "next", "{:.1f}"),
    ("visible", "waited/sample", "{:.1%}"),
    ("left_us", "sample beside learn", "{:.0f}"),
    ("bound", "least wait/sample", "{:.1%}"),
    ("learn_us", "learn", "{:.0f}"),
    ("step_sample_us", "step sample", "{:.0f}"),
    ("step_sampler_us", "step sampler", "{:.0f}"),
    ("adds_sample_us", "adds sample", "{:.0f}"),
    ("adds_sampler_us", "adds sampler", "{:.0f}"),
    ("saved", "saved", "{:.0%}"),
]


def check_targets(rows: list[dict]) -> list[tuple[str, bool]]:
    """The targets that ``--check`` tests (bench/README.md): (description, met) pairs."""
    what = f"the learner's wait for a sampler's batch over sample({B})"
    over = "its wait beyond the least the cores allow, over sample"
    fmt = "{:.1%}"
    return [
        c
        for r in rows
        for c in (
            target(f"{r['row']}: {what}", r["visible"], "<=", TARGET_VISIBLE, fmt),
            target(f"{r['row']}: {over}", r["over"], "<=", TARGET_VISIBLE, fmt),
        )
    ]


def main(argv=None) -> list[dict]:
    """Run the sampler benchmark and print one table; return the rows.

    With ``--check`` it also prints the targets and exits with status 1 if one is missed.
    """
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_sampler",
        description="The learner-visible time per batch of ReplayBuffer.sampler against "
        "ReplayBuffer.sample, with a learner step as long as one sample.",
    )
    p.add_argument("--quick", action="store_true", help="a small, fast smoke run")
    p.add_argument(
        "--transitions",
        type=int,
        default=None,
        help="transitions in the buffer (default 100000, 5000 with --quick)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="timed steps of each kind per row (default 600, 40 with --quick)",
    )
    p.add_argument("--adds", type=int, default=4, help="transitions added per step (default 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--check",
        action="store_true",
        help="developer check: print the targets and exit with status 1 if one is missed",
    )
    args = p.parse_args(argv)
    n = args.transitions or (5_000 if args.quick else 100_000)
    steps = args.steps or (40 if args.quick else 600)
    block = 20 if args.quick else 100  # steps of one kind in a row: each kind's steady state
    print(header("bench_sampler", f"B={B}, prefetch={PREFETCH}, {args.adds} adds per step"))
    print(
        f"84x84 uint8 frames, k={K}, {n:,} transitions; median of {steps} steps of each kind "
        f"(microseconds); load average {os.getloadavg()[0]:.1f}"
    )
    rows = []
    learners = []
    for name, make in (("raw", raw_buffer), ("pong compressed", pong_buffer)):
        rb, add = make(n, args.seed)
        for dtype, scale, label in ((None, None, "uint8"), (np.float32, 1 / 255, "float32/255")):
            row = run_row(f"{name} {label}", rb, add, dtype, scale, steps, args.adds, block)
            rows.append(row)
            learners.append(f"{row['row']}: {row['learner']}")
        del rb, add
    print(format_table(rows, COLUMNS))
    print(
        "sample / next: the time inside rb.sample(B) / next(rb.sampler(B, prefetch=2)); waited: "
        "next + the adds' time over that of adds alone; "
        "learn: the learner step alone (sized to one sample: "
        + "; ".join(learners)
        + "); step: fetch + learn; adds: the step's "
        f"{args.adds} adds (with a sampler, the first makes the draw owed unless the sampler's "
        "thread has); saved: 1 - (step + adds with the sampler) / (step + "
        "adds with sample)."
    )
    if args.check:
        report_checks(check_targets(rows))
    return rows


if __name__ == "__main__":
    main()
