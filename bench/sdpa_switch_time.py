#!/usr/bin/env python3
"""Host time of SDPA through one named backend, a call (GPU): SDPA's own choice, sdpa_kernel() entered per call, and the
generated op's route, which flips SDPA's backend switches itself. `python bench/sdpa_switch_time.py`; result:
bench/results/sdpa-switch-time-h200.json (written to $OUT/sdpa-switch-time.json, or /tmp)."""
import os, statistics, sys, time, json
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import generated.attention as A

def loop_us(fn, n=500):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - t0) / n * 1e6

out = {}
for label, (b, hq, hkv, lq, lk) in {"llama3-8b decode B1 Lk8192": (1, 32, 8, 1, 8192), "vit B8 L197": (8, 12, 12, 197, 197)}.items():
    q = torch.randn(b, hq, lq, 128 if hq == 32 else 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, hkv, lk, q.shape[-1], device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
    gqa = hq != hkv
    def ctx(backend):
        def f():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
        return f
    fns = {"sdpa default": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa),
           "sdpa_kernel(cudnn) per call": ctx(SDPBackend.CUDNN_ATTENTION),
           "gen run_provider sdpa-cudnn (switch flip)": lambda: A.run_provider("sdpa-cudnn", q, k, v),
           "gen attention (dispatched)": lambda: A.attention(q, k, v, mod="none")}
    for f in fns.values(): f()
    res = {n: [] for n in fns}
    for _ in range(7):
        for n, f in fns.items(): res[n].append(loop_us(f))
    out[label] = {n: round(statistics.median(x), 1) for n, x in res.items()}
    out[label]["dispatched to"] = A.decide(q, k, v, "none")
    ref = F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(hq // hkv, 1), v.float().repeat_interleave(hq // hkv, 1))
    o = A.run_provider("sdpa-cudnn", q, k, v).float()
    out[label]["rel_err sdpa-cudnn"] = float((o - ref).norm() / ref.norm())
print(json.dumps(out, indent=1))
result = {"device": torch.cuda.get_device_name(0),
          "versions": {"torch": torch.__version__, "triton": __import__("triton").__version__},
          "command": "python bench/sdpa_switch_time.py",
          "method": "us a call: 500 back-to-back calls a loop, host clock, synchronized at both ends, loops "
                    "interleaved, median of 7", "cases": out}
with open(os.path.join(os.environ.get("OUT", "/tmp"), "sdpa-switch-time.json"), "w") as f:
    json.dump(result, f, indent=1)
