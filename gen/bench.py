"""Variant vs baselines on a GPU: medians of many timed runs, every provider in the same process and run.

FLOPs are counted explicitly: GEMM 2*M*N*K; attention 4*B*Hq*Lq*Lk*D times the fraction of the score matrix the mask
keeps (unmasked work only), so masked providers are compared on the work they must do.
"""
from __future__ import annotations

import math
import os
import time

from .families import get_family

# A wall-clock budget for one benchmark run (GEN_BENCH_BUDGET_S): cases past it are reported as not measured.
_DEADLINE = [math.inf]


def start_budget() -> None:
    budget = float(os.environ.get("GEN_BENCH_BUDGET_S", "inf"))
    _DEADLINE[0] = time.monotonic() + budget


def over_budget() -> bool:
    return time.monotonic() > _DEADLINE[0]
from .spec import KernelSpec


def time_ms(fn, warmup_ms: int = 100, rep_ms: int = 500) -> float:
    """Median time of `fn` in ms (CUDA events around each call, after warm-up)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def _row(case: str, provider: str, ms: float, flops: float) -> dict:
    return {"case": case, "provider": provider, "ms": round(ms, 5), "tflops": round(flops / ms / 1e9, 1)}


def _safe(rows: list, case: str, provider: str, flops: float, fn, errors: list) -> None:
    if over_budget():
        errors.append({"case": case, "provider": provider, "error": "not measured: GEN_BENCH_BUDGET_S ran out"})
        return
    try:
        rows.append(_row(case, provider, time_ms(fn), flops))
    except Exception as e:  # a baseline that cannot run here is reported, not fatal
        errors.append({"case": case, "provider": provider, "error": f"{type(e).__name__}: {e}"[:300]})


def bench_gemm(spec: KernelSpec, variants: dict, num_sms: int, with_autotune: bool = True) -> tuple[list, list]:
    """variants: provider name -> variant module. Returns (rows, errors)."""
    import torch

    fam = get_family("gemm")
    rows, errors = [], []
    start_budget()
    gen = torch.Generator(device="cpu").manual_seed(1)
    for shape in spec.bench["shapes"]:  # shape-major: a time-boxed run covers every case at the headline shape
        for case in spec.bench["cases"]:
            inputs = fam.make_inputs(shape, case, spec.options, "cpu", gen)
            a, b = inputs["a"].cuda(), inputs["b"].cuda()
            bias = inputs["bias"].cuda() if inputs["bias"] is not None else None
            act, label, flops = case["activation"], fam.case_label(case, shape), fam.flops(shape)
            out = torch.empty(shape[0], shape[1], device="cuda", dtype=getattr(torch, case["out_dtype"]))
            for provider, mod in variants.items():
                _safe(rows, label, provider, flops, lambda mod=mod: mod.launch(a, b, bias, out, act, num_sms), errors)
            _safe(rows, label, "cublas+eager", flops, lambda: fam.eager_reference(a, b, bias, act), errors)
            if with_autotune and not over_budget() and not os.environ.get("GEN_BENCH_NO_AUTOTUNE"):
                torch._dynamo.reset()
                compiled = torch.compile(fam.eager_reference, mode="max-autotune")
                _safe(rows, label, "inductor-max-autotune", flops, lambda: compiled(a, b, bias, act), errors)
            torch._dynamo.reset()
            default = torch.compile(fam.eager_reference)
            _safe(rows, label, "inductor", flops, lambda: default(a, b, bias, act), errors)
    return rows, errors


def _flex_mods(mod: dict, inputs: dict, lq: int, lk: int):
    """score_mod / mask_mod for torch's FlexAttention expressing the same spec mod."""
    import torch

    off = lk - lq
    score_mod = mask_mod = None
    if mod["mask"] == "causal":
        mask_mod = lambda b, h, q, kv: kv <= q + off  # noqa: E731
    elif mod["mask"] == "window":
        left, right = inputs["window_left"], inputs["window_right"]
        mask_mod = lambda b, h, q, kv: (kv <= q + off + right) & (kv >= q + off - left)  # noqa: E731
    if mod["score_mod"] == "softcap":
        cap = inputs["softcap"]
        score_mod = lambda s, b, h, q, kv: cap * torch.tanh(s / cap)  # noqa: E731
    elif mod["score_mod"] == "alibi":
        slopes = inputs["alibi_slopes"]
        score_mod = lambda s, b, h, q, kv: s + slopes[h] * (kv - q - off)  # noqa: E731
    elif mod["score_mod"] == "custom":
        fam = get_family("attention")
        # flex applies score_mod to the scaled score too, so the spec expression carries over unchanged
        score_mod = lambda s, b, h, q, kv: fam._eval_custom(mod["expr"], s, b, h, q, kv)  # noqa: E731
    return score_mod, mask_mod


def bench_attention(spec: KernelSpec, variants: dict, num_sms: int, cases: list[dict]) -> tuple[list, list]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    fam = get_family("attention")
    rows, errors = [], []
    start_budget()
    gen = torch.Generator(device="cpu").manual_seed(1)
    flex = torch.compile(flex_attention)
    for shape in spec.bench["shapes"]:  # shape-major: a time-boxed run covers every case at the headline shape
        for case in cases:
            mod = fam.mod_by_name(spec.options, case["mod"])
            bsz, hq, hkv, lq, lk = shape
            inputs = fam.make_inputs(shape, case, spec.options, "cpu", gen)
            q, k, v = (inputs[n].cuda() for n in ("q", "k", "v"))
            slopes = inputs["alibi_slopes"].cuda()
            inputs["alibi_slopes"] = slopes
            frac = fam.unmasked_fraction(mod, lq, lk, inputs["window_left"], inputs["window_right"])
            flops = fam.flops(shape, case["head_dim"], frac)
            label = fam.case_label(case, shape)
            out = torch.empty_like(q)
            lse = torch.empty(q.shape[:3], device="cuda", dtype=torch.float32)
            args = (inputs["scale"], case["mod"], inputs["window_left"], inputs["window_right"], inputs["softcap"], slopes)
            for provider, vmod in variants.items():
                _safe(rows, label, provider, flops, lambda vmod=vmod: vmod.launch(q, k, v, out, lse, *args, num_sms), errors)
            plain = mod["score_mod"] == "none" and mod["mask"] in ("none", "causal")
            if plain and (lq == lk or mod["mask"] == "none"):  # SDPA's is_causal is top-left aligned: equal only when Lq == Lk
                causal = mod["mask"] == "causal"
                kk, vv = (k, v) if hq == hkv else (k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1))
                for name, backend in (("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa-flash", SDPBackend.FLASH_ATTENTION)):
                    def run(backend=backend):
                        with sdpa_kernel([backend]):
                            return F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, scale=inputs["scale"])
                    _safe(rows, label, name, flops, run, errors)
            score_mod, mask_mod = _flex_mods(mod, inputs, lq, lk)
            if over_budget():
                continue
            try:
                block_mask = create_block_mask(mask_mod, bsz, hq, lq, lk, device="cuda") if mask_mod else None
                _safe(rows, label, "flex-attention", flops,
                      lambda: flex(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=inputs["scale"],
                                   enable_gqa=hq != hkv), errors)
            except Exception as e:
                errors.append({"case": label, "provider": "flex-attention", "error": f"{type(e).__name__}: {e}"[:300]})
            torch._dynamo.reset()
            math_ref = torch.compile(lambda q, k, v: fam.reference({**inputs, "q": q, "k": k, "v": v}, spec.options,
                                                                   precision=q.dtype)[0])
            _safe(rows, label, "inductor", flops, lambda: math_ref(q, k, v), errors)
    return rows, errors


def speedups(rows: list, ours: str, baseline: str) -> dict:
    """case -> our time ratio vs a baseline (>1 means we are faster)."""
    by = {(r["case"], r["provider"]): r["ms"] for r in rows}
    return {c: round(by[(c, baseline)] / by[(c, ours)], 3) for (c, p) in by if p == ours and (c, baseline) in by
            and by[(c, ours)] > 0 and not math.isinf(by[(c, ours)])}
