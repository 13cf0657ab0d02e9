"""The build record: what one build of a spec made and measured, as typed objects.

The build (gen/__main__.cmd_build) assembles it in memory from the pipeline's result (`assemble`), adds what later
stages learn (the bundles' summaries, the GPU's verify/bench results, tuning winners), and writes it once at the end
as manifest.json and REPORT.md (gen/build/manifest.write_record). The standalone commands that add to a committed build
(`gen simulate`, `gen tune`) load it, add their result and write it once the same way.

Carry-over: a variant whose spec, template and config digests are unchanged keeps what was measured for it before
(on a GPU, by the simulator, the bundle). Those results live in the committed manifest.json, which is why the
previous record is read from there: a rebuild on a CPU machine must reproduce the committed files byte for byte,
and gen.store is a local cache that a fresh clone does not have.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# Results a variant keeps from an earlier build of the same digests, in the order manifest.json lists them.
MEASURED = ("verify", "bench", "simulate", "decision", "keep_inductor", "precompiled")
CARRIED_OVER = "verify/bench recorded earlier for the same spec, template and config digests; not re-run here"


@dataclass
class VariantRecord:
    """One shipped-or-failed variant (a target's default config or a named config) and what is known about it."""
    target: str
    name: str
    module: str
    config: dict
    template: str
    template_digest: str
    config_digest: str
    compile: dict
    runs: str                                  # "compiled", "compiled, not run", "verified on <device>"
    verify: Optional[dict] = None
    bench: Optional[dict] = None
    simulate: Optional[dict] = None
    decision: Optional[str] = None
    keep_inductor: Optional[list] = None
    precompiled: Optional[dict] = None
    carried_over: Optional[str] = None

    @property
    def ok(self) -> bool:
        return bool(self.compile["ok"])

    def to_json(self) -> dict:
        d = {"target": self.target, "name": self.name, "module": self.module, "config": self.config,
             "template": self.template, "template_digest": self.template_digest,
             "config_digest": self.config_digest, "compile": self.compile, "runs": self.runs}
        for key in (*MEASURED, "carried_over"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "VariantRecord":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        known.setdefault("name", d["target"])   # manifests written before named configs have no "name"
        return cls(**known)

    def same_build(self, other: "VariantRecord") -> bool:
        return (self.template_digest, self.config_digest) == (other.template_digest, other.config_digest)


@dataclass
class BuildRecord:
    family: str
    op: str
    spec_path: str
    spec_sha256: str
    versions: dict
    variants: list = field(default_factory=list)     # [VariantRecord]
    rejected: list = field(default_factory=list)     # [{"target", "config", "stage", "reason"}]
    inductor: Optional[dict] = None
    tuning: Optional[dict] = None

    def variant(self, name: str) -> VariantRecord:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(f"{self.family} has no variant {name!r} (it has {[v.name for v in self.variants]})")

    def shipped(self) -> list[str]:
        """Names of the variants that passed their gates, in build order."""
        return [v.name for v in self.variants if v.ok]

    # ---- what later stages add ----

    def add_precompiled(self, summary: dict) -> None:
        """gen/build/bundle.py's per-variant summary (the bundles are built after the modules exist)."""
        for v in self.variants:
            if v.name in summary:
                v.precompiled = summary[v.name]

    def add_measurements(self, fresh: dict) -> None:
        """gen/measure/gpu.run_on_gpu's results: per variant name {"verify", "bench", "decision", "keep_inductor"}."""
        for v in self.variants:
            new = fresh.get(v.name)
            if not new:
                continue
            for key, value in new.items():
                setattr(v, key, value)
            v.carried_over = None
            if "verify" in new:
                v.runs = f"verified on {new['verify']['device']}"

    # ---- manifest.json ----

    def to_json(self) -> dict:
        d = {"family": self.family, "op": self.op, "spec": {"path": self.spec_path, "sha256": self.spec_sha256},
             "versions": self.versions, "variants": [v.to_json() for v in self.variants], "rejected": self.rejected}
        if self.inductor:
            d["inductor"] = self.inductor
        if self.tuning:
            d["tuning"] = self.tuning
        return d

    @classmethod
    def from_json(cls, d: dict) -> "BuildRecord":
        return cls(family=d["family"], op=d["op"], spec_path=d["spec"]["path"], spec_sha256=d["spec"]["sha256"],
                   versions=d["versions"], variants=[VariantRecord.from_json(v) for v in d["variants"]],
                   rejected=d.get("rejected", []), inductor=d.get("inductor"), tuning=d.get("tuning"))


def assemble(result, spec_path: str, versions: dict, previous: Optional[BuildRecord],
             keep_other_targets: bool = False, folder: Optional[str] = None) -> BuildRecord:
    """The record of a pipeline result (gen.build.pipeline.PipelineResult), with what `previous` measured for variants
    built from the same spec, template and config digests carried over. `folder`: a Triton release's own build
    (gen.build.emit.emit_release), whose modules live one package deeper."""
    spec = result.spec
    package = f"generated.{spec.family}" + (f".{folder}" if folder else "")
    same_spec = previous is not None and previous.spec_sha256 == spec.sha256
    old = {v.name: v for v in previous.variants} if same_spec else {}
    variants = []
    for v in result.variants:
        compile_info = v.reports[0].to_manifest()
        compile_info["ok"] = v.ok
        compile_info["cases"] = [{"case": r.case, "ok": r.ok, "smem_bytes": r.smem_bytes, "regs": r.regs,
                                  "spills": r.spills,
                                  "prologue_spills": r.prologue_spills, "hot_reloads": r.hot_reloads,
                                  "failures": r.failures()} for r in v.reports]
        rec = VariantRecord(target=v.target, name=v.name, module=f"{package}.{v.name}",
                            config=v.config, template=v.source.template,
                            template_digest=v.source.template_digest, config_digest=v.source.config_digest,
                            compile=compile_info, runs="compiled, not run" if v.target == "sm100" else "compiled")
        before = old.get(v.name)
        if before is not None and before.same_build(rec):
            rec.runs = before.runs
            for key in MEASURED:
                setattr(rec, key, getattr(before, key))
            if before.verify is not None or before.bench is not None:
                rec.carried_over = CARRIED_OVER
        variants.append(rec)
    if keep_other_targets and previous is not None:   # a --target subset was rebuilt: the others stay as they were
        built = {v.target for v in variants}
        variants += [v for v in previous.variants if v.target not in built]
    return BuildRecord(
        family=spec.family, op=spec.op, spec_path=spec_path, spec_sha256=spec.sha256, versions=versions,
        variants=variants,
        rejected=[{"target": r.target, "config": r.config, "stage": r.stage, "reason": r.reason[:1000]}
                  for r in result.rejected],
        inductor=previous.inductor if previous is not None else None,
        tuning=previous.tuning if same_spec else None)
