"""The examples run end to end: real Atari, lazyframes' stacker and replay, torch DQN."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch  # noqa: F401  (installed by .ci/run as a CPU build: the example needs it)

ROOT = Path(__file__).resolve().parent.parent


def run_example(name, args, cwd):
    """Run ``examples/<name>`` with this checkout importable; returns its stdout."""
    return run_example_file(ROOT / "examples" / name, cwd, *args)


def run_example_file(path, cwd, *args):
    """Run the script ``path`` with this checkout importable; returns its stdout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    cmd = [sys.executable, str(path), *args]
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


#: A few steps of real Pong: 150 vector steps of 2 envs, 12 gradient steps.
DQN_ARGS = [
    "--env-id",
    "ALE/Pong-v5",
    "--total-timesteps",
    "300",
    "--num-envs",
    "2",
    "--learning-starts",
    "100",
    "--train-frequency",
    "4",
    "--batch-size",
    "8",
    "--buffer-size",
    "1000",
    "--target-network-frequency",
    "50",
    "--torch-threads",
    "1",
    "--seed",
    "1",
    "--progress-every",
    "0",
]


def test_dqn_atari_example_trains_a_few_steps(tmp_path):
    out = run_example("dqn_atari.py", DQN_ARGS, tmp_path)
    # a flushed progress line per step here, with the run's fraction and an ETA
    assert re.search(r"^global_step=300/300 \(100%\), SPS=\d+, ETA 0\.0 min, ", out, flags=re.M)
    m = re.search(
        r"dqn_atari summary: (\d+) env steps, (\d+) gradient steps, (\d+) episodes.*"
        r"final td_loss ([0-9.]+).*replay (\d+) transitions at ([0-9,]+) B each",
        out,
    )
    assert m, out
    steps, grads, _, loss, stored, per = m.groups()
    assert int(steps) == 300
    # 150 vector steps; a gradient step when step > 100 and step % 4 == 0: 104, 108, ..., 148
    assert int(grads) == 12
    assert float(loss) >= 0.0
    assert int(stored) == 300
    # frames are stored once: far below one 28,224-byte observation per transition
    assert int(per.replace(",", "")) < 28_224


def test_dqn_atari_example_prioritized(tmp_path):
    out = run_example("dqn_atari.py", [*DQN_ARGS, "--prioritized"], tmp_path)
    m = re.search(r"dqn_atari summary: 300 env steps, (\d+) gradient steps", out)
    assert m and int(m.group(1)) == 12, out
    m = re.search(r"^prioritized replay: alpha 0.6, max priority ([0-9.]+)$", out, flags=re.M)
    assert m and float(m.group(1)) >= 1.0, out


def test_cleanrl_dqn_atari_example_trains_a_few_steps(tmp_path):
    args = ["--total-timesteps", "300", "--learning-starts", "100", "--buffer-size", "1000"]
    args += ["--target-network-frequency", "50", "--torch-threads", "1", "--no-cuda"]
    out = run_example("cleanrl_dqn_atari.py", args, tmp_path)
    # CleanRL prints SPS every 100 steps once learning has started
    assert re.search(r"^SPS: \d+$", out, flags=re.M), out


def _readme_blocks():
    """The README's python blocks, each with the heading it sits under."""
    text = (ROOT / "README.md").read_text()
    out = []
    for m in re.finditer(r"```python\n(.*?)```", text, flags=re.S):
        heading = re.findall(r"^#{1,4} ([A-Z].*)$", text[: m.start()], flags=re.M)[-1]
        out.append((heading, m.group(1)))
    return out


README_BLOCKS = _readme_blocks()


def test_readme_has_its_python_examples():
    assert len(README_BLOCKS) >= 5, "README lost its python examples"


@pytest.mark.parametrize(
    "heading, code", README_BLOCKS, ids=[f"{i}-{h}" for i, (h, _) in enumerate(README_BLOCKS)]
)
def test_readme_python_block_runs_on_its_own(tmp_path, heading, code):
    """Each python block of the README is a whole program: a reader can paste it alone."""
    (tmp_path / "block.py").write_text(code)
    out = run_example_file(tmp_path / "block.py", tmp_path)
    assert "Traceback" not in out
