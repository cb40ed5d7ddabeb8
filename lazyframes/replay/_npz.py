"""An ``.npz`` archive read as untrusted input: members checked before they are read.

The container of replay checkpoints (``_archive``, docs/CHECKPOINTS.md): a zip of stored
(not deflated) ``.npy`` members, read by :class:`Archive`, written by :func:`write_entry`.
"""

from __future__ import annotations

import json
import math
import zipfile

import numpy as np

#: The ``format`` tag of a replay checkpoint's ``meta`` entry.
FORMAT = "lazyframes.ReplayBuffer"


def write_entry(zf: zipfile.ZipFile, name: str, arr: np.ndarray) -> None:
    """Write ``arr`` as the entry ``name`` (``name.npy``) of the open archive."""
    with zf.open(name + ".npy", "w", force_zip64=True) as f:
        np.lib.format.write_array(f, np.require(arr, requirements="C"), allow_pickle=False)


class Archive:
    """The entries of an open checkpoint, each checked against the file before it is read.

    Args:
        zf: the open ``zipfile.ZipFile``.
        size: the file's size in bytes.

    Raises:
        ValueError: a member that is compressed, whose stored size differs from its
            declared size, that lies outside the file, or whose name is not
            ``<entry>.npy``; members that add up to more than the file.
    """

    def __init__(self, zf: zipfile.ZipFile, size: int):
        self.zf, self.size = zf, size
        self.members: dict[str, zipfile.ZipInfo] = {}
        total = 0
        for info in zf.infolist():
            name = info.filename
            if not name.endswith(".npy") or name[:-4] in self.members:
                raise ValueError(f"unexpected member {name!r}")
            if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
                raise ValueError(f"member {name!r} is compressed (checkpoints are stored)")
            total += info.file_size
            if info.header_offset + info.compress_size > size or total > size:
                raise ValueError(f"member {name!r} declares more bytes than the file holds")
            self.members[name[:-4]] = info

    def names(self) -> set:
        """The entry names (without ``.npy``)."""
        return set(self.members)

    def open(self, name: str, shape: tuple | None, dtype) -> tuple:
        """Open entry ``name``: ``(file, shape, dtype)`` after checking its ``.npy`` header.

        ``shape`` (``dtype``) None accepts any shape (dtype); the data must fill the
        member exactly, in C order.

        Raises:
            ValueError: a missing entry, another shape or dtype, a data size other than
                the member's.
        """
        if name not in self.members:
            raise ValueError(f"missing entry {name!r}")
        f = self.zf.open(self.members[name])
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                got, fortran, dt = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                got, fortran, dt = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"entry {name!r}: unsupported .npy version {version}")
            got = tuple(got)
            if (
                fortran
                or (dtype is not None and dt != np.dtype(dtype))
                or (shape is not None and got != shape)
            ):
                raise ValueError(
                    f"entry {name!r} has shape {got} and dtype {dt}"
                    f"{' (Fortran order)' if fortran else ''}, expected shape "
                    f"{'(any)' if shape is None else shape} and dtype "
                    f"{'(any)' if dtype is None else np.dtype(dtype)}"
                )
            if f.tell() + math.prod(got) * dt.itemsize != self.members[name].file_size:
                raise ValueError(f"entry {name!r}: its data is not the size its header declares")
        except BaseException:
            f.close()
            raise
        return f, got, dt

    def array(self, name: str, shape: tuple, dtype) -> np.ndarray:
        """Entry ``name`` as an array of ``shape`` and ``dtype`` (checked before read)."""
        f, _, dt = self.open(name, shape, dtype)
        with f:
            return np.frombuffer(f.read(math.prod(shape) * dt.itemsize), dt).reshape(shape)

    def meta(self) -> dict:
        """The ``meta`` entry, a JSON object of the right format tag."""
        if "meta" not in self.members:
            raise ValueError("not a ReplayBuffer checkpoint (no meta entry)")
        f, shape, dt = self.open("meta", None, None)
        with f:
            if shape != () or dt.kind != "U":
                raise ValueError("not a ReplayBuffer checkpoint (bad meta entry)")
            text = np.frombuffer(f.read(dt.itemsize), dt)[0]
        meta = json.loads(str(text))
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ValueError("not a ReplayBuffer checkpoint (wrong format tag)")
        return meta
