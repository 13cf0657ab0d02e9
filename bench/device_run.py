#!/usr/bin/env python3
"""Everything a GPU can tell about this build, in one command and one JSON: the run a B200 (or H200) owner makes.

    python bench/device_run.py [--steps tests,bench,consan,suite-gemm,suite-attention,suite-block,train]
                               [--out DIR] [--suite-budget SECONDS] [--dry-run]

Steps, in this order, each a child process with its own time limit, exit code and output file, so that one that
fails, aborts the CUDA context or hangs does not stop the others:
  tests            pytest -m gpu: every variant this GPU runs against the torch reference, CUDA-graph capture,
                   the backward, split-K (per-test outcomes from pytest's junit XML)
  bench            bench/gpu_ci.py --family all --skip-tests: `python -m gen SPEC --bench` per family (verify and
                   benchmark against Inductor and the vendor libraries) compared with bench/results/<family>-<device>.json
  consan           bench/consan.py: every shipped Gluon variant of this GPU's architecture under Triton's
                   concurrency sanitizer
  suite-gemm, suite-attention, suite-block
                   bench/suite/run.py --family F: the workload suite (every torch provider and ours per case, call and
                   GPU time), --suite-budget seconds each
  train            bench/attention_train.py: forward + backward per provider, our Gluon dK/dV included where the GPU's
                   target has one
Output: DIR/device-run-<device>.json {"device", "versions", "command", "steps": [{"name", "command", "status"
("passed", "failed", "timed out", "not run"), "rc", "seconds", "outputs", "summary"}]}, the steps' own files beside it
(DIR defaults to bench/results/device-run-<device>/). A step's summary is read from its output: test counts, consan
variants clean and not, suite cases measured. Exit 0 when every step run passed, 1 otherwise, 2 without a GPU
(--dry-run prints the plan on any machine). The Blackwell and Hopper workflows call it; README says what each step
covers and what no GPU has run yet.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STEPS = ("tests", "bench", "consan", "suite-gemm", "suite-attention", "suite-block", "train")
TIMEOUT_S = {"tests": 3600, "bench": 3600, "consan": 3600, "train": 1800}   # suite steps: --suite-budget + 600


def step_command(name: str, out: Path, slug: str, suite_budget: float) -> tuple[list, dict]:
    """(argv, {output name: path}) of one step."""
    py = sys.executable
    if name == "tests":
        xml = out / "gpu-tests.xml"
        return [py, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}"], {"junit": xml}
    if name == "bench":
        path = out / "gpu-ci.json"
        return [py, "bench/gpu_ci.py", "--family", "all", "--skip-tests", "--out", str(path)], {"json": path}
    if name == "consan":
        path = out / "consan.json"
        return [py, "bench/consan.py", "--out", str(path)], {"json": path}
    if name == "train":
        path = out / f"attention-train-{slug}.json"
        return [py, "bench/attention_train.py", "--out", str(path)], {"json": path}
    family = name.removeprefix("suite-")
    path = out / f"suite-{family}-{slug}.json"
    return ([py, "bench/suite/run.py", "--family", family, "--out", str(path), "--time-budget", str(suite_budget)],
            {"json": path})


def summarize(name: str, outputs: dict) -> dict:
    """What a step's output file says, in a few counts ({} when it wrote none)."""
    try:
        if name == "tests":
            suite = ET.parse(outputs["junit"]).getroot()
            suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
            counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
            failed = [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
                      if case.find("failure") is not None or case.find("error") is not None]
            return {**counts, "failed": failed[:50]}
        doc = json.loads(Path(outputs["json"]).read_text())
    except (OSError, ValueError, ET.ParseError, AttributeError):
        return {}
    if name == "consan":
        variants = doc.get("variants", [])
        return {"variants": len(variants), "clean": sum(1 for v in variants if v.get("ok")),
                "not_clean": [f"{v.get('family')}/{v.get('variant')}" for v in variants if not v.get("ok")]}
    if name == "bench":
        return {family: {"rows": len(f.get("rows", [])), "errors": len(f.get("errors", []))}
                for family, f in doc.get("families", {}).items()}
    return {"rows": len(doc.get("rows", []))}


def run_step(name: str, argv: list, outputs: dict, timeout: float) -> dict:
    print(f"== {name}: {' '.join(argv[1:])}", flush=True)
    t0 = time.monotonic()
    try:
        rc = subprocess.call(argv, cwd=ROOT, timeout=timeout)
        status = "passed" if rc == 0 else "failed"
    except subprocess.TimeoutExpired:
        rc, status = None, "timed out"
    seconds = round(time.monotonic() - t0, 1)
    print(f"== {name}: {status} in {seconds} s", flush=True)
    return {"name": name, "command": " ".join(["python"] + argv[1:]), "status": status, "rc": rc,
            "seconds": seconds, "outputs": {k: str(v) for k, v in outputs.items()},
            "summary": summarize(name, {k: ROOT / v for k, v in outputs.items()})}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python bench/device_run.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated subset of {','.join(STEPS)}")
    p.add_argument("--out", help="folder for the run's files (default bench/results/device-run-<device>/)")
    p.add_argument("--suite-budget", type=float, default=1800, help="seconds per suite family (default 1800)")
    p.add_argument("--dry-run", action="store_true", help="print the steps' commands; run nothing (any machine)")
    args = p.parse_args(argv)
    steps = [s for s in args.steps.split(",") if s]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        p.error(f"unknown step(s) {unknown}; choose from {','.join(STEPS)}")

    from bench.gpu_ci import device_slug
    from gen.runtime.device import cuda_available, device_info

    gpu = cuda_available()
    if not gpu and not args.dry_run:
        print("error: no CUDA GPU visible (--dry-run prints the plan)", file=sys.stderr)
        return 2
    info = device_info(0) if gpu else None
    slug = device_slug(info.name) if info else "no-gpu"
    out = Path(args.out).resolve() if args.out else ROOT / "bench" / "results" / f"device-run-{slug}"
    if out.is_relative_to(ROOT):
        out = out.relative_to(ROOT)   # the steps run in the checkout: recorded commands name no machine path
    plan = [(name, *step_command(name, out, slug, args.suite_budget)) for name in STEPS if name in steps]
    if args.dry_run:
        for name, cmd, _ in plan:
            print(f"{name}: python {' '.join(cmd[1:])}")
        return 0

    import torch
    import triton

    (ROOT / out).mkdir(parents=True, exist_ok=True)
    record = {"device": info.label, "versions": {"torch": torch.__version__, "triton": triton.__version__},
              "command": "python bench/device_run.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "steps": [{"name": name, "status": "not run", "reason": "not in --steps"}
                        for name in STEPS if name not in steps]}
    path = ROOT / out / f"device-run-{slug}.json"
    for name, cmd, outputs in plan:
        timeout = TIMEOUT_S.get(name, args.suite_budget + 600)
        record["steps"].append(run_step(name, cmd, outputs, timeout))
        path.write_text(json.dumps(record, indent=1) + "\n")   # after every step: a killed run keeps what it did
    failed = [s["name"] for s in record["steps"] if s["status"] in ("failed", "timed out")]
    print(f"device_run: {path}: " + (f"FAILED: {', '.join(failed)}" if failed else "every step run passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
