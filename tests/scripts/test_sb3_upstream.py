"""SB3's own tests against the drop-ins: ``test_vec_envs.py`` with ``lazyframes.sb3.VecFrameStack``.

Opt-in, ``LAZYFRAMES_SB3_UPSTREAM=1`` (a download and about a minute): fetches the sdist of
the installed Stable-Baselines3 (it ships its ``tests/``; nothing of it is kept in this
repository), adds one import line to ``test_vec_envs.py`` so that every ``VecFrameStack`` in it
is ours (step before reset, forced channel orders, terminal observations, wrapped VecEnvs),
and runs it. SB3's n-step and buffer tests use vector observations, which
``lazyframes.sb3``'s buffers refuse by design (they store image frames):
``tests/wrappers/test_sb3.py`` restates their cases on images, against SB3's buffers.
"""

import os
import subprocess
import sys
import tarfile

import pytest

pytestmark = pytest.mark.skipif(
    os.environ.get("LAZYFRAMES_SB3_UPSTREAM", "") in ("", "0"),
    reason="opt-in: LAZYFRAMES_SB3_UPSTREAM=1 downloads SB3's sdist and runs its tests",
)

SB3_IMPORT = (
    "from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack, "
    "VecNormalize, VecVideoRecorder"
)


def test_sb3s_vec_env_tests_pass_on_our_vec_frame_stack(tmp_path):
    import stable_baselines3

    version = stable_baselines3.__version__
    download = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                "-q", "-d", str(tmp_path), f"stable-baselines3=={version}"]  # fmt: skip
    subprocess.run(download, check=True)
    sdist = next(tmp_path.glob("stable_baselines3-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("tests/test_vec_envs.py"))
        text = tar.extractfile(member).read().decode()
    assert SB3_IMPORT in text, "SB3's test_vec_envs.py imports VecFrameStack otherwise now"
    swapped = SB3_IMPORT + "\nfrom lazyframes.sb3 import VecFrameStack  # the drop-in under test"
    (tmp_path / "test_vec_envs.py").write_text(text.replace(SB3_IMPORT, swapped, 1))
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull,
         "test_vec_envs.py"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:]
    assert " passed" in r.stdout and "failed" not in r.stdout
