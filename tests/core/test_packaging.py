"""The sdist carries everything a test or the README needs, and the license metadata."""

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_sdist_has_the_license_examples_docs_and_tests(tmp_path):
    code = f"from setuptools import build_meta; print(build_meta.build_sdist({str(tmp_path)!r}))"
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "warning" not in r.stderr.lower(), r.stderr
    name = r.stdout.strip().splitlines()[-1]
    with tarfile.open(tmp_path / name) as tar:
        top = name.removesuffix(".tar.gz")
        members = {m.name.removeprefix(top + "/") for m in tar.getmembers()}
        info = tar.extractfile(f"{top}/PKG-INFO").read().decode()
    wanted = {"LICENSE", "README.md", ".ci/run"}
    globs = [("examples", "**/*.py"), ("examples", "**/*.yml"), ("tests", "**/*.py"),
             ("tests", "*.sh"), ("tests/data", "*.npz"), ("bench", "*.py"), ("bench", "*.md"),
             ("docs", "*.md"), ("csrc", "*.pyx")]  # fmt: skip
    for folder, pattern in globs:
        wanted |= {p.relative_to(ROOT).as_posix() for p in (ROOT / folder).glob(pattern)}
    assert wanted <= members, sorted(wanted - members)
    assert "License-Expression: MIT" in info and "License-File: LICENSE" in info


def test_the_readme_test_command_is_ci():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("# 2. the tests", 1)[1].split("```", 1)[0]
    assert block.strip().splitlines()[1].strip() == "bash .ci/run"
    ci = (ROOT / ".ci" / "run").read_text()
    torch = (
        "python -m pip install torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu"
    )
    assert torch in ci and "python -m pip install -e '.[test]'" in ci
    assert "STEPS=(install lint types tests sanitizers)" in ci


def test_the_replay_engines_hot_modules_are_compiled():
    """setup.py compiles them from their .py sources: an install that did not runs them slowly."""
    import importlib
    import importlib.machinery

    for name in ("_args", "_ring", "_store", "_samples", "_buffer", "_prioritized"):
        module = importlib.import_module(f"lazyframes.replay.{name}")
        assert module.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), name
        assert (ROOT / "lazyframes" / "replay" / f"{name}.py").is_file()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the link flags are Linux's")
def test_the_core_exports_its_module_init_alone():
    # the dynamic symbol table (binutils' nm, there wherever the C compiler is): none of the
    # static libraries' (LZ4, Zstd, npyrandom...), none of the core's own C functions or
    # their clones' resolvers
    from lazyframes import _core

    r = subprocess.run(["nm", "-D", "--defined-only", _core.__file__], capture_output=True,
                       text=True, timeout=60, check=True)  # fmt: skip
    assert [line.split()[-1] for line in r.stdout.splitlines()] == ["PyInit__core"]
