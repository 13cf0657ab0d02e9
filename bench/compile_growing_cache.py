#!/usr/bin/env python3
"""torch.compile'd decode attention over a growing KV cache (GPU): a generation loop's step, B 8, 32 query heads over 8
KV heads, D 128, Lk 4096 + 1 each step (views of one buffer), 40 steps, host clock around each synchronized step.

    python bench/compile_growing_cache.py

Rows: torch.compile of the user's own SDPA call (`enable_gqa=True`), torch.compile of generated.attention, and
generated.attention eager; the first three steps include compilation, the median is over steps 10-39; rel_err
against an fp32 SDPA. Run on the H200 on 2026-12-04 (bench/NOTES.md has the figures).
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

B, HQ, HKV, D, L0, STEPS = 8, 32, 8, 128, 4096, 40


def main() -> int:
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print("compile_growing_cache.py needs a CUDA GPU", file=sys.stderr)
        return 2
    import generated.attention as att

    torch.manual_seed(0)
    cache = torch.randn(2, B, HKV, L0 + STEPS + 1, D, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(B, HQ, 1, D, device="cuda", dtype=torch.bfloat16)
    impls = {
        "torch-compile": torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                                       fullgraph=True),
        "gen-compile": torch.compile(lambda q, k, v: att.attention(q, k, v, mod="causal"), fullgraph=True),
        "gen-eager": lambda q, k, v: att.attention(q, k, v, mod="causal"),
    }
    for name, fn in impls.items():
        times, errs = [], []
        for i in range(STEPS):
            k, v = cache[0, :, :, :L0 + i], cache[1, :, :, :L0 + i]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = fn(q, k, v)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
            if i % 10 == 9:
                ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
                errs.append(float((out.float() - ref).norm() / ref.norm()))
        print(f"{name}: ms per step, first 3 {[round(t, 2) for t in times[:3]]}, median of steps 10-39 "
              f"{statistics.median(times[10:]):.3f}, max of 10-39 {max(times[10:]):.2f}, rel_err {max(errs):.2e}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
