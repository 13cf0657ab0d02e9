"""`python -m gen simulate generated/<family> --target sm100|sm90`: a Gluon variant's numerics on the CPU simulator.

Runs the emitted module (generated/<family>/<target>.py) under gen.simulator on small shapes and compares with the
float64 torch reference; deadlocks and hazards are reported with their source lines. The verdict is recorded in
manifest.json under the variant's `simulate` key (kept across re-runs while the build digests are unchanged).
"""
from __future__ import annotations

from pathlib import Path

from ..cache import REPO_ROOT
from ..families import get_family
from ..build.manifest import load_record, write_record
from ..build.spec import load_spec
from ..build.targets import SMEM_OPT_IN_BYTES
from .verify import verify_module

def simulate_source(spec, text: str, name: str, seed: int = 0, shapes=None, cases=None, late: bool = False):
    """`late`: asynchronous operations complete as late as the kernel allows (gen.simulator.load_module)."""
    from ..simulator import load_module

    family = get_family(spec.family)
    module = load_module(text, name, seed=seed, smem_limit=SMEM_OPT_IN_BYTES, late=late)
    order = ", late completions" if late else ""
    return verify_module(spec, module, cases or family.simulation_cases(spec), shapes or family.simulation_shapes(), "cpu",
                         num_sms=2, seed=seed, device_label=f"CPU simulator (seed {seed}{order})")


def simulate_family(family_dir: Path, target: str, seed: int = 0, record: bool = True, late: bool = False) -> int:
    build = load_record(family_dir)
    if build is None:
        print(f"error: {family_dir / 'manifest.json'} not found; run `python -m gen specs/<family>.yaml` first")
        return 2
    entry = next((v for v in build.variants if v.name == target), None)
    if entry is None:
        print(f"error: {family_dir} has no {target} variant (it has {[v.name for v in build.variants]})")
        return 2
    if entry.target not in ("sm100", "sm90"):
        print(f"error: {target} is a {entry.target} variant; the simulator runs the Gluon ones (sm100, sm90 and "
              "their named configs)")
        return 2
    spec = load_spec(REPO_ROOT / build.spec_path)
    text = (family_dir / f"{target}.py").read_text()
    report = simulate_source(spec, text, f"{build.family}_{target}", seed=seed, late=late)
    for c in report.cases:
        print(f"  [{'ok' if c['ok'] else 'FAIL'}] {c['case']}: rel err {c['rel_err']:.2e} {c['detail']}")
    print(f"{build.family}/{target} on the {report.device}: {len(report.cases)} cases, "
          f"max rel err {report.max_rel_err:.2e} -> {'PASS' if report.ok else 'FAIL'}")
    if record:
        entry.simulate = {**report.to_manifest(), "seed": seed, "command": f"python -m gen simulate {family_dir} "
                          f"--target {target} --seed {seed}" + (" --late" if late else "")}
        write_record(family_dir, build)
    return 0 if report.ok else 1
