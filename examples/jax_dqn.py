"""DQN on Atari in JAX, fed by lazyframes: ``sample(out=)`` into host arrays, then ``device_put``.

The data path a JAX (or Flax) learner uses with lazyframes:

- ``lazyframes.vector.FrameStackObservation`` stacks by reference, each frame stored once;
- ``ReplayBuffer.sample(B, out=(obs, next_obs), dtype=np.float32, scale=1/255)`` fills two
  preallocated host arrays in one C call (the conversion fused into the copy), which
  ``jax.device_put`` hands to the device (a no-op copy on the CPU backend);
- the learner is pure JAX: a small CNN written with ``jax.lax.conv_general_dilated``, its
  parameters a dict, one jitted SGD step on the Huber TD loss with a target network. (A Flax
  module and an optax optimiser slot in the same place.)

Needs JAX (``python -m pip install jax``) and, from the clone, ``python -m pip install -e
'.[atari]'``. Every option is checked before any work (one ``jax_dqn.py: error: ...`` line and
exit status 2 for a mistake).

Example (a few minutes on 2 cores):
    python examples/jax_dqn.py --env-id ALE/Pong-v5 --total-timesteps 20000
"""

from __future__ import annotations

import time

import numpy as np
from dqn_atari import _Parser, linear_schedule, make_env, parse_checked

RULES = [
    (("num_envs", "buffer_size", "batch_size", "train_frequency", "target_network_frequency",
      "total_timesteps"), lambda v: v >= 1, ">= 1"),
    (("learning_starts", "seed"), lambda v: v >= 0, ">= 0"),
    (("learning_rate",), lambda v: v > 0, "> 0"),
    (("gamma", "start_e", "end_e"), lambda v: 0 <= v <= 1, "in [0, 1]"),
]  # fmt: skip


def parse_args(argv=None):
    p = _Parser(description=__doc__.split("\n")[0])
    p.add_argument("--env-id", default="ALE/Pong-v5", help="ALE environment id")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--total-timesteps", type=int, default=20_000, help="env steps over all envs")
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument("--buffer-size", type=int, default=20_000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=2.5e-4)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--start-e", type=float, default=1.0)
    p.add_argument("--end-e", type=float, default=0.05)
    p.add_argument("--learning-starts", type=int, default=1_000, help="vector steps first")
    p.add_argument("--train-frequency", type=int, default=4, help="vector steps per update")
    p.add_argument("--target-network-frequency", type=int, default=250, help="updates")
    return parse_checked(p, argv, RULES, ("jax", "lazyframes", "gymnasium", "ale_py", "cv2"))


def init_params(key, n_actions: int) -> dict:
    """A small CNN: conv 8x8/4 (16), conv 4x4/2 (32), dense 256, dense n_actions."""
    import jax

    k = jax.random.split(key, 4)

    def he(key, shape, fan_in):
        return jax.random.normal(key, shape) * (2.0 / fan_in) ** 0.5

    return {
        "c1": he(k[0], (16, 4, 8, 8), 4 * 64), "b1": np.zeros(16, np.float32),
        "c2": he(k[1], (32, 16, 4, 4), 16 * 16), "b2": np.zeros(32, np.float32),
        "d1": he(k[2], (32 * 9 * 9, 256), 32 * 81), "e1": np.zeros(256, np.float32),
        "d2": he(k[3], (256, n_actions), 256) * 0.1, "e2": np.zeros(n_actions, np.float32),
    }  # fmt: skip


def q_values(params: dict, x):
    """Q-values of observations ``x`` ``(B, 4, 84, 84)`` float32 in [0, 1]."""
    import jax
    from jax import lax

    def conv(x, w, b, stride):
        y = lax.conv_general_dilated(x, w, (stride, stride), "VALID")
        return jax.nn.relu(y + b[None, :, None, None])

    x = conv(x, params["c1"], params["b1"], 4)
    x = conv(x, params["c2"], params["b2"], 2)
    x = jax.nn.relu(x.reshape(x.shape[0], -1) @ params["d1"] + params["e1"])
    return x @ params["d2"] + params["e2"]


def main(argv=None) -> dict:
    args = parse_args(argv)
    import gymnasium as gym
    import jax
    import jax.numpy as jnp

    import lazyframes
    from lazyframes import vector as lf_vector

    rng = np.random.default_rng(args.seed)
    n, B = args.num_envs, args.batch_size
    envs = gym.vector.SyncVectorEnv([make_env(args.env_id, args.seed + i) for i in range(n)])
    envs = lf_vector.FrameStackObservation(envs, 4)
    n_actions = int(envs.single_action_space.n)
    params = init_params(jax.random.PRNGKey(args.seed), n_actions)
    target = params
    rb = lazyframes.ReplayBuffer(args.buffer_size, num_envs=n, gamma=args.gamma, seed=args.seed,
                                 compress=True)  # fmt: skip
    # the host arrays sample() fills in place, every batch: no allocation per step
    host = (np.empty((B, 4, 84, 84), np.float32), np.empty((B, 4, 84, 84), np.float32))
    obs_in = np.empty((n, 4, 84, 84), np.float32)

    @jax.jit
    def act(params, x):
        return jnp.argmax(q_values(params, x), axis=1)

    @jax.jit
    def update(params, target, obs, nxt, actions, rewards, dones):
        def loss_fn(p):
            q = jnp.take_along_axis(q_values(p, obs), actions[:, None], axis=1)[:, 0]
            best = jnp.argmax(q_values(p, nxt), axis=1)  # double DQN
            v = jnp.take_along_axis(q_values(target, nxt), best[:, None], axis=1)[:, 0]
            y = rewards + args.gamma * (1.0 - dones) * jax.lax.stop_gradient(v)
            return jnp.mean(huber(q - y))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        new = jax.tree_util.tree_map(lambda w, g: w - args.learning_rate * g, params, grads)
        return new, loss

    obs, _ = envs.reset(seed=args.seed)
    prev_done = np.zeros(n, bool)
    vec_steps = max(1, args.total_timesteps // n)
    updates, loss, start = 0, 0.0, time.time()
    for step in range(vec_steps):
        eps = linear_schedule(args.start_e, args.end_e, vec_steps // 2, step)
        obs.numpy(out=obs_in, dtype=np.float32, scale=1 / 255)
        greedy = np.asarray(act(params, jax.device_put(obs_in)))
        actions = np.where(rng.random(n) < eps, rng.integers(n_actions, size=n), greedy)
        next_obs, rewards, term, trunc, _ = envs.step(actions)
        rb.add(obs, actions, rewards, next_obs, term, trunc, autoreset=prev_done)
        prev_done, obs = term | trunc, next_obs
        if step >= args.learning_starts and step % args.train_frequency == 0:
            s = rb.sample(B, out=host, dtype=np.float32, scale=1 / 255)
            batch = (jax.device_put(host[0]), jax.device_put(host[1]))  # to the device
            params, loss = update(params, target, *batch, s.actions, s.rewards, s.dones)
            updates += 1
            if updates % args.target_network_frequency == 0:
                target = params
    envs.close()
    summary = {"env_steps": vec_steps * n, "gradient_steps": updates, "final_loss": float(loss),
               "steps_per_s": vec_steps * n / (time.time() - start),
               "replay_bytes_per_transition": rb.memory()["bytes_per_transition"]}  # fmt: skip
    print(
        f"jax_dqn summary: {summary['env_steps']} env steps, {updates} gradient steps, final "
        f"loss {summary['final_loss']:.4f}, {summary['steps_per_s']:.0f} steps/s, replay "
        f"{len(rb)} transitions at {summary['replay_bytes_per_transition']:,.0f} B each",
        flush=True,
    )
    return summary


def huber(x, delta: float = 1.0):
    """The Huber loss of errors ``x`` (what optax's ``huber_loss`` computes)."""
    import jax.numpy as jnp

    a = jnp.abs(x)
    return jnp.where(a <= delta, 0.5 * x * x, delta * (a - 0.5 * delta))


if __name__ == "__main__":
    main()
