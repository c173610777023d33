"""opserve's dtypes and their numpy forms, and the bytes of a tensor both ways.

The wire holds little-endian, row-major element bytes. numpy has no bfloat16, so BFLOAT16 data
is either widened to float32 (exact: bfloat16 is the upper half of a float32) or kept as its raw
uint16 bits; uploads take either form.
"""

from __future__ import annotations

import enum
from typing import Any, Optional, Sequence, Tuple, Union

import grpc
import numpy as np

from opserve._proto import pb
from opserve.errors import OpserveError, invalid_argument


# One row per dtype, in the proto's order, as the server's table (common/dtype.cc) has them; the
# dtype_table test holds the two together. Columns: the proto's name, its enum value, the element
# size in bytes, numpy's name, the Open Inference Protocol's datatype name.
TABLE = (
    ("FLOAT32", 1, 4, "float32", "FP32"),
    ("INT32", 2, 4, "int32", "INT32"),
    ("INT64", 3, 8, "int64", "INT64"),
    ("BFLOAT16", 4, 2, "bfloat16", "BF16"),
)


class DType(enum.Enum):
    """A tensor's element type, named as in the proto. Compares equal to its name.

    Not a str subclass, so that help() shows the type rather than every method of str; equality
    and hashing follow the name, so DType.FLOAT32 == "FLOAT32" and either finds the other in a dict.
    """

    FLOAT32 = "FLOAT32"
    INT32 = "INT32"
    INT64 = "INT64"
    BFLOAT16 = "BFLOAT16"

    def __str__(self) -> str:
        return self.value

    def __eq__(self, other) -> bool:
        return self.value == other if isinstance(other, str) else self is other

    def __hash__(self) -> int:
        return hash(self.value)


# Bytes per element, and the Open Inference Protocol's datatype name, of each DType.
ELEMENT_SIZE = {DType(row[0]): row[2] for row in TABLE}
OIP_NAME = {DType(row[0]): row[4] for row in TABLE}
_FROM_OIP_NAME = {row[4]: DType(row[0]) for row in TABLE}

# The numpy dtype of each DType's wire bytes (BFLOAT16: its raw bits), of the table's sizes.
_WIRE = {
    DType.FLOAT32: np.dtype("<f4"),
    DType.INT32: np.dtype("<i4"),
    DType.INT64: np.dtype("<i8"),
    DType.BFLOAT16: np.dtype("<u2"),
}
assert all(_WIRE[d].itemsize == ELEMENT_SIZE[d] for d in DType), "_WIRE disagrees with TABLE"
# What an upload with no dtype named becomes: only numpy types that are the DType exactly.
# float64 (numpy's default) is refused rather than narrowed silently; dtype="float32" asks for it.
_INFERRED = {np.dtype(np.float32): DType.FLOAT32, np.dtype(np.int32): DType.INT32,
             np.dtype(np.int64): DType.INT64}

DTypeLike = Union[DType, str]


def dtype_of(value: DTypeLike) -> DType:
    """A DType from itself or its name, in any case ("bfloat16", "FLOAT32")."""
    try:
        return value if isinstance(value, DType) else DType(str(value).upper())
    except ValueError:
        raise invalid_argument(f"unknown dtype {value!r}; dtypes: "
                               f"{', '.join(d.value for d in DType)}") from None


def from_oip_name(name: str) -> DType:
    """The DType of an Open Inference Protocol datatype name ("FP32", "BF16", ...)."""
    try:
        return _FROM_OIP_NAME[name]
    except KeyError:
        raise invalid_argument(f"datatype {name!r} is not one opserve runs; datatypes: "
                               f"{', '.join(_FROM_OIP_NAME)}") from None


def to_number(dtype: DType) -> int:
    return pb.dtype_number[dtype.value]


def from_number(number: int) -> DType:
    """The DType of a proto enum number; one this client does not know (a newer server's) is
    UNIMPLEMENTED here."""
    name = pb.dtype_name.get(number, str(number))
    try:
        return DType(name)
    except ValueError:
        raise OpserveError(grpc.StatusCode.UNIMPLEMENTED,
                           f"dtype {name} is not one this client can decode") from None


def float32_to_bfloat16_bits(values: Any) -> np.ndarray:
    """bfloat16 bits (uint16) of float values, rounded to nearest even as hardware converts.

    NaNs stay NaN (quiet); values past bfloat16's range become infinities.
    """
    f = np.asarray(values, dtype="<f4", order="C")
    bits = f.view("<u4")
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
               >> np.uint32(16)).astype("<u2")
    quiet_nan = ((bits >> np.uint32(16)) | np.uint32(0x0040)).astype("<u2")
    return np.where(np.isnan(f), quiet_nan, rounded)


def bfloat16_bits_to_float32(bits: Any) -> np.ndarray:
    """float32 values of bfloat16 bits (uint16): exact, bfloat16 being a float32's upper half."""
    b = np.asarray(bits, dtype="<u2", order="C")
    return (b.astype("<u4") << np.uint32(16)).view("<f4")


def encode(array: Any, dtype: Optional[DTypeLike] = None) -> Tuple[DType, Tuple[int, ...], np.ndarray]:
    """(dtype, shape, wire array) of an upload: the wire array is C-contiguous little-endian.

    With no dtype, the array's numpy dtype must be float32, int32 or int64. A dtype converts:
    FLOAT32 from any real numbers, INT32 and INT64 from integers, BFLOAT16 from floats (rounded
    to nearest even) or from uint16 taken as raw bfloat16 bits.
    """
    a = np.asarray(array)
    if dtype is None:
        if a.dtype.newbyteorder("=") not in _INFERRED:
            raise invalid_argument(f"numpy dtype {a.dtype} is not an opserve dtype; pass dtype= "
                                   "(FLOAT32, INT32, INT64, BFLOAT16) or convert with astype")
        target = _INFERRED[a.dtype.newbyteorder("=")]
    else:
        target = dtype_of(dtype)
    if target is DType.BFLOAT16:
        if a.dtype == np.uint16:
            wire = np.asarray(a, dtype="<u2", order="C")
        elif a.dtype.kind == "f":
            wire = float32_to_bfloat16_bits(a)  # float64 goes through float32 first
        else:
            raise invalid_argument(f"BFLOAT16 takes float arrays or uint16 bits, not {a.dtype}")
    else:
        if not np.can_cast(a.dtype, _WIRE[target], casting="same_kind"):
            raise invalid_argument(f"numpy dtype {a.dtype} does not convert to {target.value}")
        wire = np.asarray(a, dtype=_WIRE[target], order="C")
    return target, tuple(int(d) for d in a.shape), wire


def decode(dtype: DType, shape: Sequence[int], data: Union[bytes, np.ndarray],
           raw_bfloat16: bool = False) -> np.ndarray:
    """The numpy array of wire bytes, writable: bytes (a message's) are copied, an ndarray
    buffer (the caller's) is used in place.

    BFLOAT16 comes back as float32, or as its raw uint16 bits with raw_bfloat16.
    """
    wire = _WIRE[dtype]
    flat = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray)) else data
    count = int(np.prod(shape, dtype=np.int64))
    if flat.nbytes != count * wire.itemsize:
        raise invalid_argument(f"{dtype.value}{list(shape)} needs {count * wire.itemsize} bytes, "
                               f"got {flat.nbytes}")
    values = flat.view(wire).reshape(tuple(shape))
    if dtype is DType.BFLOAT16 and not raw_bfloat16:
        return bfloat16_bits_to_float32(values)
    # Bytes from a message are read-only and owned by it; a caller's buffer is the caller's.
    return values.copy() if isinstance(data, (bytes, bytearray)) else values
