"""The workload suite: GEMM, attention and decoder-block cases taken from public models' layers.

Where the cases come from (models.py holds the configs, with the Hugging Face values they cite):
- GEMM: each model's linear layers as nn.Linear stores them ([N, K]): fused QKV (N = (heads + 2 * kv_heads) *
  head_dim, with Qwen2's q/k/v bias), O, gate (with the model's gated activation fused: silu for SwiGLU, gelu_tanh
  for Gemma's GeGLU), up, the fused gate+up, down, fc1 (bias + gelu_tanh for ViT/BERT, bias + relu for OPT), fc2, and
  the LM head (vocab 32k-152k; a few with float32 logits, as `lm_head(h).float()` gives). M is the number of tokens
  in the batch: decode 1, 4, 16, 64; prefill 512, 2048, 8192, 16384; ViT and BERT use batch * their fixed sequence
  (197 and 512). Most cases pass the weight as `w.t()` ("nk", what a model does); some pass a row-major [K, N]
  operand ("kn": HF GPT-2 Conv1D weights, JAX exports, activation x activation). Models whose layers repeat another
  model's shapes (Mistral-7B is Llama-3-8B but for lm_head) contribute only their distinct layers.
- Attention: each model's heads (Hq, Hkv, D) at prefill (Lq == Lk, including lengths that are not multiples of 128:
  ViT's 197 and 577, 500, 1000, 1025, 3000) and decode (Lq 1..16 new tokens against a KV cache of 1k..128k,
  including unaligned cache lengths). Masks are bottom-right aligned. The mod is the model's own where it has one
  (causal decoders, Mistral's sliding window, bidirectional encoders) and otherwise a mod crossed with a real shape
  to measure what the mod costs (softcap, ALiBi and the custom decay on Llama-3-8B and Llama-3.2-1B heads, ALiBi
  also on OPT's MHA heads as in BLOOM/MPT). The
  window, cap and ALiBi slopes are the build's (specs/attention.yaml): window left 1024 right 0, cap 50, slopes
  2^(-8(h+1)/Hq). Gemma-2 (head_dim 256) is skipped: see skipped_attention().
- Blocks (block.py): a whole Llama-3-8B decoder layer at prefill (512..16384 tokens) and decode (B 1..64 against a
  1k..32k cache), plus one prefill and one decode shape each of Qwen2.5-7B and Mistral-7B.
Batch sizes: decoder prefill B = clamp(8192 // L, 1, 512 // Hq), so a case is ~8k tokens and B * Hq stays in
16..512; the encoders list their batch.
No case exceeds MAX_DENSE_FLOP (4 * B * Hq * Lq * Lk * D, before masking) so the suite fits its device budget.

Order matters: the runner goes in list order and a time-limited run keeps what it measured, so the lists are
built round-robin over their rows (every row's first shape, then every row's second, ...), and each row lists its
shapes most informative first: the first round (one shape per row) covers every model, layer, mod and phase; the
later rounds add the other regimes (GEMM: M=1 second, then 8192, 16, 64, ...).

Versioning: a case's `id` names its shape and never changes meaning. Bump SUITE_VERSION whenever a case is added,
removed or changed (tests/test_suite_cases.py pins the case list's digest per version), so results files of one
version are comparable row by row; a row of an older version is comparable where its case is unchanged (run.py's
--resume keeps exactly those).
"""
from __future__ import annotations

import hashlib
import json

import numpy as np

from gen.runtime.shapes import b_columns

from .models import MODELS

SUITE_VERSION = 6   # 2: gated GEMM cases (one fused gate_up weight and its activation); the block's fused MLP
# 3: residual GEMM cases (the O and down projections with the residual add, "residual": true); gen's block adds its
#    residuals in those projections' epilogues ("residual": "fused" in its block cases)
# 4: RMSNorm-rows GEMM cases (the QKV and gate_up projections after a pre-norm, "rms_eps": the model's eps); gen's
#    block folds its norms into those projections ("norm": "fused" in its block cases)
# 5: RoPE GEMM cases (the QKV projection with its rotary embedding on the q and k heads, "rope": the convention,
#    "rope_dim": the head dim, "rope_columns": (heads + kv_heads) * head_dim)
# 6: RMSNorm rows and RoPE in one QKV call ("/rms/rope"); gen's block rotates q and k in its QKV projection's
#    epilogue ("rope": "fused" in its block cases; v5 rotated them with torch on both sides)

MAX_DENSE_FLOP = 20e12
MATH_SCORE_BYTES = 2 ** 31  # the math providers materialize [B, Hq, Lq, Lk] fp32 scores: only below 2 GiB
WINDOW_LEFT, WINDOW_RIGHT = 1024, 0  # the window mod of the build (specs/attention.yaml)
MODS = ("none", "causal", "window", "softcap", "alibi", "decay")
ACTIVATIONS = ("none", "relu", "gelu_tanh", "silu")

# Provider names the dispatch table can map to torch code; every other provider name in a results file is ours.
TORCH_PROVIDERS = {
    "gemm": ("torch", "torch-compile", "torch-max-autotune"),
    "attention": ("sdpa", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "torch", "flex-attention", "torch-compile",
                  "torch-max-autotune"),
}

ALL_M = (2048, 1, 8192, 16, 64, 512, 16384, 4)  # most informative first

# (model, layers, Ms, options). Options: out_dtype, weight, autotune (the Ms that also get torch-max-autotune).
_GEMM_ROWS = [
    ("llama3-8b", ("qkv", "o", "gate", "down"), ALL_M, {}),
    ("qwen2.5-7b", ("qkv", "o", "gate", "down"), (2048, 1, 8192, 16, 64), {}),
    ("llama3-70b", ("qkv", "o", "gate", "down"), (2048, 1, 8192, 16), {}),
    ("gemma2-9b", ("qkv", "o", "gate", "down"), (2048, 1, 8192, 16), {}),
    ("qwen2.5-72b", ("qkv", "gate", "down"), (2048, 1, 8192, 64), {}),
    ("llama3.2-1b", ("qkv", "o", "gate", "down"), (2048, 1), {}),
    ("vit-b16", ("qkv", "o", "fc1", "fc2"), (1576, 197, 12608), {}),
    ("bert-base", ("qkv", "o", "fc1", "fc2"), (4096, 512, 16384), {}),
    ("opt-6.7b", ("fc1",), (2048, 1, 8192, 16), {}),
    ("opt-6.7b", ("fc2",), (2048, 16), {}),
    ("llama3-8b", ("up",), (2048,), {}),
    ("llama3-8b", ("gate_up",), (2048, 8192), {}),
    # the MLP's gate and up projections and its activation in one call (a fused gate_up weight, "gated"), against
    # torch's F.linear of that weight then act(gate) * up
    ("llama3-8b", ("gated",), ALL_M, {}),
    ("qwen2.5-7b", ("gated",), (2048, 1, 16, 64), {}),
    ("llama3-70b", ("gated",), (2048, 1, 16), {}),
    ("gemma2-9b", ("gated",), (2048, 1, 16), {}),
    ("llama3-8b", ("lm_head",), (2048, 1, 8192, 64), {}),
    ("qwen2.5-7b", ("lm_head",), (2048, 1, 64), {}),
    ("llama3-70b", ("lm_head",), (2048, 1, 64), {}),
    ("qwen2.5-72b", ("lm_head",), (2048, 1), {}),
    ("mistral-7b", ("lm_head",), (2048, 1, 8192, 16, 64), {}),
    ("llama3-8b", ("lm_head",), (2048, 1), {"out_dtype": "float32"}),
    ("qwen2.5-7b", ("lm_head",), (2048, 1), {"out_dtype": "float32"}),
    ("mistral-7b", ("lm_head",), (2048, 1), {"out_dtype": "float32"}),
    ("llama3-8b", ("qkv", "gate", "down"), (2048, 16, 8192), {"weight": "kn"}),
    ("bert-base", ("fc1",), (4096,), {"weight": "kn"}),
    # a decoder layer's residual adds, h = x + O(attn) and out = h + down(mlp), in the projection's call
    # ("residual"), against torch's F.linear then the add
    ("llama3-8b", ("o", "down"), ALL_M, {"residual": True}),
    ("qwen2.5-7b", ("o", "down"), (2048, 1, 16, 64), {"residual": True}),
    ("llama3-70b", ("o", "down"), (2048, 1, 16), {"residual": True}),
    # a pre-norm layer's RMSNorm before its QKV and gate_up projections, folded into the projection's call
    # ("rms": linear(x, w * gain, rms_eps=eps)), against torch's RMSNorm (Hugging Face's form, gain included) then
    # F.linear
    ("llama3-8b", ("qkv", "gated"), ALL_M, {"rms": True}),
    ("qwen2.5-7b", ("qkv", "gated"), (2048, 1, 16, 64), {"rms": True}),
    ("llama3-70b", ("qkv", "gated"), (2048, 1, 16), {"rms": True}),
    # the rotary embedding of q and k in the QKV projection's call ("rope": linear(x, w, rope=(cos, sin),
    # rope_columns=...)), against torch's F.linear then Hugging Face's `q * cos + rotate_half(q) * sin` on q and k
    ("llama3-8b", ("qkv",), ALL_M, {"rope": True}),
    ("qwen2.5-7b", ("qkv",), (2048, 1, 16, 64), {"rope": True}),
    ("llama3-70b", ("qkv",), (2048, 1, 16), {"rope": True}),
    ("llama3.2-1b", ("qkv",), (2048, 1, 16), {"rope": True}),
    # both in one call, as gen's decoder block makes its QKV projection (a pre-norm model's QKV: linear(x, w * gain,
    # rms_eps=eps, rope=(cos, sin), ...)), against torch's RMSNorm, F.linear, then the rotation
    ("llama3-8b", ("qkv",), ALL_M, {"rms": True, "rope": True}),
    ("qwen2.5-7b", ("qkv",), (2048, 1, 16, 64), {"rms": True, "rope": True}),
    ("llama3-70b", ("qkv",), (2048, 1, 16), {"rms": True, "rope": True}),
]

# torch-max-autotune compiles one kernel per shape (minutes for the whole suite): a subset across regimes.
_GEMM_AUTOTUNE = {
    "llama3-8b/qkv/M1", "llama3-8b/gate/M16", "qwen2.5-7b/qkv/M64", "llama3-8b/o/M2048", "llama3-8b/down/M8192",
    "llama3-70b/gate/M2048", "bert-base/fc1/M4096", "llama3-8b/lm_head/M2048/f32out",
}


def _epilogue(model, layer: str) -> tuple[bool, str]:
    """(bias, activation) of a model's layer, as the model computes it."""
    if layer == "qkv":
        return model.bias or model.qkv_bias, "none"
    if layer == "gate":
        return False, {"swiglu": "silu", "geglu": "gelu_tanh"}[model.mlp]
    if layer == "gated":
        return False, model.mlp   # swiglu or geglu
    if layer == "fc1":
        return model.bias, {"gelu": "gelu_tanh", "relu": "relu"}[model.mlp]
    if layer in ("o", "fc2"):
        return model.bias, "none"
    return False, "none"  # up, gate_up, down, lm_head


def _round_robin(rows: list) -> list:
    """Interleave lists: every list's first item, then every list's second, ..."""
    out = []
    for i in range(max(len(r) for r in rows)):
        out.extend(r[i] for r in rows if i < len(r))
    return out


def gemm_cases() -> list[dict]:
    rows = []
    for name, layers, ms, opt in _GEMM_ROWS:
        model = MODELS[name]
        for layer in layers:
            n, k = model.linears()["gate" if layer == "gated" else layer]   # gated: the output is gate's N
            bias, activation = _epilogue(model, layer)
            out_dtype, weight = opt.get("out_dtype", "bfloat16"), opt.get("weight", "nk")
            residual, rms, rope = opt.get("residual", False), opt.get("rms", False), opt.get("rope", False)
            row = []
            for m in ms:
                cid = f"{name}/{layer}/M{m}" + ("/kn" if weight == "kn" else "") + \
                      ("/f32out" if out_dtype == "float32" else "") + ("/residual" if residual else "") + \
                      ("/rms" if rms else "") + ("/rope" if rope else "")
                case = {"id": cid, "model": f"{name}/{layer}", "M": m, "N": n, "K": k, "dtype": "bfloat16",
                        "out_dtype": out_dtype, "bias": bias, "activation": activation, "weight": weight,
                        "autotune": cid in _GEMM_AUTOTUNE}
                if residual:   # only where true, so the other cases' fields (and --resume of v2 rows) stay as they were
                    case["residual"] = True
                if rms:   # likewise: the norm's eps, the model's
                    case["rms"], case["rms_eps"] = True, model.norm_eps
                if rope:   # likewise: rotate-half (the Hugging Face models'), on the q and k heads
                    case.update(rope="half", rope_dim=model.head_dim,
                                rope_columns=(model.heads + model.kv_heads) * model.head_dim)
                row.append(case)
            rows.append(row)
    return _round_robin(rows)


# Prefill rows: (model, mod, lengths most informative first, lengths that also get torch-compile).
_PREFILL_ROWS = [
    ("llama3-8b", "causal", (4096, 1024, 32768, 500, 8192, 2048, 1025, 16384, 3000, 1000, 128), (1024, 500)),
    ("llama3-70b", "causal", (4096, 16384, 1024, 8192, 512, 2048), ()),
    ("qwen2.5-7b", "causal", (2048, 32768, 1000, 8192, 4096), ()),
    ("qwen2.5-14b", "causal", (4096, 1025, 16384, 2048, 3000, 512, 8192), ()),
    ("qwen2.5-72b", "causal", (8192, 2048), ()),
    ("llama3.2-1b", "causal", (2048, 32768, 1000, 8192, 512, 4096), (1000,)),
    ("mistral-7b", "window", (8192, 32768, 2048, 16384, 4096, 1024), (1024,)),
    ("opt-6.7b", "causal", (2048, 500), ()),
    ("llama3-8b", "none", (4096, 1024, 16384), ()),
    ("llama3-8b", "softcap", (4096, 1024, 16384, 2048), (1024,)),
    ("llama3-8b", "alibi", (4096, 1024, 8192, 2048), (1024,)),
    ("llama3-8b", "decay", (4096, 1000, 8192, 2048), (1000,)),
    ("llama3.2-1b", "softcap", (2048,), ()),
    ("llama3.2-1b", "alibi", (2048,), ()),
    ("llama3.2-1b", "decay", (2048,), ()),
    ("llama3.2-1b", "window", (4096,), ()),
    ("llama3.2-1b", "none", (4096,), ()),
    ("opt-6.7b", "alibi", (2048,), ()),  # ALiBi's own models (BLOOM, MPT) are MHA like OPT
]
# Encoders: fixed sequence lengths, batch given: (model, mod, ((B, L), ...), torch-compile (B, L)s).
_ENCODER_ROWS = [
    ("vit-b16", "none", ((32, 197), (8, 577), (8, 197)), ((32, 197),)),  # 577 = ViT-B/16 at 384 px
    ("bert-base", "none", ((32, 512), (8, 512), (32, 128)), ((32, 512),)),
]
# Decode rows: (model, mod, ((B, Lq, Lk), ...), torch-compile (B, Lq, Lk)s).
_DECODE_ROWS = [
    ("llama3-8b", "causal", ((8, 1, 8192), (1, 1, 1024), (64, 1, 32768), (1, 1, 131072), (8, 1, 32768),
                             (64, 1, 8192), (8, 4, 8192), (8, 1, 4097), (1, 1, 8192), (8, 1, 131072),
                             (8, 16, 4096), (64, 1, 1024), (8, 1, 1000), (1, 4, 32768), (8, 1, 1024),
                             (1, 16, 131072), (1, 1, 32768), (8, 1, 30000)), ((8, 1, 8192),)),
    ("llama3-70b", "causal", ((8, 1, 8192), (64, 1, 32768), (1, 1, 32768), (64, 1, 8192), (8, 16, 8192),
                              (1, 1, 8192), (8, 1, 32768)), ()),
    ("qwen2.5-7b", "causal", ((16, 1, 4096), (64, 1, 32768), (1, 1, 131072), (1, 1, 4096), (16, 1, 32768),
                              (64, 1, 4096), (1, 1, 32768)), ((16, 1, 4096),)),
    ("qwen2.5-14b", "causal", ((8, 1, 8192), (32, 1, 32768), (8, 4, 8192), (32, 1, 8192), (8, 1, 32768)), ()),
    ("llama3.2-1b", "causal", ((64, 1, 8192), (1, 1, 131072), (64, 1, 32768), (8, 16, 4096), (1, 1, 8192)), ()),
    ("mistral-7b", "window", ((8, 1, 32768), (1, 1, 8192), (64, 1, 32768), (8, 16, 32768), (64, 1, 8192),
                              (8, 1, 8192), (1, 1, 32768)), ()),
    ("llama3-8b", "softcap", ((8, 1, 8192), (8, 16, 8192)), ()),
    ("llama3-8b", "alibi", ((8, 1, 8192), (8, 16, 8192)), ()),
    ("llama3-8b", "decay", ((8, 1, 8192),), ()),
    ("llama3-8b", "none", ((8, 1, 8192),), ()),
]


def prefill_batch(length: int, heads: int) -> int:
    return max(1, min(8192 // length, 512 // heads))


def _attention_case(name: str, mod: str, b: int, lq: int, lk: int, compile_: bool) -> dict:
    model = MODELS[name]
    phase = "prefill" if lq == lk else "decode"
    shape = f"B{b}-L{lq}" if phase == "prefill" else f"B{b}-Lq{lq}-Lk{lk}"
    return {"id": f"{name}/{phase}/{mod}/{shape}", "model": f"{name}/{phase}", "phase": phase, "B": b,
            "Hq": model.heads, "Hkv": model.kv_heads, "Lq": lq, "Lk": lk, "D": model.head_dim, "dtype": "bfloat16",
            "mod": mod, "compile": compile_}


def attention_cases() -> list[dict]:
    rows = []
    for name, mod, lengths, compiled in _PREFILL_ROWS:
        heads = MODELS[name].heads
        rows.append([_attention_case(name, mod, prefill_batch(L, heads), L, L, L in compiled) for L in lengths])
    for name, mod, shapes, compiled in _ENCODER_ROWS:
        rows.append([_attention_case(name, mod, b, L, L, (b, L) in compiled) for b, L in shapes])
    for name, mod, shapes, compiled in _DECODE_ROWS:
        rows.append([_attention_case(name, mod, b, lq, lk, (b, lq, lk) in compiled) for b, lq, lk in shapes])
    return _round_robin(rows)


# Decoder blocks (block.py): (model, mode, ((B, L or Lk), ...), max-autotune (B, L)s). Mistral at <= 4096 tokens:
# its 4096-token sliding window masks nothing there, so plain causal attention is the model's exact computation.
_BLOCK_ROWS = [
    ("llama3-8b", "prefill", ((1, 2048), (1, 512), (4, 2048), (2, 8192)), ((1, 2048),)),
    ("llama3-8b", "decode", ((8, 8192), (1, 1024), (64, 32768), (1, 32768), (64, 1024), (8, 1024), (1, 8192),
                             (8, 32768), (64, 8192)), ()),
    ("qwen2.5-7b", "prefill", ((1, 2048),), ((1, 2048),)),
    ("qwen2.5-7b", "decode", ((8, 8192),), ()),
    ("mistral-7b", "prefill", ((1, 4096),), ()),
    ("mistral-7b", "decode", ((8, 4096),), ()),
]


def block_cases() -> list[dict]:
    """Decoder-block cases: prefill of B sequences of L tokens, or one decode step of B sequences against a KV cache
    of Lk tokens (the new token's K/V written into its last slot)."""
    rows = []
    for name, mode, shapes, tuned in _BLOCK_ROWS:
        length = "L" if mode == "prefill" else "Lk"
        # mlp: how the layer's MLP is built (block.py): "gate_up", one fused gate/up weight (suite v2; v1 had
        # separate gate and up weights, so its block rows measure another layer)
        # residual: "fused", gen's O and down projections add the residual in their epilogue (suite v3; v2 added it
        # after them with torch); norm: "fused", gen's QKV and gate_up projections apply the RMSNorm before them
        # (rms_eps; suite v4; v3 ran torch's RMSNorm on both sides); rope: "fused", gen's QKV projection rotates q
        # and k in its epilogue (rope=...; suite v6; v5 rotated them with torch on both sides)
        rows.append([{"id": f"{name}/block/{mode}/B{b}-{length}{n}", "model": f"{name}/block", "mode": mode, "B": b,
                      length: n, "mlp": "gate_up", "residual": "fused", "norm": "fused", "rope": "fused",
                      "autotune": (b, n) in tuned}
                     for b, n in shapes])
    return _round_robin(rows)


def skipped_attention() -> dict:
    """model -> why its attention is not in the suite."""
    return {m.name: m.attention_skip_reason() for m in MODELS.values() if m.attention_skip_reason()}


def visible_pairs(mod: str, lq: int, lk: int) -> int:
    """(query, key) pairs the mask keeps, bottom-right aligned: query i sees key j iff j <= i + Lk - Lq (causal),
    and also j >= i + Lk - Lq - WINDOW_LEFT (window)."""
    diag = np.arange(lq, dtype=np.int64) + (lk - lq)
    if mod in ("causal", "alibi"):
        return int(np.clip(diag + 1, 0, lk).sum())
    if mod == "window":
        hi = np.clip(diag + WINDOW_RIGHT, -1, lk - 1)
        lo = np.clip(diag - WINDOW_LEFT, 0, lk)
        return int(np.clip(hi - lo + 1, 0, None).sum())
    return lq * lk


def gemm_columns(c: dict) -> int:
    """The weight's N: the output's, or twice that under a gated activation (gate and up projections)."""
    return b_columns(c["N"], c["activation"])


def gemm_flops(c: dict) -> int:
    return 2 * c["M"] * gemm_columns(c) * c["K"]


def gemm_bytes(c: dict) -> int:
    """Minimum traffic: read A, B (and bias, and a residual) once, write C once."""
    out, nb = (4 if c["out_dtype"] == "float32" else 2), gemm_columns(c)
    return (2 * (c["M"] * c["K"] + c["K"] * nb + (nb if c["bias"] else 0))
            + out * c["M"] * c["N"] * (2 if c.get("residual") else 1))


def attention_flops(c: dict) -> int:
    """4 * B * Hq * D per visible (query, key) pair: QK^T and PV, unmasked work only."""
    return 4 * c["B"] * c["Hq"] * c["D"] * visible_pairs(c["mod"], c["Lq"], c["Lk"])


def attention_dense_flops(c: dict) -> int:
    return 4 * c["B"] * c["Hq"] * c["Lq"] * c["Lk"] * c["D"]


def attention_bytes(c: dict) -> int:
    """Minimum traffic: read Q, K, V once, write O once (bf16)."""
    return 2 * 2 * c["D"] * (c["B"] * c["Hq"] * c["Lq"] + c["B"] * c["Hkv"] * c["Lk"])


def score_bytes(c: dict) -> int:
    """Size of the [B, Hq, Lq, Lk] fp32 score matrix the math providers materialize."""
    return 4 * c["B"] * c["Hq"] * c["Lq"] * c["Lk"]


def smoke_cases(family: str) -> list[dict]:
    """Tiny cases for `run.py --smoke` on a CPU: 3 per op family, 2 blocks (they test the runner, not the ops; not
    part of the suite, not versioned)."""
    if family == "gemm":
        shapes = [(8, 32, 64, "bfloat16", False, "none", "nk", True, False),
                  (5, 48, 32, "float32", True, "gelu_tanh", "nk", False, True),
                  (16, 32, 64, "bfloat16", False, "silu", "kn", False, False)]
        return [{"id": f"smoke/gemm{i}", "model": "smoke", "M": m, "N": n, "K": k, "dtype": "bfloat16",
                 "out_dtype": out, "bias": bias, "activation": act, "weight": w, "autotune": tuned,
                 **({"residual": True} if res else {})}
                for i, (m, n, k, out, bias, act, w, tuned, res) in enumerate(shapes)]
    if family == "attention":
        shapes = [(1, 4, 2, 100, 100, "causal", True), (2, 2, 2, 64, 64, "softcap", False),
                  (1, 4, 1, 3, 200, "causal", False)]
        return [{"id": f"smoke/attention{i}", "model": "smoke", "phase": "prefill" if lq == lk else "decode", "B": b,
                 "Hq": hq, "Hkv": hkv, "Lq": lq, "Lk": lk, "D": 64, "dtype": "bfloat16", "mod": mod, "compile": c}
                for i, (b, hq, hkv, lq, lk, mod, c) in enumerate(shapes)]
    return [{"id": "smoke/block/prefill", "model": "smoke", "mode": "prefill", "B": 2, "L": 64, "autotune": False},
            {"id": "smoke/block/decode", "model": "smoke", "mode": "decode", "B": 2, "Lk": 100, "autotune": False}]


def digest() -> str:
    """sha256 of the case lists: what SUITE_VERSION versions."""
    blob = json.dumps({"gemm": gemm_cases(), "attention": attention_cases(), "block": block_cases()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()
