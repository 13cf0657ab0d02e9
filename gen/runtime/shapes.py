"""What a call's tensors say about how it can run: B's memory layout, TMA addressability, and its dispatch bucket.

Shared by the generated ops (per call: keep each function a few attribute reads) and by gen's dispatch-table
builder (gen/analysis/dispatch_table.py), so a call and the measurement that decides it land in the same bucket.
"""
from __future__ import annotations

import operator

from .dispatch import log2_bin

_BITS = {"torch.float16": "16", "torch.bfloat16": "16", "torch.float32": "32",
         "float16": "16", "bfloat16": "16", "float32": "32"}


# Gated activations (GEMM): b holds an MLP's gate and up projections, [K, 2N] (the w.t() of a fused [2N, K]
# gate_up weight, gate rows first), bias [2N]; the output is [M, N] = act(gate) * up with the activation named here.
GATED = {"swiglu": "silu", "geglu": "gelu_tanh"}


def b_columns(n: int, activation: str) -> int:
    """b's columns for an output of n columns: 2n under a gated activation."""
    return 2 * n if activation in GATED else n


def out_columns(b_columns: int, activation: str) -> int:
    """The output's columns for a b of `b_columns`: half of them under a gated activation."""
    return b_columns // 2 if activation in GATED else b_columns


def b_layout(b) -> str:
    """GEMM B ([K, N] logical): "kn" when rows of N are contiguous (a [K, N] tensor), "nk" when columns of K are
    (the `w.t()` view of an nn.Linear weight [N, K]), "" when neither (the op copies it once)."""
    k, n = b.shape
    sk, sn = b.stride()
    if sn == 1 and (k == 1 or sk >= n):
        return "kn"
    if sk == 1 and (n == 1 or sn >= k):
        return "nk"
    return ""


def tma_problem(*tensors) -> str:
    """Why TMA descriptors cannot address these tensors ("" if they can): unit last stride, 16-byte aligned base and
    strides."""
    for t in tensors:
        if t is None:
            continue
        if t.stride(-1) != 1:
            return f"a {tuple(t.shape)} tensor has last-dim stride {t.stride(-1)} (TMA needs 1)"
        if t.data_ptr() % 16:
            return f"base address of a {tuple(t.shape)} tensor is not 16-byte aligned"
        size = t.element_size()
        for s in t.stride()[:-1]:
            if (s * size) % 16:
                return f"a {tuple(t.shape)} tensor has a stride of {s * size} bytes (TMA needs multiples of 16)"
    return ""


def gemm_epilogue(has_bias: bool, activation: str, residual: bool = False, rms: bool = False,
                  rope: bool = False) -> str:
    return ((("bias" if has_bias else "") + ("+act" if activation != "none" else "") or "none")
            + ("+res" if residual else "") + ("+rms" if rms else "") + ("+rope" if rope else ""))


def static_size(d):
    """d as a plain int if its value is fixed while torch.compile traces (a static size, or a symbolic one that
    guards have pinned to one value), None if it is symbolic. Dynamo reports type(d) as int for both, and a SymInt
    handed to a constant function fails the trace; has_static_value is the test Dynamo traces, and operator.index
    of a fixed value adds no guard."""
    try:
        from torch.fx.experimental.symbolic_shapes import has_static_value
    except ImportError:   # an older torch: nothing is known static, so the op decides per call
        return None
    return operator.index(d) if has_static_value(d) else None


def same_size(a, b) -> bool:
    """a == b known without a guard while torch.compile traces (two symbolic sizes that are one symbol, or equal
    static sizes); False when it would take a guard. Plain ints compare as ints."""
    try:
        from torch.fx.experimental.symbolic_shapes import statically_known_true
    except ImportError:
        return a is b
    return statically_known_true(a == b)


def _bin(x):
    return None if x is None else log2_bin(x)


def gemm_bucket(m: int, n: int, k: int, dtype, out_dtype, has_bias: bool, activation: str, layout: str,
                residual: bool = False, rms: bool = False, rope: bool = False):
    """(categorical, bins) of a GEMM call. fp16 and bf16 share buckets (same kernels, same speed); a residual is
    a bucket of its own (its epilogue read costs our kernels more at large M than torch's add), and so are RMSNorm
    rows (the torch provider normalizes a first: more kernels and a pass over a), and RoPE on the output (torch
    rotates in a pass of its own). A size given as None (symbolic while tracing) gives a free bin (None)."""
    return ((_BITS[str(dtype)], _BITS[str(out_dtype)], gemm_epilogue(has_bias, activation, residual, rms, rope),
             layout),
            (_bin(m), _bin(n), _bin(k)))


def attention_bucket(b: int, hq: int, hkv: int, lq: int, lk: int, d: int, mod: str):
    """(categorical, bins) of an attention call: head dim, mod, grouped (GQA/MQA) or not; Lq, Lk, B*Hq bins (free
    where a size is None)."""
    return ((d, mod, hq != hkv), (_bin(lq), _bin(lk), None if b is None or hq is None else log2_bin(b * hq)))
