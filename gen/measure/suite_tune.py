"""Per-bucket tuning from a workload-suite config sweep: which configs to ship as named variants so that the dispatch
table can pick them per bucket.

Input: a JSON file written on a GPU by `bench/suite/config_sweep.py` (one target, a list of configs, the first one
the shipped config the others were merged over; per suite case each config's GPU time by CUDA-graph replay and its
relative error, and the torch provider's GPU time where the sweep has one). Here, on any machine:

  sweep rows -> dispatch buckets (the function the op applies per call) -> per bucket, the config with the lowest
  geomean GPU time relative to each case's fastest, among the configs correct (within the op's tolerance) on every
  case of the bucket -> it wins the bucket only if it beats the shipped config by MARGIN.

A winner is proposed as a variant when the dispatch table would send its bucket to it: it beats the torch provider by
MARGIN there (GPU time, our extra host time a call added as gen.analysis.dispatch_table's rule adds it), or the sweep
timed no torch provider there (`--all-winners`: every winner). A variant that no bucket dispatches to costs build time (and
bundles, for a Gluon target) for nothing. `python -m gen tune SPEC --from-sweep FILE --write` adds the proposals to
specs/tuned/<spec>.yaml (gen/build/spec.py merges them into the target's `variants:`); the next build ships each as
`<target>_<name>`, the next suite run times it as a provider, and the dispatch table picks it per bucket.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml

from ..analysis.dispatch_table import HOST_EXTRA_MS, MARGIN, case_tolerance, geomean, row_bucket, usable
from ..build.spec import VARIANT_NAME, tuned_path, tuned_variants


def _usable(cell: dict, case: dict) -> bool:
    return usable(cell, case_tolerance(case), "gpu_ms") and cell["gpu_ms"] > 0   # a ratio's denominator


def bucket_label(bucket: tuple) -> str:
    cat, bins = bucket
    return " ".join(map(str, cat)) + " | " + " ".join(map(str, bins))


def winners(family: str, sweep: dict, shipped: frozenset = frozenset({0}), margin: float = MARGIN) -> list[dict]:
    """One entry per dispatch bucket of the sweep's rows: {"bucket", "cases", "scores" {config index: geomean},
    "winner" (config index: a shipped one where no other beats the best shipped config by `margin`), "speedup" (the
    best shipped config's score / the winner's, GPU time), "vs_torch" {config index: geomean of (its GPU time +
    HOST_EXTRA_MS) / torch's} and "vs_torch_captured" (the same without the host extra: captured calls) where every case
    has torch's time}. `shipped`: the indices of the sweep's configs the
    package already ships (config 0, and any other rebase() finds shipped)."""
    groups: dict = {}
    for row in sweep["rows"]:
        groups.setdefault(row_bucket(family, row["case"]), []).append(row)
    n = len(sweep["configs"])
    out = []
    for bucket, rows in sorted(groups.items(), key=lambda kv: repr(kv[0])):
        ok = [i for i in range(n) if all(i < len(r["configs"]) and _usable(r["configs"][i], r["case"]) for r in rows)]
        entry = {"bucket": bucket_label(bucket), "cases": [r["id"] for r in rows], "scores": {}, "winner": None}
        if ok:
            fastest = [min(r["configs"][i]["gpu_ms"] for i in ok) for r in rows]
            scores = entry["scores"] = {i: round(geomean([r["configs"][i]["gpu_ms"] / f
                                                           for r, f in zip(rows, fastest)]), 4) for i in ok}
            best = min(ok, key=lambda i: (scores[i], i))
            kept = min((i for i in ok if i in shipped), key=lambda i: (scores[i], i), default=None)
            entry["winner"] = best if kept is None or scores[best] * margin < scores[kept] else kept
            if kept is not None:
                entry["speedup"] = round(scores[kept] / scores[entry["winner"]], 3)
            if all(_usable(r.get("torch"), r["case"]) for r in rows):
                entry["vs_torch"] = {i: round(geomean([(r["configs"][i]["gpu_ms"] + HOST_EXTRA_MS)
                                                        / r["torch"]["gpu_ms"] for r in rows]), 4) for i in ok}
                entry["vs_torch_captured"] = {i: round(geomean([r["configs"][i]["gpu_ms"] / r["torch"]["gpu_ms"]
                                                                for r in rows]), 4) for i in ok}
        out.append(entry)
    return out


def rebase(spec, sweep: dict) -> tuple[list, frozenset]:
    """(each sweep config as the spec has it now, None for one that sets module constants; the indices of those the
    package ships). A sweep config is what it changed over its config 0 (the target's default, or the named config
    it swept around), applied to that config as the spec has it now: a sweep taken before the spec gained a key
    compares like one taken after."""
    raw = yaml.safe_load(Path(spec.path).read_text())["targets"][sweep["target"]]
    base = dict(raw["config"])
    named = {**(raw.get("variants") or {}), **tuned_variants(Path(spec.path))[0].get(sweep["target"], {})}
    shipped = [base, *({**base, **v} for v in named.values())]
    swept_from = sweep["configs"][0]["config"]
    base_now = {**base, **named.get(sweep.get("variant") or "", {})}
    configs = [None if c.get("set") else {**base_now, **{k: v for k, v in c["config"].items() if swept_from.get(k) != v}}
               for c in sweep["configs"]]
    return configs, frozenset([0] + [i for i, c in enumerate(configs) if c is not None and c in shipped])


def would_dispatch(entry: dict, margin: float = MARGIN) -> bool:
    """Would the dispatch table send the bucket to its winner (config 0 never counts: it ships), for eager calls or
    for calls captured into a CUDA graph? Where the sweep timed a torch provider, the winner must beat it by the
    margin on GPU time, our extra host time a call added (eager) or not (captured: a replay runs no host code);
    where it timed none (a mod SDPA cannot express), ours is what runs there already."""
    w = entry["winner"]
    if not w:
        return False
    # the captured ratio is the eager one less the host extra: whatever the eager rule passes, it passes too
    captured = entry.get("vs_torch_captured")
    return captured is None or captured[w] * margin < 1.0


def tuned_name(changed: dict, prefix: str = "") -> str:
    """A legible variant name for a tuned config: the swept named config it came from, then each changed key's
    initials and value (splitkv + {BLOCK_N: 128} -> "splitkvbn128"); a hash where that is no valid name."""
    parts = [prefix]
    for key, value in sorted(changed.items()):
        initials = "".join(w[0] for w in key.lower().split("_") if w)
        parts.append(initials + (str(int(value)) if isinstance(value, (bool, int)) else "x"))
    name = "".join(parts)
    if not VARIANT_NAME.fullmatch(name) or "x" in "".join(parts[1:]):
        name = "t" + hashlib.sha256(json.dumps(changed, sort_keys=True).encode()).hexdigest()[:7]
    return name


def proposals(spec, sweep: dict, entries: list[dict], source: str,
              all_winners: bool = False) -> tuple[list[dict], list[str]]:
    """([{"name", "target", "overrides", "buckets", "why"}], notes): the winning configs to ship as variants of the
    sweep's target, as keys over the spec's own `config:` (what `variants:` entries hold); notes say why a winner is
    not proposed (module constants are no config keys). `source` names the sweep file in "why"."""
    target = sweep["target"]
    base = dict(yaml.safe_load(Path(spec.path).read_text())["targets"][target]["config"])
    configs, shipped = rebase(spec, sweep)
    swept_from = sweep["configs"][0]["config"]
    picked: dict = {}
    notes = []
    for e in entries:
        w = e["winner"]
        if w is None or w in shipped or not (all_winners or would_dispatch(e)):
            continue   # the best shipped config holds the bucket, or the table would not pick the winner
        if configs[w] is None:
            notes.append(f"config {w} wins {e['bucket']} ({e.get('speedup')}x) through module constants "
                         f"{sweep['configs'][w]['set']}: not a config key, so not a variant; change the template's "
                         "rule instead")
            continue
        changed = {k: v for k, v in sweep["configs"][w]["config"].items() if swept_from.get(k) != v}
        p = picked.setdefault(w, {"name": tuned_name(changed, sweep.get("variant") or ""), "target": target,
                                  "overrides": {k: v for k, v in configs[w].items() if base.get(k) != v},
                                  "buckets": []})
        p["buckets"].append(e)
    out = []
    for p in picked.values():
        best = max(b.get("speedup", 1.0) for b in p["buckets"])
        cases = [c for b in p["buckets"] for c in b["cases"]]
        p["why"] = (f"{sweep.get('device')} ({source}): the fastest config in {len(p['buckets'])} bucket(s), up to "
                    f"{best}x the best shipped config's GPU time there ({', '.join(cases[:4])}"
                    f"{', ...' if len(cases) > 4 else ''})")
        out.append(p)
    return out, notes


def gate(spec, props: list[dict], jobs: int | None = None) -> tuple[list[dict], list[str]]:
    """(the proposals that render, cross-compile at every compile case and pass their target's gates, notes on the
    others): what the build would ship (gen/build/pipeline.py gate_configs). A sweep times the cases it ran; the
    gates see every compile case (a config fast on causal decode may spill with another mod)."""
    from ..build.pipeline import gate_configs

    rejected: list = []
    items = [(p["target"], p["name"], {**spec.targets[p["target"]].config, **p["overrides"],
                                       **spec.targets[p["target"]].by_triton}) for p in props]   # as load_spec merges
    passed = {v.name for v in gate_configs(spec, items, rejected, jobs)} if items else set()
    kept = [p for p in props if f"{p['target']}_{p['name']}" in passed]
    return kept, [f"rejected by the build's {r.stage}: {r.reason}" for r in rejected]


def _read_tuned(spec_path) -> dict:
    path = tuned_path(Path(spec_path))
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def write_tuned(spec, props: list[dict]) -> Path:
    """Add the proposals to specs/tuned/<spec>.yaml beside the entries it has (sorted by name: the same text for the
    same inputs)."""
    path = tuned_path(Path(spec.path))
    doc = _read_tuned(spec.path)
    for p in props:
        doc.setdefault(p["target"], {})[p["name"]] = {"config": p["overrides"], "why": p["why"]}
    header = ("# Tuned configs of specs/{0}.yaml, written by `python -m gen tune specs/{0}.yaml --from-sweep FILE "
              "--write`\n# (gen/measure/suite_tune.py): target -> variant name -> {{config: keys over the spec's "
              "config, why}}.\n# gen/build/spec.py merges them into the target's variants; each ships as the module "
              "<target>_<name>\n# and the dispatch table picks it per bucket once a suite run has timed it.\n"
              ).format(Path(spec.path).stem)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(doc, sort_keys=True, width=120))
    return path


def report(sweep: dict, entries: list[dict], shipped: frozenset, props: list[dict], notes: list[str]) -> str:
    """The winners table and the proposals, as text."""
    lines = [f"{sweep.get('target')}{'_' + sweep['variant'] if sweep.get('variant') else ''} on "
             f"{sweep.get('device')}: {len(sweep['rows'])} cases, {len(sweep['configs'])} configs (shipped: "
             f"{', '.join(map(str, sorted(shipped)))}), per dispatch bucket (GPU time, geomean relative to each case's "
             "fastest; torch: ours + host extra over torch's):"]
    for e in entries:
        w, vs = e["winner"], e.get("vs_torch") or {}
        if w is None:
            lines.append(f"  {e['bucket']:48s} n={len(e['cases']):2d} no config correct on every case")
            continue
        what = "shipped" if w in shipped else f"{e.get('speedup', '-')}x the best shipped"
        torch_part = f", vs torch {vs[w]:.3f}" if w in vs else ""
        lines.append(f"  {e['bucket']:48s} n={len(e['cases']):2d} winner {w} ({what}{torch_part})")
    lines.append(f"proposed variants: {len(props)}")
    for p in props:
        lines.append(f"  {p['target']}_{p['name']}: {p['overrides']}  # {p['why']}")
    lines += [f"  not proposed: {n}" for n in notes]
    return "\n".join(lines)
