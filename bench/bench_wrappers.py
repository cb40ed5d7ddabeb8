"""Wrapper benchmark: per-step cost of stacking + materialising, against peers in the same run.

Single env (one 84x84 uint8 frame per step, k = 4):

- **lazyframes FrameStackObservation** (``layout="stack"``, ``(4, 84, 84)``) vs
  **Gymnasium 1.x FrameStackObservation**; the lazyframes ``lazy=False`` variant too;
- **lazyframes FrameStack** (``(84, 84, 4)``) vs **baselines' FrameStack** (restated in
  bench/baselines.py, with its LazyFrames), frames ``(84, 84, 1)``.

Vector env (8 envs, k = 4), per env-step:

- **lazyframes.vector.FrameStackObservation** vs **SB3 VecFrameStack**, over vector envs
  that return one preallocated batch of 8 frames (``--vec-env sync``: a
  ``SyncVectorEnv(copy=False)`` / ``DummyVecEnv`` of counter envs, whose own ~100 us step
  and its noise then dominate the difference), channels-last (SB3's Atari recipe:
  frames ``(84, 84, 1)`` -> ``(8, 84, 84, 4)``) and channels-first (``(1, 84, 84)`` ->
  ``(8, 4, 84, 84)``).

Every step is followed by ``np.asarray(obs)`` (a no-op for the peers that already return
an ndarray), so each stacker pays for one materialised observation / batch. The env is
a cheap counter env returning one preallocated frame, so the wrapper dominates; the
bare env's (or bare vector env's) own step time is measured too and subtracted:
"overhead" = time with the stacker - time of the bare env. Methods are interleaved
within each repeat and each figure is the median over repeats after a warmup.

Run: ``python -m bench.bench_wrappers [--quick]`` from the source checkout, or
``python -m bench``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import gymnasium as gym
import numpy as np

from bench._util import format_table, header, report_checks, target
from bench.baselines import BaselinesFrameStack
from lazyframes import vector as lf_vector
from lazyframes.wrappers import FrameStack, FrameStackObservation

K = 4
N_ENVS = 8
TARGET_GYM = 7.0  # at least this much less overhead than Gymnasium's FrameStackObservation
TARGET_SB3 = 30.0  # at least this much less per env-step than SB3's channels-last VecFrameStack


class CheapEnv(gym.Env):
    """Returns one preallocated uint8 frame every step; episodes never end."""

    metadata = {"render_modes": []}  # noqa: RUF012 - Gymnasium's class attribute

    def __init__(self, shape=(84, 84)):
        self.frame = np.zeros(shape, np.uint8)
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.frame, {}

    def step(self, action):
        return self.frame, 0.0, False, False, {}


class CheapVectorEnv(gym.vector.VectorEnv):
    """A Gymnasium VectorEnv of ``n`` counter envs at (almost) no cost: one preallocated batch."""

    def __init__(self, n, shape):
        self.num_envs = n
        self.single_observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, n)
        self.single_action_space = gym.spaces.Discrete(2)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, n)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
        self.obs = np.zeros((n,) + tuple(shape), np.uint8)
        self.rewards, self.flags = np.zeros(n), np.zeros(n, np.bool_)

    def reset(self, *, seed=None, options=None):
        return self.obs, {}

    def step(self, actions):
        return self.obs, self.rewards, self.flags, self.flags, {}


def _cheap_sb3_vec_env(n, shape):
    """The same for SB3's VecEnv API (what DummyVecEnv returns, without its per-env loop)."""
    from stable_baselines3.common.vec_env.base_vec_env import VecEnv

    class CheapVecEnv(VecEnv):
        def __init__(self):
            super().__init__(n, gym.spaces.Box(0, 255, shape, np.uint8), gym.spaces.Discrete(2))
            self.obs = np.zeros((n,) + tuple(shape), np.uint8)
            self.rewards, self.dones = np.zeros(n, np.float32), np.zeros(n, np.bool_)
            self.infos = [{} for _ in range(n)]

        def reset(self):
            return self.obs

        def step_async(self, actions):
            pass

        def step_wait(self):
            return self.obs, self.rewards, self.dones, self.infos

        def close(self):
            pass

        def get_attr(self, attr_name, indices=None):
            return [None] * n

        def set_attr(self, attr_name, value, indices=None):
            pass

        def env_method(self, method_name, *args, indices=None, **kwargs):
            return [None] * n

        def env_is_wrapped(self, wrapper_class, indices=None):
            return [False] * n

    return CheapVecEnv()


# -- step loops ---------------------------------------------------------------------------
def _single_loop(env):
    env.reset(seed=0)
    step, asarray = env.step, np.asarray

    def run(n):
        for _ in range(n):
            asarray(step(0)[0])

    return run


def _bare_single_loop(env):
    env.reset(seed=0)
    step = env.step

    def run(n):
        for _ in range(n):
            step(0)

    return run


def _vector_loop(envs, bare=False):
    if isinstance(envs, gym.vector.VectorEnv):
        envs.reset(seed=0)
    else:  # SB3 VecEnv
        envs.seed(0)
        envs.reset()
    actions = np.zeros(N_ENVS, np.int64)
    step, asarray = envs.step, np.asarray

    if bare:

        def run(n):
            for _ in range(n):
                step(actions)
    else:

        def run(n):
            for _ in range(n):
                asarray(step(actions)[0])

    return run


def _time(run, n) -> float:
    t0 = time.perf_counter()
    run(n)
    return (time.perf_counter() - t0) / n


def _measure(cases: dict, steps: int, repeats: int) -> dict:
    """Median seconds per step of each case; cases interleaved within each repeat."""
    runs = {name: make() for name, make in cases.items()}
    for run in runs.values():  # warmup
        run(max(10, steps // 10))
    samples = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            samples[name].append(_time(run, steps))
    return {name: statistics.median(v) for name, v in samples.items()}


# -- the benchmark ---------------------------------------------------------------------------
def single_rows(steps: int, repeats: int) -> list[dict]:
    cases = {
        "bare (84, 84)": lambda: _bare_single_loop(CheapEnv((84, 84))),
        "gym": lambda: _single_loop(gym.wrappers.FrameStackObservation(CheapEnv((84, 84)), K)),
        "lf": lambda: _single_loop(FrameStackObservation(CheapEnv((84, 84)), K)),
        "lf eager": lambda: _single_loop(FrameStackObservation(CheapEnv((84, 84)), K, lazy=False)),
        "bare (84, 84, 1)": lambda: _bare_single_loop(CheapEnv((84, 84, 1))),
        "baselines": lambda: _single_loop(BaselinesFrameStack(CheapEnv((84, 84, 1)), K)),
        "lf framestack": lambda: _single_loop(FrameStack(CheapEnv((84, 84, 1)), K)),
    }
    t = _measure(cases, steps, repeats)
    b1, b2 = t["bare (84, 84)"], t["bare (84, 84, 1)"]
    ours_fso, ours_fs = t["lf"] - b1, t["lf framestack"] - b2

    def row(case, stacker, key, bare, ours):
        over = t[key] - bare
        return {
            "case": case,
            "stacker": stacker,
            "us_per_step": t[key] * 1e6,
            "overhead_us": over * 1e6,
            "per": "step",
            "vs_lazyframes": over / ours if ours > 0 else float("nan"),
        }

    return [
        row("single (4, 84, 84)", "Gymnasium FrameStackObservation", "gym", b1, ours_fso),
        row("single (4, 84, 84)", "lazyframes FrameStackObservation", "lf", b1, ours_fso),
        row(
            "single (4, 84, 84)",
            "lazyframes FrameStackObservation(lazy=False)",
            "lf eager",
            b1,
            ours_fso,
        ),
        row("single (84, 84, 4)", "baselines FrameStack", "baselines", b2, ours_fs),
        row("single (84, 84, 4)", "lazyframes FrameStack", "lf framestack", b2, ours_fs),
    ]


def vector_rows(steps: int, repeats: int, vec_env: str = "cheap") -> list[dict]:
    try:
        from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack
    except ImportError:
        print("bench_wrappers: stable_baselines3 is not installed; SB3 VecFrameStack rows skipped")
        DummyVecEnv = VecFrameStack = None
    from gymnasium.vector import SyncVectorEnv

    rows = []
    for order, shape, layout in (("last", (84, 84, 1), "last"), ("first", (1, 84, 84), "first")):
        fns = [lambda: CheapEnv(shape)] * N_ENVS
        if vec_env == "sync":
            gym_venv = lambda: SyncVectorEnv(fns, copy=False)  # noqa: E731
            sb3_venv = lambda: DummyVecEnv(fns)  # noqa: E731
        else:
            gym_venv = lambda: CheapVectorEnv(N_ENVS, shape)  # noqa: E731
            sb3_venv = lambda: _cheap_sb3_vec_env(N_ENVS, shape)  # noqa: E731
        cases = {
            "bare sync": lambda: _vector_loop(gym_venv(), bare=True),
            "lf": lambda: _vector_loop(
                lf_vector.FrameStackObservation(gym_venv(), K, layout=layout)
            ),
        }
        if VecFrameStack is not None:
            cases["bare dummy"] = lambda: _vector_loop(sb3_venv(), bare=True)
            cases["sb3"] = lambda: _vector_loop(VecFrameStack(sb3_venv(), K, channels_order=order))
        t = _measure(cases, max(1, steps // N_ENVS), repeats)
        ours = (t["lf"] - t["bare sync"]) / N_ENVS
        obs = f"vector 8 x {(4 * shape[0],) + shape[1:] if order == 'first' else shape[:-1] + (4,)}"
        if VecFrameStack is not None:
            over = (t["sb3"] - t["bare dummy"]) / N_ENVS
            rows.append(
                {
                    "case": obs,
                    "stacker": f"SB3 VecFrameStack(channels_order={order!r})",
                    "us_per_step": t["sb3"] / N_ENVS * 1e6,
                    "overhead_us": over * 1e6,
                    "per": "env-step",
                    "vs_lazyframes": over / ours if ours > 0 else float("nan"),
                }
            )
        rows.append(
            {
                "case": obs,
                "stacker": f"lazyframes.vector.FrameStackObservation(layout={layout!r})",
                "us_per_step": t["lf"] / N_ENVS * 1e6,
                "overhead_us": ours * 1e6,
                "per": "env-step",
                "vs_lazyframes": 1.0,
            }
        )
    return rows


COLUMNS = [
    ("case", "case", "{}"),
    ("stacker", "stacker", "{}"),
    ("per", "per", "{}"),
    ("us_per_step", "time (us)", "{:.2f}"),
    ("overhead_us", "overhead (us)", "{:.2f}"),
    ("vs_lazyframes", "overhead / lazyframes'", "{:.1f}x"),
]


def check_targets(rows: list[dict]) -> list[tuple[str, bool]]:
    """The targets that ``--check`` tests (bench/README.md): (description, met) pairs."""
    by = {r["stacker"]: r for r in rows}
    what = "single-env overhead of Gymnasium's FrameStackObservation / ours"
    gym_x = by["Gymnasium FrameStackObservation"]["vs_lazyframes"]
    results = [target(what, gym_x, ">=", TARGET_GYM, "{:.1f}x")]
    sb3 = by.get("SB3 VecFrameStack(channels_order='last')")
    if sb3 is not None:
        what = "per env-step overhead of SB3's channels-last VecFrameStack / ours"
        results.append(target(what, sb3["vs_lazyframes"], ">=", TARGET_SB3, "{:.1f}x"))
    return results


def main(argv=None) -> list[dict]:
    """Run the wrapper benchmark and print one table; return the rows.

    With ``--check`` it also prints the targets and exits with status 1 if one is missed.
    """
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_wrappers",
        description="Per-step overhead of frame stacking wrappers vs Gymnasium, baselines and SB3.",
    )
    p.add_argument("--quick", action="store_true", help="fewer steps and repeats (a smoke run)")
    p.add_argument("--steps", type=int, default=None, help="env steps per repeat (default 4000)")
    p.add_argument("--repeats", type=int, default=None, help="repeats per case (default 9)")
    p.add_argument(
        "--vec-env",
        choices=("cheap", "sync"),
        default="cheap",
        help="vector envs under the stackers: 'cheap' (default) returns one preallocated "
        "batch, so the stacker's overhead is not lost in the vector env's own noise; "
        "'sync' uses SyncVectorEnv(copy=False) / DummyVecEnv of counter envs",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="developer check: print the performance targets (bench/README.md) and "
        "exit with status 1 if one is missed",
    )
    args = p.parse_args(argv)
    steps = args.steps or (400 if args.quick else 4000)
    repeats = args.repeats or (3 if args.quick else 9)
    print(header("bench_wrappers", f"gymnasium {gym.__version__}"))
    print(f"k={K}, {steps} steps x {repeats} repeats, median")
    rows = single_rows(steps, repeats) + vector_rows(steps, repeats, args.vec_env)
    print(format_table(rows, COLUMNS))
    vec_name = (
        "SyncVectorEnv / DummyVecEnv"
        if args.vec_env == "sync"
        else "a vector env returning one preallocated batch"
    )
    print(
        "overhead = time with the stacker - time of the bare env (vector: per env-step, 8 envs, "
        f"{vec_name}); "
        "each step includes np.asarray(obs)"
    )
    if args.check:
        report_checks(check_targets(rows))
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
