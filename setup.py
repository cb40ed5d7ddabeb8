"""Build the compiled core ``lazyframes._core`` (Cython + plain C, ``csrc/``) and the hot modules.

The hot modules are the replay engine's, compiled from their Python sources.
"""

import glob
import importlib.util
import os
import sys

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

# NumPy 2's headers, and the NumPy 1.22 C API as the floor the built module needs: one build
# runs on NumPy 1.24 (CleanRL's pin) and on NumPy 2
NUMPY_MACROS = [("NPY_NO_DEPRECATED_API", "NPY_2_0_API_VERSION"),
                ("NPY_TARGET_VERSION", "NPY_1_22_API_VERSION")]  # fmt: skip


def blosc2_dirs():
    """The include and lib directories of C-Blosc2 shipped inside the ``blosc2`` wheel.

    ``blosc2`` is a build requirement only: ``libblosc2.a`` (zstd and lz4 inside) is linked
    statically, so the built extension does not need it at run time.
    """
    spec = importlib.util.find_spec("blosc2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("building lazyframes needs the 'blosc2' package (pip install blosc2)")
    root = next(iter(spec.submodule_search_locations))
    include, lib = os.path.join(root, "include"), os.path.join(root, "lib")
    static = os.path.join(lib, "libblosc2.a")
    if not (os.path.isfile(os.path.join(include, "blosc2.h")) and os.path.isfile(static)):
        raise SystemExit(
            f"the blosc2 package at {root} has no include/blosc2.h and lib/libblosc2.a; "
            "lazyframes links C-Blosc2 statically from them (a blosc2 wheel from PyPI ships both)"
        )
    return include, static


BLOSC2_INCLUDE, BLOSC2_STATIC = blosc2_dirs()

# Portable by default: no CPU-specific tuning flags, so wheels run on any x86-64 / aarch64.
# LAZYFRAMES_OPT overrides -O3 (tests/sanitize.sh builds with -O1: a sanitized -O3 build of
# the generated C takes minutes and finds nothing more).
# C11: the handoff ring's <stdatomic.h> (handoff.c).
extra = [os.environ.get("LAZYFRAMES_OPT", "-O3"), "-std=c11"] if os.name != "nt" else ["/O2"]

# The module exports PyInit__core alone: its own C functions hidden, and the symbols of the
# static libraries it links (C-Blosc2 with its LZ4, Zstd, zlib-ng; NumPy's npyrandom) kept
# out of its dynamic table, so that another copy of them in the process (another library's
# Zstd, loaded globally) can neither take the place of ours nor be taken over by them.
hidden = (
    (["-fvisibility=hidden"], ["-Wl,--exclude-libs,ALL"])
    if sys.platform.startswith("linux")
    else ([], [])
)

ext = Extension(
    "lazyframes._core",
    sources=[
        "csrc/_core.pyx",
        "csrc/pool.c",
        "csrc/codec.c",
        "csrc/kernels.c",
        "csrc/sumtree.c",
        "csrc/parallel.c",
        "csrc/handoff.c",
    ],
    include_dirs=["csrc", np.get_include(), BLOSC2_INCLUDE],
    define_macros=NUMPY_MACROS,
    extra_compile_args=extra + hidden[0],
    extra_link_args=hidden[1],
    extra_objects=[BLOSC2_STATIC],  # static: the wheel has no run-time dependency on blosc2
    # NumPy's static npyrandom: draw_integers calls the routine Generator.integers calls
    library_dirs=[os.path.join(np.get_include(), "..", "..", "random", "lib")],
    libraries=["npyrandom"] + (["pthread", "dl", "m"] if os.name != "nt" else []),
    # _core.pyx includes one .pxi per topic: a change to any of them rebuilds the module
    depends=sorted(glob.glob("csrc/*.pxi") + glob.glob("csrc/*.h")),
)

# The replay engine's hot modules, compiled from their plain Python sources as they are
# (Cython's pure-Python mode): an add or a sample runs their code without the interpreter's
# per-bytecode cost. The .py files stay the source (and run as they are if not compiled).
COMPILED_PY = [
    Extension(
        f"lazyframes.replay.{m}",
        [f"lazyframes/replay/{m}.py"],
        include_dirs=[np.get_include()],  # (_store reads an ndarray's shape from C)
        define_macros=NUMPY_MACROS,
        extra_compile_args=extra,
    )
    for m in ("_args", "_ring", "_store", "_samples", "_buffer", "_prioritized")
]

JOBS = os.cpu_count() or 1  # the modules generated and compiled side by side
setup(
    options={"build_ext": {"parallel": JOBS}},
    ext_modules=cythonize(
        [ext, *COMPILED_PY],
        nthreads=JOBS,
        compiler_directives={
            "language_level": 3,
            "binding": True,  # introspectable signatures (inspect.signature works)
            "embedsignature": False,
            "auto_pickle": False,  # every class defines __reduce__ itself
        },
    ),
)
