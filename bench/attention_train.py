#!/usr/bin/env python3
"""A training step's attention, forward + backward, per provider (GPU).

    python bench/attention_train.py [--out bench/results/attention-train-<device>.json] [--reps 20]

Per case (model-shaped: Llama-3-8B GQA causal, MHA with and without a mask, BERT-like D 64, odd lengths, each mod
FlexAttention must handle), each provider runs out = attention(q, k, v); out.backward(g) on inputs that require grad:
- "gen": `generated.attention.attention` as a training user calls it (its dispatch, the default backward kernels);
- "gen-op": our forward and our backward with the portable dK/dV kernel (GEN_ATTENTION_BACKWARD=triton: the
  registered op with the LSE, what "gen" ran before it sent training calls SDPA expresses to SDPA);
- "gen-op-gluon": the same with the device target's Gluon dK/dV kernel (GEN_ATTENTION_BACKWARD=gluon, where the
  target's module has one: sm90): against "gen-op", the two dK/dV kernels;
- "gen-op-gluon-dq": the same with the Gluon dQ kernel too (GEN_ATTENTION_BACKWARD=gluon-dq, the default): against
  "gen-op-gluon", the two dQ kernels;
- "sdpa": F.scaled_dot_product_attention, its own backend choice (only the mods it expresses: none, causal);
- "flex": torch.compile(flex_attention) with the mod's score_mod / block mask.
Timed with CUDA events around fwd+bwd, fresh gradient each rep (grads set to None), providers in a new random
order each round, median of `reps` rounds; every step is 0.1 ms or more of GPU work, so the host does not decide.
The gradients of each provider are checked against autograd of the float32 math (relative error of dq, dk, dv).
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (name, B, Hq, Hkv, L, D, mod)
CASES = [
    ("llama3-8b L4096", 1, 32, 8, 4096, 128, "causal"),
    ("llama3-8b B4 L2048", 4, 32, 8, 2048, 128, "causal"),
    ("mha B4 H16 L2048", 4, 16, 16, 2048, 128, "causal"),
    ("mha B8 H16 L1024", 8, 16, 16, 1024, 128, "causal"),
    ("mha B4 H16 L1000 odd", 4, 16, 16, 1000, 128, "none"),
    ("bert-like B32 H12 L512 D64", 32, 12, 12, 512, 64, "none"),
    ("mistral window L4096", 1, 32, 8, 4096, 128, "window"),
    ("softcap B2 H16/8 L4096", 2, 16, 8, 4096, 128, "softcap"),
    ("alibi B4 H16 L2048", 4, 16, 16, 2048, 128, "alibi"),
    ("decay B4 H16 L2048", 4, 16, 16, 2048, 128, "decay"),
]


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("attention_train.py needs a CUDA GPU", file=sys.stderr)
        return 2
    import torch.nn.functional as F

    import generated.attention as att
    from bench.gpu_ci import device_slug
    from bench.suite.run import flex_call, flex_mods

    default_backward = att.BACKWARD
    rng = random.Random(0)
    torch.manual_seed(0)
    flex_compiled = torch.compile(flex_call)
    rows = []
    for name, b, hq, hkv, n, d, mod in CASES:
        q = torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        g = torch.randn_like(q)
        _, _, _, scale, _, left, right, cap, _ = att._arguments(q, k, v, mod, None, None, None, None)
        slopes = att.default_alibi_slopes(hq, q.device) if mod == "alibi" else None
        providers = {
            "gen": lambda q, k, v: att.attention(q, k, v, mod=mod),
            "gen-op": lambda q, k, v: att._op(q, k, v, scale, mod, left, right, cap, slopes, True)[0],
        }
        if att._gluon_backward_module(q, mod) is not None:
            # same call; step() picks the backward's kernels
            providers["gen-op-gluon"] = providers["gen-op-gluon-dq"] = providers["gen-op"]
        if att._sdpa_form(mod, n, n) == (mod == "causal", False):
            providers["sdpa"] = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=mod == "causal",
                                                                               enable_gqa=hq != hkv)
        from torch.nn.attention.flex_attention import create_block_mask
        score_mod, mask_mod = flex_mods(mod, n, n, slopes, "cuda")
        block_mask = create_block_mask(mask_mod, None, None, n, n, device="cuda") if mask_mod else None
        providers["flex"] = lambda q, k, v: flex_compiled(q, k, v, score_mod, block_mask, hq != hkv)

        qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
        ref = att.torch_math(qf, kf, vf, scale, mod, left, right, cap, slopes)[0]
        want = torch.autograd.grad((ref * g.float()).sum(), (qf, kf, vf))
        del ref, qf, kf, vf
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]

        def step(p):
            for t in leaves:
                t.grad = None
            att.BACKWARD = {"gen-op": "triton", "gen-op-gluon": "gluon",
                            "gen-op-gluon-dq": "gluon-dq"}.get(p, default_backward)
            providers[p](*leaves).backward(g)

        row = {"case": name, "B": b, "Hq": hq, "Hkv": hkv, "L": n, "D": d, "mod": mod, "ms": {}, "rel_err": {}}
        live = []   # the providers that ran this case
        for p in providers:
            try:
                step(p)
                row["rel_err"][p] = max(float((t.grad.double() - w.double()).norm() / w.double().norm())
                                        for t, w in zip(leaves, want))
                live.append(p)
            except Exception as e:  # noqa: BLE001 - a provider that cannot run this case is reported, not fatal
                row["ms"][p] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
        times = {p: [] for p in live}
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(3):
            for p in live:
                step(p)
        for _ in range(args.reps):
            order = live[:]
            rng.shuffle(order)
            for p in order:
                torch.cuda.synchronize()
                start.record()
                step(p)
                end.record()
                end.synchronize()
                times[p].append(start.elapsed_time(end))
        for p, ts in times.items():
            row["ms"][p] = round(statistics.median(ts), 4)
        row["gen_picked"] = "sdpa" if att._training_sdpa_plan(leaves[0], leaves[1], mod, scale) is not None else "gen-op"
        rows.append(row)
        print(json.dumps(row), flush=True)
    device = torch.cuda.get_device_name()
    columns = ("gen", "gen-op", "gen-op-gluon", "gen-op-gluon-dq", "sdpa", "flex")
    print(f"\n{'case':32} {'mod':8} " + " ".join(f"{p:>15}" for p in columns))
    for row in rows:
        cells = [row["ms"].get(p) for p in columns]
        print(f"{row['case']:32} {row['mod']:8} " + " ".join(
            f"{c:15.3f}" if isinstance(c, float) else f"{'-' if c is None else 'err':>15}" for c in cells))
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / f"attention-train-{device_slug(device)}.json"
    out.write_text(json.dumps({"device": device, "versions": {"torch": torch.__version__,
                                                              "triton": __import__("triton").__version__},
                               "command": "python bench/attention_train.py", "reps": args.reps, "rows": rows},
                              indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
