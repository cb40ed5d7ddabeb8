"""A seeded fuzzer through test_model.py's ``Run`` (LAZYFRAMES_FUZZ_SEEDS=200: more seeds)."""

import os

import numpy as np
import pytest
from test_model import KINDS, SHAPES, Run

SEEDS = int(os.environ.get("LAZYFRAMES_FUZZ_SEEDS", "4"))
OPS = 100


@pytest.mark.parametrize("seed", range(SEEDS))
def test_fuzz(seed, tmp_path):
    rng = np.random.default_rng([seed, 0xF022])
    num_envs = int(rng.integers(1, 5))
    capacity = int(rng.integers(num_envs, 8 * num_envs + 10))
    layout = str(rng.choice(list(SHAPES)))
    run = Run(capacity, num_envs=num_envs, layout=layout, seed=seed, prioritized=seed % 2 == 1,
              n_step=int(rng.integers(1, min(4, capacity // num_envs * num_envs) + 1)),
              alpha=float(rng.choice([0.0, 0.6, 1.0])),
              gamma=float(rng.choice([0.0, 0.5, 0.99, 1.0])),
              tell=layout != "stack" or rng.random() < 0.5,  # else decided by the first add
              compress=bool(rng.random() < 0.25),
              action_dtype=rng.choice([np.int64, np.uint8, np.float32]))  # fmt: skip
    p_end = float(rng.choice([0.05, 0.2, 0.5]))
    for _ in range(OPS):
        op = rng.random()
        if op < 0.75:
            kind = str(rng.choice(KINDS))
            run.add(kind, run.envs(kind), p_end=p_end)
            run.check()
        elif op < 0.87:
            s = run.sample()
            if run.prioritized and s is not None:
                p = rng.uniform(0.01, 5.0, s.indices.size)
                run.rb.update_priorities(s.indices, p)
                run.model.update_priorities(s.indices, p)
                numbers = [t.number for t in run.model.fifo]
                assert run.rb.priorities(numbers).tolist() == run.model.priorities(numbers)
                if numbers[0] > 0:  # a number evicted or cleared since is refused
                    with pytest.raises(ValueError, match="evicted"):
                        run.rb.update_priorities([numbers[0] - 1], [1.0])
        elif op < 0.92:
            run.rb.clear()
            run.model.clear()
            run.check()
        else:
            run.roundtrip(str(rng.choice(["save", "pickle"])), tmp_path / "rb.npz")
