"""Distributed ingest benchmark: actors feeding one replay actor on Ray, two ways, one run.

With 1, 2 and 4 actor processes (Ray actors on this machine), each emulating ``--envs``
Atari envs, it measures how many transitions per second reach one replay actor, and how
many bytes each transition costs on the wire:

- **lazyframes**: the actor feeds ``lazyframes.transport.Sender`` its ``LazyBatch``
  observations and sends a message every ``--flush`` vector steps: each new frame once
  (compressed), transitions as frame references; the replay actor's ``Receiver`` adds
  them to a compressed ``lazyframes.ReplayBuffer``.
- **naive**: the actor sends stacked ``obs`` and ``next_obs`` arrays (uint8
  ``(4, 84, 84)`` each) with the actions, rewards and flags, as RLlib's and SB3's
  workers do; the replay actor copies them into a preallocated NumPy ring (SB3's
  ``ReplayBuffer`` without ``optimize_memory_usage``).

The frames are real: each actor records ``--record`` random-policy steps of
``ALE/Pong-v5`` (Gymnasium's ``AtariPreprocessing``, 84x84) once, then replays them
through lazyframes' stacker with its envs at different offsets, episodes cut every
``--episode`` steps, so the actors, not the emulator, set the pace. Rates are
end to end (first send to last acknowledgement); "replay us/tr" is the replay actor's
own time per transition. On a machine with fewer cores than actors the processes share
them, so the rate measures the whole pipeline's CPU cost as much as its parallelism.

First, in one process and without Ray, a table of ``Receiver.ingest`` against the same
``ReplayBuffer.add`` calls made locally (``--local GAME ...``, recorded frames of Pong and
MsPacman by default): time per transition, wire bytes, and stored bytes per frame (a
compressing receiver stores the message's blobs as they came).

Run: ``python -m bench.bench_distributed [--steps N]`` from the source checkout (needs
``.[distributed]``); the defaults take about a minute.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import lazyframes
from bench._util import format_table, header
from lazyframes.transport import Receiver, Sender, wire_bytes

K = 4
FRAME = (84, 84)
ACTORS = (1, 2, 4)


class Actor:
    """Replays recorded Pong frames through lazyframes' stacker, for ``envs`` envs."""

    def __init__(self, envs: int, record: int, episode: int, flush: int, seed: int):
        from bench._util import atari_env

        env = atari_env("ALE/Pong-v5")
        env.action_space.seed(seed)
        obs, _ = env.reset(seed=seed)
        frames = [obs]
        for _ in range(record):
            obs, _, te, tr, _ = env.step(env.action_space.sample())
            frames.append(obs)
            if te or tr:
                obs, _ = env.reset()
                frames.append(obs)
        env.close()
        self.frames = np.stack(frames)
        self.envs, self.episode, self.flush = envs, episode, flush
        self.rng = np.random.default_rng(seed)
        self.offsets = self.rng.integers(0, len(self.frames), envs)

    def ready(self) -> int:
        return len(self.frames)

    def run(self, mode: str, replay, stream: int, steps: int) -> dict:
        """``steps`` vector steps sent to ``replay``; returns the bytes sent and the counts."""
        import ray

        pool = lazyframes.FramePool(FRAME, np.uint8)
        E, n = self.envs, len(self.frames)
        sender = Sender(num_envs=E, stream=stream, action_dtype=np.uint8)
        obs = pool.push_batch(self.frames[self.offsets % n], k=K)
        naive: list = []
        in_flight: list = []
        sent = {"transitions": 0, "bytes": 0}

        def send(msg, method) -> None:
            sent["bytes"] += wire_bytes(msg)
            if len(in_flight) >= 2:  # back-pressure: at most 2 messages in flight
                ray.get(in_flight.pop(0))
            in_flight.append(method.remote(msg))

        for t in range(1, steps + 1):
            self.offsets += 1
            cut = (t % self.episode == 0) & np.ones(E, np.bool_)
            nxt = obs.shift(self.frames[self.offsets % n])
            actions = self.rng.integers(0, 6, E).astype(np.uint8)
            rewards = np.zeros(E, np.float32)
            term = np.zeros(E, np.bool_)
            if mode == "lazyframes":
                sender.add(obs, actions, rewards, nxt, term, cut)
            else:
                naive.append((np.asarray(obs), actions, rewards, np.asarray(nxt), term, cut))
            sent["transitions"] += E
            # a new episode starts from the next frame, padded (reset padding)
            obs = nxt if not cut.any() else pool.push_batch(self.frames[self.offsets % n], k=K)
            if t % self.flush == 0 or t == steps:
                if mode == "lazyframes":
                    send(sender.flush(), replay.ingest)
                else:
                    cols = list(zip(*naive, strict=True))
                    keys = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
                    send(
                        {k: np.concatenate(c) for k, c in zip(keys, cols, strict=True)},
                        replay.add_naive,
                    )
                    naive = []
        ray.get(in_flight)
        return sent


class Replay:
    """The replay actor: lazyframes' Receiver into a compressed buffer, or a NumPy ring."""

    def __init__(self, capacity: int, num_envs: int):
        self.rb = lazyframes.ReplayBuffer(
            capacity, num_envs=num_envs, compress=True, action_dtype=np.uint8
        )
        self.rx = Receiver(self.rb, frame_shape=FRAME)
        self.capacity = capacity
        self.ring: dict = {}
        self.pos = 0
        self.busy = 0.0

    def open(self, num_envs: int) -> int:
        return self.rx.open(num_envs)

    def ingest(self, msg) -> None:
        t0 = time.perf_counter()
        self.rx.ingest(msg)
        self.busy += time.perf_counter() - t0

    def add_naive(self, batch: dict) -> None:
        t0 = time.perf_counter()
        if not self.ring:
            self.ring = {
                k: np.zeros((self.capacity, *v.shape[1:]), v.dtype) for k, v in batch.items()
            }
        T = len(batch["obs"])
        idx = (self.pos + np.arange(T)) % self.capacity
        for k, v in batch.items():
            self.ring[k][idx] = v
        self.pos = (self.pos + T) % self.capacity
        self.busy += time.perf_counter() - t0

    def stats(self) -> dict:
        mem = self.rb.memory()
        return {"busy": self.busy, "bytes_per_transition": mem["bytes_per_transition"]}


def run(steps: int, envs: int, record: int, episode: int, flush: int, seed: int) -> list:
    import ray

    ray.init(include_dashboard=False, log_to_driver=False)
    remote_actor = ray.remote(Actor).options(num_cpus=0)
    actors = [
        remote_actor.remote(envs, record, episode, flush, seed + i) for i in range(max(ACTORS))
    ]
    ray.get([a.ready.remote() for a in actors])  # recorded: the runs time sending only
    rows = []
    for n in (1, *ACTORS):  # the first run (1 actor) warms the processes up, unreported
        row: dict = {"actors": n}
        for mode in ("lazyframes", "naive"):
            cap = n * envs * steps if mode == "lazyframes" else min(n * envs * steps, 2048)
            replay = ray.remote(Replay).options(num_cpus=0).remote(cap, n * envs)
            streams = [ray.get(replay.open.remote(envs)) for _ in range(n)]
            t0 = time.perf_counter()
            sent = ray.get(
                [
                    a.run.remote(mode, replay, s, steps)
                    for a, s in zip(actors, streams, strict=False)
                ]
            )
            wall = time.perf_counter() - t0
            st = ray.get(replay.stats.remote())
            T = sum(s["transitions"] for s in sent)
            row[f"{mode}_rate"] = T / wall
            row[f"{mode}_bytes"] = sum(s["bytes"] for s in sent) / T
            row[f"{mode}_replay_us"] = 1e6 * st["busy"] / T
            ray.kill(replay)
        row["speedup"] = row["lazyframes_rate"] / row["naive_rate"]
        row["wire_ratio"] = row["naive_bytes"] / row["lazyframes_bytes"]
        rows.append(row)
    ray.shutdown()
    return rows[1:]


def local_ingest(games, flushes, envs: int, steps: int, seed: int) -> list[dict]:
    """One process, no Ray: ``Receiver.ingest`` against making the same transitions locally.

    ``envs`` envs replay recorded steps of each game (cached by bench_compress) at
    different offsets. Locally, lazyframes' stacker pushes each new frame and
    ``ReplayBuffer.add`` stores the step, the pool compressing each frame once only the
    buffer holds it (an actor and learner in one process). Remotely, a Sender made a
    message every ``flush`` vector steps beforehand (not timed), and a compressing
    buffer's Receiver ingests them, adopting their blobs. Each side runs twice, the
    second timed.
    """
    from pathlib import Path

    from bench.bench_compress import record

    rows = []
    for game in games:
        frames = np.load(record(game, 10_000, seed, Path.home() / ".cache" / "lazyframes"))
        frames = frames["frames"]
        at = np.random.default_rng(seed).integers(0, len(frames), envs)
        news = [frames[(at + t) % len(frames)] for t in range(steps + 1)]
        act, zero, no = np.ones(envs, np.int64), np.zeros(envs, np.float32), np.zeros(envs, bool)

        def run(sink) -> float:
            """Stack ``steps`` vector steps, ``sink(t, obs, next_obs)`` each: seconds."""
            obs = lazyframes.FramePool(FRAME, np.uint8).push_batch(news[0], k=K)
            t0 = time.perf_counter()
            for t in range(1, steps + 1):
                nxt = obs.shift(news[t])
                sink(t, obs, nxt)
                obs = nxt
            return time.perf_counter() - t0

        def buffer() -> lazyframes.ReplayBuffer:
            return lazyframes.ReplayBuffer(steps * envs, num_envs=envs, compress=True)

        for flush in flushes:
            sender, msgs = Sender(num_envs=envs), []

            def send(t, obs, nxt, sender=sender, msgs=msgs, flush=flush) -> None:
                sender.add(obs, act, zero, nxt, no, no)
                if t % flush == 0 or t == steps:
                    msgs.append(sender.flush())

            run(send)
            row = {"game": game, "flush": flush}
            for side in ("add", "ingest"):
                for _ in range(2):
                    rb = buffer()
                    if side == "add":
                        dt = run(lambda t, o, n, rb=rb: rb.add(o, act, zero, n, no, no))
                    else:
                        rx = Receiver(rb, frame_shape=FRAME)
                        rx.open(envs)
                        t0 = time.perf_counter()
                        for m in msgs:
                            rx.ingest(m)
                        dt = time.perf_counter() - t0
                st = rb.pool.stats()
                row[f"{side}_us"] = 1e6 * dt / (steps * envs)
                row[f"{side}_bpf"] = st["cold_bytes"] / max(1, st["cold_frames"])
            row["ratio"] = row["ingest_us"] / row["add_us"]
            row["wire"] = sum(wire_bytes(m) for m in msgs) / (steps * envs)
            rows.append(row)
    return rows


LOCAL_COLUMNS = [
    ("game", "game", str),
    ("flush", "steps/message", str),
    ("add_us", "local add us/tr", lambda x: f"{x:.1f}"),
    ("ingest_us", "ingest us/tr", lambda x: f"{x:.1f}"),
    ("ratio", "ingest/add", lambda x: f"{x:.2f}x"),
    ("wire", "wire B/tr", lambda x: f"{x:,.0f}"),
    ("add_bpf", "local B/frame", lambda x: f"{x:,.0f}"),
    ("ingest_bpf", "received B/frame", lambda x: f"{x:,.0f}"),
]


def _int(x) -> str:
    return f"{x:,.0f}"


def _ratio(x) -> str:
    return f"{x:.1f}x"


def _us(x) -> str:
    return f"{x:.1f}"


COLUMNS = [
    ("actors", "actors", str),
    ("lazyframes_rate", "lazyframes tr/s", _int),
    ("naive_rate", "naive tr/s", _int),
    ("speedup", "lf/naive", _ratio),
    ("lazyframes_bytes", "lazyframes B/tr", _int),
    ("naive_bytes", "naive B/tr", _int),
    ("wire_ratio", "bytes naive/lf", _ratio),
    ("lazyframes_replay_us", "lf replay us/tr", _us),
    ("naive_replay_us", "naive replay us/tr", _us),
]


def main(argv=None) -> list[dict]:
    """Run the distributed benchmark and print one table; return the rows."""
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_distributed",
        description="Transitions per second and bytes on the wire from 1, 2, 4 Ray actors "
        "to one replay actor: lazyframes.transport vs stacked observations.",
    )
    p.add_argument("--steps", type=int, default=300, help="vector steps per actor per run")
    p.add_argument("--envs", type=int, default=4, help="envs per actor")
    p.add_argument("--flush", type=int, default=50, help="vector steps per message")
    p.add_argument("--record", type=int, default=400, help="recorded Pong steps per actor")
    p.add_argument("--episode", type=int, default=200, help="steps per emulated episode")
    p.add_argument("--seed", type=int, default=0, help="seed of the recordings and actions")
    p.add_argument("--local", nargs="*", default=["Pong", "MsPacman"], metavar="GAME",
                   help="games of the one-process ingest table (none: skip it)")  # fmt: skip
    args = p.parse_args(argv)
    print(header("bench_distributed"))
    if args.local:
        print("One process: Receiver.ingest vs the same ReplayBuffer.add calls, 8 envs, "
              "1,200 vector steps of recorded frames, both buffers compressed")  # fmt: skip
        print(format_table(local_ingest(args.local, (16, 50), 8, 1200, args.seed), LOCAL_COLUMNS))
    print(
        f"Ray actors on this machine, {args.envs} Pong envs each (recorded frames), "
        f"{args.steps} vector steps per actor, a message every {args.flush} steps"
    )
    rows = run(args.steps, args.envs, args.record, args.episode, args.flush, args.seed)
    print(format_table(rows, COLUMNS))
    print(
        "tr/s: transitions reaching the replay actor per second, end to end; B/tr: bytes "
        "pickled (protocol 5, buffers out of band, as Ray sends them) per transition; "
        "replay us/tr: the replay actor's time per transition (Receiver.ingest into a "
        "compressed ReplayBuffer; naive: copying into a NumPy ring)"
    )
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
