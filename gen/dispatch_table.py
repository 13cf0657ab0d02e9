"""Build a generated package's dispatch table (generated/<family>/dispatch.json) from workload-suite results.

Input: bench/results/suite-<family>-<device>.json files written by `bench/suite/run.py` on a GPU (one row per case,
every provider's call time). Per target (the Gluon variant the run measured, e.g. sm90), rows are grouped by their
bucket (gen/runtime/shapes.py, the same function the op applies per call). In each bucket every provider the op can
dispatch to that ran correctly on all of the bucket's rows gets a score, the geomean over those rows of its call time
over the row's fastest; the lowest score wins, except that one of our variants must beat the best torch provider by
MARGIN (within noise the torch provider, which is also what an unmeasured call gets, is kept). A provider whose error
exceeds the op's tolerance for the output dtype (gen.verify.TOLERANCE) is not a candidate for that case.

Call time (back-to-back calls on the host clock, what an eager caller waits for) decides, not CUDA-graph GPU time:
it is the larger of the two, and host overhead is part of what a user pays.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from .cache import REPO_ROOT
from .runtime.shapes import attention_bucket, gemm_bucket
from .verify import TOLERANCE

RESULTS = REPO_ROOT / "bench" / "results"
FORMAT = 1
MARGIN = 1.02
OUR_TARGETS = ("sm100", "sm90", "triton")
# What each family's op can dispatch to besides our variants (bench-only providers such as torch.compile are not).
TORCH_PROVIDERS = {"gemm": ("torch",), "attention": ("sdpa", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "torch")}
# What an unmeasured bucket gets (the attention op turns "sdpa" into our variant for mods SDPA cannot express).
DEFAULT = {"gemm": "torch", "attention": "sdpa"}


def row_bucket(family: str, case: dict):
    if family == "gemm":
        return gemm_bucket(case["M"], case["N"], case["K"], case["dtype"], case["out_dtype"], case["bias"],
                           case["activation"], case["weight"])
    return attention_bucket(case["B"], case["Hq"], case["Hkv"], case["Lq"], case["Lk"], case["D"], case["mod"])


def usable(p, tolerance: float = math.inf) -> bool:
    """Ran, and within the op's accuracy contract (gen.verify.TOLERANCE for the output dtype): a provider that is
    faster because it rounds an fp32 output through bf16 is not a candidate for that output."""
    return (isinstance(p, dict) and "error" not in p and not p.get("wrong") and p.get("call_ms") is not None
            and p.get("rel_err", 0.0) <= tolerance)


def _tolerance(case: dict) -> float:
    return TOLERANCE[case.get("out_dtype", case.get("dtype", "bfloat16"))]


def choose(family: str, rows: list[dict], margin: float = MARGIN) -> tuple[str, dict]:
    """(provider, {provider: score}) for one bucket's rows."""
    names = set(TORCH_PROVIDERS[family]) | set(OUR_TARGETS)
    common = [n for n in sorted(names)
              if all(usable(r["providers"].get(n), _tolerance(r["case"])) for r in rows)]
    scores = {}
    for n in common:
        ratios = [r["providers"][n]["call_ms"] / min(r["providers"][m]["call_ms"] for m in common) for r in rows]
        scores[n] = round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 4)
    torch_side = {n: s for n, s in scores.items() if n in TORCH_PROVIDERS[family]}
    ours = {n: s for n, s in scores.items() if n in OUR_TARGETS}
    best_torch = min(torch_side, key=lambda n: (torch_side[n], n)) if torch_side else None
    best_ours = min(ours, key=lambda n: (ours[n], n)) if ours else None
    if best_ours and (best_torch is None or ours[best_ours] * margin < torch_side[best_torch]):
        return best_ours, scores
    return best_torch or DEFAULT[family], scores


def _target_of(run: dict) -> str:
    measured = {n for r in run["rows"] for n, p in r["providers"].items() if usable(p)}
    gluon = [t for t in ("sm100", "sm90") if t in measured]
    return gluon[0] if gluon else "triton"


def build(family: str, runs: list[tuple[str, dict]]) -> dict:
    """runs: [(source file relative to the repo, suite JSON)] -> the dispatch.json content."""
    targets = {}
    for source, run in runs:
        groups: dict = {}
        for row in run["rows"]:
            cat, bins = row_bucket(family, row["case"])
            groups.setdefault((cat, bins), []).append(row)
        buckets = []
        for (cat, bins), rows in sorted(groups.items(), key=lambda kv: repr(kv[0])):
            provider, scores = choose(family, rows)
            buckets.append({"categorical": list(cat), "bins": list(bins), "provider": provider,
                            "cases": [r["id"] for r in rows], "scores": scores})
        targets[_target_of(run)] = {
            "source": source, "device": run.get("device"), "versions": run.get("versions"),
            "command": run.get("command"), "default": DEFAULT[family], "buckets": buckets}
    return {"format": FORMAT, "family": family, "margin": MARGIN,
            "rule": "per bucket, the provider with the lowest geomean call time relative to each case's fastest; "
                    f"our variants must beat the best torch provider by {MARGIN}x; unmeasured buckets take the "
                    "nearest measured bucket with the same categorical fields (<= 2 log2 bins away), else the default",
            "targets": targets}


def suite_results(family: str, results: Path = RESULTS) -> list[tuple[str, dict]]:
    runs = []
    for path in sorted(results.glob(f"suite-{family}-*.json")):
        data = json.loads(path.read_text())
        if data.get("family") == family and data.get("rows"):
            runs.append((str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else path.name, data))
    return runs


def write(out_dir: Path, family: str, results: Path = RESULTS) -> Path | None:
    """generated/<family>/dispatch.json from the committed suite results (removed when there are none)."""
    path = out_dir / "dispatch.json"
    runs = suite_results(family, results)
    if not runs:
        path.unlink(missing_ok=True)
        return None
    path.write_text(json.dumps(build(family, runs), indent=1) + "\n")
    return path
