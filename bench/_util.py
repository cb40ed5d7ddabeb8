"""Helpers the benchmarks share: the header line, tables, round-robin timing, ``--check``.

- :func:`header`: the first line of every table, naming the versions, the core in use,
  the machine (``lazyframes._machine.stamp()``: CPU model, logical CPUs, last-level
  cache) and the date;
- :func:`format_table`: a plain aligned table of row dicts;
- :func:`round_robin_us`: medians of functions timed in turns, so that functions
  compared with one another are timed in the same moments on a host whose speed drifts;
- :func:`target` and :func:`report_checks`: the developer targets of ``--check``, one
  ``met`` / ``MISSED`` line each, exit status 1 if one is missed (bench/README.md);
- :func:`atari_env`: one ALE env as the DQN recipe makes it, for the benches that record
  real frames (``bench_compress``, ``bench_distributed``).
"""

from __future__ import annotations

import math
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence

#: a column of :func:`format_table`: (row key, header, format string or callable)
Column = tuple[str, str, "str | Callable[[object], str]"]


def header(name: str, *details: str) -> str:
    """``"<name>: lazyframes V, core: C, numpy V, Python V; <details>; measured on ..."``."""
    import numpy as np

    import lazyframes
    from lazyframes import _machine

    versions = (
        f"lazyframes {lazyframes.__version__}, "
        f"numpy {np.__version__}, Python {platform.python_version()}"
    )
    parts = [
        versions,
        *details,
        _machine.stamp(),
    ]
    return f"{name}: " + "; ".join(p for p in parts if p)


def _cell(value, fmt) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isnan(value):
        return "-"
    return fmt(value) if callable(fmt) else fmt.format(value)


def format_table(rows: Sequence[dict], columns: Sequence[Column]) -> str:
    """A plain aligned table of ``rows``; ``columns`` is a list of (key, header, format).

    The format is a ``str.format`` string (``"{:.2f}"``) or a callable returning the
    cell's text; a missing key, None or NaN is shown as ``-``. Text columns (the first
    one, and any whose values are all strings) are left-aligned, the others right-aligned.
    """
    cells = [[h for _, h, _ in columns]]
    for r in rows:
        cells.append([_cell(r.get(k), fmt) for k, _, fmt in columns])
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]

    def is_text(key):
        values = [r[key] for r in rows if r.get(key) is not None]
        return bool(values) and all(isinstance(v, str) for v in values)

    left = [i == 0 or is_text(k) for i, (k, _, _) in enumerate(columns)]

    def line(row):
        return "  ".join(
            c.ljust(w) if lj else c.rjust(w) for c, w, lj in zip(row, widths, left, strict=True)
        ).rstrip()

    lines = [line(cells[0]), "  ".join("-" * w for w in widths)]
    lines += [line(row) for row in cells[1:]]
    return "\n".join(lines)


def round_robin_us(fns: dict, repeats: int, warmup: int, block: int = 1) -> dict:
    """Median microseconds of each function, timed round-robin, ``block`` calls at a time.

    On a shared host whose speed drifts, functions compared with one another are then
    timed in the same moments; blocks of calls keep each function's steady state (its
    allocations reused, its working set in cache) as a loop calling it would. The order
    is shuffled each round (seeded): a function timed right after another inherits its
    cache state, which would favour whichever always came second.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict = {k: [] for k in fns}
    order, shuffle = list(fns.items()), random.Random(0).shuffle
    for _ in range(max(1, repeats // block)):
        shuffle(order)
        for k, fn in order:
            for _ in range(block):
                t0 = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e6 for k, v in times.items()}


_OPS = {"<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b}


def target(
    what: str, value: float | None, op: str, bound: float, fmt: str = "{:.2f}x"
) -> tuple[str, bool]:
    """One ``--check`` target: ``("<what>: <value> (target <op> <bound>)", met)``.

    ``op`` is ``"<="`` or ``">="``; ``fmt`` formats the value and the bound alike. A
    value that was not measured (None or NaN) misses the target.
    """
    measured = value is not None and not (isinstance(value, float) and math.isnan(value))
    shown = fmt.format(value) if measured else "not measured"
    met = bool(measured and _OPS[op](value, bound))
    return f"{what}: {shown} (target {op} {fmt.format(bound)})", met


def report_checks(results: Iterable[tuple[str, bool]]) -> bool:
    """Print ``check <text>: met`` / ``MISSED`` per target; exit with status 1 if one is missed.

    Returns True when every target is met (so a caller can go on to return its rows).
    """
    results = list(results)
    for text, met in results:
        print(f"check {text}: {'met' if met else 'MISSED'}")
    if not all(met for _, met in results):
        sys.exit(1)
    return True


def atari_env(env_id: str):
    """One ALE env as the DQN recipe makes it: frameskip 1 under Gymnasium's AtariPreprocessing.

    Frame skip 4, 84x84 grayscale, as ``examples/demo.py`` makes its env (the benches do
    not import the examples: they are scripts, not modules).
    """
    import ale_py
    import gymnasium as gym
    from gymnasium.wrappers import AtariPreprocessing

    gym.register_envs(ale_py)
    env = gym.make(env_id, frameskip=1)
    return AtariPreprocessing(env, frame_skip=4, screen_size=84, grayscale_obs=True)
