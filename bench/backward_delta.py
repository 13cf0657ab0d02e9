"""The attention backward's delta pre-pass on Hopper: the portable Triton kernel against sm90's Gluon one (GPU only).

    python bench/backward_delta.py [--out DIR]

The op's backward (GEN_ATTENTION_BACKWARD=gluon-dq, the default) runs sm90's Gluon dK/dV and dQ kernels, bundled,
after a pre-pass that computes delta = rowsum(dO * O). That pre-pass was the portable Triton kernel: JIT-compiled on
a process's first backward and launched through Triton's binder on every one. Now it is sm90's own Gluon kernel
(`backward_delta`), bundled and launched directly. Measured here, each way ("portable": the sm90 module's
backward_delta removed, so the backward falls back to the portable pre-pass; "gluon": as shipped):
- first: a fresh process with an empty Triton cache (TRITON_CACHE_DIR in a new temp dir) runs one training step of
  `attention(q, k, v, mod="window")` (a mod SDPA cannot express, so our kernels train); the step's backward wall time
  (synchronized) and the Triton compiler invocations during it;
- steady: in one process, back-to-back backward calls (the portable backward function, as the op calls it) at a small
  and a model-sized shape: host time per call (no synchronize between calls) and GPU time per call (CUDA events),
  medians of 7 rounds of 50 calls, the two ways interleaved.
The record goes to DIR/backward-delta.json (default bench/results/backward-delta-<device>.json).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = r'''
import json, sys, time
import torch
from bench.compile_counter import install
import generated.attention as att
import generated.attention.sm90 as sm90
if sys.argv[1] == "portable":
    del sm90.backward_delta
compiles = install()["compiled"]
torch.manual_seed(0)
q, k, v = (torch.randn(2, h, 1024, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for h in (32, 8, 8))
out = att.attention(q, k, v, mod="window")
g = torch.randn_like(out)
torch.cuda.synchronize()
before = len(compiles)
t = time.perf_counter()
out.backward(g)
torch.cuda.synchronize()
print(json.dumps({"backward_s": time.perf_counter() - t, "compiled": compiles[before:]}))
'''


def first_backward(way: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, "-c", CHILD, way], capture_output=True, text=True, env=env, cwd=ROOT,
                              timeout=600)
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def steady(shape: tuple, calls: int = 50, rounds: int = 7) -> dict:
    import torch
    import generated.attention as att
    import generated.attention.sm90 as sm90

    B, Hq, Hkv, L, D = shape
    torch.manual_seed(0)
    q = torch.randn(B, Hq, L, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, Hkv, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out, lse = att.run_provider("sm90", q, k, v, mod="window", return_lse=True)
    dout = torch.randn_like(out)
    portable = att._module("triton", q, "window")
    _, _, _, scale, _, left, right, cap, _ = att._arguments(q, k, v, "window", None, None, None, None)
    ways = {"portable": None, "gluon": sm90.backward_delta}
    results = {}

    def step(delta_kernel):
        return portable.backward(q, k, v, out, lse, dout, None, scale, "window", left, right, cap, None,
                                 dkdv=sm90.backward_dkdv, dq_kernel=sm90.backward_dq, delta_kernel=delta_kernel)

    grads = {way: step(kernel) for way, kernel in ways.items()}   # compiled and warm
    same = all(torch.equal(a, b) for a, b in zip(grads["portable"], grads["gluon"]))
    host, gpu = {w: [] for w in ways}, {w: [] for w in ways}
    for _ in range(rounds):
        for way, kernel in ways.items():
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t = time.perf_counter()
            start.record()
            for _ in range(calls):
                step(kernel)
            end.record()
            host[way].append((time.perf_counter() - t) / calls * 1e6)
            end.synchronize()
            gpu[way].append(start.elapsed_time(end) / calls * 1e3)
    for way in ways:
        results[way] = {"host_us_per_call": round(statistics.median(host[way]), 1),
                        "gpu_us_per_call": round(statistics.median(gpu[way]), 1)}
    return {"shape": {"B": B, "Hq": Hq, "Hkv": Hkv, "L": L, "D": D, "mod": "window"}, "same_gradients": same,
            **results}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    import torch

    device = torch.cuda.get_device_name(0)
    record = {"device": device, "torch": torch.__version__, "command": "python bench/backward_delta.py",
              "first": {way: first_backward(way) for way in ("portable", "gluon")},
              "steady": [steady(s) for s in ((1, 8, 8, 256, 64), (2, 32, 8, 2048, 128))]}
    print(json.dumps(record, indent=1))
    out = Path(args.out or ROOT / "bench" / "results") / (
        "backward-delta.json" if args.out else f"backward-delta-{device.split()[1].lower()}.json")
    out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
