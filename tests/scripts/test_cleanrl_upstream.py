"""CleanRL's own scripts with lazyframes' buffers, on CleanRL's pins, without SB3.

Opt-in, ``LAZYFRAMES_CLEANRL=<a CleanRL checkout>`` (``git clone
https://github.com/vwxyzjn/cleanrl``: the package index serves only cleanrl 0.4.8, of 2022,
which predates the scripts' buffer API). Needs Python 3.10 (CleanRL requires < 3.11;
``LAZYFRAMES_PYTHON310``, default ``python3.10`` on ``PATH``) and about 3 GB of downloads
(torch 2.4.1): minutes.

A venv gets CleanRL's pins from the checkout's ``requirements/requirements-atari.txt``
(numpy, gymnasium, torch, opencv-python, tyro, tensorboard; ale-py 0.9.0 for its 0.8.1,
whose ROMs are a separate download) and this checkout, built from source: NumPy stays at
CleanRL's pin, and SB3 is absent. Copies of ``dqn_atari.py`` and ``rainbow_atari.py`` get
the one-line changes docs/SB3.md shows (CleanRL's own SB3-style buffer module is deleted
from the copy, so nothing can fall back to it) and run a few hundred steps past
``learning_starts`` on Breakout; then ``rainbow_atari.py``'s own buffer and the drop-in are
filled with the same transitions, and every transition CleanRL's holds is sampled from ours
with the same values.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

CLEANRL = os.environ.get("LAZYFRAMES_CLEANRL", "")
pytestmark = pytest.mark.skipif(
    CLEANRL in ("", "0"),
    reason="opt-in: LAZYFRAMES_CLEANRL=<a CleanRL checkout> runs its scripts on its pins",
)

PINNED = ("numpy", "gymnasium", "torch", "opencv-python", "tyro", "tensorboard")
DQN_IMPORT = "from cleanrl_utils.buffers import ReplayBuffer"
MAIN = '\nif __name__ == "__main__":\n'

# runs a script as __main__ after registering the ALE envs (ale-py 0.8.1 did it by an
# entry point), then reports the type of its buffer ``rb`` and what it holds
LAUNCH = """
import runpy, sys
import ale_py  # noqa: F401
script = sys.argv[1]
sys.argv = sys.argv[1:]
rb = runpy.run_path(script, run_name="__main__")["rb"]
print("BUFFER", type(rb).__module__, type(rb).__name__, rb.memory()["transitions"])
"""

# CleanRL's Rainbow buffer and the drop-in, filled with the same transitions
DIFFERENTIAL = """
import runpy
import numpy as np
from lazyframes.cleanrl import PrioritizedReplayBuffer

theirs = runpy.run_path("upstream_rainbow.py", run_name="upstream")["PrioritizedReplayBuffer"]
rng = np.random.default_rng(0)
a = theirs(500, (4, 16, 16), "cpu", 3, 0.9)
b = PrioritizedReplayBuffer(500, (4, 16, 16), "cpu", 3, 0.9, seed=0)
obs = rng.integers(0, 255, (1, 4, 16, 16), np.uint8)
for t in range(400):
    nxt = np.concatenate([obs[:, 1:], rng.integers(0, 255, (1, 1, 16, 16), np.uint8)], 1)
    args = (obs, rng.integers(0, 6, 1), rng.normal(size=1).astype(np.float32), nxt,
            rng.random(1) < 0.05)
    a.add(*args)
    b.add(*args)
    obs = rng.integers(0, 255, obs.shape, np.uint8) if args[4][0] else nxt
held = {a.buffer_obs[i].tobytes(): (a.buffer_actions[i], a.buffer_rewards[i],
        a.buffer_next_obs[i].tobytes(), a.buffer_dones[i]) for i in range(a.size)}
seen = set()
for _ in range(200):
    s = b.sample(64)
    for i in range(64):
        key = s.observations[i].numpy().tobytes()
        if key in held:
            act, rew, nxt, done = held[key]
            assert s.actions[i, 0].item() == act
            assert abs(s.rewards[i, 0].item() - rew) <= 1e-5 * max(1.0, abs(rew))
            assert s.next_observations[i].numpy().tobytes() == nxt
            assert s.dones[i, 0].item() == done
            seen.add(key)
print("SAME", len(seen), len(held), b.size)
"""


@pytest.fixture(scope="module")
def cleanrl_venv(tmp_path_factory):
    """``(python, workdir)``: a venv of CleanRL's pins with this checkout, and the copies."""
    python310 = os.environ.get("LAZYFRAMES_PYTHON310") or shutil.which("python3.10")
    version = [python310 or "python3.10", "-c", "import sys; print(sys.version_info[:2])"]
    found = python310 and subprocess.run(version, capture_output=True, text=True).stdout
    assert found == "(3, 10)\n", "CleanRL needs Python 3.10: name it in LAZYFRAMES_PYTHON310"
    src = Path(CLEANRL)
    reqs = (src / "requirements" / "requirements-atari.txt").read_text()
    pins = [m.group(0) for name in PINNED for m in [re.search(rf"^{name}==\S+", reqs, re.M)] if m]
    assert len(pins) == len(PINNED), f"pins found: {pins}"
    tmp = tmp_path_factory.mktemp("cleanrl")
    subprocess.run([python310, "-m", "venv", str(tmp / "venv")], check=True)
    py = str(tmp / "venv" / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q"]
    subprocess.run([*pip, *pins, "ale-py==0.9.0"], check=True)
    subprocess.run([*pip, ROOT], check=True)
    work = tmp / "work"
    shutil.copytree(src / "cleanrl_utils", work / "cleanrl_utils")
    (work / "cleanrl_utils" / "buffers.py").unlink()
    dqn = (src / "cleanrl" / "dqn_atari.py").read_text()
    assert dqn.count(DQN_IMPORT) == 1, "dqn_atari.py imports its buffer otherwise now"
    (work / "dqn_atari.py").write_text(dqn.replace(DQN_IMPORT, docs_line("ReplayBuffer")))
    rainbow = (src / "cleanrl" / "rainbow_atari.py").read_text()
    assert rainbow.count(MAIN) == 1 and "class PrioritizedReplayBuffer:" in rainbow
    (work / "upstream_rainbow.py").write_text(rainbow)
    swapped = rainbow.replace(MAIN, f"\n{docs_line('PrioritizedReplayBuffer')}\n{MAIN}")
    (work / "rainbow_atari.py").write_text(swapped)
    (work / "launch.py").write_text(LAUNCH)
    return py, work


def docs_line(name: str) -> str:
    """The import line docs/SB3.md gives CleanRL users for ``name``."""
    line = f"from lazyframes.cleanrl import {name}"
    assert line in Path(ROOT, "docs", "SB3.md").read_text(), f"docs/SB3.md lacks {line!r}"
    return line


def run(py, work, *args):
    env = dict(os.environ, PYTHONPATH=str(work), OMP_NUM_THREADS="1")
    r = subprocess.run([py, *args], cwd=work, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_the_environment_keeps_cleanrls_pins_and_has_no_sb3(cleanrl_venv):
    py, work = cleanrl_venv
    code = "import numpy, gymnasium, importlib.util as u; print(numpy.__version__, "
    code += "gymnasium.__version__, u.find_spec('stable_baselines3') is None)"
    reqs = Path(CLEANRL, "requirements", "requirements-atari.txt").read_text()
    want = [re.search(rf"^{n}==(\S+)", reqs, re.M).group(1) for n in ("numpy", "gymnasium")]
    assert run(py, work, "-c", code).split() == [*want, "True"]


@pytest.mark.parametrize(
    "script, buffer",
    [("dqn_atari.py", "lazyframes.sb3 ReplayBuffer"),
     ("rainbow_atari.py", "lazyframes.cleanrl PrioritizedReplayBuffer")],
)  # fmt: skip
def test_cleanrls_script_trains_on_our_buffer(cleanrl_venv, script, buffer):
    py, work = cleanrl_venv
    out = run(py, work, "launch.py", script, "--env-id", "BreakoutNoFrameskip-v4",
              "--total-timesteps", "500", "--learning-starts", "200", "--buffer-size",
              "1000", "--batch-size", "32")  # fmt: skip
    assert "SPS:" in out  # printed by the training branch, after learning_starts
    assert f"BUFFER {buffer} 500" in out


def test_rainbow_buffers_hold_the_same_transitions(cleanrl_venv):
    py, work = cleanrl_venv
    same, held, size = map(int, run(py, work, "-c", DIFFERENTIAL).split()[1:])
    assert same == held > 300 and size >= held  # ours keeps the tail windows CleanRL drops
