"""cast=True: numpy dtypes the server does not take, converted to the nearest one it does.

Without it an upload of such an array is refused, naming its dtype: numpy's default float64
narrowed to float32 silently would lose precision the caller never agreed to lose.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from opserve.dtypes import DTypeLike
from opserve.errors import invalid_argument

# numpy dtypes the server takes as they are (dtypes.encode infers FLOAT32, INT32, INT64 from them).
_NATIVE = {np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.int64)}


def _nearest(a: np.ndarray, what: str) -> np.ndarray:
    kind, size = a.dtype.kind, a.dtype.itemsize
    if kind == "f":  # float16, float64, longdouble
        return a.astype(np.float32)
    if kind == "b" or (kind == "i" and size < 4) or (kind == "u" and size < 4):
        return a.astype(np.int32)
    if kind == "u" and size == 4:
        return a.astype(np.int64)
    if kind == "u" and size == 8:
        # Compared as uint64: against a Python int numpy would compare float64s, and round.
        if a.size and a.max() > np.uint64(np.iinfo(np.int64).max):
            raise invalid_argument(f"{what}: uint64 values above {np.iinfo(np.int64).max} do not "
                                   "fit INT64")
        return a.astype(np.int64)
    raise invalid_argument(f"{what}: numpy dtype {a.dtype} has no opserve dtype to cast to "
                           "(FLOAT32, INT32, INT64, BFLOAT16)")


def prepare(array: Any, dtype: Optional[DTypeLike], cast: bool, what: str) -> Any:
    """The array to encode: as given, or with cast its nearest dtype the server takes. An array
    the server does not take, with neither dtype= nor cast=True, is refused here by name."""
    if dtype is not None:
        return array  # dtype= converts explicitly (dtypes.encode)
    a = np.asarray(array)
    if a.dtype.newbyteorder("=") in _NATIVE:
        return a
    if cast:
        return _nearest(a, what)
    raise invalid_argument(f"{what}: numpy dtype {a.dtype} is not one the server takes "
                           "(float32, int32, int64); pass cast=True to convert it to the nearest "
                           "(float64 -> float32, int8/int16/uint8/uint16/bool -> int32, "
                           "uint32/uint64 -> int64) or dtype= to name one")
