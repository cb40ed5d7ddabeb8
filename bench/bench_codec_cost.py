"""Compression's cost in ``add`` against the coder's own work, counted in instructions.

``bench_compress`` times the same thing in microseconds, but on a shared 2-core host a
single add's time drifts by tens of percent between runs. Instructions do not: this
benchmark runs each of four children under ``valgrind --tool=callgrind`` (from Debian's
``valgrind``; ``PYTHONHASHSEED=0``, one BLAS thread) on a recorded game of
``bench_compress`` and counts what each executes:

- ``none``: loading the recording (the baseline of the three others);
- ``plain``: that, then every transition added to ``ReplayBuffer(n)``;
- ``compress``: the same adds to ``ReplayBuffer(n, compress=True)``;
- ``floor``: the recording, then ``lazyframes._core._codec_floor`` on its frames (the
  pool's coder, ``lf_coder_encode``, alone in a C loop).

The cost of compression is ``compress - plain``; the coder's work is ``floor - none``;
the target (bench/README.md) is their ratio <= 1.1. Run: ``python -m bench.bench_codec_cost
[--games Pong ...] [--steps N]`` from the source checkout (the recordings are
``bench_compress``'s, made on first use); a few minutes per game.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from ._util import format_table, header
from .bench_compress import GAMES, Stream, record

MODES = ("none", "plain", "compress", "floor")
TARGET = 1.10


def child(path: str, mode: str) -> None:
    """What one child runs (under callgrind): load the recording, then ``mode``'s work."""
    import numpy as np

    from lazyframes import _core
    from lazyframes.replay import ReplayBuffer

    stream = Stream(Path(path), None)
    items = list(stream)
    if mode == "floor":
        _core._codec_floor(np.ascontiguousarray(stream.frames))
    elif mode != "none":
        rb = ReplayBuffer(len(items), compress=mode == "compress")
        for item in items:
            rb.add(*item)


def instructions(path: Path, mode: str) -> int:
    """Instructions the child of ``mode`` executes, by callgrind."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable]
    cmd += ["-m", "bench.bench_codec_cost", "--child", str(path), mode]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    found = re.search(r"Collected : (\d+)", r.stderr)
    if r.returncode != 0 or not found:
        raise RuntimeError(f"callgrind failed for {mode}: {r.stderr[-2000:]}")
    return int(found.group(1))


def main(argv=None) -> list[dict]:
    """Count, print one row per game; return the rows."""
    p = argparse.ArgumentParser(prog="python -m bench.bench_codec_cost", description=__doc__)
    p.add_argument("--games", nargs="+", choices=GAMES, default=list(GAMES))
    p.add_argument("--steps", type=int, default=2000, help="recorded steps per game")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "lazyframes")
    p.add_argument("--child", nargs=2, metavar=("PATH", "MODE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(*args.child)
        return []
    if shutil.which("valgrind") is None:
        p.error("needs valgrind (apt-get install valgrind)")
    print(header("bench_codec_cost", "instructions by callgrind, not time"))
    rows = []
    for g in args.games:
        path = record(g, args.steps, args.seed, args.cache)
        n = {m: instructions(path, m) for m in MODES}
        cost, coder = n["compress"] - n["plain"], n["floor"] - n["none"]
        rows.append(
            {
                "game": g,
                "frames": len(Stream(path, None).frames),
                "cost": cost,
                "coder": coder,
                "ratio": cost / coder,
            }
        )
        print(f"  {g}: {n}", flush=True)
    cols = [
        ("game", "game", "{}"),
        ("frames", "frames", "{:,}"),
        ("cost", "compress - plain (instr.)", "{:,}"),
        ("coder", "codec floor (instr.)", "{:,}"),
        ("ratio", "cost / floor", "{:.3f}"),
    ]
    print(format_table(rows, cols))
    for r in rows:
        ok = "met" if r["ratio"] <= TARGET else "MISSED"
        print(f"  {r['game']}: compression's cost / coder {r['ratio']:.3f} (<= {TARGET}: {ok})")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
