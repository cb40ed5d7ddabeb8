"""lazyframes: frame stacking for deep RL that stores each frame once.

The compiled core (``lazyframes._core``) is used when it is built; set
``LAZYFRAMES_NO_EXTENSIONS=1`` to use the pure-NumPy twin (``lazyframes._reference``),
which has the same API and errors. The choice is made once, here, at import.
"""

import os as _os

from ._common import LAYOUTS

if _os.environ.get("LAZYFRAMES_NO_EXTENSIONS", "") not in ("", "0"):
    from . import _reference as _impl
else:
    try:
        from . import _core as _impl  # type: ignore[no-redef]
    except ImportError as _e:  # pragma: no cover - only without a build
        import warnings as _warnings

        _warnings.warn(
            f"lazyframes: compiled core not available ({_e}); using the pure-NumPy twin",
            RuntimeWarning,
            stacklevel=2,
        )
        from . import _reference as _impl

FramePool = _impl.FramePool
FrameRef = _impl.FrameRef
LazyFrames = _impl.LazyFrames
LazyBatch = _impl.LazyBatch
stack = _impl.stack
default_pool = _impl.default_pool
#: "compiled" or "reference": which core ``import lazyframes`` chose.
IMPLEMENTATION = "reference" if _impl.__name__.endswith("_reference") else "compiled"

__version__ = "0.2.0"

__all__ = [
    "IMPLEMENTATION",
    "LAYOUTS",
    "FramePool",
    "FrameRef",
    "FrameStack",
    "FrameStackObservation",
    "LazyBatch",
    "LazyFrames",
    "PrioritizedReplayBuffer",
    "ReplayBuffer",
    "default_pool",
    "stack",
    "vector",
]

_LAZY = {
    "FrameStack": ("wrappers", "FrameStack"),
    "FrameStackObservation": ("wrappers", "FrameStackObservation"),
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
