"""The timing harness of benchmarks on a GPU: medians of many timed runs, a wall-clock budget, speed-up ratios.

What each op benchmarks (its providers, cases and FLOP counts) is its family's `benchmark` (gen/families/); this
module is what every family's benchmark times with.
"""
from __future__ import annotations

import math
import os
import time

# A wall-clock budget for one benchmark run (GEN_BENCH_BUDGET_S): cases past it are reported as not measured.
_DEADLINE = [math.inf]


def start_budget() -> None:
    budget = float(os.environ.get("GEN_BENCH_BUDGET_S", "inf"))
    _DEADLINE[0] = time.monotonic() + budget


def over_budget() -> bool:
    return time.monotonic() > _DEADLINE[0]


def time_ms(fn, warmup_ms: int = 100, rep_ms: int = 500) -> float:
    """Median time of `fn` in ms (CUDA events around each call, after warm-up)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def _row(case: str, provider: str, ms: float, flops: float) -> dict:
    return {"case": case, "provider": provider, "ms": round(ms, 5), "tflops": round(flops / ms / 1e9, 1)}


def measure(rows: list, case: str, provider: str, flops: float, fn, errors: list) -> None:
    """Time `fn` into a row of `rows`, or record why not in `errors` (a baseline that cannot run is a finding)."""
    if over_budget():
        errors.append({"case": case, "provider": provider, "error": "not measured: GEN_BENCH_BUDGET_S ran out"})
        return
    try:
        rows.append(_row(case, provider, time_ms(fn), flops))
    except Exception as e:  # a baseline that cannot run here is reported, not fatal
        errors.append({"case": case, "provider": provider, "error": f"{type(e).__name__}: {e}"[:300]})


def speedups(rows: list, ours: str, baseline: str) -> dict:
    """case -> our time ratio vs a baseline (>1 means we are faster)."""
    by = {(r["case"], r["provider"]): r["ms"] for r in rows}
    return {c: round(by[(c, baseline)] / by[(c, ours)], 3) for (c, p) in by if p == ours and (c, baseline) in by
            and by[(c, ours)] > 0 and not math.isinf(by[(c, ours)])}
