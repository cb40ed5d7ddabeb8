"""Prioritized replay benchmark: sample + update_priorities against cpprb and TorchRL in one run.

For ``N`` in 100,000 and 1,000,000 transitions and batches of 32 and 256, it times one
training step's worth of priority work, ``sample(B)`` then ``update_priorities(B)``
(the same new priorities for every buffer):

- **lazyframes machinery**: ``PrioritizedReplayBuffer``'s draw (uniforms from its RNG,
  the stratified descent of the C sum-tree, the weights, the transition numbers) and
  ``update_priorities``: everything but the copy of the frames;
- **lazyframes sample+update**: the whole ``sample(B)`` (84x84 uint8 frames, k = 4,
  copied out as uint8 ``(B, 4, 84, 84)`` observations and next observations) and
  ``update_priorities``;
- **lazyframes uniform sample**: ``ReplayBuffer.sample(B)`` of a uniform buffer of the
  same transitions (the uniform draw and the same copy): the cost the machinery adds to;
- **lazyframes tiny**: ``sample(B)`` + ``update_priorities`` of a buffer of 1x1 frames
  (k = 4): the whole call with a payload as small as cpprb's below, like for like;
- **cpprb**: ``cpprb.PrioritizedReplayBuffer`` (C++ segment trees) ``sample(B, beta)``
  and ``update_priorities``, storing a 1-byte observation, an action, a reward and a
  done per transition (cpprb stores whole observations, so 84x84x4 frames do not fit
  1M transitions in memory): its priority machinery plus a near-free gather;
- **TorchRL**: ``torchrl.data.PrioritizedSampler`` (C++ segment trees) ``sample`` and
  ``update_priority`` over a storage of ``N``, given priority 1.0 for every transition
  after ``extend`` (as ours and cpprb's start): priority machinery only. When it cannot
  be loaded, a line says why and its column is empty.

A second table compares the whole call on real-size frames, at 100,000 transitions
only (cpprb's buffer of 1M 84x84 frames would take 7 GB and minutes to fill): the same
transitions, one stream of 84x84 uint8 frames in k = 4 windows, in
``cpprb.PrioritizedReplayBuffer(next_of="obs", stack_compress="obs")`` (each frame
stored once) and in our ``PrioritizedReplayBuffer``, both sampled channel-last
``(B, 84, 84, 4)``.

Every row of the lazyframes buffer holds the same frames (one random-looking 84x84
stack; the pool stores them once per env stream), so 1M transitions fit in about
100 MB. Figures are medians over repeats taken round-robin, after a warmup. Ratios:
``peer / lazyframes machinery`` and ``peer / lazyframes tiny`` (target >= 2x against the
fastest peer; tiny is the like-for-like whole call) and
``machinery / uniform sample(32)`` (target <= 25%). A missing peer costs one line.
Run: ``python -m bench.bench_prioritized [--quick] [--check] [--frames-size N]``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

import numpy as np

from lazyframes.replay import PrioritizedReplayBuffer, ReplayBuffer

from ._util import format_table, header, report_checks, round_robin_us, target

ALPHA, BETA = 0.6, 0.4
H = W = 84
K = 4
E = 1000  # env streams of the fill: one add call stores E transitions
R = 4096  # distinct frames of the real-size row's looping stream
TARGET_PEER = 2.0  # the fastest peer's sample+update over our machinery
TARGET_UNIFORM = 0.25  # our machinery over our uniform sample(32)


def ours(n: int, seed: int, frame=(H, W), uniform: bool = False):
    """A prioritized (or uniform) buffer of ``n`` transitions of the same k-stack of ``frame``s."""
    if uniform:
        rb = ReplayBuffer(n, num_envs=E, seed=seed)
    else:
        rb = PrioritizedReplayBuffer(n, alpha=ALPHA, num_envs=E, seed=seed)
    stack = np.random.default_rng(seed).integers(0, 256, (K, *frame), dtype=np.uint8)
    obs = np.broadcast_to(stack, (E, K, *frame))
    act = np.zeros(E, np.int64)
    rew = np.ones(E, np.float32)
    flags = np.zeros(E, bool)
    for _ in range(n // E):
        rb.add(obs, act, rew, obs, flags, flags)
    return rb


def cpprb_buffer(n: int):
    """The cpprb PrioritizedReplayBuffer of ``n`` transitions, or None without cpprb."""
    try:
        import cpprb
    except ImportError:
        return None
    rb = cpprb.PrioritizedReplayBuffer(
        n,
        {"obs": {"shape": (1,), "dtype": np.uint8}, "act": {}, "rew": {}, "done": {}},
        alpha=ALPHA,
    )
    for _ in range(n // E):
        rb.add(obs=np.zeros((E, 1), np.uint8), act=np.zeros(E), rew=np.ones(E), done=np.zeros(E))
    return rb


def stream_windows(seed: int):
    """``R + 1`` channel-last windows ``(84, 84, 4)`` of a looping stream of R random frames.

    Window ``t % R`` (a view) is the observation at step ``t``: consecutive windows share
    ``K - 1`` frames, as a frame stack's do, and window ``R`` equals window 0.
    """
    base = np.random.default_rng(seed).integers(0, 256, (R + K, H, W), dtype=np.uint8)
    base[R:] = base[:K]
    return np.lib.stride_tricks.sliding_window_view(base, K, axis=0)


def ours_frames(n: int, seed: int, win) -> PrioritizedReplayBuffer:
    """Transitions ``0 .. n-1`` of the stream (obs window ``t % R``) in E env streams.

    Env ``e`` holds transitions ``e * n/E`` onwards, so each of its adds stores one new
    frame (the others are the previous observation's); sampled channel-last as cpprb's.
    """
    steps = n // E
    rb = PrioritizedReplayBuffer(n, alpha=ALPHA, num_envs=E, layout="last", stack_size=K, seed=seed)
    start = np.arange(E) * steps
    act = np.zeros(E, np.int64)
    rew = np.ones(E, np.float32)
    flags = np.zeros(E, bool)
    for s in range(steps):
        t = start + s
        rb.add(win[t % R], act, rew, win[(t + 1) % R], flags, flags)
    return rb


def cpprb_frames(n: int, win):
    """The cpprb buffer of the same n transitions, frames shared (next_of, stack_compress).

    Added in order, one batch of E consecutive steps per call (its ``stack_compress``
    needs consecutive observations to be sliding windows). None without cpprb.
    """
    try:
        import cpprb
    except ImportError:
        return None
    rb = cpprb.PrioritizedReplayBuffer(
        n,
        {"obs": {"shape": (H, W, K), "dtype": np.uint8}, "act": {}, "rew": {}, "done": {}},
        alpha=ALPHA,
        next_of="obs",
        stack_compress="obs",
    )
    for s in range(n // E):
        t = np.arange(s * E, (s + 1) * E)
        rb.add(
            obs=win[t % R],
            next_obs=win[(t + 1) % R],
            act=np.zeros(E),
            rew=np.ones(E),
            done=np.zeros(E),
        )
    return rb


def run_frames(n: int, batches, repeats: int, warmup: int, seed: int) -> list[dict]:
    """Sample + update on real-size frames: ours against cpprb holding the same transitions."""
    win = stream_windows(seed)
    peer = cpprb_frames(n, win)
    if peer is None:
        return []
    rb = ours_frames(n, seed, win)
    rng = np.random.default_rng(seed)
    rows = []
    for b in batches:
        p = rng.uniform(0.01, 2.0, b)

        def full(b=b, p=p):
            s = rb.sample(b, beta=BETA)
            rb.update_priorities(s.indices, p)

        def cp(b=b, p=p):
            s = peer.sample(b, beta=BETA)
            peer.update_priorities(s["indexes"], p)

        t = round_robin_us({"full": full, "cpprb": cp}, repeats, warmup)
        rows.append({"N": n, "B": b, **{k + "_us": v for k, v in t.items()}})
        rows[-1]["x"] = t["cpprb"] / t["full"]
    return rows


def torchrl_sampler(n: int):
    """``(sampler, storage)`` of TorchRL over ``n`` transitions, or the reason it is missing."""
    try:
        import torch
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, PrioritizedSampler

        storage = LazyTensorStorage(n)
        storage.set(torch.arange(n), TensorDict({"a": torch.zeros(n, 1)}, batch_size=[n]))
        sampler = PrioritizedSampler(n, alpha=ALPHA, beta=BETA)
        sampler.extend(torch.arange(n))
        # extend leaves the new entries' priorities unset ("non-positive p_sum" at the
        # first sample): give them ours, every stored transition at priority 1.0
        sampler.update_priority(torch.arange(n), torch.ones(n))
        return sampler, storage
    except ImportError as e:
        return f"not installed ({e}; pip install torchrl)"
    except Exception as e:  # its C++ segment trees not loading: built for another torch
        import torch
        import torchrl

        try:  # the extension's own error names what is wrong (an undefined torch symbol)
            import torchrl._torchrl

            why = ""
        except ImportError as ie:
            msg = str(ie).splitlines()[0]
            why = ", an undefined symbol of libtorch" if "undefined symbol" in msg else f": {msg}"
        return (
            f"{type(e).__name__}: {str(e).splitlines()[0][:80]} (its C++ extension does not "
            f"load{why}; torchrl {torchrl.__version__} was built for another torch than "
            f"{torch.__version__})"
        )


def run(sizes, batches, repeats: int, warmup: int, seed: int) -> tuple[list[dict], list[str]]:
    rows, notes = [], []
    rng = np.random.default_rng(seed)
    prios = {b: rng.uniform(0.01, 2.0, b) for b in batches}
    for n in sizes:
        rb = ours(n, seed)
        uni = ours(n, seed, uniform=True)  # the same transitions, sampled uniformly
        tiny = ours(n, seed, (1, 1))
        peer = cpprb_buffer(n)
        if peer is None:
            notes.append("cpprb: not installed (pip install cpprb); its column is empty")
        tr = torchrl_sampler(n)
        if isinstance(tr, str):
            notes.append(f"TorchRL PrioritizedSampler: unavailable, {tr}")
            tr = None
        for b in batches:
            p = prios[b]

            def machinery(b=b, p=p, rb=rb):
                _, numbers, _ = rb._draw(b, BETA)
                rb.update_priorities(numbers, p)

            def full(b=b, p=p, rb=rb):
                s = rb.sample(b, beta=BETA)
                rb.update_priorities(s.indices, p)

            def uniform(b=b, rb=uni):
                rb.sample(b)

            def tiny_full(b=b, p=p, rb=tiny):
                s = rb.sample(b, beta=BETA)
                rb.update_priorities(s.indices, p)

            fns: dict[str, Callable] = {
                "machinery": machinery,
                "full": full,
                "uniform": uniform,
                "tiny": tiny_full,
            }
            if peer is not None:

                def cp(b=b, p=p, peer=peer):
                    s = peer.sample(b, beta=BETA)
                    peer.update_priorities(s["indexes"], p)

                fns["cpprb"] = cp
            if tr is not None:
                import torch

                sampler, storage = tr
                tp = torch.as_tensor(p)

                def tl(b=b, tp=tp):
                    idx, _ = sampler.sample(storage, b)
                    sampler.update_priority(idx, tp)

                fns["torchrl"] = tl
            t = round_robin_us(fns, repeats if b == 32 else max(10, repeats // 4), warmup)
            peers = [t[k] for k in ("cpprb", "torchrl") if k in t]
            rows.append(
                {
                    "N": n,
                    "B": b,
                    **{k + "_us": v for k, v in t.items()},
                    "fastest_peer_x": min(peers) / t["machinery"] if peers else float("nan"),
                    "tiny_x": min(peers) / t["tiny"] if peers else float("nan"),
                    "machinery_of_uniform": t["machinery"] / t["uniform"],
                }
            )
    return rows, notes


FRAME_COLS = [
    ("N", "N", "{:,}"),
    ("B", "B", "{}"),
    ("full_us", "lf sample+update", "{:.1f}"),
    ("cpprb_us", "cpprb sample+update", "{:.1f}"),
    ("x", "cpprb/lf", "{:.2f}x"),
]

COLUMNS = [
    ("N", "N", "{:,}"),
    ("B", "B", "{}"),
    ("machinery_us", "lf machinery", "{:.1f}"),
    ("full_us", "lf sample+update", "{:.1f}"),
    ("uniform_us", "lf uniform sample", "{:.1f}"),
    ("tiny_us", "lf tiny", "{:.1f}"),
    ("cpprb_us", "cpprb", "{:.1f}"),
    ("torchrl_us", "TorchRL", "{:.1f}"),
    ("fastest_peer_x", "peer/lf machinery", "{:.2f}x"),
    ("tiny_x", "peer/lf tiny", "{:.2f}x"),
    ("machinery_of_uniform", "machinery/uniform", "{:.0%}"),
]


def check_targets(rows: list[dict]) -> list[tuple[str, bool]]:
    """The targets that ``--check`` tests (bench/README.md): (description, met) pairs."""
    out = []
    for r in rows:
        where = f"N={r['N']:,} B={r['B']}"
        out.append(
            target(f"{where}: fastest peer / machinery", r["fastest_peer_x"], ">=", TARGET_PEER)
        )
        out.append(target(f"{where}: fastest peer / tiny", r["tiny_x"], ">=", TARGET_PEER))
        if r["B"] == 32:
            what = f"{where}: machinery / uniform sample"
            out.append(target(what, r["machinery_of_uniform"], "<=", TARGET_UNIFORM, "{:.0%}"))
    return out


def main(argv=None) -> list[dict]:
    """Run the prioritized replay benchmark and print one table; return the rows.

    With ``--check`` it also prints the targets and exits with status 1 if one is missed.
    """
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_prioritized",
        description="Prioritized replay: sample + update_priorities of lazyframes against "
        "cpprb's PrioritizedReplayBuffer and TorchRL's PrioritizedSampler.",
    )
    p.add_argument("--quick", action="store_true", help="a small, fast smoke run")
    p.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=None,
        help="buffer sizes (default 100000 1000000; 10000 with --quick)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed calls at batch 32 (a quarter at 256; default 400, 40 with --quick)",
    )
    p.add_argument(
        "--frames-size",
        type=int,
        default=None,
        help="transitions of the real-size frames row against cpprb's stack_compress "
        "buffer (default 100000, 10000 with --quick; 0 skips it)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--check",
        action="store_true",
        help="developer check: print the targets and exit with status 1 if one is missed",
    )
    args = p.parse_args(argv)
    sizes = args.sizes or ([10_000] if args.quick else [100_000, 1_000_000])
    repeats = args.repeats or (40 if args.quick else 400)
    warmup = 3 if args.quick else 30
    print(header("bench_prioritized", f"alpha={ALPHA}, beta={BETA}"))
    print(
        f"{H}x{W} uint8 frames, k={K}, the same stack in every row; median of {repeats} "
        f"calls at B=32, {max(10, repeats // 4)} at B=256 (microseconds); "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    rows, notes = run(sizes, (32, 256), repeats, warmup, args.seed)
    print(format_table(rows, COLUMNS))
    for note in dict.fromkeys(notes):
        print(note)
    print(
        "lf machinery: draw (RNG uniforms, C tree descent, weights, numbers) + "
        "update_priorities, no frame copy; lf tiny: sample+update with 1x1 frames; peer/lf ...: "
        "the fastest peer's sample+update over ours; machinery/uniform: over our uniform "
        "sample(B) of the same frames. Every call warmed first; ours reuse their outputs, "
        "cpprb's and TorchRL's sample return new arrays / tensors (no output argument)."
    )
    n_frames = args.frames_size
    if n_frames is None:
        n_frames = 10_000 if args.quick else 100_000
    if n_frames:
        frame_rows = run_frames(n_frames, (32, 256), max(10, repeats // 8), 3, args.seed)
        if frame_rows:
            print(
                f"\nReal-size frames: {n_frames:,} transitions of one stream of {H}x{W} uint8 "
                f"frames, k={K}, sampled channel-last (B, {H}, {W}, {K}) by both; cpprb stores "
                f"each frame once (next_of='obs', stack_compress='obs'), lazyframes in {E} env "
                f"streams; median of {max(10, repeats // 8)} calls (microseconds)"
            )
            print(format_table(frame_rows, FRAME_COLS))
        else:
            print("cpprb: not installed (pip install cpprb); no real-size frames row")
    if args.check:
        report_checks(check_targets(rows))
    return rows


if __name__ == "__main__":
    main()
