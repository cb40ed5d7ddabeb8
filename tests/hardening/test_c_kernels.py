"""Compile and run csrc/test_kernels.c: the plain-C kernels, pool, codec and sum tree.

With ``cc``, under ASan and UBSan where this machine has them, linked with C-Blosc2 from the
installed ``blosc2`` package as setup.py links it.
"""

import importlib.util
import os
import pathlib
import shutil
import subprocess

CSRC = pathlib.Path(__file__).resolve().parents[2] / "csrc"
SOURCES = [CSRC / "test_kernels.c", CSRC / "kernels.c", CSRC / "pool.c",
           CSRC / "codec.c", CSRC / "sumtree.c", CSRC / "parallel.c"]  # fmt: skip
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]


def _cc():
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert cc, "no C compiler found (set CC)"
    return cc


def _sanitizers_work(cc, tmp):
    src = tmp / "probe.c"
    src.write_text("int main(void) { return 0; }\n")
    exe = tmp / "probe"
    r = subprocess.run([cc, *SANITIZE, str(src), "-o", str(exe)], capture_output=True)
    return r.returncode == 0 and subprocess.run([str(exe)], capture_output=True).returncode == 0


def _blosc2():
    """The include directory and static library of C-Blosc2 in the ``blosc2`` package."""
    spec = importlib.util.find_spec("blosc2")
    assert spec is not None and spec.submodule_search_locations, (
        "the blosc2 package (a build requirement, in the test extra) is not installed"
    )
    root = pathlib.Path(next(iter(spec.submodule_search_locations)))
    return root / "include", root / "lib" / "libblosc2.a"


def test_c_kernels_and_pool(tmp_path):
    cc = _cc()
    include, lib = _blosc2()
    flags = ["-std=c99", "-O1", "-g", "-Wall", "-Wextra", f"-I{CSRC}", f"-I{include}"]
    if _sanitizers_work(cc, tmp_path):
        flags += SANITIZE
    exe = tmp_path / "test_kernels"
    build = subprocess.run(
        [cc, *flags, *map(str, SOURCES), str(lib), "-o", str(exe), "-lpthread", "-ldl", "-lm"],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1")  # fmt: skip
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    last = run.stdout.strip().splitlines()[-1]
    passed, failed = last.split(" passed, ")
    assert int(passed) > 1000 and failed == "0 failed", last
    assert run.stderr == "", run.stderr  # no sanitizer report, no FAIL line
