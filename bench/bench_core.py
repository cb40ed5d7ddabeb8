"""Core benchmark: materialising observations and batches, against peers measured in the same run.

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
- **baselines-style**: OpenAI baselines' LazyFrames (``np.concatenate`` on the last axis
  and its ``_out`` cache, restated in bench/baselines_reference.py; a fresh
  object for every observation so the cache does not make it free), batched as
  baselines' replay buffer does (``np.array([np.array(o) for o in batch])``), and for
  the float cases followed by ``.astype(np.float32) / 255``;
- **np.array(list)**: ``np.array(batch_of_lazyframes)`` (``.astype(np.float32) / 255``
  for the float cases), the obvious call.

Sources are cycled over many distinct batches (as much data as the pool) so no
method runs from a warm cache the others do not get. Each figure is the median over
repeats after a warmup. Run: ``python -m bench.bench_core [--quick]`` from the source
checkout, or ``python -m lazyframes bench``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

import lazyframes
from bench.baselines_reference import BaselinesLazyFrames

FRAME_SHAPE = (84, 84, 1)
K = 4
TARGET_FLOOR = 1.2  # batch of 32 within this factor of the copy floor
TARGET_BASELINES = 5.0  # at least this much faster than the baselines-style path


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
    """Median wall time in microseconds of each ``name: (fn, setup)``: ``fn(setup(i))``, setup untimed.

    The cases are timed round-robin (one call of each per repeat), so a burst of load
    from elsewhere on the machine hits them alike and their ratios stay fair. Call ``j``
    of repeat ``i`` gets ``setup(i * len(cases) + j)``: consecutive calls read different
    sources, so no case finds its data in cache because another case just read it.
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


def format_table(rows: list[dict], columns: list[tuple[str, str, callable]]) -> str:
    """Plain aligned table: ``columns`` is a list of (key, header, formatter)."""
    cells = [[h for _, h, _ in columns]]
    for r in rows:
        cells.append([fmt(r.get(k)) for k, _, fmt in columns])
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


COLUMNS = [
    ("case", "case", str),
    ("layout", "layout", str),
    ("lazyframes_us", "lazyframes us", _fmt_us),
    ("floor_us", "copy floor us", _fmt_us),
    ("vs_floor", "lf/floor", _fmt_ratio),
    ("baselines_us", "baselines us", _fmt_us),
    ("speedup_baselines", "x faster", _fmt_ratio),
    ("np_array_us", "np.array(list) us", _fmt_us),
    ("speedup_np_array", "x faster", _fmt_ratio),
]


def run(*, pool_frames: int, repeats: int, warmup: int, batch_sizes=(32, 256), seed: int = 0):
    """Measure every case; returns the rows (dicts with the COLUMNS keys and a ``lazyframes_call``)."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, size=(pool_frames,) + FRAME_SHAPE, dtype=np.uint8)
    pool = lazyframes.FramePool(FRAME_SHAPE, np.uint8)
    slots = pool.push_many(frames)
    n_pos = pool_frames - K + 1
    obs_bytes = int(np.prod(FRAME_SHAPE)) * K
    rows = []

    for layout in ("last", "stack"):
        windows = slots[np.arange(n_pos)[:, None] + np.arange(K)]  # (n_pos, K) slot ids

        # -- one observation --------------------------------------------------------
        n_src = max(1, min(n_pos, pool.frame_bytes * pool_frames // obs_bytes))
        starts = rng.integers(0, n_pos, size=n_src)
        lazy = [pool.lazy(windows[s], layout=layout) for s in starts]
        shape = np.asarray(lazy[0]).shape
        src1 = np.stack([np.asarray(o) for o in lazy])  # same bytes, contiguous
        dst1 = np.empty(shape, np.uint8)
        t = _time({
            "lf": (np.asarray, lambda i: lazy[i % n_src]),
            "floor": (lambda s: np.copyto(dst1, s), lambda i: src1[i % n_src]),
            "base": (np.asarray, lambda i: _baselines_frames(frames, layout, int(starts[i % n_src]))),
        }, repeats, warmup)
        lf, floor, base = t["lf"], t["floor"], t["base"]
        rows.append(_row("1 obs", layout, "np.asarray(obs)", lf, floor, base, None))

        # -- batches ---------------------------------------------------------------
        for B in batch_sizes:
            n_batches = max(2, min(64, pool_frames // B))
            pos = rng.integers(0, n_pos, size=(n_batches, B))
            batches = [[pool.lazy(windows[p], layout=layout) for p in row] for row in pos]
            slot_batches = [np.ascontiguousarray(windows[row]) for row in pos]
            src = np.stack([lazyframes.stack(b) for b in batches])  # (n_batches, B, *shape)
            out = np.empty((B,) + shape, np.uint8)
            outf = np.empty((B,) + shape, np.float32)
            scale = np.float32(1 / 255)

            def fresh(i, B=B, pos=pos):
                return [_baselines_frames(frames, layout, int(p)) for p in pos[i % len(pos)]]

            batch = lambda i: batches[i % n_batches]  # noqa: E731
            t = _time({
                "lf": (lambda b: lazyframes.stack(b, out=out), batch),
                "gather": (lambda s: pool.gather(s, out=out, layout=layout),
                           lambda i: slot_batches[i % n_batches]),
                "floor": (lambda s: np.copyto(out, s), lambda i: src[i % n_batches]),
                "base": (lambda b: np.array([np.array(o) for o in b]), fresh),
                "npa": (np.array, batch),
            }, repeats, warmup)
            rows.append(_row(f"batch {B}", layout, "stack(batch, out=)",
                             t["lf"], t["floor"], t["base"], t["npa"]))
            rows.append(_row(f"batch {B} gather", layout, "pool.gather(slots, out=)",
                             t["gather"], t["floor"], t["base"], t["npa"]))
            t = _time({
                "lf": (lambda b: lazyframes.stack(b, out=outf, dtype=np.float32, scale=1 / 255), batch),
                "floor": (lambda s: np.multiply(s, scale, out=outf), lambda i: src[i % n_batches]),
                "base": (lambda b: np.array([np.array(o) for o in b]).astype(np.float32) / 255, fresh),
                "npa": (lambda b: np.array(b).astype(np.float32) / 255, batch),
            }, repeats, warmup)
            rows.append(_row(f"batch {B} -> f32/255", layout, "stack(batch, out=, dtype=f32, scale=1/255)",
                             t["lf"], t["floor"], t["base"], t["npa"]))
            del batches, src
    del lazy
    return rows


def _row(case, layout, call, lf, floor, base, npa):
    return {
        "case": case,
        "layout": layout,
        "lazyframes_call": call,
        "lazyframes_us": lf,
        "floor_us": floor,
        "vs_floor": lf / floor,
        "baselines_us": base,
        "speedup_baselines": base / lf,
        "np_array_us": npa,
        "speedup_np_array": None if npa is None else npa / lf,
    }


def main(argv=None) -> list[dict]:
    """Run the core benchmark, print one table and the targets; return the rows."""
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_core",
        description="Materialising observations and batches: lazyframes vs the copy floor, "
                    "a baselines-style LazyFrames and np.array(list).",
    )
    p.add_argument("--quick", action="store_true",
                   help="a fast smoke run (small pool, few repeats); figures are noisier")
    p.add_argument("--pool-frames", type=int, default=None,
                   help="distinct 84x84x1 frames in the pool (default 16384; 2048 with --quick)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed repeats per figure, the median is reported (default 200; 15 with --quick)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random frames and positions")
    args = p.parse_args(argv)
    pool_frames = args.pool_frames or (2048 if args.quick else 16384)
    repeats = args.repeats or (15 if args.quick else 200)
    warmup = 3 if args.quick else 20
    if pool_frames < K + 256:
        p.error(f"--pool-frames must be at least {K + 256}")

    print(f"bench_core: lazyframes {lazyframes.__version__}, core: {lazyframes.IMPLEMENTATION}, "
          f"numpy {np.__version__}; pool of {pool_frames:,} distinct {FRAME_SHAPE} uint8 frames, "
          f"k={K}; median of {repeats} repeats (microseconds)")
    rows = run(pool_frames=pool_frames, repeats=repeats, warmup=warmup, seed=args.seed)
    print(format_table(rows, COLUMNS))
    print("lf/floor: lazyframes time / copy floor time (1.00x = as fast as copying the "
          "same bytes contiguously); x faster: peer time / lazyframes time.")
    for r in rows:
        if r["case"] == "batch 32":
            ok_floor = r["vs_floor"] <= TARGET_FLOOR
            ok_base = r["speedup_baselines"] >= TARGET_BASELINES
            print(f"target batch 32 [{r['layout']}]: {r['vs_floor']:.2f}x the copy floor "
                  f"(<= {TARGET_FLOOR}x: {'met' if ok_floor else 'MISSED'}); "
                  f"{r['speedup_baselines']:.1f}x faster than baselines-style "
                  f"(>= {TARGET_BASELINES:.0f}x: {'met' if ok_base else 'MISSED'})")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
