"""IR baselines: the key figures of each shipped variant, checked in, so a regression fails CI and names the figure."""
from __future__ import annotations

from ..build.mlir import IRReport

ASYNC_OPS = ("UTCHMMA", "HGMMA", "UTMALDG", "UTMASTG")
# Compile cost is gated by code size, not wall clock: seconds compare machines and cache states (the baseline's
# machine against CI's), while SASS size is the same everywhere and grows with what makes compiles slow (unrolling).
CODE_SIZE_FACTOR = 1.5


def snapshot(reports: list[IRReport]) -> dict:
    """Key figures over every compile case of a variant (worst case for budgets, presence for instructions)."""
    return {
        "smem_bytes": max(r.smem_bytes for r in reports),
        "tmem_cols": max(r.tmem_cols for r in reports),
        "spills": max(r.spills - r.prologue_spills for r in reports),   # the prologue's: their own figure
        "prologue_spills": max(r.prologue_spills for r in reports),
        "local_bytes": max(r.local_bytes for r in reports),
        "convert_layouts": max(r.convert_layouts for r in reports),
        "regs": max(r.regs for r in reports),
        "instructions": {op: min(r.instructions.get(op, 0) for r in reports) for op in ASYNC_OPS},
        "sass_size": max(r.sass_size for r in reports),
    }


def regressions(current: dict, baseline: dict) -> list[str]:
    """What moved the wrong way, each naming the figure."""
    out = []
    for key in ("smem_bytes", "tmem_cols", "convert_layouts", "local_bytes", "prologue_spills"):
        if current.get(key, 0) > baseline.get(key, current.get(key, 0)):
            out.append(f"{key} rose from {baseline[key]} to {current[key]}")
    if current["spills"] > 0:
        out.append(f"spills: {current['spills']} spill stores (baseline {baseline.get('spills', 0)})")
    for op, n in baseline.get("instructions", {}).items():
        if n > 0 and current["instructions"].get(op, 0) == 0:
            out.append(f"async instruction {op} disappeared from SASS (baseline had {n})")
    base_size = baseline.get("sass_size", 0)
    if base_size and current["sass_size"] > CODE_SIZE_FACTOR * base_size:
        out.append(f"SASS size {current['sass_size']} instructions > {CODE_SIZE_FACTOR}x baseline {base_size} "
                   "(compile time grows with it)")
    return out
