"""Runs the stages for one spec: plan -> render -> compile -> inspect (-> verify -> bench on a GPU) -> emit.

A candidate that fails a stage is kept with its reason; nothing past a stage boundary raises for one bad config.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import compile as compile_stage
from . import mlir
from .plan import Candidate, plan
from .render import Source, render_variant
from ..runtime.dispatch import variant_name
from .spec import KernelSpec
from .targets import get_target


@dataclass(frozen=True)
class Variant:
    """A shipped config of one target: its source and its IR report per compile case. `name` is its module and
    provider name: the target itself for the default config, <target>_<variant> for a spec's `variants:` entry."""
    target: str
    config: dict
    source: Source
    reports: list                      # [IRReport], one per spec.compile_cases, primary first
    ttgir: str = ""                    # TTGIR of the primary case (emitted to ir/<name>.ttgir)
    name: str = ""

    def __post_init__(self):
        if not self.name:
            object.__setattr__(self, "name", self.target)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.reports)


@dataclass(frozen=True)
class Rejected:
    target: str
    config: dict
    stage: str                         # plan | render | compile | gates
    reason: str                        # in full (the manifest keeps its first 1000 characters; the build log all)


@dataclass(frozen=True)
class PipelineResult:
    spec: KernelSpec
    variants: list = field(default_factory=list)     # [Variant]
    rejected: list = field(default_factory=list)     # [Rejected]


def _declared_tmem(source: Source) -> dict | None:
    """The template's TMEM_BUFFERS table, read from the rendered text without importing it."""
    import ast

    for node in ast.parse(source.text).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "TMEM_BUFFERS" for t in node.targets):
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return None
    return None


def run_pipeline(spec: KernelSpec, targets: list[str] | None = None, jobs: int | None = None, log=print,
                 search: bool = True) -> PipelineResult:
    targets = targets or list(spec.targets)
    rejected: list[Rejected] = []
    rendered: list[tuple[Candidate, Source]] = []
    for t in targets:
        cands = plan(spec, t)
        if not search:
            cands = cands[:1]
        for c in cands:
            if c.pruned:
                rejected.append(Rejected(t, c.config, "plan", c.pruned))
                continue
            try:
                rendered.append((c, render_variant(spec, t, c.config)))
            except Exception as e:
                rejected.append(Rejected(t, c.config, "render", f"{type(e).__name__}: {e}"))
    n_pruned = sum(1 for r in rejected if r.stage == "plan")
    log(f"[gen] {spec.family}: {len(rendered)} candidate(s) to compile, {n_pruned} pruned by arithmetic, "
        f"{sum(1 for r in rejected if r.stage == 'render')} failed to render")

    primary = spec.compile_cases[0]
    done = [0]

    def progress(req, arts):
        done[0] += 1
        state = "cached" if arts and all(a.cached for a in arts) else ("ok" if all(a.ok for a in arts) else "FAILED")
        log(f"[gen]   compiled {done[0]}: {req.target.name} {req.source.config} [{state}]")

    # Wave 1: every surviving candidate at the primary case.
    reqs = [compile_stage.CompileRequest(src, primary, get_target(c.target)) for c, src in rendered]
    arts = compile_stage.compile_many(reqs, jobs=jobs, progress=progress)
    by_target: dict[str, list] = {}
    for (c, src), a in zip(rendered, arts):
        target = get_target(c.target)
        report = mlir.inspect(a, target, spec.targets[c.target].expect, _declared_tmem(src))
        by_target.setdefault(c.target, []).append((c, src, report, a))
        if not report.ok:
            rejected.append(Rejected(c.target, c.config, "compile" if not report.compiled else "gates",
                                     "; ".join(report.failures())))

    # The shipped config per target: the first candidate (the spec's default comes first) that passes its gates at
    # the primary case and then at every other compile case. Targets are retried in parallel, one candidate each.
    others = spec.compile_cases[1:]
    pending = {t: [item for item in items if item[2].ok] for t, items in by_target.items()}
    pending = {t: items for t, items in pending.items() if items}
    variants = []
    chosen = set()
    while pending:
        batch = [(t, items[0]) for t, items in pending.items()]
        reqs2 = [compile_stage.CompileRequest(src, case, get_target(t)) for t, (c, src, _, _) in batch for case in others]
        arts2 = iter(compile_stage.compile_many(reqs2, jobs=jobs, progress=progress) if reqs2 else [])
        for t, (c, src, report, a) in batch:
            reports = [report] + [mlir.inspect(next(arts2), get_target(t), spec.targets[t].expect, _declared_tmem(src))
                                  for _ in others]
            failing = [r for r in reports[1:] if not r.ok]
            if failing:
                r = failing[0]
                rejected.append(Rejected(t, c.config, "gates", f"case {r.case}: " + "; ".join(r.failures())))
                pending[t].pop(0)
                if not pending[t]:
                    del pending[t]
                continue
            variants.append(Variant(t, c.config, src, reports, "\n".join(x.ttgir for x in a)))
            chosen.add(t)
            del pending[t]
    variants += _named_variants(spec, [t for t in targets if t in chosen], rejected, jobs, progress)
    order = {t: [t] + [variant_name(t, n) for n in spec.targets[t].variants] for t in targets}
    variants.sort(key=lambda v: (targets.index(v.target), order[v.target].index(v.name)))
    for t in targets:
        if t not in chosen:
            log(f"[gen] {t}: no candidate passed its gates" + ("" if t == "triton" else "; the public op falls back to the portable variant"))
    return PipelineResult(spec, variants, rejected)


def _named_variants(spec: KernelSpec, targets: list[str], rejected: list, jobs, progress) -> list:
    """The spec's `variants:` of each target whose default shipped: each config rendered, compiled at every compile
    case and gated like the default (no search: the config was chosen by a measurement, bench/suite/config_sweep.py)."""
    return gate_configs(spec, [(t, vname, cfg) for t in targets for vname, cfg in spec.targets[t].variants.items()],
                        rejected, jobs, progress)


def gate_configs(spec: KernelSpec, items: list, rejected: list, jobs=None, progress=None) -> list:
    """[(target, variant name, config)] -> the Variants that render, compile at every compile case and pass the
    target's gates; the others are appended to `rejected` with the reason."""
    rendered = []
    for t, vname, cfg in items:
        try:
            rendered.append((t, vname, cfg, render_variant(spec, t, cfg)))
        except Exception as e:
            rejected.append(Rejected(t, cfg, "render", f"variant {vname}: {type(e).__name__}: {e}"))
    reqs = [compile_stage.CompileRequest(src, case, get_target(t)) for t, _, _, src in rendered
            for case in spec.compile_cases]
    arts = iter(compile_stage.compile_many(reqs, jobs=jobs, progress=progress) if reqs else [])
    out = []
    for t, vname, cfg, src in rendered:
        got = [next(arts) for _ in spec.compile_cases]
        reports = [mlir.inspect(a, get_target(t), spec.targets[t].expect, _declared_tmem(src)) for a in got]
        failing = [r for r in reports if not r.ok]
        if failing:
            r = failing[0]
            stage = "compile" if not r.compiled else "gates"
            rejected.append(Rejected(t, cfg, stage, f"variant {vname}, case {r.case}: " + "; ".join(r.failures())))
            continue
        out.append(Variant(t, cfg, src, reports, "\n".join(x.ttgir for x in got[0]), variant_name(t, vname)))
    return out
