"""Kernel families: everything the stages need to know about one op, behind one interface (protocol.Family).

A family module (gemm.py, attention.py) implements every function of protocol.Family; the stages reach it only
through `get_family(spec.family)`, so they hold no per-op branches and a new op is one module here plus its templates.
The helpers below are the validation vocabulary the family modules share.
"""
from __future__ import annotations

from importlib import import_module

from ..build.spec_types import SpecError
from .protocol import Family, check_family

FAMILIES = ("gemm", "attention")


def get_family(name, path: str = "<spec>") -> Family:
    """The family module `name`, checked to implement protocol.Family (a SpecError for an unknown name)."""
    if name not in FAMILIES:
        raise SpecError(path, "family", f"unknown family {name!r}", f"use one of {list(FAMILIES)}")
    return check_family(import_module(f"{__name__}.{name}"))


def inputs_on(inputs: dict, device) -> dict:
    """A family's make_inputs on `device`: its tensors, and those inside its tuples (gemm's RoPE tables), moved;
    everything else as it is."""
    import torch

    def move(v):
        if isinstance(v, torch.Tensor):
            return v.to(device)
        return tuple(move(x) for x in v) if isinstance(v, tuple) else v
    return {k: move(v) for k, v in inputs.items()}


def is_int(n) -> bool:
    # YAML `true` is a Python int too; never let it pass for 1
    return isinstance(n, int) and not isinstance(n, bool)


def is_number(x) -> bool:
    """An int or float that is finite and fits a float (not a bool, nan, inf or a 400-digit int)."""
    return (is_int(x) or isinstance(x, float)) and abs(x) < 1e300  # False for nan; exact for huge ints


def is_pow2(n) -> bool:
    return is_int(n) and n > 0 and (n & (n - 1)) == 0


def require_keys(cfg: dict, keys, path: str, field: str, target: str):
    for k in keys:
        if k not in cfg:
            raise SpecError(path, f"{field}.{k}", f"missing for target {target}", f"set {k} (see the template's header comment)")


def require_pow2(cfg: dict, keys, path: str, field: str, lo: int = 1, hi: int = 1 << 16):
    for k in keys:
        v = cfg.get(k)
        if not is_pow2(v) or not lo <= v <= hi:
            raise SpecError(path, f"{field}.{k}", f"{v!r} is not a power of two in [{lo}, {hi}]",
                            f"use a power of two between {lo} and {hi}")


def require_int(cfg: dict, keys, path: str, field: str, lo: int, hi: int):
    """Each of `keys` that cfg sets is an integer in [lo, hi] (absent ones are the template's default)."""
    for k in keys:
        if k in cfg and not (is_int(cfg[k]) and lo <= cfg[k] <= hi):
            raise SpecError(path, f"{field}.{k}", f"{cfg[k]!r} is not an integer in [{lo}, {hi}]",
                            f"use an integer between {lo} and {hi}")


def require_list(value, path: str, field: str, example: str, empty_ok: bool = False) -> list:
    if not isinstance(value, list) or not (value or empty_ok):
        what = "a list" if empty_ok else "a non-empty list"
        raise SpecError(path, field, f"expected {what}, got {value!r}", f"write e.g. {field.rsplit('.', 1)[-1]}: {example}")
    return value


def require_known(section: dict, known, path: str, field: str) -> None:
    for k in section:
        if k not in known:
            raise SpecError(path, f"{field}.{k}", "unknown field", f"use only {list(known)}")


def require_choice(value, choices, path: str, field: str):
    # by type as well as value: 64.0 or `true` must not pass for 64 or 1 (they would render into the kernels)
    if not any(type(value) is type(c) and value == c for c in choices):
        raise SpecError(path, field, f"{value!r} is not allowed", f"use one of {list(choices)}")
    return value
