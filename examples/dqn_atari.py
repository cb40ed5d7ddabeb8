"""DQN on Atari (Mnih et al. 2015) in the style of CleanRL's ``dqn_atari.py``, with lazyframes.

The differences from CleanRL's script are the data path only:

- frames are stacked by ``lazyframes.vector.FrameStackObservation`` (each frame stored
  once in a refcounted pool; observations are ``LazyBatch``es of references to them);
- transitions go to ``lazyframes.ReplayBuffer``, which stores frame references instead of frames
  (about 7 KB per transition instead of SB3's 28 KB), keeps the real next observation
  of truncated episodes, and samples straight into the network's float32 input
  tensors (``dtype=np.float32, scale=1/255``: conversion fused into the copy, no
  ``x / 255.0`` in the network).

With ``--prioritized`` the buffer is ``lazyframes.PrioritizedReplayBuffer`` (Schaul et al.,
2016, proportional): transitions are drawn in proportion to ``priority ** alpha``, the
squared TD errors are weighted by the importance weights ``data.weights`` (``beta``
annealed from ``--beta`` to 1 over the run), and the priorities are set to
``|TD error| + --priority-eps`` after each gradient step.

Under Gymnasium 1.x's default NEXT_STEP autoreset the step after an episode ends
returns the reset observation; that (final -> reset) pair is not a transition, so it is
stored as a placeholder the buffer never samples (``autoreset=`` mask), as CleanRL skips it.

Needs torch (its CPU build: ``python -m pip install torch==2.13.0 --extra-index-url
https://download.pytorch.org/whl/cpu``) and, from the clone, ``python -m pip install -e
'.[atari]'`` (ale-py, opencv). Every option is checked before any work: a bad number, an
env id that is not an ALE game or a missing package (with the command that installs it)
ends the script with one ``dqn_atari.py: error: ...`` line and exit status 2.

Example (CPU-sized defaults, about 15 minutes on 2 cores; ``--help`` shows them):
    python examples/dqn_atari.py --env-id ALE/Breakout-v5
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import re
import time
from typing import NoReturn

import numpy as np

# torch, gymnasium, ALE and lazyframes are imported by main(), once the options are checked

INSTALL_TORCH = (
    "python -m pip install torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu"
)
INSTALL_ATARI = "python -m pip install -e '.[atari]'"  # from the clone
INSTALL_JAX = "python -m pip install jax"


class UsageError(ValueError):
    """A user mistake found before the run: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, whose errors are one line (no usage block), like the script's own checks."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def parse_args(argv=None):
    """The options, checked (:func:`check_options`); a mistake exits with one line, status 2."""
    p = _Parser(
        description="CleanRL-style DQN on Atari with lazyframes' stacker and replay buffer. "
        "The defaults are sized for a CPU (about 15 minutes on 2 cores); the DQN paper's "
        "run is --total-timesteps 10000000 --buffer-size 1000000 --learning-starts 80000 "
        "on a GPU.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--env-id", default="ALE/Breakout-v5", help="ALE environment id")
    p.add_argument("--seed", type=int, default=1, help="seed of the envs, torch, numpy, buffer")
    p.add_argument(
        "--total-timesteps", type=int, default=50_000, help="env steps, summed over the envs"
    )
    p.add_argument("--num-envs", type=int, default=1, help="parallel envs in a SyncVectorEnv")
    p.add_argument("--learning-rate", type=float, default=1e-4, help="Adam learning rate")
    p.add_argument("--buffer-size", type=int, default=50_000, help="replay capacity")
    p.add_argument("--gamma", type=float, default=0.99, help="discount factor")
    p.add_argument("--tau", type=float, default=1.0, help="target update rate (1.0: hard copy)")
    p.add_argument(
        "--target-network-frequency",
        type=int,
        default=1000,
        help="vector steps between target network updates",
    )
    p.add_argument("--batch-size", type=int, default=32, help="transitions per gradient step")
    p.add_argument("--start-e", type=float, default=1.0, help="initial epsilon")
    p.add_argument("--end-e", type=float, default=0.01, help="final epsilon")
    p.add_argument(
        "--exploration-fraction",
        type=float,
        default=0.10,
        help="fraction of the run over which epsilon decays linearly",
    )
    p.add_argument(
        "--learning-starts", type=int, default=5_000, help="vector steps before the first update"
    )
    p.add_argument(
        "--train-frequency", type=int, default=4, help="vector steps between gradient steps"
    )
    p.add_argument(
        "--prioritized",
        action="store_true",
        help="prioritized replay (PrioritizedReplayBuffer) with importance weights in the loss",
    )
    p.add_argument("--alpha", type=float, default=0.6, help="priority exponent (--prioritized)")
    p.add_argument(
        "--beta", type=float, default=0.4, help="initial importance exponent, annealed to 1"
    )
    p.add_argument(
        "--priority-eps", type=float, default=1e-6, help="added to |TD error| as the priority"
    )
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch.set_num_threads; 0 keeps torch's default (one thread per core: on 2 "
        "cores a gradient step is several times slower than with 1)",
    )
    p.add_argument(
        "--progress-every", type=float, default=10.0, help="seconds between progress lines"
    )
    return parse_checked(p, argv, RULES)


#: (options, test, what the test says): every number option and its valid range
RULES = [
    (
        (
            "num_envs",
            "buffer_size",
            "batch_size",
            "target_network_frequency",
            "train_frequency",
            "total_timesteps",
        ),
        lambda v: v >= 1,
        ">= 1",
    ),
    (
        ("learning_starts", "torch_threads", "seed", "alpha", "progress_every"),
        lambda v: v >= 0,
        ">= 0",
    ),
    (("learning_rate", "priority_eps"), lambda v: v > 0, "> 0"),
    (
        ("gamma", "tau", "start_e", "end_e", "exploration_fraction", "beta"),
        lambda v: 0 <= v <= 1,
        "in [0, 1]",
    ),
]


#: the packages a script needs, in the order its messages name them
PACKAGES = ("torch", "lazyframes", "gymnasium", "ale_py", "cv2")


def parse_checked(p: argparse.ArgumentParser, argv, rules, packages=PACKAGES):
    """``p``'s options, checked (:func:`check_options`); a mistake exits with one line, status 2.

    What dqn_atari.py, r2d2_atari.py and jax_dqn.py share.
    """
    args = p.parse_args(argv)
    try:
        check_options(args, rules, packages)
    except UsageError as e:
        p.exit(2, f"{p.prog}: error: {e}\n")
    return args


def check_options(args, rules, packages=PACKAGES) -> None:
    """Refuse, before any work, what would make the run fail or mean nothing.

    Numbers first (``rules``), then the packages (one line naming every missing one and the
    commands that install them), then the env id: an ALE game, as the DQN recipe's wrappers
    need.

    Raises:
        UsageError: the message names the option, or the packages and the commands.
    """
    check_numbers(args, rules)
    if args.buffer_size < args.num_envs:
        raise UsageError(
            f"--buffer-size ({args.buffer_size}) must be at least --num-envs ({args.num_envs})"
        )
    check_packages(packages)
    check_ale_env_id(args.env_id)


def check_numbers(args, rules) -> None:
    """Each option of ``rules`` (``(names, test, what the test says)``) passes its test."""
    for names, ok, what in rules:
        for name in names:
            value = getattr(args, name)
            if not ok(value):  # NaN too
                raise UsageError(f"--{name.replace('_', '-')} must be {what}, got {value}")


def check_packages(packages=PACKAGES) -> None:
    """``packages`` import (lazyframes built), or one line names the missing and their commands."""
    missing = [m for m in packages if _missing(m)]
    if missing:
        own = {"torch": INSTALL_TORCH, "jax": INSTALL_JAX}  # the others: the atari extra
        commands = [own[m] for m in missing if m in own]
        commands += [INSTALL_ATARI] if set(missing) - set(own) else []
        names = {"ale_py": "ale-py", "cv2": "opencv-python-headless"}
        raise UsageError(
            f"needs {', '.join(names.get(m, m) for m in missing)}, not installed: "
            + " && ".join(commands)
        )
    try:
        import lazyframes  # noqa: F401  (every script needs it)
    except ImportError as e:  # a clone whose core is not built: the message says how
        raise UsageError(str(e)) from None


def _missing(module: str) -> bool:
    return importlib.util.find_spec(module) is None


def check_ale_env_id(env_id: str) -> None:
    """Refuse an env id that is not an ALE game (the DQN recipe's wrappers need one)."""
    import ale_py
    import gymnasium as gym

    if tuple(int(x) for x in re.findall(r"\d+", gym.__version__)[:2]) < (1, 1):
        raise UsageError(f"needs gymnasium >= 1.1 (installed: {gym.__version__}): {INSTALL_ATARI}")
    gym.register_envs(ale_py)
    try:
        spec = gym.spec(env_id)
    except gym.error.Error as e:
        hint = (
            ""
            if env_id.startswith("ALE/")
            else " (Atari games are ALE/<Game>-v5, e.g. ALE/Pong-v5)"
        )
        raise UsageError(f"--env-id {env_id!r}: {e}{hint}") from None
    if "ale_py" not in str(spec.entry_point):
        raise UsageError(
            f"--env-id {env_id!r} is not an ALE game: the DQN recipe's wrappers need one, "
            "e.g. ALE/Breakout-v5"
        )


def make_env(env_id: str, seed: int):
    import gymnasium as gym

    def thunk():
        env = gym.make(env_id, frameskip=1)
        # noop starts, frame skip 4 with max-pooling, 84x84 grayscale (the DQN recipe)
        env = gym.wrappers.AtariPreprocessing(
            env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True
        )
        env = gym.wrappers.TransformReward(env, lambda r: float(np.sign(r)))  # reward clipping
        env.action_space.seed(seed)
        return env

    return thunk


def nature_cnn(n_actions: int, k: int = 4):
    """The Nature-DQN CNN; input float32 (B, 4, 84, 84) already scaled to [0, 1]."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(k, 32, 8, stride=4),
        nn.ReLU(),
        nn.Conv2d(32, 64, 4, stride=2),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(3136, 512),
        nn.ReLU(),
        nn.Linear(512, n_actions),
    )


def linear_schedule(start_e: float, end_e: float, duration: int, t: int) -> float:
    slope = (end_e - start_e) / max(duration, 1)
    return max(slope * t + start_e, end_e)


def main(argv=None) -> dict:
    args = parse_args(argv)
    import gymnasium as gym
    import torch
    import torch.nn.functional as F

    import lazyframes
    from lazyframes import vector as lf_vector

    random.seed(args.seed)
    np.random.seed(args.seed)  # noqa: NPY002 - seeds the libraries that use the global RNG
    torch.manual_seed(args.seed)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    n = args.num_envs
    envs = gym.vector.SyncVectorEnv([make_env(args.env_id, args.seed + i) for i in range(n)])
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    envs = lf_vector.FrameStackObservation(envs, 4)  # LazyBatch observations (n, 4, 84, 84)
    assert isinstance(envs.single_action_space, gym.spaces.Discrete), "only discrete actions"
    n_actions = int(envs.single_action_space.n)

    q_network = nature_cnn(n_actions)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate)
    target_network = nature_cnn(n_actions)
    target_network.load_state_dict(q_network.state_dict())

    if args.prioritized:
        rb = lazyframes.PrioritizedReplayBuffer(
            args.buffer_size, alpha=args.alpha, num_envs=n, gamma=args.gamma, seed=args.seed
        )
    else:
        rb = lazyframes.ReplayBuffer(args.buffer_size, num_envs=n, gamma=args.gamma, seed=args.seed)
    # the network's input tensors, filled in place by lazyframes (no intermediate arrays)
    obs_t = torch.empty((n, 4, 84, 84), dtype=torch.float32)
    b_obs = torch.empty((args.batch_size, 4, 84, 84), dtype=torch.float32)
    b_next = torch.empty((args.batch_size, 4, 84, 84), dtype=torch.float32)

    start = time.time()
    obs, _ = envs.reset(seed=args.seed)
    prev_done = np.zeros(n, dtype=bool)
    vec_steps = max(1, args.total_timesteps // n)
    updates = episodes = 0
    returns = []
    loss = torch.zeros(())
    next_report = start + args.progress_every
    for global_step in range(vec_steps):
        epsilon = linear_schedule(
            args.start_e, args.end_e, int(args.exploration_fraction * vec_steps), global_step
        )
        if random.random() < epsilon:
            actions = envs.action_space.sample()
        else:
            obs.numpy(out=obs_t.numpy(), dtype=np.float32, scale=1 / 255)
            with torch.no_grad():
                actions = torch.argmax(q_network(obs_t), dim=1).numpy()

        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        if "episode" in infos:
            for i in np.flatnonzero(infos["_episode"]):
                episodes += 1
                returns.append(float(infos["episode"]["r"][i]))
                print(
                    f"global_step={global_step * n}, episodic_return={returns[-1]:.1f}",
                    flush=True,
                )

        # (final obs -> reset obs) after an autoreset is no transition: a placeholder never sampled
        rb.add(obs, actions, rewards, next_obs, terminations, truncations, autoreset=prev_done)
        prev_done = np.logical_or(terminations, truncations)
        obs = next_obs

        if global_step > args.learning_starts and global_step % args.train_frequency == 0:
            out = (b_obs.numpy(), b_next.numpy())
            if args.prioritized:
                beta = args.beta + (1.0 - args.beta) * global_step / vec_steps
                data = rb.sample(
                    args.batch_size, beta=beta, out=out, dtype=np.float32, scale=1 / 255
                )
            else:
                data = rb.sample(args.batch_size, out=out, dtype=np.float32, scale=1 / 255)
            with torch.no_grad():
                target_max, _ = target_network(b_next).max(dim=1)
                td_target = torch.from_numpy(data.rewards) + args.gamma * target_max * (
                    1 - torch.from_numpy(data.dones)
                )
            old_val = (
                q_network(b_obs).gather(1, torch.from_numpy(data.actions).view(-1, 1)).squeeze(1)
            )
            if args.prioritized:  # importance weights in the loss, |TD error| as priority
                td = td_target - old_val
                loss = (torch.from_numpy(data.weights) * td.pow(2)).mean()
                rb.update_priorities(data.indices, td.abs().detach().numpy() + args.priority_eps)
            else:
                loss = F.mse_loss(td_target, old_val)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            updates += 1

        now = time.time()
        if now >= next_report:
            next_report = now + args.progress_every
            done = global_step + 1
            eta = (now - start) / done * (vec_steps - done)
            print(
                f"global_step={done * n}/{vec_steps * n} ({100 * done / vec_steps:.0f}%), "
                f"SPS={done * n / (now - start):.0f}, ETA {eta / 60:.1f} min, "
                f"updates={updates}, td_loss={loss.item():.4f}",
                flush=True,
            )

        if global_step % args.target_network_frequency == 0:
            for tp, qp in zip(target_network.parameters(), q_network.parameters(), strict=True):
                tp.data.copy_(args.tau * qp.data + (1.0 - args.tau) * tp.data)

    envs.close()
    seconds = time.time() - start
    mem = rb.memory()
    summary = {
        "env_steps": vec_steps * n,
        "gradient_steps": updates,
        "episodes": episodes,
        "mean_return": float(np.mean(returns)) if returns else None,
        "final_loss": float(loss.item()),
        "steps_per_s": vec_steps * n / seconds,
        "replay_transitions": len(rb),
        "replay_bytes_per_transition": mem["bytes_per_transition"],
        "max_priority": rb.max_priority if args.prioritized else None,
    }
    print(
        f"dqn_atari summary: {summary['env_steps']} env steps, {updates} gradient steps, "
        f"{episodes} episodes"
        + (f" (mean return {summary['mean_return']:.1f})" if returns else "")
        + f", final td_loss {summary['final_loss']:.4f}, {summary['steps_per_s']:.0f} steps/s, "
        f"replay {len(rb)} transitions at {mem['bytes_per_transition']:,.0f} B each",
        flush=True,
    )
    if args.prioritized:
        print(f"prioritized replay: alpha {args.alpha}, max priority {rb.max_priority:.4f}")
    return summary


if __name__ == "__main__":
    main()
