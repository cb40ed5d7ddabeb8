"""The differential fuzzer (``tests/fuzz_worker.py``): compiled core and twin in lockstep.

Each batch of seeds runs in its own subprocess, so a crash (a signal) fails the test and
names the seed it died in. A few seeds by default; ``LAZYFRAMES_FUZZ_SEEDS=N`` runs N.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("fuzz_worker.py")
SEEDS = int(os.environ.get("LAZYFRAMES_FUZZ_SEEDS", "40"))
STEPS = 200
BATCH = 10  # seeds per subprocess

pytestmark = pytest.mark.fuzz


@pytest.mark.parametrize("first", range(0, SEEDS, BATCH))
def test_cores_agree(first):
    seeds = [str(s) for s in range(first, min(first + BATCH, SEEDS))]
    cmd = [sys.executable, str(WORKER), "--steps", str(STEPS), *seeds]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    started = [line.split()[1] for line in r.stdout.splitlines() if line.startswith("seed ")]
    seed = started[-1] if started else " ".join(seeds)
    repro = f"reproduce: python tests/{WORKER.name} --steps {STEPS} {seed}"
    if r.returncode < 0:
        msg = f"the worker died of signal {-r.returncode} in seed {seed}; {repro}\n{r.stderr}"
        pytest.fail(msg, pytrace=False)
    if r.returncode != 0:
        pytest.fail(f"seed {seed}; {repro}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}", pytrace=False)
    assert r.stdout.splitlines()[-1] == f"ok {len(seeds)} seeds", r.stdout
