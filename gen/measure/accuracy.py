"""The accuracy contract every op is held to: the error measure and its tolerance per output dtype.

Its own module because the families (each judges its outputs) and the stages that read the verdicts (gen.measure.verify,
gen.analysis.dispatch_table) need the same numbers, and the families must not import the stages.
"""
from __future__ import annotations

import math

# Relative-error tolerances ||out - ref|| / ||ref|| by output dtype (bf16 rounding alone is ~2e-3 in norm).
TOLERANCE = {"bfloat16": 1e-2, "float16": 4e-3, "float32": 1e-4}


def rel_err(out, ref) -> float:
    import torch

    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return math.inf
    denom = ref.norm().item()
    diff = (out - ref).norm().item()
    return diff / denom if denom > 0 else diff
