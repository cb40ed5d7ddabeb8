"""``python -m bench``: run the side-by-side benchmarks of this folder, each printing its table.

From the root of a clone (``bench`` is the source checkout's folder, not part of the
installed package): ``bench_core``, ``bench_wrappers``, ``bench_replay``, ``bench_sb3`` and
``bench_compress`` in turn, or those named with ``--only``; ``--quick`` for a smoke run.
A peer package that is not installed only skips its benchmark's rows; a benchmark that
fails is reported in one line, the others still run, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
import time
import traceback
from pathlib import Path

BENCHES = ("core", "wrappers", "replay", "sb3", "compress")


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m bench``."""
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description=(
            "Runs bench/bench_core.py, bench_wrappers.py, bench_replay.py, bench_sb3.py and "
            "bench_compress.py of this source checkout, each printing one table with ratios "
            "against peers measured in the same run. bench_compress records real Atari frames "
            "first (cached in ~/.cache/lazyframes). A peer package that is not installed "
            "(stable-baselines3, cpprb, sb3-extra-buffers: python -m pip install -e '.[bench]') "
            "is reported in one line and its rows skipped. Run from the root of the clone."
        ),
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a fast smoke run of every benchmark (small sizes, few repeats; noisy figures)",
    )
    p.add_argument(
        "--only",
        action="append",
        choices=BENCHES,
        metavar="NAME",
        help=f"run only this benchmark (one of {', '.join(BENCHES)}); repeatable",
    )
    return p


def run_benches(names, *, quick: bool, root=None) -> int:
    """Run the benchmark modules ``bench_<name>`` of the package folder ``root``.

    ``root`` defaults to this folder; another one (a test's) is imported as the package
    of its own name, from its parent folder. Returns an exit status: 0 when every
    benchmark ran (a missing peer package only skips its rows), 1 when one failed or
    ``root`` is not a package folder.
    """
    root = Path(__file__).resolve().parent if root is None else Path(root).resolve()
    if not (root / "__init__.py").is_file():
        print(f"bench: {root} is not a benchmark folder (no __init__.py); nothing ran")
        return 1
    if str(root.parent) not in sys.path:
        sys.path.insert(0, str(root.parent))
    status = 0
    for name in names:
        mod_name = f"bench_{name}"
        if not (root / f"{mod_name}.py").is_file():
            print(f"bench: {mod_name}.py is not in {root}; skipped")
            continue
        print(f"\n=== bench/{mod_name}.py{' --quick' if quick else ''} ===", flush=True)
        t0 = time.perf_counter()
        try:
            mod = importlib.import_module(f"{root.name}.{mod_name}")
            argv = ["--quick"] if quick and _accepts_quick(mod) else []
            mod.main(argv)
        except ModuleNotFoundError as e:
            # a peer package (stable-baselines3, cpprb, ...) is missing
            print(
                f"bench: {mod_name} needs the package {e.name!r}, which is not installed "
                f"(python -m pip install -e '.[bench]'); its rows are skipped"
            )
        except SystemExit as e:  # argparse inside a benchmark
            if e.code not in (0, None):
                print(f"bench: {mod_name} exited with status {e.code}")
                status = 1
        except Exception as e:  # report and go on with the next benchmark
            last = traceback.extract_tb(e.__traceback__)[-1]
            print(
                f"bench: {mod_name} failed: {type(e).__name__}: {e} "
                f"({Path(last.filename).name}:{last.lineno})"
            )
            status = 1
        print(f"({mod_name}: {time.perf_counter() - t0:.1f} s)", flush=True)
    return status


def _accepts_quick(mod) -> bool:
    """Whether a benchmark's ``main`` understands ``--quick`` (its argparse source says so)."""
    try:
        return "--quick" in inspect.getsource(mod)
    except (OSError, TypeError):
        return False


def main(argv=None) -> int:
    """Entry point of ``python -m bench``."""
    args = build_parser().parse_args(argv)
    return run_benches(args.only or BENCHES, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
