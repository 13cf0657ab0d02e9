"""Gluon (triton.language) dtypes <-> torch dtypes. Gluon code keeps seeing the real triton dtype objects."""
from __future__ import annotations

import torch
import triton.language.core as tlc

from .errors import SimulationError

_GL2TORCH = {
    "int1": torch.bool,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "uint16": torch.uint16,
    "uint32": torch.uint32,
    "uint64": torch.uint64,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
    "fp64": torch.float64,
    "fp8e4nv": torch.float8_e4m3fn,
    "fp8e5": torch.float8_e5m2,
    "fp8e4b8": torch.float8_e4m3fnuz,
    "fp8e5b16": torch.float8_e5m2fnuz,
}
_TORCH2GL = {
    torch.bool: tlc.int1,
    torch.int8: tlc.int8,
    torch.int16: tlc.int16,
    torch.int32: tlc.int32,
    torch.int64: tlc.int64,
    torch.uint8: tlc.uint8,
    torch.uint16: tlc.uint16,
    torch.uint32: tlc.uint32,
    torch.uint64: tlc.uint64,
    torch.float16: tlc.float16,
    torch.bfloat16: tlc.bfloat16,
    torch.float32: tlc.float32,
    torch.float64: tlc.float64,
    torch.float8_e4m3fn: tlc.float8e4nv,
    torch.float8_e5m2: tlc.float8e5,
    torch.float8_e4m3fnuz: tlc.float8e4b8,
    torch.float8_e5m2fnuz: tlc.float8e5b16,
}


def to_torch(dt) -> torch.dtype:
    dt = unwrap(dt)
    if isinstance(dt, torch.dtype):
        return dt
    try:
        return _GL2TORCH[dt.name]
    except (KeyError, AttributeError):
        raise SimulationError(f"dtype {dt!r} is not supported by the simulator") from None


def from_torch(dt: torch.dtype):
    try:
        return _TORCH2GL[dt]
    except KeyError:
        raise SimulationError(f"torch dtype {dt} has no Gluon equivalent") from None


def as_gl(dt):
    """Accept a gluon dtype or a torch dtype, return the gluon dtype."""
    dt = unwrap(dt)
    if isinstance(dt, torch.dtype):
        return from_torch(dt)
    if isinstance(dt, tlc.dtype):
        return dt
    raise SimulationError(f"expected a dtype, got {dt!r}")


def nbytes_of(dt) -> int:
    return max(1, as_gl(dt).primitive_bitwidth // 8)


def unwrap(x):
    """Strip triton constexpr wrappers (modules may build layouts with real tl.constexpr values)."""
    while isinstance(x, tlc.constexpr):
        x = x.value
    return x
