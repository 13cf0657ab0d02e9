"""Quick GPU check of the current templates: verify every runnable variant, time the headline cases.

    python bench/quick_check.py [--out DIR]

Writes quick_check.json (and prints a table). Uses the spec's default configs.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    import torch

    from gen.bench import time_ms
    from gen.compile import load_module_from_text
    from gen.device import device_info
    from gen.gpu import verify_cases
    from gen.render import render_variant
    from gen.spec import load_spec
    from gen.targets import get_target
    from gen.verify import verify_module

    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--families", default="gemm,attention")
    args = p.parse_args()
    info = device_info(0)
    print(f"device: {info.label}, {info.num_sms} SMs, smem opt-in {info.smem_optin} B (via {info.source})")
    results = {"device": info.label, "verify": {}, "timing": []}
    modules = {}
    for family in args.families.split(","):
        spec = load_spec(f"specs/{family}.yaml")
        for t in spec.targets:
            if not get_target(t).runs_on(info.major):
                continue
            key = f"{family}/{t}"
            try:
                src = render_variant(spec, t, spec.targets[t].config)
                mod = load_module_from_text(src.text, src.digest)
                modules[key] = mod
                t0 = time.time()
                rep = verify_module(spec, mod, verify_cases(spec), spec.verify["shapes"], "cuda", info.num_sms)
                bad = [c for c in rep.cases if not c["ok"]]
                results["verify"][key] = {"ok": rep.ok, "cases": len(rep.cases), "max_rel_err": rep.max_rel_err,
                                          "failures": bad[:20], "seconds": round(time.time() - t0, 1)}
                print(f"verify {key}: ok={rep.ok} cases={len(rep.cases)} max_rel_err={rep.max_rel_err:.3e} "
                      f"failures={len(bad)}")
                for c in bad[:8]:
                    print("   FAIL", c)
            except Exception:
                results["verify"][key] = {"ok": False, "error": traceback.format_exc()[-2000:]}
                print(f"verify {key}: ERROR\n{traceback.format_exc()[-1500:]}")

    def timeit(label, provider, fn, flops):
        try:
            ms = time_ms(fn)
            row = {"case": label, "provider": provider, "ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1)}
        except Exception as e:
            row = {"case": label, "provider": provider, "error": f"{type(e).__name__}: {e}"[:300]}
        results["timing"].append(row)
        print(row)

    if "gemm/sm90" in modules or "gemm/triton" in modules:
        for m, n, k in ((8192, 8192, 8192), (8192, 14336, 4096)):
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
            bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            fl = 2.0 * m * n * k
            for act, bb in (("none", None), ("gelu_tanh", bias)):
                label = f"{m}x{n}x{k} {act}"
                for key in ("gemm/sm90", "gemm/triton"):
                    if key in modules:
                        timeit(label, key, lambda mod=modules[key]: mod.launch(a, b, bb, out, act, info.num_sms), fl)
                if act == "none":
                    timeit(label, "cublas", lambda: a @ b, fl)
                else:
                    timeit(label, "cublas+eager", lambda: torch.nn.functional.gelu(a @ b + bias, approximate="tanh"), fl)
    if "attention/sm90" in modules or "attention/triton" in modules:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        for d in (128, 64):
            B, H, L = 4, 16 if d == 128 else 32, 4096
            q, k, v = (torch.randn(B, H, L, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            out = torch.empty_like(q)
            lse = torch.empty(B, H, L, device="cuda", dtype=torch.float32)
            slopes = torch.ones(H, device="cuda")
            for mod in ("none", "causal"):
                fl = 4.0 * B * H * L * L * d * (0.5 if mod == "causal" else 1.0)
                label = f"B{B} H{H} L{L} D{d} {mod}"
                for key in ("attention/sm90", "attention/triton"):
                    if key in modules:
                        timeit(label, key, lambda m_=modules[key]: m_.launch(q, k, v, out, lse, d ** -0.5, mod, 0, 0, 0.0,
                                                                            slopes, info.num_sms), fl)
                def cudnn():
                    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=mod == "causal")
                timeit(label, "sdpa-cudnn", cudnn, fl)
    Path(args.out, "quick_check.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
