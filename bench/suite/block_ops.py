#!/usr/bin/env python3
"""Where an eager decode block's extra host time goes, gen against torch, op by op on the block's own shapes (GPU).

    python bench/suite/block_ops.py        # writes $OUT/block-ops.json (or /tmp/block-ops.json)

For three decode cases: each op's call time (back-to-back calls, host clock, 300 calls a loop, torch and gen loops
interleaved, median of 7 rounds), the same for the whole block (also with the garbage collector off), each op's
GPU time (CUDA-graph replay), what the dispatch picked per op, and cProfile's view of the gen block by cumulative
time. Committed result: bench/results/block-ops-h200.json.
"""
import cProfile, gc, io, json, os, pstats, statistics, sys, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torch
import torch.nn.functional as F
from bench.suite import block as B
from bench.suite.models import MODELS
from generated import gemm as gg, attention as ga

out = {}
def loop_us(fn, n=300):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - t0) / n * 1e6

def inter(fns, rounds=7, n=300):
    res = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items(): res[k].append(loop_us(f, n))
    return {k: round(statistics.median(v), 1) for k, v in res.items()}

dev = torch.device("cuda")
g = torch.Generator(device=dev); g.manual_seed(0)
for name, bsz, lk in [("llama3-8b", 64, 1024), ("mistral-7b", 8, 4096), ("llama3-8b", 1, 8192)]:
    model = MODELS[name]
    w = B.block_weights(model, dev, g)
    x = torch.randn(bsz, 1, model.hidden, device=dev, dtype=torch.bfloat16, generator=g)
    cos, sin = B.rope_tables(model.rope_theta, model.head_dim, torch.tensor([lk - 1], device=dev))
    kc = torch.randn(bsz, model.kv_heads, lk, model.head_dim, device=dev, dtype=torch.bfloat16, generator=g)
    vc = torch.randn_like(kc)
    tb, gb = B.make_block(model, "torch", "decode"), B.make_block(model, "gen", "decode")
    h = x.view(bsz, model.hidden)
    hq, hkv, d = model.heads, model.kv_heads, model.head_dim
    q = torch.randn(bsz, 1, hq, d, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    m = torch.randn(bsz, model.intermediate, device=dev, dtype=torch.bfloat16)
    o = torch.randn(bsz, hq * d, device=dev, dtype=torch.bfloat16)
    gqa = hq != hkv
    fns = {
        "torch qkv": lambda: F.linear(h, w["wqkv"], w["bqkv"]), "gen qkv": lambda: gg.linear(h, w["wqkv"], w["bqkv"]),
        "torch o": lambda: F.linear(o, w["wo"]), "gen o": lambda: gg.linear(o, w["wo"]),
        "torch gate+silu": lambda: F.silu(F.linear(h, w["wgate"])), "gen gate+silu": lambda: gg.linear(h, w["wgate"], activation="silu"),
        "torch down": lambda: F.linear(m, w["wdown"]), "gen down": lambda: gg.linear(m, w["wdown"]),
        "torch attn": lambda: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=gqa),
        "gen attn": lambda: ga.attention(q, kc, vc, mod="causal"),
        "torch block": lambda: tb(w, x, cos, sin, kc, vc), "gen block": lambda: gb(w, x, cos, sin, kc, vc),
    }
    for f in fns.values(): f()
    key = f"{name} B{bsz} Lk{lk}"
    out[key] = {"decisions": {"qkv": gg.decide(h, w["wqkv"].t(), w["bqkv"]), "o": gg.decide(o, w["wo"].t()),
                              "gate": gg.decide(h, w["wgate"].t(), None, "silu"), "down": gg.decide(m, w["wdown"].t()),
                              "attn": ga.decide(q, kc, vc, "causal")},
                "us": inter(fns)}
    gc.disable(); out[key]["us_nogc"] = inter({k: fns[k] for k in ("torch block", "gen block")}); gc.enable()
    # GPU time per op: CUDA graph replay
    gus = {}
    for k in fns:
        try:
            gr = B.captured(fns[k]); gus[k] = round(loop_us(gr, 300), 1)
        except Exception as e:
            gus[k] = repr(e)[:200]
    out[key]["graph_us"] = gus
    pr = cProfile.Profile(); pr.enable()
    for _ in range(200): gb(w, x, cos, sin, kc, vc)
    torch.cuda.synchronize(); pr.disable()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(35)
    out[key]["cprofile_gen"] = s.getvalue().splitlines()[-45:]
    print(key, json.dumps({k: out[key][k] for k in ("decisions", "us", "us_nogc", "graph_us")}, indent=1), flush=True)
os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
result = {"device": torch.cuda.get_device_name(0),
          "versions": {"torch": torch.__version__, "triton": __import__("triton").__version__},
          "command": "python bench/suite/block_ops.py", "cases": out}
with open(os.path.join(os.environ.get("OUT", "/tmp"), "block-ops.json"), "w") as f:
    json.dump(result, f, indent=1)
