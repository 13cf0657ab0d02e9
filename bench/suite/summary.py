#!/usr/bin/env python3
"""Summarize a workload-suite run against the dispatch table built from it (markdown on stdout).

    python bench/suite/summary.py bench/results/suite-gemm-h200.json bench/results/suite-attention-h200.json \
        bench/results/suite-block-h200.json > bench/results/suite-h200.md

Per family and regime, geomeans of best-torch time / our time (>= 1: not slower), for:
- "ours, default config": each target's default config alone (the variant modules named after their target);
- "ours before dispatch": the best of our variants, named configs (sm90_m64, ...) included, as a call and as GPU
  time (CUDA-graph replay);
- "dispatched, measured": the public op as the run timed it, with the dispatch table the package had then (timed
  apart from the provider it picked, so the two differ by the run's noise: the overhead line gives both); its GPU
  time is the op captured in a CUDA graph, which takes the captured pick in runs made since graph_provider exists;
- "table pick": the provider generated/<family>/dispatch.json picks for the case's bucket, at its same-run time.
  That provider is what the op now runs; the op adds its own host time on top (the measured wrapper overhead row),
  which only shows in call time and only where the call is host-bound;
- "table pick, captured": the provider the table picks for a call captured into a CUDA graph (graph_provider: by
  GPU time alone), at its same-run GPU time (a replay runs no host code, so there is no call time to give).
Then every case below 0.97x under the table pick, with the reason, and the decoder-block table.
"""
from __future__ import annotations

import functools
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.suite.cases import TORCH_PROVIDERS  # noqa: E402
from bench.suite.plot import regime  # noqa: E402
from gen.measure.accuracy import TOLERANCE  # noqa: E402
from gen.analysis.dispatch_table import OUR_TARGETS, is_ours, row_bucket, usable  # noqa: E402
from gen.families import get_family  # noqa: E402
from gen.runtime.dispatch import BucketTable  # noqa: E402

FLOOR = 0.97


def _best(row, names, key):
    got = [row["providers"][n][key] for n in names if usable(row["providers"].get(n)) and row["providers"][n].get(key)]
    return min(got) if got else None


def _geo(xs):
    xs = [x for x in xs if x]
    return (math.exp(sum(map(math.log, xs)) / len(xs)), len(xs), sum(x < FLOOR for x in xs)) if xs else (None, 0, 0)


@functools.lru_cache(maxsize=None)
def _dispatch_targets(family: str):
    """generated/<family>/dispatch.json's tables (read once: one picker per bucket field reads them), or None."""
    path = ROOT / "generated" / family / "dispatch.json"
    return json.loads(path.read_text())["targets"] if path.exists() else None


def table_picker(family: str, device: str, field="provider"):
    """(target, case -> the provider generated/<family>/dispatch.json picks for it): the table built on `device`'s
    model (else the first, the table a GPU of that architecture without its own falls back on), or None. field:
    the bucket field picked (BucketTable.from_json), e.g. ("graph_provider", "provider") for captured calls."""
    tables = _dispatch_targets(family)
    if tables is None:
        return None
    target, tab = next(((t, tab) for t, tab in tables.items() if tab.get("device") == device),
                       next(iter(tables.items())))
    table = BucketTable.from_json(tab, field=field)
    return target, lambda case: table.pick(*row_bucket(family, case))


def family_tables(run: dict) -> list[str]:
    family = run["family"]
    torch_names = TORCH_PROVIDERS[family]
    target, picker = table_picker(family, run["device"])
    _, graph_picker = table_picker(family, run["device"], ("graph_provider", "provider"))
    metrics: dict = {}
    below, overhead, twice = [], [], []
    for row in run["rows"]:
        reg = regime(family, row["case"])[0]
        pick, graph_pick = picker(row["case"]), graph_picker(row["case"])
        for key in ("call_ms", "gpu_ms"):
            bt = _best(row, torch_names, key)
            ours = _best(row, [n for n in row["providers"] if is_ours(n)], key)
            default = _best(row, OUR_TARGETS, key)   # each target's default config alone (no named configs)
            disp = row.get("dispatched", {}).get(key) if usable(row.get("dispatched")) else None
            chosen = row["providers"].get(pick, {}).get(key) if usable(row["providers"].get(pick)) else None
            captured = (row["providers"][graph_pick].get(key) if key == "gpu_ms"
                        and usable(row["providers"].get(graph_pick)) else None)
            for name, val in (("ours, default config", default), ("ours before dispatch", ours),
                              ("dispatched, measured", disp), ("table pick", chosen),
                              ("table pick, captured", captured)):
                metrics.setdefault((name, key, reg), []).append(bt / val if bt and val else None)
                metrics.setdefault((name, key, "all"), []).append(bt / val if bt and val else None)
            if key == "call_ms" and bt and chosen and bt / chosen < FLOOR:
                best_name = min((n for n in torch_names if usable(row["providers"].get(n))),
                                key=lambda n: row["providers"][n]["call_ms"])
                err, tol = row["providers"][best_name].get("rel_err", 0.0), TOLERANCE[row["case"].get("out_dtype", "bfloat16")]
                gpu_best, gpu_pick = (row["providers"][n].get("gpu_ms") for n in (best_name, pick))
                why = (f"{best_name} is bench-only (not a provider the op can call)" + (
                       f"; its GPU time is not lower ({gpu_best:.4f} vs {gpu_pick:.4f} ms): the call-time gap is "
                       "this run's noise" if gpu_best and gpu_pick and gpu_best >= gpu_pick else "")
                       if best_name not in get_family(family).TORCH_PROVIDERS else
                       f"{best_name}'s result misses the output dtype's accuracy (rel err {err:.1e} > {tol:.0e}: "
                       "rounded through bf16)" if err > tol else
                       "its bucket's other cases favour the pick" if row["providers"].get(best_name, {}).get("call_ms")
                       else "")
                below.append(f"| {row['id']} | {pick} {chosen:.4f} | {best_name} {bt:.4f} | {bt / chosen:.2f} | {why} |")
        d = row.get("dispatched")
        if usable(d) and usable(row["providers"].get(d.get("picked"))):
            p = row["providers"][d["picked"]]
            overhead.append((d["call_ms"] - p["call_ms"]) * 1000)
            twice.append(d["call_ms"] / p["call_ms"])
    out = [f"### {family} ({run['device']}, `{run['command']}`; table target {target})", "",
           "| measure | time | " + " | ".join(sorted({k[2] for k in metrics})) + " |",
           "|---|---|" + "---|" * len({k[2] for k in metrics})]
    regs = sorted({k[2] for k in metrics})
    for name in ("ours, default config", "ours before dispatch", "dispatched, measured", "table pick",
                 "table pick, captured"):
        for key in ("call_ms", "gpu_ms") if name != "table pick, captured" else ("gpu_ms",):
            cells = []
            for reg in regs:
                g, n, low = _geo(metrics.get((name, key, reg), []))
                cells.append(f"{g:.3f} (n={n}, {low} < 0.97)" if g else "-")
            out.append(f"| {name} | {'call' if key == 'call_ms' else 'GPU (graph)'} | " + " | ".join(cells) + " |")
    if overhead:
        twice.sort()
        out += ["", f"Wrapper overhead of the public op over the provider it dispatched to (same run, call time): "
                    f"median {statistics.median(overhead):.1f} us, n={len(overhead)}. The same provider timed twice "
                    f"in one run (as the public op, and directly) differs by a factor of median "
                    f"{statistics.median(twice):.3f}, 10th-90th percentile {twice[len(twice) // 10]:.3f}-"
                    f"{twice[(len(twice) * 9) // 10]:.3f}: the noise of one case's ratio."]
    if below:
        out += ["", f"Cases below {FLOOR}x in call time under the table pick:", "",
                "| case | table pick ms | best torch ms | ratio | why |", "|---|---|---|---|---|"] + below
    return out + [""]


def block_table(run: dict) -> list[str]:
    modes = ("eager", "compile", "graph", "reduce-overhead", "max-autotune")
    out = [f"### decoder block ({run['device']}, `{run['command']}`): ms, torch ops / gen ops", ""]
    out += [f"Note: {n}" for n in run.get("notes", [])] + ([""] if run.get("notes") else [])
    out += ["| case | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    ratios: dict = {m: [] for m in modes}
    for row in run["rows"]:
        cells = []
        for mode in modes:
            t, g = (row["providers"].get(f"{side}-{mode}", {}).get("ms") for side in ("torch", "gen"))
            if t and g:
                ratios[mode].append(t / g)
            cells.append(f"{t:.3f} / {g:.3f} ({t / g:.2f}x)" if t and g else
                         f"- / {g:.3f}" if g else "-")
        out.append(f"| {row['id']} | " + " | ".join(cells) + " |")
    geo = []
    for mode in modes:
        g, n, _ = _geo(ratios[mode])
        geo.append(f"{g:.3f} (n={n}, {sum(r < 1.0 for r in ratios[mode])} < 1.0)" if g else "-")
    out.append("| geomean torch / gen | " + " | ".join(geo) + " |")
    return out + [""]


def main(argv=None) -> int:
    paths = argv if argv is not None else sys.argv[1:]
    lines = ["# Workload suite summary (generated by bench/suite/summary.py; do not edit)", ""]
    for p in paths:
        run = json.loads(Path(p).read_text())
        lines += block_table(run) if run["family"] == "block" else family_tables(run)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
