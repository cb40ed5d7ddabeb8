"""``ReplayBuffer.add`` per transition, full and evicting: ours against 0.1, 0.2 and floors.

This checkout against lazyframes 0.1 and 0.2, the baselines restatement and a C floor,
all in one run, the revisions taking turns.

84x84 uint8 frames that change every step, k = 4, capacity 10,000 transitions (the
warm-up fills it and evicts half a buffer more, so every timed add evicts). Cases:

- **8 envs LazyBatch**: the observations of ``lazyframes.vector.FrameStackObservation``
  over a vector env returning a new ``(8, 84, 84)`` batch each step; int64 actions
  ``(8,)``, float32 rewards ``(8,)``, bool flags ``(8,)``;
- **1 env LazyFrames**: the observations of ``lazyframes.FrameStackObservation``; a
  Python int action, a float reward, bool flags;
- **1 env ndarray**, **8 envs ndarray**: new C-contiguous ``(4, 84, 84)`` /
  ``(8, 4, 84, 84)`` uint8 stacks each step, as SB3's ``VecFrameStack`` and ale-py give
  them (the buffer copies one new frame per stack in, de-duplicated);
- **sample(32)**: ``sample(32, out=)`` (uint8, the same ``out`` each call) of a full
  uncompressed buffer of those frames (8 envs through the vector stacker), per call;
- **prioritized**: ``PrioritizedReplayBuffer(alpha=0.6)``: ``sample(32, beta=0.4)`` then
  ``update_priorities`` of the batch, per cycle.

Each revision runs in a process of its own (``bench/_add_worker.py``, the revision's
source first on ``sys.path``): ``ours`` is this checkout (built in place), ``0.1`` and
``0.2`` are git revisions built once in ``~/.cache/lazyframes-bench/<sha>`` (a venv with
the system's packages; :mod:`bench._revisions`). The host's speed drifts by +-30% over
minutes, so the workers take turns: the parent tells one worker at a time to time one
block of a case (``--block`` transitions, or ``--block-calls`` calls), over a pipe,
rotating the order every round, so the blocks of all revisions interleave in time; a
figure is the median over ``--blocks`` blocks. Inside a block, the inputs of each chunk
of env steps are made first (the stacker's or the env's cost, untimed), then the add
calls over them are timed in one loop. The cyclic garbage collector runs before each
block and is paused during it (as ``timeit`` does; a block that leaves cyclic garbage is
noted in the table).

In ``ours``' worker, on the same inputs in the same chunks (their order alternating):

- **baselines**: OpenAI baselines' ``ReplayBuffer.add`` (``deepq/replay_buffer.py``,
  restated in bench/baselines.py: a tuple ``(obs_t, action, reward, obs_tp1,
  done)`` in a circular list), one call per transition, fed the same LazyFrames (for
  the 8-env case the LazyBatch is split per env, ``batch[i]``, before the timed loop):
  what storing references costs at least, once per transition;
- **C floor** (ndarray cases): ``lazyframes._core._ingest_floor`` on the same arrays:
  per transition, ``memcmp`` of the k-1 frames the new stack shares with the stored
  frames of the previous observation, ``memcpy`` of the new frame into a preallocated
  arena, GIL released, no Python per stack.

Targets (``--check``; bench/README.md): every add case no slower than 0.1; 8 envs
LazyBatch <= 1.0x the baselines restatement, 1 env LazyFrames <= 4x; an ndarray case
<= the lazy target of its env count + 2x its C floor; ``sample`` and the prioritized
cycle no slower than 0.2, within a noise tolerance of 5%.

Run: ``python -m bench.bench_add [--quick] [--check] [--revisions 0.1 0.2 ours]`` from the
source checkout, with the checkout built in place. Not part of ``python -m bench``
(its first run builds 0.1 and 0.2, a minute or two each).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import _revisions
from bench._util import format_table, header, report_checks, target

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "_add_worker.py"

#: the releases compared with this checkout by default: 0.1.0 and 0.2.0
REVISIONS = {"0.1": "0c2736b", "0.2": "6f27689"}
OURS = "ours"
CAPACITY = 10_000
TARGET_VS_01 = 1.0  # every add case: ours / 0.1
TARGET_VS_BASELINES = {8: 1.0, 1: 4.0}  # ours / the baselines restatement, by env count
FLOOR_FACTOR = 2.0  # ndarray: target = the lazy target of its env count + 2 x the C floor
TARGET_VS_02 = 1.0  # sample and prioritized: ours / 0.2 ...
TOLERANCE_VS_02 = 1.05  # ... which --check allows up to this, for the noise


@dataclass(frozen=True)
class Case:
    name: str  # the worker's name of the case
    label: str
    kind: str  # "lazy", "ndarray" or "sample"
    envs: int
    unit: str
    chunk: int  # transitions whose inputs are made before they are timed (sample: calls)


CASES = (
    Case("add_lazybatch_8", "add: 8 envs LazyBatch", "lazy", 8, "us/tr", 256),
    Case("add_lazyframes_1", "add: 1 env LazyFrames", "lazy", 1, "us/tr", 256),
    # ndarray chunks of ~0.9 MB of stacks, so they are in cache as an env's output is
    Case("add_ndarray_1", "add: 1 env ndarray (4, 84, 84)", "ndarray", 1, "us/tr", 32),
    Case("add_ndarray_8", "add: 8 envs ndarray (8, 4, 84, 84)", "ndarray", 8, "us/tr", 32),
    Case("sample_32", "sample(32, out=) uint8", "sample", 8, "us/call", 10),
    Case("prioritized_32", "prioritized sample(32) + update", "sample", 8, "us/call", 10),
)
BY_NAME = {c.name: c for c in CASES}
ANSWER_TIMEOUT = 900  # seconds a worker may take to set a case up or time a block


class WorkerError(RuntimeError):
    pass


class Worker:
    """One revision's process: requests and answers are JSON lines over its stdin/stdout."""

    def __init__(self, rev: _revisions.Revision, logdir: Path):
        self.label = rev.label
        self.err_path = logdir / f"worker-{rev.label}.stderr"
        self.err = open(self.err_path, "w+")  # noqa: SIM115 - closed by close()
        env = {k: v for k, v in os.environ.items() if k != "LAZYFRAMES_NO_EXTENSIONS"}
        env["PYTHONHASHSEED"] = "0"
        role = "ours" if rev.label == OURS else "peer"
        self.proc = subprocess.Popen(
            [rev.python, str(WORKER), str(rev.src), role],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            text=True,
            cwd=str(rev.src),
            env=env,
        )
        try:
            self.hello = self._answer()
        except WorkerError:
            self.close()
            raise

    def _answer(self) -> dict:
        # one answer per request, so nothing waits in the reader's buffer: select sees it
        ready, _, _ = select.select([self.proc.stdout], [], [], ANSWER_TIMEOUT)
        if not ready:
            self.proc.kill()
            raise WorkerError(f"no answer in {ANSWER_TIMEOUT} s: {self._tail()}")
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=30)
            raise WorkerError(f"exited with status {self.proc.returncode}: {self._tail()}")
        msg = json.loads(line)
        if not msg.get("ok"):
            raise WorkerError(msg.get("error", "failed"))
        return msg

    def _tail(self) -> str:
        self.err.flush()
        text = Path(self.err_path).read_text().strip().splitlines()
        return " | ".join(text[-5:]) or "(no output)"

    def ask(self, **request) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self):
        try:
            if self.proc.poll() is None:
                self.ask(op="quit")
            self.proc.wait(timeout=30)
        except (WorkerError, OSError, ValueError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        finally:
            for fh in (self.proc.stdin, self.proc.stdout, self.err):
                fh.close()


def _median(xs):
    return statistics.median(xs) if xs else None


def _spread(xs):
    """Half the interquartile range of the blocks over their median (the noise of a figure)."""
    if len(xs) < 4:
        return None
    q1, _, q3 = statistics.quantiles(xs, n=4)
    return (q3 - q1) / 2 / statistics.median(xs)


def resolve(specs: list[str]) -> list[tuple[str, str | None]]:
    """``["0.1", "ours", "x=abc123"]`` -> [(label, git revision or None for the checkout)]."""
    out = []
    for s in specs:
        label, _, rev = s.partition("=")
        if label == OURS and not rev:
            out.append((OURS, None))
        elif rev:
            out.append((label, rev))
        elif label in REVISIONS:
            out.append((label, REVISIONS[label]))
        else:
            raise ValueError(f"unknown revision {s!r}: one of {[*REVISIONS, OURS]} or LABEL=REV")
    if OURS not in [label for label, _ in out]:
        raise ValueError("--revisions must include 'ours' (every target is about this checkout)")
    return out


def measure(
    revisions, cases, params: dict, blocks: int, cache: Path, log=print
) -> tuple[dict, dict, dict]:
    """Build and start the workers, set the cases up, time ``blocks`` rounds of turns.

    Returns ``(times, notes, described)``: ``times[case][label][variant]`` the per-block
    figures; ``notes[case][label]`` why a revision has no figure for a case (and
    ``notes[None][label]`` why it has none at all); ``described[label]`` how each
    revision was made.
    """
    notes: dict = {None: {}}
    described: dict = {}
    revs = []
    for label, rev in revisions:
        try:
            if rev is None:
                revs.append(_revisions.checkout(ROOT, label))
            else:
                revs.append(_revisions.build(ROOT, label, rev, cache, log=log))
        except (_revisions.RevisionError, OSError, subprocess.CalledProcessError) as e:
            notes[None][label] = f"not built: {e}"
    times = {c.name: {} for c in cases}
    garbage = {c.name: {} for c in cases}
    with tempfile.TemporaryDirectory(prefix="bench_add-") as logdir:
        workers = {}
        try:
            for rev in revs:
                try:
                    w = Worker(rev, Path(logdir))
                except WorkerError as e:
                    notes[None][rev.label] = f"worker did not start: {e}"
                    continue
                workers[rev.label] = w
                where = "cached build" if rev.cached else "built now"
                if rev.sha:
                    described[rev.label] = (
                        f"{rev.describe}, lazyframes {w.hello['version']} ({where} in {rev.src})"
                    )
                else:
                    described[rev.label] = f"{rev.describe}, lazyframes {w.hello['version']}"
            for c in cases:
                notes[c.name] = {}
                for label, w in workers.items():
                    t0 = time.perf_counter()
                    try:
                        a = w.ask(op="setup", case=c.name, params={**params, **_chunks(c, params)})
                    except WorkerError as e:
                        notes[c.name][label] = f"setup failed: {str(e).splitlines()[0]}"
                        continue
                    if "unsupported" in a:
                        notes[c.name][label] = a["unsupported"]
                        continue
                    times[c.name][label] = {v: [] for v in a["variants"]}
                    log(f"  set up {c.name} for {label} ({time.perf_counter() - t0:.1f} s)")
            for r in range(blocks):
                for i, c in enumerate(cases):
                    live = list(times[c.name])
                    if not live:
                        continue
                    shift = (r + i) % len(live)
                    for label in live[shift:] + live[:shift]:  # the turns, rotated each round
                        if label in notes[c.name]:
                            continue  # failed earlier in this run
                        try:
                            a = workers[label].ask(op="block", case=c.name)
                        except WorkerError as e:
                            notes[c.name][label] = f"failed: {str(e).splitlines()[0]}"
                            continue
                        for v, us in a["us"].items():
                            times[c.name][label][v].append(us)
                        garbage[c.name][label] = garbage[c.name].get(label, 0) + a["garbage"]
        finally:
            for w in workers.values():
                w.close()
    for c in cases:
        for label, n in garbage[c.name].items():
            if n:  # the collector is paused while timing: this cost is not in the figures
                extra = f"left {n:,} objects of cyclic garbage (freed untimed)"
                old = notes[c.name].get(label)
                notes[c.name][label] = f"{old}; {extra}" if old else extra
    return times, notes, described


def _chunks(c: Case, params: dict) -> dict:
    """The chunk of case ``c``: ``--chunk`` for the add cases, else the case's own."""
    chunk = params.get("chunk_transitions") if c.kind != "sample" else None
    return {"chunk_transitions": chunk or c.chunk}


def rows_of(times: dict, notes: dict, labels: list[str], cases) -> list[dict]:
    """The table's rows: per case the medians of each revision and variant, and the ratios."""
    rows = []
    for c in cases:
        t = times.get(c.name, {})
        ours = t.get(OURS, {})
        row = {
            "case": c.label,
            "name": c.name,
            "kind": c.kind,
            "envs": c.envs,
            "unit": c.unit,
            "blocks": t,
        }
        for label in labels:
            row[f"{label}_us"] = _median(t.get(label, {}).get("lf", []))
        row["baselines_us"] = _median(ours.get("baselines", []))
        row["floor_us"] = _median(ours.get("floor", []))
        row["spread"] = _spread(ours.get("lf", []))
        why = {**notes.get(None, {}), **notes.get(c.name, {})}
        row["note"] = "; ".join(f"{label}: {w}" for label, w in why.items() if label in labels)
        rows.append(row)
    lazy_target = {}
    for row in rows:
        ours_us = row[f"{OURS}_us"]
        for label in labels:
            if label != OURS:
                ref = row[f"{label}_us"]
                row[f"ours_vs_{label}"] = ours_us / ref if ours_us and ref else None
        base = row["baselines_us"]
        row["ours_vs_baselines"] = ours_us / base if ours_us and base else None
        row["target_us"] = None
        if row["kind"] == "lazy" and base:
            row["target_us"] = TARGET_VS_BASELINES[row["envs"]] * base
            lazy_target[row["envs"]] = row["target_us"]
    for row in rows:
        lazy = lazy_target.get(row["envs"])
        if row["kind"] == "ndarray" and lazy is not None and row["floor_us"] is not None:
            row["target_us"] = lazy + FLOOR_FACTOR * row["floor_us"]
        ours_us = row[f"{OURS}_us"]
        row["ours_vs_target"] = ours_us / row["target_us"] if ours_us and row["target_us"] else None
        row["targets"] = _target_text(row)
    return rows


def _target_text(row) -> str:
    if row["kind"] == "sample":
        return f"<= {TARGET_VS_02:g}x 0.2 (check: {TOLERANCE_VS_02:g}x, noise)"
    vs = f"<= {TARGET_VS_01:g}x 0.1; "
    if row["kind"] == "lazy":
        return vs + f"<= {TARGET_VS_BASELINES[row['envs']]:g}x baselines"
    return vs + f"<= lazy {row['envs']}-env target + {FLOOR_FACTOR:g}x floor"


def columns(labels: list[str]) -> list:
    cols = [("case", "case", "{}"), ("unit", "unit", "{}")]
    cols += [(f"{label}_us", label, "{:,.2f}") for label in labels]
    cols += [
        ("baselines_us", "baselines", "{:.2f}"),
        ("floor_us", "C floor", "{:.2f}"),
        ("target_us", "target", "{:.2f}"),
    ]
    cols += [(f"ours_vs_{label}", f"ours/{label}", "{:.2f}x") for label in labels if label != OURS]
    cols += [
        ("ours_vs_baselines", "ours/baselines", "{:.2f}x"),
        ("ours_vs_target", "ours/target", "{:.2f}x"),
        ("spread", "ours +-", "{:.0%}"),
        ("targets", "targets", "{}"),
        ("note", "note", "{}"),
    ]
    return cols


def check_targets(rows: list[dict], labels: list[str]) -> list[tuple[str, bool]]:
    """The targets that ``--check`` tests (bench/README.md), for the revisions measured."""
    out = []
    for r in rows:
        if r["kind"] == "sample":
            if "0.2" in labels:
                what = f"{r['case']}: ours / 0.2 (target {TARGET_VS_02:g}x, noise allowed)"
                out.append(target(what, r["ours_vs_0.2"], "<=", TOLERANCE_VS_02))
            continue
        if "0.1" in labels:
            out.append(target(f"{r['case']}: ours / 0.1", r["ours_vs_0.1"], "<=", TARGET_VS_01))
        if r["kind"] == "lazy":
            what = f"{r['case']}: ours / the baselines restatement"
            bound = TARGET_VS_BASELINES[r["envs"]]
            out.append(target(what, r["ours_vs_baselines"], "<=", bound))
        else:
            tgt = r["target_us"]
            shown = "-" if tgt is None else f"{tgt:.2f} us"
            what = (
                f"{r['case']}: ours / (lazy {r['envs']}-env target + {FLOOR_FACTOR:g}x C floor "
                f"= {shown})"
            )
            out.append(target(what, r["ours_vs_target"], "<=", 1.0))
    return out


LEGEND = (
    "us per transition (add) or per call, medians of the blocks; ours/X: ours' figure over "
    "X's. baselines: baselines' ReplayBuffer.add restated (a tuple in a circular list), one "
    "call per transition, on the same LazyFrames; C floor: memcmp of the k-1 shared frames "
    "+ memcpy of the new one, on the same arrays; target: the baselines figure x 1 (8 envs) "
    "or x 4 (1 env), for ndarray that of the lazy case with as many envs + 2 x the C "
    "floor; ours +-: half the interquartile range of ours' blocks over their median."
)


def main(argv=None) -> list[dict]:
    """Run the add benchmark and print one table; return the rows.

    With ``--check`` it also prints the targets and exits with status 1 if one is missed.
    """
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_add",
        description="ReplayBuffer.add per transition (full, evicting) of this checkout "
        "against lazyframes 0.1 and 0.2, the baselines restatement and a C floor; "
        "sample(32) and prioritized sample + update against 0.2. Each revision in its own "
        "process, the processes timing one block at a time, in turns.",
    )
    p.add_argument("--quick", action="store_true", help="a smoke run: few, short blocks")
    p.add_argument(
        "--revisions",
        nargs="+",
        default=[*REVISIONS, OURS],
        metavar="REV",
        help="the revisions to compare: 0.1, 0.2 (the releases), ours (this checkout, "
        "built in place; required) or LABEL=GITREV (default: 0.1 0.2 ours)",
    )
    p.add_argument(
        "--cases",
        nargs="+",
        choices=list(BY_NAME),
        default=list(BY_NAME),
        metavar="CASE",
        help=f"the cases to run (default all: {' '.join(BY_NAME)})",
    )
    p.add_argument(
        "--capacity", type=int, default=CAPACITY, help=f"transitions (default {CAPACITY:,})"
    )
    p.add_argument(
        "--blocks",
        type=int,
        default=None,
        help="blocks per case and revision, in turns; the median is reported (default 30; "
        "3 with --quick)",
    )
    p.add_argument(
        "--block",
        type=int,
        default=None,
        help="transitions per add block (default 4000; 400 with --quick)",
    )
    p.add_argument(
        "--block-calls",
        type=int,
        default=None,
        help="calls per sample block (default 200; 20 with --quick)",
    )
    p.add_argument(
        "--chunk",
        type=int,
        default=None,
        help="transitions whose inputs are made before they are timed (default 256 for "
        "LazyBatch/LazyFrames, 32 for ndarray stacks: ~0.9 MB, in cache as an env's output)",
    )
    p.add_argument(
        "--cache",
        type=Path,
        default=_revisions.DEFAULT_CACHE,
        help=f"where the revisions are built, once (default {_revisions.DEFAULT_CACHE})",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--check",
        action="store_true",
        help="developer check: print the targets (bench/README.md) and exit with status 1 "
        "if one is missed",
    )
    args = p.parse_args(argv)
    try:
        revisions = resolve(args.revisions)
    except ValueError as e:
        p.error(str(e))
    labels = [label for label, _ in revisions]
    if args.capacity < 64:
        p.error("--capacity must be at least 64")
    blocks = args.blocks or (3 if args.quick else 30)
    block = args.block or (400 if args.quick else 4000)
    block_calls = args.block_calls or (20 if args.quick else 200)
    cases = [c for c in CASES if c.name in args.cases]
    params = {
        "capacity": args.capacity,
        "seed": args.seed,
        "block_transitions": block,
        "block_calls": block_calls,
        "chunk_transitions": args.chunk,
    }
    print(
        header(
            "bench_add",
            f"84x84 uint8 frames changing every step, k=4, capacity {args.capacity:,} "
            f"(full and evicting)",
        ),
        flush=True,
    )
    t0 = time.perf_counter()
    times, notes, described = measure(
        revisions, cases, params, blocks, args.cache, log=lambda m: print(m, flush=True)
    )
    for label in labels:
        print(f"  {label}: {described.get(label) or notes[None].get(label, '-')}")
    print(
        f"{blocks} blocks per case and revision, in turns (one process at a time, the order "
        f"rotating each round): {block:,} transitions per add block, {block_calls} calls per "
        f"sample block; {time.perf_counter() - t0:.0f} s"
    )
    rows = rows_of(times, notes, labels, cases)
    print(format_table(rows, columns(labels)))
    print(LEGEND)
    if args.check:
        report_checks(check_targets(rows, labels))
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
