"""The worker process of bench_add: times one lazyframes revision's replay buffer, when told.

Run as ``python bench/_add_worker.py SRC ROLE`` by ``bench_add``: ``SRC`` (a source
checkout with the compiled core built in place) goes first on ``sys.path``, so
``import lazyframes`` is that revision's; ``ROLE`` is ``ours`` (the checkout the bench
runs from: it also times the baselines restatement and the C floor) or ``peer``.

It reads one JSON request per line on stdin and answers one JSON line on stdout
(anything else the process prints goes to stderr):

- ``{"op": "setup", "case": NAME, "params": {...}}``: build the case (its env stand-in,
  buffer, inputs), fill the buffer until full and evicting; answers the variants it
  will time (``lf``: the revision's buffer; ``baselines``, ``floor``) or
  ``{"unsupported": why}`` when the revision's API cannot run the case;
- ``{"op": "block", "case": NAME}``: time one block of the case; answers
  ``{"us": {variant: microseconds per unit}, "garbage": objects}`` (the objects of
  cyclic garbage the block left, which the collector then freed);
- ``{"op": "quit"}``.

The parent sends blocks to its workers in turns, so one worker at a time runs and the
blocks of all revisions interleave in time. The cyclic garbage collector runs before
each block and is paused during it (as ``timeit`` does): a collection's cost depends on
every object of the process (ours' worker also holds the baselines restatement's
tuples), not on the code timed. The timed calls should leave no cyclic garbage (the
parent notes any a block reports: its collection was not timed).

This file must import nothing of the benchmark that imports lazyframes: a revision
older than the checkout lacks modules.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path

H = W = 84
K = 4


def _start(src: str):
    """Put ``src`` first on sys.path, import its lazyframes; check it is that one, compiled."""
    sys.path.insert(0, src)
    os.environ.pop("LAZYFRAMES_NO_EXTENSIONS", None)
    import lazyframes

    where = Path(lazyframes.__file__).resolve()
    if Path(src).resolve() not in where.parents:
        raise RuntimeError(f"imported lazyframes from {where}, not from {src}")
    if getattr(lazyframes, "IMPLEMENTATION", "compiled") != "compiled":  # 0.1 and 0.2 had a twin
        raise RuntimeError(
            f"lazyframes in {src} has no compiled core (build it: cd {src} && python setup.py "
            f"build_ext --inplace)"
        )
    return lazyframes


class FrameSource:
    """Frames that change every step: a bank of random frames, each stamped with a counter.

    ``next(n)`` returns a new ``(n, 84, 84)`` uint8 array (a fancy-indexed copy).
    """

    def __init__(self, seed, bank=512):
        import numpy as np

        rng = np.random.default_rng(seed)
        self.np = np
        self.bank = rng.integers(0, 256, (bank, H, W), dtype=np.uint8)
        self.t = 0

    def next(self, n):
        np = self.np
        idx = (self.t + np.arange(n)) % len(self.bank)
        out = self.bank[idx]
        out[:, 0, :8] = np.frombuffer(
            (self.t + np.arange(n, dtype=np.int64)).tobytes(), np.uint8
        ).reshape(n, 8)
        self.t += n
        return out


def single_env(src: FrameSource):
    """A Gymnasium env whose every step returns a new 84x84 frame; episodes never end."""
    import gymnasium as gym
    import numpy as np

    class Env(gym.Env):
        metadata = {"render_modes": []}  # noqa: RUF012 - Gymnasium's class attribute
        observation_space = gym.spaces.Box(0, 255, (H, W), np.uint8)
        action_space = gym.spaces.Discrete(6)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return src.next(1)[0], {}

        def step(self, action):
            return src.next(1)[0], 1.0, False, False, {}

    return Env()


def vector_env(n: int, src: FrameSource):
    """A Gymnasium VectorEnv of ``n`` envs returning a new ``(n, 84, 84)`` batch each step."""
    import gymnasium as gym
    import numpy as np

    class VecEnv(gym.vector.VectorEnv):
        def __init__(self):
            self.num_envs = n
            self.single_observation_space = gym.spaces.Box(0, 255, (H, W), np.uint8)
            self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, n)
            self.single_action_space = gym.spaces.Discrete(6)
            self.action_space = gym.vector.utils.batch_space(self.single_action_space, n)
            self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
            self.rewards, self.flags = np.ones(n), np.zeros(n, np.bool_)

        def reset(self, *, seed=None, options=None):
            return src.next(n), {}

        def step(self, actions):
            return src.next(n), self.rewards, self.flags, self.flags, {}

    return VecEnv()


class AddCase:
    """``ReplayBuffer.add`` of one kind of observation; one unit is one transition.

    ``kind``: ``"lazybatch"`` (the vector stacker's LazyBatch, ``envs`` envs),
    ``"lazyframes"`` (FrameStackObservation's LazyFrames, one env) or ``"ndarray"``
    (fresh ``(k, 84, 84)`` / ``(envs, k, 84, 84)`` uint8 stacks, as SB3's
    VecFrameStack and ale-py give them). The inputs of each chunk (``chunk`` env steps)
    are made before the chunk is timed, then every variant adds the same objects, the
    order of the variants alternating from chunk to chunk: the timed loop holds the
    add calls only.
    """

    def __init__(self, lf, role, kind, envs, params):
        import numpy as np

        from lazyframes.replay import ReplayBuffer

        self.np, self.kind, self.E = np, kind, envs
        p = params
        self.capacity, self.seed = p["capacity"], p["seed"]
        self.chunk = max(1, p["chunk_transitions"] // envs)
        self.block_units = p["block_transitions"]
        self.src = FrameSource(p["seed"])
        self.rb = ReplayBuffer(self.capacity, num_envs=envs, seed=p["seed"])
        E = envs
        self.a, self.r = np.zeros(E, np.int64), np.ones(E, np.float32)
        self.f = np.zeros(E, np.bool_)
        if kind == "lazybatch":
            import lazyframes.vector as lv

            self.env = lv.FrameStackObservation(vector_env(E, self.src), K)
            self.obs, _ = self.env.reset(seed=p["seed"])
        elif kind == "lazyframes":
            self.env = lf.FrameStackObservation(single_env(self.src), K)
            self.obs, _ = self.env.reset(seed=p["seed"])
        else:
            first = self.src.next(E)
            self.obs = np.repeat(first[:, None], K, axis=1)  # reset padding
            if E == 1:
                self.obs = self.obs[0]
        self.variants = {"lf": self._lf}
        if role == "ours" and kind != "ndarray":
            from baselines import BaselinesReplayBuffer

            self.base = BaselinesReplayBuffer(self.capacity)
            self.variants["baselines"] = self._baselines
        if role == "ours" and kind == "ndarray":
            floor = getattr(sys.modules["lazyframes._core"], "_ingest_floor", None)
            if floor is not None:
                self.floor = floor
                self.previous = np.full((E, K), -1, np.int64)
                self.arena = np.empty((self.capacity + E * K, H, W), np.uint8)
                self.arena_pos = 0
                self.variants["floor"] = self._floor
        self.flip = False
        # the warm-up: fill, wrap around and keep evicting for half a buffer more
        steps = (self.capacity + self.capacity // 2) // E + 1
        for _ in range(max(1, -(-steps // self.chunk))):
            self._chunk()
        if len(self.rb) != self.rb.capacity:
            held = f"{len(self.rb)} of {self.rb.capacity}"
            raise RuntimeError(f"the buffer holds {held} transitions after the warm-up")

    # -- inputs ------------------------------------------------------------------------------
    def _steps(self):
        """The next ``chunk`` transitions' inputs: a list of (obs, next_obs), made untimed."""
        np, E, out = self.np, self.E, []
        obs = self.obs
        for _ in range(self.chunk):
            if self.kind == "ndarray":
                new = self.src.next(E)
                if E == 1:
                    nxt = np.concatenate([obs[1:], new])  # a new (k, 84, 84) array
                else:
                    nxt = np.concatenate([obs[:, 1:], new[:, None]], axis=1)
            elif self.kind == "lazybatch":
                nxt = self.env.step(self.a)[0]
            else:
                nxt = self.env.step(0)[0]
            out.append((obs, nxt))
            obs = nxt
        self.obs = obs
        return out

    # -- the timed variants ------------------------------------------------------------------
    def _lf(self, pairs):
        add, perf = self.rb.add, time.perf_counter
        if self.E == 1:  # a Python int action, a float reward, bool flags
            t0 = perf()
            for o, n in pairs:
                add(o, 0, 1.0, n, False, False)
            return perf() - t0
        a, r, f = self.a, self.r, self.f  # int64, float32, bool arrays (E,)
        t0 = perf()
        for o, n in pairs:
            add(o, a, r, n, f, f)
        return perf() - t0

    def _baselines(self, pairs):
        """One call per transition: a LazyBatch is split per env (``batch[i]``) untimed."""
        add, perf = self.base.add, time.perf_counter
        if self.E == 1:
            t0 = perf()
            for o, n in pairs:
                add(o, 0, 1.0, n, False)
            return perf() - t0
        a, r, f = self.a, self.r, self.f
        calls = [(o[i], a[i], r[i], n[i], f[i]) for o, n in pairs for i in range(self.E)]
        t0 = perf()
        for o, a_, r_, n, d in calls:
            add(o, a_, r_, n, d)
        return perf() - t0

    def _floor(self, pairs):
        stacks = [n for _, n in pairs]
        t0 = time.perf_counter()
        self.arena_pos = self.floor(stacks, self.previous, self.arena, self.arena_pos)
        return time.perf_counter() - t0

    def _chunk(self):
        """Make one chunk's inputs, then time every variant on them: {variant: s}, units."""
        pairs = self._steps()
        names = list(self.variants)
        if self.flip:
            names.reverse()
        self.flip = not self.flip
        return {v: self.variants[v](pairs) for v in names}, len(pairs) * self.E

    def block(self):
        """One block: a chunk to warm the caches up (untimed), then chunks to ``block_units``."""
        self._chunk()
        total = dict.fromkeys(self.variants, 0.0)
        units = 0
        while units < self.block_units:
            t, n = self._chunk()
            for v in total:
                total[v] += t[v]
            units += n
        return {v: s / units * 1e6 for v, s in total.items()}


class SampleCase:
    """``sample(32, out=)`` (uint8) of a full buffer, or prioritized sample + update; per call.

    The buffer (capacity transitions of 8 envs from the vector stacker, frames changing
    every step, uncompressed) is filled once at setup.
    """

    def __init__(self, lf, role, prioritized, params):
        import numpy as np

        from lazyframes import replay

        p = params
        E, B = 8, 32
        if prioritized:
            if not hasattr(replay, "PrioritizedReplayBuffer"):
                raise Unsupported("no PrioritizedReplayBuffer in this revision")
            self.rb = replay.PrioritizedReplayBuffer(
                p["capacity"], alpha=0.6, num_envs=E, seed=p["seed"]
            )
        else:
            self.rb = replay.ReplayBuffer(p["capacity"], num_envs=E, seed=p["seed"])
        import lazyframes.vector as lv

        env = lv.FrameStackObservation(vector_env(E, FrameSource(p["seed"])), K)
        obs, _ = env.reset(seed=p["seed"])
        a, r, f = np.zeros(E, np.int64), np.ones(E, np.float32), np.zeros(E, np.bool_)
        for _ in range((p["capacity"] + p["capacity"] // 4) // E + 1):
            nxt = env.step(a)[0]
            self.rb.add(obs, a, r, nxt, f, f)
            obs = nxt
        del env, obs, nxt  # the buffer keeps the frames it refers to
        rng = np.random.default_rng(p["seed"])
        self.prios = [rng.uniform(0.01, 2.0, B) for _ in range(16)]
        self.out = (np.empty((B, K, H, W), np.uint8), np.empty((B, K, H, W), np.uint8))
        self.B, self.i = B, 0
        self.prioritized = prioritized
        self.chunk = p["chunk_transitions"]  # calls per timed loop
        self.block_units = p["block_calls"]
        self.variants = {"lf": None}
        self._calls(self.chunk)  # warm-up

    def _calls(self, n):
        rb, B, out, perf = self.rb, self.B, self.out, time.perf_counter
        if not self.prioritized:
            sample = rb.sample
            t0 = perf()
            for _ in range(n):
                sample(B, out=out)
            return perf() - t0
        sample, update, prios = rb.sample, rb.update_priorities, self.prios
        i = self.i
        t0 = perf()
        for j in range(n):
            s = sample(B, beta=0.4, out=out)
            update(s.indices, prios[(i + j) % 16])
        t = perf() - t0
        self.i = i + n
        return t

    def block(self):
        self._calls(self.chunk)  # warm the caches up, untimed
        total, units = 0.0, 0
        while units < self.block_units:
            total += self._calls(self.chunk)
            units += self.chunk
        return {"lf": total / units * 1e6}


class Unsupported(Exception):
    """The revision's API cannot run this case (the message says what is missing)."""


def make_case(lf, role, name, params):
    if name == "add_lazybatch_8":
        return AddCase(lf, role, "lazybatch", 8, params)
    if name == "add_lazyframes_1":
        return AddCase(lf, role, "lazyframes", 1, params)
    if name == "add_ndarray_1":
        return AddCase(lf, role, "ndarray", 1, params)
    if name == "add_ndarray_8":
        return AddCase(lf, role, "ndarray", 8, params)
    if name == "sample_32":
        return SampleCase(lf, role, False, params)
    if name == "prioritized_32":
        return SampleCase(lf, role, True, params)
    raise ValueError(f"unknown case {name!r}")


def main(argv):
    src, role = argv[0], argv[1]
    proto = os.fdopen(os.dup(1), "w", buffering=1)  # the answers; stray prints go to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def answer(**msg):
        proto.write(json.dumps(msg) + "\n")
        proto.flush()

    try:
        lf = _start(src)
    except Exception as e:
        answer(ok=False, error=f"{type(e).__name__}: {e}")
        return 1
    import numpy as np

    floor = hasattr(sys.modules["lazyframes._core"], "_ingest_floor")
    answer(ok=True, version=lf.__version__, file=lf.__file__, numpy=np.__version__, floor=floor)
    cases = {}
    for line in sys.stdin:
        req = json.loads(line)
        op = req.get("op")
        try:
            if op == "quit":
                answer(ok=True)
                return 0
            if op == "setup":
                name = req["case"]
                try:
                    case = make_case(lf, role, name, req["params"])
                except Unsupported as e:
                    answer(ok=True, unsupported=str(e))
                    continue
                except TypeError as e:  # an argument the revision's API does not take
                    answer(ok=True, unsupported=f"{type(e).__name__}: {e}")
                    continue
                cases[name] = case
                gc.collect()
                answer(ok=True, variants=list(case.variants))
            elif op == "block":
                gc.collect()  # untimed; then paused while the block runs (as timeit does)
                gc.disable()
                try:
                    us = cases[req["case"]].block()
                finally:
                    garbage = gc.collect()  # cyclic garbage the block made, reported
                    gc.enable()
                answer(ok=True, us=us, garbage=garbage)
            else:
                answer(ok=False, error=f"unknown op {op!r}")
        except Exception as e:
            answer(ok=False, error=f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
