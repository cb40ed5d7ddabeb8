"""lazyframes: frame stacking for deep RL that stores each frame once.

The compiled core (``lazyframes._core``) is used when it is built; set
``LAZYFRAMES_NO_EXTENSIONS=1`` to use the pure-NumPy twin (``lazyframes._reference``),
which has the same API and errors.
"""

import os as _os

from ._common import LAYOUTS

if _os.environ.get("LAZYFRAMES_NO_EXTENSIONS", "") not in ("", "0"):
    from . import _reference as _impl
else:
    try:
        from . import _core as _impl
    except ImportError as _e:  # pragma: no cover - only without a build
        import warnings as _warnings

        _warnings.warn(
            f"lazyframes: compiled core not available ({_e}); using the pure-NumPy twin",
            RuntimeWarning,
            stacklevel=2,
        )
        from . import _reference as _impl

FramePool = _impl.FramePool
LazyFrames = _impl.LazyFrames
stack = _impl.stack
default_pool = _impl.default_pool
#: "compiled" or "reference": which implementation is in use.
IMPLEMENTATION = "reference" if _impl.__name__.endswith("_reference") else "compiled"

__version__ = "0.1.0"

__all__ = [
    "FramePool",
    "LazyFrames",
    "stack",
    "default_pool",
    "LAYOUTS",
    "IMPLEMENTATION",
]
