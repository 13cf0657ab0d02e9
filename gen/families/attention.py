"""Attention forward family: O = softmax(mod(scale * Q K^T) + mask) V, plus the row log-sum-exp.

Causal and window masks are aligned bottom-right (FlashAttention's convention): query row i of Lq sees key j of Lk
iff j <= i + (Lk - Lq) + right and, for windows, j >= i + (Lk - Lq) - left. A fully masked row yields O = 0, LSE = -inf.
"""
from __future__ import annotations

import math

from ..measure.accuracy import rel_err
from ..measure.bench import measure, over_budget, start_budget
from ..build.spec_types import SpecError
from . import (is_int, is_number, mod_ir, require_choice, require_int, require_keys, require_known, require_list,
               require_pow2)

DTYPES = ("bfloat16", "float16")
HEAD_DIMS = (64, 128, 256)
MASKS = ("none", "causal", "window")
SCORE_MODS = ("none", "softcap", "alibi", "custom")
MOD_FIELDS = {"name", "mask", "score_mod", "left", "right", "cap", "expr"}

CONFIG_KEYS_REQUIRED = ("BLOCK_M", "BLOCK_N", "num_warps")
# Optional keys each template reads, with defaults there (documented at the top of each template).
CONFIG_KEYS_OPTIONAL = {
    "sm100": ("Q_TILES", "KV_STAGES", "S_CHUNK", "SOFTMAX_REGS", "RESCALE_THRESHOLD", "EXP2_EMU", "L2_KV_BYTES",
              "L2_GROUP_BYTES", "EPI_D", "WORKER_REGS", "SLOPE_PER_TILE"),
    "sm90": ("STAGES", "O_IN_Q", "PINGPONG", "Q_STAGES", "CONSUMER_REGS", "PRODUCER_REGS", "MAXNREG", "BWD_BLOCK_M",
             "L2_KV_BYTES", "L2_GROUP_BYTES", "L2_GROUPS"),
    "triton": ("num_stages", "SPLIT_KV", "BWD_STAGES"),
}


def _check_mod(mod, path: str, field: str) -> dict:
    if isinstance(mod, str):
        mod = {"name": mod, "mask": mod if mod in ("causal",) else "none"}
    if not isinstance(mod, dict) or "name" not in mod:
        raise SpecError(path, field, "expected {name: ..., mask: ..., score_mod: ...}", "e.g. {name: causal, mask: causal}")
    for k in mod:
        if k not in MOD_FIELDS:
            raise SpecError(path, f"{field}.{k}", "unknown mod field", f"use only {sorted(MOD_FIELDS)}")
    name = mod["name"]
    if not isinstance(name, str) or not name.isidentifier():
        raise SpecError(path, f"{field}.name", f"{name!r} is not an identifier", "name it like a variable, e.g. causal")
    out = {"name": name,
           "mask": require_choice(mod.get("mask", "none"), MASKS, path, f"{field}.mask"),
           "score_mod": require_choice(mod.get("score_mod", "none"), SCORE_MODS, path, f"{field}.score_mod"),
           "left": mod.get("left"), "right": mod.get("right", 0), "cap": mod.get("cap"), "expr": None}
    if out["mask"] == "window":
        for k in ("left", "right"):
            if not is_int(out[k]) or not 0 <= out[k] < 2 ** 31:  # passed to the kernels as int32
                raise SpecError(path, f"{field}.{k}", f"window {k} must be an integer >= 0, got {out[k]!r}", f"e.g. {k}: 1024")
    else:
        for k in ("left", "right"):
            if mod.get(k) is not None:
                raise SpecError(path, f"{field}.{k}", "only window masks take left/right", f"set mask: window or drop {k}")
    if out["score_mod"] == "softcap":
        if not is_number(out["cap"]) or out["cap"] <= 0:
            raise SpecError(path, f"{field}.cap", f"softcap needs a finite cap > 0, got {out['cap']!r}", "e.g. cap: 50.0")
        out["cap"] = float(out["cap"])
    elif mod.get("cap") is not None:
        raise SpecError(path, f"{field}.cap", "only score_mod: softcap takes cap", "set score_mod: softcap or drop cap")
    if out["score_mod"] == "custom":
        out["expr"] = mod_ir.safe_score_expr(mod.get("expr"), path, f"{field}.expr")
    elif mod.get("expr") is not None:
        raise SpecError(path, f"{field}.expr", "only score_mod: custom takes expr", "set score_mod: custom or drop expr")
    return out


def check_options(options: dict, path: str) -> dict:
    for key in options:
        if key not in ("mods", "head_dims"):
            raise SpecError(path, f"options.{key}", "unknown attention option", "use mods and head_dims")
    mods_raw = options.get("mods", [{"name": "none"}, {"name": "causal", "mask": "causal"}])
    if not isinstance(mods_raw, list) or not mods_raw:
        raise SpecError(path, "options.mods", "expected a non-empty list", "e.g. [{name: none}, {name: causal, mask: causal}]")
    mods = [_check_mod(m, path, f"options.mods[{i}]") for i, m in enumerate(mods_raw)]
    names = [m["name"] for m in mods]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SpecError(path, "options.mods", f"duplicate mod names {sorted(dup)}", "give every mod a unique name")
    head_dims = require_list(options.get("head_dims", [64, 128]), path, "options.head_dims", "[64, 128]")
    for i, d in enumerate(head_dims):
        require_choice(d, HEAD_DIMS, path, f"options.head_dims[{i}]")
    return {"mods": mods, "head_dims": list(head_dims)}


def check_config(target: str, cfg: dict, path: str, field: str) -> None:
    require_keys(cfg, CONFIG_KEYS_REQUIRED, path, field, target)
    known = CONFIG_KEYS_REQUIRED + CONFIG_KEYS_OPTIONAL[target]
    for k in cfg:
        if k not in known:
            raise SpecError(path, f"{field}.{k}", f"not a config key of the {target} attention template",
                            f"use only {list(known)}")
    require_pow2(cfg, ("BLOCK_M", "BLOCK_N"), path, field, 16, 256)
    require_pow2(cfg, ("num_warps",), path, field, 1, 16)
    # the optional keys, where set: types and ranges the templates (and estimate) can do arithmetic with
    require_int(cfg, ("Q_TILES",), path, field, 1, 8)  # TMEM use is pruned by the plan
    require_int(cfg, ("KV_STAGES",), path, field, 2, 16)
    require_int(cfg, ("STAGES",), path, field, 2, 8)
    require_int(cfg, ("Q_STAGES",), path, field, 1, 2)
    require_int(cfg, ("num_stages", "BWD_STAGES"), path, field, 1, 8)
    require_int(cfg, ("MAXNREG",), path, field, 8, 256)
    require_int(cfg, ("L2_KV_BYTES", "L2_GROUP_BYTES"), path, field, 1, 2 ** 31 - 1)   # a kernel constant (int32 arithmetic)
    for k in ("SOFTMAX_REGS", "CONSUMER_REGS", "PRODUCER_REGS", "WORKER_REGS"):
        if k in cfg and (not is_int(cfg[k]) or cfg[k] not in range(24, 257, 8)):
            raise SpecError(path, f"{field}.{k}", f"{cfg[k]!r} is not a setmaxnreg count", "use a multiple of 8 in [24, 256]")
    if "S_CHUNK" in cfg:
        require_pow2(cfg, ("S_CHUNK",), path, field, 1, cfg["BLOCK_N"])  # divides BLOCK_N
    if "EXP2_EMU" in cfg:   # S chunks per KV block whose exp2 is emulated: at most all of them
        require_int(cfg, ("EXP2_EMU",), path, field, 0, cfg["BLOCK_N"] // cfg.get("S_CHUNK", 32))
    if "EPI_D" in cfg:   # O columns per epilogue chunk: divides every head dim (64, 128, 256)
        require_pow2(cfg, ("EPI_D",), path, field, 8, 64)
    if "BWD_BLOCK_M" in cfg:
        require_pow2(cfg, ("BWD_BLOCK_M",), path, field, 16, 128)  # the N of the backward's S^T / dP^T wgmmas
    if "RESCALE_THRESHOLD" in cfg and (not is_number(cfg["RESCALE_THRESHOLD"]) or cfg["RESCALE_THRESHOLD"] < 0):
        raise SpecError(path, f"{field}.RESCALE_THRESHOLD", f"{cfg['RESCALE_THRESHOLD']!r} is not a number >= 0",
                        "use e.g. 8.0 (log2 units; 0.0 rescales on every max increase)")
    for k in ("O_IN_Q", "PINGPONG", "SPLIT_KV", "L2_GROUPS", "SLOPE_PER_TILE"):
        if k in cfg and not isinstance(cfg[k], bool):
            raise SpecError(path, f"{field}.{k}", f"{cfg[k]!r} is not true/false", f"write {k}: true or {k}: false")
    if target == "sm100" and cfg["BLOCK_M"] != 128:
        raise SpecError(path, f"{field}.BLOCK_M", f"{cfg['BLOCK_M']} rows per Q tile; tcgen05 with a TMEM accumulator of 128 lanes wants 128",
                        "use BLOCK_M: 128")
    if target == "sm90" and cfg["BLOCK_M"] % 64:
        raise SpecError(path, f"{field}.BLOCK_M", f"{cfg['BLOCK_M']} is not a multiple of a warpgroup's 64 wgmma rows", "use 64 or 128")


def estimate(target: str, cfg: dict, case: dict) -> dict:
    """Shared memory and TMEM a config needs at the least (the templates shrink their K/V rings to fit).

    sm100: Q tiles + a K/V ring of single K or V slots (>= 2) + two 128 x EPI_D O staging chunks; S/P (BLOCK_N
    columns) and O (D columns) per Q tile in TMEM. sm90 and triton: Q tiles + a K/V ring of >= 2 K and V slots.
    """
    d, bm, bn = case["head_dim"], cfg["BLOCK_M"], cfg["BLOCK_N"]
    if target == "sm100":
        q_tiles = cfg.get("Q_TILES", 2)
        smem = 2 * (q_tiles * bm * d + 2 * bn * d + 2 * 128 * cfg.get("EPI_D", 64)) + q_tiles * 16 * 128
        return {"smem_bytes": smem, "tmem_cols": q_tiles * (bn + d)}
    q_tiles = cfg.get("NUM_CONSUMERS", 1)
    return {"smem_bytes": 2 * (q_tiles * bm * d + 2 * 2 * bn * d), "tmem_cols": 0}


def default_case(options: dict) -> dict:
    return {"dtype": "bfloat16", "head_dim": options["head_dims"][-1], "mod": options["mods"][0]["name"]}


def check_case(case, options: dict, path: str, field: str) -> dict:
    if not isinstance(case, dict):
        raise SpecError(path, field, "expected a mapping", "e.g. {dtype: bfloat16, head_dim: 128, mod: causal}")
    for k in case:
        if k not in ("dtype", "head_dim", "mod"):
            raise SpecError(path, f"{field}.{k}", "unknown case key", "use dtype, head_dim, mod")
    out = {**default_case(options), **case}
    require_choice(out["dtype"], DTYPES, path, f"{field}.dtype")
    require_choice(out["head_dim"], options["head_dims"], path, f"{field}.head_dim")
    require_choice(out["mod"], [m["name"] for m in options["mods"]], path, f"{field}.mod")
    return out


def _check_shapes(shapes, path: str, field: str) -> list:
    fix = "write [B, Hq, Hkv, Lq, Lk], e.g. [3, 4, 2, 17, 130]"
    if not isinstance(shapes, list) or not shapes:
        raise SpecError(path, field, "expected a non-empty list of shapes", fix)
    for i, s in enumerate(shapes):
        if not (isinstance(s, list) and len(s) == 5 and all(is_int(x) and x >= 1 for x in s)):
            raise SpecError(path, f"{field}[{i}]", f"{s!r} is not [B, Hq, Hkv, Lq, Lk] with each >= 1", fix)
        if s[1] % s[2]:
            raise SpecError(path, f"{field}[{i}]", f"Hq={s[1]} is not a multiple of Hkv={s[2]}", "use Hkv dividing Hq (MHA, GQA, MQA)")
    return [list(s) for s in shapes]


def check_verify(verify: dict, options: dict, path: str) -> dict:
    require_known(verify, ("shapes",), path, "verify")
    shapes = _check_shapes(verify.get("shapes", [[1, 2, 2, 1, 64], [3, 4, 2, 100, 100], [2, 4, 1, 17, 130]]), path, "verify.shapes")
    return {"shapes": shapes}


def check_bench(bench: dict, options: dict, path: str) -> dict:
    require_known(bench, ("shapes", "keep_margin", "mods", "head_dims"), path, "bench")
    shapes = _check_shapes(bench.get("shapes", [[4, 16, 16, 4096, 4096]]), path, "bench.shapes")
    margin = bench.get("keep_margin", 1.05)
    if not is_number(margin) or margin <= 0:
        raise SpecError(path, "bench.keep_margin", f"{margin!r} is not a positive ratio", "e.g. 1.05")
    names = [m["name"] for m in options["mods"]]
    mods = bench.get("mods", names)
    if not isinstance(mods, list) or not mods:
        raise SpecError(path, "bench.mods", "expected a non-empty list of mod names", f"choose from {names}")
    for i, m in enumerate(mods):
        require_choice(m, names, path, f"bench.mods[{i}]")
    head_dims = require_list(bench.get("head_dims", sorted(options["head_dims"], reverse=True)), path, "bench.head_dims",
                             str(sorted(options["head_dims"], reverse=True)))
    for i, d in enumerate(head_dims):
        require_choice(d, options["head_dims"], path, f"bench.head_dims[{i}]")
    return {"shapes": shapes, "keep_margin": float(margin), "mods": list(mods), "head_dims": list(head_dims)}


def template_context(options: dict) -> dict:
    """The spec's mods, each with its IR (`ir`), whose lowerings the kernel and api templates splice in."""
    return {"mods": [{**m, "ir": mod_ir.of(m)} for m in options["mods"]]}


# ---- the cases each stage runs ----

def verify_cases(spec) -> list[dict]:
    return api_cases(spec.options)  # every dtype x head dim x mod the op can launch


def simulation_cases(spec) -> list[dict]:
    """Every mod at head dim 64, and the other dtype at head dim 128 (the simulator is slow: not the full product)."""
    return [{"dtype": "bfloat16", "head_dim": 64, "mod": m["name"]} for m in spec.options["mods"]] + \
           [{"dtype": "float16", "head_dim": 128, "mod": spec.options["mods"][0]["name"]}]


def simulation_shapes() -> list[list[int]]:
    # the last: six (batch, head) tiles on the simulator's two SMs, so each persistent program carries its barrier
    # counters (and, on sm100, the wait for the previous tile's last PV) across three tiles
    return [[1, 2, 1, 130, 200], [1, 2, 2, 1, 70], [3, 2, 1, 130, 200]]


def tune_buckets(bench: dict) -> list[tuple[str, tuple, dict]]:
    """One bucket per benchmark shape x head dim, timed with the first bench mod."""
    return [("B={} Hq={} Hkv={} Lq={} Lk={}".format(*s) + f" D={d}", tuple(s),
             {"dtype": "bfloat16", "head_dim": d, "mod": bench["mods"][0]})
            for s in bench["shapes"] for d in bench["head_dims"]]


def accuracy_shape(shape) -> list:
    """The float64 reference materialises B*Hq*Lq*Lk scores, so past 2**30 of them keep Lq, Lk and the GQA ratio but
    drop to B=1, Hkv=1 (the tile loops and masks depend on those, not on the batch/head grid)."""
    bsz, hq, hkv, lq, lk = shape
    if bsz * hq * lq * lk > 2 ** 30:
        return [1, max(1, hq // hkv), 1, lq, lk]
    return list(shape)


def capture_case(spec) -> tuple[dict, list]:
    """The first mod at the largest head dim, at the first bench shape."""
    return ({"dtype": "bfloat16", "head_dim": spec.options["head_dims"][-1], "mod": spec.options["mods"][0]["name"]},
            spec.bench["shapes"][0])


# ---- runtime side ----

def mod_by_name(options: dict, name: str) -> dict:
    for m in options["mods"]:
        if m["name"] == name:
            return m
    raise ValueError(f"mod {name!r} is not in this spec; choose one of {[m['name'] for m in options['mods']]}")


# Shape [B, Hq, Hkv, Lq, Lk] the precompile step launches each API case at (gen/build/bundle.py); the Gluon kernels do not
# specialize on shape ints, so one shape stands for all.
CAPTURE_SHAPE = (1, 2, 1, 128, 128)


def api_cases(options: dict) -> list[dict]:
    """Every specialization the public `attention` can launch: dtype x head dim x mod."""
    return [{"dtype": dt, "head_dim": d, "mod": m["name"]}
            for dt in DTYPES for d in options["head_dims"] for m in options["mods"]]


def case_label(case: dict, shape) -> str:
    b, hq, hkv, lq, lk = shape
    return f"B={b} Hq={hq} Hkv={hkv} Lq={lq} Lk={lk} D={case['head_dim']} {case['dtype']} {case['mod']}"


def alibi_slopes(hq: int):
    """The standard ALiBi slopes 2^(-8 (h+1) / Hq)."""
    import torch

    return torch.tensor([2.0 ** (-8.0 * (h + 1) / hq) for h in range(hq)], dtype=torch.float32)


def make_inputs(shape, case: dict, options: dict, device, generator=None) -> dict:
    import torch

    b, hq, hkv, lq, lk = shape
    d, dt = case["head_dim"], getattr(torch, case["dtype"])
    mod = mod_by_name(options, case["mod"])
    q = torch.randn(b, hq, lq, d, device=device, dtype=dt, generator=generator)
    k = torch.randn(b, hkv, lk, d, device=device, dtype=dt, generator=generator)
    v = torch.randn(b, hkv, lk, d, device=device, dtype=dt, generator=generator)
    return {"q": q, "k": k, "v": v, "mod": mod["name"], "scale": 1.0 / math.sqrt(d),
            "window_left": mod["left"] if mod["left"] is not None else 0, "window_right": mod["right"] or 0,
            "softcap": mod["cap"] or 0.0, "alibi_slopes": alibi_slopes(hq).to(device)}


def new_outputs(inputs: dict, fill: float | None = None) -> dict:
    """O like Q, and the row log-sum-exp in float32."""
    import torch

    q = inputs["q"]
    if fill is None:
        return {"out": torch.empty_like(q), "lse": torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)}
    return {"out": torch.full_like(q, fill),
            "lse": torch.full(q.shape[:3], fill, device=q.device, dtype=torch.float32)}


def not_applicable(module, inputs: dict, outputs: dict) -> str:
    return ""  # every variant takes every attention input the op passes it


def launch(module, inputs: dict, outputs: dict, num_sms: int) -> None:
    module.launch(inputs["q"], inputs["k"], inputs["v"], outputs["out"], outputs["lse"], inputs["scale"],
                  inputs["mod"], inputs["window_left"], inputs["window_right"], inputs["softcap"],
                  inputs["alibi_slopes"], num_sms)


def launch_backward(module, inputs: dict) -> bool:
    """The module's Gluon backward kernels (`backward_dkdv`, `backward_dq`, `backward_delta`: the ones the op's
    backward takes on that target) at these inputs, with a zero upstream gradient and row statistics of the right
    shapes: what they compute from them is never read, only which kernels the launches bind."""
    if not hasattr(module, "backward_dkdv"):
        return False
    import torch

    q, k = inputs["q"], inputs["k"]
    rows = torch.zeros(q.shape[:3], device=q.device, dtype=torch.float32)   # LSE and delta, [B, Hq, Lq]
    mod_args = (inputs["scale"], inputs["mod"], inputs["window_left"], inputs["window_right"], inputs["softcap"],
                inputs["alibi_slopes"])
    module.backward_dkdv(q, k, inputs["v"], torch.zeros_like(q), rows, rows.clone(), torch.empty_like(k),
                         torch.empty_like(k), *mod_args)
    if hasattr(module, "backward_dq"):
        module.backward_dq(q, k, inputs["v"], torch.zeros_like(q), rows, rows.clone(), torch.empty_like(q),
                           *mod_args)
    if hasattr(module, "backward_delta"):   # O and dO as the forward and autograd hand them over
        module.backward_delta(torch.zeros_like(q), torch.zeros_like(q), None, rows.clone())
    return True


def check_outputs(outputs: dict, inputs: dict, options: dict) -> tuple[float, str]:
    """O by relative error; the LSE must be -inf on exactly the reference's fully masked rows and within 2e-2
    elsewhere (inf otherwise)."""
    import torch

    out, lse = outputs["out"], outputs["lse"]
    ref_o, ref_lse = reference(inputs, options)
    err = rel_err(out, ref_o)
    finite = torch.isfinite(ref_lse)
    lse_cpu = lse.double().cpu()
    ref_cpu = ref_lse.cpu()
    if not torch.equal(torch.isfinite(lse_cpu), finite.cpu()) or torch.isnan(lse_cpu).any():
        return math.inf, "LSE finiteness differs from the reference (fully masked rows must give -inf)"
    lse_err = (lse_cpu[finite.cpu()] - ref_cpu[finite.cpu()]).abs().max().item() if finite.any() else 0.0
    detail = f"lse max abs err {lse_err:.2e}"
    if lse_err > 2e-2:
        return math.inf, detail + " (> 2e-2)"
    return err, detail


def reference(inputs: dict, options: dict, precision=None):
    """(O, LSE) by the math definition, in float64 (or `precision`)."""
    import torch

    dt = precision or torch.float64
    q, k, v = (inputs[n].to(dt) for n in ("q", "k", "v"))
    bsz, hq, lq, _ = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    s = (q @ k.transpose(-1, -2)) * inputs["scale"]
    mod = mod_ir.of(mod_by_name(options, inputs["mod"]))
    dev = q.device
    env = {"score": s, "b": torch.arange(bsz, device=dev).view(bsz, 1, 1, 1),
           "h": torch.arange(hq, device=dev).view(1, hq, 1, 1), "q_idx": torch.arange(lq, device=dev).view(lq, 1),
           "kv_idx": torch.arange(lk, device=dev).view(1, lk), "Lq": lq, "Lk": lk, "softcap": inputs["softcap"],
           "window_left": inputs["window_left"], "window_right": inputs["window_right"],
           "alibi_slopes": inputs["alibi_slopes"].to(device=dev, dtype=dt)}
    s = mod.apply(env).to(dt)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    p = torch.nan_to_num(p, nan=0.0)  # fully masked rows: exp(-inf - -inf)
    return p @ v, lse


def unmasked_fraction(mod: dict, lq: int, lk: int, window_left: int = 0, window_right: int = 0) -> float:
    """Fraction of the Lq x Lk score matrix a mask keeps: the work TFLOP/s are counted over."""
    if mod["mask"] == "none":
        return 1.0
    right = 0 if mod["mask"] == "causal" else window_right
    left = lk if mod["mask"] == "causal" else window_left
    kept = 0
    for i in range(lq):
        d = i + lk - lq
        lo, hi = max(0, d - left), min(lk - 1, d + right)
        kept += max(0, hi - lo + 1)
    return kept / (lq * lk)


def flops(shape, head_dim: int, fraction: float = 1.0) -> float:
    """4 * B * Hq * Lq * Lk * D * (unmasked fraction): two matmuls, counting only kept scores."""
    b, hq, _, lq, lk = shape
    return 4.0 * b * hq * lq * lk * head_dim * fraction


def case_flops(shape, case: dict) -> float:
    return flops(shape, case["head_dim"])


# ---- measuring against the alternatives (GPU) ----

# What the op can dispatch to besides our variants (gen.analysis.dispatch_table; bench-only providers such as torch.compile are
# not), what an unmeasured bucket gets, and the Inductor kernels the workload suite times ours against.
TORCH_PROVIDERS = ("sdpa", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "torch")
DEFAULT_PROVIDER = "sdpa"  # the op turns it into our variant for mods SDPA cannot express
SWITCHED_PROVIDERS = ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient")   # SDPA's backend switches flipped per call
# Providers that pay a setup per new shape, which the suite (fixed shapes, warmed up) never sees: on the H200 (torch
# 2.11) SDPA's own choice for a GQA decode call is cuDNN, and a call at a KV length cuDNN has not seen costs about
# 33-35 ms against 45-65 us at a length it has (flash: 55 us either way; bench/results/sdpa-new-length-h200.json).
# A generation loop with a growing cache meets a new length every step, a server's prefill one each prompt, so where
# the op sees a call class's length change (or a cache length trace as symbolic) it takes the bucket's best provider
# without them (dispatch.json's varying_provider).
PER_SHAPE_SETUP_PROVIDERS = ("sdpa", "sdpa-cudnn")
# What such a call gets in a bucket the suite never measured: flash sets up nothing per length (55-62 us a decode call
# either way in the same run), where the plain default, SDPA's own choice, paid 33-73 ms at each new length.
VARYING_DEFAULT_PROVIDER = "sdpa-flash"
SUITE_INDUCTOR_PROVIDERS = ("torch-compile", "flex-attention")
TRACED_AS = {}   # SDPA traced is the same SDPA kernels


def benchmark(spec, variants: dict, num_sms: int) -> tuple[list, list]:
    """Ours against SDPA (cuDNN, flash: where it can express the mod), FlexAttention and Inductor's compile of the math
    definition, on bench shapes x head dims x mods in bfloat16; FLOPs count only the scores the mask keeps."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    cases = [{"dtype": "bfloat16", "head_dim": d, "mod": m} for d in spec.bench["head_dims"] for m in spec.bench["mods"]]
    rows, errors = [], []
    start_budget()
    gen = torch.Generator(device="cpu").manual_seed(1)
    flex = torch.compile(flex_attention)
    for shape in spec.bench["shapes"]:  # shape-major: a time-boxed run covers every case at the headline shape
        for case in cases:
            mod = mod_by_name(spec.options, case["mod"])
            bsz, hq, hkv, lq, lk = shape
            inputs = make_inputs(shape, case, spec.options, "cpu", gen)
            inputs = {n: (x.cuda() if isinstance(x, torch.Tensor) else x) for n, x in inputs.items()}
            q, k, v = inputs["q"], inputs["k"], inputs["v"]
            frac = unmasked_fraction(mod, lq, lk, inputs["window_left"], inputs["window_right"])
            work = flops(shape, case["head_dim"], frac)
            label = case_label(case, shape)
            outputs = new_outputs(inputs)
            for provider, vmod in variants.items():
                measure(rows, label, provider, work, lambda vmod=vmod: launch(vmod, inputs, outputs, num_sms), errors)
            plain = mod["score_mod"] == "none" and mod["mask"] in ("none", "causal")
            if plain and (lq == lk or mod["mask"] == "none"):  # SDPA's is_causal is top-left aligned: equal only when Lq == Lk
                causal = mod["mask"] == "causal"
                kk, vv = (k, v) if hq == hkv else (k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1))
                for name, backend in (("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa-flash", SDPBackend.FLASH_ATTENTION)):
                    def run(backend=backend):
                        with sdpa_kernel([backend]):
                            return F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, scale=inputs["scale"])
                    measure(rows, label, name, work, run, errors)
            score_mod, mask_mod = mod_ir.flex_mods(mod_ir.of(mod), lq, lk, inputs["window_left"], inputs["window_right"],
                                                    inputs["softcap"], inputs["alibi_slopes"])
            if over_budget():
                continue
            try:
                block_mask = create_block_mask(mask_mod, bsz, hq, lq, lk, device="cuda") if mask_mod else None
                measure(rows, label, "flex-attention", work,
                      lambda: flex(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=inputs["scale"],
                                   enable_gqa=hq != hkv), errors)
            except Exception as e:
                errors.append({"case": label, "provider": "flex-attention", "error": f"{type(e).__name__}: {e}"[:300]})
            torch._dynamo.reset()
            math_ref = torch.compile(lambda q, k, v: reference({**inputs, "q": q, "k": k, "v": v}, spec.options,
                                                                   precision=q.dtype)[0])
            measure(rows, label, "inductor", work, lambda: math_ref(q, k, v), errors)
    return rows, errors




def eager_call(inputs: dict, case: dict, shape, options: dict, device: str = "cuda"):
    q, k, v = (inputs[n].to(device) for n in ("q", "k", "v"))
    inputs = {**inputs, "alibi_slopes": inputs["alibi_slopes"].to(device)}
    mod = mod_by_name(options, case["mod"])
    _, _, _, lq, lk = shape
    frac = unmasked_fraction(mod, lq, lk, inputs["window_left"], inputs["window_right"])

    def fn(q, k, v):  # same as the benchmark's "inductor" row: the math definition at the input precision
        return reference({**inputs, "q": q, "k": k, "v": v}, options, precision=q.dtype)[0]
    return fn, (q, k, v), flops(shape, case["head_dim"], frac)


def suite_bucket(case: dict) -> tuple:
    from ..runtime.shapes import attention_bucket

    return attention_bucket(case["B"], case["Hq"], case["Hkv"], case["Lq"], case["Lk"], case["D"], case["mod"])
