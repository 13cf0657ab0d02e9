"""Causal tile order of the sm90 attention kernel, before and after dealing tiles longest first (GPU, same run).

    git show 757c478:generated/attention/sm90.py > generated/attention/sm90_old.py   # the head-major order
    python bench/tile_order.py            # writes $OUT/tile-order.json (or /tmp/tile-order.json)

For 12 causal prefill shapes (GQA and MHA, L 1000-16384): both kernels' output against SDPA (rel_err, float64 norm),
and GPU time of each kernel and of SDPA (its own backend choice), each as CUDA-graph replay (bench/suite/run.graph_ms:
about 10 calls per graph, median over replays), same inputs, same process. Committed result:
bench/results/tile-order-h200.json.
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch
import torch.nn.functional as F
from bench.suite import run as suite_run
import generated.attention as att
from generated.attention import sm90 as new
try:
    from generated.attention import sm90_old as old
except ImportError:
    raise SystemExit("bench/tile_order.py needs the head-major kernel beside the current one: "
                     "git show 757c478:generated/attention/sm90.py > generated/attention/sm90_old.py")
from gen.runtime.device import device_info
num_sms = device_info(0).num_sms
out = {"device": torch.cuda.get_device_name(0),
       "versions": {"torch": torch.__version__, "triton": __import__("triton").__version__},
       "command": "python bench/tile_order.py", "num_sms": num_sms, "rows": []}
shapes = [  # B, Hq, Hkv, L, D
    (1, 32, 8, 8192, 128), (8, 32, 8, 2048, 128), (4, 16, 16, 4096, 128), (2, 32, 8, 4096, 128),
    (1, 32, 32, 4096, 128), (16, 32, 8, 1024, 128), (1, 8, 8, 16384, 128), (4, 32, 8, 8192, 128),
    (2, 16, 16, 2048, 64), (4, 28, 4, 4096, 128), (8, 16, 16, 1000, 128), (1, 32, 8, 3000, 128)]
g = torch.Generator(device="cuda"); g.manual_seed(0)
for (B, Hq, Hkv, L, D) in shapes:
    q = torch.randn(B, Hq, L, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, Hkv, L, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, Hkv, L, D, device="cuda", dtype=torch.bfloat16, generator=g)
    scale = D ** -0.5
    o_buf = torch.empty_like(q); lse = torch.empty(B, Hq, L, device="cuda", dtype=torch.float32)
    def run(mod, modname="causal"):
        mod.launch(q, k, v, o_buf, lse, scale, modname, 0, 0, 0.0, None, num_sms)
        return o_buf
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hq != Hkv)
    row = {"shape": [B, Hq, Hkv, L, D], "tiles": B * Hq * math.ceil(L / 256)}
    o_buf.fill_(float("nan"))
    row["rel_err_new"] = float(f"{suite_run.rel_err(run(new), ref):.3g}")
    o_buf.fill_(float("nan"))
    row["rel_err_old"] = float(f"{suite_run.rel_err(run(old), ref):.3g}")
    fl = 4 * B * Hq * L * L * D / 2
    for name, fn in (("new", lambda: run(new)), ("old", lambda: run(old)),
                     ("sdpa", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hq != Hkv))):
        ms = suite_run.graph_ms([fn], 1.0)
        row[name + "_ms"] = round(ms, 4); row[name + "_tflops"] = round(fl / ms / 1e9, 1)
    row["new/old"] = round(row["old_ms"] / row["new_ms"], 3)
    row["new_vs_sdpa"] = round(row["sdpa_ms"] / row["new_ms"], 3)
    print(json.dumps(row), flush=True)
    out["rows"].append(row)
# alibi (causal mask with a score mod) correctness against the op's torch math
q = torch.randn(2, 8, 700, 128, device="cuda", dtype=torch.bfloat16, generator=g)
k = torch.randn(2, 2, 700, 128, device="cuda", dtype=torch.bfloat16, generator=g)
v = torch.randn_like(k)
o = att.run_provider("sm90", q, k, v, mod="alibi"); r = att.run_provider("torch", q, k, v, mod="alibi")
out["alibi_rel_err"] = float(f"{suite_run.rel_err(o, r):.3g}")
print("alibi", out["alibi_rel_err"])
os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "tile-order.json"), "w"), indent=1)
