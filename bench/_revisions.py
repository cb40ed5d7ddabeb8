"""Other revisions of lazyframes, built once in a cache, for benchmarks that compare them.

:func:`build` exports a git revision of the checkout (``git archive``) into
``<cache>/<sha>/src``, creates ``<cache>/<sha>/venv`` (``python -m venv
--system-site-packages --without-pip``: the interpreter's numpy, Cython, setuptools and
blosc2, any missing one pip-installed into the venv) and builds the compiled core in place there
(``setup.py build_ext --inplace``, log in ``<cache>/<sha>/build.log``). A stamp
``built.json`` records the commit, the Python and the numpy and Cython versions the
build was made with; a later call with the same ones reuses it, anything else
rebuilds. A lock file serialises two benchmarks building the same revision.

A process then imports that revision by putting ``src`` first on ``sys.path`` (it comes
before an installed or editable ``lazyframes``).
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CACHE = Path.home() / ".cache" / "lazyframes-bench"


class RevisionError(RuntimeError):
    """A revision that cannot be exported or built (the message says why)."""


@dataclass
class Revision:
    """A revision ready to import: ``python`` to run, ``src`` to put first on ``sys.path``."""

    label: str
    sha: str  # "" for the checkout itself
    src: Path
    python: str
    cached: bool = False  # an earlier build was reused
    describe: str = ""


def _git(repo: Path, *args: str) -> str:
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RevisionError(f"git {' '.join(args)}: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout.strip()


def checkout(repo: Path, label: str = "ours") -> Revision:
    """The checkout the benchmark runs from, in this interpreter (built in place by the user)."""
    describe = str(repo)
    try:
        head = _git(repo, "rev-parse", "--short", "HEAD")
        dirty = _git(repo, "status", "--porcelain", "--", "lazyframes", "csrc", "setup.py")
        describe = f"{repo} at {head}" + (" + uncommitted changes" if dirty else "")
    except (RevisionError, OSError):
        pass
    return Revision(label, "", repo, sys.executable, describe=describe)


def _key(python: str, sha: str) -> dict:
    """What a build depends on: the commit, the interpreter and the build requirements."""
    code = (
        "import json, platform, numpy, Cython; print(json.dumps({'python': "
        "platform.python_version(), 'implementation': platform.python_implementation(), "
        "'numpy': numpy.__version__, 'cython': Cython.__version__}))"
    )
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RevisionError(f"{python} cannot import numpy and Cython: {r.stderr.strip()[-300:]}")
    return {"sha": sha, **json.loads(r.stdout)}


def _missing(python: str, modules: list[str]) -> list[str]:
    missing = []
    for m in modules:
        r = subprocess.run([python, "-c", f"import {m}"], capture_output=True, check=False)
        if r.returncode != 0:
            missing.append(m)
    return missing


def _built(src: Path) -> bool:
    return any((src / "lazyframes").glob("_core*.so")) or any(
        (src / "lazyframes").glob("_core*.pyd")
    )


def build(repo: Path, label: str, rev: str, cache: Path = DEFAULT_CACHE, log=print) -> Revision:
    """Export ``rev`` of ``repo`` into ``cache``, build it in a venv, once; the :class:`Revision`.

    Raises:
        RevisionError: ``rev`` is unknown to the repository, or its build failed (the
            message names the build log).
    """
    sha = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    home = Path(cache).expanduser() / sha
    home.mkdir(parents=True, exist_ok=True)
    src, venv, stamp = home / "src", home / "venv", home / "built.json"
    python = str(venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python"))
    short = sha[:7]
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not Path(python).exists():
            log(f"{label} ({short}): creating {venv}")
            # no pip of its own: ensurepip would also put an old setuptools first on its
            # path, shadowing the interpreter's (0.2's pyproject needs setuptools >= 77)
            flags = ["--system-site-packages", "--without-pip"]
            subprocess.run([sys.executable, "-m", "venv", *flags, str(venv)], check=True)
        needed = ["numpy", "Cython", "setuptools"]
        setup_py = _git(repo, "show", f"{sha}:setup.py")
        if "blosc2" in setup_py:
            needed.append("blosc2")
        missing = _missing(python, needed)
        if missing:
            log(f"{label} ({short}): pip install {' '.join(missing)} into {venv}")
            r = subprocess.run(
                [python, "-m", "pip", "install", "-q", *missing], capture_output=True, text=True
            )
            if r.returncode != 0:
                raise RevisionError(
                    f"{label} ({short}): pip install {missing} failed: {r.stderr.strip()[-500:]}"
                )
        key = _key(python, sha)
        if stamp.exists() and _built(src):
            try:
                if json.loads(stamp.read_text()) == key:
                    return Revision(label, sha, src, python, cached=True, describe=short)
            except ValueError:
                pass
        log(f"{label} ({short}): exporting and building in {src} (once; about a minute)")
        stamp.unlink(missing_ok=True)
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", "--format=tar", sha],
            capture_output=True,
            check=False,
        )
        if archive.returncode != 0:
            raise RevisionError(f"git archive {sha}: {archive.stderr.decode().strip()}")
        tar_path = home / "src.tar"
        tar_path.write_bytes(archive.stdout)
        with tarfile.open(tar_path) as tar:
            tar.extractall(src, filter="data")
        tar_path.unlink()
        env = {k: v for k, v in os.environ.items() if k != "LAZYFRAMES_NO_EXTENSIONS"}
        with open(home / "build.log", "w") as fh:
            r = subprocess.run(
                [python, "setup.py", "build_ext", "--inplace"],
                cwd=src,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=env,
                check=False,
            )
        if r.returncode != 0 or not _built(src):
            raise RevisionError(
                f"{label} ({short}): the build failed (status {r.returncode}); see "
                f"{home / 'build.log'}"
            )
        stamp.write_text(json.dumps(key, indent=1) + "\n")
        log(f"{label} ({short}): built ({platform.python_version()}, numpy {key['numpy']})")
        return Revision(label, sha, src, python, describe=short)
