#!/usr/bin/env python3
"""Host time of a decode SDPA call at a KV length the backend has met before, and at one it has not (GPU).

    python bench/sdpa_new_length.py [--out bench/results/sdpa-new-length-<device>.json] [--calls 12]

A Llama-3-8B decode call (Lq 1, 32 query heads over 8 KV heads, D 128, `enable_gqa=True`), K and V views of a
preallocated cache: "fixed" repeats Lk 4096; "growing" reads one key more every call (a generation loop over a
growing cache), every backend from a fresh length so none is warm from another. Host clock around `calls` calls,
synchronized before and after. Why it matters: the suite times warmed-up loops at fixed shapes, so a backend that
sets up per new shape looks fast there (Family.PER_SHAPE_SETUP_PROVIDERS in gen/families/attention.py).
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

    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    cache = torch.randn(2, 1, 8, 5000 + 6 * args.calls + 1, 128, device="cuda", dtype=torch.bfloat16)
    fresh = [5000]

    def us_per_call(call, grow: bool) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fresh[0] += grow
            n = fresh[0] if grow else 4096
            call(cache[0, :, :, :n], cache[1, :, :, :n])
        torch.cuda.synchronize()
        return round((time.perf_counter() - t0) / args.calls * 1e6, 1)

    rows = []
    for name, backend in (("SDPA's own choice", None), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("math", SDPBackend.MATH)):
        def call(k, v, backend=backend):
            if backend is None:
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        try:
            call(cache[0, :, :, :4096], cache[1, :, :, :4096])
            row = {"backend": name, "fixed_us": us_per_call(call, False), "growing_us": us_per_call(call, True)}
        except RuntimeError as e:
            row = {"backend": name, "error": str(e).splitlines()[0][:120]}
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
