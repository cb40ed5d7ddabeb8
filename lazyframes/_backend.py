"""Which implementation of the core is active: the compiled one or its pure-NumPy twin.

The Python layer (wrappers, vector stacker, replay buffer) looks the core up through
:func:`core` when it creates a pool, so the test suite can run it against both.
"""

from __future__ import annotations

import importlib
import os
import warnings

_NAMES = {"compiled": "lazyframes._core", "reference": "lazyframes._reference"}
_active = None


def core():
    """The active core module (``lazyframes._core`` or ``lazyframes._reference``)."""
    return _active


def name() -> str:
    """``"compiled"`` or ``"reference"``."""
    return "reference" if _active.__name__.endswith("_reference") else "compiled"


def use(which: str):
    """Switch the core used for new pools; returns the previous name. For tests.

    Raises:
        ValueError: an unknown name. ImportError: the compiled core is not built.
    """
    global _active
    if which not in _NAMES:
        raise ValueError(f"implementation must be one of {sorted(_NAMES)}, got {which!r}")
    prev = None if _active is None else name()
    _active = importlib.import_module(_NAMES[which])
    return prev


def _initial():
    if os.environ.get("LAZYFRAMES_NO_EXTENSIONS", "") not in ("", "0"):
        use("reference")
        return
    try:
        use("compiled")
    except ImportError as e:  # pragma: no cover - only without a build
        warnings.warn(
            f"lazyframes: compiled core not available ({e}); using the pure-NumPy twin",
            RuntimeWarning,
            stacklevel=3,
        )
        use("reference")


_initial()


def _cores():
    mods = [importlib.import_module(_NAMES["reference"])]
    try:
        mods.append(importlib.import_module(_NAMES["compiled"]))
    except ImportError:  # pragma: no cover - only without a build
        pass
    return mods


#: The observation types of every available core, for isinstance checks.
LAZYFRAMES_TYPES = tuple(m.LazyFrames for m in _cores())
LAZYBATCH_TYPES = tuple(m.LazyBatch for m in _cores())
