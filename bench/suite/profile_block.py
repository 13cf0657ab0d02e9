#!/usr/bin/env python3
"""Where a decoder-block step's time goes, per implementation and mode (GPU): host time per step, GPU time per step,
and the host functions that cost the most.

    python bench/suite/profile_block.py [--case llama3-8b/block/decode/B1-Lk8192] [--steps 200] [--top 20]
                                        [--modes eager,compile,compile-dynamic,compile-auto] [--out FILE]

For each of torch and gen (block.make_block), and each mode: the step's host time (back-to-back steps, host clock,
synchronized at both ends, median of 3 loops), its GPU time (torch.profiler: the sum of device kernel time per
step), the number of kernels launched per step, and cProfile's top functions by own time. A step whose host time is
well above its GPU time is host-bound; the cProfile rows say where that host time is spent.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from bench.suite import block as suite_block  # noqa: E402
from bench.suite import cases as suite  # noqa: E402
from bench.suite import run as suite_run  # noqa: E402


def host_ms(fn, steps: int) -> float:
    loops = []
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
        loops.append((time.perf_counter() - t0) / steps * 1e3)
    return round(statistics.median(loops), 4)


def gpu_ms(fn, steps: int) -> tuple[float, float]:
    """(device kernel ms per step, kernels per step), from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type.name == "CUDA"]
    total_us = sum(e.device_time for e in events)
    return round(total_us / steps / 1e3, 4), round(len(events) / steps, 1)


def top_functions(fn, steps: int, top: int) -> list[str]:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    lines = buf.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls"))
    return lines[start:start + top + 1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", default="llama3-8b/block/decode/B1-Lk8192")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--modes", default="eager,compile,compile-dynamic")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_block.py needs a CUDA GPU", file=sys.stderr)
        return 2
    cases = {c["id"]: c for c in suite.block_cases()}
    if args.case not in cases:
        print(f"--case {args.case!r} is not a block case; one of: {', '.join(cases)}", file=sys.stderr)
        return 2
    case = cases[args.case]
    env = suite_run.Env(argparse.Namespace(smoke=False, time_budget=None, with_triton=False))
    bench = suite_block.Block()
    model, inputs = bench._inputs(env, case)
    result = {"case": args.case, "device": torch.cuda.get_device_name(),
              "versions": {"torch": torch.__version__}, "steps": args.steps, "rows": []}
    for impl in suite_block.IMPLS:
        for mode in args.modes.split(","):
            block = suite_block.make_block(model, impl, case["mode"])
            if mode in ("compile", "compile-dynamic", "compile-auto"):
                # dynamic: every size symbolic (weights too); auto: Dynamo's automatic dynamic shapes, as the suite
                # and a serving loop get them: the layer first runs another case of the model (other B, L or Lk),
                # so the sizes that changed become symbolic and the rest stay static
                block = torch.compile(suite_run.fresh(block), fullgraph=True, dynamic=mode == "compile-dynamic")
                if mode == "compile-auto":
                    other = next(c for c in suite.block_cases() if c["model"] == case["model"]
                                 and c["mode"] == case["mode"] and c["id"] != case["id"])
                    block(*bench._inputs(env, other)[1])
            elif mode != "eager":
                raise SystemExit(f"--modes: {mode!r} is not eager, compile, compile-dynamic or compile-auto")
            step = lambda block=block: block(*inputs)  # noqa: E731
            for _ in range(5):   # compile, caches, routes
                step()
            torch.cuda.synchronize()
            gpu, kernels = gpu_ms(step, 20)
            row = {"impl": impl, "mode": mode, "host_ms": host_ms(step, args.steps), "gpu_ms": gpu,
                   "kernels_per_step": kernels, "top": top_functions(step, args.steps, args.top)}
            result["rows"].append(row)
            print(f"\n== {impl}-{mode}: {row['host_ms']} ms/step on the host clock, {gpu} ms GPU, "
                  f"{kernels} kernels/step")
            print("\n".join(row["top"]))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
