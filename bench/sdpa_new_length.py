#!/usr/bin/env python3
"""Host time of an SDPA call at a length the backend has met before, and at one it has not (GPU): decode over a
growing KV cache, and causal prefill at prompt lengths that change every call.

    python bench/sdpa_new_length.py [--out bench/results/sdpa-new-length-<device>.json] [--calls 12]

A Llama-3-8B decode call (Lq 1, 32 query heads over 8 KV heads, D 128, `enable_gqa=True`), K and V views of a
preallocated cache: "fixed" repeats Lk 4096; "growing" reads one key more every call (a generation loop over a
growing cache), every backend from a fresh length so none is warm from another. Host clock around `calls` calls,
synchronized before and after. "prefill" is the same model's causal prefill (B 1, Lq = Lk), "fixed" at 2048 and
"growing" one token longer every call (a server's prompts). The first row is our op as a user calls it
(generated.attention.attention), whose route leaves the backends that set up per length once the length varies.
Why it matters: the suite times warmed-up loops at fixed shapes, so a backend that sets up per new shape looks fast
there (Family.PER_SHAPE_SETUP_PROVIDERS in gen/families/attention.py).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--calls", type=int, default=12)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("sdpa_new_length.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from bench.gpu_ci import device_slug
    from generated.attention import attention as gen_attention

    # decode: q [1, 32, 1, 128] over views of a KV cache; prefill: q, k, v views of [1, H, L, 128] buffers
    cache = torch.randn(2, 1, 8, 5000 + 6 * args.calls + 1, 128, device="cuda", dtype=torch.bfloat16)
    q_decode = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    q_prompt = torch.randn(1, 32, 3000 + 6 * args.calls + 1, 128, device="cuda", dtype=torch.bfloat16)
    phases = {  # phase -> (fixed length, first growing length, call at length n)
        "decode": (4096, 5000, lambda n, sdpa: sdpa(q_decode, cache[0, :, :, :n], cache[1, :, :, :n], enable_gqa=True)),
        "prefill": (2048, 3000, lambda n, sdpa: sdpa(q_prompt[:, :, :n], cache[0, :, :, :n], cache[1, :, :, :n],
                                                     is_causal=True, enable_gqa=True)),
    }

    rows = []
    for phase, (fixed, first, call_at) in phases.items():
        fresh = [first]

        def us_per_call(call, grow: bool) -> float:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fresh[0] += grow
                call_at(fresh[0] if grow else fixed, call)
            torch.cuda.synchronize()
            return round((time.perf_counter() - t0) / args.calls * 1e6, 1)

        for name, backend in (("gen (generated.attention, as dispatched)", "gen"), ("SDPA's own choice", None),
                              ("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                              ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH)):
            def sdpa(*a, backend=backend, **kw):
                if backend == "gen":   # the op a user calls: its route sees the length change (varying_provider)
                    return gen_attention(*a, mod="causal" if kw.get("is_causal") else "none")
                if backend is None:
                    return F.scaled_dot_product_attention(*a, **kw)
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(*a, **kw)
            try:
                call_at(fixed, sdpa)
                row = {"phase": phase, "backend": name, "fixed_us": us_per_call(sdpa, False),
                       "growing_us": us_per_call(sdpa, True)}
            except RuntimeError as e:
                row = {"phase": phase, "backend": name, "error": str(e).splitlines()[0][:120]}
            rows.append(row)
            print(row, flush=True)
    device = torch.cuda.get_device_name()
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / f"sdpa-new-length-{device_slug(device)}.json"
    out.write_text(json.dumps({"device": device, "versions": {"torch": torch.__version__},
                               "command": "python bench/sdpa_new_length.py", "calls": args.calls, "rows": rows},
                              indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
