"""GEMM family: out = act(a @ b + bias) [+ residual], fp16/bf16 in, fp32 accumulate, fp16/bf16/fp32 out; with a
gated activation (swiglu, geglu) out = act(z[:, :N]) * z[:, N:] for z = a @ b + bias, b [K, 2N]. A residual is an
[M, N] tensor in the output dtype added after the activation (a transformer's `h = x + O(attn)`). RMSNorm rows (case
"rms", the op's rms_eps) normalize a's rows first, act(rmsnorm(a) @ b + bias), the norm's gain folded into b: the
kernels scale each output row by 1 / sqrt(mean(a_row^2) + eps) from the rows' L2 norms. RoPE (case "rope": "half"
or "interleaved", "rope_dim" the head dim; the op's rope=(cos, sin)) rotates the output's heads after the
activation, as a QKV projection's rotary embedding: out = rope(act(a @ b + bias))."""
from __future__ import annotations

import os

from ..measure.accuracy import rel_err
from ..measure.bench import measure, over_budget, start_budget
from ..build.spec_types import SpecError
from ..runtime.rope import rope_case_kind, rope_kind, rotated_heads
from ..runtime.shapes import GATED, b_columns, out_columns
from . import inputs_on, is_int, is_number, require_choice, require_int, require_keys, require_known, require_list, require_pow2

DTYPES = ("bfloat16", "float16")
OUT_DTYPES = ("bfloat16", "float16", "float32")
ACTIVATIONS = ("none", "relu", "gelu_tanh", "silu", *GATED)   # GATED: swiglu, geglu (gen/runtime/shapes.py)
B_LAYOUTS = ("kn", "nk")
ROPE_STYLES = ("none", "half", "interleaved")   # RoPE on the output: none, rotate-half, interleaved pairs
ROPE_DIMS = (64, 128)                           # the head dims a case may rotate (what models use)
ELEM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

# Config keys each template reads (documented at the top of each template).
CONFIG_KEYS = {
    "sm100": ("BLOCK_M", "BLOCK_N", "BLOCK_K", "STAGES", "ACC_BUFFERS", "EPI_N", "GROUP_M", "num_warps"),
    "sm90": ("BLOCK_M", "BLOCK_N", "BLOCK_K", "STAGES", "GROUP_M", "EPI_N", "LOAD_REGS", "num_warps"),
    "triton": ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages"),
}
# Keys a template reads when present, with the default it assumes.
OPTIONAL_KEYS = {"sm100": {"SCHEDULE": "static", "CTA_PAIR": 0}, "sm90": {"SWAP_AB": 0, "SPLIT_K": 1}, "triton": {"SPLIT_K": 1}}
SCHEDULES = ("static", "clc")


def has_cluster_launch_control() -> bool:
    """The installed Triton's Gluon has Blackwell cluster launch control (clc.try_cancel: triton >= 3.8)."""
    import importlib.util

    return importlib.util.find_spec("triton.experimental.gluon.language.nvidia.blackwell.clc") is not None


def has_cta_pairs() -> bool:
    """The installed Triton's Gluon lays tensor memory out over a CTA cluster (TensorMemoryLayout's cga_layout, which
    2-CTA tcgen05 MMAs need: triton >= 3.8; 3.7 spells it differently)."""
    import dataclasses

    from triton.experimental.gluon.language.nvidia.blackwell import TensorMemoryLayout

    return "cga_layout" in {f.name for f in dataclasses.fields(TensorMemoryLayout)}


def check_options(options: dict, path: str) -> dict:
    for key in options:
        if key == "b_layout":
            raise SpecError(path, "options.b_layout", "is no longer an option: every build reads B both as [K, N] and "
                            "as the w.t() view of an [N, K] weight, picked per call",
                            "remove it; name a layout per case with b_layout: kn|nk in compile_cases/verify/bench")
        raise SpecError(path, f"options.{key}", "unknown GEMM option", "the GEMM family takes no options")
    return {}


def check_config(target: str, cfg: dict, path: str, field: str) -> None:
    require_keys(cfg, CONFIG_KEYS[target], path, field, target)
    optional = OPTIONAL_KEYS.get(target, {})
    for k in cfg:
        if k not in CONFIG_KEYS[target] and k not in optional:
            raise SpecError(path, f"{field}.{k}", f"not a config key of the {target} GEMM template",
                            f"use only {list(CONFIG_KEYS[target]) + list(optional)}")
    if cfg.get("SWAP_AB", 0) not in (0, 1) or isinstance(cfg.get("SWAP_AB"), bool):
        raise SpecError(path, f"{field}.SWAP_AB", f"{cfg['SWAP_AB']!r} is not 0 or 1",
                        "use 1 to put an nn.Linear weight on the MMA's 64-row side (decode GEMMs), else 0")
    # types first: every comparison below, the estimate and the template may then do integer arithmetic
    require_pow2(cfg, ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps"), path, field, 1, 512)
    if "SPLIT_K" in cfg:
        require_int(cfg, ("SPLIT_K",), path, field, 1, 64)
        if cfg["SPLIT_K"] > 1 and cfg.get("SWAP_AB", 0):
            raise SpecError(path, f"{field}.SPLIT_K", "split-K runs unswapped (its workspace holds out's rows)",
                            "drop SWAP_AB (or SPLIT_K) from this config")
    require_int(cfg, ("GROUP_M",), path, field, 1, 1024)
    require_int(cfg, ("num_stages",), path, field, 1, 8)
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    if target in ("sm100", "sm90"):
        require_pow2(cfg, ("EPI_N",), path, field, 1, 512)
    if target in ("sm100", "sm90") and cfg["EPI_N"] > bn:  # both powers of two: EPI_N <= BLOCK_N divides it
        raise SpecError(path, f"{field}.EPI_N", f"{cfg['EPI_N']} must divide BLOCK_N={bn}", "use e.g. 32 or 64")
    if target == "sm100":
        if bm not in (64, 128):
            raise SpecError(path, f"{field}.BLOCK_M", f"{bm} is not a tcgen05 M (64 or 128 for one CTA)", "use 128 (or 64)")
        if not 16 <= bn <= 256:
            raise SpecError(path, f"{field}.BLOCK_N", f"{bn} is outside tcgen05's N range [16, 256]", "use 128 or 256")
        if not is_int(cfg["ACC_BUFFERS"]) or cfg["ACC_BUFFERS"] not in (1, 2):
            raise SpecError(path, f"{field}.ACC_BUFFERS", f"{cfg['ACC_BUFFERS']!r} TMEM accumulators", "use 2 (epilogue overlaps next tile) or 1")
        require_choice(cfg.get("SCHEDULE", "static"), SCHEDULES, path, f"{field}.SCHEDULE")
        if cfg.get("SCHEDULE") == "clc" and not has_cluster_launch_control():
            import triton

            raise SpecError(path, f"{field}.SCHEDULE", f"clc needs cluster launch control, which triton "
                            f"{triton.__version__}'s Gluon does not have (3.8 added it)",
                            'use SCHEDULE: static here, or set clc for ">=3.8" only in specs/by_triton/gemm.yaml')
        pair = cfg.get("CTA_PAIR", 0)
        if pair not in (0, 1) or isinstance(pair, bool):
            raise SpecError(path, f"{field}.CTA_PAIR", f"{pair!r} is not 0 or 1",
                            "use 1 for 2-CTA MMAs (a cluster of two CTAs per tile), else 0")
        if pair:
            if cfg.get("SCHEDULE", "static") != "static" or bm != 128:
                raise SpecError(path, f"{field}.CTA_PAIR", "a CTA pair runs the static schedule with BLOCK_M 128 "
                                f"(got SCHEDULE {cfg.get('SCHEDULE', 'static')}, BLOCK_M {bm})",
                                "set SCHEDULE: static and BLOCK_M: 128 in this config")
            if bn < 128:
                raise SpecError(path, f"{field}.BLOCK_N", f"{bn}: a CTA pair loads half of B's tile per CTA, and a "
                                "gated one half of each of its gate and up tiles", "use BLOCK_N 128 or 256")
            if not has_cta_pairs():
                import triton

                raise SpecError(path, f"{field}.CTA_PAIR", f"2-CTA MMAs need TensorMemoryLayout's cga_layout, which "
                                f"triton {triton.__version__}'s Gluon does not have (3.8 added it)",
                                'declare the variant for ">=3.8" only in specs/by_triton/gemm.yaml')
    if target == "sm90":
        if bm % 64 or bm // 64 > cfg["num_warps"] // 4:
            raise SpecError(path, f"{field}.BLOCK_M", f"{bm} rows need {max(1, bm // 64)} warpgroups of 64 rows; num_warps={cfg['num_warps']}",
                            "use BLOCK_M = 64 * (num_warps // 4), e.g. 128 with num_warps 8")
        if not 8 <= bn <= 256:
            raise SpecError(path, f"{field}.BLOCK_N", f"{bn} is outside wgmma's N range [8, 256]", "use 128 or 256")
        if not is_int(cfg["LOAD_REGS"]) or cfg["LOAD_REGS"] not in range(24, 257, 8):
            raise SpecError(path, f"{field}.LOAD_REGS", f"{cfg['LOAD_REGS']!r} is not a setmaxnreg count", "use a multiple of 8 in [24, 256], e.g. 24")
    if target in ("sm100", "sm90"):
        if bk * 2 < 32:
            raise SpecError(path, f"{field}.BLOCK_K", f"{bk} is too narrow for a swizzled TMA tile", "use 64")
        if not is_int(cfg["STAGES"]) or not 2 <= cfg["STAGES"] <= 8:
            raise SpecError(path, f"{field}.STAGES", f"{cfg['STAGES']!r} pipeline stages", "use 2..8 (3 or 4 is typical)")
    if bk < 16:
        raise SpecError(path, f"{field}.BLOCK_K", f"{bk} is below the MMA K of 16", "use BLOCK_K >= 16")


def estimate(target: str, cfg: dict, case: dict) -> dict:
    """Shared-memory bytes and TMEM columns a config needs, before compiling it (arithmetic pruning)."""
    in_b, out_b = ELEM_BYTES[case["dtype"]], ELEM_BYTES[case["out_dtype"]]
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    stages = cfg.get("STAGES", cfg.get("num_stages", 1))
    ring = stages * (bm * bk + bn * bk) * in_b
    if target in ("sm100", "sm90"):
        # two epilogue staging buffers of BLOCK_M x EPI_N so one TMA store drains while the next fills; where that
        # does not fit (4-byte outputs), the templates halve EPI_N and single-buffer, as estimated here
        tmem = cfg["ACC_BUFFERS"] * bn if target == "sm100" else 0
        epi = 2 * bm * cfg["EPI_N"] * out_b
        if ring + epi > 232_448:
            epi = bm * max(cfg["EPI_N"] // 2, 8) * out_b
        return {"smem_bytes": ring + epi, "tmem_cols": tmem}
    return {"smem_bytes": max(stages - 1, 1) * (bm * bk + bn * bk) * in_b, "tmem_cols": 0}


def default_case(options: dict) -> dict:
    return {"dtype": "bfloat16", "out_dtype": "bfloat16", "bias": True, "activation": "gelu_tanh", "b_layout": "kn",
            "residual": False, "rms": False}


def check_case(case, options: dict, path: str, field: str) -> dict:
    if not isinstance(case, dict):
        raise SpecError(path, field, "expected a mapping", "e.g. {dtype: bfloat16, out_dtype: bfloat16, bias: true, activation: gelu_tanh}")
    allowed = {"dtype", "out_dtype", "bias", "activation", "b_layout", "residual", "rms", "rope", "rope_dim"}
    for k in case:
        if k not in allowed:
            raise SpecError(path, f"{field}.{k}", "unknown case key", f"use only {sorted(allowed)}")
    out = {**default_case(options), **case}
    require_choice(out["dtype"], DTYPES, path, f"{field}.dtype")
    require_choice(out["out_dtype"], OUT_DTYPES, path, f"{field}.out_dtype")
    require_choice(out["activation"], ACTIVATIONS, path, f"{field}.activation")
    require_choice(out["b_layout"], B_LAYOUTS, path, f"{field}.b_layout")
    for flag in ("bias", "residual", "rms"):
        if not isinstance(out[flag], bool):
            raise SpecError(path, f"{field}.{flag}", f"{out[flag]!r} is not true/false",
                            f"write {flag}: true or {flag}: false")
    if "rope" in out or "rope_dim" in out:   # absent: no RoPE (cases without it keep their shape)
        out.setdefault("rope", "half")
        out.setdefault("rope_dim", 128)
        require_choice(out["rope"], ROPE_STYLES, path, f"{field}.rope")
        require_choice(out["rope_dim"], ROPE_DIMS, path, f"{field}.rope_dim")
        if out["rope"] != "none" and (out["activation"] in GATED or out["residual"]):
            raise SpecError(path, f"{field}.rope", "RoPE rotates a projection's heads and does not combine with a "
                            "gated activation or a residual", "drop rope, or set activation: none and residual: false")
    return out


def _check_shapes(shapes, path: str, field: str) -> list:
    if not isinstance(shapes, list) or not shapes:
        raise SpecError(path, field, "expected a non-empty list of [M, N, K]", "e.g. [[128, 96, 200], [4096, 4096, 4096]]")
    for i, s in enumerate(shapes):
        if not (isinstance(s, list) and len(s) == 3 and all(is_int(x) and x >= 1 for x in s)):
            raise SpecError(path, f"{field}[{i}]", f"{s!r} is not [M, N, K] with each >= 1", "write e.g. [17, 33, 65]")
    return [list(s) for s in shapes]


def _check_cases(cases, options: dict, path: str, field: str) -> list:
    cases = require_list(cases, path, field, "[{dtype: bfloat16, out_dtype: bfloat16, bias: true, activation: gelu_tanh}]",
                         empty_ok=True)
    return [check_case(c, options, path, f"{field}[{i}]") for i, c in enumerate(cases)]


def check_verify(verify: dict, options: dict, path: str) -> dict:
    require_known(verify, ("shapes", "cases"), path, "verify")
    shapes = _check_shapes(verify.get("shapes", [[1, 1, 1], [17, 33, 65], [128, 96, 200], [1000, 520, 320]]), path, "verify.shapes")
    cases = _check_cases(verify.get("cases", []), options, path, "verify.cases")
    return {"shapes": shapes, "cases": cases}


def check_bench(bench: dict, options: dict, path: str) -> dict:
    require_known(bench, ("shapes", "cases", "keep_margin"), path, "bench")
    shapes = _check_shapes(bench.get("shapes", [[4096, 4096, 4096], [8192, 8192, 8192], [8192, 14336, 4096]]), path, "bench.shapes")
    margin = bench.get("keep_margin", 1.05)
    if not is_number(margin) or margin <= 0:
        raise SpecError(path, "bench.keep_margin", f"{margin!r} is not a positive speed-up ratio", "e.g. 1.05 = must beat Inductor by 5%")
    cases = _check_cases(bench.get("cases", [
        {"dtype": "bfloat16", "out_dtype": "bfloat16", "bias": False, "activation": "none"},
        {"dtype": "bfloat16", "out_dtype": "bfloat16", "bias": True, "activation": "gelu_tanh"}]), options, path, "bench.cases")
    return {"shapes": shapes, "cases": cases, "keep_margin": float(margin)}


def template_context(options: dict) -> dict:
    return {}


# ---- the cases each stage runs ----

def verify_cases(spec) -> list[dict]:
    return spec.verify["cases"] or spec.compile_cases


def simulation_cases(spec) -> list[dict]:
    return verify_cases(spec)   # the simulator runs what a GPU build verifies, at its own small shapes


def simulation_shapes() -> list[list[int]]:
    # partial tiles, a decode row (M=1: the swap-AB configs' path), and six 128-row tiles, so that each of the
    # simulator's two programs comes back to a TMEM / accumulator buffer its epilogue released (the ring wraps)
    return [[64, 48, 40], [200, 136, 72], [1, 72, 136], [768, 136, 40]]


def tune_buckets(bench: dict) -> list[tuple[str, tuple, dict]]:
    """One bucket per benchmark shape [M, N, K], timed at the first bench case."""
    case = bench["cases"][0]
    return [("M={} N={} K={}".format(*s), tuple(s), dict(case)) for s in bench["shapes"]]


def accuracy_shape(shape) -> list:
    return list(shape)  # the float64 reference of any benchmark GEMM fits


def capture_case(spec) -> tuple[dict, list]:
    """The last bench case (the fused epilogue) at the first bench shape."""
    return spec.bench["cases"][-1], spec.bench["shapes"][0]


# ---- runtime side: inputs, reference, accounting (used by verify and bench) ----

# Shape the precompile step launches each API case at (gen/build/bundle.py): any TMA-compatible shape will do, since the
# Gluon kernels do not specialize on shape ints.
CAPTURE_SHAPE = (128, 128, 128)


# Activations whose residual form is precompiled: a transformer's residual adds follow its O and down projections,
# which have none. A residual after another activation runs too; its kernel is compiled on its first call.
RESIDUAL_ACTIVATIONS = ("none",)
# Activations whose RMSNorm-rows form (rms_eps) is precompiled: a pre-norm layer's norms precede its QKV projection
# (none, with or without bias) and its gate_up projection (swiglu); others compile on their first call.
RMS_ACTIVATIONS = ("none", "swiglu")
# The eps the verification cases normalize with (any positive value exercises the same code)
VERIFY_RMS_EPS = 1e-5


def api_cases(options: dict) -> list[dict]:
    """The specializations the precompiled bundles hold: in dtype x out dtype x bias x activation x B layout, with
    a residual for RESIDUAL_ACTIVATIONS, and with RMSNorm rows for RMS_ACTIVATIONS."""
    def epilogues(act):
        return ([(False, False)] + ([(True, False)] if act in RESIDUAL_ACTIVATIONS else [])
                + ([(False, True)] if act in RMS_ACTIVATIONS else []))
    return [{"dtype": dt, "out_dtype": odt, "bias": bias, "activation": act, "b_layout": lay, "residual": res,
             "rms": rms}
            for dt in DTYPES for odt in OUT_DTYPES for bias in (False, True) for act in ACTIVATIONS
            for lay in B_LAYOUTS for res, rms in epilogues(act)]


def case_label(case: dict, shape) -> str:
    epi = (("rms+" if case.get("rms") else "") + ("bias+" if case["bias"] else "") + case["activation"]
           + ("+residual" if case.get("residual") else "")
           + (f"+rope({case['rope']},{case['rope_dim']})" if rope_case_kind(case)[0] > 0 else ""))
    weight = " w[N,K]" if case.get("b_layout") == "nk" else ""
    return f"M={shape[0]} N={shape[1]} K={shape[2]} {case['dtype']}->{case['out_dtype']} {epi}{weight}"


def make_inputs(shape, case: dict, options: dict, device, generator=None) -> dict:
    import torch

    m, k = shape[0], shape[2]
    n = b_columns(shape[1], case["activation"])   # a gated case's b holds the gate and up projections
    dt = getattr(torch, case["dtype"])
    a = torch.randn(m, k, device=device, dtype=dt, generator=generator)
    if case.get("rms"):   # rows of different sizes, so that a row's RMSNorm factor is not about 1
        a = (a.float() * torch.rand(m, 1, device=device, generator=generator).mul(8).add(0.125)).to(dt)
    if case.get("b_layout", "kn") == "kn":
        b = torch.randn(k, n, device=device, dtype=dt, generator=generator)
    else:  # an nn.Linear weight [N, K], passed as its [K, N] transposed view
        b = torch.randn(n, k, device=device, dtype=dt, generator=generator).t()
    bias = torch.randn(n, device=device, dtype=dt, generator=generator) if case["bias"] else None
    out_dt = getattr(torch, case["out_dtype"])
    residual = (torch.randn(m, shape[1], device=device, dtype=out_dt, generator=generator)
                if case.get("residual") else None)
    return {"a": a, "b": b, "bias": bias, "activation": case["activation"], "out_dtype": out_dt, "residual": residual,
            "rms_eps": VERIFY_RMS_EPS if case.get("rms") else None,
            "rope": rope_inputs(case, m, shape[1], dt, device, generator)}


def rope_inputs(case: dict, m: int, n: int, dtype, device, generator=None):
    """A RoPE case's (cos [M, D], sin [M, D], columns, interleaved) as the op passes them to a kernel: a rotary
    embedding's tables (base 10000, as Llama's) at random positions below 8192, one row per token, the first
    (N // D) * D output columns rotated (whole heads); None without RoPE, or where N is below one head."""
    import torch

    d, interleaved = rope_case_kind(case)
    if not d or n < d:
        return None
    pos = torch.randint(0, 8192, (m, 1), generator=generator).double()
    angles = pos * (10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d))   # [M, D/2]
    angles = angles.repeat_interleave(2, dim=1) if interleaved else torch.cat((angles, angles), dim=1)
    cos, sin = (t.to(device=device, dtype=dtype) for t in (angles.cos(), angles.sin()))
    return cos, sin, (n // d) * d, interleaved


def rope_rows(out, rope):
    """RoPE on out's first `columns` columns in out's precision (the op's torch route's rotation), v's columns kept:
    the reference's form of the op's apply_rope."""
    import torch

    rotated = rotated_heads(out, rope)
    return rotated if rope[2] == out.shape[1] else torch.cat((rotated, out[:, rope[2]:]), dim=1)


def rms_rows(a, eps: float):
    """a's rows RMS-normalized (no gain) in a's own precision: what rms_eps applies before the product."""
    return a * (a.square().mean(-1, keepdim=True) + eps).rsqrt()


def reference(inputs: dict, options: dict, precision=None):
    """act(rmsnorm(a) @ b + bias) [+ residual] (the norm where rms_eps is given) in float64 (or `precision`), the
    accuracy yardstick."""
    import torch

    dt = precision or torch.float64
    a = inputs["a"].to(dt)
    if inputs.get("rms_eps") is not None:
        a = rms_rows(a, inputs["rms_eps"])
    out = a @ inputs["b"].to(dt)
    if inputs["bias"] is not None:
        out = out + inputs["bias"].to(dt)
    out = apply_activation(out, inputs["activation"])
    if inputs.get("rope") is not None:
        out = rope_rows(out, inputs["rope"])
    return out if inputs.get("residual") is None else out + inputs["residual"].to(dt)


def apply_activation(x, activation: str):
    """act(x); for a gated activation, act(x[..., :N]) * x[..., N:] with x's last dim 2N."""
    import torch

    if activation in GATED:
        gate, up = x.chunk(2, dim=-1)
        return apply_activation(gate, GATED[activation]) * up
    if activation == "relu":
        return torch.relu(x)
    if activation == "gelu_tanh":
        return torch.nn.functional.gelu(x, approximate="tanh")
    if activation == "silu":
        return torch.nn.functional.silu(x)
    return x


def eager_reference(a, b, bias, activation, residual=None, rms_eps=None, rope=None):
    """What a user writes in PyTorch: the baseline Inductor compiles (b is [K, N], either memory order); with
    rms_eps, a pre-norm model's RMSNorm (Hugging Face's form: in fp32, rounded back) before the product; with rope,
    Hugging Face's rotation of q and k in their dtype (`q * cos + rotate_half(q) * sin`) after it."""
    if rms_eps is not None:
        a = rms_rows(a.float(), rms_eps).to(a.dtype)
    out = a @ b
    if bias is not None:
        out = out + bias
    out = apply_activation(out, activation)
    if rope is not None:
        out = rope_rows(out, rope)
    return out if residual is None else out + residual


def new_outputs(inputs: dict, fill: float | None = None) -> dict:
    import torch

    a, b = inputs["a"], inputs["b"]
    shape, dtype = (a.shape[0], out_columns(b.shape[1], inputs["activation"])), inputs["out_dtype"]
    if fill is None:
        return {"out": torch.empty(shape, device=a.device, dtype=dtype)}
    return {"out": torch.full(shape, fill, device=a.device, dtype=dtype)}


def not_applicable(module, inputs: dict, outputs: dict) -> str:
    from ..runtime.shapes import b_layout

    b = inputs["b"]
    b_mem = b if b_layout(b) == "kn" else b.t()  # as stored: [K, N], or an nn.Linear weight [N, K]
    if hasattr(module, "tma_compatible") and not module.tma_compatible(inputs["a"], b_mem, outputs["out"]):
        return "TMA needs 16-byte aligned rows; the public op falls back to the portable variant"
    rope = inputs.get("rope")
    if rope is not None and rope_kind(rope) not in getattr(module, "ROPE_KINDS", ()):
        return (f"no RoPE epilogue for head dim {rope[0].shape[1]} ({'interleaved' if rope[3] else 'rotate-half'}) in "
                "this variant; the public op sends the call to one that has it, or to torch")
    return ""


def rms_argument(a, eps):
    """A kernel's `rms` argument for RMSNorm rows: (the rows' fp32 L2 norms, eps), as the generated op passes it."""
    from ..runtime.rownorm import row_norms

    return None if eps is None else (row_norms(a), float(eps))


def launch(module, inputs: dict, outputs: dict, num_sms: int) -> None:
    module.launch(inputs["a"], inputs["b"], inputs["bias"], outputs["out"], inputs["activation"], num_sms,
                  inputs.get("residual"), rms_argument(inputs["a"], inputs.get("rms_eps")),
                  **({} if inputs.get("rope") is None else {"rope": inputs["rope"]}))


def launch_backward(module, inputs: dict) -> bool:
    return False   # the GEMM op has no backward kernels


def check_outputs(outputs: dict, inputs: dict, options: dict) -> tuple[float, str]:
    return rel_err(outputs["out"], reference(inputs, options)), ""


def flops(shape) -> float:
    m, n, k = shape
    return 2.0 * m * n * k


def case_flops(shape, case: dict) -> float:
    return flops(shape) * (2 if case.get("activation") in GATED else 1)   # (M, N, K): N is the output's


# ---- measuring against the alternatives (GPU) ----

# What the op can dispatch to besides our variants (gen.analysis.dispatch_table; bench-only providers such as torch.compile are
# not), what an unmeasured bucket gets, and the Inductor kernels the workload suite times ours against.
TORCH_PROVIDERS = ("torch",)
DEFAULT_PROVIDER = "torch"
SWITCHED_PROVIDERS = ()
PER_SHAPE_SETUP_PROVIDERS = ()   # cuBLAS has no per-shape setup worth a dispatch rule
VARYING_DEFAULT_PROVIDER = DEFAULT_PROVIDER
SUITE_INDUCTOR_PROVIDERS = ("torch-compile", "torch-max-autotune")
TRACED_AS = {"torch": "torch-compile"}   # the suite's torch-compile is torch.compile of the torch provider's function

def benchmark(spec, variants: dict, num_sms: int) -> tuple[list, list]:
    """Ours against cuBLAS (eager torch) and Inductor (default and max-autotune) on every bench shape x case."""
    import torch

    rows, errors = [], []
    start_budget()
    gen = torch.Generator(device="cpu").manual_seed(1)
    for shape in spec.bench["shapes"]:  # shape-major: a time-boxed run covers every case at the headline shape
        for case in spec.bench["cases"]:
            inputs = make_inputs(shape, case, spec.options, "cpu", gen)
            inputs = inputs_on(inputs, "cuda")
            a, b, bias, act, res = inputs["a"], inputs["b"], inputs["bias"], case["activation"], inputs["residual"]
            eps, rope = inputs["rms_eps"], inputs["rope"]
            label, work = case_label(case, shape), case_flops(shape, case)
            outputs = new_outputs(inputs)
            for provider, mod in variants.items():
                measure(rows, label, provider, work, lambda mod=mod: launch(mod, inputs, outputs, num_sms), errors)
            measure(rows, label, "cublas+eager", work, lambda: eager_reference(a, b, bias, act, res, eps, rope),
                    errors)
            if not over_budget() and not os.environ.get("GEN_BENCH_NO_AUTOTUNE"):
                torch._dynamo.reset()
                compiled = torch.compile(eager_reference, mode="max-autotune")
                measure(rows, label, "inductor-max-autotune", work,
                        lambda: compiled(a, b, bias, act, res, eps, rope), errors)
            torch._dynamo.reset()
            default = torch.compile(eager_reference)
            measure(rows, label, "inductor", work, lambda: default(a, b, bias, act, res, eps, rope), errors)
    return rows, errors


def eager_call(inputs: dict, case: dict, shape, options: dict, device: str = "cuda"):
    act = case["activation"]
    a, b = inputs["a"].to(device), inputs["b"].to(device)
    bias = inputs["bias"].to(device) if inputs["bias"] is not None else None
    res = inputs["residual"].to(device) if inputs.get("residual") is not None else None
    eps = inputs.get("rms_eps")
    rope = inputs.get("rope")
    rope = None if rope is None else (rope[0].to(device), rope[1].to(device), *rope[2:])

    def fn(a, b, bias, res):
        return eager_reference(a, b, bias, act, res, eps, rope)
    return fn, (a, b, bias, res), case_flops(shape, case)


def suite_bucket(case: dict) -> tuple:
    from ..runtime.shapes import gemm_bucket

    return gemm_bucket(case["M"], b_columns(case["N"], case["activation"]),   # b's columns, as a call is bucketed
                       case["K"], case["dtype"], case["out_dtype"], case["bias"], case["activation"], case["weight"],
                       case.get("residual", False), case.get("rms", False), rope_case_kind(case)[0] > 0)
