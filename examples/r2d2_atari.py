"""R2D2-style recurrent Q-learning on Atari (Kapturowski et al. 2019), with lazyframes' windows.

A CPU-sized sketch of R2D2's replay, not its scale: one learner, a few vector envs, no
distributed actors. What it shows is the data path:

- frames are stacked by ``lazyframes.vector.FrameStackObservation`` and stored once in a
  ``lazyframes.PrioritizedReplayBuffer`` (one new frame per step, compressed with
  ``--compress``);
- each gradient step draws ``--batch-size`` windows of ``--burn-in + --length`` consecutive
  steps with ``rb.sample_sequences`` (by priority), straight into the float32 input tensor
  (``dtype=np.float32, scale=1/255``: ``(B, T, 4, 84, 84)``);
- the LSTM starts each window from a zero state, is unrolled over the burn-in without
  gradients (R2D2's "burn-in" strategy: no stored recurrent state), then over the window;
  the loss is double-Q 1-step TD on the steps ``mask`` marks as the window's episode;
- priorities are R2D2's mix of the window's TD errors,
  ``lazyframes.replay.sequence_priority(td, mask, eta=0.9)``, updated by window id.

Needs torch (``python -m pip install torch==2.13.0 --extra-index-url
https://download.pytorch.org/whl/cpu``) and, from the clone, ``python -m pip install -e
'.[atari]'``. Every option is checked before any work (one ``r2d2_atari.py: error: ...``
line and exit status 2 for a mistake).

Example (a few minutes on 2 cores):
    python examples/r2d2_atari.py --env-id ALE/Pong-v5 --total-timesteps 20000
"""

from __future__ import annotations

import time

import numpy as np
from dqn_atari import _Parser, linear_schedule, make_env, parse_checked

RULES = [
    (("num_envs", "buffer_size", "batch_size", "length", "train_frequency",
      "target_network_frequency", "hidden", "total_timesteps"), lambda v: v >= 1, ">= 1"),
    (("learning_starts", "burn_in", "torch_threads", "seed"),
     lambda v: v >= 0, ">= 0"),
    (("learning_rate",), lambda v: v > 0, "> 0"),
    (("gamma", "eta", "alpha", "beta", "start_e", "end_e"), lambda v: 0 <= v <= 1, "in [0, 1]"),
]  # fmt: skip


def parse_args(argv=None):
    p = _Parser(description=__doc__.split("\n")[0])
    p.add_argument("--env-id", default="ALE/Pong-v5", help="ALE environment id")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--total-timesteps", type=int, default=20_000, help="env steps over all envs")
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument("--buffer-size", type=int, default=20_000, help="replay capacity (steps)")
    p.add_argument("--compress", action="store_true", help="compress the stored frames")
    p.add_argument("--batch-size", type=int, default=16, help="windows per gradient step")
    p.add_argument("--burn-in", type=int, default=8, help="steps unrolled without gradients")
    p.add_argument("--length", type=int, default=16, help="steps trained on per window")
    p.add_argument("--hidden", type=int, default=128, help="LSTM units")
    p.add_argument("--learning-rate", type=float, default=1e-4)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--alpha", type=float, default=0.9, help="priority exponent (R2D2: 0.9)")
    p.add_argument("--beta", type=float, default=0.6, help="importance exponent (R2D2: 0.6)")
    p.add_argument("--eta", type=float, default=0.9, help="max/mean mix of window priorities")
    p.add_argument("--start-e", type=float, default=1.0)
    p.add_argument("--end-e", type=float, default=0.05)
    p.add_argument("--learning-starts", type=int, default=1_000, help="vector steps first")
    p.add_argument("--train-frequency", type=int, default=4, help="vector steps per update")
    p.add_argument("--target-network-frequency", type=int, default=250, help="updates")
    p.add_argument("--torch-threads", type=int, default=1, help="0: torch's default")
    args = parse_checked(p, argv, RULES)
    T = args.burn_in + args.length  # a window's steps, all in one env stream
    if args.learning_starts < T:
        p.exit(2, f"{p.prog}: error: --learning-starts ({args.learning_starts}) must be at "
                  f"least --burn-in + --length ({T}), the steps of a window\n")  # fmt: skip
    if args.buffer_size < args.num_envs * T:
        p.exit(2, f"{p.prog}: error: --buffer-size ({args.buffer_size}) must be at least "
                  f"--num-envs x (--burn-in + --length) ({args.num_envs * T}): each env's "
                  f"share holds whole windows\n")  # fmt: skip
    return args


def recurrent_q(n_actions: int, hidden: int):
    """Nature-CNN torso, an LSTM, a Q head: ``(B, T, 4, 84, 84), state -> (B, T, A), state``."""
    import torch
    from torch import nn

    class RecurrentQ(nn.Module):
        def __init__(self):
            super().__init__()
            self.torso = nn.Sequential(
                nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(),
                nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
                nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(),
                nn.Linear(3136, hidden), nn.ReLU(),
            )  # fmt: skip
            self.lstm = nn.LSTM(hidden, hidden, batch_first=True)
            self.head = nn.Linear(hidden, n_actions)

        def forward(self, x: torch.Tensor, state=None):
            B, T = x.shape[:2]
            z = self.torso(x.reshape(B * T, *x.shape[2:])).reshape(B, T, -1)
            out, state = self.lstm(z, state)
            return self.head(out), state

    return RecurrentQ()


def main(argv=None) -> dict:
    args = parse_args(argv)
    import gymnasium as gym
    import torch

    import lazyframes
    from lazyframes import vector as lf_vector
    from lazyframes.replay import sequence_priority

    rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    n, T, burn = args.num_envs, args.burn_in + args.length, args.burn_in
    envs = gym.vector.SyncVectorEnv([make_env(args.env_id, args.seed + i) for i in range(n)])
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    envs = lf_vector.FrameStackObservation(envs, 4)
    n_actions = int(envs.single_action_space.n)
    q, target = recurrent_q(n_actions, args.hidden), recurrent_q(n_actions, args.hidden)
    target.load_state_dict(q.state_dict())
    optimizer = torch.optim.Adam(q.parameters(), lr=args.learning_rate, eps=1e-3)
    rb = lazyframes.PrioritizedReplayBuffer(
        args.buffer_size, alpha=args.alpha, num_envs=n, gamma=args.gamma, seed=args.seed,
        compress=args.compress,
    )  # fmt: skip
    obs_t = torch.empty((n, 1, 4, 84, 84))  # the acting input, one step per env
    b_obs = torch.empty((args.batch_size, T, 4, 84, 84))  # the windows, filled in place

    obs, _ = envs.reset(seed=args.seed)
    state = None  # the acting LSTM state, reset per env at episode ends
    prev_done = np.zeros(n, bool)
    vec_steps = max(1, args.total_timesteps // n)
    updates, returns, loss = 0, [], torch.zeros(())
    start = time.time()
    for step in range(vec_steps):
        obs.numpy(out=obs_t.numpy()[:, 0], dtype=np.float32, scale=1 / 255)
        with torch.no_grad():
            qs, state = q(obs_t, state)
        eps = linear_schedule(args.start_e, args.end_e, vec_steps // 2, step)
        actions = np.where(rng.random(n) < eps, rng.integers(n_actions, size=n),
                           qs[:, 0].argmax(1).numpy())  # fmt: skip
        next_obs, rewards, term, trunc, infos = envs.step(actions)
        rb.add(obs, actions, rewards, next_obs, term, trunc, autoreset=prev_done)
        prev_done = term | trunc
        keep = torch.from_numpy(~prev_done).float().view(1, n, 1)
        state = tuple(s * keep for s in state)  # a new episode starts from zeros
        obs = next_obs
        if "episode" in infos:
            returns += [float(infos["episode"]["r"][i]) for i in np.flatnonzero(infos["_episode"])]

        if step >= args.learning_starts and step % args.train_frequency == 0:
            beta = args.beta + (1 - args.beta) * step / vec_steps
            s = rb.sample_sequences(args.batch_size, args.length, burn_in=burn, beta=beta,
                                    out=b_obs.numpy(), dtype=np.float32, scale=1 / 255)  # fmt: skip
            with torch.no_grad():  # burn-in: both networks' states from the window's start
                _, hq = q(b_obs[:, :burn]) if burn else (None, None)
                _, ht = target(b_obs[:, :burn]) if burn else (None, None)
                q_next, _ = target(b_obs[:, burn:], ht)
            q_all, _ = q(b_obs[:, burn:], hq)
            act = torch.from_numpy(s.actions[:, burn:].astype(np.int64))
            q_taken = q_all.gather(2, act.unsqueeze(2)).squeeze(2)[:, :-1]
            best = q_all.detach().argmax(2, keepdim=True)
            v_next = q_next.gather(2, best).squeeze(2)[:, 1:]  # double Q
            r, d = (torch.from_numpy(a[:, burn:-1]) for a in (s.rewards, s.dones))
            td = r + args.gamma * (1 - d) * v_next - q_taken
            m = torch.from_numpy(s.mask[:, burn:-1])
            w = torch.from_numpy(s.weights).unsqueeze(1)
            loss = (w * m * td.pow(2)).sum() / m.sum().clamp(min=1)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(q.parameters(), 40.0)
            optimizer.step()
            prio = sequence_priority(td.detach().numpy(), s.mask[:, burn:-1], eta=args.eta)
            rb.update_priorities(s.indices, prio)
            updates += 1
            if updates % args.target_network_frequency == 0:
                target.load_state_dict(q.state_dict())
    envs.close()
    seconds = time.time() - start
    summary = {
        "env_steps": vec_steps * n,
        "gradient_steps": updates,
        "episodes": len(returns),
        "final_loss": float(loss.item()),
        "replay_bytes_per_step": rb.memory()["bytes_per_transition"],
        "steps_per_s": vec_steps * n / seconds,
    }
    print(
        f"r2d2_atari summary: {summary['env_steps']} env steps, {updates} gradient steps on "
        f"{args.batch_size} windows of {T} steps, {len(returns)} episodes, final loss "
        f"{summary['final_loss']:.4f}, {summary['steps_per_s']:.0f} steps/s, replay "
        f"{len(rb)} steps at {summary['replay_bytes_per_step']:,.0f} B each",
        flush=True,
    )
    return summary


if __name__ == "__main__":
    main()
