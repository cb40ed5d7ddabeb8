"""SB3 replay buffers on real Atari frames: memory per transition and sample latency.

Every buffer is filled in its own spawned process with the transitions SB3's DQN would
store: ``make_atari_env("BreakoutNoFrameskip-v4")`` + ``VecFrameStack(4)`` +
``VecTransposeImage`` (the channels-first layout the CNN policy's buffer receives), a
random policy, the terminal observation put in place of ``next_obs`` as SB3's
``_store_transition`` does. Real frames matter here: a compressing buffer is only as
good as the frames are compressible.

Rows: SB3's ``ReplayBuffer`` (its default), SB3 with ``optimize_memory_usage=True``,
sb3-extra-buffers' ``CompressedReplayBuffer`` (zstd level 3, when installed) and
``lazyframes.sb3.ReplayBuffer``, uncompressed and with ``compress=True``. Memory is the
growth of the process's resident set while the buffer is built and filled, per
transition held (extrapolated to 1M); sample is the median time of
``buffer.sample(32)``, which returns SB3's torch ``ReplayBufferSamples`` (torch on one
thread). Run: ``python -m bench.bench_sb3 [--transitions N] [--quick]``.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

import numpy as np

from bench._util import format_table, header
from bench.bench_replay import _in_child, _median_us, rss

ENV_ID = "BreakoutNoFrameskip-v4"

#: Buffer name -> (module, class, constructor keyword arguments).
BUFFERS = {
    "SB3 ReplayBuffer (default)": ("stable_baselines3.common.buffers", "ReplayBuffer", {}),
    "SB3 optimize_memory_usage=True": (
        "stable_baselines3.common.buffers",
        "ReplayBuffer",
        {"optimize_memory_usage": True, "handle_timeout_termination": False},
    ),
    "sb3-extra-buffers zstd-3": (
        "sb3_extra_buffers.compressed",
        "CompressedReplayBuffer",
        {"compression_method": "zstd-3"},
    ),
    "lazyframes.sb3.ReplayBuffer": ("lazyframes.sb3", "ReplayBuffer", {}),
    "lazyframes.sb3.ReplayBuffer compress=True": (
        "lazyframes.sb3",
        "ReplayBuffer",
        {"compress": True},
    ),
}

COLUMNS = [
    ("buffer", "buffer", "{}"),
    ("transitions", "transitions", "{:,}"),
    ("bytes_per_transition", "B/transition (RSS)", "{:,.0f}"),
    ("payload_bpt", "B/transition (data)", "{:,.0f}"),
    ("gib_at_1M", "GiB at 1M", "{:.1f}"),
    ("add_us", "add us", "{:.1f}"),
    ("sample32_us", "sample(32) us", "{:,.1f}"),
]


def _payload(rb) -> int:
    """Bytes the buffer's own data takes (what it would hold without allocator overhead)."""
    if hasattr(rb, "memory"):  # lazyframes: frames (pool chunks, or compressed) and tables
        m = rb.memory()
        return int(m["bytes_held"] + m["table_bytes"])
    total = 0
    for name in ("observations", "next_observations", "actions", "rewards", "dones", "timeouts"):
        a = getattr(rb, name, None)
        if a is None:
            continue
        if a.dtype == object:  # compressed observations: one bytes object each
            total += sum(len(x) for x in a.flat if x is not None)
        else:
            total += a.nbytes
    return total


def bench_buffer(name: str, transitions: int, repeats: int, seed: int) -> dict | None:
    """Fill one buffer with ``transitions`` real Breakout transitions; measure it."""
    import importlib

    module, cls_name, kwargs = BUFFERS[name]
    try:
        cls = getattr(importlib.import_module(module), cls_name)
        import ale_py
        import gymnasium as gym
        import torch
        from stable_baselines3.common.env_util import make_atari_env
        from stable_baselines3.common.vec_env import VecFrameStack, VecTransposeImage
    except ImportError as e:
        print(f"{name}: not available ({e}); row skipped")
        return None
    torch.set_num_threads(1)
    gym.register_envs(ale_py)
    env = VecTransposeImage(VecFrameStack(make_atari_env(ENV_ID, n_envs=1, seed=seed), 4))
    rng = np.random.default_rng(seed)
    obs = env.reset()
    gc.collect()
    r0 = rss()
    rb = cls(transitions, env.observation_space, env.action_space, device="cpu", **kwargs)
    add_s = 0.0
    for _ in range(transitions):
        action = rng.integers(0, env.action_space.n, size=1)
        new_obs, reward, done, infos = env.step(action)
        next_obs = new_obs.copy()
        if done[0]:
            next_obs[0] = infos[0]["terminal_observation"]
        t0 = time.perf_counter()
        rb.add(obs, next_obs, action, reward, done, infos)
        add_s += time.perf_counter() - t0
        obs = new_obs
    gc.collect()
    held = rss() - r0
    payload = _payload(rb)
    np.random.seed(seed)  # noqa: NPY002 - SB3's buffers sample from the global generator
    s32 = _median_us(lambda: rb.sample(32), repeats, max(3, repeats // 10))
    env.close()
    bpt = held / transitions
    return {
        "buffer": name,
        "transitions": transitions,
        "bytes_per_transition": bpt,
        "payload_bpt": payload / transitions,
        "gib_at_1M": bpt * 1e6 / 2**30,
        "add_us": add_s / transitions * 1e6,
        "sample32_us": s32,
    }


def main(argv=None) -> list[dict]:
    """Run the SB3 buffer benchmark and print one table; return the rows."""
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_sb3",
        description="SB3 replay buffers on real Breakout frames: RSS per transition and "
        "sample(32) latency; SB3 default, optimize_memory_usage, sb3-extra-buffers zstd-3 "
        "and lazyframes.sb3.ReplayBuffer (uncompressed and compress=True).",
    )
    p.add_argument(
        "--transitions",
        type=int,
        default=None,
        help="transitions stored in each buffer (default 20000; 2000 with --quick)",
    )
    p.add_argument("--repeats", type=int, default=None, help="timed sample calls (default 200)")
    p.add_argument("--quick", action="store_true", help="a small, fast smoke run")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    n = args.transitions or (2_000 if args.quick else 20_000)
    repeats = args.repeats or (20 if args.quick else 200)
    print(header("bench_sb3"))
    print(
        f"{ENV_ID}, random policy, {n:,} transitions per buffer; sample = median of {repeats} calls"
    )
    rows = [r for r in (_in_child(bench_buffer, b, n, repeats, args.seed) for b in BUFFERS) if r]
    print(format_table(rows, COLUMNS))
    print(
        "B/transition (RSS): resident-set growth while building and filling / transitions "
        "held (includes SB3's up-front allocation and allocator overhead); data: the "
        "buffer's own arrays and compressed bytes; add: one SB3 add() call; sample(32): "
        "returns SB3's ReplayBufferSamples of torch tensors."
    )
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
