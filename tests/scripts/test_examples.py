"""The examples run end to end: real Atari, lazyframes' stacker and replay, torch DQN."""

import os
import re
from pathlib import Path

import pytest
import torch  # noqa: F401  (installed by .ci/run as a CPU build: the example needs it)
from conftest import ROOT, assert_one_line_error, run_guarded, run_ok


def run_example(name, args, cwd):
    """Run ``examples/<name>`` from ``cwd`` with this checkout importable; its stdout."""
    return run_ok(os.path.join(ROOT, "examples", name), *args, cwd=cwd)


#: A few steps of real Pong: 150 vector steps of 2 envs, 12 gradient steps.
DQN_ARGS = [
    "--env-id", "ALE/Pong-v5", "--total-timesteps", "300", "--num-envs", "2",
    "--learning-starts", "100", "--train-frequency", "4", "--batch-size", "8",
    "--buffer-size", "1000", "--target-network-frequency", "50", "--torch-threads", "1",
    "--seed", "1", "--progress-every", "0",
]  # fmt: skip


@pytest.mark.parametrize("prioritized", [False, True])
def test_dqn_atari_example_trains_a_few_steps(tmp_path, prioritized):
    out = run_example("dqn_atari.py", DQN_ARGS + ["--prioritized"] * prioritized, tmp_path)
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
    assert int(grads) == 12 and float(loss) >= 0.0
    assert int(stored) == 300
    # frames are stored once: far below one 28,224-byte observation per transition
    assert int(per.replace(",", "")) < 28_224
    m = re.search(r"^prioritized replay: alpha 0.6, max priority ([0-9.]+)$", out, flags=re.M)
    assert (m is not None) == prioritized and (m is None or float(m.group(1)) >= 1.0), out


R2D2_ARGS = [
    "--total-timesteps", "400", "--num-envs", "2", "--learning-starts", "60",
    "--batch-size", "4", "--burn-in", "2", "--length", "6", "--buffer-size", "1000",
    "--target-network-frequency", "5", "--compress",
]  # fmt: skip


def test_r2d2_atari_example_trains_on_windows(tmp_path):
    out = run_example("r2d2_atari.py", R2D2_ARGS, tmp_path)
    m = re.search(
        r"r2d2_atari summary: 400 env steps, (\d+) gradient steps on 4 windows of 8 steps, "
        r"\d+ episodes, final loss ([0-9.]+), \d+ steps/s, replay 400 steps at ([0-9,]+) B",
        out,
    )
    assert m, out
    # 200 vector steps; an update when step >= 60 and step % 4 == 0: 60, 64, ..., 196
    assert int(m.group(1)) == 35 and float(m.group(2)) >= 0.0
    assert int(m.group(3).replace(",", "")) < 7_056  # frames stored once, compressed


@pytest.mark.parametrize("args, message", [
    (["--length", "0"], "--length must be >= 1, got 0"),
    (["--burn-in", "-1"], "--burn-in must be >= 0, got -1"),
    (["--eta", "2"], "--eta must be in [0, 1], got 2.0"),
    (["--env-id", "CartPole-v1"], "--env-id 'CartPole-v1' is not an ALE game"),
    (["--env-id", "Pong-v5"], "(Atari games are ALE/<Game>-v5, e.g. ALE/Pong-v5)"),
    (["--learning-starts", "23"], "(23) must be at least --burn-in + --length (24)"),
    (["--buffer-size", "60"], "(--burn-in + --length) (96): each env's share holds whole windows"),
])  # fmt: skip
def test_r2d2_atari_refuses_a_bad_option_in_one_line_before_any_work(args, message):
    assert_one_line_error(run_guarded("examples/r2d2_atari.py", *args), message)


def test_jax_dqn_example_feeds_sample_out_into_device_put(tmp_path):
    args = ["--total-timesteps", "400", "--num-envs", "2", "--learning-starts", "60",
            "--batch-size", "8", "--buffer-size", "1000",
            "--target-network-frequency", "5"]  # fmt: skip
    out = run_example("jax_dqn.py", args, tmp_path)
    m = re.search(r"jax_dqn summary: 400 env steps, (\d+) gradient steps, final loss ([0-9.]+), "
                  r"\d+ steps/s, replay 400 transitions at ([0-9,]+) B each", out)  # fmt: skip
    assert m, out
    assert int(m.group(1)) == 35 and float(m.group(2)) >= 0.0  # steps 60, 64, ..., 196
    assert int(m.group(3).replace(",", "")) < 7_056  # compressed frames


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--gamma", "2"], "--gamma must be in [0, 1], got 2.0"),
    (["--env-id", "CartPole-v1"], "--env-id 'CartPole-v1' is not an ALE game"),
])  # fmt: skip
def test_jax_dqn_refuses_a_bad_option_in_one_line_before_any_work(args, message):
    assert_one_line_error(run_guarded("examples/jax_dqn.py", *args), message)


def test_jax_dqn_names_the_install_command_of_jax():
    r = run_guarded("examples/jax_dqn.py", block=["jax"])
    assert_one_line_error(r, "needs jax, not installed: python -m pip install jax")


INSTALL_TORCH = (
    "python -m pip install torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu"
)
INSTALL_ATARI = "python -m pip install -e '.[atari]'"


@pytest.mark.parametrize("args, message", [
    (["--env-id", "ALE/Pongg-v5"], "--env-id 'ALE/Pongg-v5': Environment `Pongg` doesn't"),
    (["--env-id", "Breakout"], "--env-id 'Breakout': No registered env with id: Breakout"),
    (["--env-id", "not an id"], "--env-id 'not an id': Malformed environment ID"),
    (["--env-id", "CartPole-v1"], "--env-id 'CartPole-v1' is not an ALE game"),
    (["--buffer-size", "0"], "--buffer-size must be >= 1, got 0"),
    (["--num-envs", "0"], "--num-envs must be >= 1, got 0"),
    (["--total-timesteps", "0"], "--total-timesteps must be >= 1, got 0"),
    (["--num-envs", "4", "--buffer-size", "2"], "--buffer-size (2) must be at least"),
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--train-frequency", "0"], "--train-frequency must be >= 1, got 0"),
    (["--target-network-frequency", "0"], "--target-network-frequency must be >= 1"),
    (["--learning-starts", "-1"], "--learning-starts must be >= 0, got -1"),
    (["--gamma", "1.5"], "--gamma must be in [0, 1], got 1.5"),
    (["--learning-rate", "0"], "--learning-rate must be > 0, got 0.0"),
    (["--learning-rate", "nan"], "--learning-rate must be > 0, got nan"),
    (["--seed", "-3"], "--seed must be >= 0, got -3"),
    (["--total-timesteps", "lots"], "argument --total-timesteps: invalid int value: 'lots'"),
    (["--no-such-option"], "unrecognized arguments: --no-such-option"),
])  # fmt: skip
def test_dqn_atari_refuses_a_bad_option_in_one_line_before_any_work(args, message):
    assert_one_line_error(run_guarded("examples/dqn_atari.py", *args), message)


@pytest.mark.parametrize("script, block, command", [
    ("dqn_atari.py", ["torch"], INSTALL_TORCH),
    ("dqn_atari.py", ["ale_py"], INSTALL_ATARI),
    ("dqn_atari.py", ["torch", "cv2"], f"{INSTALL_TORCH} && {INSTALL_ATARI}"),
    ("apex_ray.py", ["ray"], "python -m pip install -e '.[distributed]'"),
    ("apex_ray.py", ["ray", "cv2"], "python -m pip install -e '.[atari,distributed]'"),
])  # fmt: skip
def test_examples_name_the_install_commands_of_missing_packages(script, block, command):
    r = run_guarded(f"examples/{script}", *["--smoke"] * (script == "apex_ray.py"), block=block)
    names = {"cv2": "opencv-python-headless", "ale_py": "ale-py"}
    message = f"needs {', '.join(names.get(m, m) for m in block)}, not installed: {command}"
    assert_one_line_error(r, message)
    assert r.stderr == f"{script}: error: {message}\n"


@pytest.mark.parametrize("args, message", [
    (["--env-id", "ALE/Pongg-v5"], "--env-id 'ALE/Pongg-v5': Environment `Pongg` doesn't"),
    (["--smoke", "--env-id", "CartPole-v1"], "--env-id 'CartPole-v1' is not an ALE game"),
    (["--num-actors", "0"], "--num-actors must be >= 1, got 0"),
    (["--envs-per-actor", "0"], "--envs-per-actor must be >= 1, got 0"),
    (["--rounds", "0"], "--rounds must be >= 1, got 0"),
    (["--steps-per-round", "-1"], "--steps-per-round must be >= 1, got -1"),
    (["--capacity", "0"], "--capacity (0) must be at least the number of envs"),
    (["--smoke", "--n-step", "5000"], "--n-step (5000) must be at most the capacity (1000"),
    (["--gamma", "-0.5"], "--gamma must be in [0, 1], got -0.5"),
    (["--num-actors", "two"], "argument --num-actors: invalid int value: 'two'"),
    (["--address", "127.0.0.1:9"], "--address 127.0.0.1:9: nothing answers there"),
    (["--address", "ray://[::1]:9"], "--address ray://[::1]:9: nothing answers there"),
])  # fmt: skip
def test_apex_ray_refuses_a_bad_option_in_one_line_before_ray_starts(args, message):
    assert_one_line_error(run_guarded("examples/apex_ray.py", *args), message)


def test_cleanrl_dqn_atari_example_trains_a_few_steps(tmp_path):
    args = ["--total-timesteps", "300", "--learning-starts", "100", "--buffer-size", "1000"]
    args += ["--target-network-frequency", "50", "--torch-threads", "1", "--no-cuda"]
    out = run_example("cleanrl_dqn_atari.py", args, tmp_path)
    # CleanRL prints SPS every 100 steps once learning has started
    assert re.search(r"^SPS: \d+$", out, flags=re.M), out


def _readme_blocks():
    """The python programs of the README and its docs/ pages (not ``>>>`` sessions: doctests).

    Each with its file and the heading it sits under.
    """
    out = []
    pages = ("WRAPPERS", "REPLAY", "PRIORITIZED", "SB3", "DISTRIBUTED", "BENCHMARKS", "API")
    for path in [Path(ROOT, "README.md"), *(Path(ROOT, "docs", f"{p}.md") for p in pages)]:
        text = path.read_text()
        for m in re.finditer(r"```python\n(.*?)```", text, flags=re.S):
            if m.group(1).lstrip().startswith(">>>"):
                continue
            heading = re.findall(r"^#{1,4} ([A-Z].*)$", text[: m.start()], flags=re.M)[-1]
            out.append((f"{path.name}: {heading}", m.group(1)))
    return out


README_BLOCKS = _readme_blocks()


def test_readme_has_its_python_examples():
    assert len(README_BLOCKS) >= 5, "README and docs/ lost their python examples"
    assert README_BLOCKS[0][0] == "README.md: One example"


@pytest.mark.parametrize(
    "heading, code", README_BLOCKS, ids=[f"{i}-{h}" for i, (h, _) in enumerate(README_BLOCKS)]
)
def test_readme_python_block_runs_on_its_own(tmp_path, heading, code):
    """Each python program of the README and docs/ is whole: a reader can paste it alone."""
    (tmp_path / "block.py").write_text(code)
    out = run_ok(tmp_path / "block.py", cwd=tmp_path)
    assert "Traceback" not in out
