"""lazyframes: frame stacking for deep RL that stores each frame once.

The core (:class:`FramePool`, :class:`LazyFrames`, :class:`LazyBatch`, :func:`stack`, ...)
is the compiled extension ``lazyframes._core``, built from ``csrc/``.
"""

try:
    from . import _core
except ImportError as _e:  # pragma: no cover - only without a build
    import glob
    import importlib.machinery
    import os

    # unbuilt, Python's message speaks of "a circular import": say what is missing instead
    _here = os.path.dirname(__file__)
    _built = any(
        glob.glob(os.path.join(_here, "_core*" + suffix))
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
    )
    _why = f"does not load ({_e})" if _built else "is not built"
    raise ImportError(
        f"lazyframes: the compiled core (lazyframes._core) {_why}. Install the package with "
        "pip (from a clone: python -m pip install -e .), or build it in place: python "
        "setup.py build_ext --inplace"
    ) from None

from ._checks import LAYOUTS

FramePool = _core.FramePool
FrameRef = _core.FrameRef
LazyFrames = _core.LazyFrames
LazyBatch = _core.LazyBatch
stack = _core.stack
default_pool = _core.default_pool
set_num_threads = _core.set_num_threads
get_num_threads = _core.get_num_threads

__version__ = "0.2.0"

__all__ = [
    "LAYOUTS", "FramePool", "FrameRef", "FrameStack", "FrameStackObservation", "LazyBatch",
    "LazyFrames", "PrioritizedReplayBuffer", "ReplayBuffer", "ScaledFloatFrame",
    "ScaledLazyBatch", "ScaledLazyFrames", "default_pool", "get_num_threads",
    "set_num_threads", "stack", "vector",
]  # fmt: skip

_LAZY = {
    "FrameStack": ("wrappers", "FrameStack"),
    "FrameStackObservation": ("wrappers", "FrameStackObservation"),
    "ScaledFloatFrame": ("wrappers", "ScaledFloatFrame"),
    "ScaledLazyBatch": ("_scaled", "ScaledLazyBatch"),
    "ScaledLazyFrames": ("_scaled", "ScaledLazyFrames"),
    "PrioritizedReplayBuffer": ("replay", "PrioritizedReplayBuffer"),
    "ReplayBuffer": ("replay", "ReplayBuffer"),
    "vector": ("vector", None),
}


def __getattr__(name):
    # The Python layer imports gymnasium; load it on first use only.
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        m = importlib.import_module(f".{mod}", __name__)
        return m if attr is None else getattr(m, attr)
    raise AttributeError(f"module 'lazyframes' has no attribute {name!r}")
