"""Sequence replay benchmark: ``sample_sequences`` against TorchRL's ``SliceSampler`` and a C loop.

``--steps`` (20,000) recorded random-policy steps of ``ALE/<--game>-v5`` (``bench_compress``'s
recording: AtariPreprocessing 84x84, frame skip 4, stack 4; recorded once and cached), one env
stream, in three buffers holding the same steps:

- **ours** / **ours compress**: ``ReplayBuffer(compress=False / True, action_dtype=uint8)``
  fed the stacked ndarray observations (one new frame stored per step); bytes per step by
  ``memory()``;
- **TorchRL**: ``ReplayBuffer(storage=LazyTensorStorage(n), sampler=SliceSampler(slice_len=T,
  traj_key="episode"))`` holding ``pixels`` ``(4, 84, 84)`` uint8 per step, its episode id,
  action and reward (next pixels by offset: nothing more); bytes per step: its tensors'.

Bytes per step stand beside the frame (7,056 B) and ``bench_memory``'s zstd-3 floor of each
frame XOR its predecessor. Then ``B`` (64) windows of ``T`` (80) steps, uint8, timed
round-robin after a warm-up, medians:

- **sample_sequences**: ``(B, T, 4, 84, 84)`` into a reused ``out`` (147 MB); **frames**:
  ``within_episode=True, frames=True``, the ``(B, T + 3, 84, 84)`` frames into a reused
  ``out`` and the observations a view;
- **C floor** of each: ``_core._memcpy_gather``, one ``memcpy`` per output frame from the
  same pool, over windows drawn beforehand (4 batches, cycled, so no call reads frames the
  last one read: so do ours);
- **TorchRL**: ``rb.sample()`` of ``B * T`` steps as ``B`` slices (new tensors each call:
  its API has no output argument; the row says so).

Run: ``python -m bench.bench_sequences [--steps N] [--check]`` (needs ``.[bench]``:
ale-py, zstandard; TorchRL's rows are skipped with a line when it is missing).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from lazyframes import ReplayBuffer, _core

from ._util import format_table, header, report_checks, round_robin_us, target
from .bench_compress import Stream, record
from .bench_memory import floors

K, FB = 4, 84 * 84
CYCLE = 4  # batches of windows a timed function cycles over
TARGET_RAW = 64  # uncompressed bytes per step <= the frame + this
TARGET_FLOOR, TARGET_META = 1.5, 24  # compressed <= this x the XOR floor + this
TARGET_COPY = 1.3  # sample_sequences(B, T) uint8 <= this x the C loop writing the same bytes


def filled(stream: Stream, compress: bool) -> ReplayBuffer:
    rb = ReplayBuffer(stream.n, seed=0, compress=compress, action_dtype=np.uint8)
    for obs, a, r, nxt, te, tr in stream:
        rb.add(obs, a, r, nxt, te, tr)
    rb.flush()
    return rb


def floor_of(rb: ReplayBuffer, B: int, T: int, frames: bool):
    """A C loop writing what ``sample_sequences`` writes, over CYCLE batches drawn now."""
    table, sets = rb._stores[0].frame_ids(len(rb)), []
    for _ in range(CYCLE):
        s = rb.sample_sequences(B, T, within_episode=frames)
        ids = table[rb._ring.walk(s.indices, T)][:, :, :K]  # (B, T, k): each step's stack
        slots = np.concatenate([ids[:, 0], ids[:, 1:, K - 1]], axis=1) if frames else ids
        sets.append(np.ascontiguousarray(slots.reshape(-1, slots.shape[-1])))
    out = np.empty((B, T + K - 1, 84, 84) if frames else (B, T, K, 84, 84), np.uint8)
    calls = iter(range(1 << 62))
    return lambda: _core._memcpy_gather(rb.pool, sets[next(calls) % CYCLE], out)


def torchrl_buffer(stream: Stream, T: int, B: int):
    """TorchRL's SliceSampler over a LazyTensorStorage of the same steps, or None."""
    try:
        import torch
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, SliceSampler
        from torchrl.data import ReplayBuffer as TorchRB
    except ImportError as e:
        print(f"TorchRL rows skipped: {e}")
        return None
    n = stream.n
    episode = np.cumsum(np.concatenate([[0], (stream.term | stream.trunc)[: n - 1]]))
    data = TensorDict(
        {
            "pixels": torch.from_numpy(stream.frames[stream.obs_idx[:n]]),
            "episode": torch.from_numpy(episode),
            "action": torch.from_numpy(stream.actions[:n].astype(np.uint8)),
            "reward": torch.from_numpy(stream.rewards[:n]),
        },
        batch_size=[n],
    )
    sampler = SliceSampler(slice_len=T, traj_key="episode", strict_length=True)
    rb = TorchRB(storage=LazyTensorStorage(n), sampler=sampler, batch_size=B * T)
    rb.extend(data)
    stored = sum(v.numel() * v.element_size() for v in rb.storage._storage.values()) / n
    return rb, stored


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--game", default="Pong")
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--length", type=int, default=80)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "lazyframes")
    p.add_argument("--check", action="store_true", help="check the targets (bench/README.md)")
    args = p.parse_args(argv)
    B, T = args.batch, args.length
    path = record(args.game, args.steps, 0, args.cache)
    stream = Stream(path, None)
    _, xor = floors(path)
    raw, comp = filled(stream, False), filled(stream, True)
    peer = torchrl_buffer(stream, T, B)
    obs_out = np.empty((B, T, K, 84, 84), np.uint8)
    fr_out = np.empty((B, T + K - 1, 84, 84), np.uint8)
    fns = {
        "sample_sequences": lambda: raw.sample_sequences(B, T, out=obs_out),
        "sample_sequences compress": lambda: comp.sample_sequences(B, T, out=obs_out),
        "frames": lambda: raw.sample_sequences(B, T, within_episode=True, frames=True, out=fr_out),
        "frames compress": lambda: comp.sample_sequences(
            B, T, within_episode=True, frames=True, out=fr_out
        ),
        "C floor": floor_of(raw, B, T, False),
        "C floor frames": floor_of(raw, B, T, True),
    }
    if peer is not None:
        fns["TorchRL"] = peer[0].sample
    us = round_robin_us(fns, args.repeats, warmup=2)
    rows = [
        {"row": "ours", "bytes": raw.memory()["bytes_per_transition"]},
        {"row": "ours compress", "bytes": comp.memory()["bytes_per_transition"]},
    ]
    if peer is not None:
        rows.append({"row": "TorchRL LazyTensorStorage", "bytes": peer[1]})
    for row in rows:
        row["vs_frame"] = row["bytes"] - FB
    for name in ("sample_sequences", "frames"):
        fl = us[f"C floor{' frames' if name == 'frames' else ''}"]
        for suffix in ("", " compress"):
            rows.append({"row": name + suffix, "ms": us[name + suffix] / 1e3,
                         "vs_floor": us[name + suffix] / fl})  # fmt: skip
        rows.append({"row": f"C floor{' frames' if name == 'frames' else ''}", "ms": fl / 1e3})
    if peer is not None:
        rows.append({"row": "TorchRL (new tensors)", "ms": us["TorchRL"] / 1e3,
                     "vs_floor": us["TorchRL"] / us["C floor"]})  # fmt: skip
    print(header("bench_sequences", f"{args.game}, {stream.n:,} recorded steps, B={B}, T={T}"))
    print(f"zstd-3 floor of each frame XOR its predecessor: {xor:.1f} B per step")
    print(format_table(rows, [("row", "row", "{}"), ("bytes", "bytes/step", "{:,.1f}"),
                              ("vs_frame", "- frame", "{:+,.1f}"), ("ms", "ms", "{:.2f}"),
                              ("vs_floor", "x C floor", "{:.2f}x")]))  # fmt: skip
    if args.check:
        by = {r["row"]: r for r in rows}
        report_checks([
            target("uncompressed bytes/step - frame", by["ours"]["vs_frame"], "<=", TARGET_RAW,
                   "{:.1f}"),
            target("compressed bytes/step", by["ours compress"]["bytes"], "<=",
                   TARGET_FLOOR * xor + TARGET_META, "{:.1f}"),
            *(target(f"{n} / C floor", by[n]["vs_floor"], "<=", TARGET_COPY)
              for n in ("sample_sequences", "frames")),
        ])  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
