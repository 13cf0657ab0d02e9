"""Writes generated/<family>/: variant modules, the public module, manifest.json, REPORT.md, ir/*.ttgir.

The only stage that writes files. Verify/bench results recorded earlier (on a GPU) are carried over when the spec,
template and config digests are unchanged, so a re-run on a CPU machine does not erase them.
"""
from __future__ import annotations

import json
import platform
import re
from pathlib import Path

from . import __version__, dispatch_table
from .cache import REPO_ROOT
from .pipeline import PipelineResult
from .render import comment_block, render_api

GENERATED = REPO_ROOT / "generated"


def _versions() -> dict:
    from importlib.metadata import version

    return {"gen": __version__, "triton": version("triton"), "torch": version("torch").split("+")[0],
            "python": platform.python_version()}


def _rel(path: str) -> str:
    p = Path(path).resolve()
    try:
        return str(p.relative_to(REPO_ROOT))
    except ValueError:
        return str(p)


def entry_name(entry: dict) -> str:
    """A manifest variant's module and provider name (the target for its default config; manifests written before
    named variants have no "name")."""
    return entry.get("name", entry["target"])


def load_manifest(family: str, root: Path = GENERATED) -> dict:
    path = root / family / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _same_build(old: dict, new: dict, spec_sha: str, old_spec_sha: str) -> bool:
    return (old_spec_sha == spec_sha and old.get("template_digest") == new["template_digest"]
            and old.get("config_digest") == new["config_digest"])


def measured_lines(entry: dict, family: str) -> list[str]:
    """What the module says about the measured alternatives: the reason the kernel exists (or doesn't). The
    per-build benchmark (`gen --bench`) where this build has one, else what the committed workload suite measured
    for this target (dispatch_table.suite_lines)."""
    bench = entry.get("bench")
    if not bench:
        suite = dispatch_table.suite_lines(family, entry_name(entry))
        return (["Inductor alternative: this build was not benchmarked (`python -m gen SPEC --bench` on a GPU); "
                 "the committed workload suite measured this target as follows."] + suite if suite else
                ["Inductor alternative: not measured yet for this build (run `python -m gen SPEC --bench` on a GPU)."])
    ours = f"gen-{entry['target']}"
    by_case: dict = {}
    for r in bench["rows"]:
        by_case.setdefault(r["case"], {})[r["provider"]] = r.get("tflops")
    lines = [f"Measured on {bench['device']} (`{bench['command']}`), TFLOP/s:"]
    for case, provs in by_case.items():
        if ours in provs:
            others = " | ".join(f"{p} {t}" for p, t in provs.items() if p != ours and not p.startswith("gen-"))
            lines.append(f"  {case}: {ours} {provs[ours]} | {others}")
    if entry.get("decision"):
        lines.append(f"Decision: {entry['decision']}")
    return lines


def build_manifest(result: PipelineResult, previous: dict, fresh: dict | None = None,
                   keep_other_targets: bool = False, tuning: dict | None = None) -> dict:
    spec = result.spec
    old_by_name = {entry_name(v): v for v in previous.get("variants", [])}
    old_sha = previous.get("spec", {}).get("sha256", "")
    variants = []
    for v in result.variants:
        primary = v.reports[0]
        compile_info = primary.to_manifest()
        compile_info["ok"] = v.ok
        compile_info["cases"] = [{"case": r.case, "ok": r.ok, "smem_bytes": r.smem_bytes, "regs": r.regs,
                                  "spills": r.spills, "failures": r.failures()} for r in v.reports]
        entry = {"target": v.target, "name": v.name, "module": f"generated.{spec.family}.{v.name}", "config": v.config,
                 "template": v.source.template, "template_digest": v.source.template_digest,
                 "config_digest": v.source.config_digest, "compile": compile_info,
                 "runs": "compiled, not run" if v.target == "sm100" else "compiled"}
        old = old_by_name.get(v.name)
        if old and _same_build(old, entry, spec.sha256, old_sha):
            for key in ("verify", "bench", "simulate", "decision", "keep_inductor", "runs", "precompiled"):
                if key in old:
                    entry[key] = old[key]
            if any(k in old for k in ("verify", "bench")):
                entry["carried_over"] = "verify/bench recorded earlier for the same spec, template and config digests; not re-run here"
        new = (fresh or {}).get(v.name, {})
        if new:
            entry.update(new)
            entry.pop("carried_over", None)
            if "verify" in new:
                entry["runs"] = f"verified on {new['verify']['device']}"
        variants.append(entry)
    if keep_other_targets:  # a --target subset was rebuilt: the other targets' entries stay as they were
        built = {v["target"] for v in variants}
        variants += [v for v in previous.get("variants", []) if v["target"] not in built]
    manifest = {
        "family": spec.family, "op": spec.op,
        "spec": {"path": _rel(spec.path), "sha256": spec.sha256},
        "versions": _versions(),
        "variants": variants,
        "rejected": [{"target": r.target, "config": r.config, "stage": r.stage, "reason": r.reason[:1000]}
                     for r in result.rejected],
    }
    if (fresh or {}).get("_inductor"):
        from .inductor import manifest_entry

        manifest["inductor"] = manifest_entry(fresh["_inductor"], variants)
    elif "inductor" in previous:
        manifest["inductor"] = previous["inductor"]
    tuning = tuning or (previous.get("tuning") if old_sha == spec.sha256 else None)
    if tuning:  # `gen tune` winners per benchmark shape (recorded; configs shipped per bucket are the spec's `variants:`)
        manifest["tuning"] = tuning
    return manifest


def _fmt_instr(instr: dict) -> str:
    keys = [k for k in ("UTCHMMA", "HGMMA", "UTMALDG", "UTMASTG", "SYNCS") if instr.get(k)]
    return " ".join(f"{k}:{instr[k]}" for k in keys) or "-"


def summary_table(manifest: dict) -> str:
    head = "| target | config | smem B | TMEM cols | regs | spills | convert_layouts | partitions | key SASS | gates |\n"
    head += "|---|---|---|---|---|---|---|---|---|---|\n"
    rows = []
    for v in manifest["variants"]:
        c = v["compile"]
        parts = ", ".join(f"{p['name']}:{p['warps']}w/{p['regs'] or '?'}r" for p in c["partitions"]) or "-"
        cfg = " ".join(f"{k}={x}" for k, x in v["config"].items())
        verdict = "pass" if c["ok"] else "FAIL: " + "; ".join(f for case in c["cases"] for f in case["failures"])[:200]
        rows.append(f"| {entry_name(v)} | {cfg} | {c['smem_bytes']} | {c['tmem_cols'] or '-'} | {c['regs']} | {c['spills']} | "
                    f"{c['convert_layouts']} | {parts} | {_fmt_instr(c['instructions'])} | {verdict} |")
    return head + "\n".join(rows) + "\n"


def report_markdown(manifest: dict) -> str:
    lines = [f"# generated/{manifest['family']}: report", "",
             f"Generated by gen {manifest['versions']['gen']} from `{manifest['spec']['path']}` "
             f"(sha256 {manifest['spec']['sha256'][:12]}) with triton {manifest['versions']['triton']}, "
             f"torch {manifest['versions']['torch']}. Regenerate with `python -m gen {manifest['spec']['path']}`; do not edit.", "",
             "## Variants (IR read from the cross-compiled dumps; the first compile case)", "", summary_table(manifest)]
    for v in manifest["variants"]:
        c = v["compile"]
        lines += [f"### {entry_name(v)} ({v['runs']})", ""]
        if c["tmem_buffers"]:
            lines.append("TMEM allocations: " + ", ".join(f"`{b['name']}` {b['shape']} {b['dtype']} = {b['cols']} cols" for b in c["tmem_buffers"]))
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
                         f"{pc.get('specializations', pc['kernels'])} API specializations, {pc.get('bytes', 0) / 1e6:.1f} MB xz"
                         + ("" if pc["ok"] else f"; FAILED: {pc.get('error') or pc.get('failed')}") + ".")
        lines.append("")
    if manifest.get("tuning"):
        from .tune import format_winners

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


def variant_header(manifest: dict, entry: dict) -> str:
    # A fixed number of lines: Triton's kernel hash covers each kernel's line number, so a header that grew with
    # new measurements would move every kernel and void the precompiled bundle (kernels/) and Triton's cache.
    return comment_block([
        f"generated/{manifest['family']}/{entry_name(entry)}.py: generated by gen; do not edit.",
        f"spec: {manifest['spec']['path']} (sha256 {manifest['spec']['sha256'][:12]})",
        f"template: templates/{entry['template']} (digest {entry['template_digest'][:12]})",
        f"config: {json.dumps(entry['config'])}",
        f"target: {entry['target']} ({entry['runs']}); gates: {'pass' if entry['compile']['ok'] else 'FAIL'}",
        "Why this kernel exists (the measured Inductor alternative): at the end of this file.",
        "",
    ])


def variant_trailer(entry: dict, family: str) -> str:
    return "\n\n" + comment_block(measured_lines(entry, family))


def portable_ttgir(ttgir: str, family: str, target: str) -> str:
    """TTGIR with the machine-specific paths in its locations replaced by stable names, so ir/ only changes when the IR
    does: the compiled module becomes generated/<family>/<target>.py (body) (line numbers are those of the rendered
    body, i.e. that file without its header), and Triton's own sources lose the install prefix (triton/language/...)."""
    ttgir = re.sub(r'"[^"]*/v_[0-9a-f]{20}\.py"', f'"generated/{family}/{target}.py (body)"', ttgir)
    return re.sub(r'"[^"]*/(?:site|dist)-packages/(triton/[^"]*)"', r'"\1"', ttgir)


def emit(result: PipelineResult, root: Path = GENERATED, fresh: dict | None = None,
         keep_other_targets: bool = False, tuning: dict | None = None) -> tuple[Path, dict]:
    spec = result.spec
    out = root / spec.family
    (out / "ir").mkdir(parents=True, exist_ok=True)
    previous = load_manifest(spec.family, root)
    manifest = build_manifest(result, previous, fresh, keep_other_targets, tuning)
    written = {"__init__.py", "manifest.json", "REPORT.md"}
    for v, entry in zip(result.variants, manifest["variants"]):
        (out / f"{v.name}.py").write_text(variant_header(manifest, entry) + v.source.text.rstrip("\n")
                                           + variant_trailer(entry, spec.family))
        (out / "ir" / f"{v.name}.ttgir").write_text(portable_ttgir(v.ttgir, spec.family, v.name))
        written.add(f"{v.name}.py")
    shipped = [entry_name(e) for e in manifest["variants"] if e["compile"]["ok"]]
    api = render_api(spec, {"spec": spec, "options": spec.options, "shipped": shipped, "manifest": manifest})
    (out / "__init__.py").write_text(api)
    dispatch_table.write(out, spec.family)  # from the committed workload-suite results (REPORT.md summarizes it)
    write_manifest(out, manifest)
    written |= {f"{entry_name(e)}.py" for e in manifest["variants"]}
    for stale in (out / "ir").glob("*.ttgir"):
        if f"{stale.stem}.py" not in written:
            stale.unlink()
    for stale in out.glob("*.py"):
        if stale.name not in written:
            stale.unlink()
    (root / "__init__.py").touch()
    write_runtime(root)
    return out, manifest


RUNTIME = Path(__file__).resolve().parent / "runtime"


def write_runtime(root: Path) -> None:
    """generated/_runtime/: gen/runtime/ copied file for file, so the generated packages import their run time from
    themselves and stand alone (torch, triton and cuda-python are all a vendored generated/ needs)."""
    out = root / "_runtime"
    out.mkdir(parents=True, exist_ok=True)
    sources = {p.name: p.read_text() for p in sorted(RUNTIME.glob("*.py"))}
    for name, text in sources.items():
        path = out / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    for stale in out.glob("*.py"):
        if stale.name not in sources:
            stale.unlink()


def write_manifest(out: Path, manifest: dict) -> None:
    """manifest.json and the REPORT.md rendered from it (and from dispatch.json): every writer of the manifest goes
    through here."""
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=False) + "\n")
    table = out / "dispatch.json"
    dispatch = json.loads(table.read_text()) if table.exists() else None
    (out / "REPORT.md").write_text(report_markdown(manifest) + dispatch_markdown(dispatch))


def dispatch_markdown(dispatch: dict | None) -> str:
    """REPORT.md's dispatch section: which provider each measured bucket goes to, and where that was measured."""
    if not dispatch:
        return ("## Dispatch\n\nNo workload-suite results are committed for this family: every call takes the "
                "conservative default (see the package docstring).\n")
    lines = ["## Dispatch (dispatch.json)", "", dispatch["rule"] + ".", ""]
    for target, t in dispatch["targets"].items():
        counts: dict = {}
        for b in t["buckets"]:
            counts[b["provider"]] = counts.get(b["provider"], 0) + len(b["cases"])
        lines += [f"- {target}: measured on {t['device']} (torch {t['versions'].get('torch')}, triton "
                  f"{t['versions'].get('triton')}), `{t['command']}`, from `{t['source']}`: {len(t['buckets'])} "
                  "buckets; suite cases per picked provider: "
                  + ", ".join(f"{p} {n}" for p, n in sorted(counts.items(), key=lambda kv: -kv[1]))]
    lines += ["", "Per-case times, geomeans and every case below 0.97x: `bench/results/suite-h200.md`; plot:",
              "", "![suite](../../bench/results/suite-h200.png)", ""]
    return "\n".join(lines)


def record_precompiled(out: Path, summary: dict) -> dict:
    """Write gen/bundle.py's per-target summary into manifest.json (the bundle is built after the modules exist)."""
    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["variants"]:
        if entry_name(entry) in summary:
            entry["precompiled"] = summary[entry_name(entry)]
    write_manifest(out, manifest)
    return manifest


def record_tuning(out: Path, spec, tuning: dict) -> dict:
    """Write `gen tune`'s record into manifest.json; later builds of the same spec carry it (build_manifest)."""
    path = out / "manifest.json"
    if not path.exists():
        raise ValueError(f"{path} does not exist: run `python -m gen {_rel(spec.path)}` first")
    manifest = json.loads(path.read_text())
    if manifest["spec"]["sha256"] != spec.sha256:
        raise ValueError(f"{path} was built from another version of {_rel(spec.path)}: regenerate it first")
    manifest["tuning"] = tuning
    write_manifest(out, manifest)
    return manifest
