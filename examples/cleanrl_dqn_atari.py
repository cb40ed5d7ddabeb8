"""A DQN in the shape of CleanRL's ``dqn_atari.py``, on Gymnasium 1.x, with lazyframes' buffer.

This is our script, not CleanRL's: it follows CleanRL's single-file DQN (docs at
https://docs.cleanrl.dev/rl-algorithms/dqn/#dqn_ataripy) line for line where it can, and
differs in three groups (docs/SB3.md shows the one-line change to CleanRL's own file):

lazyframes (two changes; the first alone is the switch):

- ``from cleanrl_utils.buffers import ReplayBuffer`` (CleanRL's copy of SB3's) ->
  ``from lazyframes.cleanrl import ReplayBuffer`` (same constructor, ``add`` and ``sample``;
  each frame stored once, and with CleanRL's ``optimize_memory_usage=True`` compressed:
  about 0.2 KB per transition instead of 28 KB; it needs torch, not SB3);
- the copy of the batch with the final observations of the truncated envs put in,

  .. code-block:: python

      real_next_obs = next_obs.copy()
      for idx, trunc in enumerate(truncations):
          if trunc:
              real_next_obs[idx] = infos["final_observation"][idx]
      rb.add(obs, real_next_obs, actions, rewards, terminations, infos)

  becomes one call that reads only those rows (``next_obs`` is stored as it is):

  .. code-block:: python

      rb.add(obs, next_obs, actions, rewards, terminations, infos,
             final_obs=infos.get("final_obs"), final_mask=truncations)

Gymnasium 1.x (needed by any user of current Gymnasium, lazyframes or not):

- ``gym.register_envs(ale_py)``; ``GrayScaleObservation`` -> ``GrayscaleObservation``,
  ``FrameStack`` -> ``FrameStackObservation``;
- ``SyncVectorEnv(..., autoreset_mode=SAME_STEP)``: 1.x defaults to next-step autoreset,
  where ``final_observation`` no longer exists; same-step keeps CleanRL's logic, with
  the keys ``final_obs`` and ``final_info`` (a dict of arrays with ``_episode`` masks).

This repository (so the script runs and is tested without CleanRL's own extras):

- ``tyro.cli(Args)`` -> :func:`parse_args`, the same flags from the same dataclass with
  argparse (tyro is not a dependency here); ``--torch-threads`` added (on a 2-core
  CPU one thread makes a gradient step several times faster than torch's default);
- tensorboard's ``SummaryWriter`` is used when tensorboard is installed, otherwise
  scalars are dropped (episode returns and SPS are printed either way);
- ``cleanrl_utils.atari_wrappers`` -> SB3's ``atari_wrappers``, of which CleanRL's are a copy;
- a missing package is a one-line error naming the install commands;
- the Weights & Biases, video, model-saving and Hugging Face options are left out.

The defaults are CleanRL's (10M steps, a 1M buffer, 80k learning starts: days on a
CPU). Needs ``python -m pip install -e '.[atari,sb3]'`` and a CPU torch. A short run:

    python examples/cleanrl_dqn_atari.py --total-timesteps 20000 --learning-starts 2000 \
        --buffer-size 20000 --torch-threads 1
"""

import argparse
import dataclasses
import importlib.util
import os
import random
import sys
import time
from dataclasses import dataclass

# a missing extra is one line naming the command, not a traceback (--help too)
if _missing := [m for m in ("torch", "ale_py", "stable_baselines3", "lazyframes")
                if importlib.util.find_spec(m) is None]:  # fmt: skip
    sys.stderr.write(
        f"cleanrl_dqn_atari.py: error: needs {', '.join(_missing)}, not installed: python -m "
        "pip install torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu && "
        "python -m pip install -e '.[atari,sb3]' (in the clone)\n"
    )
    sys.exit(2)

import ale_py
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from stable_baselines3.common.atari_wrappers import (
    ClipRewardEnv,
    EpisodicLifeEnv,
    FireResetEnv,
    MaxAndSkipEnv,
    NoopResetEnv,
)

from lazyframes.cleanrl import ReplayBuffer

gym.register_envs(ale_py)


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=False`"""
    cuda: bool = True
    """if toggled, cuda will be enabled by default"""
    torch_threads: int = 0
    """torch.set_num_threads (0: torch's default)"""

    # Algorithm specific arguments
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the environment"""
    total_timesteps: int = 10000000
    """total timesteps of the experiments"""
    learning_rate: float = 1e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel game environments"""
    buffer_size: int = 1000000
    """the replay memory buffer size"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 1.0
    """the target network update rate"""
    target_network_frequency: int = 1000
    """the timesteps it takes to update the target network"""
    batch_size: int = 32
    """the batch size of sample from the reply memory"""
    start_e: float = 1
    """the starting epsilon for exploration"""
    end_e: float = 0.01
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.10
    """the fraction of `total-timesteps` it takes from start-e to go end-e"""
    learning_starts: int = 80000
    """timestep to start learning"""
    train_frequency: int = 4
    """the frequency of training"""


def parse_args(argv=None) -> Args:
    """The flags of ``Args`` (``--total-timesteps`` for ``total_timesteps``), as tyro makes them."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for f in dataclasses.fields(Args):
        flag = "--" + f.name.replace("_", "-")
        if f.type is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            p.add_argument(flag, type=type(f.default), default=f.default, help="(%(default)s)")
    return Args(**vars(p.parse_args(argv)))


def make_env(env_id, seed, idx, capture_video, run_name):
    def thunk():
        env = gym.make(env_id)
        env = gym.wrappers.RecordEpisodeStatistics(env)

        env = NoopResetEnv(env, noop_max=30)
        env = MaxAndSkipEnv(env, skip=4)
        env = EpisodicLifeEnv(env)
        if "FIRE" in env.unwrapped.get_action_meanings():
            env = FireResetEnv(env)
        env = ClipRewardEnv(env)
        env = gym.wrappers.ResizeObservation(env, (84, 84))
        env = gym.wrappers.GrayscaleObservation(env)
        env = gym.wrappers.FrameStackObservation(env, 4)

        env.action_space.seed(seed)
        return env

    return thunk


# ALGO LOGIC: initialize agent here:
class QNetwork(nn.Module):
    def __init__(self, env):
        super().__init__()
        self.network = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(3136, 512),
            nn.ReLU(),
            nn.Linear(512, env.single_action_space.n),
        )

    def forward(self, x):
        return self.network(x / 255.0)


def linear_schedule(start_e: float, end_e: float, duration: int, t: int):
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


class _NoWriter:
    """Stands in for tensorboard's SummaryWriter when tensorboard is not installed."""

    def add_scalar(self, *args):
        pass

    def close(self):
        pass


if __name__ == "__main__":
    args = parse_args()
    assert args.num_envs == 1, "vectorized envs are not supported at the moment"
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    try:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(f"runs/{run_name}")
    except ImportError:
        writer = _NoWriter()

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)  # noqa: NPY002 - the generator lazyframes.sb3 samples from, as SB3
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    # env setup
    envs = gym.vector.SyncVectorEnv(
        [make_env(args.env_id, args.seed + i, i, False, run_name) for i in range(args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    assert isinstance(envs.single_action_space, gym.spaces.Discrete), (
        "only discrete action space is supported"
    )

    q_network = QNetwork(envs).to(device)
    optimizer = optim.Adam(q_network.parameters(), lr=args.learning_rate)
    target_network = QNetwork(envs).to(device)
    target_network.load_state_dict(q_network.state_dict())

    rb = ReplayBuffer(
        args.buffer_size,
        envs.single_observation_space,
        envs.single_action_space,
        device,
        optimize_memory_usage=True,
        handle_timeout_termination=False,
    )
    start_time = time.time()

    # TRY NOT TO MODIFY: start the game
    obs, _ = envs.reset(seed=args.seed)
    for global_step in range(args.total_timesteps):
        # ALGO LOGIC: put action logic here
        epsilon = linear_schedule(
            args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step
        )
        if random.random() < epsilon:
            actions = np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)])
        else:
            q_values = q_network(torch.Tensor(obs).to(device))
            actions = torch.argmax(q_values, dim=1).cpu().numpy()

        # TRY NOT TO MODIFY: execute the game and log data.
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)

        # TRY NOT TO MODIFY: record rewards for plotting purposes
        if "final_info" in infos and "episode" in infos["final_info"]:
            final = infos["final_info"]
            for i in np.flatnonzero(final["_episode"]):
                r, length = final["episode"]["r"][i], final["episode"]["l"][i]
                print(f"global_step={global_step}, episodic_return={r}", flush=True)
                writer.add_scalar("charts/episodic_return", r, global_step)
                writer.add_scalar("charts/episodic_length", length, global_step)

        # TRY NOT TO MODIFY: save data to reply buffer; handle `final_obs`
        rb.add(obs, next_obs, actions, rewards, terminations, infos,
               final_obs=infos.get("final_obs"), final_mask=truncations)  # fmt: skip

        # TRY NOT TO MODIFY: CRUCIAL step easy to overlook
        obs = next_obs

        # ALGO LOGIC: training.
        if global_step > args.learning_starts:
            if global_step % args.train_frequency == 0:
                data = rb.sample(args.batch_size)
                with torch.no_grad():
                    target_max, _ = target_network(data.next_observations).max(dim=1)
                    td_target = data.rewards.flatten() + args.gamma * target_max * (
                        1 - data.dones.flatten()
                    )
                old_val = q_network(data.observations).gather(1, data.actions).squeeze()
                loss = F.mse_loss(td_target, old_val)

                if global_step % 100 == 0:
                    writer.add_scalar("losses/td_loss", loss, global_step)
                    writer.add_scalar("losses/q_values", old_val.mean().item(), global_step)
                    print("SPS:", int(global_step / (time.time() - start_time)), flush=True)
                    writer.add_scalar(
                        "charts/SPS", int(global_step / (time.time() - start_time)), global_step
                    )

                # optimize the model
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

            # update target network
            if global_step % args.target_network_frequency == 0:
                for target_network_param, q_network_param in zip(
                    target_network.parameters(), q_network.parameters(), strict=True
                ):
                    target_network_param.data.copy_(
                        args.tau * q_network_param.data
                        + (1.0 - args.tau) * target_network_param.data
                    )

    envs.close()
    writer.close()
