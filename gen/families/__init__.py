"""Kernel families: what each op's spec may say, its torch reference, inputs, and work accounting.

A family module exposes the functions `gen.spec` and the later stages call; see gemm.py for the full set.
"""
from __future__ import annotations

from importlib import import_module

FAMILIES = ("gemm", "attention")


def get_family(name, path: str = "<spec>"):
    from ..spec import SpecError

    if name not in FAMILIES:
        raise SpecError(path, "family", f"unknown family {name!r}", f"use one of {list(FAMILIES)}")
    return import_module(f"{__name__}.{name}")


def is_pow2(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n > 0 and (n & (n - 1)) == 0


def require_keys(cfg: dict, keys, path: str, field: str, target: str):
    from ..spec import SpecError

    for k in keys:
        if k not in cfg:
            raise SpecError(path, f"{field}.{k}", f"missing for target {target}", f"set {k} (see the template's header comment)")


def require_pow2(cfg: dict, keys, path: str, field: str, lo: int = 1, hi: int = 1 << 16):
    from ..spec import SpecError

    for k in keys:
        v = cfg.get(k)
        if not is_pow2(v) or not lo <= v <= hi:
            raise SpecError(path, f"{field}.{k}", f"{v!r} is not a power of two in [{lo}, {hi}]",
                            f"use a power of two between {lo} and {hi}")


def require_choice(value, choices, path: str, field: str):
    from ..spec import SpecError

    if value not in choices:
        raise SpecError(path, field, f"{value!r} is not allowed", f"use one of {list(choices)}")
    return value
