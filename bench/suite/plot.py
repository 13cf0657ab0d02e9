#!/usr/bin/env python3
"""Plot workload-suite results: how our ops compare with the best torch provider, case by case.

    python bench/suite/plot.py bench/results/suite-gemm-h200.json bench/results/suite-attention-h200.json \
        --out bench/results/suite-h200.png

One panel per family, cases sorted by regime (x), log-scale ratios (y), lines at 1.0 and 0.97:
- gemm / attention: best torch call_ms / dispatched call_ms (>= 1: the public op is not slower than the best torch
  provider), best torch / best of our providers before dispatch, and best torch / the same-run time of the provider
  generated/<family>/dispatch.json picks for the case (what the op runs now, when the table was built after the run);
- block: torch-<mode> ms / gen-<mode> ms for each mode measured (eager, compile, graph, reduce-overhead, ...).
Geometric means (and the count below 0.97) are printed per family and regime. Needs matplotlib (imported only here).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.suite.cases import TORCH_PROVIDERS  # noqa: E402

FLOOR = 0.97
BLOCK_MODES = ("eager", "compile", "graph", "reduce-overhead", "max-autotune")


def _ms(entry: dict | None) -> float | None:
    if not entry or entry.get("wrong"):
        return None
    return entry.get("call_ms", entry.get("ms"))


def regime(family: str, case: dict) -> tuple:
    """(regime label, sort key within it)."""
    if family == "gemm":
        m = case["M"]
        label = "decode M<=64" if m <= 64 else "prefill M<=2048" if m <= 2048 else "prefill M>2048"
        return label, (m, case["N"] * case["K"])
    if family == "attention":
        if case["phase"] == "decode":
            return "decode", (case["Lk"], case["B"] * case["Hq"] * case["Lq"])
        return ("prefill L<=2048" if case["Lq"] <= 2048 else "prefill L>2048"), (case["Lq"], case["B"] * case["Hq"])
    return case["mode"], (case["B"] * case.get("L", 1), case.get("Lk", 0))


REGIME_ORDER = ("decode M<=64", "prefill M<=2048", "prefill M>2048", "decode", "prefill L<=2048", "prefill L>2048",
                "prefill")


def series(doc: dict) -> tuple[list[tuple], dict]:
    """(sorted [(regime, id)], {series name: [ratio or None per case]}) for one results file."""
    family, rows = doc["family"], [r for r in doc["rows"] if "providers" in r]
    rows.sort(key=lambda r: (REGIME_ORDER.index(regime(family, r["case"])[0]), regime(family, r["case"])[1]))
    labels = [(regime(family, r["case"])[0], r["id"]) for r in rows]
    out: dict = {}
    if family == "block":
        for mode in BLOCK_MODES:
            ratios = [ratio(_ms(r["providers"].get(f"torch-{mode}")), _ms(r["providers"].get(f"gen-{mode}")))
                      for r in rows]
            if any(x is not None for x in ratios):
                out[f"torch-{mode} / gen-{mode}"] = ratios
        return labels, out
    from bench.suite.summary import table_picker  # summary imports this module

    torch_names = TORCH_PROVIDERS[family]
    picker = table_picker(family, doc.get("device"))
    disp, ours, picked = [], [], []
    for r in rows:
        p = r["providers"]
        bt = _ms(p.get(r.get("best_torch"))) if r.get("best_torch") else None
        disp.append(ratio(bt, _ms(r.get("dispatched"))))
        our_ms = [m for n, e in p.items() if n not in torch_names and (m := _ms(e)) is not None]
        ours.append(ratio(bt, min(our_ms)) if our_ms else None)
        picked.append(ratio(bt, _ms(p.get(picker[1](r["case"])))) if picker else None)
    out["best torch / dispatched (as measured)"] = disp
    out["best torch / best ours (before dispatch)"] = ours
    if picker:
        out["best torch / table pick (same-run time)"] = picked
    return labels, out


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def geomean(xs: list) -> float | None:
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summary(family: str, labels: list, data: dict) -> list[str]:
    lines = []
    for name, ratios in data.items():
        for reg in [None] + sorted({lab[0] for lab in labels}, key=REGIME_ORDER.index):
            sel = [x for (r, _), x in zip(labels, ratios) if x and (reg is None or r == reg)]
            if not sel:
                continue
            g = geomean(sel)
            lines.append(f"{family:10s} {name:42s} {reg or 'all':18s} geomean {g:.3f}  n={len(sel):3d}  "
                         f"below {FLOOR}: {sum(x < FLOOR for x in sel)}")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="suite JSON files (bench/suite/run.py --out)")
    p.add_argument("--out", required=True, help="PNG to write")
    args = p.parse_args(argv)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot.py needs matplotlib: pip install matplotlib", file=sys.stderr)
        return 2
    docs = [json.loads(Path(f).read_text()) for f in args.results]
    fig, axes = plt.subplots(len(docs), 1, figsize=(15, 4.5 * len(docs)), squeeze=False)
    for ax, doc in zip(axes[:, 0], docs):
        labels, data = series(doc)
        for line in summary(doc["family"], labels, data):
            print(line)
        xs = range(len(labels))
        for (name, ratios), marker in zip(data.items(), "ox^sv"):
            pts = [(x, r) for x, r in zip(xs, ratios) if r]
            if pts:
                ax.scatter(*zip(*pts), marker=marker, s=18, label=f"{name} (geomean {geomean(ratios):.3f})")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(FLOOR, color="red", linewidth=0.8, linestyle="--", label=f"{FLOOR}")
        ax.set_yscale("log")
        ax.set_xlim(-1, max(len(labels), 1))
        ax.set_xticks([])
        for i, (reg, _) in enumerate(labels):  # regime boundaries and names
            if i == 0 or labels[i - 1][0] != reg:
                ax.axvline(i - 0.5, color="grey", linewidth=0.5)
                ax.text(i, ax.get_ylim()[1], reg, va="top", fontsize=8, color="grey")
        ax.set_title(f"{doc['family']} on {doc['device']} (suite v{doc['suite_version']}, {len(labels)} cases)")
        ax.set_ylabel("ratio (>= 1: ours not slower)")
        ax.set_xlabel("case (sorted by regime)")
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
