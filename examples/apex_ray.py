"""Ape-X-style distributed replay on Ray (Horgan et al. 2018), with each frame sent once.

N actor processes (Ray actors) each run a few ALE envs under lazyframes' vector
stacker and an epsilon-greedy policy (Ape-X's per-actor epsilons); each feeds a
``lazyframes.transport.Sender`` and sends its messages straight to one replay Ray actor,
whose ``Receiver`` adds them to a compressed ``lazyframes.ReplayBuffer`` (n-step 3): every
new frame crosses the wire once, compressed, and transitions travel as frame references.
A learner (here in the driver) samples batches from the replay actor, takes a step of a
tiny linear Q-function (NumPy) and, with ``--prioritized``, updates the priorities with
the TD errors; actors fetch the learner's weights at every round.

The run ends with one line of figures: transitions ingested per second (end to end, and
the replay actor's own ingest rate), bytes sent over the wire per transition against an
actor that sends stacked obs and next_obs (RLlib's and SB3's default), the replay's
sample latency and its memory per transition (all in: compressed frames, the frames not
compressed yet - the last message's, a large share in a small buffer - and the tables;
``cold_bytes_per_frame`` is the compressed frames' own cost).

Needs, from the clone, ``python -m pip install -e '.[distributed]'`` (Ray, gymnasium, ale-py;
``.[atari,distributed]`` where opencv is missing, which AtariPreprocessing needs). Every
option is checked before any work (before Ray starts): a bad number, an env id that is not
an ALE game or a missing package (with the command that installs it) ends the script with
one ``apex_ray.py: error: ...`` line and exit status 2.

Examples:
    python examples/apex_ray.py --smoke          # a local Ray, 2 CPUs, about a minute
    python examples/apex_ray.py --num-actors 8 --rounds 50
    RAY_ADDRESS=ray://head:10001 python examples/apex_ray.py --num-actors 64
    python examples/apex_ray.py --address auto   # a cluster started with `ray start`

On a cluster, every node needs lazyframes installed (or ship it with Ray's
``runtime_env``); the replay actor holds the buffer in its node's memory.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import socket
import statistics
import time
from typing import NoReturn

import numpy as np

K = 4  # frames per observation
OBS_SHAPE = (K, 84, 84)

INSTALL = "python -m pip install -e '.[distributed]'"  # from the clone
INSTALL_WITH_OPENCV = "python -m pip install -e '.[atari,distributed]'"


class UsageError(ValueError):
    """A user mistake found before the run: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, whose errors are one line (no usage block), like the script's own checks."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def parse_args(argv=None):
    """The options, checked (:func:`check_args`); a mistake exits with one line, status 2."""
    p = _Parser(
        description="Ape-X-style actors feeding one replay actor on Ray through "
        "lazyframes.transport (each frame sent once, compressed).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--env-id", default="ALE/Pong-v5", help="ALE environment id")
    p.add_argument("--num-actors", type=int, default=4, help="actor processes")
    p.add_argument("--envs-per-actor", type=int, default=2, help="envs of each actor")
    p.add_argument("--rounds", type=int, default=10, help="rounds of acting (weights sync)")
    p.add_argument("--steps-per-round", type=int, default=500, help="vector steps per round")
    p.add_argument("--flush-every", type=int, default=50, help="vector steps per message")
    p.add_argument("--capacity", type=int, default=200_000, help="replay capacity")
    p.add_argument("--batch-size", type=int, default=32, help="transitions per learner step")
    p.add_argument("--learning-starts", type=int, default=500, help="transitions before learning")
    p.add_argument("--max-learner-steps", type=int, default=10**9, help="cap on learner steps")
    p.add_argument("--n-step", type=int, default=3, help="n-step return")
    p.add_argument("--gamma", type=float, default=0.99, help="discount factor")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate of the linear Q")
    p.add_argument(
        "--prioritized",
        action="store_true",
        help="use lazyframes.PrioritizedReplayBuffer (sample(beta=), update_priorities)",
    )
    p.add_argument("--alpha", type=float, default=0.6, help="priority exponent")
    p.add_argument("--beta", type=float, default=0.4, help="importance-sampling exponent")
    p.add_argument("--no-compress", action="store_true", help="send and store frames raw")
    p.add_argument("--seed", type=int, default=0, help="seed of envs, policies and replay")
    p.add_argument(
        "--address",
        default=None,
        help="Ray cluster to join (ray.init(address=...)); default: $RAY_ADDRESS, else a local Ray",
    )
    p.add_argument("--actor-cpus", type=float, default=1.0, help="CPUs reserved per actor")
    p.add_argument("--replay-cpus", type=float, default=1.0, help="CPUs of the replay actor")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="a short job on a local ray.init(num_cpus=2): 2 actors x 2 envs, 2 rounds",
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.num_actors, args.envs_per_actor = 2, 2
        args.rounds, args.steps_per_round, args.flush_every = 2, 150, 50
        args.capacity, args.learning_starts, args.max_learner_steps = 1_000, 200, 20
        args.actor_cpus = args.replay_cpus = 0.5
    try:
        check_args(args)
    except UsageError as e:
        p.exit(2, f"{p.prog}: error: {e}\n")
    return args


#: (options, test, what the test says): every number option and its valid range
RULES = [
    (
        ("num_actors", "envs_per_actor", "rounds", "steps_per_round", "flush_every"),
        lambda v: v >= 1,
        ">= 1",
    ),
    (("batch_size", "n_step"), lambda v: v >= 1, ">= 1"),
    (
        ("learning_starts", "max_learner_steps", "seed", "alpha", "actor_cpus", "replay_cpus"),
        lambda v: v >= 0,
        ">= 0",
    ),
    (("lr",), lambda v: v > 0, "> 0"),
    (("gamma", "beta"), lambda v: 0 <= v <= 1, "in [0, 1]"),
]


def check_args(args) -> None:
    """Refuse, before any work (before Ray starts), what would make the run fail.

    Numbers first, then the packages (one line naming every missing one and the command
    that installs them), then the env id: an ALE game, as the actors' wrappers need.

    Raises:
        UsageError: the message names the option, or the packages and the command.
    """
    for names, ok, what in RULES:
        for name in names:
            value = getattr(args, name)
            if not ok(value):  # NaN too
                raise UsageError(f"--{name.replace('_', '-')} must be {what}, got {value}")
    num_envs = args.num_actors * args.envs_per_actor
    if args.capacity < num_envs:
        raise UsageError(
            f"--capacity ({args.capacity}) must be at least the number of envs "
            f"(--num-actors x --envs-per-actor = {num_envs})"
        )
    rounded = args.capacity // num_envs * num_envs  # the buffer's own rounding
    if args.n_step > rounded:
        raise UsageError(
            f"--n-step ({args.n_step}) must be at most the capacity ({rounded}: --capacity "
            "rounded down to a multiple of the number of envs)"
        )

    wanted = ("ray", "lazyframes", "gymnasium", "ale_py", "cv2")
    missing = [m for m in wanted if importlib.util.find_spec(m) is None]
    if missing:
        names = {"ale_py": "ale-py", "cv2": "opencv-python-headless"}
        raise UsageError(
            f"needs {', '.join(names.get(m, m) for m in missing)}, not installed: "
            + (INSTALL_WITH_OPENCV if "cv2" in missing else INSTALL)
        )
    try:
        import lazyframes  # noqa: F401
    except ImportError as e:  # a clone whose core is not built: the message says how
        raise UsageError(str(e)) from None
    if args.prioritized:
        check_prioritized()
    import ale_py
    import gymnasium as gym

    if tuple(int(x) for x in re.findall(r"\d+", gym.__version__)[:2]) < (1, 1):
        raise UsageError(f"needs gymnasium >= 1.1 (installed: {gym.__version__}): {INSTALL}")
    gym.register_envs(ale_py)
    try:
        spec = gym.spec(args.env_id)
    except gym.error.Error as e:
        raise UsageError(f"--env-id {args.env_id!r}: {e}") from None
    if "ale_py" not in str(spec.entry_point):
        raise UsageError(
            f"--env-id {args.env_id!r} is not an ALE game: the actors' wrappers need one, "
            "e.g. ALE/Pong-v5"
        )
    check_reachable(args.address or os.environ.get("RAY_ADDRESS"), args.smoke)


def check_reachable(address: str | None, smoke: bool) -> None:
    """Refuse a cluster address ``host:port`` nothing answers on (Ray itself retries for minutes).

    ``auto``, a ``ray://`` client address without a port, or no address (a local Ray) are
    left to Ray.
    """
    m = re.fullmatch(r"(?:ray://)?\[?([^\[\]]+?)\]?:(\d+)", address or "")
    if smoke or m is None:
        return
    host, port = m.group(1), int(m.group(2))
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as e:
        raise UsageError(
            f"--address {address}: nothing answers there ({e}); start a cluster with "
            "`ray start --head` and pass the address it prints, or --address auto"
        ) from None


def epsilons(n: int) -> np.ndarray:
    """Ape-X's exploration rates: actor i acts with ``0.4 ** (1 + 7 i / (n - 1))``."""
    return 0.4 ** (1 + 7 * np.arange(n) / max(1, n - 1))


class LinearQ:
    """A tiny Q-function: linear in the observation average-pooled to ``(4, 21, 21)``.

    Enough to make the learner's sample -> TD error -> priority loop real without a GPU.
    """

    def __init__(self, n_actions: int, seed: int):
        rng = np.random.default_rng(seed)
        self.w = (rng.standard_normal((K * 21 * 21, n_actions)) * 1e-3).astype(np.float32)
        self.b = np.zeros(n_actions, np.float32)

    @staticmethod
    def features(obs: np.ndarray) -> np.ndarray:
        """uint8 ``(B, 4, 84, 84)`` -> float32 ``(B, 1764)`` in [0, 1]."""
        b = obs.shape[0]
        pooled = obs.reshape(b, K, 21, 4, 21, 4).mean(axis=(3, 5), dtype=np.float32)
        return pooled.reshape(b, -1) / 255.0

    def q(self, obs: np.ndarray) -> np.ndarray:
        return self.features(obs) @ self.w + self.b

    def td_step(self, s, lr: float) -> np.ndarray:
        """One semi-gradient step on ``s`` (a sample dict); returns the TD errors."""
        x = self.features(s["observations"])
        q = x @ self.w + self.b
        a = s["actions"].astype(np.int64)
        target = s["rewards"] + s["discounts"] * (1 - s["dones"]) * self.q(
            s["next_observations"]
        ).max(axis=1)
        td = target - q[np.arange(len(a)), a]
        g = td * s["weights"] * lr / len(a)
        np.add.at(self.w.T, a, g[:, None] * x)
        np.add.at(self.b, a, g)
        return td

    def get(self) -> tuple:
        return self.w, self.b

    def set(self, weights: tuple) -> None:
        self.w, self.b = (np.array(x) for x in weights)


class Actor:
    """An env worker: envs + lazyframes' stacker + epsilon-greedy policy + a Sender."""

    def __init__(self, env_id, num_envs, seed, epsilon, replay, stream, flush_every, compress):
        import ale_py
        import gymnasium as gym

        from lazyframes import vector as lf_vector
        from lazyframes.transport import Sender

        gym.register_envs(ale_py)

        def thunk():
            env = gym.make(env_id, frameskip=1)
            env = gym.wrappers.AtariPreprocessing(
                env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True
            )
            return gym.wrappers.TransformReward(env, lambda r: float(np.sign(r)))

        envs = gym.vector.SyncVectorEnv([thunk for _ in range(num_envs)])
        self.envs = lf_vector.FrameStackObservation(envs, K)  # LazyBatch (E, 4, 84, 84)
        self.obs, _ = self.envs.reset(seed=seed)
        self.n = num_envs
        self.n_actions = int(self.envs.single_action_space.n)
        self.rng = np.random.default_rng(seed)
        self.eps = float(epsilon)
        self.q = LinearQ(self.n_actions, seed)
        self.replay = replay
        self.sender = Sender(
            num_envs=num_envs, stream=stream, compress=compress, action_dtype=np.uint8
        )
        self.flush_every = flush_every
        self.ended = np.zeros(num_envs, np.bool_)  # NEXT_STEP autoreset: placeholder next
        self.in_flight: list = []
        self.stats = {"transitions": 0, "wire_bytes": 0, "naive_bytes": 0, "messages": 0}

    def num_actions(self) -> int:
        return self.n_actions

    def totals(self) -> dict:
        """Transitions, messages and bytes sent so far (and what stacked obs would cost)."""
        return dict(self.stats)

    def run(self, steps: int, weights) -> dict:
        """``steps`` vector steps; messages go straight to the replay actor."""
        import ray

        if weights is not None:
            self.q.set(weights)
        for t in range(steps):
            greedy = self.q.q(np.asarray(self.obs)).argmax(axis=1)
            explore = self.rng.random(self.n) < self.eps
            actions = np.where(explore, self.rng.integers(0, self.n_actions, self.n), greedy)
            nxt, rew, term, trunc, _ = self.envs.step(actions)
            self.sender.add(self.obs, actions, rew, nxt, term, trunc, autoreset=self.ended)
            self.ended = np.logical_or(term, trunc)
            self.obs = nxt
            if (t + 1) % self.flush_every == 0 or t + 1 == steps:
                self._send(ray)
        ray.get(self.in_flight)  # every message of the round ingested
        self.in_flight = []
        return self.totals()

    def _send(self, ray) -> None:
        from lazyframes.transport import wire_bytes

        msg = self.sender.flush()
        if msg is None:
            return
        T = msg["transitions"]
        self.stats["transitions"] += T
        self.stats["wire_bytes"] += wire_bytes(msg)
        self.stats["naive_bytes"] += naive_wire_bytes(T)
        self.stats["messages"] += 1
        if len(self.in_flight) >= 2:  # back-pressure: at most 2 messages in flight
            ray.get(self.in_flight.pop(0))
        self.in_flight.append(self.replay.ingest.remote(msg))


def naive_wire_bytes(T: int) -> int:
    """What an actor that sends stacked obs and next_obs pays for ``T`` transitions."""
    from lazyframes.transport import wire_bytes

    return wire_bytes(
        {
            "obs": np.zeros((T, *OBS_SHAPE), np.uint8),
            "next_obs": np.zeros((T, *OBS_SHAPE), np.uint8),
            "action": np.zeros(T, np.uint8),
            "reward": np.zeros(T, np.float32),
            "terminated": np.zeros(T, np.bool_),
            "truncated": np.zeros(T, np.bool_),
        }
    )


def check_prioritized() -> None:
    """Raises UsageError, saying why, when lazyframes has no PrioritizedReplayBuffer."""
    import lazyframes

    if not hasattr(lazyframes, "PrioritizedReplayBuffer"):
        raise UsageError(
            "--prioritized needs lazyframes.PrioritizedReplayBuffer, which this lazyframes "
            f"({lazyframes.__version__}) does not have; run without --prioritized"
        )


class Replay:
    """The replay actor: a compressed (optionally prioritized) buffer behind a Receiver."""

    def __init__(self, capacity, num_envs, n_step, gamma, seed, prioritized, alpha, compress):
        import lazyframes
        from lazyframes.transport import Receiver

        kwargs = {
            "num_envs": num_envs,
            "n_step": n_step,
            "gamma": gamma,
            "seed": seed,
            "compress": compress,
            "action_dtype": np.uint8,
        }
        if prioritized:
            check_prioritized()  # again here: the replay's node may have another lazyframes
            self.rb = lazyframes.PrioritizedReplayBuffer(capacity, alpha=alpha, **kwargs)
        else:
            self.rb = lazyframes.ReplayBuffer(capacity, **kwargs)
        self.prioritized = prioritized
        self.rx = Receiver(self.rb, frame_shape=OBS_SHAPE[1:])  # fixed here, never by a message
        self.ingest_s = 0.0
        self.ingested = 0
        self.sample_s: list = []

    def open(self, num_envs: int) -> int:
        return self.rx.open(num_envs)

    def ingest(self, msg) -> int:
        t0 = time.perf_counter()
        n = self.rx.ingest(msg)
        self.ingest_s += time.perf_counter() - t0
        self.ingested += n
        return n

    def size(self) -> int:
        return len(self.rb)

    def sample(self, batch_size: int, beta: float) -> dict:
        t0 = time.perf_counter()
        if self.prioritized:
            s = self.rb.sample(batch_size, beta=beta)
            weights = np.asarray(s.weights, np.float32)
        else:
            s = self.rb.sample(batch_size)
            weights = np.ones(batch_size, np.float32)
        self.sample_s.append(time.perf_counter() - t0)
        return {
            "observations": s.observations.copy(),  # the buffer reuses its arrays
            "next_observations": s.next_observations.copy(),
            "actions": s.actions,
            "rewards": s.rewards,
            "dones": s.dones,
            "discounts": s.discounts,
            "indices": s.indices,
            "weights": weights,
        }

    def update_priorities(self, indices, priorities) -> None:
        self.rb.update_priorities(indices, priorities)

    def stats(self) -> dict:
        mem = self.rb.memory()
        return {
            "transitions": len(self.rb),
            "ingested": self.ingested,
            "ingest_s": self.ingest_s,
            "sample_us": 1e6 * statistics.median(self.sample_s) if self.sample_s else 0.0,
            "bytes_per_transition": mem["bytes_per_transition"],
            "cold_bytes_per_frame": mem["cold_bytes"] / max(1, mem["cold_frames"]),
        }


def main(argv=None) -> None:
    args = parse_args(argv)
    import ray

    address = args.address or os.environ.get("RAY_ADDRESS")
    if args.smoke or not address:
        ray.init(num_cpus=2 if args.smoke else None, include_dashboard=False)
    else:
        ray.init(address=address)
    num_envs = args.num_actors * args.envs_per_actor
    replay = (
        ray.remote(Replay)
        .options(num_cpus=args.replay_cpus)
        .remote(
            args.capacity,
            num_envs,
            args.n_step,
            args.gamma,
            args.seed,
            args.prioritized,
            args.alpha,
            not args.no_compress,
        )
    )
    remote_actor = ray.remote(Actor).options(num_cpus=args.actor_cpus)
    actors = [
        remote_actor.remote(
            args.env_id,
            args.envs_per_actor,
            args.seed + 1000 * i,
            eps,
            replay,
            ray.get(replay.open.remote(args.envs_per_actor)),
            args.flush_every,
            not args.no_compress,
        )
        for i, eps in enumerate(epsilons(args.num_actors))
    ]
    q = LinearQ(ray.get(actors[0].num_actions.remote()), args.seed)
    rtts: list = []
    learner_steps = 0
    t_start = time.perf_counter()
    for _ in range(args.rounds):
        weights = ray.put(q.get())
        pending = [a.run.remote(args.steps_per_round, weights) for a in actors]
        while pending:
            _, pending = ray.wait(pending, timeout=0)
            if (
                learner_steps >= args.max_learner_steps
                or ray.get(replay.size.remote()) < args.learning_starts
            ):
                ray.wait(pending, timeout=0.2)
                continue
            t0 = time.perf_counter()
            s = ray.get(replay.sample.remote(args.batch_size, args.beta))
            rtts.append(time.perf_counter() - t0)
            td = q.td_step(s, args.lr)
            if args.prioritized:
                replay.update_priorities.remote(s["indices"], np.abs(td) + 1e-6)
            learner_steps += 1
    wall = time.perf_counter() - t_start
    per_actor = ray.get([a.totals.remote() for a in actors])
    st = ray.get(replay.stats.remote())
    sent = sum(a["transitions"] for a in per_actor)
    wire = sum(a["wire_bytes"] for a in per_actor) / max(1, sent)
    naive = sum(a["naive_bytes"] for a in per_actor) / max(1, sent)
    print(
        f"apex_ray: actors={args.num_actors} envs={num_envs} transitions={st['ingested']} "
        f"learner_steps={learner_steps} ingest_per_s={st['ingested'] / wall:.0f} "
        f"replay_ingest_per_s={st['ingested'] / max(st['ingest_s'], 1e-9):.0f} "
        f"wire_bytes_per_transition={wire:.0f} naive_bytes_per_transition={naive:.0f} "
        f"wire_ratio={naive / max(wire, 1e-9):.0f} sample_us={st['sample_us']:.0f} "
        f"sample_rtt_ms={1e3 * statistics.median(rtts) if rtts else 0.0:.1f} "
        f"replay_bytes_per_transition={st['bytes_per_transition']:.0f} "
        f"cold_bytes_per_frame={st['cold_bytes_per_frame']:.0f} "
        f"prioritized={args.prioritized}",
        flush=True,
    )
    ray.shutdown()


if __name__ == "__main__":
    main()
