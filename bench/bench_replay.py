"""Replay buffer benchmark: memory per transition, add and sample costs, against peers in one run.

84x84 uint8 frames that change every step, stack k = 4. Buffers:

- **lazyframes LazyBatch**: ``lazyframes.ReplayBuffer`` fed the observations of a
  vector frame stacker (``lazyframes.vector.LazyBatch``, ``--num-envs`` envs): frame
  references only, the frames live once in the stacker's pool;
- **lazyframes LazyFrames**: the same, one env, one ``LazyFrames`` per add;
- **lazyframes ndarray**: the same, one env fed stacked ndarrays ``(4, 84, 84)`` (as
  EnvPool or ale-py give): one new frame copied in per step, de-duplicated;
- **SB3**: ``stable_baselines3`` ``ReplayBuffer(optimize_memory_usage=True,
  handle_timeout_termination=False)``, ``--num-envs`` envs (its ``sample`` includes its
  conversion to torch tensors, which users pay);
- **cpprb**: ``cpprb.ReplayBuffer(..., next_of="obs", stack_compress="obs")``, one env
  (its frame sharing needs consecutive transitions of one stream), obs ``(84, 84, 4)``;
- **naive numpy**: two preallocated arrays of stacked obs and next obs, fancy-indexed;
- **gather floor**: one ``pool.gather`` of the same bytes (obs + next obs, ``2 B``
  stacks of random slots) into a preallocated array: our copy kernel's floor;
- **np.take floor**: ``np.take`` of the same ``2 B k`` frames from one contiguous
  array of frames into a preallocated array.

Memory is the growth of the process's resident set (``/proc/self/statm``) while the
buffer is built and filled to capacity, divided by the transitions held, and
extrapolated to 1M transitions; for lazyframes also ``memory()``'s own figure. Peers
whose storage grows with the capacity by whole observations (SB3, naive) hold the
same transitions as ours unless ``--peer-capacity`` is smaller (their per-transition
memory holds at any capacity). ``add`` is timed around the add calls only (making
frames and stacks is the env's cost). ``sample`` figures are medians from one more
process holding every buffer, filled with the same frames, whose calls (and the
floors') are timed round-robin after the same untimed warm-up: outputs are preallocated
once and reused where the API allows (``out=`` for ours, ``np.take(out=)`` for naive);
SB3's and cpprb's ``sample`` have no output argument and return new arrays each call,
as the row's note says. The row's own process's figure (``alone``) stands beside it.
Missing peer packages: one line, rows skipped.
Run: ``python -m bench.bench_replay [--capacity N] [--quick] [--check]``.
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import statistics
import sys
import time

import numpy as np

import lazyframes
from bench._add_worker import FrameSource
from bench._util import format_table, header, report_checks, round_robin_us, target
from lazyframes.replay import ReplayBuffer

H = W = 84
K = 4
FB = H * W
TARGET_BPT = 7150
TARGET_FLOOR = 1.2
TARGET_PEER = 1.5
TARGET_ADD_US = 1.0


def rss() -> int:
    """Resident set size of this process in bytes."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Stacker:
    """A vector frame stacker's state: the rings of k frames of all envs, one LazyBatch."""

    def __init__(self, num_envs, src):
        self.E, self.src = num_envs, src
        self.pool = lazyframes.FramePool((H, W), np.uint8)
        self.rings = self.pool.push_batch(src.next(num_envs), k=K)

    def step(self):
        self.rings = self.rings.shift(self.src.next(self.E))

    def batch(self):
        return self.rings


def _in_child(fn, *args):
    """Run ``fn(*args)`` in a fresh (spawned) process: its RSS growth is its own.

    A forked child would inherit the parent's freed heap and reuse it without growing
    its RSS, under-counting the buffer's memory.
    """
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx, initializer=_die_with_parent) as ex:
        return ex.submit(fn, *args).result()


def _die_with_parent() -> None:
    """A child's initializer: it gets SIGTERM when the bench that made it ends (Linux)."""
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _steady(fill):
    """Steps after the fill: ``add`` is timed only once the buffer is full and evicting."""
    return max(200, fill // 10)


def _median_us(fn, repeats, warmup):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def _row(name, capacity, held_rss, n, add_s, n_add, s32, s256, note="", bpt_own=None):
    bpt = held_rss / n
    return {
        "buffer": name,
        "capacity": capacity,
        "bytes_per_transition": bpt,
        "memory_bpt": bpt_own,
        "gb_at_1M": bpt * 1e6 / 1e9,
        "add_us": None if add_s is None else add_s / n_add * 1e6,
        "sample32_us": s32,
        "sample256_us": s256,
        "note": note,
    }


def _outs(B):
    """Preallocated ``(obs, next_obs)`` outputs of a batch of ``B``, reused by every call."""
    return np.empty((B, K, H, W), np.uint8), np.empty((B, K, H, W), np.uint8)


def _timed(name, calls, keep, repeats, warmup):
    """``(sample(32) us, sample(256) us)`` of ``calls`` (B -> a call), or, with ``keep``, None.

    With ``keep`` (a dict), the calls are stored under ``name`` for :func:`bench_same_run`
    to time with the others, and nothing is timed here.
    """
    if keep is not None:
        keep[name] = calls
        return None, None
    s32 = _median_us(calls[32], repeats, warmup)
    return s32, _median_us(calls[256], max(10, repeats // 4), warmup)


def bench_lazyframes(mode, capacity, num_envs, repeats, warmup, seed, keep=None):
    src = FrameSource(seed)
    gc.collect()
    r0 = rss()
    E = num_envs if mode == "LazyBatch" else 1
    st = Stacker(E, src)
    rb = ReplayBuffer(capacity, num_envs=E, seed=seed)
    acts, rews, f = np.zeros(E, np.int64), np.ones(E, np.float32), np.zeros(E, bool)
    add_s, fill = 0.0, capacity // E
    steps = fill + _steady(fill)
    stored = collections.deque(maxlen=fill)  # the slots of the stored observations
    for t in range(steps):
        if mode == "LazyBatch":
            obs = st.batch()
            st.step()
            nxt = st.batch()
            stored.append(obs.slots)
            t0 = time.perf_counter()
            rb.add(obs, acts, rews, nxt, f, f)
        elif mode == "LazyFrames":
            obs = st.batch()[0]
            st.step()
            nxt = st.batch()[0]
            t0 = time.perf_counter()
            rb.add(obs, 0, 1.0, nxt, False, False)
        else:  # ndarray
            obs = st.batch().numpy()[0]
            st.step()
            nxt = st.batch().numpy()[0]
            t0 = time.perf_counter()
            rb.add(obs, 0, 1.0, nxt, False, False)
        if t >= fill:
            add_s += time.perf_counter() - t0
    del obs, nxt
    gc.collect()
    held = rss() - r0
    mem = rb.memory()
    name = f"lazyframes {mode}" + (f" x{E}" if E > 1 else "")
    outs = {B: _outs(B) for B in (32, 256)}
    calls = {B: (lambda B=B: rb.sample(B, out=outs[B])) for B in (32, 256)}
    s32, s256 = _timed(name, calls, keep, repeats, warmup)
    row = _row(
        name,
        capacity,
        held,
        len(rb),
        add_s,
        (steps - fill) * E,
        s32,
        s256,
        bpt_own=mem["bytes_per_transition"],
        note="out= reused",
    )
    if mode == "LazyBatch":
        return [row] + bench_floors(rb, np.concatenate(stored), repeats, warmup, seed, keep)
    return [row]


def bench_floors(rb, stored, repeats, warmup, seed, keep=None):
    """The gather floor (same bytes via pool.gather) and np.take of frames.

    ``stored``: the slot ids of the stored observations.
    """
    rng = np.random.default_rng(seed)
    pool = rb.pool
    n = len(rb)
    live = np.unique(stored)  # the frames of stored observations
    rows = []
    for name in ("gather floor", "np.take floor"):
        calls = {}
        for B in (32, 256):
            if name == "gather floor":
                out = np.empty((2 * B, K, H, W), np.uint8)
                slots = [live[rng.integers(0, live.size, (2 * B, K))] for _ in range(16)]
                it = iter(range(10**9))

                def fn(out=out, slots=slots, it=it):
                    pool.gather(slots[next(it) % 16], out=out, layout="stack")
            else:
                frames = np.empty((min(n, 20000), H, W), np.uint8)  # contiguous frames
                frames[:] = np.random.default_rng(1).integers(0, 256, (1, H, W), dtype=np.uint8)
                out = np.empty((2 * B * K, H, W), np.uint8)
                idxs = [rng.integers(0, len(frames), 2 * B * K) for _ in range(16)]
                it = iter(range(10**9))

                def fn(out=out, frames=frames, idxs=idxs, it=it):
                    np.take(frames, idxs[next(it) % 16], axis=0, out=out)

            calls[B] = fn
        s32, s256 = _timed(name, calls, keep, repeats, warmup)
        rows.append(
            {
                "buffer": name,
                "capacity": None,
                "bytes_per_transition": None,
                "memory_bpt": None,
                "gb_at_1M": None,
                "add_us": None,
                "sample32_us": s32,
                "sample256_us": s256,
                "note": "copy only, out= reused",
            }
        )
    return rows


def bench_sb3(capacity, num_envs, repeats, warmup, seed, keep=None):
    try:
        import gymnasium as gym
        from stable_baselines3.common.buffers import ReplayBuffer as SB3Buffer
    except ImportError as e:
        print(f"stable-baselines3 not available ({e}): SB3 rows skipped")
        return None
    src = FrameSource(seed)
    gc.collect()
    r0 = rss()
    E = num_envs
    rb = SB3Buffer(
        capacity,
        gym.spaces.Box(0, 255, (K, H, W), np.uint8),
        gym.spaces.Discrete(6),
        device="cpu",
        n_envs=E,
        optimize_memory_usage=True,
        handle_timeout_termination=False,
    )
    rings = np.repeat(src.next(E)[:, None], K, axis=1)
    acts, rews, f = np.zeros((E, 1), np.int64), np.ones(E, np.float32), np.zeros(E, np.float32)
    infos = [{} for _ in range(E)]
    add_s, fill = 0.0, capacity // E
    steps = fill + _steady(fill)
    for t in range(steps):
        obs = rings
        rings = np.concatenate([rings[:, 1:], src.next(E)[:, None]], axis=1)
        t0 = time.perf_counter()
        rb.add(obs, rings, acts, rews, f, infos)
        if t >= fill:
            add_s += time.perf_counter() - t0
    gc.collect()
    held = rss() - r0
    import torch

    torch.set_num_threads(1)
    rb.seed = None
    np.random.seed(seed)  # noqa: NPY002 - SB3's sampling draws from the legacy global RNG
    name = f"SB3 optimize_memory x{E}"
    s32, s256 = _timed(
        name, {B: (lambda B=B: rb.sample(B)) for B in (32, 256)}, keep, repeats, warmup
    )
    n = rb.buffer_size * rb.n_envs
    return _row(
        name,
        capacity,
        held,
        n,
        add_s,
        (steps - fill) * E,
        s32,
        s256,
        note="no out= in its API: new torch tensors each call (conversion included)",
    )


def bench_cpprb(capacity, repeats, warmup, seed, keep=None):
    try:
        import cpprb
    except ImportError as e:
        print(f"cpprb not available ({e}): cpprb rows skipped")
        return None
    src = FrameSource(seed)
    gc.collect()
    r0 = rss()
    rb = cpprb.ReplayBuffer(
        capacity,
        env_dict={
            "obs": {"shape": (H, W, K), "dtype": np.uint8},
            "act": {"dtype": np.int64},
            "rew": {},
            "done": {},
        },
        next_of="obs",
        stack_compress="obs",
    )
    ring = np.repeat(src.next(1)[0][..., None], K, axis=-1)
    add_s, fill = 0.0, capacity
    steps = fill + _steady(fill)
    for t in range(steps):
        obs = ring
        ring = np.concatenate([ring[..., 1:], src.next(1)[0][..., None]], axis=-1)
        t0 = time.perf_counter()
        rb.add(obs=obs, act=0, rew=1.0, next_obs=ring, done=0.0)
        if t >= fill:
            add_s += time.perf_counter() - t0
    gc.collect()
    held = rss() - r0
    name = "cpprb stack_compress"
    s32, s256 = _timed(
        name, {B: (lambda B=B: rb.sample(B)) for B in (32, 256)}, keep, repeats, warmup
    )
    note = "no out= in its API: new arrays each call"
    return _row(name, capacity, held, rb.get_stored_size(), add_s, steps - fill, s32, s256, note)


def bench_naive(capacity, num_envs, repeats, warmup, seed, keep=None):
    src = FrameSource(seed)
    gc.collect()
    r0 = rss()
    obs_a = np.zeros((capacity, K, H, W), np.uint8)
    next_a = np.zeros((capacity, K, H, W), np.uint8)
    E = num_envs
    rings = np.repeat(src.next(E)[:, None], K, axis=1)
    pos, full, add_s, fill = 0, False, 0.0, capacity // E
    steps = fill + _steady(fill)
    for t in range(steps):
        obs = rings
        rings = np.concatenate([rings[:, 1:], src.next(E)[:, None]], axis=1)
        t0 = time.perf_counter()
        obs_a[pos : pos + E] = obs
        next_a[pos : pos + E] = rings
        pos += E
        if pos + E > capacity:
            pos, full = 0, True
        if t >= fill:
            add_s += time.perf_counter() - t0
    held = rss() - r0
    rng = np.random.default_rng(seed)
    n = capacity if full else pos

    outs = {B: _outs(B) for B in (32, 256)}

    def sample(B):
        idx = rng.integers(0, n, B)
        o, no = outs[B]
        return np.take(obs_a, idx, axis=0, out=o), np.take(next_a, idx, axis=0, out=no)

    name = f"naive numpy x{E}"
    s32, s256 = _timed(name, {B: (lambda B=B: sample(B)) for B in (32, 256)}, keep, repeats, warmup)
    note = "np.take, out= reused"
    return _row(name, capacity, held, n, add_s, (steps - fill) * E, s32, s256, note)


def bench_same_run(capacity, peer_capacity, num_envs, repeats, warmup, seed):
    """``{row name: (sample(32) us, sample(256) us)}`` of every buffer, timed in one process.

    Each buffer is built and filled as in its own row (same frames, same transitions),
    then all the ``sample`` calls (and the floors) are timed round-robin in blocks of
    calls (10 at B = 32, 5 at 256: a loop's steady state), after the same warm-up, so
    that a drift of the host's speed hits them alike.
    """
    calls: dict = {}
    for mode, e in (("LazyBatch", num_envs), ("LazyFrames", 1), ("ndarray", 1)):
        bench_lazyframes(mode, capacity, e, repeats, warmup, seed, keep=calls)
    bench_sb3(peer_capacity, num_envs, repeats, warmup, seed, keep=calls)
    bench_cpprb(capacity, repeats, warmup, seed, keep=calls)
    bench_naive(peer_capacity, num_envs, repeats, warmup, seed, keep=calls)
    t32 = round_robin_us({k: c[32] for k, c in calls.items()}, repeats, warmup, block=10)
    n256 = max(10, repeats // 4)
    t256 = round_robin_us({k: c[256] for k, c in calls.items()}, n256, warmup, block=5)
    return {k: (t32[k], t256[k]) for k in calls}


COLUMNS = [
    ("buffer", "buffer", "{}"),
    ("capacity", "capacity", "{:,}"),
    ("bytes_per_transition", "B/transition (RSS)", "{:,.0f}"),
    ("memory_bpt", "B/tr (memory())", "{:,.0f}"),
    ("gb_at_1M", "GB at 1M", "{:.2f}"),
    ("add_us", "steady add us/tr", "{:.2f}"),
    ("sample32_us", "sample(32) us", "{:,.1f}"),
    ("sample256_us", "sample(256) us", "{:,.1f}"),
    ("alone32_us", "alone s(32) us", "{:,.1f}"),
    ("vs_floor", "s32/floor", "{:.2f}x"),
    ("note", "note", "{}"),
]


def check_targets(rows: list[dict], num_envs: int) -> list[tuple[str, bool]]:
    """The targets that ``--check`` tests (bench/README.md): (description, met) pairs."""
    main_row = next(r for r in rows if r["buffer"].startswith("lazyframes"))
    peers = [
        r for r in rows if not r["buffer"].startswith("lazyframes") and r["add_us"] is not None
    ]
    what = f"bytes/transition by memory() ({main_row['bytes_per_transition']:,.0f} by RSS)"
    results = [
        target(what, main_row["memory_bpt"], "<=", TARGET_BPT, "{:,.0f}"),
        target("sample(32) / the gather floor", main_row["vs_floor"], "<=", TARGET_FLOOR),
    ]
    if peers:
        best = min(peers, key=lambda r: r["sample32_us"])
        sp = best["sample32_us"] / main_row["sample32_us"]
        what = f"sample(32) of the fastest peer ({best['buffer']}) / ours"
        results.append(target(what, sp, ">=", TARGET_PEER))
    what = f"steady add (buffer full), {num_envs} envs per call, us per transition"
    results.append(target(what, main_row["add_us"], "<=", TARGET_ADD_US, "{:.2f}"))
    return results


def main(argv=None) -> list[dict]:
    """Run the replay benchmark and print one table; return the rows.

    With ``--check`` it also prints the targets and exits with status 1 if one is missed.
    """
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_replay",
        description="Replay buffers of 84x84 uint8 frames, k=4: memory per transition, add "
        "and sample costs; lazyframes against SB3, cpprb, a naive buffer and "
        "the copy floors.",
    )
    p.add_argument(
        "--capacity",
        type=int,
        default=None,
        help="transitions of the lazyframes and cpprb buffers (default 100000; 5000 with --quick)",
    )
    p.add_argument(
        "--peer-capacity",
        type=int,
        default=None,
        help="capacity of SB3 and the naive buffer, which hold whole observations "
        "(default: capacity, the same transitions as ours; 28 KB and 56 KB a transition)",
    )
    p.add_argument("--num-envs", type=int, default=8, help="envs of the vector rows (default 8)")
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed sample calls (default 300; 30 with --quick)",
    )
    p.add_argument("--quick", action="store_true", help="a small, fast smoke run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--check",
        action="store_true",
        help="developer check: print the performance targets (bench/README.md) and "
        "exit with status 1 if one is missed",
    )
    args = p.parse_args(argv)
    cap = args.capacity or (5000 if args.quick else 100_000)
    peer_cap = args.peer_capacity or cap
    repeats = args.repeats or (30 if args.quick else 300)
    warmup = 3 if args.quick else 20
    E = args.num_envs
    print(header("bench_replay"))
    print(
        f"{H}x{W} uint8 frames changing every step, k={K}; capacity {cap:,} (SB3/naive: "
        f"{peer_cap:,}); sample = median of {repeats} calls, after {warmup} untimed ones"
    )
    rows = []
    for mode, e in (("LazyBatch", E), ("LazyFrames", 1), ("ndarray", 1)):
        rows += _in_child(bench_lazyframes, mode, cap, e, repeats, warmup, args.seed)
    for fn, a in ((bench_sb3, (peer_cap, E)), (bench_cpprb, (cap,)), (bench_naive, (peer_cap, E))):
        r = _in_child(fn, *a, repeats, warmup, args.seed)
        if r is not None:
            rows.append(r)
    same = _in_child(bench_same_run, cap, peer_cap, E, repeats, warmup, args.seed)
    for r in rows:  # the figures of one run; each row's own process's beside them
        r["alone32_us"] = r["sample32_us"]
        r["sample32_us"], r["sample256_us"] = same.get(r["buffer"], (None, None))
    floor = {r["buffer"]: r for r in rows}["gather floor"]
    for r in rows:
        r["vs_floor"] = r["sample32_us"] and r["sample32_us"] / floor["sample32_us"]
    print(format_table(rows, COLUMNS))
    main_row = next(r for r in rows if r["buffer"].startswith("lazyframes"))
    print(
        f"RSS check: {main_row['bytes_per_transition']:,.0f} B/transition by RSS growth vs "
        f"{main_row['memory_bpt']:,.0f} by memory() ({main_row['gb_at_1M']:.2f} GB at 1M)"
    )
    print(
        "B/transition (RSS): resident-set growth while building and filling / transitions held; "
        "GB at 1M: that x 1e6. s32/floor: sample(32) / gather floor (obs + next obs bytes).\n"
        "sample(32), sample(256): every buffer in one process, the calls round-robin after "
        "a warm-up, outputs reused where the API allows (note); alone s(32): the same call "
        "timed in the row's own process, after the same warm-up."
    )
    if args.check:
        report_checks(check_targets(rows, E))
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
