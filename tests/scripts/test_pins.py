"""CleanRL's pins: one build, against NumPy 2's headers, runs on NumPy 1.24 and Gymnasium 0.29.1.

Opt-in, ``LAZYFRAMES_PINS=1`` (a few minutes: it builds a wheel of the checkout and a venv):
installs the wheel in a venv with ``numpy==1.24.4`` and ``gymnasium==0.29.1`` (the package
index must serve them) and runs there the tests of the core, the replay buffers and the
Gymnasium versions that need nothing more (no torch, no SB3).
"""

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.skipif(
    os.environ.get("LAZYFRAMES_PINS", "") in ("", "0"),
    reason="opt-in: LAZYFRAMES_PINS=1 builds a venv with CleanRL's pins (minutes)",
)

TESTS = ["tests/core/test_core.py", "tests/replay", "tests/wrappers/test_gymnasium_versions.py"]


def test_the_build_runs_on_cleanrls_pins(tmp_path):
    venv.create(tmp_path / "venv", with_pip=True)
    py = str(tmp_path / "venv" / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "numpy==1.24.4", "gymnasium==0.29.1", "pytest", "hypothesis",
                    "zstandard"], check=True)  # fmt: skip
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels),
                    ROOT], check=True)  # fmt: skip
    subprocess.run([*pip, "--no-deps", str(next(wheels.glob("lazyframes-*.whl")))], check=True)
    shutil.copytree(Path(ROOT, "tests"), tmp_path / "tests")  # the installed package, not ROOT's
    r = subprocess.run(
        [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir",
         str(tmp_path), "-o", "pythonpath=tests", *TESTS],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    code = "import numpy, gymnasium; print(numpy.__version__, gymnasium.__version__)"
    versions = subprocess.run([py, "-c", code], capture_output=True, text=True)
    assert versions.stdout.split() == ["1.24.4", "0.29.1"]
