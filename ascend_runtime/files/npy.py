"""``.npy`` arrays read only after their header agrees with the file: nothing is allocated for a lie.

An ``.npy`` file is a header (magic, version, a Python-literal dict of ``descr``, ``fortran_order`` and
``shape``) followed by the raw data. ``numpy.load`` allocates ``prod(shape) x itemsize`` bytes from the header
alone; a 100-byte file claiming shape ``(100000, 100000)`` of float64 asks for 80 GB. :func:`load_npy` reads the
header with numpy's own parser (its header size bounded), then requires, before allocating:

- no object dtype (those would need pickle; other dtypes are the caller's to judge);
- ``prod(shape) x itemsize`` computed exactly (Python integers) equal to the bytes after the header;
- that size within the kind's cap (1 GiB for a load history,
  :data:`~ascend_runtime.files.read.NPY_LOAD`), which the file's size was already held to.

An ``.npz`` archive (a zip file) is refused naming what to give instead.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from ascend_runtime.files.read import NPY_LOAD, FileKind, FileRefused, open_regular

#: Largest ``.npy`` header read (numpy's own default limit for untrusted files).
MAX_HEADER_BYTES = 10_000
_ZIP_MAGIC = b"PK\x03\x04"


def load_npy(path: Path | str, kind: FileKind = NPY_LOAD, max_elements: int | None = None) -> np.ndarray:
    """The array of the ``.npy`` file ``path``, any shape, numeric dtype; :class:`FileRefused` for a file that
    is not one, a header that disagrees with the file's size, one over ``kind``'s cap, or one of more than
    ``max_elements`` values (a caller that converts them to float64 bounds the copy it makes)."""
    fd, info = open_regular(path, kind)
    with os.fdopen(fd, "rb") as fh:
        magic = fh.read(6)
        if magic.startswith(_ZIP_MAGIC):
            raise FileRefused(f"{path} is an .npz archive, not one .npy array", "save the array with numpy.save")
        fh.seek(0)
        try:
            version = np.lib.format.read_magic(fh)
            reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = reader(fh, max_header_size=MAX_HEADER_BYTES)
        except (ValueError, OSError, EOFError, SyntaxError, TypeError) as exc:
            raise FileRefused(f"{path} is not a readable .npy array ({_short(exc)})", kind.fix) from None
        if dtype.hasobject:
            raise FileRefused(f"{path} holds Python objects (numpy reads them with pickle, which runs code)",
                              "save integer or float counts")
        offset = fh.tell()
        need = math.prod(shape) * dtype.itemsize
        held = info.st_size - offset
        if need != held:
            raise FileRefused(f"{path}: its header claims shape {tuple(shape)} of {dtype} ({need} bytes) but the file "
                              f"holds {held} bytes after the header (truncated, or not what numpy.save wrote)", kind.fix)
        if max_elements is not None and math.prod(shape) > max_elements:
            raise FileRefused(f"{path}: shape {tuple(shape)} holds {math.prod(shape)} values, more than the "
                              f"{max_elements} a {kind.name} may have", kind.fix)
        if need > kind.max_bytes:
            raise FileRefused(f"{path}: shape {tuple(shape)} of {dtype} is {need} bytes, more than the "
                              f"{kind.max_bytes} a {kind.name} may have", kind.fix)
        data = bytearray(need)  # writable, so the array needs no copy
        if fh.readinto(data) != need:
            raise FileRefused(f"{path} changed while it was read", "read it again once it is written")
    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")


def _short(exc: BaseException, limit: int = 120) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
