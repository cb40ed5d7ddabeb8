"""Build the compiled core ``lazyframes._core`` from ``csrc/`` (Cython + plain C)."""

import glob
import os

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

# Portable by default: no CPU-specific tuning flags, so wheels run on any x86-64 / aarch64.
extra = ["-O3", "-std=c99"] if os.name != "nt" else ["/O2"]

ext = Extension(
    "lazyframes._core",
    sources=["csrc/_core.pyx", "csrc/pool.c", "csrc/kernels.c"],
    include_dirs=["csrc", np.get_include()],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_2_0_API_VERSION")],
    extra_compile_args=extra,
    # _core.pyx includes one .pxi per topic: a change to any of them rebuilds the module
    depends=sorted(glob.glob("csrc/*.pxi") + glob.glob("csrc/*.h")),
)

setup(
    ext_modules=cythonize(
        [ext],
        compiler_directives={
            "language_level": 3,
            "binding": True,  # introspectable signatures (inspect.signature works)
            "embedsignature": False,
            "auto_pickle": False,  # every class defines __reduce__ itself
        },
    )
)
