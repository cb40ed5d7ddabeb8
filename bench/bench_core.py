"""Core benchmark: materialising observations and batches, against floors and peers in one run.

For each layout (``"last"``: baselines' ``(84, 84, 4)``; ``"stack"``: Gymnasium /
PyTorch ``(4, 84, 84)``) and each case (one observation; a batch of 32 and of 256
observations drawn from random positions of a pool of distinct 84x84x1 uint8 frames;
the same batches converted to float32 in [0, 1]), it times:

- **lazyframes**: ``np.asarray(obs)`` for one observation, ``lazyframes.stack(batch,
  out=..., dtype=..., scale=...)`` into a preallocated array for a batch, and
  ``pool.gather(slots, out=...)`` (the replay buffer's path, from slot ids);
- **copy floor**: ``np.copyto`` of the same bytes, already contiguous, into a
  preallocated array (for the float cases: ``np.multiply(src, 1/255, out=f32)``, the
  best NumPy does from contiguous bytes);
- **gather floor**: ``lazyframes._core._memcpy_gather``, a plain C
  loop of ``memcpy`` over the same frame addresses as the batch, GIL released: the true
  floor of reading frames from random places, which is bound by memory latency; for
  the float cases ``lazyframes._core._convert_gather_floor``, a plain C loop that
  converts the same bytes at the same addresses (``float32(byte) * float32(1/255)``);
- **baselines-style**: OpenAI baselines' LazyFrames (``np.concatenate`` on the last axis
  and its ``_out`` cache, restated in bench/baselines.py; a fresh
  object for every observation so the cache does not make it free), batched as
  baselines' replay buffer does (``np.array([np.array(o) for o in batch])``), and for
  the float cases followed by ``.astype(np.float32) / 255``;
- **np.array(list)**: ``np.array(batch_of_lazyframes)`` (``.astype(np.float32) / 255``
  for the float cases), the obvious call.

A second part, **sample 32 obs+next**, times ``ReplayBuffer.sample(32, out=...)`` (uint8,
uncompressed, warmed, outputs reused) per layout (``"stack"`` ``(4, 84, 84)`` of
``(84, 84)`` frames, ``"first"`` ``(4, 84, 84)`` of ``(1, 84, 84)``, ``"last"``
``(84, 84, 4)`` of ``(84, 84, 1)``) on a buffer of ``--transitions`` (100,000) transitions
of one stream of distinct random frames, against the floor of its layout:
``_memcpy_gather(pool, slots, out, layout=...)`` copying the same ``2k`` frames of each
drawn transition (obs and next obs) into one preallocated array, in the same process:
one ``memcpy`` per frame (``"stack"``, ``"first"``), a plain nested C loop of the
interleave (``"last"``). Both cycle over the same 64 draws (the buffer's RNG rewound
every 64 calls), the floor half a cycle behind, so neither reads frames the other just
read; calls alternate, medians.

Sources are cycled over many distinct batches (as much data as the pool) so no
method runs from a warm cache the others do not get. Each figure is the median over
repeats after a warmup. Run: ``python -m bench.bench_core [--quick] [--check]`` from the
source checkout, or ``python -m bench``; bench/README.md explains the targets
that ``--check`` tests.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

import lazyframes
from bench._util import format_table, header, report_checks, target
from bench.baselines import BaselinesLazyFrames
from lazyframes import _core

#: The gather floors, plain C loops over a batch's frames: memcpy, and uint8 -> float32 * scale.
_memcpy_gather = _core._memcpy_gather
_convert_gather_floor = _core._convert_gather_floor

FRAME_SHAPE = (84, 84, 1)
K = 4
#: the frame shape of each layout's buffer in the sample rows: the same bytes in each
SAMPLE_FRAMES = {"stack": (84, 84), "first": (1, 84, 84), "last": (84, 84, 1)}
SAMPLE_B = 32
DRAWS = 64  # the sample rows cycle over this many draws (115 MB of frames read per cycle)
TARGET_GATHER_FLOOR = 1.1  # every uint8 batch within this factor of the gather floor
TARGET_BASELINES = 5.0  # batch of 32: at least this much faster than the baselines-style path


class _StackedBaselines(BaselinesLazyFrames):
    """Baselines' class in the new-leading-axis layout: ``np.stack`` instead of concatenate."""

    def _force(self):
        if self._out is None:
            self._out = np.stack(self._frames, axis=0)
            self._frames = None
        return self._out


def _baselines_frames(frames: np.ndarray, layout: str, start: int) -> BaselinesLazyFrames:
    """A fresh baselines-style observation over frames ``start .. start+K-1``.

    ``"last"``: (84, 84, 1) frames concatenated on the last axis, as baselines does;
    ``"stack"``: the (84, 84) frames stacked on a new leading axis, ``(4, 84, 84)``.
    """
    if layout == "last":
        return BaselinesLazyFrames([frames[start + j] for j in range(K)])
    return _StackedBaselines([frames[start + j, :, :, 0] for j in range(K)])


def _time(cases: dict, repeats: int, warmup: int) -> dict:
    """Median wall time in microseconds of each ``name: (fn, setup)``: ``fn(setup(i))``.

    ``setup`` is not timed. The cases are timed round-robin (one call of each per
    repeat), so a burst of load from elsewhere on the machine hits them alike and their
    ratios stay fair. Call ``j`` of repeat ``i`` gets ``setup(i * len(cases) + j)``:
    consecutive calls read different sources, so no case finds its data in cache
    because another case just read it.
    """
    perf = time.perf_counter_ns
    times = {name: [] for name in cases}
    n = len(cases)
    for i in range(warmup + repeats):
        for j, (name, (fn, setup)) in enumerate(cases.items()):
            arg = setup(i * n + j)
            t0 = perf()
            fn(arg)
            t1 = perf()
            if i >= warmup:
                times[name].append(t1 - t0)
    return {name: statistics.median(t) / 1000.0 for name, t in times.items()}


def _fmt_us(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


def _fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


COLUMNS = [
    ("case", "case", str),
    ("layout", "layout", str),
    ("lazyframes_us", "lazyframes us", _fmt_us),
    ("floor_us", "copy floor us", _fmt_us),
    ("vs_floor", "lf/copy floor", _fmt_ratio),
    ("gather_floor_us", "gather floor us", _fmt_us),
    ("vs_gather_floor", "lf/gather floor", _fmt_ratio),
    ("baselines_us", "baselines us", _fmt_us),
    ("speedup_baselines", "x faster", _fmt_ratio),
    ("np_array_us", "np.array(list) us", _fmt_us),
    ("speedup_np_array", "x faster", _fmt_ratio),
]

LEGEND = (
    "lf/copy floor: lazyframes time / time to copy the same bytes when they are already "
    "contiguous;\nlf/gather floor: lazyframes time / a plain C memcpy loop over the same "
    "frame addresses (1.00x = as fast as reading those frames can be); for the sample rows,\n"
    "the floor of the row's layout on the same frames (last: a plain C loop of the "
    "interleave; f32 rows: a plain C loop converting the same bytes);\n"
    "x faster: peer time / lazyframes time."
)


def run(*, pool_frames: int, repeats: int, warmup: int, batch_sizes=(32, 256), seed: int = 0):
    """Measure every case; returns the rows (dicts with the COLUMNS keys and a ``lazyframes_call``).

    The gather floor is measured only with the compiled core; with the NumPy twin its
    columns are None.
    """
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, size=(pool_frames,) + FRAME_SHAPE, dtype=np.uint8)
    pool = lazyframes.FramePool(FRAME_SHAPE, np.uint8)
    store = pool.push_batch(frames)  # (pool_frames, 1): owns one reference per frame
    ids = store.slots[:, 0]
    n_pos = pool_frames - K + 1
    windows = ids[np.arange(n_pos)[:, None] + np.arange(K)]  # (n_pos, K) slot ids
    timing = {"repeats": repeats, "warmup": warmup}
    rows = []
    for layout in ("last", "stack"):
        rows.append(_one_obs_row(pool, frames, windows, layout, rng, **timing))
        for B in batch_sizes:
            rows.extend(_batch_rows(pool, frames, windows, layout, B, rng, **timing))
    del store
    return rows


def _one_obs_row(pool, frames, windows, layout, rng, *, repeats, warmup) -> dict:
    """``np.asarray(obs)`` of one observation against the copy floor and baselines-style."""
    n_pos = len(windows)
    n_src = max(1, min(n_pos, len(frames) // K))  # as many bytes as the pool holds
    starts = rng.integers(0, n_pos, size=n_src)
    lazy = [pool.lazy(windows[s], layout=layout) for s in starts]
    src = np.stack([np.asarray(o) for o in lazy])  # the same bytes, contiguous
    dst = np.empty(lazy[0].shape, np.uint8)
    t = _time(
        {
            "lf": (np.asarray, lambda i: lazy[i % n_src]),
            "floor": (lambda s: np.copyto(dst, s), lambda i: src[i % n_src]),
            "base": (
                np.asarray,
                lambda i: _baselines_frames(frames, layout, int(starts[i % n_src])),
            ),
        },
        repeats,
        warmup,
    )
    return _row("1 obs", layout, "np.asarray(obs)", t["lf"], floor=t["floor"], base=t["base"])


def _batch_rows(pool, frames, windows, layout, B, rng, *, repeats, warmup) -> list[dict]:
    """Batches of ``B`` observations: ``stack``, ``pool.gather`` and the float conversion."""
    n_batches = max(2, min(64, len(frames) // B))
    pos = rng.integers(0, len(windows), size=(n_batches, B))
    batches = [[pool.lazy(windows[p], layout=layout) for p in row] for row in pos]
    slot_batches = [np.ascontiguousarray(windows[row]) for row in pos]
    src = np.stack([lazyframes.stack(b) for b in batches])  # (n_batches, B, *obs_shape)
    out = np.empty(src.shape[1:], np.uint8)
    outf = np.empty(src.shape[1:], np.float32)
    scale = np.float32(1 / 255)

    def batch(i):
        return batches[i % n_batches]

    def slot_batch(i):
        return slot_batches[i % n_batches]

    def contiguous(i):
        return src[i % n_batches]

    def fresh(i):
        return [_baselines_frames(frames, layout, int(p)) for p in pos[i % n_batches]]

    cases = {
        "lf": (lambda b: lazyframes.stack(b, out=out), batch),
        "gather": (lambda s: pool.gather(s, out=out, layout=layout), slot_batch),
        "floor": (lambda s: np.copyto(out, s), contiguous),
        "base": (lambda b: np.array([np.array(o) for o in b]), fresh),
        "npa": (np.array, batch),
    }
    cases["gfloor"] = (lambda s: _memcpy_gather(pool, s, out), slot_batch)
    t = _time(cases, repeats, warmup)
    ref = {"floor": t["floor"], "gather_floor": t.get("gfloor"), "base": t["base"], "npa": t["npa"]}
    rows = [
        _row(f"batch {B}", layout, "stack(batch, out=)", t["lf"], **ref),
        _row(f"batch {B} gather", layout, "pool.gather(slots, out=)", t["gather"], **ref),
    ]
    t = _time(
        {
            "lf": (lambda b: lazyframes.stack(b, out=outf, dtype=np.float32, scale=1 / 255), batch),
            "gather": (
                lambda s: pool.gather(s, out=outf, layout=layout, dtype=np.float32, scale=1 / 255),
                slot_batch,
            ),
            "floor": (lambda s: np.multiply(s, scale, out=outf), contiguous),
            "gfloor": (lambda s: _convert_gather_floor(pool, s, outf, scale), slot_batch),
            "base": (lambda b: np.array([np.array(o) for o in b]).astype(np.float32) / 255, fresh),
            "npa": (lambda b: np.array(b).astype(np.float32) / 255, batch),
        },
        repeats,
        warmup,
    )
    ref = {"floor": t["floor"], "gather_floor": t["gfloor"], "base": t["base"], "npa": t["npa"]}
    call = "stack(batch, out=, dtype=f32, scale=1/255)"
    rows.append(_row(f"batch {B} -> f32/255", layout, call, t["lf"], **ref))
    call = "pool.gather(slots, out=, dtype=f32, scale=1/255)"
    rows.append(_row(f"batch {B} gather -> f32/255", layout, call, t["gather"], **ref))
    return rows


def sample_rows(*, transitions: int, repeats: int, warmup: int, seed: int = 0) -> list[dict]:
    """``rb.sample(32, out=)`` obs + next obs against the floor of its layout, per layout."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, size=(transitions + K, 84 * 84), dtype=np.uint8)
    rows = []
    for layout, shape in SAMPLE_FRAMES.items():
        pool = lazyframes.FramePool(shape, np.uint8)
        held = pool.push_batch(frames.reshape(-1, *shape))  # one stream's frames
        ids = held.slots[:, 0]
        rb = lazyframes.ReplayBuffer(transitions, pool=pool, layout=layout, seed=seed)
        for t in range(transitions):
            w = ids[t : t + K + 1]
            rb.add(pool.lazy(w[:K], layout=layout), 0, 1.0, pool.lazy(w[1:], layout=layout),
                   False, False)  # fmt: skip
        obs_shape = rb.sample(1).observations.shape[1:]
        out = tuple(np.empty((SAMPLE_B, *obs_shape), np.uint8) for _ in range(2))
        fout = np.empty((SAMPLE_B, 2, *obs_shape), np.uint8)  # each row's obs and next obs
        table = rb._stores[0].frame_ids(len(rb))  # (n, 2k): obs then next obs frames (n_step 1)
        state = rb._rng.bit_generator.state
        draws = [table[rb.sample(SAMPLE_B, out=out).indices] for _ in range(DRAWS)]
        slots = [d.reshape(2 * SAMPLE_B, K) for d in draws]  # obs 0, next 0, obs 1, ...
        _memcpy_gather(pool, slots[-1], fout, layout=layout)  # the same bytes as the sample
        assert (fout[:, 0] == out[0]).all() and (fout[:, 1] == out[1]).all(), layout
        times: dict = {"lf": [], "floor": []}
        perf = time.perf_counter_ns
        for i in range(warmup + repeats):
            if i % DRAWS == 0:
                rb._rng.bit_generator.state = state  # call i draws draws[i % DRAWS]
            for name in ("lf", "floor") if i % 2 else ("floor", "lf"):
                t0 = perf()
                if name == "lf":
                    rb.sample(SAMPLE_B, out=out)
                else:  # half a cycle behind the sample: frames it read 32 calls ago
                    _memcpy_gather(pool, slots[(i + DRAWS // 2) % DRAWS], fout, layout=layout)
                if i >= warmup:
                    times[name].append(perf() - t0)
        lf, floor = (statistics.median(times[k]) / 1000.0 for k in ("lf", "floor"))
        rows.append({
            "case": f"sample {SAMPLE_B} obs+next",
            "layout": layout,
            "lazyframes_call": "rb.sample(32, out=(obs, next_obs))",
            "lazyframes_us": lf,
            "gather_floor_us": floor,
            "vs_gather_floor": lf / floor,
        })  # fmt: skip
        del rb, pool, held
    return rows


def _row(case, layout, call, lf, *, floor, base, gather_floor=None, npa=None) -> dict:
    """One table row: ``lf`` (microseconds) and the ratios of the floors and peers to it."""
    return {
        "case": case,
        "layout": layout,
        "lazyframes_call": call,
        "lazyframes_us": lf,
        "floor_us": floor,
        "vs_floor": lf / floor,
        "gather_floor_us": gather_floor,
        "vs_gather_floor": None if gather_floor is None else lf / gather_floor,
        "baselines_us": base,
        "speedup_baselines": base / lf,
        "np_array_us": npa,
        "speedup_np_array": None if npa is None else npa / lf,
    }


def check_targets(rows: list[dict]) -> list[tuple[str, bool]]:
    """The targets that ``--check`` tests (bench/README.md): (description, met) pairs."""
    results = []
    for r in rows:
        where = f"{r['case']} [{r['layout']}]"
        if r["vs_gather_floor"] is not None and "f32" not in r["case"]:  # uint8 rows
            results.append(
                target(
                    f"{where}: lazyframes / gather floor",
                    r["vs_gather_floor"],
                    "<=",
                    TARGET_GATHER_FLOOR,
                )
            )
        if r["case"] == "batch 32":
            results.append(
                target(
                    f"{where}: baselines-style / lazyframes",
                    r["speedup_baselines"],
                    ">=",
                    TARGET_BASELINES,
                    "{:.1f}x",
                )
            )
    return results


def main(argv=None) -> list[dict]:
    """Run the core benchmark and print one table; return the rows.

    With ``--check`` it also prints the targets and exits with status 1 if one is missed.
    """
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_core",
        description="Materialising observations and batches: lazyframes vs the copy and "
        "gather floors, a baselines-style LazyFrames and np.array(list).",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a fast smoke run (small pool, few repeats); figures are noisier",
    )
    p.add_argument(
        "--pool-frames",
        type=int,
        default=None,
        help="distinct 84x84x1 frames in the pool (default 16384; 2048 with --quick)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed repeats per figure, the median is reported (default 200; 15 with --quick)",
    )
    p.add_argument(
        "--transitions",
        type=int,
        default=None,
        help="transitions of each layout's buffer in the sample rows (default 100000; "
        "10000 with --quick)",
    )
    p.add_argument(
        "--sample-only",
        action="store_true",
        help="only the sample rows (rb.sample(32) obs + next obs against each layout's floor)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random frames and positions")
    p.add_argument(
        "--check",
        action="store_true",
        help="developer check: print the performance targets (bench/README.md) and "
        "exit with status 1 if one is missed",
    )
    args = p.parse_args(argv)
    pool_frames = args.pool_frames or (2048 if args.quick else 16384)
    repeats = args.repeats or (15 if args.quick else 200)
    warmup = 3 if args.quick else 20
    if pool_frames < K + 256:
        p.error(f"--pool-frames must be at least {K + 256}")

    print(header("bench_core"))
    print(
        f"pool of {pool_frames:,} distinct {FRAME_SHAPE} uint8 frames, k={K}; "
        f"median of {repeats} repeats (microseconds)"
    )
    transitions = args.transitions or (10_000 if args.quick else 100_000)
    if transitions < DRAWS * SAMPLE_B:
        p.error(f"--transitions must be at least {DRAWS * SAMPLE_B}")
    print(f"sample rows: buffers of {transitions:,} transitions, {transitions + K:,} frames")
    rows = []
    if not args.sample_only:
        rows = run(pool_frames=pool_frames, repeats=repeats, warmup=warmup, seed=args.seed)
    rows += sample_rows(transitions=transitions, repeats=repeats, warmup=warmup, seed=args.seed)
    print(format_table(rows, COLUMNS))
    print(LEGEND)
    if args.check:
        report_checks(check_targets(rows))
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
