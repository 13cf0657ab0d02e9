"""Build a generated package's dispatch table (generated/<family>/dispatch.json) from workload-suite results.

Input: bench/results/suite-<family>-<device>.json files written by `bench/suite/run.py` on a GPU (one row per case,
every provider's call time). Per target (the Gluon variant the run measured, e.g. sm90), rows are grouped by their
bucket (gen/runtime/shapes.py, the same function the op applies per call). In each bucket every provider the op can
dispatch to that ran correctly on all of the bucket's rows gets a score, the geomean over those rows of its call time
(plus SWITCH_MS for a provider selected by switching torch state per call) over the row's fastest; the lowest score
wins, except that one of our variants must beat the best torch provider by
MARGIN (within noise the torch provider, which is also what an unmeasured call gets, is kept). Among the torch
providers the family's default (SDPA's own backend choice, no `sdpa_kernel` context) is kept unless a named backend
beats it by MARGIN too: on the H200 SDPA already picks cuDNN where cuDNN wins, and forcing a backend that ties costs
host time per call (a decode block ran 0.07-0.17 ms a step slower eager with `sdpa-cudnn` picked). A provider whose error
exceeds the op's tolerance for the output dtype (gen.measure.accuracy.TOLERANCE) is not a candidate for that case.

Call time (back-to-back calls on the host clock, what an eager caller waits for) decides: it is the larger of host
and GPU time, and host overhead is part of what a user pays. But one of ours must also not lose on GPU time
(CUDA-graph replay) by more than MARGIN where every row has it: a call that is host-bound on both sides is a tie
within noise on the host clock, while under CUDA graphs, or whenever the host runs ahead of the GPU, the GPU time is
the cost (H200: llama3-8b decode B1 Lk1024, sm90 0.026 vs SDPA 0.027 ms a call but 0.0175 vs 0.0075 ms on the GPU;
the decoder block with it ran 0.95x under CUDA graphs). And ours must repay its launch path in GPU time: its GPU
time plus HOST_EXTRA_MS (what a call of ours costs the host over the torch op's) must still be within MARGIN of the
torch provider's GPU time. A model step is host-bound in eager decode (41 launches a layer), where a call of ours
costs that much more whatever its kernel saves (H200: sm90_swap16 beat cuBLAS by 1-9% on decode GEMMs of 11-40 us,
and the Llama-3-8B decode block with it picked ran 0.76-0.93x eager).

Each bucket also has a `graph_provider`: the same choice by GPU time alone, for calls captured into a CUDA graph
(torch.cuda.graph, torch.compile's reduce-overhead mode), whose replays run no host code, so neither our launch path
nor a backend switch costs anything there (H100 suite: 21 of 109 attention buckets pick otherwise, 1.31x GPU time
on their cases, Mistral's sliding-window decode 2.4-2.9x through split-KV; 48 of 142 GEMM buckets, 1.04x, the
decode GEMMs through swap-AB).

Each bucket also has a `traced_provider`: the choice for a call torch.compile traces (and, beside `varying_provider`,
a `traced_varying_provider`: that choice without the per-shape-setup providers, for a length torch.compile made
symbolic; H200, the Llama-3-8B decode block compiled with B and Lk symbolic ran 0.71-0.79x at Lk 1024-32768 with the
op traced wherever our split-KV kernel beat flash by less than that dispatch).
Under torch.compile a call of ours is an opaque custom op that torch.library dispatches, after which our eager path
runs (the suite times that eager path), while a torch provider is traced into the graph Inductor schedules (its
kernels are those the suite's torch-compile provider times, Family.TRACED_AS), launched by the compiled wrapper with
no eager host time. A compiled step of a model is host-bound at small and medium sizes, so host and GPU time are
counted as adding up: ours is charged its GPU time plus TRACED_OURS_MS, a torch provider its GPU time (or its
compiled form's, where less) plus TRACED_KERNEL_MS; where a GPU time is missing, the call time. H100, suite v4's
block: with traced calls charged as eager ones (our call time + dispatch against the torch provider's eager call:
rmsnorm's kernels, then F.linear), the table sent decode RMSNorm-rows GEMMs to ours and the compiled decode step ran
at its eager time, 0.63-0.87x of torch.compile's; charging the torch side as Inductor's kernels of it gave
0.92-1.11x, but the L512 prefill step still ran 0.79x with one op of ours left in its graph (gate_up, whose GPU time
beat Inductor's by 40 us, 0.174 against 0.214 ms): that step is host-bound (torch.compile 0.376 ms), so the op's
host time is what it cost. On the H200 the decoder block at prefill L=512 under torch.compile ran 0.71x with the GEMM
gate projection (ours by 5% in the suite) as a custom op.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from ..measure.accuracy import TOLERANCE
from ..cache import REPO_ROOT
from ..families import get_family
from ..runtime.dispatch import variant_target

RESULTS = REPO_ROOT / "bench" / "results"
FORMAT = 1
MARGIN = 1.02
# Host cost of torch.library's dispatch of one custom op call, over the direct eager path, rounded up from
# bench/results/host_time-h200.json as it was when the committed tables were built (H200, `python bench/host_time.py`:
# 55.8 vs 33.1 us gemm, 56.8 vs 40.8 attention). The file's later run, on a slower host, has 44.1 vs 20.8 and 65.3 vs
# 29.4 us: the host's speed moves between runs by up to 30%.
TRACED_OP_MS = 0.03
# Host time of one kernel launch in a compiled graph (Inductor's wrapper), what a traced torch provider costs the host
# over its GPU time: H200, the Mistral-7B decode block compiled launches 16 kernels a step
# (bench/results/profile-block-mistral-decode-h200.json); H100, suite v4's compiled decode blocks take 0.28-0.30 ms a
# step, host-bound: about 17 us a kernel, rounded down to the one or two an op becomes.
TRACED_KERNEL_MS = 0.015
# What a traced call of ours costs the host: torch.library's dispatch (TRACED_OP_MS) and our eager path (gemm through
# sm90 19.9 us a call, attention 24.3, in the run HOST_EXTRA_MS comes from), rounded.
TRACED_OURS_MS = TRACED_OP_MS + 0.02
# Host time of a call of ours over the torch op it replaces, eager, rounded up from the same earlier run: gemm through
# sm90 19.9 vs F.linear 13.2 us, attention through sm90 24.3 vs SDPA 17.8 us (the later run: 28.1 vs 17.4 and 34.1
# vs 24.2).
HOST_EXTRA_MS = 0.007
# Host time of selecting a switched torch provider per call (Family.SWITCHED_PROVIDERS: attention's named SDPA
# backends, whose switches the op flips and restores around the call), which the suite's loops pay once per loop.
# H200 host, Llama-3-8B decode B1 Lk8192, us a call (bench/sdpa_switch_time.py, results in
# bench/results/sdpa-switch-time-h200.json): SDPA's own choice 19.4, sdpa_kernel(cudnn) per call 37.3 (what the op
# did before), the op's run_provider("sdpa-cudnn") with the flip 27.5, of which about 4 us is the op's route (the op
# dispatched to SDPA: 23.3).
SWITCH_MS = 0.005
OUR_TARGETS = ("sm100", "sm90", "triton")   # ours: these and their named configs (sm90_m64, ...)


def row_bucket(family: str, case: dict):
    """The bucket a suite row's case falls in, as the family's op computes it per call."""
    return get_family(family).suite_bucket(case)


def usable(p, tolerance: float = math.inf, timed: str = "call_ms") -> bool:
    """Ran, was timed (`timed`: call_ms, or gpu_ms for a config sweep's cells), and within the op's accuracy contract
    (gen.measure.accuracy.TOLERANCE for the output dtype): a provider that is faster because it rounds an fp32 output
    through bf16 is not a candidate for that output."""
    return (isinstance(p, dict) and "error" not in p and not p.get("wrong") and p.get(timed) is not None
            and p.get("rel_err", 0.0) <= tolerance)


def case_tolerance(case: dict) -> float:
    """The op's accuracy tolerance for a suite case's output dtype."""
    return TOLERANCE[case.get("out_dtype", case.get("dtype", "bfloat16"))]


def geomean(xs: list) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs))


def _scores(rows: list[dict], names: list[str], ms) -> dict:
    """{provider: geomean over rows of ms(row, provider) / the row's fastest among `names`}."""
    return {n: round(geomean([ms(r, n) / min(ms(r, m) for m in names) for r in rows]), 4) for n in names}


def choose(family: str, rows: list[dict], margin: float = MARGIN, traced: bool = False,
           exclude: tuple = (), timed: str = "call_ms") -> tuple[str, dict]:
    """(provider, {provider: score}) for one bucket's rows; providers in `exclude` are not candidates.
    traced: the choice for a call torch.compile traces (_traced_ms: host and GPU time added up).
    timed="gpu_ms": the choice for calls captured in a CUDA graph, by GPU time alone (a replay runs no host code: no
    launch path, no backend switch to pay for)."""
    fam = get_family(family)
    names = (set(fam.TORCH_PROVIDERS) | {n for r in rows for n in r["providers"] if is_ours(n)}) - set(exclude)
    common = [n for n in sorted(names)
              if all(usable(r["providers"].get(n), case_tolerance(r["case"]), timed) for r in rows)]
    graph = timed == "gpu_ms"

    def ms(r, n):
        if graph:
            return r["providers"][n]["gpu_ms"]
        p = r["providers"][n]
        if traced:
            if is_ours(n):
                return _traced_ms(p, ours=True)
            compiled = r["providers"].get(fam.TRACED_AS.get(n))
            return min(_traced_ms(q, ours=False) for q in (p, compiled) if usable(q, case_tolerance(r["case"])))
        return p["call_ms"] + (SWITCH_MS if n in fam.SWITCHED_PROVIDERS else 0.0)

    scores = _scores(rows, common, ms)
    torch_side = {n: s for n, s in scores.items() if n in fam.TORCH_PROVIDERS}
    ours = {n: s for n, s in scores.items() if is_ours(n)}
    best_torch = min(torch_side, key=lambda n: (torch_side[n], n)) if torch_side else None
    default = fam.DEFAULT_PROVIDER
    if default in torch_side and torch_side[default] <= torch_side[best_torch] * margin:
        best_torch = default
    best_ours = min(ours, key=lambda n: (ours[n], n)) if ours else None
    if best_ours and (best_torch is None or (ours[best_ours] * margin < torch_side[best_torch]
                                             and (graph or not _loses_on_gpu(rows, best_ours, best_torch, margin)))):
        return best_ours, scores
    return best_torch or default, scores


def _traced_ms(p: dict, ours: bool) -> float:
    """A provider's cost in a compiled graph: its GPU time plus the host time a call of it costs there (ours
    TRACED_OURS_MS, a torch provider's kernels TRACED_KERNEL_MS); where no GPU time was measured, its call time, ours
    with the custom op's dispatch added."""
    if p.get("gpu_ms"):
        return p["gpu_ms"] + (TRACED_OURS_MS if ours else TRACED_KERNEL_MS)
    return p["call_ms"] + (TRACED_OP_MS if ours else 0.0)


def is_ours(provider: str) -> bool:
    """One of our variants: a target's default config or one of its named configs."""
    return variant_target(provider) in OUR_TARGETS


def _loses_on_gpu(rows: list[dict], ours: str, theirs: str, margin: float) -> bool:
    """Is `ours`, its extra host time per call counted as GPU time (HOST_EXTRA_MS), slower than `theirs` by more than
    the margin (where every row measured both)?"""
    if not all(r["providers"][n].get("gpu_ms") for r in rows for n in (ours, theirs)):
        return False
    def gpu_ms(r, n):
        return r["providers"][n]["gpu_ms"] + (HOST_EXTRA_MS if n == ours else 0.0)

    gpu = _scores(rows, [ours, theirs], gpu_ms)
    return gpu[ours] > gpu[theirs] * margin


def _target_of(run: dict) -> str:
    measured = {n for r in run["rows"] for n, p in r["providers"].items() if usable(p)}
    gluon = [t for t in ("sm100", "sm90") if any(variant_target(n) == t for n in measured)]
    return gluon[0] if gluon else "triton"


def build(family: str, runs: list[tuple[str, dict]]) -> dict:
    """runs: [(source file relative to the repo, suite JSON)] -> the dispatch.json content."""
    fam = get_family(family)
    setup = fam.PER_SHAPE_SETUP_PROVIDERS
    targets = {}
    for source, run in runs:
        groups: dict = {}
        for row in run["rows"]:
            cat, bins = row_bucket(family, row["case"])
            groups.setdefault((cat, bins), []).append(row)
        buckets = []
        for (cat, bins), rows in sorted(groups.items(), key=lambda kv: repr(kv[0])):
            provider, scores = choose(family, rows)
            traced, _ = choose(family, rows, traced=True)
            entry = {"categorical": list(cat), "bins": list(bins), "provider": provider, "traced_provider": traced,
                     "graph_provider": choose(family, rows, timed="gpu_ms")[0]}
            if setup:   # the choice where the shape varies call to call (see Family.PER_SHAPE_SETUP_PROVIDERS)
                entry["varying_provider"] = choose(family, rows, exclude=setup)[0]
                entry["traced_varying_provider"] = choose(family, rows, traced=True, exclude=setup)[0]
            buckets.append(dict(entry, cases=[r["id"] for r in rows], scores=scores))
        key = _target_of(run)
        if key in targets and targets[key]["device"] != run.get("device"):
            key = f"{key}@{run.get('device')}"   # another GPU model of that architecture: a table of its own
        target = targets[key] = {
            "source": source, "device": run.get("device"), "versions": run.get("versions"),
            "command": run.get("command"), "default": fam.DEFAULT_PROVIDER, "buckets": buckets}
        if setup:   # an unmeasured bucket whose length varies: no per-shape setup either
            target["varying_default"] = fam.VARYING_DEFAULT_PROVIDER
    return {"format": FORMAT, "family": family, "margin": MARGIN,
            "rule": "per bucket, the provider with the lowest geomean call time relative to each case's fastest; "
                    f"our variants must beat the best torch provider by {MARGIN}x and not lose to it by more than "
                    f"{MARGIN}x in GPU time (CUDA-graph replay) with {HOST_EXTRA_MS} ms (their extra host time a "
                    f"call) added to theirs; a torch provider selected per call by switching torch state (SDPA "
                    f"backends) is charged {SWITCH_MS} ms a call; unmeasured buckets take the "
                    "nearest measured bucket with the same categorical fields (<= 2 log2 bins away), else the default; "
                    f"traced_provider: the same by GPU time plus host time in a compiled graph ({TRACED_OURS_MS} ms "
                    f"for ours, {TRACED_KERNEL_MS} ms for a torch provider, charged as its compiled form where less), "
                    "used under torch.compile; varying_provider (families with per-shape-setup providers): the same "
                    "without them, used where a call's length varies; traced_varying_provider: both, used where "
                    "torch.compile made such a length symbolic; graph_provider: the same by GPU time (CUDA-graph "
                    "replay) alone, no host time counted, used for calls captured into a CUDA graph",
            "targets": targets}


def suite_lines(family: str, target: str, results: Path = RESULTS) -> list[str]:
    """What the committed workload suite measured for our `target` against the Inductor kernels it replaces and the
    best torch provider (the lines a variant module ends with: why it exists); [] where no suite run has it."""
    fam = get_family(family)
    lines = []
    for source, run in suite_results(family, results):
        rows = [r for r in run["rows"] if usable(r["providers"].get(target))]
        if not rows:
            continue
        table = build(family, [(source, run)])["targets"].get(target, {"buckets": []})
        picked = sum(len(b["cases"]) for b in table["buckets"] if b["provider"] == target)
        lines.append(f"Workload suite, {run.get('device')} (`{run.get('command')}`, {source}; "
                     f"torch {run.get('versions', {}).get('torch')}, triton {run.get('versions', {}).get('triton')}): "
                     f"{target} measured on {len(rows)} cases, the dispatch table sends {picked} of them to it.")
        inductor = fam.SUITE_INDUCTOR_PROVIDERS
        for label, names in ((f"Inductor ({' / '.join(inductor)})", inductor),
                             ("the best torch provider (dispatchable or Inductor)",
                              fam.TORCH_PROVIDERS + inductor)):
            for key, what in (("call_ms", "call"), ("gpu_ms", "GPU time")):
                ratios = []
                for r in rows:
                    theirs = [r["providers"][n][key] for n in names
                              if usable(r["providers"].get(n), case_tolerance(r["case"])) and r["providers"][n].get(key)]
                    ours = r["providers"][target].get(key)
                    if theirs and ours:
                        ratios.append(min(theirs) / ours)
                if ratios:
                    wins = sum(x >= 1.0 for x in ratios)
                    lines.append(f"  vs {label}, {what}: geomean {geomean(ratios):.3f}x (>1: ours faster), "
                                 f"ours faster on {wins} of {len(ratios)} cases")
    return lines


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
