"""SB3's own tests against the drop-ins, from the sdist of the installed Stable-Baselines3.

Opt-in, ``LAZYFRAMES_SB3_UPSTREAM=1`` (a download and a minute or two): the sdist ships SB3's
``tests/`` (nothing of it is kept in this repository). Each file below is run with our classes
imported after SB3's import line; that line and every other edit are textual substitutions that
must occur exactly as often as stated, so that a change upstream fails here instead of testing
something else:

- ``test_vec_envs.py`` with ``lazyframes.sb3.VecFrameStack``, unchanged otherwise: all of it.
- ``test_n_step_replay.py`` with ``NStepReplayBuffer`` and ``ReplayBuffer``, its ``Box((4,))``
  float observations turned into ``(4, 8, 8)`` uint8 images of the same values: the n-step
  reward, done, discount and window tests.
- ``test_buffers.py`` with ``ReplayBuffer``, its ``DummyEnv`` observing ``(1, 8, 8)`` images
  of its values: VecNormalize on sampling and the device of the samples.

What stays out is in ``DESELECTED``, each with its reason: tests that train ``MlpPolicy``
models on vector observations (which these buffers refuse by design: they store image frames),
tests of SB3's other classes (Dict, HER and rollout buffers, env checker) with no drop-in in
them, and tests that read or write SB3's preallocated arrays (``buffer.dones``,
``buffer.observations``), which these buffers do not have.
"""

import os
import subprocess
import sys
import tarfile
from pathlib import PurePosixPath

import pytest

pytestmark = pytest.mark.skipif(
    os.environ.get("LAZYFRAMES_SB3_UPSTREAM", "") in ("", "0"),
    reason="opt-in: LAZYFRAMES_SB3_UPSTREAM=1 downloads SB3's sdist and runs its tests",
)

# test (or test[parametrization token]) -> why it is not run
DESELECTED = {
    "test_n_step_replay.py": {
        "test_run": "trains SAC, DQN and TD3 MlpPolicy on CartPole/Pendulum (vector "
        "observations) and asserts SB3 chose its own NStepReplayBuffer",
        "test_n_steps_warns_with_custom_replay_buffer_class": "SAC MlpPolicy on Pendulum: "
        "vector observations, refused by design",
        "test_n_steps_custom_class_no_warnings": "SAC MlpPolicy on Pendulum: vector "
        "observations, refused by design",
        "test_n_steps_with_dict_obs": "SAC on a Dict space with SB3's DictReplayBuffer and "
        "HerReplayBuffer: no drop-in in it (Dict observations are refused by design)",
        "test_nstep_no_terminations": "writes SB3's private array (buffer.dones[pos - 1] = "
        "True), which ours does not have; its asserts before that line pass",
    },
    "test_buffers.py": {
        "test_env": "checks SB3's test envs with check_env: no buffer in it",
        "test_replay_buffer_normalization[DictReplayBuffer]": "SB3's DictReplayBuffer: "
        "Dict observations are refused by design",
        "test_device_buffer[DictReplayBuffer]": "SB3's DictReplayBuffer: Dict observations "
        "are refused by design",
        "test_device_buffer[RolloutBuffer]": "SB3's on-policy RolloutBuffer: no drop-in",
        "test_device_buffer[DictRolloutBuffer]": "SB3's on-policy DictRolloutBuffer: no drop-in",
        "test_buffer_dtypes": "reads SB3's preallocated arrays (replay_buffer.observations, "
        ".actions) and samples an empty buffer after setting full = True; its observations "
        "are (1,) Boxes of every dtype, alone or in a Dict",
        "test_custom_rollout_buffer": "A2C MlpPolicy with SB3's rollout buffers: no drop-in",
    },
}


@pytest.fixture(scope="module")
def sb3_tests(tmp_path_factory):
    """The files of the installed SB3's ``tests/``, from its sdist: ``{name: text}``."""
    import stable_baselines3

    d, version = tmp_path_factory.mktemp("sdist"), stable_baselines3.__version__
    download = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                "-q", "-d", str(d), f"stable-baselines3=={version}"]  # fmt: skip
    subprocess.run(download, check=True)
    with tarfile.open(next(d.glob("stable_baselines3-*.tar.gz"))) as tar:
        return {
            PurePosixPath(m.name).name: tar.extractfile(m).read().decode()
            for m in tar.getmembers()
            if m.isfile() and PurePosixPath(m.name).parent.name == "tests"
        }


def _edit(text: str, edits: list) -> str:
    """``text`` with each ``(old, new, count)`` substituted, ``old`` found ``count`` times."""
    for old, new, count in edits:
        assert text.count(old) == count, f"SB3's test changed: {old!r} x{text.count(old)}"
        text = text.replace(old, new)
    return text


def _deselected(nodeid: str, key: str) -> bool:
    """Whether ``key`` (``test`` or ``test[token]``) names the test ``nodeid``."""
    test, _, params = nodeid.split("::")[1].partition("[")
    name, _, token = key.partition("[")
    return test == name and (not token or token[:-1] in params[:-1].split("-"))


def _run(tmp_path, name: str, text: str) -> None:
    """Runs SB3's test file ``name`` as ``text`` but for its tests in ``DESELECTED``."""
    (tmp_path / name).write_text(text)
    pytest_ = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull,
               "--rootdir", str(tmp_path)]  # fmt: skip
    listed = subprocess.run(pytest_ + ["--collect-only", name], cwd=tmp_path,
                            capture_output=True, text=True, check=True)  # fmt: skip
    ids = [line for line in listed.stdout.splitlines() if line.startswith(f"{name}::")]
    out = DESELECTED.get(name, {})
    for key in out:  # an upstream rename must not leave a stale entry
        assert any(_deselected(i, key) for i in ids), f"{name} has no test {key}"
    kept = [i for i in ids if not any(_deselected(i, key) for key in out)]
    r = subprocess.run(pytest_ + kept, cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]
    assert " passed" in r.stdout and "failed" not in r.stdout
    print(name, r.stdout.splitlines()[-1])  # with -s: the counts


def test_sb3s_vec_env_tests_pass_on_our_vec_frame_stack(sb3_tests, tmp_path):
    sb3 = (
        "from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack, "
        "VecNormalize, VecVideoRecorder"
    )
    ours = "\nfrom lazyframes.sb3 import VecFrameStack  # the drop-in under test"
    _run(tmp_path, "test_vec_envs.py", _edit(sb3_tests["test_vec_envs.py"], [(sb3, sb3 + ours, 1)]))


def test_sb3s_n_step_tests_pass_on_our_buffers_with_images(sb3_tests, tmp_path):
    sb3 = (
        "from stable_baselines3.common.buffers import DictReplayBuffer, NStepReplayBuffer, "
        "ReplayBuffer"
    )
    ours = "\nfrom lazyframes.sb3 import NStepReplayBuffer, ReplayBuffer  # the drop-ins"
    edits = [
        (sb3, sb3 + ours, 1),
        (  # in create_buffer and create_normal_buffer
            "gym.spaces.Box(low=0, high=1, shape=(4,), dtype=np.float32)",
            "gym.spaces.Box(low=0, high=255, shape=(4, 8, 8), dtype=np.uint8)",
            2,
        ),
        ("np.full((1, 4), i, dtype=np.float32)", "np.full((1, 4, 8, 8), i, dtype=np.uint8)", 1),
        (
            "np.full((1, 4), i + 1, dtype=np.float32)",
            "np.full((1, 4, 8, 8), i + 1, dtype=np.uint8)",
            1,
        ),
    ]
    text = _edit(sb3_tests["test_n_step_replay.py"], edits)
    _run(tmp_path, "test_n_step_replay.py", text)


def test_sb3s_buffer_tests_pass_on_our_replay_buffer_with_images(sb3_tests, tmp_path):
    sb3 = (
        "from stable_baselines3.common.buffers import DictReplayBuffer, DictRolloutBuffer, "
        "ReplayBuffer, RolloutBuffer"
    )
    ours = "\nfrom lazyframes.sb3 import ReplayBuffer  # the drop-in under test"
    values = "[1.0], [2.0], [3.0], [4.0], [5.0]"
    dummy_env = (  # DummyEnv's two lines (DummyDictEnv's space is a Dict)
        "self.observation_space = spaces.Box(1, 5, (1,))\n"
        f"        self._observations = np.array([{values}], dtype=np.float32)"
    )
    images = (
        "self.observation_space = spaces.Box(1, 5, (1, 8, 8))\n"
        f"        self._observations = np.array([{values}], dtype=np.float32)"
        "[:, :, None, None].repeat(8, 2).repeat(8, 3)"
    )
    text = _edit(sb3_tests["test_buffers.py"], [(sb3, sb3 + ours, 1), (dummy_env, images, 1)])
    _run(tmp_path, "test_buffers.py", text)
