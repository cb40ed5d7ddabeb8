"""``python examples/demo.py``: real Atari through the stacker and the replay buffer, reported.

From a clone: ``python -m pip install -e '.[demo]' && python examples/demo.py`` (about 1-2
minutes on 2 cores); ``--help`` explains every option.

The demo runs the data path of a DQN agent (Mnih et al. 2015, as CleanRL's
``dqn_atari.py``) with a random policy: ALE Pong through Gymnasium's
``AtariPreprocessing`` (frame skip 4, 84x84 grayscale), stacked 4 frames deep by
:class:`lazyframes.FrameStackObservation` (or :class:`lazyframes.vector.FrameStackObservation`
over a ``SyncVectorEnv`` with ``--num-envs > 1``); every step the observation is
materialised as the policy's float32 input, the transition is stored in a
:class:`lazyframes.ReplayBuffer`, and every 4 steps a batch is sampled straight into
float32 scaled by 1/255 (the fused path).

The report gives env steps per second, the share of time spent stacking, the memory the
replay buffer holds against what the same transitions take in SB3's memory-optimised
buffer, a naive buffer and a baselines-style list after sampling, and the sample latency.
The buffer compresses its frames (the wrapper's pool, adopted; ``--no-compress`` stores
them raw), and the report and the plot show that memory beside the same frames uncompressed.

Every option is checked before any work (:func:`check_args`): a bad number, an unknown
env id, an output path that cannot be written or a missing package (with the command that
installs it) ends the script with one ``demo.py: error: ...`` line and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import statistics
import sys
import textwrap
import time
from typing import Any, NoReturn

import numpy as np

#: bytes per transition besides the observations, as SB3's ReplayBuffer stores them for a
#: Discrete action: int64 action, float32 reward, float32 done, float32 timeout.
SB3_SCALAR_BYTES = 8 + 4 + 4 + 4

DEFAULT_STEPS = 40_000

#: Whether the demo's replay buffer compresses its frames unless told (--compress /
#: --no-compress). On: compression meets its targets (docs/BENCHMARKS.md, "Memory", has the
#: measured table), and in this demo's loop (a batch sampled every 4 steps, no learner)
#: it ran as many env steps per second as the uncompressed buffer (997 vs 1,001 over
#: 10,000 Pong steps on the 2-core machine of that table) in ~1/20 of the memory.
DEFAULT_COMPRESS = True
COMPRESS_HELP = (
    "store the replay's frames compressed (ReplayBuffer(..., compress=True): LZ4 "
    "keyframes, each other frame a patch of the bytes that changed), or not; the report "
    "and the plot then show the compressed memory (bytes, ratio, frames compressed and "
    "held raw) beside the same frames uncompressed (default: %(default)s: a "
    "1M-transition Atari replay fits in 0.2-0.4 GB instead of ~7 GB, at about the same "
    "env steps per second in this loop; docs/BENCHMARKS.md, 'Memory')"
)


DESCRIPTION = (
    "Steps an env (default ALE Pong, Gymnasium's AtariPreprocessing, stack 4) with a "
    "random policy as a DQN data loop does: each observation is materialised as the "
    "policy's float32 input, each transition is stored in lazyframes.ReplayBuffer, and "
    "every --train-freq steps a batch is sampled into float32 scaled by 1/255. Then it "
    "reports env steps/s, the share of time spent stacking, the replay memory held "
    "against SB3's memory-optimised buffer, a naive obs+next_obs buffer and a "
    "baselines-style list after sampling, and the sample latency; compressed (the "
    "default; --no-compress stores raw), the buffer's compressed memory beside the "
    "same frames uncompressed."
)


class UsageError(ValueError):
    """A user mistake found before the run: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, whose errors are one line (no usage block), like the demo's own checks."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def build_parser() -> argparse.ArgumentParser:
    """The demo's command line: the options of ``python examples/demo.py``."""
    p = _Parser(description=DESCRIPTION)
    p.add_argument(
        "--env",
        default="ALE/Pong-v5",
        metavar="ID",
        help="Gymnasium environment id (default: %(default)s). ALE ids ('ALE/...') are "
        "made with frameskip=1 and wrapped in Gymnasium's AtariPreprocessing "
        "(frame_skip=4, 84x84 grayscale, as the DQN papers); other ids must have "
        "a Box observation space and are stacked as they are",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        metavar="N",
        help="total env steps, summed over all envs (default: %(default)s, about "
        "1-2 minutes on 2 cores)",
    )
    p.add_argument(
        "--num-envs",
        type=int,
        default=1,
        metavar="N",
        help="number of envs; > 1 runs a gymnasium SyncVectorEnv through "
        "lazyframes.vector.FrameStackObservation and stores one transition per "
        "env per step (default: %(default)s)",
    )
    p.add_argument(
        "--stack-size",
        type=int,
        default=4,
        metavar="K",
        help="frames per observation k (default: %(default)s)",
    )
    p.add_argument(
        "--capacity",
        type=int,
        default=100_000,
        metavar="N",
        help="replay buffer capacity in transitions; the oldest are evicted first "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=32,
        metavar="B",
        help="transitions per sampled batch (default: %(default)s, as DQN)",
    )
    p.add_argument(
        "--train-freq",
        type=int,
        default=4,
        metavar="N",
        help="sample a batch every N vector steps, as DQN trains every 4 steps "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the envs, the random policy and the replay sampling (default: %(default)s)",
    )
    p.add_argument(
        "--scale",
        action="store_true",
        help="wrap each env in lazyframes.ScaledFloatFrame (baselines' wrap_deepmind(scale="
        "True)): observations are float32 in [0, 1], and the buffer still stores each "
        "frame's bytes once (the report then measures that case)",
    )
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        default=None,
        help="draw memory held versus transitions stored (lazyframes measured; SB3 "
        "memory-optimised, naive and baselines-style computed) to this PNG "
        "(matplotlib, Agg backend)",
    )
    p.add_argument(
        "--json",
        metavar="FILE",
        default=None,
        help="write the report's figures (and the plot's series) to this JSON file",
    )
    p.add_argument(
        "--compress",
        action=argparse.BooleanOptionalAction,
        default=DEFAULT_COMPRESS,
        help=COMPRESS_HELP,
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar (tqdm, on stderr)")
    return p


# -- environments -------------------------------------------------------------------------
def _is_atari(env_id: str) -> bool:
    return env_id.startswith("ALE/") or "NoFrameskip" in env_id


def make_env(env_id: str, scale: bool = False):
    """One env as the DQN recipe makes it: ALE with Gymnasium's AtariPreprocessing.

    ``scale``: then :class:`lazyframes.ScaledFloatFrame` (float32 observations in [0, 1]).
    """
    import gymnasium as gym

    import lazyframes

    if _is_atari(env_id):
        import ale_py
        from gymnasium.wrappers import AtariPreprocessing

        gym.register_envs(ale_py)
        env = gym.make(env_id, frameskip=1)
        env = AtariPreprocessing(env, frame_skip=4, screen_size=84, grayscale_obs=True)
    else:
        env = gym.make(env_id)
    return lazyframes.ScaledFloatFrame(env) if scale else env


def _timed_classes():
    import gymnasium as gym
    from gymnasium.vector import VectorWrapper

    class _Timed:
        """Accumulates the seconds spent inside the wrapped env (below the stacker)."""

        env: Any
        seconds = 0.0

        def step(self, action):
            t = time.perf_counter()
            try:
                return self.env.step(action)
            finally:
                self.seconds += time.perf_counter() - t

        def reset(self, **kwargs):
            t = time.perf_counter()
            try:
                return self.env.reset(**kwargs)
            finally:
                self.seconds += time.perf_counter() - t

    class Timed(_Timed, gym.Wrapper):
        pass

    class TimedVector(_Timed, VectorWrapper):
        pass

    return Timed, TimedVector


# -- memory models of the alternatives --------------------------------------------------
def _alternatives(transitions: int, pixels: int, itemsize: int, k: int, forced_obs: int) -> dict:
    """Bytes the same transitions take in the other buffers.

    - SB3 ``ReplayBuffer(optimize_memory_usage=True)``: one observation per transition
      (the next one is the following row) plus the scalar fields.
    - naive (SB3 default, most hand-written buffers): obs and next_obs per transition.
    - baselines-style: a list of (obs, action, reward, next_obs, done) holding
      LazyFrames; frames are shared until an observation is converted, after which it
      caches its own concatenated copy (``_out``) and drops its frame references. An
      unconverted observation adds one new frame; a converted one adds an observation.
      Python object overhead is not counted (it only adds to baselines' figure).
    - the same with baselines' ``ScaledFloatFrame`` under ``FrameStack``
      (``wrap_deepmind(scale=True)``): every frame a float32 array, 4 bytes a pixel.

    ``pixels``: elements of one observation (of ``itemsize`` bytes; ``k`` frames).
    """
    forced_obs = min(forced_obs, transitions)
    scalars = transitions * SB3_SCALAR_BYTES
    obs_bytes, frame, floats = pixels * itemsize, pixels * itemsize // k, 4 * pixels
    return {
        "sb3_optimized": transitions * (obs_bytes + SB3_SCALAR_BYTES),
        "naive": transitions * (2 * obs_bytes + SB3_SCALAR_BYTES),
        "baselines_after_sampling": forced_obs * obs_bytes
        + (transitions - forced_obs) * frame
        + scalars,
        "baselines_scaled": transitions * floats // k + scalars,
        "baselines_scaled_after_sampling": forced_obs * floats
        + (transitions - forced_obs) * floats // k
        + scalars,
    }


class _SampledTracker:
    """Which stored transitions were sampled at least once (baselines' ``_out`` caches).

    In baselines' DQN loop the next observation of transition ``i`` is the same
    LazyFrames object as the observation of the env's following transition
    (``i + num_envs`` in the buffer), so sampling ``i`` converts (and caches) both.
    Overwriting a position frees its transition and its cache.
    """

    def __init__(self, capacity: int, num_envs: int):
        self.sampled = np.zeros(capacity, np.bool_)
        self.num_envs = num_envs

    def overwrite(self, start: int):
        self.sampled[start : start + self.num_envs] = False

    def mark(self, indices: np.ndarray):
        self.sampled[indices] = True

    def forced_observations(self) -> int:
        s = self.sampled
        return int(np.count_nonzero(s | np.roll(s, self.num_envs)))


# -- the checks ---------------------------------------------------------------------------
#: the command that installs what the demo needs, in a clone (the demo is not in the package)
INSTALL_DEMO = "python -m pip install -e '.[demo]'"

#: what a loop with fewer than one of these would do: nothing, or divide by zero
_AT_LEAST_ONE = ("steps", "num_envs", "stack_size", "batch_size", "train_freq")


def _version(text: str) -> tuple[int, ...]:
    """``"1.1.0rc1"`` -> ``(1, 1)``: the major and minor numbers of a version string."""
    return tuple(int(x) for x in re.findall(r"\d+", text)[:2])


def _check_output(option: str, path: str) -> None:
    """Refuse an output path that cannot be written (checked before the run, not after)."""
    if not path:
        raise UsageError(f"{option} needs a file name")
    if os.path.isdir(path):
        raise UsageError(
            f"{option} {path}: is a folder; give a file name, e.g. "
            f"{os.path.join(path, 'report.json' if option == '--json' else 'memory.png')}"
        )
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"{option} {path}: the folder {folder} does not exist")
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            raise UsageError(f"{option} {path}: the file exists and is not writable")
    elif not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: the folder {folder} is not writable")


def check_args(args: argparse.Namespace) -> None:
    """Refuse, before the run, what would make it fail during or after it.

    Numbers first, then the packages, the env id, the output paths and, for an env id
    that is not ALE, its observation space (the only check that makes an env).

    Raises:
        UsageError: a bad number, a missing package (with the command that installs
            it), an unknown env id, or a ``--plot``/``--json`` path that cannot be
            written; the message names the option.
    """
    for name in _AT_LEAST_ONE:
        value = getattr(args, name)
        if value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.capacity < args.num_envs:
        raise UsageError(
            f"--capacity ({args.capacity}) must be at least --num-envs ({args.num_envs})"
        )
    if args.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {args.seed}")
    if args.plot is not None and args.json is not None and args.plot == args.json:
        raise UsageError(f"--plot and --json are the same file ({args.plot})")

    try:  # the package itself: a clone needs it installed (or on PYTHONPATH) and built
        import lazyframes  # noqa: F401
    except ImportError as e:
        if isinstance(e, ModuleNotFoundError) and e.name == "lazyframes":
            raise UsageError(
                f"the package lazyframes is not installed: {INSTALL_DEMO} (in the clone)"
            ) from None
        raise UsageError(str(e)) from None
    atari = _is_atari(args.env)
    needs = [("gymnasium", "the demo")]
    needs += [("ale_py", f"--env {args.env}"), ("cv2", f"--env {args.env}")] if atari else []
    needs += [] if args.no_progress else [("tqdm", "the progress bar (or --no-progress)")]
    needs += [("matplotlib", "--plot")] if args.plot else []
    for module, what in needs:
        if importlib.util.find_spec(module) is None:
            package = {"cv2": "opencv-python-headless", "ale_py": "ale-py"}.get(module, module)
            raise UsageError(f"{what} needs the package {package!r}: {INSTALL_DEMO}")
    import gymnasium as gym

    if _version(gym.__version__) < (1, 1):
        raise UsageError(
            f"the demo needs gymnasium >= 1.1 (installed: {gym.__version__}): {INSTALL_DEMO}"
        )
    if atari:
        import ale_py

        gym.register_envs(ale_py)
    try:
        gym.spec(args.env)
    except gym.error.Error as e:
        hint = "" if atari else " (Atari games are ALE/<Game>-v5, e.g. ALE/Pong-v5)"
        raise UsageError(f"--env {args.env!r}: {e}{hint}") from None

    for option, path in (("--plot", args.plot), ("--json", args.json)):
        if path is not None:
            _check_output(option, path)
    if args.plot:
        from matplotlib.figure import Figure

        formats = Figure().canvas.get_supported_filetypes()
        ext = os.path.splitext(args.plot)[1].lstrip(".").lower()
        if ext not in formats:
            raise UsageError(
                f"--plot {args.plot}: matplotlib cannot write a {ext or 'extensionless'!r} "
                f"file; use one of {', '.join(sorted(formats))}"
            )
    if not atari:  # stacked as it is: its observations must be an array (a Box)
        try:
            env = gym.make(args.env)
        except Exception as e:  # a missing dependency of that env, a bad entry point
            raise UsageError(f"--env {args.env!r}: {type(e).__name__}: {e}") from None
        space = env.observation_space
        env.close()
        if not isinstance(space, gym.spaces.Box):
            raise UsageError(
                f"--env {args.env!r}: its observations are {space}, not a Box: the demo "
                "stacks arrays"
            )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the demo loop on options :func:`check_args` accepted; returns the report.

    The report is a JSON-serialisable dict.
    """
    import gymnasium as gym

    import lazyframes
    from lazyframes import _machine
    from lazyframes import vector as lvector

    n = args.num_envs
    k = args.stack_size
    Timed, TimedVector = _timed_classes()
    if n == 1:
        inner = Timed(make_env(args.env, args.scale))
        env = lazyframes.FrameStackObservation(inner, k)
    else:
        inner = TimedVector(
            gym.vector.SyncVectorEnv([lambda: make_env(args.env, args.scale) for _ in range(n)])
        )
        env = lvector.FrameStackObservation(inner, k)
    env.action_space.seed(args.seed)
    rb = lazyframes.ReplayBuffer(args.capacity, num_envs=n, seed=args.seed, compress=args.compress)
    tracker = _SampledTracker(rb.capacity, n)
    rows = rb.capacity // n

    vec_steps = math.ceil(args.steps / n)
    space = env.observation_space if n == 1 else env.single_observation_space
    obs_shape, obs_dtype = tuple(space.shape), space.dtype
    policy_in = np.empty(((n,) if n > 1 else (1,)) + obs_shape, np.float32)
    # float32 in [0, 1]: converted in the copy, or ScaledFloatFrame's values as they are
    conv = {} if args.scale else {"dtype": np.float32, "scale": 1 / 255}

    t_outer = t_mat = t_add = 0.0
    sample_us: list[float] = []
    real = 0  # real transitions added (autoreset placeholders not counted)
    skipped = np.zeros(rows, np.int64)  # placeholders in each buffer row
    episodes = 0
    prev_done = np.zeros(n, np.bool_)
    series = []
    checkpoint_every = max(1, vec_steps // 100)

    progress = None
    if not args.no_progress:
        from tqdm import tqdm

        progress = tqdm(
            total=vec_steps * n,
            unit="step",
            desc=f"demo {args.env}",
            mininterval=0.5,
            file=sys.stderr,
            dynamic_ncols=True,
        )
    perf = time.perf_counter
    t_start = perf()
    t0 = perf()
    obs, _ = env.reset(seed=args.seed)
    t_outer += perf() - t0
    for step in range(vec_steps):
        # the policy's input: the observation materialised as float32 in [0, 1]
        t0 = perf()
        if n > 1:
            obs.numpy(out=policy_in, **conv)
        elif args.scale:
            policy_in[0] = np.asarray(obs)
        else:
            lazyframes.stack([obs], out=policy_in, **conv)
        t_mat += perf() - t0
        action = env.action_space.sample()  # random policy

        t0 = perf()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        t_outer += perf() - t0

        pos = (step % rows) * n
        tracker.overwrite(pos)
        t0 = perf()
        if n == 1:
            rb.add(obs, action, reward, next_obs, terminated, truncated)
        else:
            # Gymnasium 1.x NEXT_STEP autoreset: the step after an episode ends returns the
            # reset observation; (final obs -> reset obs) is no transition: a placeholder
            # the buffer never samples (as CleanRL skips it).
            rb.add(obs, action, reward, next_obs, terminated, truncated, autoreset=prev_done)
        t_add += perf() - t0
        if n == 1:
            real += 1
            done = bool(terminated or truncated)
            episodes += done
            if done:
                t0 = perf()
                next_obs, _ = env.reset()
                t_outer += perf() - t0
        else:
            skipped[step % rows] = np.count_nonzero(prev_done)
            real += int(n - skipped[step % rows])
            prev_done = np.logical_or(terminated, truncated)
            episodes += int(np.count_nonzero(prev_done))
        obs = next_obs

        if step % args.train_freq == 0 and real >= args.batch_size:
            t0 = perf()
            batch = rb.sample(args.batch_size, **conv)
            sample_us.append((perf() - t0) * 1e6)
            tracker.mark(batch.indices)
        if step % checkpoint_every == 0 or step == vec_steps - 1:
            stored = len(rb) - int(skipped.sum())
            series.append(
                {
                    "transitions": stored,
                    **_lazy_bytes(rb),
                    "forced_obs": tracker.forced_observations(),
                }
            )
        if progress is not None:
            progress.update(n)
    total = perf() - t_start
    if progress is not None:
        progress.close()

    mem = rb.memory()
    stats = env.pool.stats()
    pixels, itemsize = int(np.prod(obs_shape)), np.dtype(obs_dtype).itemsize
    obs_bytes = pixels * itemsize
    frame_bytes = int(mem["frame_bytes"])
    stored_real = len(rb) - int(skipped.sum())
    lazy = _lazy_bytes(rb)
    forced = tracker.forced_observations()
    alt = _alternatives(stored_real, pixels, itemsize, k, forced)
    for pt in series:
        pt.update(_alternatives(pt["transitions"], pixels, itemsize, k, pt.pop("forced_obs")))
    env_seconds = inner.seconds
    stacking_seconds = max(0.0, t_outer - env_seconds)
    env.close()

    per = (lambda b: b / stored_real) if stored_real else (lambda b: 0.0)
    report = {
        "measured": _machine.stamp(),
        "env": args.env,
        "num_envs": n,
        "stack_size": k,
        "observation_shape": list(obs_shape),
        "steps": vec_steps * n,
        "episodes_ended": episodes,
        "capacity": rb.capacity,
        "batch_size": args.batch_size,
        "train_freq": args.train_freq,
        "seed": args.seed,
        "compress": bool(args.compress),
        "scale": bool(args.scale),
        "seconds": total,
        "env_steps_per_s": vec_steps * n / total,
        "time": {
            "env_s": env_seconds,
            "stacking_s": stacking_seconds,
            "materialise_s": t_mat,
            "replay_add_s": t_add,
            "replay_sample_s": sum(sample_us) / 1e6,
            "total_s": total,
        },
        "stacking_share": (stacking_seconds + t_mat) / total,
        "transitions": stored_real,
        "buffer_len": len(rb),
        "samples": len(sample_us),
        "sample_latency_us": {
            "mean": statistics.fmean(sample_us) if sample_us else None,
            "median": statistics.median(sample_us) if sample_us else None,
        },
        "memory": {
            "frame_bytes": frame_bytes,
            "observation_bytes": obs_bytes,
            "unique_frames": int(mem["unique_frames"]),
            "pool_bytes_held": int(mem["bytes_held"]),
            "pool_peak_bytes": int(stats["peak_bytes"]),
            "sampled_observations": forced,
            "compression": mem["compression"],
            "hot_frames": int(mem["hot_frames"]),
            "cold_frames": int(mem["cold_frames"]),
            "cold_bytes": int(mem["cold_bytes"]),
            "ratio": float(mem["ratio"]),
            **lazy,
            **alt,
            "per_transition": {
                **{name: per(b) for name, b in lazy.items()},
                **{name: per(b) for name, b in alt.items()},
            },
        },
        "max_rss_bytes": _max_rss(),
        "series": series,
    }
    return report


def _max_rss():
    """Peak resident set size of this process in bytes (None where unknown)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(kb if sys.platform == "darwin" else kb * 1024)


def _lazy_bytes(rb) -> dict[str, int]:
    """The buffer's memory: ``lazyframes`` (measured) and ``lazyframes_uncompressed``.

    ``lazyframes``: the frame memory the pool holds + the buffer's tables for the rows in
    use. ``lazyframes_uncompressed`` (computed): the same frames held uncompressed, each
    once, + the same tables; equal to the measured figure's frames when not compressing.
    """
    m = rb.memory()
    tables = m["table_bytes"] * m["transitions"] / rb.capacity if m["transitions"] else 0
    return {
        "lazyframes": int(m["bytes_held"] + tables),
        "lazyframes_uncompressed": int(m["unique_frames"] * m["frame_bytes"] + tables),
    }


# -- output -------------------------------------------------------------------------------
def _table(rows: list[list[str]], align: str) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for j, r in enumerate(rows):
        out.append(
            "  ".join(
                c.ljust(w) if a == "l" else c.rjust(w)
                for c, w, a in zip(r, widths, align, strict=True)
            )
        )
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def _mb(b: float) -> str:
    return f"{b / 2**20:,.1f} MiB"


def format_report(r: dict) -> str:
    """The report as plain aligned text."""
    t = r["time"]
    m = r["memory"]
    lines = [
        (
            f"lazyframes demo: {r['env']}, {r['num_envs']} env(s), stack {r['stack_size']} "
            f"-> observations {tuple(r['observation_shape'])}"
        ),
        r["measured"],
        (
            f"{r['steps']:,} env steps in {r['seconds']:.1f} s, {r['episodes_ended']} episodes "
            f"ended, random policy, {r['samples']:,} batches of {r['batch_size']} sampled "
            + ("(float32: ScaledFloatFrame's values)" if r.get("scale") else "(float32, x1/255)")
        ),
        "",
    ]
    tot = t["total_s"] or 1.0
    rows = [["time", "seconds", "share"]]
    for label, key in [
        ("env (ALE + preprocessing)" if _is_atari(r["env"]) else "env", "env_s"),
        ("stacking (inside the wrapper)", "stacking_s"),
        ("materialising policy input", "materialise_s"),
        ("replay add", "replay_add_s"),
        ("replay sample", "replay_sample_s"),
    ]:
        rows.append([label, f"{t[key]:.2f}", f"{100 * t[key] / tot:.1f}%"])
    other = tot - sum(
        t[k] for k in ("env_s", "stacking_s", "materialise_s", "replay_add_s", "replay_sample_s")
    )
    rows.append(["other (policy, loop, progress bar)", f"{other:.2f}", f"{100 * other / tot:.1f}%"])
    rows.append(["total", f"{tot:.2f}", "100.0%"])
    lines += _table(rows, "lrr")
    lat = r["sample_latency_us"]
    lines += [
        "",
        f"env steps/s: {r['env_steps_per_s']:,.0f}",
        f"share of time spent stacking (wrapper + materialising): {100 * r['stacking_share']:.2f}%",
        "sample latency (batch of {b}, obs + next_obs into float32): {lat}".format(
            b=r["batch_size"],
            lat="-"
            if lat["mean"] is None
            else f"mean {lat['mean']:,.1f} us, median {lat['median']:,.1f} us",
        ),
        "",
    ]
    n = r["transitions"]
    lz = m["lazyframes"]
    rows = [
        [
            "replay memory for " + f"{n:,} transitions",
            "held",
            "bytes/transition",
            "at 1M transitions",
            "vs lazyframes",
        ]
    ]
    scaled = " (ScaledFloatFrame)" if r.get("scale") else ""
    mine = [(f"lazyframes{scaled} (measured)", "lazyframes")]
    if r["compress"]:
        mine = [
            (f"lazyframes{scaled} compressed (measured)", "lazyframes"),
            ("lazyframes uncompressed (computed)", "lazyframes_uncompressed"),
        ]
    for label, key in mine + [
        ("SB3 optimize_memory_usage=True", "sb3_optimized"),
        ("naive obs + next_obs", "naive"),
        ("baselines-style list, after sampling", "baselines_after_sampling"),
        ("baselines scale=True, before sampling", "baselines_scaled"),
        ("baselines scale=True, after sampling", "baselines_scaled_after_sampling"),
    ]:
        per = m["per_transition"][key]
        rows.append(
            [
                label,
                _mb(m[key]),
                f"{per:,.0f}",
                f"{per * 1e6 / 2**30:,.1f} GiB",
                f"{m[key] / lz:.1f}x" if lz else "-",
            ]
        )
    lines += _table(rows, "lrrrr")
    if r["compress"]:
        lines += textwrap.wrap(
            f"{_compression_line(m)} (held raw: the live observations, the next delta's "
            "reference). 'uncompressed' is the same frames stored raw, each once.",
            width=100,
        )
    if m["frame_bytes"] < 1024:  # e.g. CartPole's 16 B
        lines += textwrap.wrap(
            f"These frames are {m['frame_bytes']:,} B: a frame's bookkeeping (its slot, "
            "references and tables, tens of bytes) outweighs it. lazyframes is for image "
            "frames, such as Atari's 7,056 B ones.",
            width=100,
        )
    lines += textwrap.wrap(
        f"frames: {m['unique_frames']:,} unique x {m['frame_bytes']:,} B; one observation = "
        f"{m['observation_bytes']:,} B. SB3 and naive are computed from the observation size "
        f"(+{SB3_SCALAR_BYTES} B of action/reward/done/timeout, as SB3 stores them); "
        f"baselines-style from the {m['sampled_observations']:,} observations this run sampled "
        f"(each then caches its own {m['observation_bytes']:,} B copy). "
        "baselines scale=True: wrap_deepmind(scale=True), whose ScaledFloatFrame under "
        "FrameStack makes every frame float32 (4 B a pixel); lazyframes' ScaledFloatFrame "
        "stores the bytes, as above (--scale measures it), and gives the same float32 values. "
        "'at 1M' extrapolates bytes/transition.",
        width=100,
    )
    if r.get("max_rss_bytes"):
        lines.append(
            f"process peak RSS (whole demo: Python, the env, the buffer): {_mb(r['max_rss_bytes'])}"
        )
    return "\n".join(lines)


def _compression_line(m: dict, *, short: bool = False) -> str:
    """The compressed store in one line: options, frames cold and hot, bytes, ratio."""
    if short:  # the plot's title
        c = m["compression"]
        return (
            f"compressed ({c['codec']}, group {c['group']}): {m['cold_frames']:,} frames cold in "
            f"{_mb(m['cold_bytes'])}, {m['hot_frames']:,} hot; {m['ratio']:.1f}x smaller"
        )
    opts = ", ".join(f"{k} {v}" for k, v in m["compression"].items())
    return (
        f"compressed ({opts}): {m['cold_frames']:,} frames compressed in "
        f"{_mb(m['cold_bytes'])}, {m['hot_frames']:,} held raw; frames {m['ratio']:.1f}x "
        "smaller than raw"
    )


def plot(r: dict, path: str) -> None:
    """Draw memory held versus transitions stored for the four buffers to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = r["series"]
    x = [p["transitions"] for p in s]
    lz = s[-1]["lazyframes"] if s else 0
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    mine = [("lazyframes", "lazyframes (measured)", "-")]
    if r["compress"]:
        mine = [
            ("lazyframes_uncompressed", "lazyframes uncompressed (computed)", "-"),
            ("lazyframes", "lazyframes compressed (measured)", "-"),
        ]
    for key, label, style in [
        ("naive", "naive obs + next_obs (computed)", ":"),
        ("baselines_after_sampling", "baselines-style list after sampling (computed)", "-."),
        ("sb3_optimized", "SB3 optimize_memory_usage (computed)", "--"),
        *mine,
    ]:
        y = [p[key] / 2**20 for p in s]
        ax.plot(x, y, linestyle=style, label=label, linewidth=2)
        if s:  # the final value, and its ratio to lazyframes'
            ratio = f" ({s[-1][key] / lz:.1f}x)" if lz and key != "lazyframes" else ""
            ax.annotate(
                f"{y[-1]:,.0f} MiB{ratio}",
                (x[-1], y[-1]),
                xytext=(4, 0),
                textcoords="offset points",
                va="center",
                fontsize=8,
            )
    ax.set_xlabel("transitions stored")
    ax.set_ylabel("memory held (MiB)")
    ax.set_title(
        f"Replay memory: {r['env']}, {r['num_envs']} env(s), stack {r['stack_size']}\n"
        f"{r['measured']}"
        + (f"\n{_compression_line(r['memory'], short=True)}" if r["compress"] else ""),
        fontsize=9,
    )
    ax.margins(x=0.18)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Check the options, run the demo, print the report; write --json / --plot."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_args(args)
        report = run(args)
    except UsageError as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    except KeyboardInterrupt:
        parser.exit(130, f"{parser.prog}: interrupted\n")
    print(format_report(report))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
        print(f"figures written to {args.json}")
    if args.plot:
        plot(report, args.plot)
        print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
