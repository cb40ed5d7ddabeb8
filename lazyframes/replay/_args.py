"""The one parser of ``add()`` arguments: everything but the observations' frames, checked.

:meth:`Parser.parse` turns the arguments of :meth:`ReplayBuffer.add
<lazyframes.ReplayBuffer.add>` (and of ``transport.Sender.add``) into the env streams,
the ring's values and the observations split by leaf, still as given (each store checks
its own). Usual arguments pass as they are; others are converted exactly or refused.
"""

from __future__ import annotations

import math
import numbers
import operator

import numpy as np

from .. import _core
from .._checks import layout_name

#: What the leading axis of a batched add counts, for error messages.
PER_ADD = "(num_envs, or one per id of env_ids)"
_SCALARS = (bool, int, float)
_LazyBatch = _core.LazyBatch
#: NumPy's integer and float scalar types (an action from ``argmax``, a reward from a
#: NumPy env), taken for one transition as the same number in Python (``int``, ``float``)
_NP_INTS = frozenset(
    (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
)
_NP_FLOATS = frozenset((np.float16, np.float32, np.float64))
#: Types of a reward that is one transition's (no leading axis to look for)
_ONE_REWARD = frozenset((int, float)) | _NP_INTS | _NP_FLOATS
_F32 = np.dtype(np.float32)
_BOOL = np.dtype(np.bool_)
#: Kinds of the values :func:`exact_cast` stores into a dtype, by the dtype's kind.
_CASTS_INTO = {"b": "b", "i": "biu", "u": "biu", "f": "biuf"}


def options(num_envs, action_shape, action_dtype, layout, stack_size) -> tuple:
    """``(num_envs, action_shape, action_dtype, layout, stack_size)`` checked and normalised.

    The options a buffer and a ``transport.Sender`` share.

    Raises:
        ValueError: a non-positive ``num_envs`` or ``stack_size``, a negative dimension, an
            unknown ``layout``. TypeError: a non-numeric ``action_dtype``.
    """
    num_envs = operator.index(num_envs)
    if num_envs < 1:
        raise ValueError(f"num_envs must be at least 1, got {num_envs}")
    action_shape, action_dtype = column(action_shape, action_dtype, "action_shape", "action_dtype")
    layout = None if layout is None else layout_name(layout)  # (a plain str)
    if stack_size is not None:
        stack_size = operator.index(stack_size)
        if stack_size < 1:
            raise ValueError(f"stack_size must be at least 1, got {stack_size}")
    return num_envs, action_shape, action_dtype, layout, stack_size


def column(shape, dtype, shape_name: str, dtype_name: str) -> tuple:
    """``(shape, dtype)`` of a stored column (actions, extras), checked and normalised.

    Raises:
        ValueError: a negative dimension. TypeError: a non-numeric dtype.
    """
    shape = (shape,) if isinstance(shape, (int, np.integer)) else shape
    shape = tuple(operator.index(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"{shape_name} {shape} has a negative dimension")
    dtype = np.dtype(dtype)
    if dtype.kind not in "biuf":
        raise TypeError(f"{dtype_name} must be a numeric dtype, got {dtype}")
    return shape, dtype


class Parser:
    """Parses ``add()`` arguments for a buffer of ``num_envs`` streams.

    Args:
        num_envs: env streams.
        action_shape: shape of one action.
        action_dtype: the stored dtype of actions.
    """

    def __init__(self, num_envs: int, action_shape: tuple, action_dtype: np.dtype):
        self._num_envs = num_envs
        self._action_shape = action_shape
        self._action_dtype = action_dtype
        self._scalar_action = action_shape == ()
        self._float_action = action_dtype.kind == "f"
        #: the leaf keys of Dict observations (set by the first add), or None
        self.keys: tuple | None = None
        #: whether the first add decided the kind of observations (plain or Dict)
        self.decided = False

    def parse(
        self, obs, action, reward, next_obs, terminated, truncated, autoreset, env_ids,
        final_obs, final_mask,
    ) -> tuple:  # fmt: skip
        """One add's arguments, checked: ``(envs, E, batched, values, obs, next_obs, final, keys)``.

        - ``envs``: None (every env, in order) or the env ids (int64); ``E``: the
          transitions; ``batched``: the arguments have a leading axis of ``E``;
        - ``values``: the ring's column values ``(action, reward, flags)``, ``flags`` the
          bits ``(terminated, truncated[, autoreset])``;
        - ``obs``, ``next_obs``: one argument per leaf, as given (the stores check them);
        - ``final``: None, or ``(rows, leaves)``: the rows (int64) whose next
          observations the final ones replace, one argument per leaf of ``len(rows)``
          observations;
        - ``keys``: the leaf keys of Dict observations, None for plain observations.

        Raises:
            ValueError, TypeError: as :meth:`ReplayBuffer.add
                <lazyframes.ReplayBuffer.add>` documents, for every argument but the
                observations' frames.
        """
        E = self._num_envs
        to, ta, tr = type(obs), type(action), type(reward)
        if env_ids is not None:
            envs, batched = self._env_ids(env_ids)
            E = envs.size
        else:
            envs = None
            batched = E > 1 or to is _LazyBatch or to is list or to is tuple
            if not batched and tr is not float and tr not in _ONE_REWARD:
                batched = isinstance(obs, (list, tuple, _LazyBatch)) or np.ndim(reward) == 1
        # the values go to the ring, which checks them: for one transition, Python scalars
        # as they are, anything else converted here; for a batch, as given (the ring takes
        # ndarrays of the stored dtype and shape, and has ``convert`` convert the others)
        if not batched:
            if ta is not int and ta is not float and ta in _NP_INTS:
                action, ta = int(action), int
            elif ta is not int and ta is not float and ta in _NP_FLOATS:
                action, ta = float(action), float
            if not (self._scalar_action and (ta is int or (ta is float and self._float_action))):
                action = self._action(action, 1, False)
            if tr is not float:
                reward = _reward(reward, 1, False)
            if type(terminated) is not bool or type(truncated) is not bool:
                terminated = _flag(terminated, "terminated", 1, False)
                truncated = _flag(truncated, "truncated", 1, False)
            if autoreset is not None:
                autoreset = _flag(autoreset, "autoreset", 1, False)
        flags = (terminated, truncated) if autoreset is None else (terminated, truncated, autoreset)
        keys = self.keys
        if keys is None and (to is dict or to is list or to is tuple) and _is_dict(obs):
            if self.decided:
                raise TypeError("this buffer stores single observations; obs is a dict")
            keys = _first_keys(obs)
        if keys is None:
            o, n = (obs,), (next_obs,)
        else:
            o = _leaves(obs, "obs", batched, keys)
            n = _leaves(next_obs, "next_obs", batched, keys)
        final = None
        if final_mask is not None or final_obs is not None:
            lead = (E,) if batched else ()
            final = _final(final_obs, final_mask, E, batched, lead, keys)
        return envs, E, batched, (action, reward, flags), o, n, final, keys

    def convert(self, name: str, value, E: int):
        """A batched value the ring does not take as it is, as one it does (or raises).

        ``name``: the column (``action``, ``reward``) or bit (``terminated``,
        ``truncated``, ``autoreset``); ``E``: the transitions of the add.
        """
        if name == "action":
            return np.ascontiguousarray(self._action(value, E, True))
        if name == "reward":
            return np.ascontiguousarray(_reward(value, E, True))
        return np.ascontiguousarray(_flag(value, name, E, True))

    def arrays(self, values: tuple, E: int) -> tuple:
        """``(actions, rewards, flags)`` of a parse's ``values`` as checked arrays of ``E`` rows.

        What the ring would store, for a caller without a ring (``transport.Sender``):
        actions ``(E, *action_shape)``, float32 rewards, uint8 flags (the ring's bits),
        every value checked as the ring checks it.

        Raises:
            ValueError: an action out of its dtype's range, a non-finite action or
                reward, a reward beyond float32's range.
        """
        action, reward, flags = values
        names = ("terminated", "truncated", "autoreset")[: len(flags)]
        bits = tuple(
            f if f is None or type(f) is bool else self.convert(n, f, E)
            for n, f in zip(names, flags, strict=True)
        )
        return self.values(action, reward, E) + (_bits(bits, E),)

    def values(self, action, reward, count: int) -> tuple:
        """``(actions, rewards)`` of ``count`` transitions, cast exactly and checked.

        Raises:
            ValueError, TypeError: as :meth:`ReplayBuffer.add
                <lazyframes.ReplayBuffer.add>` for actions and rewards.
        """
        shape = (count,) + self._action_shape
        a = exact_cast(numeric(action, "action"), self._action_dtype, "action")
        r = exact_cast(numeric(reward, "reward"), _F32, "reward")
        if a.shape != shape:
            if a.size != math.prod(shape) or a.shape != shape[1:] or count != 1:
                raise ValueError(f"action has shape {a.shape}, expected {shape}")
            a = a.reshape(shape)  # one transition given without its leading axis
        if r.shape != (count,):
            if r.size != count or count != 1:
                raise ValueError(f"reward has shape {r.shape}, expected {(count,)}")
            r = r.reshape(count)
        return a, r

    def _env_ids(self, env_ids) -> tuple:
        """``(envs, batched)`` of ``env_ids``: an int (one transition) or 1-D ids."""
        ids = np.asarray(env_ids)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"env_ids must be integers, got dtype {ids.dtype}")
        if ids.ndim > 1:
            raise ValueError(f"env_ids must be an integer or a 1-D array, got shape {ids.shape}")
        n = self._num_envs
        if ids.size == 0:
            raise ValueError("env_ids is empty")
        if (ids < 0).any() or (ids >= n).any():  # compared before any cast: nothing wraps
            raise ValueError(f"env_ids {ids.tolist()} out of range [0, num_envs={n})")
        envs = ids.reshape(-1).astype(np.int64)
        if np.unique(envs).size != envs.size:
            raise ValueError(
                f"env_ids {ids.tolist()} repeats an env: one transition per env per add"
            )
        return envs, ids.ndim == 1

    def _action(self, x, E: int, batched: bool):
        """The action argument as the ring's value: an exact cast (its general form)."""
        shape = ((E,) if batched else ()) + self._action_shape
        a = exact_cast(numeric(x, "action"), self._action_dtype, "action")
        if a.shape != shape:
            raise ValueError(f"action has shape {a.shape}, expected {shape}")
        return a if batched else a.reshape((1,) + a.shape)


def _first_keys(obs) -> tuple:
    """The leaf keys of a first add's Dict observation (string keys, in its order).

    Raises:
        TypeError: a key that is not a string.
    """
    d = obs if isinstance(obs, dict) else obs[0]
    bad = [key for key in d if not isinstance(key, str)]
    if bad:
        raise TypeError(f"Dict observation keys must be strings, got {bad!r}")
    return tuple(d)


def _leaves(x, name: str, batched: bool, keys: tuple) -> tuple:
    """A Dict argument as one argument per leaf of ``keys`` (a list of E dicts: lists).

    Raises:
        TypeError: not a dict (nor a list of dicts). ValueError: other keys.
    """
    if isinstance(x, dict):
        d = x
    elif batched and isinstance(x, (list, tuple)) and x and all(isinstance(v, dict) for v in x):
        if any(v.keys() != x[0].keys() for v in x):
            raise ValueError(f"the dicts of {name} have different keys")
        d = {key: [v[key] for v in x] for key in x[0]}
    else:
        raise TypeError(
            f"{name} must be a dict of observations (the buffer stores Dict observations), "
            f"got {type(x).__name__}"
        )
    if d.keys() != set(keys):
        raise ValueError(f"{name} has keys {sorted(map(str, d))}, the buffer stores {list(keys)}")
    return tuple(d[key] for key in keys)


def _final(final_obs, final_mask, E: int, batched: bool, lead: tuple, keys):
    """``(rows, final leaves)`` or None; only the rows ``final_mask`` marks are read.

    Raises:
        ValueError: ``final_obs`` without ``final_mask``, a wrong number of entries,
            no observation (None) where ``final_mask`` marks an env.
        TypeError: a non-boolean ``final_mask``.
    """
    if final_mask is None:
        raise ValueError(
            "final_obs needs final_mask (e.g. Gymnasium's infos['_final_obs']): the envs "
            "whose next_obs it replaces"
        )
    rows = np.flatnonzero(flags_array(final_mask, "final_mask", lead))
    if rows.size == 0:
        return None
    if final_obs is None:
        raise ValueError(f"final_mask marks env(s) {rows.tolist()} but final_obs is None")
    if not batched:
        return rows, (final_obs,) if keys is None else _leaves(final_obs, "final_obs", False, keys)
    if keys is not None and isinstance(final_obs, dict):  # batched leaves: the marked rows
        leaves = _leaves(final_obs, "final_obs", True, keys)
        for v in leaves:
            if not hasattr(v, "__len__") or len(v) != E:
                raise ValueError(f"final_obs must hold one entry per env ({E} {PER_ADD})")
        return rows, tuple([v[i] for i in rows.tolist()] for v in leaves)
    if not hasattr(final_obs, "__len__") or len(final_obs) != E:
        raise ValueError(f"final_obs must hold one entry per env ({E} {PER_ADD})")
    entries = [final_obs[i] for i in rows.tolist()]
    missing = [int(i) for i, o in zip(rows, entries, strict=True) if o is None]
    if missing:
        raise ValueError(f"final_obs has no observation (None) for env(s) {missing}")
    return rows, (entries,) if keys is None else _leaves(entries, "final_obs", True, keys)


def _is_dict(obs) -> bool:
    """A Dict observation: a dict of leaves, or (batched) a list of such dicts."""
    return isinstance(obs, dict) or (
        isinstance(obs, (list, tuple)) and len(obs) > 0 and isinstance(obs[0], dict)
    )


def _bits(flags: tuple, E: int) -> np.ndarray:
    """The ring's flag bits ``(E,)`` uint8 of the bit values ``flags`` (None: False)."""
    out = np.zeros(E, np.uint8)
    for bit, v in enumerate(flags):
        if v is not None:
            out |= np.asarray(v, np.bool_).reshape(E).astype(np.uint8) << np.uint8(bit)
    return out


def _reward(x, E: int, batched: bool):
    """The reward argument as the ring's value (its general form)."""
    if not batched and type(x) in _NP_FLOATS:
        x = float(x)
    elif not batched and type(x) in _NP_INTS:
        x = int(x)
    if not batched and type(x) in _SCALARS and -(2**64) < x < 2**64:
        return x  # finiteness and float32's range: checked by the ring
    lead = (E,) if batched else ()
    r = exact_cast(numeric(x, "reward"), _F32, "reward")
    if r.shape != lead:
        raise ValueError(f"reward has shape {r.shape}, expected {lead}")
    return r if batched else r.reshape(1)


def _flag(x, name: str, E: int, batched: bool):
    """A flag as the ring's bit value: a bool (one transition) or a bool ndarray (E,)."""
    if not batched and type(x) is np.bool_:
        return bool(x)
    a = flags_array(x, name, (E,) if batched else ())
    return a if batched else bool(a)


def flags_array(x, name: str, shape: tuple) -> np.ndarray:
    """A bool array of ``shape`` from bools or 0/1 numbers.

    Raises:
        ValueError: another shape. TypeError: values other than booleans or 0/1.
    """
    a = np.asarray(x)
    if a.shape != shape:
        raise ValueError(f"{name} has shape {a.shape}, expected {shape}")
    if a.dtype == np.bool_:
        return a
    if a.dtype.kind not in "iuf" or not np.all((a == 0) | (a == 1)):
        raise TypeError(f"{name} must be booleans (or 0/1), got dtype {a.dtype}")
    return a.astype(np.bool_)


def numeric(x, name: str) -> np.ndarray:
    """``x`` as a numeric (bool, integer or float) ndarray.

    Raises:
        ValueError: integers beyond 64 bits (NumPy makes them objects), which no stored
            dtype holds. TypeError: anything else that is not numeric.
    """
    a = np.asarray(x)
    if a.dtype == object and a.size and all(isinstance(v, numbers.Integral) for v in a.flat):
        raise ValueError(f"{name} holds an integer beyond 64 bits, which no stored dtype holds")
    if a.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be numeric, got dtype {a.dtype}")
    return a


def exact_cast(a: np.ndarray, dtype: np.dtype, name: str) -> np.ndarray:
    """``a`` cast to ``dtype`` with every value kept: never wrapped, never infinite.

    Booleans and integers go into any integer dtype that holds their values, anything
    numeric into a float dtype, only booleans into bool.

    Raises:
        TypeError: a float into an integer dtype, a number into bool.
        ValueError: an integer out of ``dtype``'s range (e.g. a uint64 above 2**63 into
            int64, -1 into uint8), a non-finite float, or a float that overflows ``dtype``.
    """
    if a.dtype != dtype and a.dtype.kind not in _CASTS_INTO[dtype.kind]:
        raise TypeError(f"{name} of dtype {a.dtype} cannot be stored as {dtype}")
    if dtype.kind == "f" and (a.dtype.kind == "f" or dtype.itemsize < 4):
        top = float(np.finfo(dtype).max)
        big = float(np.abs(a.astype(np.float64)).max()) if a.size else 0.0
        if not big <= top:  # also False for NaN
            bad = a[~(np.abs(a.astype(np.float64)) <= top)].flat[0]
            raise ValueError(
                f"{name} must be finite and fit {dtype} (magnitude at most {top:.4g}), got {bad!r}"
            )
    if a.dtype == dtype:
        return a
    if dtype.kind in "iu" and a.size and a.dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo, hi = int(a.min()), int(a.max())
        if lo < info.min or hi > info.max:
            bad = lo if lo < info.min else hi
            raise ValueError(f"{name} {bad} does not fit {dtype} (range [{info.min}, {info.max}])")
    return a.astype(dtype)
