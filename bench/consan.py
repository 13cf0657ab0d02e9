#!/usr/bin/env python3
"""Triton's concurrency sanitizer (consan) over every shipped Gluon variant this GPU runs, one case each.

    python bench/consan.py [--family gemm|attention|attention-backward|all] [--jobs 4] [--timeout 900] [--out F] [--dry-run]

consan (TRITON_INSTRUMENTATION_MODE=consan) compiles a kernel with every shared-memory, TMA, mbarrier and MMA access
checked against the barriers that order it, and aborts the kernel on a race. It is the GPU-side counterpart of gen's
CPU simulator (docs/simulator.md), which checks the same protocol on a model of the hardware.

Each variant runs in its own child process (a sanitizer abort poisons the CUDA context) with the instrumentation
on, the precompiled bundles off (GEN_NO_PRECOMPILED=1: a bundled, uninstrumented binary must never stand in for the
instrumented one) and a global-scratch allocator (consan's shadow state). The child runs the variant as the CPU
simulator does (gen.measure.simulate: the family's simulation cases and shapes, which wrap every ring and carry
state across persistent tiles, on 2 SMs' worth of programs), here only the first case: consan's compile is slow. "attention-backward" runs the Gluon backward kernels (dK/dV and
dQ, sm90 and sm100) inside the portable backward on one GQA causal case, against fp32 autograd.
Cross-compiled on a 2-core CPU with triton 3.6.0, one case took 47 s (gemm sm90) and 90 s (attention sm90), PTX of
126k and 190k lines. Variants: the build the package runs on the installed Triton (gen.runtime.op.OpRuntime.
release_build), for this GPU's architecture (sm90 on Hopper, sm100 on Blackwell).

Output (--out, default bench/results/consan-<device>.json): {"device", "torch", "triton", "command", "variants":
[{"family", "variant", "module", "ok", "seconds", "cases", "max_rel_err", "error"}]}. Exit 0 when every variant ran
clean, 1 when one raced, failed or timed out, 2 without a GPU (--dry-run lists what would run, on any machine).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FAMILIES = ("gemm", "attention", "attention-backward")
ENV = {"TRITON_INSTRUMENTATION_MODE": "consan", "GEN_NO_PRECOMPILED": "1"}


def variants(family: str, arch: str) -> list[tuple[str, str]]:
    """(variant, module) of every shipped Gluon variant for `arch` ("sm90", "sm100") in the build the package runs
    on the installed Triton: that release's own module where it has one, else the package's. For "attention-backward":
    the attention variants whose module has Gluon backward kernels (backward_dkdv, backward_dq)."""
    from gen.runtime.dispatch import variant_target

    package = importlib.import_module(f"generated.{family.removesuffix('-backward')}")
    own, shipped_there = package._RT.release_build()
    found = [(name, f"{own if name in shipped_there else package.__name__}.{name}")
             for name in package.SHIPPED if variant_target(name) == arch]
    if family.endswith("-backward"):
        found = [(n, m) for n, m in found if hasattr(importlib.import_module(m), "backward_dkdv")]
    return found


def backward_child(module) -> dict:
    """The module's Gluon dK/dV and dQ kernels inside the portable backward (as the op's default backward runs them),
    on one GQA causal case whose lengths are not multiples of the tiles, against fp32 autograd of the math."""
    import torch

    import generated.attention as att
    from gen.measure.accuracy import rel_err

    gen = torch.Generator(device="cuda").manual_seed(0)
    b, hq, hkv, lq, lk, d, mod = 1, 4, 2, 200, 200, 64, "causal"
    q, k, v = (torch.randn(b, h, n, d, device="cuda", generator=gen).bfloat16()
               for h, n in ((hq, lq), (hkv, lk), (hkv, lk)))
    g = torch.randn(b, hq, lq, d, device="cuda", generator=gen).bfloat16()
    _, _, _, scale, _, left, right, cap, _ = att._arguments(q, k, v, mod, None, None, None, None)
    out, lse = att.run_provider("triton", q, k, v, mod=mod, return_lse=True)
    dq, dk, dv = att._module("triton", q, mod).backward(q, k, v, out, lse, g, None, scale, mod, left, right, cap, None,
                                                       dkdv=module.backward_dkdv, dq_kernel=module.backward_dq)
    torch.cuda.synchronize()
    qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
    want = torch.autograd.grad((att.torch_math(qf, kf, vf, scale, mod, left, right, cap, None)[0].float()
                                * g.float()).sum(), (qf, kf, vf))
    errs = [rel_err(a, w) for a, w in zip((dq, dk, dv), want)]
    return {"cases": 1, "max_rel_err": max(errs), "ok": max(errs) < 2e-2, "failed": [] if max(errs) < 2e-2 else
            [{"case": [b, hq, hkv, lq, lk, d, mod], "rel_err": errs}]}


def child(family: str, module_name: str) -> None:
    """Run one variant under consan (this process was started with the instrumentation on); print a JSON line."""
    import torch
    import triton

    from gen.build.spec import load_spec
    from gen.families import get_family
    from gen.measure.verify import verify_module

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    module = importlib.import_module(module_name)
    if family.endswith("-backward"):
        print(json.dumps(backward_child(module)))
        return
    spec = load_spec(ROOT / "specs" / f"{family}.yaml")
    fam = get_family(family)
    report = verify_module(spec, module, fam.simulation_cases(spec)[:1], fam.simulation_shapes(), "cuda", num_sms=2)
    torch.cuda.synchronize()
    print(json.dumps({"cases": len(report.cases), "max_rel_err": report.max_rel_err, "ok": report.ok,
                      "failed": [c for c in report.cases if not c["ok"]][:3]}))


def run_one(family: str, name: str, module_name: str, timeout: int) -> dict:
    t0 = time.perf_counter()
    row = {"family": family, "variant": name, "module": module_name}
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", family, module_name], capture_output=True,
                              text=True, cwd=ROOT, env={**os.environ, **ENV, "PYTHONPATH": str(ROOT)}, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**row, "ok": False, "seconds": round(time.perf_counter() - t0, 1), "error": f"timed out ({timeout} s)"}
    row["seconds"] = round(time.perf_counter() - t0, 1)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if proc.returncode != 0 or not last.startswith("{"):
        return {**row, "ok": False, "error": (proc.stderr or proc.stdout)[-3000:]}
    result = json.loads(last)
    return {**row, "ok": result["ok"], "cases": result["cases"], "max_rel_err": result["max_rel_err"],
            **({"error": json.dumps(result["failed"])[:3000]} if not result["ok"] else {})}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", choices=FAMILIES + ("all",), default="all")
    ap.add_argument("--jobs", type=int, default=4, help="variants compiled and run at once (consan compiles are slow)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per variant (compile and run)")
    ap.add_argument("--out", default="")
    ap.add_argument("--arch", default="", help="with --dry-run: list the variants of this arch (sm90, sm100)")
    ap.add_argument("--dry-run", action="store_true", help="list the variants and the command, run nothing")
    ap.add_argument("--child", nargs=2, metavar=("FAMILY", "MODULE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return 0

    import torch

    families = FAMILIES if args.family == "all" else (args.family,)
    if args.dry_run:
        arch = args.arch or ("sm%d%d" % torch.cuda.get_device_capability() if torch.cuda.is_available() else "sm90")
        for family in families:
            for name, module in variants(family, arch):
                print(f"{family} {name}: {' '.join(f'{k}={v}' for k, v in ENV.items())} "
                      f"python bench/consan.py --child {family} {module}")
        return 0
    if not torch.cuda.is_available():
        print("error: no CUDA GPU here (consan runs kernels); --dry-run lists what would run", file=sys.stderr)
        return 2
    import triton

    from bench.gpu_ci import device_slug
    from bench.suite.run import command_line

    arch = "sm%d%d" % torch.cuda.get_device_capability()
    todo = [(f, n, m) for f in families for n, m in variants(f, arch)]
    if not todo:
        print(f"error: no shipped Gluon variant runs on {arch}", file=sys.stderr)
        return 2
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = list(pool.map(lambda t: run_one(*t, args.timeout), todo))
    for r in rows:
        print(f"[{'ok' if r['ok'] else 'FAIL'}] {r['family']} {r['variant']} ({r['seconds']} s)"
              + ("" if r["ok"] else f": {r['error'][-300:]}"))
    device = torch.cuda.get_device_name()
    out = Path(args.out or ROOT / "bench" / "results" / f"consan-{device_slug(device)}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": device, "torch": torch.__version__, "triton": triton.__version__,
                               "command": command_line(sys.argv), "variants": rows},
                              indent=1) + "\n")
    print(f"{sum(r['ok'] for r in rows)}/{len(rows)} clean -> {out}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
