"""Import-to-first-result time of the generated kernels, with and without the precompiled bundle (GPU only).

    python bench/first_call.py [--out DIR] [--repeats 3]

Each measurement is a fresh Python process with an empty Triton cache (TRITON_CACHE_DIR in a new temp dir), which is
what a new machine, container or CI job sees. It times `import generated.<family>` plus the first call and its
synchronize, checks the result against torch, and counts what ran: Triton compiler invocations (the frontend's
make_ir) and C launcher builds (triton.runtime.build._build, gcc). Modes:
- jit:          GEN_NO_PRECOMPILED=1, so the bundle is ignored (the "before").
- precompiled:  the bundle seeds Triton's cache (the "after").
- warm:         a second process on the cache the precompiled run left: Triton's own cache, launchers included.
The record goes to DIR/first_call.json (default bench/results/first_call-<device>.json).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = r'''
import json, os, sys, time
t_start = time.perf_counter()
import torch
from bench.compile_counter import install

counts = install()

family = sys.argv[1]
torch.manual_seed(0)
dev = "cuda"
if family == "gemm":
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    bias = torch.randn(4096, device=dev, dtype=torch.bfloat16)
    ref = torch.nn.functional.gelu(a.double() @ b.double() + bias.double(), approximate="tanh")
else:
    q, k, v = (torch.randn(2, 16, 2048, 128, device=dev, dtype=torch.bfloat16) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
torch.cuda.synchronize()
t_torch = time.perf_counter()
if family == "gemm":
    from generated.gemm import gemm
    call = lambda: gemm(a, b, bias, activation="gelu_tanh")
else:
    from generated.attention import attention
    call = lambda: attention(q, k, v, mod="causal")
t_import = time.perf_counter()
out = call()
torch.cuda.synchronize()
t_first = time.perf_counter()
call(); torch.cuda.synchronize()
t_second = time.perf_counter()
err = ((out.double() - ref).norm() / ref.norm()).item()
print(json.dumps({"import_s": t_import - t_torch, "first_call_s": t_first - t_import,
                  "import_to_first_result_s": t_first - t_torch, "second_call_s": t_second - t_first,
                  "process_to_first_result_s": t_first - t_start, "rel_err": err, "compiler": len(counts["compiled"]),
                  "launcher_builds": counts["launcher_builds"], "launcher_build_s": counts["launcher_build_s"]}))
'''


def child_env(mode: str, cache_dir: str) -> dict:
    """A child's environment: its own Triton cache, and the bundle ignored in "jit" mode only."""
    env = {**os.environ, "TRITON_CACHE_DIR": cache_dir, "PYTHONPATH": str(ROOT)}
    env.pop("GEN_NO_PRECOMPILED", None)
    if mode == "jit":
        env["GEN_NO_PRECOMPILED"] = "1"
    return env


def profile(family: str) -> str:
    """cProfile of one precompiled-mode child (fresh cache): the top of the cumulative-time table."""
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as tmp:
        env = child_env("precompiled", cache)
        stats = Path(tmp) / "prof"
        child = Path(tmp) / "child.py"
        child.write_text(CHILD)
        subprocess.run([sys.executable, "-m", "cProfile", "-o", str(stats), str(child), family], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=900, check=True)
        import io
        import pstats

        buf = io.StringIO()
        pstats.Stats(str(stats), stream=buf).sort_stats("cumulative").print_stats(40)
        return buf.getvalue()


def measure(family: str, mode: str, cache_dir: str) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, family], env=child_env(mode, cache_dir), cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    if p.returncode:
        raise SystemExit(f"{family}/{mode} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--family", action="append", choices=["gemm", "attention"])
    ap.add_argument("--profile", action="store_true", help="also print where a precompiled first call spends its time")
    args = ap.parse_args()
    import torch

    from gen.runtime.device import device_info

    device = device_info(0).label
    record = {"device": device, "command": "python bench/first_call.py", "python": sys.version.split()[0],
              "torch": torch.__version__, "families": {}}
    for family in args.family or ["gemm", "attention"]:
        runs = {"jit": [], "precompiled": [], "warm": []}
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as jit_cache, tempfile.TemporaryDirectory() as pre_cache:
                runs["jit"].append(measure(family, "jit", jit_cache))
                runs["precompiled"].append(measure(family, "precompiled", pre_cache))
                runs["warm"].append(measure(family, "warm", pre_cache))
        summary = {}
        for mode, rs in runs.items():
            summary[mode] = {"median_import_to_first_result_s": round(statistics.median(
                r["import_to_first_result_s"] for r in rs), 3), "runs": rs}
            print(f"{family:9s} {mode:12s} import->first result {summary[mode]['median_import_to_first_result_s']:7.3f} s"
                  f"  (compiler runs {rs[0]['compiler']}, launcher builds {rs[0]['launcher_builds']} "
                  f"{rs[0]['launcher_build_s']:.2f} s, rel err {rs[0]['rel_err']:.1e}) on {device}", flush=True)
        record["families"][family] = summary
        if args.profile:
            print(profile(family), flush=True)
    out = Path(args.out) if args.out else ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    name = "first_call.json" if args.out else f"first_call-{device.split()[-1].strip('()').replace('_', '')}.json"
    (out / name).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
