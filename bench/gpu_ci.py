#!/usr/bin/env python3
"""GPU CI, one local command: GPU tests, then the family benchmarks, compared with the results committed for this device.

    python bench/gpu_ci.py --family gemm|attention|all [--update] [--tolerance 0.10] [--no-autotune]

1. `python -m pytest -m gpu -q` (a failure fails the job);
2. `python -m gen specs/<family>.yaml --bench`: verify and benchmark the shipped variants this device runs against
   the baselines, recorded in generated/<family>/manifest.json and REPORT.md;
3. a comparison with bench/results/<family>-<device-slug>.json ({"device", "command", "date", "rows": [{"case",
   "provider", "ms", "tflops"}]}): every gen-* row is printed against its committed time, and the job fails (exit 1)
   when one is more than --tolerance slower, or is committed but no longer measured. Baseline rows (cuBLAS, Inductor,
   cuDNN, flex) are printed for context only. `--update` rewrites the committed file with this run (after the tests
   pass); commit it with the change that moved the numbers.
Exit codes: 0 ok, 1 test failure or regression, 2 no GPU / nothing to run.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results"
FAMILIES = ("gemm", "attention")
_VENDOR_WORDS = {"nvidia", "geforce", "tesla", "quadro", "graphics", "(tm)"}
_MEMORY_WORD = re.compile(r"^\d+gb$|^hbm\d*e?$|^sxm\d*$")


def device_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA B200' -> 'b200', 'NVIDIA H100 80GB HBM3' -> 'h100',
    'NVIDIA H100 PCIe' -> 'h100-pcie', 'NVIDIA GeForce RTX 4090' -> 'rtx-4090'."""
    words = [w for w in re.split(r"[\s_]+", name.lower().strip()) if w]
    words = [re.sub(r"[^a-z0-9.-]", "", w) for w in words if w not in _VENDOR_WORDS and not _MEMORY_WORD.match(w)]
    slug = "-".join(w for w in words if w)
    return slug or "unknown-gpu"


def results_path(family: str, slug: str) -> Path:
    return RESULTS / f"{family}-{slug}.json"


def compare(rows: list, committed: list, tolerance: float) -> tuple[list[str], list[str]]:
    """(lines to print, failures) comparing this run's rows with the committed ones; only gen-* rows can fail."""
    old = {(r["case"], r["provider"]): r for r in committed}
    new = {(r["case"], r["provider"]): r for r in rows}
    lines, failures = [], []
    for key in sorted(set(old) | set(new), key=lambda k: (not k[1].startswith("gen-"), k[0], k[1])):
        case, prov = key
        ours = prov.startswith("gen-")
        o, n = old.get(key), new.get(key)
        if n is None:
            line = f"{prov:24s} {case}: committed {o['ms']:.4f} ms, NOT MEASURED in this run"
            if ours:
                failures.append(line)
            lines.append(("FAIL " if ours else "     ") + line)
            continue
        if o is None:
            lines.append(f"     {prov:24s} {case}: {n['ms']:.4f} ms (new: nothing committed)")
            continue
        ratio = n["ms"] / o["ms"] if o["ms"] else float("inf")
        slower = ratio > 1.0 + tolerance
        verdict = ("FAIL " if ours and slower else "ok   " if ours else "     ")
        line = (f"{prov:24s} {case}: {n['ms']:.4f} ms vs committed {o['ms']:.4f} ms ({(ratio - 1) * 100:+.1f}%"
                + (f", over the {tolerance * 100:.0f}% allowed" if ours and slower else "") + ")")
        lines.append(verdict + line)
        if ours and slower:
            failures.append(line)
    return lines, failures


def run_tests() -> bool:
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q"]
    if importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", "8"]  # each worker JIT-compiles its own specializations: the tests are compile-bound
    print("== GPU tests: " + " ".join(cmd[1:]), flush=True)
    rc = subprocess.call(cmd, cwd=ROOT)
    if rc != 0:
        print(f"GPU tests failed (pytest exit code {rc}{': no GPU test was collected' if rc == 5 else ''})")
    return rc == 0


def bench_family(family: str, info, with_autotune: bool) -> tuple[list, list, list]:
    """(rows, errors, providers): `python -m gen specs/<family>.yaml --bench` (verify, benchmark, record in
    generated/<family>/manifest.json, as a user would), then its recorded rows."""
    cmd = [sys.executable, "-m", "gen", f"specs/{family}.yaml", "--bench"]
    env = dict(os.environ)
    if not with_autotune:
        env["GEN_BENCH_NO_AUTOTUNE"] = "1"
    print("== " + " ".join(["python"] + cmd[1:]), flush=True)
    rc = subprocess.call(cmd, cwd=ROOT, env=env)
    if rc != 0:
        return [], [{"case": "-", "provider": "-", "error": f"python -m gen exited {rc}"}], []
    manifest = json.loads((ROOT / "generated" / family / "manifest.json").read_text())
    measured = [v for v in manifest["variants"] if "bench" in v]
    if not measured:
        print(f"{family}: no shipped variant runs on {info.label}")
        return [], [], []
    bench = measured[0]["bench"]
    errors = list(bench.get("errors", []))
    for v in manifest["variants"]:
        if "verify" in v and not v["verify"]["ok"]:
            errors.append({"case": "-", "provider": f"gen-{v['target']}", "error": "verification failed"})
    return bench["rows"], errors, [f"gen-{v['target']}" for v in measured]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python bench/gpu_ci.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=[*FAMILIES, "all"], required=True)
    p.add_argument("--update", action="store_true", help="rewrite bench/results/<family>-<device>.json with this run")
    p.add_argument("--tolerance", type=float, default=0.10, help="allowed slowdown of a gen-* row (default 0.10 = 10%%)")
    p.add_argument("--no-autotune", action="store_true", help="skip the Inductor max-autotune GEMM baseline (slow)")
    p.add_argument("--out", default=None, help="also write this run's rows (every family) to this JSON file (CI artifact)")
    p.add_argument("--skip-tests", action="store_true", help="benchmark only (local use; CI runs the tests)")
    args = p.parse_args(argv)

    from gen.runtime.device import cuda_available, device_info

    if not cuda_available():
        print("error: no CUDA GPU visible; this job runs on the self-hosted GPU runners", file=sys.stderr)
        return 2
    info = device_info(0)
    slug = device_slug(info.name)
    print(f"device: {info.label}, {info.num_sms} SMs -> results slug '{slug}'")
    if not args.skip_tests and not run_tests():
        return 1

    command = "python bench/gpu_ci.py " + " ".join(argv if argv is not None else sys.argv[1:])
    status = 0
    families = FAMILIES if args.family == "all" else (args.family,)
    run_record = {"device": info.label, "slug": slug, "command": command, "families": {}}
    for family in families:
        rows, errors, providers = bench_family(family, info, with_autotune=not args.no_autotune)
        run_record["families"][family] = {"rows": rows, "errors": errors}
        if args.out:
            Path(args.out).write_text(json.dumps(run_record, indent=1) + "\n")
        ours_failed = [e for e in errors if (e["provider"].startswith("gen-") or e["provider"] == "-")
                       and not e["error"].startswith("not measured")]
        for e in errors:
            print(f"  {'FAIL' if e in ours_failed else 'note'}: {e['provider']} {e['case']}: {e['error']}")
        if ours_failed:
            status = 1
        if not providers:
            continue
        path = results_path(family, slug)
        if args.update:
            if ours_failed:
                print(f"{family}: not updating {path.relative_to(ROOT)}: our variants failed to run")
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            doc = {"device": info.label, "command": command,
                   "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
                   "rows": [{k: r[k] for k in ("case", "provider", "ms", "tflops") if k in r} for r in rows]}
            path.write_text(json.dumps(doc, indent=1) + "\n")
            print(f"{family}: wrote {len(rows)} rows to {path.relative_to(ROOT)} (commit it)")
            continue
        if not path.exists():
            print(f"{family}: no committed results for this device ({path.relative_to(ROOT)}); nothing to compare. "
                  f"Record them with: python bench/gpu_ci.py --family {family} --update")
            for r in rows:
                print(f"     {r['provider']:24s} {r['case']}: {r['ms']:.4f} ms, {r.get('tflops', '-')} TFLOP/s")
            continue
        committed = json.loads(path.read_text())
        print(f"== {family}: vs {path.relative_to(ROOT)} (recorded {committed.get('date', '?')} on "
              f"{committed.get('device', '?')}, tolerance {args.tolerance * 100:.0f}%)")
        lines, failures = compare(rows, committed.get("rows", []), args.tolerance)
        print("\n".join(lines))
        if failures:
            print(f"{family}: {len(failures)} regression(s) of our kernels")
            status = 1
    print("gpu_ci: " + ("FAILED" if status else "ok"))
    return status


if __name__ == "__main__":
    sys.exit(main())
