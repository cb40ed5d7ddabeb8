"""lazyframes: frame stacking for deep RL that stores each frame once.

The compiled core (``lazyframes._core``) is used when it is built; set
``LAZYFRAMES_NO_EXTENSIONS=1`` to use the pure-NumPy twin (``lazyframes._reference``),
which has the same API and errors.
"""

from . import _backend
from ._common import LAYOUTS

_impl = _backend.core()
FramePool = _impl.FramePool
LazyFrames = _impl.LazyFrames
stack = _impl.stack
default_pool = _impl.default_pool
#: "compiled" or "reference": which implementation is in use.
IMPLEMENTATION = _backend.name()

__version__ = "0.1.0"

__all__ = [
    "FramePool",
    "LazyFrames",
    "stack",
    "default_pool",
    "LAYOUTS",
    "IMPLEMENTATION",
    "FrameStack",
    "FrameStackObservation",
    "ReplayBuffer",
    "vector",
]

_LAZY = {
    "FrameStack": ("wrappers", "FrameStack"),
    "FrameStackObservation": ("wrappers", "FrameStackObservation"),
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
