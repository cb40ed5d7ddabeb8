"""fuzz_worker.py, a subprocess per batch of seeds (LAZYFRAMES_FUZZ_SEEDS=N, 40 by default)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SEEDS, STEPS, BATCH = int(os.environ.get("LAZYFRAMES_FUZZ_SEEDS", "40")), 200, 10


@pytest.mark.fuzz
@pytest.mark.parametrize("first", range(0, SEEDS, BATCH))
def test_calls_match_the_oracle(first):
    seeds = [str(s) for s in range(first, min(first + BATCH, SEEDS))]
    cmd = [sys.executable, str(TESTS / "fuzz_worker.py"), "--steps", str(STEPS), *seeds]
    # this checkout, and tests/ for the oracle
    path = [str(TESTS.parents[1]), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env, check=False)
    started = [line.split()[1] for line in r.stdout.splitlines() if line.startswith("seed ")]
    seed = started[-1] if started else " ".join(seeds)
    how = f"died of signal {-r.returncode}" if r.returncode < 0 else f"exited {r.returncode}"
    repro = f"PYTHONPATH=.:tests python tests/hardening/fuzz_worker.py --steps {STEPS} {seed}"
    if r.returncode != 0:
        pytest.fail(f"seed {seed}: the worker {how}; {repro}\n{r.stderr[-4000:]}", pytrace=False)
    assert r.stdout.splitlines()[-1] == f"ok {len(seeds)} seeds", r.stdout
