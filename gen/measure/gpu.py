"""On a CUDA machine: verify every shipped variant this device can run, optionally benchmark, decide keep-or-reject."""
from __future__ import annotations

from .bench import speedups
from ..build.compile import load_module_from_text
from ..families import get_family
from ..runtime.device import device_info
from ..build.pipeline import PipelineResult
from ..build.targets import get_target
from .verify import verify_module

INDUCTOR_PROVIDERS = ("inductor", "inductor-max-autotune")


def decide(rows: list, provider: str, margin: float) -> tuple[str, list]:
    """Keep-or-reject against the best Inductor time per case; returns (decision text, cases where Inductor stays)."""
    best = {}
    for base in INDUCTOR_PROVIDERS:
        for case, ratio in speedups(rows, provider, base).items():
            best[case] = min(best.get(case, float("inf")), ratio)
    if not best:
        return "no Inductor measurement: undecided", []
    keep = sorted(c for c, r in best.items() if r < margin)
    text = (f"beats the best Inductor time by >= {margin:.2f}x on {len(best) - len(keep)}/{len(best)} benchmark cases"
            + (f"; keep Inductor for: {', '.join(keep)}" if keep else ""))
    return text, keep


def run_on_gpu(result: PipelineResult, bench: bool, command: str, inductor_dir=None) -> dict:
    """variant name -> {"verify", "bench", "decision", "keep_inductor"}, plus "_inductor" (Inductor's kernels) with
    bench."""
    spec = result.spec
    family = get_family(spec.family)
    info = device_info(0)
    fresh: dict = {}
    modules = {}
    for v in result.variants:
        if not v.ok or not get_target(v.target).runs_on(info.major):
            continue
        module = load_module_from_text(v.source.text, v.source.digest)
        modules[v.name] = module
        rep = verify_module(spec, module, family.verify_cases(spec), spec.verify["shapes"], "cuda", info.num_sms)
        fresh[v.name] = {"verify": {**rep.to_manifest(), "device": info.label}}
        print(f"[gen] verify {v.name} on {info.label}: {len(rep.cases)} cases, max rel err {rep.max_rel_err:.2e} "
              f"-> {'ok' if rep.ok else 'FAILED'}")
    if bench and modules:
        providers = {f"gen-{t}": m for t, m in modules.items() if fresh[t]["verify"]["ok"]}
        rows, errors = family.benchmark(spec, providers, info.num_sms)
        for t in modules:
            prov = f"gen-{t}"
            summary = [f"{prov} vs {base}: " + ", ".join(f"{c}: {r}x" for c, r in speedups(rows, prov, base).items())
                       for base in ("cublas+eager", "sdpa-cudnn", "flex-attention", *INDUCTOR_PROVIDERS)
                       if speedups(rows, prov, base)]
            decision, keep = decide(rows, prov, spec.bench["keep_margin"])
            fresh[t]["bench"] = {"device": info.label, "command": command, "rows": rows, "errors": errors, "summary": summary}
            fresh[t]["decision"] = decision
            fresh[t]["keep_inductor"] = keep
        if inductor_dir is not None:
            from .inductor import capture

            case, shape = family.capture_case(spec)
            fresh["_inductor"] = capture(spec, case, shape, inductor_dir)
    return fresh
