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
from .manifest import GENERATED, entry_name, load_manifest, repo_relative, write_manifest
from .pipeline import PipelineResult
from .render import comment_block, render_api


def _versions() -> dict:
    from importlib.metadata import version

    return {"gen": __version__, "triton": version("triton"), "torch": version("torch").split("+")[0],
            "python": platform.python_version()}


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
        "spec": {"path": repo_relative(spec.path), "sha256": spec.sha256},
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
