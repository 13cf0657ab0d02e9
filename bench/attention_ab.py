"""sm90 attention, the kernel as generated now against an earlier module of it (GPU, same process), with SDPA's
cuDNN and flash backends beside them (same mask, no score mod: a scale), on prefill shapes (MHA and GQA): the A/B of
a tile-walk change (causal), or of a score mod's lowering (--cases mods).

    git show 26ade99:generated/attention/sm90.py > /tmp/old_sm90_attn.py   # before the L2 head groups
    python bench/attention_ab.py /tmp/old_sm90_attn.py                  # writes $OUT/attention-ab-l2.json (or /tmp)
    git show 757c478:generated/attention/sm90.py > /tmp/head_major.py     # before the longest-first causal order
    python bench/attention_ab.py /tmp/head_major.py --cases tile-order  # its 12 shapes
    python bench/attention_ab.py OLD_MODULE --cases mods                 # score mods: decay, alibi (none, causal beside)
    git show HEAD:generated/attention/sm90_n64.py > /tmp/old_n64.py         # a named config: --variant
    python bench/attention_ab.py /tmp/old_n64.py --cases short --variant sm90_n64

The old module is loaded from its file (it imports gen's run time, JIT-compiles). Where the change only reorders
tiles, the outputs of the two must be bitwise equal: a tile's math does not depend on which CTA runs it; so where it
only moves exact integer index math to fp32. rel_err
(bench/suite/run.rel_err, float64) against SDPA in float32 (memory-efficient backend). Timing: bench/suite/run.graph_ms
(one CUDA graph of k calls over the input copies, replays timed with CUDA events, median / k), the best of two rounds,
providers in turn; inputs rotate over copies >= 3x L2. Committed results: bench/results/tile-l2-h100.json (--cases
l2), bench/results/attention-ab-l2rule-h100.json (--cases l2, the 4-CTA group rule against the build before it),
bench/results/attention-ab-floatidx-h100.json (--cases mods, fp32 index math against the shipped int32), bench/results/attention-ab-short-*-h100.json (--cases
short: each consumer computing only the KV blocks its own rows see) and bench/results/tile-order-h200.json (made by this script's predecessor, bench/tile_order.py, on the
tile-order shapes, one round, no input copies).
"""
import importlib.util
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from generated.attention import default_alibi_slopes  # noqa: E402
from bench.suite import run as suite_run  # noqa: E402

CASE_SETS = {  # name -> [(label, B, Hq, Hkv, L, D)]
    "l2": [
        ("opt-6.7b MHA B4 L2048", 4, 32, 32, 2048, 128),
        ("opt-6.7b MHA B16 L500", 16, 32, 32, 500, 128),
        ("llama-2-7b MHA B1 L4096", 1, 32, 32, 4096, 128),
        ("llama-2-7b MHA B2 L8192", 2, 32, 32, 8192, 128),
        ("vit/bert MHA D64 B32 L512", 32, 12, 12, 512, 64),
        ("llama3-8b GQA B4 L2048", 4, 32, 8, 2048, 128),
        ("llama3-8b GQA B1 L16384", 1, 32, 8, 16384, 128),
        ("llama3-8b GQA B1 L32768", 1, 32, 8, 32768, 128),
        ("llama3.2-1b GQA D64 B4 L2048", 4, 32, 8, 2048, 64),
        ("qwen2.5-14b GQA B2 L4096", 2, 40, 8, 4096, 128),
    ],
    # score mods (label, B, Hq, Hkv, L, D, mod): index arithmetic in fp32 (gen/families/mod_ir.float_indices)
    "mods": [
        ("llama3-8b GQA B2 L4096 none", 2, 32, 8, 4096, 128, "none"),
        ("llama3-8b GQA B2 L4096 decay", 2, 32, 8, 4096, 128, "decay"),
        ("llama3-8b GQA B2 L4096 causal", 2, 32, 8, 4096, 128, "causal"),
        ("llama3-8b GQA B2 L4096 alibi", 2, 32, 8, 4096, 128, "alibi"),
        ("llama3-8b GQA B8 L1000 decay", 8, 32, 8, 1000, 128, "decay"),
        ("llama3-8b GQA B8 L1024 alibi", 8, 32, 8, 1024, 128, "alibi"),
        ("llama3.2-1b GQA D64 B4 L2048 none", 4, 32, 8, 2048, 64, "none"),
        ("llama3.2-1b GQA D64 B4 L2048 decay", 4, 32, 8, 2048, 64, "decay"),
        ("llama3.2-1b GQA D64 B4 L2048 alibi", 4, 32, 8, 2048, 64, "alibi"),
        ("opt-6.7b MHA B4 L2048 alibi", 4, 32, 32, 2048, 128, "alibi"),
    ],
    # short and odd-length prefill (issue 18): causal L 128-1000 where a consumer's rows see fewer KV blocks than the
    # CTA's, lengths just past a multiple of 128 (the last tile's second consumer all padding), long controls
    "short": [
        ("opt-6.7b MHA B16 L500 causal", 16, 32, 32, 500, 128, "causal"),
        ("llama3-8b GQA B16 L500 causal", 16, 32, 8, 500, 128, "causal"),
        ("llama3-8b GQA B16 L128 causal", 16, 32, 8, 128, 128, "causal"),
        ("llama3.2-1b GQA D64 B16 L512 causal", 16, 32, 8, 512, 64, "causal"),
        ("llama3.2-1b GQA D64 B8 L1000 causal", 8, 32, 8, 1000, 64, "causal"),
        ("qwen2.5-14b GQA B12 L512 causal", 12, 40, 8, 512, 128, "causal"),
        ("llama3-70b GQA B8 L512 causal", 8, 64, 8, 512, 128, "causal"),
        ("llama3-8b GQA B16 L300 none", 16, 32, 8, 300, 128, "none"),
        ("llama3-8b GQA B16 L300 causal", 16, 32, 8, 300, 128, "causal"),
        ("llama3-8b GQA B4 L1050 none", 4, 32, 8, 1050, 128, "none"),
        ("llama3-8b GQA B2 L2100 causal", 2, 32, 8, 2100, 128, "causal"),
        ("vit-b16 MHA D64 B32 L197 none", 32, 12, 12, 197, 64, "none"),
        ("llama3-8b GQA B4 L2048 none", 4, 32, 8, 2048, 128, "none"),
        ("llama3-8b GQA B2 L4096 causal", 2, 32, 8, 4096, 128, "causal"),
    ],
    "tile-order": [(f"B{B} Hq{Hq} Hkv{Hkv} L{L} D{D}", B, Hq, Hkv, L, D) for B, Hq, Hkv, L, D in (
        (1, 32, 8, 8192, 128), (8, 32, 8, 2048, 128), (4, 16, 16, 4096, 128), (2, 32, 8, 4096, 128),
        (1, 32, 32, 4096, 128), (16, 32, 8, 1024, 128), (1, 8, 8, 16384, 128), (4, 32, 8, 8192, 128),
        (2, 16, 16, 2048, 64), (4, 28, 4, 4096, 128), (8, 16, 16, 1000, 128), (1, 32, 8, 3000, 128))],
}


def load_old(path: str):
    spec = importlib.util.spec_from_file_location("old_sm90_attn", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def graph_ms(fn, copies: int) -> float:
    """GPU ms of fn(i) over the input copies i: bench/suite/run.graph_ms (one CUDA graph, event-timed replays)."""
    fn(0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(0)
    torch.cuda.synchronize()
    return suite_run.graph_ms([lambda i=i: fn(i) for i in range(copies)], (time.perf_counter() - t0) * 1e3)


def reference(q, k, v, mod="causal", slopes=None):
    """float32 attention without an L x L score matrix: causal through SDPA's memory-efficient backend (heads
    expanded), a score mod through the suite's chunked math (bench/suite/run.attention_reference)."""
    if mod != "causal":
        return suite_run.attention_reference(q, k, v, mod, slopes)
    q, k, v = (t.float() for t in (q, k, v))
    if q.shape[1] != k.shape[1]:
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], 1) for t in (k, v))
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def measure(name, B, Hq, Hkv, L, D, old, num_sms: int, l2_bytes: int, mod: str = "causal") -> dict:
    dev = torch.device("cuda")
    causal = mod in ("causal", "alibi")   # the SDPA rows: the same mask, no score mod (a scale, not a provider)
    slopes = default_alibi_slopes(Hq, dev) if mod == "alibi" else None
    copies = max(1, -(-3 * l2_bytes // (2 * (B * Hq * L * D + 2 * B * Hkv * L * D))))
    ins = [[torch.randn(B, H, L, D, device=dev, dtype=torch.bfloat16) for H in (Hq, Hkv, Hkv)] for _ in range(copies)]
    kernels = {"old": old, "new": NEW[0]}
    outs = {m: [torch.full((B, Hq, L, D), float("nan"), device=dev, dtype=torch.bfloat16) for _ in range(copies)]
            for m in kernels}   # poisoned: a row the kernel skips stays NaN
    lses = {m: [torch.empty(B, Hq, L, device=dev, dtype=torch.float32) for _ in range(copies)] for m in kernels}
    plans = {m: module.plan(*ins[0], outs[m][0], lses[m][0], D ** -0.5, mod, 0, 0, 0.0, num_sms)
             for m, module in kernels.items()}
    fns = {m: (lambda i, m=m: kernels[m].run(plans[m], *ins[i], outs[m][i], lses[m][i], slopes)) for m in kernels}
    for backend, label in ((SDPBackend.CUDNN_ATTENTION, "cudnn"), (SDPBackend.FLASH_ATTENTION, "flash")):
        def sdpa(i, backend=backend):
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(*ins[i], is_causal=causal, enable_gqa=Hq != Hkv)
        fns[label] = sdpa
    for m in kernels:
        fns[m](0)
    torch.cuda.synchronize()
    same = torch.equal(outs["old"][0], outs["new"][0]) and torch.equal(lses["old"][0], lses["new"][0])
    ref = reference(*ins[0], mod, slopes)
    err = suite_run.rel_err(outs["new"][0], ref)   # float64, chunked; None where a poisoned row stayed NaN
    times, errors = {}, {}
    for _ in range(2):   # two rounds, providers in turn; the best of each
        for label, fn in fns.items():
            try:
                times[label] = min(times.get(label, float("inf")), graph_ms(fn, copies))
            except RuntimeError as e:   # a backend that refuses the shape
                errors[label] = str(e).splitlines()[0]
    row = {"case": name, "mod": mod, "B": B, "Hq": Hq, "Hkv": Hkv, "L": L, "D": D, "bitwise_equal_old_new": same,
           "rel_err_new": err, **{f"{m}_ms": round(x, 4) for m, x in times.items()}, "errors": errors,
           "new_over_old": round(times["old"] / times["new"], 3)}
    best = min(times.get(m, float("inf")) for m in ("cudnn", "flash"))
    row["new_vs_best_sdpa"] = round(best / times["new"], 3)
    row["old_vs_best_sdpa"] = round(best / times["old"], 3)
    return row


NEW = []   # the module as generated now (--variant: generated/attention/<variant>.py, default sm90)


def main():
    args = sys.argv[1:]
    cases = "l2"
    variant = "sm90"
    if "--variant" in args:
        i = args.index("--variant")
        variant = args[i + 1] if i + 1 < len(args) else ""
        del args[i:i + 2]
    NEW.append(importlib.import_module(f"generated.attention.{variant}"))
    if "--cases" in args:
        i = args.index("--cases")
        cases = args[i + 1] if i + 1 < len(args) else ""
        del args[i:i + 2]
    if len(args) != 1 or cases not in CASE_SETS:
        raise SystemExit(__doc__ + f"\n--cases: one of {', '.join(CASE_SETS)}")
    old = load_old(args[0])
    props = torch.cuda.get_device_properties(0)
    rows = []
    for case in CASE_SETS[cases]:
        rows.append(measure(*case[:6], old, props.multi_processor_count, props.L2_cache_size, *case[6:]))
        print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
    path = os.path.join(os.environ.get("OUT", "/tmp"), f"attention-ab-{cases}-{variant}.json")
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                   "command": f"python bench/attention_ab.py OLD_MODULE --cases {cases} --variant {variant}",
                   "variant": variant, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
