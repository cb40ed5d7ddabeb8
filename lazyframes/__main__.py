"""Command line: ``python -m lazyframes {demo,bench}`` (also installed as ``lazyframes``).

``--version`` prints the version and the core in use.

- ``demo``: real Atari (ALE Pong by default) through the frame stacker and the replay
  buffer, with a report of speed and memory against SB3's, a naive and a
  baselines-style buffer (see :mod:`lazyframes.demo`).
- ``bench``: the side-by-side benchmarks of ``bench/`` in the source checkout
  (``bench_core``, ``bench_wrappers``, ``bench_replay``, ``bench_sb3``,
  ``bench_compress``), each printing its table.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys
import time
import traceback
from pathlib import Path

BENCHES = ("core", "wrappers", "replay", "sb3", "compress")


def program_name() -> str:
    """How the user called us: ``lazyframes`` (console script) or ``python -m lazyframes``."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python -m lazyframes" if name in ("", "__main__.py", "-c") else name


def build_parser(prog: str = "python -m lazyframes") -> argparse.ArgumentParser:
    """The command-line parser with its ``demo`` and ``bench`` commands, named ``prog``."""
    from . import IMPLEMENTATION, __version__, demo

    p = argparse.ArgumentParser(
        prog=prog,
        description="lazyframes: frame stacking for deep RL that stores each frame once.",
        epilog=f"Run '{prog} COMMAND --help' for a command's options.",
    )
    p.add_argument(
        "--version",
        action="version",
        version=f"lazyframes {__version__} (core: {IMPLEMENTATION})",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    d = sub.add_parser(
        "demo",
        help="run real Atari through the stacker and the replay buffer, then report speed "
        "and memory",
        description=(
            "Steps an env (default ALE Pong, Gymnasium's AtariPreprocessing, stack 4) with a "
            "random policy as a DQN data loop does: each observation is materialised as the "
            "policy's float32 input, each transition is stored in lazyframes.ReplayBuffer, and "
            "every --train-freq steps a batch is sampled into float32 scaled by 1/255. Then it "
            "reports env steps/s, the share of time spent stacking, the replay memory held "
            "against SB3's memory-optimised buffer, a naive obs+next_obs buffer and a "
            "baselines-style list after sampling, and the sample latency; compressed (the "
            "default; --no-compress stores raw), the buffer's compressed memory beside the "
            "same frames uncompressed."
        ),
    )
    demo.add_arguments(d)
    b = sub.add_parser(
        "bench",
        help="run the benchmarks of bench/ (core, wrappers, replay, sb3, compress) and print "
        "their tables",
        description=(
            "Runs bench/bench_core.py, bench_wrappers.py, bench_replay.py, bench_sb3.py and "
            "bench_compress.py from the source checkout (the bench/ folder next to the "
            "lazyframes package), each printing one table with ratios against peers measured "
            "in the same run. bench_compress records real Atari frames first (cached in "
            "~/.cache/lazyframes). A peer package that is not installed (stable-baselines3, "
            "cpprb, sb3-extra-buffers: pip install -e '.[bench]') is reported in one line and "
            "its rows skipped."
        ),
    )
    b.add_argument(
        "--quick",
        action="store_true",
        help="a fast smoke run of every benchmark (small sizes, few repeats; noisy figures)",
    )
    b.add_argument(
        "--only",
        action="append",
        choices=BENCHES,
        metavar="NAME",
        help=f"run only this benchmark (one of {', '.join(BENCHES)}); repeatable",
    )
    return p


def bench_dir() -> Path:
    """The ``bench/`` folder of the source checkout (next to the package)."""
    return Path(__file__).resolve().parent.parent / "bench"


def run_benches(names, *, quick: bool, root=None) -> int:
    """Run the benchmark modules ``bench_<name>`` of ``root`` (default :func:`bench_dir`).

    Returns an exit status: 0 when every benchmark ran (a missing peer package only
    skips its rows), 1 when one failed or the folder is missing.
    """
    root = bench_dir() if root is None else Path(root)
    if not (root / "__init__.py").is_file():
        print(
            f"bench: no bench/ folder next to the lazyframes package ({root}); the benchmarks "
            f"live in the source checkout: git clone the project and run this from there"
        )
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
            mod = importlib.import_module(f"bench.{mod_name}")
            argv = ["--quick"] if quick and _accepts_quick(mod) else []
            mod.main(argv)
        except ModuleNotFoundError as e:
            # a peer package (stable-baselines3, cpprb, ...) is missing
            print(
                f"bench: {mod_name} needs the package {e.name!r}, which is not installed "
                f"(pip install -e '.[bench]'); its rows are skipped"
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
    """Entry point of ``python -m lazyframes`` and of the ``lazyframes`` console script."""
    parser = build_parser(program_name())
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "demo":
        from . import demo

        try:
            return demo.main(args)
        except ValueError as e:
            parser.exit(2, f"{parser.prog} demo: error: {e}\n")
    if args.command == "bench":
        return run_benches(args.only or BENCHES, quick=args.quick)
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover
    return 2


if __name__ == "__main__":
    sys.exit(main())
