"""generated/<family>/manifest.json (the build record as JSON, gen/build/build_record.py) and the REPORT.md rendered from
it: where they live, how they are read, and the one way they are written (write_record)."""
from __future__ import annotations

import json
from pathlib import Path

from .build_record import BuildRecord
from ..cache import REPO_ROOT
from ..runtime.triton_range import release_folder

GENERATED = REPO_ROOT / "generated"


def repo_relative(path: str) -> str:
    p = Path(path).resolve()
    try:
        return str(p.relative_to(REPO_ROOT))
    except ValueError:
        return str(p)


def entry_name(entry: dict) -> str:
    """A manifest variant's module and provider name (the target for its default config; manifests written before
    named variants have no "name")."""
    return entry.get("name", entry["target"])


def load_record(out: Path) -> BuildRecord | None:
    """The committed build record of generated/<family>/ (`out`), or None before the first build."""
    path = out / "manifest.json"
    return BuildRecord.from_json(json.loads(path.read_text())) if path.exists() else None


def write_record(out: Path, record: BuildRecord) -> None:
    """manifest.json and the REPORT.md rendered from it (and from dispatch.json): the one writer of both. A record
    built by a Triton release other than the GPU-tested one is that release's own build (gen.build.emit.emit_release),
    whose calls the package's table (one folder up) dispatches."""
    release = release_folder(record.versions["triton"]) is not None
    manifest = record.to_json()
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=False) + "\n")
    table = (out.parent if release else out) / "dispatch.json"
    dispatch = json.loads(table.read_text()) if table.exists() else None
    where = f"{record.family}/{out.name}" if release else record.family
    report = report_markdown(manifest, where)
    if release:   # what this folder is, after the title
        title, rest = report.split("\n", 1)
        report = (f"{title}\n\nThe build of triton {record.versions['triton']}, beside the package's own (one folder up, "
                  "the GPU-tested release's). On that release the package runs these modules and their bundles; a "
                  "variant not here (rejected below) runs the package's module, compiled by that release on first "
                  "use. Cross-compiled and gated, not run on a GPU.\n" + rest)
    (out / "REPORT.md").write_text(report + dispatch_markdown(dispatch, "../" if release else ""))


def dispatch_markdown(dispatch: dict | None, up: str = "") -> str:
    """REPORT.md's dispatch section: which provider each measured bucket goes to, and where that was measured."""
    if not dispatch:
        return ("## Dispatch\n\nNo workload-suite results are committed for this family: every call takes the "
                "conservative default (see the package docstring).\n")
    lines = ["## Dispatch (dispatch.json)", "", dispatch["rule"] + ".", ""]
    def per_provider(buckets: list, field: str) -> str:
        counts: dict = {}
        for b in buckets:
            p = b.get(field, b["provider"])
            counts[p] = counts.get(p, 0) + len(b["cases"])
        return ", ".join(f"{p} {n}" for p, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    for target, t in dispatch["targets"].items():
        lines += [f"- {target}: measured on {t['device']} (torch {t['versions'].get('torch')}, triton "
                  f"{t['versions'].get('triton')}), `{t['command']}`, from `{t['source']}`: {len(t['buckets'])} "
                  f"buckets; suite cases per picked provider: {per_provider(t['buckets'], 'provider')}; captured "
                  f"in a CUDA graph: {per_provider(t['buckets'], 'graph_provider')}"]
    lines += ["", "Per-case times, geomeans and every case below 0.97x: `bench/results/suite-h200.md`; plot:",
              "", f"![suite]({up}../../bench/results/suite-h200.png)", ""]
    return "\n".join(lines)


def record_tuning(out: Path, spec, tuning: dict) -> BuildRecord:
    """Add `gen tune`'s record to the committed build of the same spec; later builds of that spec carry it."""
    record = load_record(out)
    if record is None:
        raise ValueError(f"{out / 'manifest.json'} does not exist: run `python -m gen {repo_relative(spec.path)}` first")
    if record.spec_sha256 != spec.sha256:
        raise ValueError(f"{out / 'manifest.json'} was built from another version of {repo_relative(spec.path)}: "
                         "regenerate it first")
    record.tuning = tuning
    write_record(out, record)
    return record


def format_instructions(instr: dict) -> str:
    """The SASS counts that prove the fast path, as `UTCHMMA:8 UTMALDG:5 ...`."""
    keys = [k for k in ("UTCHMMA", "HGMMA", "UTMALDG", "UTMASTG", "SYNCS") if instr.get(k)]
    return " ".join(f"{k}:{instr[k]}" for k in keys) or "-"


def spill_figure(c: dict) -> str:
    """Spill stores, with those in the prologue (before the warp-specialize dispatch) named: `1 (1 in prologue)`."""
    prologue = c.get("prologue_spills", 0)
    return f"{c['spills']} ({prologue} in prologue)" if prologue else str(c["spills"])


def summary_table(manifest: dict) -> str:
    head = "| target | config | smem B | TMEM cols | regs | spills | convert_layouts | partitions | key SASS | gates |\n"
    head += "|---|---|---|---|---|---|---|---|---|---|\n"
    rows = []
    for v in manifest["variants"]:
        c = v["compile"]
        parts = ", ".join(f"{p['name']}:{p['warps']}w/{p['regs'] or '?'}r" for p in c["partitions"]) or "-"
        cfg = " ".join(f"{k}={x}" for k, x in v["config"].items())
        verdict = "pass" if c["ok"] else "FAIL: " + "; ".join(f for case in c["cases"] for f in case["failures"])[:200]
        rows.append(f"| {entry_name(v)} | {cfg} | {c['smem_bytes']} | {c['tmem_cols'] or '-'} | {c['regs']} | {spill_figure(c)} | "
                    f"{c['convert_layouts']} | {parts} | {format_instructions(c['instructions'])} | {verdict} |")
    return head + "\n".join(rows) + "\n"


def report_markdown(manifest: dict, where: str = "") -> str:
    lines = [f"# generated/{where or manifest['family']}: report", "",
             f"Generated by gen {manifest['versions']['gen']} from `{manifest['spec']['path']}` "
             f"(sha256 {manifest['spec']['sha256'][:12]}) with triton {manifest['versions']['triton']}, "
             f"torch {manifest['versions']['torch']}. Regenerate with `python -m gen {manifest['spec']['path']}`; do not edit.", "",
             "## Variants (IR read from the cross-compiled dumps; the first compile case)", "", summary_table(manifest)]
    for v in manifest["variants"]:
        c = v["compile"]
        lines += [f"### {entry_name(v)} ({v['runs']})", ""]
        if c["tmem_buffers"]:
            lines.append("TMEM allocations: " + ", ".join(f"`{b['name']}` {b['shape']} {b['dtype']} = {b['cols']} cols"
                                                          + (f" ({b['kernel']})" if "kernel" in b else "")
                                                          for b in c["tmem_buffers"]))
        if c["convert_layout_pairs"]:
            lines.append("convert_layout: " + "; ".join(f"{p['count']}x `{p['src'][:60]}` -> `{p['dst'][:60]}`" for p in c["convert_layout_pairs"]))
        lines.append("Cases compiled: " + "; ".join(f"{case['case']} -> {'pass' if case['ok'] else 'FAIL'}" for case in c["cases"]))
        if "verify" in v:
            ver = v["verify"]
            lines.append(f"Verified on {ver['device']}: {ver['cases']} cases, max rel err {ver['max_rel_err']:.2e}, {'ok' if ver['ok'] else 'FAILED'}.")
        else:
            lines.append("Verification: not run on a GPU for this build." if v["target"] != "sm100"
                         else "Verification on GPU: compiled, not run (no Blackwell GPU reachable).")
        if "simulate" in v:
            s = v["simulate"]
            lines.append(f"CPU simulator: {s['cases']} cases, max rel err {s['max_rel_err']:.2e}, {'ok' if s['ok'] else 'FAILED'}.")
        if "bench" in v:
            b = v["bench"]
            lines += ["", f"Benchmark on {b['device']}, command `{b['command']}`:", "",
                      "| case | provider | ms | TFLOP/s |", "|---|---|---|---|"]
            lines += [f"| {r['case']} | {r['provider']} | {r['ms']} | {r.get('tflops', '-')} |" for r in b["rows"]]
            lines += [f"- {s}" for s in b.get("summary", [])]
        if "decision" in v:
            lines.append(f"Decision: {v['decision']}")
        if v.get("precompiled"):
            pc = v["precompiled"]
            lines.append(f"Precompiled binaries (kernels/{entry_name(v)}/, zero-JIT import): {pc['kernels']} of "
                         f"{pc.get('specializations', pc['kernels'])} kernel specializations the public op can launch, "
                         f"{pc.get('bytes', 0) / 1e6:.1f} MB xz"
                         + ("" if pc["ok"] else f"; FAILED: {pc.get('error') or pc.get('failed')}") + ".")
        lines.append("")
    if manifest.get("tuning"):
        tun = manifest["tuning"]
        lines += ["## Tuning (winners per shape bucket; full table in manifest.json)", "",
                  f"Command `{tun.get('command', '')}`.", "", "```", format_winners(tun), "```", ""]
    if manifest.get("rejected"):
        lines += ["## Rejected candidates", "", "| target | config | stage | reason |", "|---|---|---|---|"]
        for r in manifest["rejected"]:
            cfg = " ".join(f"{k}={x}" for k, x in r["config"].items())
            lines.append(f"| {r['target']} | {cfg} | {r['stage']} | {r['reason'][:300].replace('|', '/')} |")
        lines.append("")
    if manifest.get("inductor"):
        ind = manifest["inductor"]
        lines += ["## Inductor side by side", "", ind.get("markdown", ""), ""]
    return "\n".join(lines)


def format_winners(tuning: dict) -> str:
    lines = [f"tuning on {tuning['device']}:"]
    for t, rec in tuning["targets"].items():
        c = rec["counts"]
        lines.append(f"  {t}{' (cached)' if rec.get('cached') else ''}: {c['candidates']} candidates, {c['timed']} timed, "
                     f"{c['pruned']} pruned, {c['failed']} failed")
        for b, w in rec["winners"].items():
            extra = f", {w['speedup_vs_default']}x vs default" if "speedup_vs_default" in w else ""
            cfg = ",".join(f"{k}={v}" for k, v in w["config"].items())
            lines.append(f"    {b}: {w['ms']} ms{extra}  [{cfg}]")
        if not rec["winners"]:
            lines.append("    no candidate passed the accuracy gate and timing")
    return "\n".join(lines)
