"""KernelSpec x Target -> candidate Configs, pruned by arithmetic (shared memory, TMEM) before any compile."""
from __future__ import annotations

from dataclasses import dataclass

from ..families import get_family
from .spec import KernelSpec, SpecError
from .targets import get_target


@dataclass(frozen=True)
class Candidate:
    target: str
    config: dict
    index: int                 # 0 is the spec's default config
    estimate: dict             # smem_bytes / tmem_cols the config needs at its worst compile case
    pruned: str = ""           # why it was rejected before compiling ("" = survives)

    @property
    def label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.config.items())


def plan(spec: KernelSpec, target_name: str) -> list[Candidate]:
    if target_name not in spec.targets:  # e.g. `--target sm90` for a spec that lists no sm90
        raise SpecError(spec.path, f"targets.{target_name}", "not listed in this spec",
                        f"add targets.{target_name}: {{config: ...}} or build one of {sorted(spec.targets)}")
    target = get_target(target_name)
    family = get_family(spec.family)
    out = []
    for i, cfg in enumerate(spec.targets[target_name].candidates()):
        worst = {"smem_bytes": 0, "tmem_cols": 0}
        for case in spec.compile_cases:
            est = family.estimate(target_name, cfg, case)
            worst = {k: max(worst[k], est[k]) for k in worst}
        reason = ""
        if worst["smem_bytes"] > target.smem_bytes:
            reason = f"needs ~{worst['smem_bytes']} B shared memory > {target.smem_bytes} B"
        elif worst["tmem_cols"] > target.tmem_cols:
            reason = f"needs {worst['tmem_cols']} TMEM columns > {target.tmem_cols}"
        out.append(Candidate(target_name, cfg, i, worst, reason))
    return out
