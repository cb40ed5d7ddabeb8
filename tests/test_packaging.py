"""The sdist carries everything a test or the README needs, and the license metadata."""

import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
    for folder, pattern in [
        ("examples", "*.py"),
        ("tests", "*.py"),
        ("bench", "*.py"),
        ("bench", "*.md"),
        ("docs", "*.md"),
        ("csrc", "*.pyx"),
    ]:
        wanted |= {p.relative_to(ROOT).as_posix() for p in (ROOT / folder).glob(pattern)}
    assert wanted <= members, sorted(wanted - members)
    assert "License-Expression: MIT" in info and "License-File: LICENSE" in info


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("# 2. the tests", 1)[1].split("```", 1)[0]
    command = block.strip().splitlines()[1].strip()
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1].strip()
    assert ci == command
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in command
