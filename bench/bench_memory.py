"""Memory benchmark: the bytes of a compressed transition, split, beside two zstd-3 floors.

Per game (``--games``: any ALE game, e.g. ``Pong MsPacman``), ``bench_compress``'s
random-policy recording (``AtariPreprocessing`` 84x84 grayscale, frame skip 4, seed
``--seed``, recorded once and cached) of ``--steps`` env steps (default: 1,000,000 for
Pong, 200,000 for any other game) is added, as stacked ``(4, 84, 84)`` observations with
reset padding (one new frame a step, each step distinct), to
``ReplayBuffer(steps, compress=True, action_dtype=np.uint8)`` (Atari's actions fit one
byte) in a spawned process of its own, then flushed.
Columns, in bytes per transition:

- **memory()**: ``memory()["bytes_per_transition"]``; **RSS**: the process's anonymous
  resident memory grown over the fill (from a heap trimmed of free memory first);
- **payload**: the frames' bytes (compressed blobs, the few frames kept uncompressed,
  the codec's slab slack): ``bytes_held - slot_state_bytes``;
- **slot state**: the pool's per-slot state (``slot_state_bytes``: the record and the
  refcount word of every slot);
- **tables**: the buffer's own arrays (``table_bytes``: the ring's fields, each row's
  frame references);
- **floor frame** / **floor xor**: zstd level 3 (``zstandard``, ``pip install -e
  '.[bench]'``) of each distinct frame alone / of each frame XOR the previous frame of
  its episode (an episode's first frame alone), summed over the recording.

``--check`` prints the targets of bench/README.md: per game the bound of its
``TARGET_BPT`` (by ``memory()`` and by RSS), on any game ``1.5 x`` the better floor ``+
24`` bytes, and slot state plus tables ``<= 24`` bytes (a plain uniform buffer, one-byte
actions). Run: ``python -m bench.bench_memory [--games G ...] [--steps N] [--check]``.
"""

from __future__ import annotations

import argparse
import gc
import os
from pathlib import Path

import numpy as np

from ._util import format_table, header, report_checks, target
from .bench_compress import Stream, record, rss_anon, rss_baseline
from .bench_replay import _in_child

GAMES = ("Pong", "Breakout", "MsPacman", "Seaquest")
STEPS = {"Pong": 1_000_000}  # the other games: DEFAULT_STEPS
DEFAULT_STEPS = 200_000
#: --check targets, bytes per transition by memory() and by RSS (bench/README.md)
TARGET_BPT = {"Pong": 150, "Breakout": 120, "MsPacman": 320, "Seaquest": 280}
TARGET_FLOOR = 1.5  # on any game: at most this times the better floor, plus TARGET_META
TARGET_META = 24  # slot state plus tables


def floors(path: Path) -> tuple[float, float]:
    """zstd-3 bytes of the recording's frames: each alone, each XOR its predecessor."""
    import zstandard

    z = zstandard.ZstdCompressor(level=3)
    with np.load(path) as d:
        frames, starts, n = d["frames"], set(d["starts"].tolist()), d["src"].size
    alone = xor = 0
    for i, f in enumerate(frames):
        size = len(z.compress(f.tobytes()))
        alone += size
        xor += size if i in starts else len(z.compress((f ^ frames[i - 1]).tobytes()))
    return alone / n, xor / n


def measure(game: str, path: str, seed: int) -> dict:
    """Fill a compressing buffer with the recording (in a child); its figures per transition."""
    from lazyframes import ReplayBuffer

    stream = Stream(Path(path), None)
    r0 = rss_baseline()
    rb = ReplayBuffer(stream.n, seed=seed, compress=True, action_dtype=np.uint8)
    for item in stream:
        rb.add(*item)
    rb.flush()
    gc.collect()
    rss = rss_anon() - r0
    m, n = rb.memory(), stream.n
    assert m["transitions"] == n, m
    frame, xor = floors(Path(path))
    return {
        "game": game,
        "steps": n,
        "memory": m["bytes_per_transition"],
        "rss": rss / n,
        "payload": (m["bytes_held"] - m["slot_state_bytes"]) / n,
        "slot_state": m["slot_state_bytes"] / n,
        "tables": m["table_bytes"] / n,
        "floor_frame": frame,
        "floor_xor": xor,
    }


COLUMNS = [
    ("game", "game", "{}"),
    ("steps", "transitions", "{:,}"),
    ("memory", "memory()", "{:.1f}"),
    ("rss", "RSS", "{:.1f}"),
    ("payload", "payload", "{:.1f}"),
    ("slot_state", "slot state", "{:.1f}"),
    ("tables", "tables", "{:.1f}"),
    ("floor_frame", "floor frame", "{:.1f}"),
    ("floor_xor", "floor xor", "{:.1f}"),
    ("bound", "1.5 floor + 24", "{:.1f}"),
]


def check_targets(rows: list[dict]) -> list[tuple[str, bool]]:
    """The targets that ``--check`` tests (bench/README.md): (description, met) pairs."""
    out = []
    for r in rows:
        g, fmt = r["game"], "{:.1f} B"
        for key, what in (("memory", "memory()"), ("rss", "RSS")):
            if g in TARGET_BPT:
                out.append(target(f"{g}: bytes per transition by {what}", r[key], "<=",
                                  TARGET_BPT[g], fmt))  # fmt: skip
            out.append(target(f"{g}: by {what}, 1.5 x the better floor + 24", r[key], "<=",
                              r["bound"], fmt))  # fmt: skip
        meta = r["slot_state"] + r["tables"]
        out.append(target(f"{g}: slot state + tables", meta, "<=", TARGET_META, fmt))
    return out


def main(argv=None) -> list[dict]:
    """Run the memory benchmark and print one table; return the rows.

    With ``--check`` it also prints the targets and exits with status 1 if one is missed.
    """
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_memory",
        description="Bytes per compressed transition of recorded Atari games, split into "
        "payload, per-slot state and tables, beside zstd-3 floors.",
    )
    p.add_argument("--games", nargs="+", default=list(GAMES), metavar="GAME",
                   help="ALE games, e.g. Pong MsPacman (default: %(default)s)")  # fmt: skip
    p.add_argument("--steps", type=int, default=None,
                   help="env steps recorded per game (default: 1,000,000 for Pong, "
                   f"{DEFAULT_STEPS:,} for the others)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "lazyframes",
                   help="where recordings are kept (default: %(default)s)")  # fmt: skip
    p.add_argument("--check", action="store_true",
                   help="developer check: print the targets, exit 1 if one is missed")  # fmt: skip
    args = p.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    print(
        header(
            "bench_memory",
            "ReplayBuffer(n, compress=True, action_dtype=np.uint8), stacked (4, 84, 84) adds",
        )
    )
    rows = []
    for game in args.games:
        steps = args.steps or STEPS.get(game, DEFAULT_STEPS)
        path = record(game, steps, args.seed, args.cache)
        row = _in_child(measure, game, os.fspath(path), args.seed)
        row["bound"] = TARGET_FLOOR * min(row["floor_frame"], row["floor_xor"]) + TARGET_META
        rows.append(row)
    print(format_table(rows, COLUMNS))
    print("bytes per transition; payload + slot state + tables = memory(); floors: zstd-3 "
          "of each distinct frame alone / XOR the previous frame of its episode.")  # fmt: skip
    if args.check:
        report_checks(check_targets(rows))
    return rows


if __name__ == "__main__":
    main()
