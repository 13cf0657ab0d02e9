#!/usr/bin/env python3
"""Config sweep: GPU time of one target rendered with several configs, on every workload-suite GEMM case
(or, with --family attention, every attention prefill or decode case).

    python bench/suite/config_sweep.py --target sm90 --config '{"BLOCK_M": 64, "BLOCK_N": 128, ...}' ...
                                       [--family gemm|attention] [--phase prefill|decode] [--variant NAME]
                                       [--subset N] [--max-m M] [--max-l L] [--match REGEX]
                                       [--time-budget S] [--out FILE]

What it answers: which configs a shipped target should carry besides its default, and for which buckets (the
decision data behind the spec's `variants:`). Each --config is merged over the spec's default config for the target
(or over its named config `--variant NAME`, e.g. `--target triton --variant splitkv --phase decode`; a config's
"_set" entry overrides module constants after import, e.g. '{"_set": {"RESIDENT": 2}}' for the split rule),
checked by the family's check_config (an invalid one is reported, not fatal), rendered from the same template the
build uses and loaded as a standalone module (it imports gen.runtime). Per suite case: the inputs, the float32
reference and the input rotation of bench/suite/run.py (Gemm.state), then for the torch provider and each config one
checked call (rel_err) and the GPU time by CUDA-graph replay (run.graph_ms: launch overhead does not decide).
Host time is not measured here: every config shares the module's launch path, so it differs only in kernels.
Attention: the inputs and float64 reference of bench/suite/run.py (Attention.state); "torch" is SDPA's own backend
choice where SDPA can express the mod, else absent; each config runs through the op's own argument handling for the
call (generated.attention's route for the sm90 provider: scale, window, softcap, ALiBi slopes), with its module.
Writes {"configs": [...], "rows": [{"id", "case", "torch": {gpu_ms}, "configs": [{gpu_ms, rel_err} | {error}]}]}.
"""
from __future__ import annotations

import time

_T0 = time.monotonic()

import argparse  # noqa: E402
import functools  # noqa: E402
import importlib.metadata  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.suite import cases as suite  # noqa: E402
from bench.suite import run  # noqa: E402
from gen.families import get_family  # noqa: E402
from gen.build.render import render_variant  # noqa: E402
from gen.build.spec import load_spec  # noqa: E402


def load_configs(spec, target: str, overrides: list[dict], tmp: Path, variant: str = "") -> list[dict]:
    """[{"config", "module" | "error"}]: each override merged over the target's default config (or its named config
    `variant`), checked, rendered and imported as a standalone module."""
    tspec = spec.targets[target]
    if variant and variant not in tspec.variants:
        raise SystemExit(f"--variant {variant!r}: {target} has no such named config (it has {sorted(tspec.variants)})")
    base = tspec.variants[variant] if variant else tspec.config
    out = []
    for i, over in enumerate(overrides):
        over = dict(over)
        consts = over.pop("_set", {})   # module constants to override after import (e.g. the split rule's RESIDENT)
        cfg = {**base, **over}
        entry = {"config": cfg, **({"set": consts} if consts else {})}
        try:
            get_family(spec.family).check_config(target, cfg, str(spec.path), f"--config[{i}]")
            path = tmp / f"sweep_{target}_{i}.py"
            path.write_text(render_variant(spec, target, cfg).text)
            mod_spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)
            for name, value in consts.items():
                if not name.isupper() or not hasattr(module, name):
                    raise ValueError(f"_set: {name!r} is not a constant of the rendered module")
                setattr(module, name, value)
            entry["module"] = module
        except Exception as e:  # noqa: BLE001 - one bad config (a SpecError, a template assert) is a reported entry
            entry["error"] = run.describe(e)
        out.append(entry)
    return out


def sweep_case(env: run.Env, case: dict, configs: list[dict]) -> dict:
    st = run.Gemm().state(env, case)
    copies, act, out_dtype = st["copies"], st["act"] or "none", st["out_dtype"]
    n_sms = torch.cuda.get_device_properties(env.device).multi_processor_count
    eager = run.torch_gemm(case["weight"], case["activation"], out_dtype, case.get("rms_eps"))
    row = {"id": case["id"], "case": run.case_fields(case)}
    torch_fns = [lambda x=x, w=w, bias=bias, r=r, g=g: eager(x, w, bias, r, g) for x, w, _, bias, r, g, _, _ in copies]
    row["torch"] = run.time_gpu(env, torch_fns, 0.05)
    row["configs"] = []
    for c in configs:
        if "module" not in c:
            row["configs"].append({"error": c["error"]})
            continue
        outs = [torch.full((case["M"], case["N"]), float("nan"), device=env.device, dtype=out_dtype) for _ in copies]

        def call(i, mod=c["module"]):
            x, _, _, bias, r, _, _, fb = copies[i]   # (fb: the weight with an RMSNorm-rows case's gain folded in)
            rms = None if not case.get("rms") else (torch.linalg.vector_norm(x, dim=1, dtype=torch.float32),
                                                    case["rms_eps"])
            mod.launch(x, fb, bias, outs[i], act, n_sms, **({} if r is None else {"residual": r}),
                       **({} if rms is None else {"rms": rms}))
            return outs[i]
        fns = [lambda i=i: call(i) for i in range(len(copies))]
        res = run.check(env, fns, st["ref"])
        if "error" not in res and not res.get("wrong"):
            res.update(run.time_gpu(env, fns, row["torch"].get("gpu_ms", 0.05)))
        row["configs"].append(res)
    return row


def sweep_attention_case(env: run.Env, case: dict, configs: list[dict], provider: str = "sm90") -> dict:
    import generated.attention as att

    st = run.Attention().state(env, case)
    copies = st["copies"]
    n_sms = torch.cuda.get_device_properties(env.device).multi_processor_count
    row = {"id": case["id"], "case": run.case_fields(case)}
    calls, ctx = run.sdpa_provider("sdpa", case, copies)
    if isinstance(calls, dict):
        row["torch"] = calls
    else:
        res = run.check(env, calls, st["ref"], st["view"], ctx)
        row["torch"] = res if "error" in res else {**res, **run.time_gpu(env, calls, 0.05, ctx)}
    q0, k0, v0 = copies[0]
    r = att._route(q0, k0, v0, case["mod"], None, None, None, None, False, provider)   # the call's checked arguments
    alibi = att.default_alibi_slopes(q0.shape[1], q0.device) if r.default_alibi else None
    outs = [(torch.full_like(q, float("nan")), torch.empty(q.shape[:3], device=q.device, dtype=torch.float32))
            for q, _, _ in copies]
    row["configs"] = []
    for c in configs:
        if "module" not in c:
            row["configs"].append({"error": c["error"]})
            continue

        def call(i, mod=c["module"]):
            (q, k, v), (o, lse) = copies[i], outs[i]
            mod.launch(q, k, v, o, lse, *r.args, alibi, n_sms)
            return o
        fns = [lambda i=i: call(i) for i in range(len(copies))]
        res = run.check(env, fns, st["ref"], st["view"])
        if "error" not in res and not res.get("wrong"):
            res.update(run.time_gpu(env, fns, row["torch"].get("gpu_ms", 0.05)))
        row["configs"].append(res)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="sm90")
    ap.add_argument("--family", default="gemm", choices=("gemm", "attention"))
    ap.add_argument("--max-l", type=int, default=0, help="attention: only the cases with Lq <= this")
    ap.add_argument("--phase", default="prefill", choices=("prefill", "decode"), help="attention: which suite cases")
    ap.add_argument("--variant", default="", help="merge the configs over this named config of the target "
                                                   "(spec `variants:`) instead of its default")
    ap.add_argument("--match", default="", help="only the suite cases whose id matches this regular expression")
    ap.add_argument("--config", action="append", default=[], type=json.loads,
                    help="JSON config keys merged over the spec's default (repeat; the default itself is always first)")
    ap.add_argument("--subset", type=int, default=0, help="only the first N suite cases")
    ap.add_argument("--max-m", type=int, default=0, help="only the cases with M <= this (e.g. 64: the decode GEMMs)")
    ap.add_argument("--time-budget", type=float, default=540.0)
    ap.add_argument("--out", type=Path, default=None, help="default bench/results/config-sweep-<family>.json")
    args = ap.parse_args(argv)
    run.configure_torch()
    env = run.Env(argparse.Namespace(smoke=False, time_budget=args.time_budget, with_triton=False))
    args.out = args.out or ROOT / "bench" / "results" / f"config-sweep-{args.family}.json"
    spec = load_spec(ROOT / "specs" / f"{args.family}.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        configs = load_configs(spec, args.target, [{}] + args.config, Path(tmp), args.variant)
        doc = {"device": torch.cuda.get_device_name(env.device), "target": args.target, "variant": args.variant,
               "versions": {"torch": torch.__version__, "triton": importlib.metadata.version("triton")},
               "command": run.command_line(sys.argv if argv is None else ["config_sweep.py", *argv]),
               "configs": [{k: v for k, v in c.items() if k != "module"} for c in configs], "rows": []}
        if args.family == "gemm":
            cases = [c for c in suite.gemm_cases() if not args.max_m or c["M"] <= args.max_m]
            sweep = sweep_case
        else:
            cases = [c for c in suite.attention_cases() if c["phase"] == args.phase and c["D"] in (64, 128)
                     and (not args.max_l or c["Lq"] <= args.max_l)]
            provider = f"{args.target}_{args.variant}" if args.variant else args.target
            sweep = functools.partial(sweep_attention_case, provider=provider)
        cases = [c for c in cases if re.search(args.match, c["id"])][: args.subset or None]
        for case in cases:
            if time.monotonic() - _T0 > args.time_budget - 15:
                doc["stopped"] = f"time budget: {len(doc['rows'])} of {len(cases)} cases"
                break
            try:
                doc["rows"].append(sweep(env, case, configs))
            except run.OutOfTime:
                doc["stopped"] = f"time budget: {len(doc['rows'])} of {len(cases)} cases"
                break
            args.out.write_text(json.dumps(doc, indent=1) + "\n")
            r = doc["rows"][-1]
            cells = " ".join(f"{c.get('gpu_ms', 'x')}" for c in r["configs"])
            print(f"{case['id']:44s} torch {r['torch'].get('gpu_ms')}  configs {cells}", flush=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
