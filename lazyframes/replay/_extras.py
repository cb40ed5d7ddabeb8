"""Extras: columns of fixed shape and dtype stored with a buffer's steps (docs/SEQUENCES.md).

Two kinds, declared at construction:

- **per step** (``extras=``): one value per stored transition (policy logits, value
  targets; reanalyse rewrites them with ``update_extras``). They are columns of the ring.
- **per window start** (``start_extras=``): values an add gives for some steps only (an
  R2D2 actor's recurrent state at the start of each sequence, every 40 steps). When any
  is declared, a window starts only at such a step, and its values come with the window.
  :class:`StartExtras` keeps them in rows of their own, one per marked step, reused once
  the step is evicted, so 4 KB of LSTM state costs 4 KB per start, not per step.
"""

from __future__ import annotations

import numpy as np

from ._args import column, exact_cast, numeric


def declared(extras, what: str) -> tuple:
    """``((name, shape, dtype), ...)`` of a declaration ``{name: (shape, dtype)}``, checked.

    Raises:
        TypeError: not a dict of pairs, a non-numeric dtype. ValueError: a name that is
            not an identifier, a negative dimension.
    """
    if extras is None:
        return ()
    if not isinstance(extras, dict):
        raise TypeError(
            f"{what} must be a dict {{name: (shape, dtype)}}, got {type(extras).__name__}"
        )
    out = []
    for name, decl in extras.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{what} names must be identifiers, got {name!r}")
        if not isinstance(decl, (tuple, list)) or len(decl) != 2:
            raise TypeError(f"{what}[{name!r}] must be a pair (shape, dtype), got {decl!r}")
        shape, dtype = column(
            decl[0], decl[1], f"{what}[{name!r}] shape", f"{what}[{name!r}] dtype"
        )
        out.append((name, shape, dtype))
    return tuple(out)


def meta(spec: tuple) -> list:
    """A declaration as a checkpoint's meta holds it: ``[[name, shape, dtype str], ...]``."""
    return [[name, list(shape), dtype.str] for name, shape, dtype in spec]


def values(spec: tuple, given, E: int, batched: bool, what: str) -> tuple:
    """One add's ``given`` values ``{name: value}`` as arrays ``(E, *shape)``, in ``spec``'s order.

    A name not given is zeros; every value is cast exactly (as actions are).

    Raises:
        TypeError: ``given`` not a dict, a value of a dtype it cannot be stored as.
        ValueError: an undeclared name, a wrong shape, a value out of range or not finite.
    """
    if given is None:
        given = {}
    elif not isinstance(given, dict):
        raise TypeError(f"{what} must be a dict {{name: value}}, got {type(given).__name__}")
    unknown = set(given) - {name for name, _, _ in spec}
    if unknown:
        raise ValueError(
            f"{what}: {sorted(map(repr, unknown))} not declared (declared: "
            f"{[name for name, _, _ in spec]})"
        )
    out = []
    for name, shape, dtype in spec:
        if name not in given:
            out.append(np.zeros((E, *shape), dtype))
            continue
        a = exact_cast(numeric(given[name], f"{what}[{name!r}]"), dtype, f"{what}[{name!r}]")
        if a.shape != (E, *shape):
            if batched or a.shape != shape:
                want = (E, *shape) if batched else shape
                raise ValueError(f"{what}[{name!r}] has shape {a.shape}, expected {want}")
            a = a.reshape((E, *shape))
        out.append(np.ascontiguousarray(a))
    return tuple(out)


class StartExtras:
    """The values of the steps where a window may start: a row each, by ring position.

    Args:
        spec: the declaration (:func:`declared`); empty, the marks alone (strided starts).
        capacity: the buffer's capacity (positions).
    """

    def __init__(self, spec: tuple, capacity: int):
        self.spec = spec
        self._row = np.full(capacity, -1, np.int64)  # each position's row, -1: none
        self._data: list = []
        self._free: list = []  # rows of evicted starts
        self._rows = 0  # rows made
        self.clear()

    def reserve(self, count: int) -> None:
        """Make room for ``count`` more starts (before an add writes anything)."""
        short = count - len(self._free)
        if short > 0:
            n = self._rows
            grown = max(n + short, 2 * n)
            self._data = [np.concatenate([d, np.empty((grown - n, *d.shape[1:]), d.dtype)])
                          for d in self._data]  # fmt: skip
            self._free.extend(range(grown - 1, n - 1, -1))
            self._rows = grown

    def put(self, positions: np.ndarray, arrays: tuple | None, marked) -> None:
        """An add wrote ``positions``: their old starts go, the ``marked`` ones get ``arrays``.

        Cannot fail once :meth:`reserve` made room for the marked ones.
        """
        old = self._row[positions]
        self._free.extend(old[old >= 0].tolist())
        self._row[positions] = -1
        if arrays is None:
            return
        for i in np.flatnonzero(marked):
            r = self._free.pop()
            for d, a in zip(self._data, arrays, strict=True):
                d[r] = a[i]
            self._row[positions[i]] = r

    def marked(self) -> np.ndarray:
        """The positions of the stored starts, sorted."""
        return np.flatnonzero(self._row >= 0)

    def get(self, positions: np.ndarray) -> dict:
        """``{name: (len(positions), *shape)}``: the values of starts ``positions``."""
        rows = self._row[positions]
        return {name: d[rows] for (name, _, _), d in zip(self.spec, self._data, strict=True)}

    def update(self, j: int, positions: np.ndarray, value: np.ndarray) -> None:
        """Rewrite extra ``j`` of starts ``positions`` (each a stored start, checked first)."""
        rows = self._row[positions]
        if (rows < 0).any():
            bad = positions[rows < 0][0]
            raise ValueError(f"position {bad} holds no window start (no start extras stored)")
        self._data[j][rows] = value

    def clear(self) -> None:
        """No start stored."""
        self._row[:] = -1
        self._data = [np.empty((0, *shape), dtype) for _, shape, dtype in self.spec]
        self._free, self._rows = [], 0

    def state(self) -> dict:
        """A checkpoint's entries: the starts' positions and values, by position."""
        pos = self.marked()
        rows = self._row[pos]
        out = {f"start_extra_{j}": d[rows] for j, d in enumerate(self._data)}
        return {"start_positions": pos, **out}

    def restore(self, positions: np.ndarray, arrays: list) -> None:
        """Take a checkpoint's starts (positions checked distinct and stored by the reader)."""
        self._data = [np.ascontiguousarray(a) for a in arrays]
        self._row[positions] = np.arange(len(positions))
        self._free, self._rows = [], len(positions)
